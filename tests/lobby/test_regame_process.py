"""kill -9 of a lobby's home while its game runs, with real processes: three echo-lobby
processes sharing a seat key and a ticket key, and an echo-topics process; the game server and
the members (the library) run here, over real sockets.

alice (owner, team red), bob (team blue) and carol start a game. carol's client goes away in
the middle of it (its seat is kept), then the home is killed (SIGKILL). alice and bob re-create
the lobby on the next server of the ring from their copies: it is still in game there (locked,
the same match). carol's new client takes its seat back there with its resume token and gets a
fresh ticket for the same match, which the game server admits. The game server's signed
result, published once the game is over, ends the game on the new home: every member gets
`GameEnded` with the result, the lobby is unlocked and no one is ready any more.

And the result published right after the kill, before the members have moved: the next server
holds it, and ends the game there as their copies arrive.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import attrs
import trio

import echo.lobby
import echo.session as es
from echo.lobby.client import Rehomed
from echo.lobby.games import GameServerAnnouncement
from echo.lobby.home import failover_home
from echo.lobby.protocol import GameEnded, GameStarting
from echo.lobby.results import GameResult
from echo.lobby.server import announce_game_server, report_game_result
from echo.server.cli import ticket_admission
from echo.server.server import echo_application
from echo.tickets import TicketClaims, TicketKey
from echo.topics import ClientConfig, open_topic_client
from echo.topics.ring import HashRing
from tests.lobby.servers import session_config
from tests.lobby.test_cli import LOBBY, REPO
from tests.ports import free_base

GAME_KEY = TicketKey(3, os.urandom(32))


def start_processes(
    tmp_path: Path, n: int
) -> tuple[list[str], dict[str, subprocess.Popen[bytes]], str]:
    """An echo-topics process and `n` echo-lobby processes (one ring, one seat key, one ticket
    key): (the ring's names, the lobby processes by name, the topic server's name)."""
    seat_key = tmp_path / "seat.key"
    seat_key.write_text(f"1 {os.urandom(32).hex()}\n")
    game_key = tmp_path / "game.key"
    game_key.write_text(f"{GAME_KEY.key_id} {GAME_KEY.secret.hex()}\n")
    topics_port = free_base(1)
    topics = f"127.0.0.1:{topics_port}"
    processes: dict[str, subprocess.Popen[bytes]] = {
        topics: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "echo.topics.serve",
                "--port",
                str(topics_port),
                "--lifetime",
                "3",
                "--log-level",
                "warning",
            ],
            cwd=REPO,
        )
    }
    ports: list[int] = []
    while len(ports) < n:
        port = free_base(40)
        if all(abs(port - p) > 40 for p in ports):
            ports.append(port)
    names = [f"127.0.0.1:{p}" for p in ports]
    for i, port in enumerate(ports):
        log = tmp_path / f"lobby{i}.log"
        with log.open("wb") as out:
            processes[names[i]] = subprocess.Popen(
                [*LOBBY, "--port", str(port), "--max-clients", "16",
                 "--lobby-servers", ",".join(names), "--seat-key", str(seat_key),
                 "--ticket-key", str(game_key), "--topics", topics, "--log-format", "json"],
                cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + 30
        while '"listening"' not in log.read_text():
            assert processes[names[i]].poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)  # another process's file or port: nothing to await
    return names, processes, topics


async def _topic_client(topics: list[str], *, task_status: trio.TaskStatus) -> None:
    async with open_topic_client(topics, ClientConfig(k=1)) as client:
        task_status.started(client)
        await trio.sleep_forever()


async def _play(start: GameStarting) -> TicketClaims:
    """Connect to the game server as the GameStarting says, with its ticket; what the game
    server admitted (it echoes; the claims are checked here from the ticket it took)."""
    async with es.connect(
        start.host, start.port, start.control_port, credentials=start.ticket, timeout=5,
        duologue_ports=start.duologue_ports,
    ) as session:  # fmt: skip
        await session.send(b"ECHO in the game")
        assert await session.receive() == b"ECHO in the game"
    from echo.tickets import open_ticket

    claims = open_ticket(start.ticket, GAME_KEY)
    assert isinstance(claims, TicketClaims)
    return claims


async def _token(client: echo.lobby.LobbyClient) -> bytes:
    with trio.fail_after(10):
        while client.resume_token is None:
            await client.next_event()
    return client.resume_token


async def test_a_game_survives_the_kill_of_its_lobbys_home(tmp_path: Path) -> None:
    await _with_servers(tmp_path, _scenario)


async def test_a_result_sent_while_the_lobby_moves_ends_its_game_on_the_new_home(
    tmp_path: Path,
) -> None:
    """The game server reports the result right after the home died, before the members have
    noticed (they take 2.5 s of silence): the next server holds it, and ends the game as the
    members' copies bring the game there."""
    await _with_servers(tmp_path, _early_result)


async def _with_servers(tmp_path: Path, scenario: Any) -> None:
    names, processes, topics = start_processes(tmp_path, 3)
    try:
        async with trio.open_nursery() as nursery:
            # The game server: admits the tickets of GAME_KEY, announces itself on the topic.
            config = attrs.evolve(session_config(8), duologue_ports="shared")
            server_id = f"{config.address}:{config.port}"
            game_key = tmp_path / "game.key"
            server = es.SessionServer(
                config, echo_application, admit=ticket_admission(str(game_key), server_id)
            )
            await nursery.start(server.run)
            topic = await nursery.start(_topic_client, [topics])
            announcement = GameServerAnnouncement(
                server_id, server_id, 8, config.control_port, "shared", {"region": "eu"}
            )
            nursery.start_soon(
                lambda: announce_game_server(topic, lambda: announcement, interval=0.2)
            )
            await scenario(names, processes, topic, server_id)
            nursery.cancel_scope.cancel()
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=30)


