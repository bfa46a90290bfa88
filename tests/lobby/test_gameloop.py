"""A lobby's game from start to end, in the pure registry: tags choose the server, tickets carry
the roster, a crashed player gets a fresh ticket, the players' reports bench a server that
refuses them, and the end (a result, a timeout) unlocks the lobby and resets ready states."""

from __future__ import annotations

import attrs

from echo.lobby.gameloop import SERVER_REFUSED, TIMED_OUT
from echo.lobby.games import GameServerAnnouncement, GameServerDirectory
from echo.lobby.limits import LobbyConfig
from echo.lobby.protocol import (
    CreateLobby,
    ErrorCode,
    GameEnded,
    JoinLobby,
    LobbyJoined,
    NumberRange,
    ReportGameServer,
    RequestTicket,
    SetAttributes,
    SetReady,
    StartGame,
    StringEquals,
)
from echo.lobby.state.checks import BUCKET_SWEEP_S
from echo.tickets import RosterEntry, TicketClaims, TicketIssuer, TicketKey, verify
from tests.lobby.lab import CONFIG, Lab

KEY = TicketKey(9, b"g" * 32)
WALL = 1_800_000_000.0
EU = GameServerAnnouncement(
    "eu-1", "10.0.0.1:7000", 8, 7001, "shared", {"region": "eu", "mode": "ctf", "version": "3"}
)
EU_BIG = GameServerAnnouncement(
    "eu-2", "10.0.0.2:7000", 32, 7001, "per-client", {"region": "eu", "mode": "ffa"}
)
US = GameServerAnnouncement("us-1", "10.0.1.1:7000", 64, 7001, "shared", {"region": "us"})
NO_READY = attrs.evolve(CONFIG, start_requires_ready=False, game_life=600.0, reconnect_grace=300.0)


def lab_with(
    *servers: GameServerAnnouncement, config: LobbyConfig = NO_READY
) -> tuple[Lab, int, GameServerDirectory]:
    directory = GameServerDirectory(ttl=1e9, bench_time=60.0)
    for s in servers:
        directory.announce(s, 0.0)
    lab = Lab(config, games=directory, tickets=TicketIssuer(KEY, ttl=30.0, clock=lambda: WALL))
    reply = lab.ok("a", CreateLobby(lab.rid(), "room", 4, False, {"map": "dust", "round": 1}))
    assert isinstance(reply, LobbyJoined)
    for m in ("b", "c"):
        lab.ok(m, JoinLobby(lab.rid(), reply.lobby_id))
    lab.ok("b", SetAttributes(lab.rid(), reply.lobby_id, "b", {"team": "blue"}))
    lab.ok("a", SetAttributes(lab.rid(), reply.lobby_id, "a", {"team": "red"}))
    return lab, reply.lobby_id, directory


def test_tags_choose_the_server_then_free_slots() -> None:
    lab, lobby_id, _ = lab_with(EU, EU_BIG, US)
    lab.ok("a", StartGame(lab.rid(), lobby_id, (StringEquals("region", "eu"),)))
    [start] = lab.games["a"]
    assert start.server_id == "eu-2"  # both are in eu: the one with more free slots
    assert (start.host, start.port, start.control_port) == ("10.0.0.2", 7000, 7001)
    assert start.duologue_ports == "per-client"


def test_every_tag_must_match_and_none_that_fits_is_refused() -> None:
    lab, lobby_id, _ = lab_with(EU, EU_BIG, US)
    wanted = (StringEquals("region", "eu"), StringEquals("mode", "ctf"))
    lab.ok("a", StartGame(lab.rid(), lobby_id, wanted))
    [start] = lab.games["a"]
    assert start.server_id == "eu-1" and start.duologue_ports == "shared"
    lab2, lobby2, _ = lab_with(EU, EU_BIG, US)
    refusal = lab2.refused(
        "a",
        StartGame(lab2.rid(), lobby2, (StringEquals("region", "asia"),)),
        ErrorCode.NO_GAME_SERVER,
    )
    assert "region=asia" in refusal.message
    lab2.refused(
        "a",
        StartGame(lab2.rid(), lobby2, (NumberRange("version", 1, 3),)),
        ErrorCode.FILTER_INVALID,
    )
    # Nothing changed: the lobby is open and nobody has a ticket.
    snap = lab2.reg.snapshot(lobby2)
    assert snap is not None and not snap.locked and lab2.games == {}


