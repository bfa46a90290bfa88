"""Verified identities over real sockets: a lobby server with a key set admits members whose
tokens prove their ids and refuses every other with its reason (the client raises
`AuthRefused`, the server counts it by reason and exports the count); without keys it runs in
development mode and says so."""

from __future__ import annotations

import time
from typing import Any

import pytest
import structlog
import trio

import echo.lobby
from echo.lobby.client import AuthRefused, LobbyUnavailable
from echo.lobby.identity import REASONS
from echo.lobby.server import LobbyServer, LobbyServerConfig
from echo.ops.metrics import LobbyCollector
from tests.lobby.auth import ISSUER, backend, verifier
from tests.lobby.servers import LOBBY, SEAT_KEY, _run_in, cluster, name_of, session_config

ED = backend.new_signing_key("2026-12", "ed25519")
HS = backend.new_signing_key("hs-2026-12", "hs256")


def token(signing: dict[str, Any] = ED, member: str = "alice", **options: Any) -> str:
    options.setdefault("issuer", ISSUER)
    return str(backend.issue_token(signing, member, **options))


def auth_refusals(server: LobbyServer) -> dict[str, float]:
    family = next(
        f for f in LobbyCollector(server).collect() if f.name == "echo_lobby_auth_refusals"
    )
    return {s.labels["reason"]: s.value for s in family.samples if s.name.endswith("_total")}


async def test_members_with_valid_tokens_join_and_their_id_is_the_subject() -> None:
    async with cluster(1, identity=verifier(ED, HS)) as c:
        servers = c.names
        async with (
            echo.lobby.connect(servers, identity_token=token(ED, "alice")) as alice,
            echo.lobby.connect(servers, member="bob", identity_token=token(HS, "bob")) as bob,
        ):
            assert alice.member == "alice"
            lobby_id = await alice.create("verified room", max_members=4)
            await bob.join(lobby_id)
            await alice.wait_until(
                lambda c: c.replica is not None and set(c.replica.members) == {"alice", "bob"}
            )
        assert not c.lobby[0].auth_refusals
        assert set(auth_refusals(c.lobby[0])) == set(REASONS)  # all there, at 0


async def _refused(servers: list[str], **options: Any) -> AuthRefused:
    with pytest.raises(AuthRefused) as caught:
        async with echo.lobby.connect(servers, connect_timeout=5, **options):
            pass
    return caught.value


async def test_each_bad_token_is_refused_with_its_reason_and_counted() -> None:
    now = time.time()
    stranger = backend.new_signing_key("2026-12", "ed25519")  # the same kid, another key
    cases = {
        "expired": {"identity_token": token(ttl=-60)},
        "not_yet_valid": {"identity_token": token(not_before=now + 3600)},
        "wrong_audience": {"identity_token": token(audience="another-game")},
        "wrong_issuer": {"identity_token": token(issuer="https://elsewhere.example")},
        "bad_signature": {"identity_token": token(stranger)},
        "unknown_kid": {"identity_token": token(backend.new_signing_key("old", "ed25519"))},
        "missing": {"member": "alice"},
    }
    async with cluster(2, identity=verifier(ED, HS)) as c:
        for reason, options in cases.items():
            error = await _refused(c.names, **options)
            assert error.reason == reason, error
            assert f"identity refused: {reason}" in str(error)
            assert isinstance(error, LobbyUnavailable)
        # A refusal ends the walk: every server of the ring checks the same keys, so the
        # member's own server refused each once and the other none.
        refusals = [dict(server.auth_refusals) for server in c.lobby]
        assert sum(sum(r.values()) for r in refusals) == len(cases)
        total = {reason: sum(r.get(reason, 0) for r in refusals) for reason in cases}
        assert total == dict.fromkeys(cases, 1)
        exported = [auth_refusals(server) for server in c.lobby]
        assert {k: sum(e[k] for e in exported) for k in cases} == dict.fromkeys(cases, 1.0)
        assert sum(s.counters["hellos_refused"] for s in c.lobby) == len(cases)


