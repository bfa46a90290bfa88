"""A lobby re-created after its home died keeps its running game, in the pure registry: the
members' copies carry their tickets and the game's life; the next server believes the game
from the tickets' signature alone, merges the copies (rule 7 of the re-creation), re-issues
tickets for it, and ends it with the game server's result, even one that came before the
lobby did."""

from __future__ import annotations

import attrs

from echo.lobby.gameloop import TIMED_OUT
from echo.lobby.games import GameServerAnnouncement, GameServerDirectory
from echo.lobby.protocol import (
    CreateLobby,
    ErrorCode,
    GameCopy,
    GameEnded,
    GameLife,
    GameStarting,
    JoinLobby,
    LobbyJoined,
    RecreateLobby,
    ReportGameServer,
    RequestTicket,
    SetAttributes,
    SetLocked,
    SetReady,
    StartGame,
)
from echo.lobby.replica import LobbyReplica
from echo.tickets import TicketIssuer, TicketKey
from tests.lobby.lab import CONFIG, Lab

KEY = TicketKey(9, b"g" * 32)
WALL = 1_800_000_000.0
GAME = GameServerAnnouncement(
    "eu-1", "10.0.0.1:7000", 8, 7001, "shared", {"region": "eu"}, b"\x05" * 32
)
LIFE = 600.0
CONFIG_GAMES = attrs.evolve(CONFIG, game_life=LIFE, reconnect_grace=300.0, result_hold=20.0)


def home(key: TicketKey = KEY, *, announced: bool = True) -> Lab:
    directory = GameServerDirectory(ttl=1e9, bench_time=60.0)
    if announced:
        directory.announce(GAME, 0.0)
    return Lab(
        CONFIG_GAMES, games=directory, tickets=TicketIssuer(key, ttl=30.0, clock=lambda: WALL)
    )


def started() -> tuple[Lab, int, int]:
    """a (owner, team red), b (team blue) and c in a lobby whose game runs: (lab, lobby, match)."""
    lab = home()
    reply = lab.ok("a", CreateLobby(lab.rid(), "room", 4, False, {"map": "dust"}))
    assert isinstance(reply, LobbyJoined)
    lobby_id = reply.lobby_id
    for m in ("b", "c"):
        lab.ok(m, JoinLobby(lab.rid(), lobby_id))
        lab.ok(m, SetReady(lab.rid(), lobby_id, m, True))
    lab.ok("a", SetAttributes(lab.rid(), lobby_id, "a", {"team": "red"}))
    lab.ok("b", SetAttributes(lab.rid(), lobby_id, "b", {"team": "blue"}))
    lab.ok("a", StartGame(lab.rid(), lobby_id))
    match_id = lab.games["a"][0].match_id
    assert {lab.games[m][0].match_id for m in "abc"} == {match_id}
    return lab, lobby_id, match_id


def test_a_start_tells_each_member_the_games_life_and_its_copy_carries_it() -> None:
    lab, _, _ = started()
    start = lab.games["b"][0]
    lab.now += 100.0
    copy = lab.replicas["b"].recreate_request(1, lab.now)
    # The ticket it was given, and what is left of the life: 600 s - 100 s.
    assert copy.game == GameCopy(start.ticket, 500_000)
    # Without a clock: the life as it was received.
    assert lab.replicas["b"].recreate_request(1).game.life_ms == 600_000


def test_the_next_server_re_creates_the_running_game_from_the_copies() -> None:
    old, lobby_id, match_id = started()
    old.now = 50.0
    new = home()
    new.now = 1000.0  # another machine's monotonic clock
    new.ok("a", old.replicas["a"].recreate_request(new.rid(), old.now))
    game = new.reg.game_of(lobby_id)
    assert game is not None
    snap = new.reg.snapshot(lobby_id)
    assert snap is not None and snap.locked
    # From the ticket: the game server, the match, the roster (teams) and the metadata.
    assert (game.match_id, game.server_id) == (match_id, "eu-1")
    assert [(e.member_id, dict(e.attributes)) for e in game.roster] == [
        ("a", {"team": "red"}),
        ("b", {"team": "blue"}),
        ("c", {}),
    ]
    assert game.metadata == {"map": "dust"}
    # From the game server's own announcement here: where players connect, and its key.
    assert (game.address, game.control_port, game.duologue_ports) == (
        "10.0.0.1:7000",
        7001,
        "shared",
    )
    assert game.server_key == GAME.public_key
    # Its life goes on where it was: 550 s left on this server's clock.
    assert game.until == 1000.0 + 550.0
    assert game.holders == {"a"}
    # b's copy of the same game: one more ticket holder, one game.
    new.ok("b", old.replicas["b"].recreate_request(new.rid(), old.now))
    assert new.reg.game_of(lobby_id) is game and game.holders == {"a", "b"}
    assert new.reg.counters["games_recreated"] == 1
    new.check_replicas()