def test_tickets_carry_the_roster_the_metadata_and_the_match() -> None:
    lab, lobby_id, _ = lab_with(US)
    lab.ok("a", StartGame(lab.rid(), lobby_id))
    starts = {m: lab.games[m][0] for m in ("a", "b", "c")}
    assert len({s.match_id for s in starts.values()}) == 1
    for member, start in starts.items():
        claims = verify(start.ticket, KEY, "us-1", WALL)
        assert isinstance(claims, TicketClaims)
        assert claims.member_id == member and claims.match_id == start.match_id
        assert claims.roster == (
            RosterEntry("a", {"team": "red"}),
            RosterEntry("b", {"team": "blue"}),
            RosterEntry("c", {}),
        )
        assert claims.metadata == {"map": "dust", "round": 1}


def test_a_roster_too_large_for_a_ticket_is_refused_before_anything_changes() -> None:
    config = attrs.evolve(NO_READY, max_attributes_bytes=1024)
    lab, lobby_id, directory = lab_with(US, config=config)
    for m in ("a", "b", "c"):
        lab.ok(m, SetAttributes(lab.rid(), lobby_id, m, {"bio": "x" * 200}))
    lab.refused("a", StartGame(lab.rid(), lobby_id), ErrorCode.TICKET_TOO_LARGE)
    assert directory.free_slots("us-1", 0.0) == 64  # nothing reserved
    snap = lab.reg.snapshot(lobby_id)
    assert snap is not None and not snap.locked


def test_a_result_unlocks_resets_ready_and_tells_everyone() -> None:
    lab, lobby_id, _ = lab_with(US, config=attrs.evolve(NO_READY, start_requires_ready=True))
    for m in ("b", "c"):
        lab.ok(m, SetReady(lab.rid(), lobby_id, m, True))
    lab.ok("a", StartGame(lab.rid(), lobby_id))
    match_id = lab.games["a"][0].match_id
    assert (
        lab.reg.game_result(lobby_id, match_id + 1, "us-1", {"winner": "a"}, lab.now)[0]
        == "not_running"
    )
    assert (
        lab.reg.game_result(lobby_id, match_id, "eu-1", {"winner": "a"}, lab.now)[0]
        == "wrong_server"
    )
    # Not here: held a while, in case its members re-create it here (its home died).
    assert lab.reg.game_result(lobby_id + 1, match_id, "us-1", {}, lab.now)[0] == "held"
    outcome, sends = lab.reg.game_result(
        lobby_id, match_id, "us-1", {"winner": "b", "turns": 9}, lab.now
    )
    assert outcome == "ended"
    lab.deliver(sends)
    [ended] = [s.message for s in sends]
    assert isinstance(ended, GameEnded)
    assert (ended.match_id, dict(ended.result)) == (match_id, {"winner": "b", "turns": 9})
    assert sorted(sends[0].to) == ["a", "b", "c"]
    snap = lab.reg.snapshot(lobby_id)
    assert snap is not None and not snap.locked
    assert [m.ready for m in snap.members] == [False, False, False]
    lab.check_replicas()  # the members' copies applied GameEnded the same way
    # A repeat of the same result (the game server sends it more than once) changes nothing.
    assert lab.reg.game_result(lobby_id, match_id, "us-1", {"winner": "b"}, lab.now) == (
        "not_running",
        (),
    )
    assert lab.reg.counters["game_results_ended"] == 1
    # The lobby is listed and joinable again, and can start its next game.
    lab.ok("d", JoinLobby(lab.rid(), lobby_id))
    lab.refused("a", StartGame(lab.rid(), lobby_id), ErrorCode.NOT_READY)


