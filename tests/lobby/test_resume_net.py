"""Resume tokens over real sockets: a member's new client takes the seat back with the token its
predecessor kept, on the home or on the server the lobby was re-created on; forged and replayed
tokens are refused with their code; a client without a token is still refused a seated member."""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

import attrs
import pytest
import trio

import echo.lobby
from echo.lobby.client import LobbyClient, Resumed, ResumeRefused
from echo.lobby.home import failover_home, home_of
from echo.lobby.protocol import Presence, ResumeToken
from echo.lobby.resume import ResumeReason, decode_resume_token_untrusted
from echo.lobby.server import LobbyServer
from echo.lobby.statefile import read_state
from tests.lobby.servers import LOBBY, cluster, until
from tests.lobby.test_cli import CLIENT, REPO


def presence(server: LobbyServer, lobby_id: int, member: str) -> Presence | None:
    snapshot = server.registry.snapshot(lobby_id)
    if snapshot is None:
        return None
    return next((m.presence for m in snapshot.members if m.member_id == member), None)


async def ready_bob(alice: LobbyClient, bob: LobbyClient) -> tuple[int, bytes]:
    lobby_id = await alice.create("room", 4)
    await bob.join(lobby_id)
    await bob.ready()
    await bob.set_attributes({"team": "red"})
    issued = await bob.next_event(ResumeToken)
    assert issued.lobby_id == lobby_id and bob.resume_token == issued.token
    claims = decode_resume_token_untrusted(issued.token)
    assert (claims.lobby_id, claims.member_id) == (lobby_id, "bob")
    return lobby_id, issued.token


async def sees_bob_back(alice: LobbyClient) -> None:
    def back(m: LobbyClient) -> bool:
        assert m.replica is not None
        bob = m.replica.members["bob"]
        return (
            bob.presence is Presence.CONNECTED and bob.ready and bob.attributes == {"team": "red"}
        )

    await alice.wait_until(back)


async def test_a_new_client_takes_the_seat_back_and_the_token_cannot_be_used_twice() -> None:
    async with cluster(1) as c, echo.lobby.connect(c.names, member="alice") as alice:
        server = c.lobby[0]
        async with echo.lobby.connect(c.names, member="bob") as bob:
            lobby_id, token = await ready_bob(alice, bob)
        await until(lambda: presence(server, lobby_id, "bob") is Presence.RECONNECTING)
        # Without the token, another client naming bob is refused, as before; and the error
        # says a server answered and refused.
        with pytest.raises(echo.lobby.LobbyUnavailable, match="let this member in") as caught:
            async with echo.lobby.connect(c.names, member="bob", reconnect=False):
                pass
        assert "its seat is needed" in str(caught.value)
        async with echo.lobby.connect(c.names, member="bob", resume_token=token) as bob2:
            assert bob2.lobby_id == lobby_id
            assert await bob2.next_event(Resumed) == Resumed(lobby_id, server.server_id)
            assert bob2.replica is not None and bob2.replica.members["bob"].ready
            await sees_bob_back(alice)
            # A fresh token, for the new client's secret.
            await bob2.wait_until(lambda m: m.resume_token not in (None, token))
            assert server.counters["seats_resumed"] == 1
            # The old token again: the seat was taken back with it.
            with pytest.raises(ResumeRefused) as refused:
                async with echo.lobby.connect(c.names, member="bob", resume_token=token):
                    pass
            assert refused.value.reason is ResumeReason.REPLAYED
            flipped = token[:-1] + bytes([token[-1] ^ 1])
            with pytest.raises(ResumeRefused) as refused:
                async with echo.lobby.connect(c.names, member="bob", resume_token=flipped):
                    pass
            assert refused.value.reason is ResumeReason.FORGED
            assert server.counters["resumes_refused"] == 2
            # Neither refusal touched the seat.
            assert presence(server, lobby_id, "bob") is Presence.CONNECTED
            await bob2.chat("still here")


