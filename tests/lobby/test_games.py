"""Game-server announcements, the choice at start, and the tickets it hands out."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echo.lobby.games import (
    GameServerAnnouncement,
    GameServerDirectory,
    encode_announcement,
    parse_announcement_untrusted,
)
from echo.lobby.limits import LobbyConfig
from echo.lobby.protocol import (
    CreateLobby,
    ErrorCode,
    JoinLobby,
    LobbyJoined,
    LobbyProtocolError,
    SetReady,
    StartGame,
)
from echo.tickets import TicketClaims, TicketIssuer, TicketKey, verify
from tests.lobby.lab import CONFIG, Lab

G1 = GameServerAnnouncement("game-1", "203.0.113.5:40123", 8)
G2 = GameServerAnnouncement("game-2", "203.0.113.6:40123", 16)


def test_announcement_round_trip_and_hostile_bytes() -> None:
    data = encode_announcement(G1)
    assert data[0] == 2 and parse_announcement_untrusted(data) == G1
    for cut in range(len(data)):
        with pytest.raises(LobbyProtocolError):
            parse_announcement_untrusted(data[:cut])
    with pytest.raises(LobbyProtocolError):
        parse_announcement_untrusted(data + b"\x00")
    with pytest.raises(LobbyProtocolError):
        parse_announcement_untrusted(b"\x03" + data[1:])
    for bad in (
        GameServerAnnouncement("", "a:1", 1),
        GameServerAnnouncement("g", "a:1", 70000),
        GameServerAnnouncement("g" * 256, "a:1", 1),
    ):
        with pytest.raises(LobbyProtocolError):
            encode_announcement(bad)


@settings(max_examples=300)
@given(st.binary(max_size=600))
def test_random_announcement_bytes_raise_only_the_protocol_error(data: bytes) -> None:
    try:
        parse_announcement_untrusted(data)
    except LobbyProtocolError:
        pass


def test_pick_most_room_reserves_and_forgets_silent_servers() -> None:
    d = GameServerDirectory(ttl=5.0)
    d.announce(G1, 0.0)
    d.announce(G2, 1.0)
    assert d.pick(20, 2.0) is None
    assert d.pick(6, 2.0) == G2  # 16 free beats 8
    assert d.free_slots("game-2", 2.0) == 10
    assert d.pick(6, 2.0) == G2  # 10 still beats 8
    assert d.pick(6, 2.0) == G1  # 4 left on game-2 now
    assert d.pick(6, 2.0) is None
    d.announce(G2, 3.0)  # the server's own count replaces the reservations
    assert d.free_slots("game-2", 3.0) == 16
    assert [a.server_id for a in d.live(4.0)] == ["game-1", "game-2"]
    assert [a.server_id for a in d.live(5.0)] == ["game-2"]  # game-1 went silent at 0
    d.withdraw("game-2")
    assert d.live(5.0) == [] and d.pick(1, 5.0) is None


def test_ties_go_to_the_lowest_server_id() -> None:
    d = GameServerDirectory()
    d.announce(GameServerAnnouncement("b", "b:1", 4), 0.0)
    d.announce(GameServerAnnouncement("a", "a:1", 4), 0.0)
    pick = d.pick(1, 0.0)
    assert pick is not None and pick.server_id == "a"


KEY = TicketKey(9, b"g" * 32)
WALL = 1_800_000_000.0


def start_lab(*servers: GameServerAnnouncement, config: LobbyConfig = CONFIG) -> tuple[Lab, int]:
    directory = GameServerDirectory(ttl=60.0)
    for s in servers:
        directory.announce(s, 0.0)
    lab = Lab(config, games=directory, tickets=TicketIssuer(KEY, ttl=30.0, clock=lambda: WALL))
    reply = lab.ok("a", CreateLobby(lab.rid(), "room", 4, False, {}))
    assert isinstance(reply, LobbyJoined)
    for m in ("b", "c"):
        lab.ok(m, JoinLobby(lab.rid(), reply.lobby_id))
    return lab, reply.lobby_id


def test_start_gives_every_connected_member_a_ticket_for_the_chosen_server() -> None:
    lab, lobby_id = start_lab(G1, G2)
    lab.refused("a", StartGame(lab.rid(), lobby_id), ErrorCode.NOT_READY)
    lab.ok("b", SetReady(lab.rid(), lobby_id, "b", True))
    lab.ok("c", SetReady(lab.rid(), lobby_id, "c", True))
    lab.refused("b", StartGame(lab.rid(), lobby_id), ErrorCode.NOT_OWNER)
    lab.disconnect("c")
    lab.ok("a", StartGame(lab.rid(), lobby_id))
    assert lab.reg.counters["games_started"] == 1
    assert sorted(lab.games) == ["a", "b"]  # c is reconnecting: no ticket
    for member in ("a", "b"):
        [start] = lab.games[member]
        assert (start.lobby_id, start.server_id, start.address) == (lobby_id, "game-2", G2.address)
        claims = verify(start.ticket, KEY, "game-2", WALL + 1)
        assert isinstance(claims, TicketClaims)
        assert (claims.lobby_id, claims.member_id, claims.server_id) == (lobby_id, member, "game-2")
        assert (claims.expires_at, claims.key_id) == (WALL + 30, 9)
        # The roster is every seat (c's too, reconnecting), in join order.
        assert [e.member_id for e in claims.roster] == ["a", "b", "c"]
        assert claims.match_id == start.match_id != 0
        assert not isinstance(verify(start.ticket, KEY, "game-1", WALL + 1), TicketClaims)
    # Started lobbies are locked: nobody joins a game in progress.
    s = lab.reg.snapshot(lobby_id)
    assert s is not None and s.locked
    lab.refused("d", JoinLobby(lab.rid(), lobby_id), ErrorCode.LOBBY_LOCKED)
    lab.check_replicas()


def test_start_without_a_game_server_with_room() -> None:
    lab, lobby_id = start_lab(GameServerAnnouncement("tiny", "t:1", 2), config=_no_ready())
    lab.refused("a", StartGame(lab.rid(), lobby_id), ErrorCode.NO_GAME_SERVER)
    no_games = Lab(_no_ready())
    reply = no_games.ok("a", CreateLobby(no_games.rid(), "room", 4, False, {}))
    assert isinstance(reply, LobbyJoined)
    no_games.refused("a", StartGame(no_games.rid(), reply.lobby_id), ErrorCode.NO_GAME_SERVER)


def _no_ready() -> LobbyConfig:
    return attrs.evolve(CONFIG, start_requires_ready=False)


def test_an_exact_fit_is_room_enough() -> None:
    d = GameServerDirectory()
    d.announce(G1, 0.0)
    assert d.pick(8, 0.0) == G1
    assert d.free_slots("game-1", 0.0) == 0 and d.pick(1, 0.0) is None