def test_a_crashed_member_gets_a_fresh_ticket_from_the_new_home() -> None:
    old, lobby_id, match_id = started()
    new = home()
    new.ok("a", old.replicas["a"].recreate_request(new.rid(), old.now))
    # c's process died with its copy: it comes back with nothing of the game, and asks.
    bare = LobbyReplica("c", old.replicas["c"].snapshot())
    new.ok("c", bare.recreate_request(new.rid()))
    new.now += 30.0
    handled = new.do("c", RequestTicket(new.rid(), lobby_id))
    # The fresh ticket, then the game's life left on the new home's clock.
    fresh, life = (s.message for s in handled.sends)
    assert isinstance(fresh, GameStarting) and fresh is new.games["c"][-1]
    assert life == GameLife(lobby_id, match_id, (LIFE - 30.0) * 1000)
    assert fresh.match_id == match_id and fresh.server_id == "eu-1"
    assert (fresh.address, fresh.control_port, fresh.server_key) == (
        "10.0.0.1:7000",
        7001,
        GAME.public_key,
    )
    claims = new.reg._tickets.claims(fresh.ticket)  # type: ignore[union-attr]
    assert claims is not None and (claims.member_id, claims.match_id) == ("c", match_id)
    assert [e.member_id for e in claims.roster] == ["a", "b", "c"]
    assert new.reg.counters["tickets_reissued"] == 1
    # Its copy now carries the game too.
    assert new.replicas["c"].game == fresh
    assert new.replicas["c"].game_copy() == GameCopy(fresh.ticket, (LIFE - 30.0) * 1000)


def test_the_game_servers_result_ends_the_re_created_game_for_everyone() -> None:
    old, lobby_id, match_id = started()
    new = home()
    for m in "abc":
        new.ok(m, old.replicas[m].recreate_request(new.rid(), old.now))
    outcome, sends = new.reg.game_result(lobby_id, match_id, "eu-1", {"winner": "b"}, new.now)
    assert outcome == "ended"
    new.deliver(sends)
    [ended] = [s.message for s in sends]
    assert isinstance(ended, GameEnded) and ended.result == {"winner": "b"}
    snap = new.reg.snapshot(lobby_id)
    assert snap is not None and not snap.locked
    assert not any(m.ready for m in snap.members)
    assert new.reg.game_of(lobby_id) is None
    for m in "abc":
        assert new.replicas[m].game is None and not new.replicas[m].locked
    new.check_replicas()


def test_a_result_that_comes_before_the_lobby_is_held_and_ends_the_game_when_all_arrived() -> None:
    old, lobby_id, match_id = started()
    new = home()
    outcome, sends = new.reg.game_result(lobby_id, match_id, "eu-1", {"winner": "a"}, new.now)
    assert (outcome, sends) == ("held", ())
    new.now += 1.0
    new.ok("a", old.replicas["a"].recreate_request(new.rid(), old.now))
    new.ok("b", old.replicas["b"].recreate_request(new.rid(), old.now))
    # Not yet: c is on its way, and would get the lobby's state without the result.
    assert new.reg.game_of(lobby_id) is not None
    handled = new.do("c", old.replicas["c"].recreate_request(new.rid(), old.now))
    # The snapshot first, then the GameEnded as the next version, to all three.
    kinds = [type(s.message).__name__ for s in handled.sends]
    assert kinds.index("LobbySnapshot") < kinds.index("GameEnded")
    [ended] = [s for s in handled.sends if isinstance(s.message, GameEnded)]
    assert set(ended.to) == {"a", "b", "c"} and ended.message.result == {"winner": "a"}
    assert new.reg.game_of(lobby_id) is None
    for m in "abc":
        assert new.replicas[m].game is None and not new.replicas[m].locked
    assert new.reg.counters["game_results_applied_late"] == 1
    assert new.reg._held_results == {}
    # A copy of that game sent again (a retry): it ended here, and no copy brings it back.
    new.ok("b", old.replicas["b"].recreate_request(new.rid(), old.now))
    assert new.reg.game_of(lobby_id) is None
    snap = new.reg.snapshot(lobby_id)
    assert snap is not None and not snap.locked
    assert new.gaps == []
    new.check_replicas()