async def test_a_token_for_another_member_is_refused() -> None:
    async with cluster(1, identity=verifier(ED)) as c:
        with pytest.raises(ValueError, match="is for 'alice', not 'mallory'"):
            async with echo.lobby.connect(c.names, member="mallory", identity_token=token()):
                pass
        # A client that sends it anyway (the check above is the library's courtesy):
        async with echo.lobby.connect(c.names, member="mallory", connect_now=False) as mallory:
            mallory.identity_token = token().encode()
            with pytest.raises(AuthRefused) as caught:
                await mallory.connect()
        assert caught.value.reason == "wrong_member"
        assert "'alice'" in caught.value.detail and "'mallory'" in caught.value.detail
        assert c.lobby[0].auth_refusals == {"wrong_member": 1}


async def test_a_token_replayed_after_its_expiry_is_refused() -> None:
    wall = [time.time()]
    config = session_config()
    server = LobbyServer(
        config,
        LobbyServerConfig(lobby=LOBBY, seat_keys=(SEAT_KEY,), identity=verifier(ED)),
        clock=lambda: wall[0],
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(_run_in, trio.CancelScope(), server)
        servers = [name_of(config)]
        captured = token(ttl=120, now=wall[0])
        async with echo.lobby.connect(servers, identity_token=captured) as alice:
            await alice.create("room")
            await alice.leave()
        wall[0] += 60  # still valid: the same token opens a new session
        async with echo.lobby.connect(servers, identity_token=captured) as alice:
            assert alice.server == servers[0]
        wall[0] += 120  # past exp + the leeway
        error = await _refused(servers, identity_token=captured)
        assert error.reason == "expired"
        assert server.auth_refusals == {"expired": 1}
        # The backend's fresh token is taken again.
        async with echo.lobby.connect(servers, identity_token=token(now=wall[0])) as alice:
            assert alice.server == servers[0]
        nursery.cancel_scope.cancel()


async def test_development_mode_takes_any_id_and_says_so() -> None:
    with structlog.testing.capture_logs() as logs:
        async with cluster(1) as c:
            async with (
                echo.lobby.connect(c.names, member="anyone") as anyone,
                # A token is ignored there (a client configured for production still joins).
                echo.lobby.connect(c.names, identity_token=token(member="bob", ttl=-999)) as bob,
            ):
                lobby_id = await anyone.create("dev room")
                await bob.join(lobby_id)
            assert not c.lobby[0].auth_refusals
    warnings = [e for e in logs if e["event"] == "lobby_development_mode"]
    assert len(warnings) == 1 and warnings[0]["log_level"] == "warning"
    assert "not verified" in warnings[0]["detail"]
    started = next(e for e in logs if e["event"] == "lobby_server_listening")
    assert started["identities"] == "development mode"


async def test_a_verifying_server_does_not_warn() -> None:
    with structlog.testing.capture_logs() as logs:
        async with cluster(1, identity=verifier(ED)):
            pass
    assert not [e for e in logs if e["event"] == "lobby_development_mode"]
    started = next(e for e in logs if e["event"] == "lobby_server_listening")
    assert started["identities"] == "verified"


async def test_the_client_refuses_tokens_it_could_not_send() -> None:
    from echo.lobby.client import member_of

    with pytest.raises(ValueError, match="member id or an identity token"):
        member_of(None, None)
    assert member_of("carol", None) == "carol" and member_of(None, token()) == "alice"
    async with echo.lobby.connect(["127.0.0.1:9"], member="alice", connect_now=False) as alice:
        with pytest.raises(ValueError, match="more than 4096"):
            alice.identity_token = "e" * 4097
        with pytest.raises(ValueError, match="ASCII"):
            alice.identity_token = "é"
        fresh = token()
        alice.identity_token = fresh  # a str is kept as its bytes
        assert alice.identity_token == fresh.encode()
