"""The lobby's own sessions encrypted (one key for the ring), and the game servers' keys carried
by the lobby, so that a member reaches an encrypted game server without typing a key.

Real sockets on loopback: lobby servers, a topic server and game servers (echo.session with
the ticket admission echo-server runs)."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import trio

import echo.lobby
import echo.session as es
from echo.lobby.client import LobbyUnavailable
from echo.lobby.games import GameServerAnnouncement
from echo.lobby.play import join_game
from echo.lobby.protocol import ChatLine, GameStarting
from echo.lobby.server import announce_game_server
from echo.server.cli import ticket_admission
from echo.server.server import echo_application
from echo.session.crypto import public_key_text
from echo.topics import ClientConfig, open_topic_client
from tests.lobby.servers import GAME_KEY, cluster, session_config, until
from tests.lobby.test_server_games import write_key

RING_KEY = es.ServerKey.generate()


async def test_an_encrypted_ring_serves_members_that_pin_its_one_key() -> None:
    async with cluster(2, key=RING_KEY, encryption="required") as c:
        key = RING_KEY.public_text
        # Two members, each homed by its own walk of the ring, one key pins both servers.
        async with (
            echo.lobby.connect(c.names, member="alice", server_key=key) as alice,
            echo.lobby.connect(c.names[::-1], member="bob", server_key=key) as bob,
        ):
            lobby_id = await alice.create("sealed", 4)
            await bob.join(lobby_id)
            await bob.chat("hello in the dark")
            line = await alice.next_event(ChatLine)
            assert (line.member_id, line.text) == ("bob", "hello in the dark")
        assert sum(s.sessions.encrypted_sessions for s in c.lobby) >= 2


async def test_a_ring_with_one_key_per_server_takes_a_mapping() -> None:
    keys = [es.ServerKey.generate(), es.ServerKey.generate()]
    async with cluster(1, key=keys[0], encryption="required") as c:
        pins = {c.names[0]: keys[0].public_text}
        async with echo.lobby.connect(c.names, member="alice", server_key=pins) as alice:
            await alice.create("one key each", 2)
        with pytest.raises(ValueError, match="no key for"):
            async with echo.lobby.connect(c.names, member="bob", server_key={}):
                pass  # pragma: no cover


async def test_an_encrypted_lobby_refuses_a_plain_member_and_a_wrong_pin() -> None:
    async with cluster(1, key=RING_KEY, encryption="required") as c:
        with pytest.raises(LobbyUnavailable, match="encryption required"):
            async with echo.lobby.connect(c.names, member="plain", connect_timeout=3):
                pass  # pragma: no cover
        other = es.ServerKey.generate().public_text
        with pytest.raises(LobbyUnavailable, match="server key refused"):
            async with echo.lobby.connect(
                c.names, member="fooled", server_key=other, connect_timeout=3
            ):
                pass  # pragma: no cover


async def _topic_client(topics: list[str], *, task_status: trio.TaskStatus) -> None:
    async with open_topic_client(topics, ClientConfig(k=1)) as client:
        task_status.started(client)
        await trio.sleep_forever()


async def encrypted_game_server(
    nursery: trio.Nursery, key_file: Path, topics: list[str], announced: bytes
) -> tuple[es.ServerConfig, es.SessionServer]:
    """echo-server --ticket-key --key --encryption required, announcing `announced` as its key."""
    config = attrs.evolve(
        session_config(8), duologue_ports="shared", key=GAME_SERVER_KEY, encryption="required"
    )
    server_id = f"{config.address}:{config.port}"
    server = es.SessionServer(
        config, echo_application, admit=ticket_admission(str(key_file), server_id)
    )
    await nursery.start(server.run)
    client = await nursery.start(_topic_client, topics)
    announcement = GameServerAnnouncement(
        server_id,
        server_id,
        8,
        control_port=config.control_port,
        duologue_ports="shared",
        public_key=announced,
    )
    nursery.start_soon(lambda: announce_game_server(client, lambda: announcement, interval=0.2))
    return config, server


GAME_SERVER_KEY = es.ServerKey.generate()


async def _start_two(c, tmp_path: Path, announced: bytes):  # type: ignore[no-untyped-def]
    key_file = write_key(tmp_path, GAME_KEY)
    game, server = await encrypted_game_server(c.nursery, key_file, c.topic_names, announced)
    await until(lambda: c.lobby[0].games.live(trio.current_time()) != [])
    return game, server


async def test_members_reach_an_encrypted_game_server_with_no_key_typed(tmp_path: Path) -> None:
    async with cluster(
        1, topics=1, ticket_keys=(GAME_KEY,), key=RING_KEY, encryption="required"
    ) as c:
        _, server = await _start_two(c, tmp_path, GAME_SERVER_KEY.public)
        ring = RING_KEY.public_text
        async with (
            echo.lobby.connect(c.names, member="owner", server_key=ring) as owner,
            echo.lobby.connect(c.names, member="bob", server_key=ring) as bob,
        ):
            lobby_id = await owner.create("match", 2)
            await bob.join(lobby_id)
            await bob.ready()
            await owner.start()
            starts = [await m.next_event(GameStarting) for m in (owner, bob)]
            assert {s.server_key for s in starts} == {GAME_SERVER_KEY.public}
            for start in starts:
                async with join_game(start, timeout=5) as session:
                    await session.send(b"ECHO sealed")
                    assert await session.receive() == b"ECHO sealed"
        assert server.encrypted_sessions == 2


async def test_a_wrong_key_announced_fails_the_handshake_as_untrusted(tmp_path: Path) -> None:
    impostor = es.ServerKey.generate()
    async with cluster(1, topics=1, ticket_keys=(GAME_KEY,)) as c:
        game, _ = await _start_two(c, tmp_path, impostor.public)
        async with echo.lobby.connect(c.names, member="owner") as owner:
            await owner.create("match", 1)
            await owner.start()
            start = await owner.next_event(GameStarting)
            assert start.server_key == impostor.public
            with pytest.raises(es.Untrusted, match="server key refused") as refused:
                async with join_game(start, timeout=5):
                    pass  # pragma: no cover
            assert GAME_SERVER_KEY.short_fingerprint in str(refused.value)
            # Plain, the same ticket is refused by the game server (encryption required).
            with pytest.raises(es.Rejected, match="encryption required"):
                async with es.connect(
                    game.address, game.port, game.control_port, credentials=start.ticket,
                    timeout=5, duologue_ports="shared",
                ):  # fmt: skip
                    pass  # pragma: no cover


def test_join_game_refuses_a_key_or_ticket_given_by_hand() -> None:
    start = GameStarting(1, "g", "127.0.0.1:9", b"t", GAME_SERVER_KEY.public)

    async def main() -> None:
        with pytest.raises(TypeError, match="server_key"):
            async with join_game(start, server_key=public_key_text(GAME_SERVER_KEY.public)):
                pass  # pragma: no cover

    trio.run(main)
