"""Start a game: game servers announce on a topic, the owner's start gives every member a
ticket, and an echo-server with --ticket-key admits those tickets and refuses forged ones."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import trio

import echo.lobby
import echo.session as es
from echo.lobby.client import LobbyError
from echo.lobby.games import GameServerAnnouncement
from echo.lobby.protocol import ErrorCode, GameStarting
from echo.lobby.server import announce_game_server
from echo.server.cli import ticket_admission
from echo.server.server import echo_application
from echo.tickets import TicketClaims, TicketKey, issue
from echo.topics import ClientConfig, open_topic_client
from tests.lobby.servers import GAME_KEY, cluster, session_config, until

LOBBY_PAGE = Path(__file__).resolve().parents[2] / "docs" / "lobby.md"


async def game_server(
    nursery: trio.Nursery, key_file: Path, topics: list[str]
) -> tuple[es.ServerConfig, es.SessionServer]:
    """What `echo-server --ticket-key` runs, plus its announcements on the games topic."""
    config = attrs.evolve(session_config(8), duologue_ports="shared")  # echo-server's default
    server_id = f"{config.address}:{config.port}"
    server = es.SessionServer(
        config, echo_application, admit=ticket_admission(str(key_file), server_id)
    )
    await nursery.start(server.run)
    client = await nursery.start(_topic_client, topics)
    announcement = GameServerAnnouncement(
        server_id, server_id, 8, config.control_port, "shared", {}
    )
    nursery.start_soon(lambda: announce_game_server(client, lambda: announcement, interval=0.2))
    return config, server


async def _topic_client(topics: list[str], *, task_status: trio.TaskStatus) -> None:
    async with open_topic_client(topics, ClientConfig(k=1)) as client:
        task_status.started(client)
        await trio.sleep_forever()


def write_key(tmp_path: Path, key: TicketKey) -> Path:
    path = tmp_path / "game.key"
    path.write_text(f"{key.key_id} {key.secret.hex()}\n")
    return path


async def echo_once(config: es.ServerConfig, ticket: bytes) -> bytes:
    async with es.connect(
        config.address,
        config.port,
        config.control_port,
        credentials=ticket,
        timeout=5,
        duologue_ports=config.duologue_ports,
    ) as session:
        await session.send(b"ECHO through the lobby")
        return await session.receive()


async def test_start_gives_every_member_a_ticket_the_game_server_accepts(tmp_path: Path) -> None:
    key_file = write_key(tmp_path, GAME_KEY)
    events: list = []
    async with cluster(1, topics=1, ticket_keys=(GAME_KEY,), events=events) as c:
        game, _ = await game_server(c.nursery, key_file, c.topic_names)
        await until(lambda: c.lobby[0].games.live(trio.current_time()) != [])
        async with (
            echo.lobby.connect(c.names, member="owner") as owner,
            echo.lobby.connect(c.names, member="bob") as bob,
            echo.lobby.connect(c.names, member="carol") as carol,
        ):
            lobby_id = await owner.create("match", 3)
            await bob.join(lobby_id)
            await carol.join(lobby_id)
            await bob.ready()
            with pytest.raises(LobbyError) as refused:
                await owner.start()
            assert refused.value.code is ErrorCode.NOT_READY
            await carol.ready()
            await owner.start()
            starts = [await m.next_event(GameStarting) for m in (owner, bob, carol)]
            assert {s.address for s in starts} == {f"127.0.0.1:{game.port}"}
            assert len({s.ticket for s in starts}) == 3
            for start in starts:
                assert await echo_once(game, start.ticket) == b"ECHO through the lobby"
            # The lobby locked itself: a latecomer cannot join a game already started.
            assert owner.replica is not None and owner.replica.locked
    assert (
        "lobby_started",
        {"lobby_id": lobby_id, "members": 3, "game_server": f"127.0.0.1:{game.port}"},
    ) in events


async def test_the_ticket_s_claims_reach_the_game_without_a_second_ask(tmp_path: Path) -> None:
    """The game reads who the player is from its session: the ticket it was admitted with."""
    key_file = write_key(tmp_path, GAME_KEY)

    async def who_is_it(session: es.Session) -> None:
        claims = session.admission
        assert isinstance(claims, TicketClaims)
        await session.send(f"{claims.member_id} of lobby {claims.lobby_id}".encode())
        await session.receive()  # until the player leaves

    async with trio.open_nursery() as nursery:
        config = attrs.evolve(session_config(4), duologue_ports="shared")
        server_id = f"{config.address}:{config.port}"
        server = es.SessionServer(
            config, who_is_it, admit=ticket_admission(str(key_file), server_id)
        )
        await nursery.start(server.run)
        for member, lobby_id in (("alice", 5), ("bob", 9)):
            async with es.connect(
                config.address,
                config.port,
                config.control_port,
                credentials=issue(GAME_KEY, lobby_id, member, server_id, 4e9),
                timeout=5,
                duologue_ports=config.duologue_ports,
            ) as session:
                assert await session.receive() == f"{member} of lobby {lobby_id}".encode()
                assert session.admission is None  # the client's end knows nothing of it
        assert server.application_errors == 0
        nursery.cancel_scope.cancel()


async def test_the_game_server_refuses_forged_and_missing_tickets(tmp_path: Path) -> None:
    key_file = write_key(tmp_path, GAME_KEY)
    async with trio.open_nursery() as nursery:
        config = attrs.evolve(session_config(4), duologue_ports="shared")
        server_id = f"{config.address}:{config.port}"
        server = es.SessionServer(
            config, echo_application, admit=ticket_admission(str(key_file), server_id)
        )
        await nursery.start(server.run)
        good = issue(GAME_KEY, 5, "alice", server_id, 4e9)
        assert await echo_once(config, good) == b"ECHO through the lobby"
        forged = issue(TicketKey(GAME_KEY.key_id, b"f" * 32), 5, "alice", server_id, 4e9)
        tampered = good[:-1] + bytes([good[-1] ^ 1])
        elsewhere = issue(GAME_KEY, 5, "alice", "127.0.0.1:1", 4e9)
        expired = issue(GAME_KEY, 5, "alice", server_id, 1.0)
        for ticket, reason in (
            (forged, "bad_signature"),
            (tampered, "bad_signature"),
            (elsewhere, "wrong_server"),
            (expired, "expired"),
            (b"", "a game ticket is required"),
        ):
            with pytest.raises(es.Rejected, match=reason):
                await echo_once(config, ticket)
        assert not server.duologues or all(d.ever_connected for d in server.duologues.values())
        nursery.cancel_scope.cancel()


async def test_start_without_a_game_server_is_refused() -> None:
    async with cluster(1, topics=1, ticket_keys=(GAME_KEY,)) as c:
        async with echo.lobby.connect(c.names, member="owner") as owner:
            await owner.create("alone", 2)
            with pytest.raises(LobbyError) as refused:
                await owner.start()
            assert refused.value.code is ErrorCode.NO_GAME_SERVER


async def test_the_documented_example_runs(tmp_path: Path) -> None:
    """The library example of the lobby's documentation page, as written, against real
    servers: alice runs it, bob joins and readies; alice starts and takes her ticket to the
    game server."""
    page = LOBBY_PAGE.read_text()
    section = page[page.index("\n## The library\n") :]
    code = section[section.index("```python") + len("```python") : section.index("```\n", 10)]
    code = code.replace("trio.run(main)", "")
    key_file = write_key(tmp_path, GAME_KEY)
    async with cluster(1, topics=1, ticket_keys=(GAME_KEY,)) as c:
        game, server = await game_server(c.nursery, key_file, c.topic_names)
        admitted: list[str] = []
        check = server.admit
        assert check is not None

        def counting(peer: tuple[str, int], credentials: bytes) -> object:
            verdict = check(peer, credentials)
            if isinstance(verdict, es.Admitted):
                admitted.append("ok")
            return verdict

        server.admit = counting
        await until(lambda: c.lobby[0].games.live(trio.current_time()) != [])
        namespace: dict[str, object] = {}
        exec(compile(code, "docs/lobby.md", "exec"), namespace)
        namespace["SERVERS"] = c.names
        async with trio.open_nursery() as nursery:
            nursery.start_soon(namespace["main"])  # type: ignore[arg-type]
            await until(lambda: len(c.lobby[0].registry) == 1)
            async with echo.lobby.connect(c.names, member="bob") as bob:
                found = await bob.search()
                await bob.join(found.listings[0].lobby_id)
                await bob.ready()
                start = await bob.next_event(GameStarting)
                assert await echo_once(game, start.ticket) == b"ECHO through the lobby"
                await until(lambda: len(admitted) == 2)  # bob's and alice's tickets
            nursery.cancel_scope.cancel()