def test_a_held_result_ends_the_game_at_the_windows_end_without_the_members_who_crashed() -> None:
    old, lobby_id, match_id = started()
    new = home()
    assert new.reg.game_result(lobby_id, match_id, "eu-1", {"winner": "b"}, new.now)[0] == "held"
    new.ok("a", old.replicas["a"].recreate_request(new.rid(), old.now))
    new.ok("b", old.replicas["b"].recreate_request(new.rid(), old.now))
    # c never comes (it crashed with the home): the game ends when the window closes.
    window = CONFIG_GAMES.recreate_window
    assert new.reg.next_deadline() == new.now + window
    assert new.advance(window - 0.5) == ()
    sends = new.advance(0.5)
    [ended] = [s for s in sends if isinstance(s.message, GameEnded)]
    assert set(ended.to) == {"a", "b"} and ended.message.result == {"winner": "b"}
    assert new.reg.game_of(lobby_id) is None
    new.check_replicas()
    new.check_replicas()


def test_a_held_result_is_forgotten_after_its_time() -> None:
    old, lobby_id, match_id = started()
    new = home()
    assert new.reg.game_result(lobby_id, match_id, "eu-1", {}, new.now)[0] == "held"
    new.advance(CONFIG_GAMES.result_hold + 1)
    new.ok("a", old.replicas["a"].recreate_request(new.rid(), old.now))
    assert new.reg.game_of(lobby_id) is not None  # still running: the result was forgotten
    assert new.reg.counters["game_results_applied_late"] == 0


def test_held_results_are_bounded() -> None:
    new = home()
    new.reg.config = attrs.evolve(CONFIG_GAMES, max_held_results=3)
    for lobby_id in range(1, 6):
        assert new.reg.game_result(lobby_id, 7, "eu-1", {}, new.now)[0] == "held"
    assert sorted(new.reg._held_results) == [3, 4, 5]  # the oldest went first


def test_a_copy_whose_ticket_is_not_ours_brings_no_game() -> None:
    old, lobby_id, _ = started()
    forger = home(TicketKey(9, b"f" * 32))
    ticket = forger.reg._tickets.issue(lobby_id, "a", "evil-1", match_id=5)  # type: ignore[union-attr]
    copy = old.replicas["a"].recreate_request(1, old.now)
    others = old.replicas["b"].recreate_request(1, old.now).game.ticket
    for bad in (
        GameCopy(ticket, 60_000),  # signed with another key
        GameCopy(others, 60_000),  # b's ticket, sent by a
        GameCopy(b"\x02" + b"x" * 60, 60_000),  # not a ticket
        GameCopy(copy.game.ticket, 0),  # no life left
    ):
        new = home()
        new.ok("a", attrs.evolve(copy, request_id=new.rid(), game=bad))
        snap = new.reg.snapshot(lobby_id)
        assert snap is not None and snap.locked  # the copy's lock, without a game
        assert new.reg.game_of(lobby_id) is None
        assert new.reg.counters["game_copies_refused"] == 1
        new.refused("a", RequestTicket(new.rid(), lobby_id), ErrorCode.NO_GAME)


def test_a_newer_copy_that_saw_the_game_end_wins_whichever_comes_first() -> None:
    old, lobby_id, match_id = started()
    stale = old.replicas["c"].recreate_request(1, old.now)  # c missed the end
    sends = old.reg.game_result(lobby_id, match_id, "eu-1", {"winner": "a"}, old.now)[1]
    old.deliver(s for s in sends if s.to == ("a",) or "a" in s.to)
    ended = old.replicas["a"].recreate_request(1, old.now)
    assert ended.game == GameCopy() and not ended.snapshot.locked
    assert ended.snapshot.version > stale.snapshot.version
    for order in (("c", "a"), ("a", "c")):
        new = home()
        copies = {"c": stale, "a": ended}
        for m in order:
            new.ok(m, attrs.evolve(copies[m], request_id=new.rid()))
        assert new.reg.game_of(lobby_id) is None, order
        snap = new.reg.snapshot(lobby_id)
        assert snap is not None and not snap.locked


def test_a_copy_without_a_game_that_is_still_locked_takes_nothing_away() -> None:
    """A member who never held a ticket (it resumed and did not ask) sends no game; its copy
    is as new, and locked: the game of the others' copies stands."""
    old, lobby_id, match_id = started()
    new = home()
    bare = LobbyReplica("c", old.replicas["c"].snapshot())
    new.ok("c", bare.recreate_request(new.rid()))
    assert new.reg.game_of(lobby_id) is None
    new.ok("a", old.replicas["a"].recreate_request(new.rid(), old.now))
    game = new.reg.game_of(lobby_id)
    assert game is not None and game.match_id == match_id


def test_an_owner_who_unlocked_mid_game_keeps_the_game_in_the_copies() -> None:
    old, lobby_id, match_id = started()
    old.ok("a", SetLocked(old.rid(), lobby_id, False))
    new = home()
    new.ok("a", old.replicas["a"].recreate_request(new.rid(), old.now))
    game = new.reg.game_of(lobby_id)
    assert game is not None and game.match_id == match_id