async def test_a_token_for_another_member_is_refused_before_it_is_sent() -> None:
    async with cluster(1) as c, echo.lobby.connect(c.names, member="alice") as alice:
        async with echo.lobby.connect(c.names, member="bob") as bob:
            _, token = await ready_bob(alice, bob)
        with pytest.raises(ResumeRefused) as refused:
            async with echo.lobby.connect(c.names, member="mallory", resume_token=token):
                pass
        assert refused.value.reason is ResumeReason.WRONG_MEMBER
        with pytest.raises(ResumeRefused) as refused:
            async with echo.lobby.connect(c.names, member="bob", resume_token=b"junk"):
                pass
        assert refused.value.reason is ResumeReason.MALFORMED


async def test_the_token_resumes_on_the_server_that_recreated_the_lobby() -> None:
    async with (
        cluster(3) as c,
        echo.lobby.connect(c.names, member="alice") as alice,
        echo.lobby.connect(c.names, member="carol") as carol,
    ):
        async with echo.lobby.connect(c.names, member="bob") as bob:
            lobby_id, token = await ready_bob(alice, bob)
            await carol.join(lobby_id)
        home = c.by_name(home_of(alice.ring, lobby_id).home)
        nxt = c.by_name(failover_home(alice.ring, lobby_id, {home.server_id}) or "")
        await until(lambda: presence(home, lobby_id, "bob") is Presence.RECONNECTING)
        c.kill(home)
        with trio.fail_after(30):
            async with echo.lobby.connect(
                c.names, member="bob", resume_token=token, connect_timeout=1.0
            ) as bob2:
                assert await bob2.next_event(Resumed) == Resumed(lobby_id, nxt.server_id)
                assert bob2.server == nxt.server_id
                assert nxt.counters["seats_resumed"] == 1
                await sees_bob_back(alice)
                await sees_bob_back(carol)


async def test_a_killed_process_s_half_open_session_is_replaced_by_the_resume() -> None:
    """bob runs as an echo-lobby-client process and is killed with SIGKILL; the server trusts
    a silent member for 30 s here, so bob's old session is still open (half-open) when its
    new client resumes: the new one replaces it at once, it is not refused."""
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "bob.state"
        async with (
            cluster(1, liveness=30.0) as c,
            echo.lobby.connect(c.names, member="alice") as alice,
        ):
            server = c.lobby[0]
            lobby_id = await alice.create("room", 4)
            argv = [*CLIENT, "--servers", c.names[0], "--member", "bob", "--json"]
            process = await trio.lowlevel.open_process(
                [*argv, "--state-file", str(state)],
                cwd=REPO,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
            try:
                assert process.stdin is not None and process.stdout is not None
                await process.stdin.send_all(f"join {lobby_id}\nready\n".encode())
                seen: set[str] = set()
                buffer = b""
                with trio.fail_after(60):
                    while not {"token_saved", "ok ready"} <= seen:
                        buffer += await process.stdout.receive_some()
                        *lines, buffer = buffer.split(b"\n")
                        for line in lines:
                            record = json.loads(line)
                            seen.add(record["event"])
                            if record["event"] == "ok":
                                seen.add(f"ok {record['command']}")
            finally:
                process.kill()
                await process.wait()
            saved = read_state(state)
            assert saved is not None
            assert presence(server, lobby_id, "bob") is Presence.CONNECTED  # half-open
            async with echo.lobby.connect(c.names, member="bob", resume_token=saved.token) as bob:
                assert bob.lobby_id == lobby_id
                assert server.counters["sessions_replaced"] == 1
                assert server.counters["seats_resumed"] == 1
                assert server.counters["hellos_refused"] == 0
                assert bob.replica is not None and bob.replica.members["bob"].ready
                await bob.chat("back")
                assert presence(server, lobby_id, "bob") is Presence.CONNECTED


async def test_the_token_is_renewed_every_grace_period() -> None:
    lobby = attrs.evolve(LOBBY, reconnect_grace=0.5)
    async with (
        cluster(1, lobby=lobby) as c,
        echo.lobby.connect(c.names, member="alice") as alice,
    ):
        await alice.create("room", 4)
        first = await alice.next_event(ResumeToken)
        with trio.fail_after(10):
            second = await alice.next_event(ResumeToken)
        assert second.lobby_id == first.lobby_id and second.token != first.token
        before = decode_resume_token_untrusted(first.token).expires_at
        after = decode_resume_token_untrusted(second.token).expires_at
        assert after > before
        assert alice.resume_token == second.token
        # Leaving the lobby: no token any more.
        await alice.leave()
        assert alice.resume_token is None
