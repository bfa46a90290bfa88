"""The lobby registry's entry points at their edges (echo.lobby.state.registry): a request
that is no request, the refusal an operator reads in the log, the counters the metrics
scrape (totals, not the last event), a match's lobby at its size bounds and with its seats'
tags, and the queries for a lobby that is gone.

Pure: the registry through `tests.lobby.lab.Lab`, no sockets (in `./dev mutate lobby`'s
selection).
"""

from __future__ import annotations

import hashlib
import re

import pytest
import structlog

from echo.lobby.limits import LobbyConfig
from echo.lobby.protocol import (
    CreateLobby,
    Done,
    ErrorCode,
    JoinLobby,
    LobbyJoined,
    Presence,
    RecreateLobby,
    Refusal,
    SetLocked,
)
from echo.lobby.state import LobbyRegistry
from echo.tickets import TicketKey, TicketSeats
from tests.lobby.lab import CONFIG, Lab
from tests.lobby.test_recreate import RECREATE_CONFIG, home_a, state

NO_ROOM = "^" + re.escape("no room for this match's lobby") + "$"
SEATS = TicketSeats(TicketKey(5, b"r" * 32), ttl=3600.0, clock=lambda: 1_800_000_000.0)


def create(lab: Lab, owner: str) -> int:
    reply = lab.ok(owner, CreateLobby(lab.rid(), f"{owner}'s", 8, False, {}))
    assert isinstance(reply, LobbyJoined)
    return reply.lobby_id


def test_a_registry_without_a_server_id_lists_its_lobbies_as_its_own() -> None:
    reg = LobbyRegistry(CONFIG)
    assert reg.server_id == ""
    handled = reg.handle("a", CreateLobby(1, "room", 4, False, {}), 0.0)
    assert isinstance(handled.reply, LobbyJoined)
    listing = reg.listing(handled.reply.lobby_id)
    assert listing is not None and listing.home == ""


def test_what_is_not_a_request_is_refused_as_a_bad_request() -> None:
    lab = Lab()
    handled = lab.reg.handle("a", Done(7), 0.0)  # type: ignore[arg-type]
    assert handled.reply == Refusal(7, ErrorCode.BAD_REQUEST, "not a request: Done")
    assert handled.sends == () and lab.reg.refusals[ErrorCode.BAD_REQUEST] == 1


def test_a_refusal_is_logged_with_who_what_and_why() -> None:
    lab = Lab()
    with structlog.testing.capture_logs() as logs:
        lab.refused("ann", JoinLobby(lab.rid(), 999), ErrorCode.NO_SUCH_LOBBY)
    refused = [e for e in logs if e.get("event") == "lobby_request_refused"]
    assert refused == [
        {
            "event": "lobby_request_refused",
            "log_level": "debug",
            "member_id": "ann",
            "request": "JoinLobby",
            "code": "NO_SUCH_LOBBY",
            "reason": "no such lobby",
        }
    ]


def test_the_census_counts_every_locked_lobby() -> None:
    lab = Lab()
    for owner in ("a", "b", "c"):
        lobby_id = create(lab, owner)
        if owner != "c":
            lab.ok(owner, SetLocked(lab.rid(), lobby_id, True))
    lobbies, _ = lab.reg.census()
    assert lobbies == {"listed": 1, "private": 0, "locked": 2}


def test_member_count_and_seat_tags_of_a_lobby_and_of_one_that_is_gone() -> None:
    lab = Lab()
    lobby_id = create(lab, "a")
    lab.ok("b", JoinLobby(lab.rid(), lobby_id))
    assert lab.reg.member_count(lobby_id) == 2
    assert lab.reg.member_count(lobby_id + 1) is None
    assert lab.reg.seat_tags(lobby_id + 1) is None
    tags = lab.reg.seat_tags(lobby_id)
    assert tags is not None and tags.lobby_id == lobby_id and tags.tags == ()


def test_every_drop_is_counted() -> None:
    lab = Lab()
    lobby_id = create(lab, "a")
    lab.ok("b", JoinLobby(lab.rid(), lobby_id))
    lab.disconnect("a")
    lab.disconnect("b")
    lab.disconnect("b")  # already away: not a second drop
    assert lab.reg.counters["members_dropped"] == 2


def test_a_drop_in_a_recreated_lobby_applies_the_owner_rule_at_its_time() -> None:
    a, lobby_id = home_a()
    b = Lab(RECREATE_CONFIG)
    b.do("b", RecreateLobby(b.rid(), a.replicas["b"].snapshot()))
    b.do("c", RecreateLobby(b.rid(), a.replicas["c"].snapshot()))
    b.now = 2.0
    b.disconnect("b")  # the owner until a is back drops within the window
    s = state(b, lobby_id)
    assert s.owner == "c" and {m.member_id: m.presence for m in s.members}["b"] is (
        Presence.RECONNECTING
    )


def test_every_game_result_is_counted_by_its_outcome() -> None:
    lab = Lab()
    for _ in range(2):
        # a lobby not here (yet): held for its members to bring it (LobbyConfig.result_hold)
        outcome, sends = lab.reg.game_result(424242, 1, "gs-1", {"winner": "a"}, 0.0)
        assert (outcome, sends) == ("held", ())
    assert lab.reg.counters["game_results_held"] == 2


# --- a match's lobby ------------------------------------------------------------------------------


def test_a_match_seats_its_members_not_ready_unless_asked() -> None:
    lab = Lab()
    lobby_id, sends = lab.reg.seat_match({"a": b"", "b": b""}, 0.0, name="m", metadata={})
    lab.deliver(sends)
    snap = lab.reg.snapshot(lobby_id)
    assert snap is not None and not any(m.ready for m in snap.members)
    lab.reg.seat_match({"c": b"", "d": b""}, 0.0, name="m", metadata={})
    assert lab.reg.counters["lobbies_matched"] == 2


def test_a_matchs_seats_are_tagged_with_each_members_own_secret() -> None:
    lab = Lab(seats=SEATS)
    secrets = {m: hashlib.sha256(m.encode()).digest()[:16] for m in ("a", "b")}
    lobby_id, _ = lab.reg.seat_match(secrets, 0.0, name="m", metadata={})
    for member, secret in secrets.items():
        assert lab.reg.holds_secret(member, secret)
    assert not lab.reg.holds_secret("a", secrets["b"])
    assert lab.reg.lobby_of("a") == lobby_id


def test_a_match_of_one_and_of_the_largest_size_is_seated() -> None:
    lab = Lab()
    one, _ = lab.reg.seat_match({"solo": b""}, 0.0, name="m", metadata={})
    assert lab.reg.member_count(one) == 1
    largest = {f"p{i}": b"" for i in range(0xFFFF)}
    big, _ = lab.reg.seat_match(largest, 0.0, name="m", metadata={})
    assert lab.reg.member_count(big) == 0xFFFF


def test_a_match_with_no_member_too_many_or_no_room_is_refused() -> None:
    lab = Lab()
    with pytest.raises(ValueError, match=NO_ROOM):
        lab.reg.seat_match({}, 0.0, name="m", metadata={})
    with pytest.raises(ValueError, match=NO_ROOM):
        lab.reg.seat_match({f"p{i}": b"" for i in range(0x10000)}, 0.0, name="m", metadata={})
    one = Lab(LobbyConfig(indexed_keys=CONFIG.indexed_keys, max_lobbies=1))
    one.reg.seat_match({"a": b""}, 0.0, name="m", metadata={})
    with pytest.raises(ValueError, match=NO_ROOM):
        one.reg.seat_match({"b": b""}, 0.0, name="m", metadata={})