def test_the_re_created_game_keeps_its_life_bound() -> None:
    old, lobby_id, match_id = started()
    old.now = LIFE - 10.0
    new = home()
    new.ok("a", old.replicas["a"].recreate_request(new.rid(), old.now))
    new.advance(9.0)
    assert new.reg.game_of(lobby_id) is not None
    sends = new.advance(1.5)
    [ended] = [s.message for s in sends if isinstance(s.message, GameEnded)]
    assert ended.match_id == match_id and ended.result == {"error": TIMED_OUT}
    new.check_replicas()


def test_a_copys_life_is_at_most_the_servers_game_life() -> None:
    old, lobby_id, _ = started()
    copy = old.replicas["a"].recreate_request(1, old.now)
    new = home()
    new.ok(
        "a", attrs.evolve(copy, request_id=new.rid(), game=GameCopy(copy.game.ticket, 2**32 - 1))
    )
    game = new.reg.game_of(lobby_id)
    assert game is not None and game.until == new.now + LIFE


def test_a_fresh_ticket_waits_for_the_game_servers_announcement() -> None:
    old, lobby_id, match_id = started()
    new = home(announced=False)
    new.ok("a", old.replicas["a"].recreate_request(new.rid(), old.now))
    refusal = new.refused("a", RequestTicket(new.rid(), lobby_id), ErrorCode.NO_GAME_SERVER)
    assert "eu-1" in refusal.message
    assert new.reg._games is not None
    new.reg._games.announce(GAME, new.now)
    new.ok("a", RequestTicket(new.rid(), lobby_id))
    fresh = new.games["a"][-1]
    assert fresh.match_id == match_id and fresh.address == GAME.address


def test_a_server_without_the_ticket_key_re_creates_the_lobby_without_its_game() -> None:
    old, lobby_id, _ = started()
    new = Lab(CONFIG_GAMES)
    new.ok("a", old.replicas["a"].recreate_request(new.rid(), old.now))
    assert new.reg.game_of(lobby_id) is None
    assert new.reg.counters["game_copies_refused"] == 1


def test_the_replica_forgets_the_game_when_it_ends_or_its_life_runs_out() -> None:
    old, lobby_id, match_id = started()
    replica = old.replicas["b"]
    assert replica.game_copy(old.now + LIFE + 1) == GameCopy()  # its life is over
    assert replica.game_copy(old.now + 1).life_ms == (LIFE - 1) * 1000
    old.deliver(old.reg.game_result(lobby_id, match_id, "eu-1", {}, old.now)[1])
    assert replica.game is None and replica.game_copy(old.now) == GameCopy()
    # A GameStarting for another lobby is not this copy's game.
    replica.note_game(attrs.evolve(old.games["b"][0], lobby_id=lobby_id + 1), old.now)
    assert replica.game is None
    # A life for another game is not this game's; without a life, no copy.
    replica.note_game(old.games["b"][0], old.now)
    replica.note_game(GameLife(lobby_id, match_id + 1, 5000), old.now)
    assert replica.game_copy(old.now) == GameCopy()
    replica.note_game(GameLife(lobby_id, match_id, 5000), old.now)
    assert replica.game_copy(old.now) == GameCopy(old.games["b"][0].ticket, 5000)


def test_a_copy_with_a_game_survives_the_wire() -> None:
    from echo.lobby.protocol import encode, parse_request_untrusted

    old, _, _ = started()
    copy = old.replicas["a"].recreate_request(3, old.now)
    assert isinstance(copy, RecreateLobby) and copy.game != GameCopy()
    assert parse_request_untrusted(encode(copy)) == copy


def test_a_game_that_ended_on_the_new_home_is_not_brought_back_by_a_later_copy() -> None:
    """a's copy re-creates the game; a finds the game server refusing it and reports it (the
    only ticket holder so far: the game ends); b's copy of that game, still on its way within
    the re-creation window, arrives after the end and does not bring it back."""
    old, lobby_id, _ = started()
    new = home()
    new.ok("a", old.replicas["a"].recreate_request(new.rid(), old.now))
    new.ok("a", ReportGameServer(new.rid(), lobby_id, "eu-1", "ticket refused"))
    assert new.reg.game_of(lobby_id) is None
    new.ok("b", old.replicas["b"].recreate_request(new.rid(), old.now))
    assert new.reg.game_of(lobby_id) is None
    assert new.reg.counters["game_copies_stale"] == 1
    new.refused("b", RequestTicket(new.rid(), lobby_id), ErrorCode.NO_GAME)
    new.check_replicas()