async def _start(owner: echo.lobby.LobbyClient) -> None:
    # (the announcements reach the lobby servers every 0.2 s: the start waits for one)
    with trio.fail_after(20):
        while True:
            try:
                await owner.start({"region": "eu"})
                return
            except echo.lobby.LobbyError as error:
                assert "no game server" in error.message
                await trio.sleep(0.2)  # the next announcement comes from another process


async def _early_result(
    names: list[str],
    processes: dict[str, subprocess.Popen[bytes]],
    topic: object,
    server_id: str,
) -> None:
    connect = {"connect_timeout": 1.0}
    async with (
        echo.lobby.connect(names, member="alice", **connect) as alice,
        echo.lobby.connect(names, member="bob", **connect) as bob,
    ):
        lobby_id = await alice.create("match", 2)
        home = alice.server
        assert home is not None
        await bob.join(lobby_id)
        await bob.ready()
        await _start(alice)
        starts = [await m.next_event(GameStarting) for m in (alice, bob)]
        match_id = starts[0].match_id
        processes[home].send_signal(signal.SIGKILL)
        processes[home].wait(timeout=10)
        result = GameResult(lobby_id, match_id, server_id, {"winner": "alice"})
        await report_game_result(topic, GAME_KEY, result, repeats=3, interval=0.1)
        assert alice.server == home  # (not moved yet: the result came first)
        new_home = failover_home(HashRing(names), lobby_id, {home})
        seen = [await _until_rehomed(member, new_home or "") for member in (alice, bob)]
        for member, before in zip((alice, bob), seen, strict=True):
            ended = next((e for e in before if isinstance(e, GameEnded)), None)
            if ended is None:
                with trio.fail_after(20):
                    ended = await member.next_event(GameEnded)
            assert (ended.match_id, dict(ended.result)) == (match_id, {"winner": "alice"})
            replica = member.replica
            assert replica is not None and not replica.locked and replica.game is None
            assert not any(m.ready for m in replica.members.values())
        # Over: a ticket for it is refused there.
        try:
            await bob.request_ticket()
        except echo.lobby.LobbyError as error:
            assert error.code.name == "NO_GAME"
        else:
            raise AssertionError("a ticket for a game that ended")


async def _scenario(
    names: list[str],
    processes: dict[str, subprocess.Popen[bytes]],
    topic: object,
    server_id: str,
) -> None:
    connect = {"connect_timeout": 1.0}
    async with (
        echo.lobby.connect(names, member="alice", **connect) as alice,
        echo.lobby.connect(names, member="bob", **connect) as bob,
    ):
        lobby_id = await alice.create("match", 3)
        home = alice.server
        assert home is not None
        await alice.set_attributes({"team": "red"})
        await bob.join(lobby_id)
        await bob.set_attributes({"team": "blue"})
        await bob.ready()
        async with echo.lobby.connect(names, member="carol", **connect) as carol:
            await carol.join(lobby_id)
            await carol.ready()
            token = await _token(carol)
            await _start(alice)
            starts = {m.member: await m.next_event(GameStarting) for m in (alice, bob, carol)}
        # carol's client is gone (its seat kept); the game runs.
        match_id = starts["alice"].match_id
        assert {s.match_id for s in starts.values()} == {match_id}
        for member in ("alice", "bob"):
            assert (await _play(starts[member])).match_id == match_id
        # The home dies, mid-game.
        processes[home].send_signal(signal.SIGKILL)
        processes[home].wait(timeout=10)
        ring = HashRing(names)
        new_home = failover_home(ring, lobby_id, {home})
        assert new_home is not None
        for member in (alice, bob):
            await _until_rehomed(member, new_home)
            assert member.replica is not None and member.replica.locked
        # carol's new client: its seat back on the new home, and a fresh ticket for the game
        # that still runs there (the old one's home is dead).
        async with echo.lobby.connect(
            names, member="carol", resume_token=token, **connect
        ) as again:
            assert again.server == new_home
            await again.request_ticket()
            fresh = await again.next_event(GameStarting)
            assert fresh.match_id == match_id and fresh.ticket != starts["carol"].ticket
            assert (fresh.server_id, fresh.control_port) == (
                server_id,
                starts["carol"].control_port,
            )
            claims = await _play(fresh)
            assert claims.member_id == "carol" and claims.match_id == match_id
            assert [(e.member_id, dict(e.attributes)) for e in claims.roster] == [
                ("alice", {"team": "red"}),
                ("bob", {"team": "blue"}),
                ("carol", {}),
            ]
            # Game over: the game server's signed result ends it on the new home.
            result = GameResult(lobby_id, match_id, server_id, {"winner": "carol"})
            await report_game_result(topic, GAME_KEY, result, repeats=5, interval=0.1)
            for member in (alice, bob, again):
                with trio.fail_after(20):
                    ended = await member.next_event(GameEnded)
                assert (ended.match_id, dict(ended.result)) == (match_id, {"winner": "carol"})
                replica = member.replica
                assert replica is not None and not replica.locked
                assert not any(m.ready for m in replica.members.values())
                assert replica.game is None
            assert again.server == new_home and alice.server == new_home


async def _until_rehomed(client: echo.lobby.LobbyClient, target: str) -> list[Any]:
    """The member's client finds the home silent and re-creates the lobby on `target`: the
    events before its `Rehomed` (the new home's updates may come before its reply)."""
    seen = []
    with trio.fail_after(40):
        while not isinstance(event := await client.next_event(), Rehomed):
            seen.append(event)
    assert event.server == target
    await client.wait_until(lambda c: c.replica is not None and c.server == target, 10)
    return seen
