"""The game server in the loop, over real sockets: lobby servers, a topic server and game
servers on loopback. GameStarting carries everything a player needs to connect; a start picks
its server by tags; a game server that refuses the lobby's tickets is reported by the players
and taken out of rotation; the game server's signed result ends the game and the members hear
GameEnded, while a forged result is ignored and counted."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import trio

import echo.lobby
import echo.session as es
from echo.lobby.client import LobbyError
from echo.lobby.games import GameServerAnnouncement
from echo.lobby.protocol import ErrorCode, GameEnded, GameStarting
from echo.lobby.results import GameResult
from echo.lobby.server import announce_game_server, report_game_result
from echo.server.cli import ticket_admission
from echo.server.server import echo_application
from echo.tickets import TicketClaims, TicketKey
from echo.topics import ClientConfig, open_topic_client
from tests.lobby.servers import GAME_KEY, cluster, session_config, until
from tests.lobby.test_server_games import write_key


async def _topic_client(topics: list[str], *, task_status: trio.TaskStatus) -> None:
    async with open_topic_client(topics, ClientConfig(k=1)) as client:
        task_status.started(client)
        await trio.sleep_forever()


async def game_server(
    nursery: trio.Nursery,
    key_file: Path,
    topics: list[str],
    tags: dict[str, str],
    *,
    slots: int = 8,
    mode: str = "shared",
) -> tuple[es.ServerConfig, es.SessionServer, object]:
    """An echo-server-alike that checks tickets with `key_file` and announces its tags,
    control port and duologue mode; returns its config, server and topic client."""
    config = attrs.evolve(session_config(8), duologue_ports=mode)
    server_id = f"{config.address}:{config.port}"
    server = es.SessionServer(
        config, echo_application, admit=ticket_admission(str(key_file), server_id)
    )
    await nursery.start(server.run)
    client = await nursery.start(_topic_client, topics)
    announcement = GameServerAnnouncement(
        server_id, server_id, slots, config.control_port, mode, tags
    )
    nursery.start_soon(lambda: announce_game_server(client, lambda: announcement, interval=0.2))
    return config, server, client


async def play(start: GameStarting) -> bytes:
    """What a player does with its GameStarting alone: connect where it says, as it says."""
    async with es.connect(
        start.host,
        start.port,
        start.control_port,
        credentials=start.ticket,
        timeout=5,
        duologue_ports=start.duologue_ports,
    ) as session:
        await session.send(b"ECHO hello game")
        return await session.receive()


async def test_a_signed_result_ends_the_game_and_a_forged_one_is_counted(tmp_path: Path) -> None:
    key_file = write_key(tmp_path, GAME_KEY)
    events: list = []
    async with cluster(1, topics=1, ticket_keys=(GAME_KEY,), events=events) as c:
        game, _, topic = await game_server(c.nursery, key_file, c.topic_names, {"region": "eu"})
        lobby_server = c.lobby[0]
        await until(lambda: lobby_server.games.live(trio.current_time()) != [])
        async with (
            echo.lobby.connect(c.names, member="owner") as owner,
            echo.lobby.connect(c.names, member="bob") as bob,
        ):
            lobby_id = await owner.create("match", 2)
            await bob.join(lobby_id)
            await bob.set_attributes({"team": "blue"})
            await bob.ready()
            await owner.start()
            starts = [await m.next_event(GameStarting) for m in (owner, bob)]
            match_id = starts[0].match_id
            assert match_id != 0 and {s.match_id for s in starts} == {match_id}
            for start in starts:
                # Everything to connect came in the GameStarting: the control port and the
                # "shared" duologue mode too (a mismatch would time out the handshake).
                assert (start.control_port, start.duologue_ports) == (game.control_port, "shared")
                assert await play(start) == b"ECHO hello game"
            # A result signed with another key: ignored, counted, the lobby stays locked.
            forged = TicketKey(GAME_KEY.key_id, b"f" * 32)
            result = GameResult(lobby_id, match_id, starts[0].server_id, {"winner": "bob"})
            await report_game_result(topic, forged, result, repeats=1)
            await until(lambda: lobby_server.counters["game_results_refused"] >= 1)
            assert owner.replica is not None and owner.replica.locked
            assert lobby_server.registry.game_of(lobby_id) is not None
            # The game server's own result: the game ends for everyone.
            await report_game_result(topic, GAME_KEY, result, repeats=3, interval=0.05)
            for member in (owner, bob):
                ended = await member.next_event(GameEnded)
                assert (ended.match_id, dict(ended.result)) == (match_id, {"winner": "bob"})
                assert member.replica is not None and not member.replica.locked
                assert not any(m.ready for m in member.replica.members.values())
            await until(lambda: lobby_server.registry.counters["game_results_not_running"] >= 1)
            assert lobby_server.registry.counters["game_results_ended"] == 1
            assert lobby_server.counters["game_results_refused"] == 1
    assert ("game_result_refused", {"reason": "bad_signature"}) in events
    assert (
        "game_ended",
        {"lobby_id": lobby_id, "match_id": match_id, "game_server": starts[0].server_id},
    ) in events


async def test_start_filters_game_servers_by_their_tags(tmp_path: Path) -> None:
    key_file = write_key(tmp_path, GAME_KEY)
    async with cluster(1, topics=1, ticket_keys=(GAME_KEY,)) as c:
        eu, _, _ = await game_server(c.nursery, key_file, c.topic_names, {"region": "eu"}, slots=8)
        us, _, _ = await game_server(
            c.nursery, key_file, c.topic_names, {"region": "us", "mode": "ctf"}, slots=4
        )
        await until(lambda: len(c.lobby[0].games.live(trio.current_time())) == 2)
        async with echo.lobby.connect(c.names, member="owner") as owner:
            await owner.create("solo", 1)
            with pytest.raises(LobbyError) as refused:
                await owner.start({"region": "mars"})
            assert refused.value.code is ErrorCode.NO_GAME_SERVER
            assert "region=mars" in refused.value.message
            await owner.start({"region": "us", "mode": "ctf"})  # fewer slots, but the tags fit
            start = await owner.next_event(GameStarting)
            assert start.port == us.port and start.control_port == us.control_port
            claims_ok = await play(start)
            assert claims_ok == b"ECHO hello game"
            assert eu.port != us.port


async def test_a_server_that_refuses_the_tickets_is_reported_and_out_of_rotation(
    tmp_path: Path,
) -> None:
    good_key = write_key(tmp_path, GAME_KEY)
    (tmp_path / "wrong").mkdir()
    wrong_key = write_key(tmp_path / "wrong", TicketKey(GAME_KEY.key_id, b"w" * 32))
    async with cluster(1, topics=1, ticket_keys=(GAME_KEY,)) as c:
        # The misconfigured one has more room: without reports it would get every game.
        bad, _, _ = await game_server(c.nursery, wrong_key, c.topic_names, {}, slots=32)
        good, _, _ = await game_server(c.nursery, good_key, c.topic_names, {}, slots=8)
        lobby_server = c.lobby[0]
        await until(lambda: len(lobby_server.games.live(trio.current_time())) == 2)
        async with (
            echo.lobby.connect(c.names, member="owner") as owner,
            echo.lobby.connect(c.names, member="bob") as bob,
        ):
            lobby_id = await owner.create("match", 2)
            await bob.join(lobby_id)
            await bob.ready()
            await owner.start()
            for member in (owner, bob):
                start = await member.next_event(GameStarting)
                assert start.port == bad.port
                with pytest.raises(es.Rejected, match="bad_signature") as rejected:
                    await play(start)
            # Half the players' word (one of two) is enough: the game ends for both.
            await owner.report_game_server(start.server_id, str(rejected.value))
            for member in (owner, bob):
                ended = await member.next_event(GameEnded)
                assert ended.result["error"] == "game_server_refused"
            with pytest.raises(LobbyError) as late:  # bob's report comes after the end
                await bob.report_game_server(start.server_id, "refused too")
            assert late.value.code is ErrorCode.NO_GAME
            bad_id = f"{bad.address}:{bad.port}"
            assert lobby_server.games.benched(trio.current_time()) == [bad_id]
            # It keeps announcing, but the next start goes to the server that admits us.
            await bob.ready()
            await owner.start()
            for member in (owner, bob):
                start = await member.next_event(GameStarting)
                assert start.port == good.port
                assert await play(start) == b"ECHO hello game"
            assert lobby_server.registry.counters["game_servers_benched"] == 1


async def test_a_player_back_in_its_seat_gets_a_fresh_ticket_for_the_running_game(
    tmp_path: Path,
) -> None:
    """In process: bob's client goes away without a word and a new client of bob takes the
    seat back with its resume token; the game still runs, and a ticket request gives it a
    fresh ticket for the same match, long after the first ticket expired."""
    key_file = write_key(tmp_path, GAME_KEY)
    async with cluster(1, topics=1, ticket_keys=(GAME_KEY,), ticket_ttl=1.0) as c:
        game, _, _ = await game_server(c.nursery, key_file, c.topic_names, {})
        await until(lambda: c.lobby[0].games.live(trio.current_time()) != [])
        async with echo.lobby.connect(c.names, member="owner") as owner:
            lobby_id = await owner.create("match", 2)
            async with echo.lobby.connect(c.names, member="bob") as bob:
                await bob.join(lobby_id)
                await bob.ready()
                token = await _token(bob)
                await owner.start()
                first = await bob.next_event(GameStarting)
            # A deadline let pass on purpose: the first ticket's 1 s lifetime runs out.
            await trio.sleep(1.2)
            with pytest.raises(es.Rejected, match="expired"):
                await play(first)
            async with echo.lobby.connect(c.names, member="bob", resume_token=token) as again:
                await again.request_ticket()
                fresh = await again.next_event(GameStarting)
                assert fresh.match_id == first.match_id and fresh.ticket != first.ticket
                assert await play(fresh) == b"ECHO hello game"
            assert c.lobby[0].registry.counters["tickets_reissued"] == 1
            assert game.port == fresh.port


async def _token(client: echo.lobby.LobbyClient) -> bytes:
    with trio.fail_after(10):
        while client.resume_token is None:
            await client.next_event()
    return client.resume_token


async def test_claims_of_a_ticket_name_the_roster(tmp_path: Path) -> None:
    """The game server reads the teams from the ticket it admitted: session.admission."""
    key_file = write_key(tmp_path, GAME_KEY)
    seen: list[TicketClaims] = []

    async def game_app(session: es.Session) -> None:
        claims = session.admission
        assert isinstance(claims, TicketClaims)
        seen.append(claims)
        await session.send(f"team {claims.attributes.get('team')}".encode())
        await session.receive()

    async with cluster(1, topics=1, ticket_keys=(GAME_KEY,)) as c:
        config = attrs.evolve(session_config(4), duologue_ports="shared")
        server_id = f"{config.address}:{config.port}"
        server = es.SessionServer(
            config, game_app, admit=ticket_admission(str(key_file), server_id)
        )
        await c.nursery.start(server.run)
        topic = await c.nursery.start(_topic_client, c.topic_names)
        announcement = GameServerAnnouncement(
            server_id, server_id, 4, config.control_port, "shared", {}
        )
        c.nursery.start_soon(
            lambda: announce_game_server(topic, lambda: announcement, interval=0.2)
        )
        await until(lambda: c.lobby[0].games.live(trio.current_time()) != [])
        async with (
            echo.lobby.connect(c.names, member="red") as red,
            echo.lobby.connect(c.names, member="blue") as blue,
        ):
            lobby_id = await red.create("match", 2, metadata={"mode": "ctf"})
            await red.set_attributes({"team": "red"})
            await blue.join(lobby_id)
            await blue.set_attributes({"team": "blue"})
            await blue.ready()
            await red.start()
            for member, team in ((red, "red"), (blue, "blue")):
                start = await member.next_event(GameStarting)
                async with es.connect(
                    start.host, start.port, start.control_port, credentials=start.ticket,
                    timeout=5, duologue_ports=start.duologue_ports,
                ) as session:  # fmt: skip
                    assert await session.receive() == f"team {team}".encode()
        assert {c.member_id for c in seen} == {"red", "blue"}
        assert all(
            [(e.member_id, dict(e.attributes)) for e in c.roster]
            == [("red", {"team": "red"}), ("blue", {"team": "blue"})]
            and c.metadata == {"mode": "ctf"}
            for c in seen
        )
