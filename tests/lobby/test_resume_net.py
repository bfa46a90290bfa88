"""Resume tokens over real sockets: a member's new client takes the seat back with the token its
predecessor kept, on the home or on the server the lobby was re-created on; forged and replayed
tokens are refused with their code; a client without a token is still refused a seated member."""

from __future__ import annotations

import pytest
import trio

import echo.lobby
from echo.lobby.client import LobbyClient, ResumeRefused, Resumed
from echo.lobby.home import failover_home, home_of
from echo.lobby.protocol import Presence, ResumeToken
from echo.lobby.resume import ResumeReason, decode_resume_token_untrusted
from echo.lobby.server import LobbyServer
from tests.lobby.servers import cluster, until


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
        return bob.presence is Presence.CONNECTED and bob.ready and bob.attributes == {
            "team": "red"
        }

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