def test_a_crashed_player_gets_a_fresh_ticket_while_the_game_runs() -> None:
    lab, lobby_id, _ = lab_with(US)
    lab.ok("a", StartGame(lab.rid(), lobby_id))
    first = lab.games["b"][0]
    lab.disconnect("b")
    lab.advance(100.0)  # long after the ticket's 30 s: the game still runs
    lab.reconnect("b")
    lab.ok("b", RequestTicket(lab.rid(), lobby_id))
    again = lab.games["b"][-1]
    assert again.match_id == first.match_id and again.server_id == first.server_id
    claims = verify(again.ticket, KEY, "us-1", WALL)
    assert isinstance(claims, TicketClaims) and claims.member_id == "b"
    assert lab.reg.counters["tickets_reissued"] == 1
    # Somebody outside the lobby gets nothing.
    lab.refused("z", RequestTicket(lab.rid(), lobby_id), ErrorCode.NOT_MEMBER)


def test_the_game_s_life_bounds_the_re_issue_and_ends_the_game() -> None:
    lab, lobby_id, _ = lab_with(US)
    lab.ok("a", StartGame(lab.rid(), lobby_id))
    life_end = lab.now + NO_READY.game_life
    lab.advance(BUCKET_SWEEP_S)  # the requests' rate buckets are full again and forgotten
    assert lab.reg.next_deadline() == life_end
    sends = lab.advance(life_end - lab.now)
    [ended] = [s.message for s in sends if isinstance(s.message, GameEnded)]
    assert ended.result == {"error": TIMED_OUT}
    lab.refused("b", RequestTicket(lab.rid(), lobby_id), ErrorCode.NO_GAME)
    snap = lab.reg.snapshot(lobby_id)
    assert snap is not None and not snap.locked
    lab.advance(BUCKET_SWEEP_S)
    assert lab.reg.next_deadline() is None
    lab.check_replicas()


def test_no_game_no_ticket_and_no_report() -> None:
    lab, lobby_id, _ = lab_with(US)
    lab.refused("b", RequestTicket(lab.rid(), lobby_id), ErrorCode.NO_GAME)
    lab.refused("b", ReportGameServer(lab.rid(), lobby_id, "us-1", "refused"), ErrorCode.NO_GAME)


def test_reports_from_half_the_players_bench_the_server_and_end_the_game() -> None:
    lab, lobby_id, directory = lab_with(EU_BIG, US)
    lab.ok("a", StartGame(lab.rid(), lobby_id))
    assert lab.games["a"][0].server_id == "us-1"
    lab.refused(
        "b", ReportGameServer(lab.rid(), lobby_id, "eu-2", "refused"), ErrorCode.BAD_REQUEST
    )
    lab.ok("b", ReportGameServer(lab.rid(), lobby_id, "us-1", "ticket refused: bad_signature"))
    lab.ok("b", ReportGameServer(lab.rid(), lobby_id, "us-1", "again"))  # one member, one vote
    assert directory.benched(lab.now) == [] and lab.reg.game_of(lobby_id) is not None
    sends = lab.do("c", ReportGameServer(lab.rid(), lobby_id, "us-1", "refused")).sends
    [ended] = [s.message for s in sends if isinstance(s.message, GameEnded)]
    assert ended.result == {"error": SERVER_REFUSED, "server_id": "us-1"}
    assert directory.benched(lab.now) == ["us-1"]
    # The next start goes elsewhere, though us-1 has more room and keeps announcing.
    directory.announce(US, lab.now)
    lab.ok("a", StartGame(lab.rid(), lobby_id))
    assert lab.games["a"][-1].server_id == "eu-2"
    # After the bench time it is back in rotation.
    assert directory.benched(lab.now + 60.0) == []
    assert directory.choose(3, lab.now + 60.0) == US


def test_a_start_while_a_game_runs_ends_it_first() -> None:
    lab, lobby_id, _ = lab_with(US)
    lab.ok("a", StartGame(lab.rid(), lobby_id))
    first = lab.games["a"][0].match_id
    sends = lab.do("a", StartGame(lab.rid(), lobby_id)).sends
    [ended] = [s.message for s in sends if isinstance(s.message, GameEnded)]
    assert ended.match_id == first and ended.result == {"error": "restarted"}
    second = lab.games["a"][-1].match_id
    assert second != first
    # The old game's result comes too late: nothing happens.
    assert (
        lab.reg.game_result(lobby_id, first, "us-1", {"winner": "a"}, lab.now)[0] == "not_running"
    )
    snap = lab.reg.snapshot(lobby_id)
    assert snap is not None and snap.locked
    lab.check_replicas()
