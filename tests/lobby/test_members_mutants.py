"""Members coming and going at their edges (echo.lobby.state.members): who hears of a return
or a departure, the owner rule when the owner drops and comes back, the seat tags sent with
the state, and the counters the metrics scrape (totals).

Pure: the registry through `tests.lobby.lab.Lab`, no sockets (in `./dev mutate lobby`'s
selection).
"""

from __future__ import annotations

import hashlib

from echo.lobby.protocol import (
    CreateLobby,
    JoinLobby,
    KickMember,
    LeaveReason,
    LobbyJoined,
    LobbySnapshot,
    MemberLeft,
    OwnerChanged,
    Presence,
    PresenceChanged,
    SeatTags,
    SendChat,
    TransferOwner,
)
from echo.lobby.state.checks import BUCKET_SWEEP_S
from echo.tickets import TicketKey, TicketSeats
from tests.lobby.lab import Lab

SEATS = TicketSeats(TicketKey(6, b"m" * 32), ttl=3600.0, clock=lambda: 1_800_000_000.0)
SECRET = {m: hashlib.sha256(m.encode()).digest()[:16] for m in ("a", "b", "c")}


def lobby(lab: Lab, owner: str, *others: str) -> int:
    reply = lab.ok(owner, CreateLobby(lab.rid(), "room", 8, False, {}), SECRET.get(owner, b""))
    assert isinstance(reply, LobbyJoined)
    for m in others:
        lab.ok(m, JoinLobby(lab.rid(), reply.lobby_id), SECRET.get(m, b""))
    return reply.lobby_id


def test_a_return_is_told_to_the_others_and_the_state_to_the_returning_member() -> None:
    lab = Lab()
    lobby_id = lobby(lab, "a", "b", "c")
    lab.disconnect("b")
    lab.ok("a", SendChat(lab.rid(), lobby_id, "while you were away"))
    sends = lab.reconnect("b")
    told = [s for s in sends if isinstance(s.message, PresenceChanged)]
    assert [(s.to, s.message.presence) for s in told] == [(("a", "c"), Presence.CONNECTED)]
    mine = [s.message for s in sends if s.to == ("b",)]
    assert (
        isinstance(mine[0], LobbySnapshot) and mine[0].version == lab.reg._lobbies[lobby_id].version
    )
    assert [line.text for line in lab.chat["b"]] == ["while you were away"]
    lab.disconnect("c")
    lab.reconnect("c")
    assert lab.reg.counters["members_reconnected"] == 2
    # No grace period is left to end: only the rate buckets' sweep (from the first request).
    assert lab.reg.next_deadline() == BUCKET_SWEEP_S


def test_a_kicked_member_hears_why_and_an_empty_lobby_goes() -> None:
    lab = Lab()
    lobby_id = lobby(lab, "a", "b")
    handled = lab.do("a", KickMember(lab.rid(), lobby_id, "b"))
    (left,) = [s for s in handled.sends if isinstance(s.message, MemberLeft)]
    assert set(left.to) == {"a", "b"} and left.message.reason is LeaveReason.KICKED
    assert lab.reg.lobby_of("b") is None
    lab.disconnect("a")
    lab.advance(lab.reg.config.reconnect_grace)
    assert lab.reg.lobby_ids() == [] and lab.reg.lobby_of("a") is None


def test_the_owner_who_drops_gets_the_lobby_back_when_it_returns() -> None:
    lab = Lab()
    lobby_id = lobby(lab, "a", "b", "c")
    sends = lab.disconnect("a")
    changed = [s.message for s in sends if isinstance(s.message, OwnerChanged)]
    assert [m.owner for m in changed] == ["b"]  # the connected member who joined first
    sends = lab.reconnect("a")
    assert [s.message.owner for s in sends if isinstance(s.message, OwnerChanged)] == ["a"]
    assert lab.reg.counters["owner_migrations"] == 2
    # Given away on purpose meanwhile, it does not come back.
    lab.disconnect("a")
    lab.ok("b", TransferOwner(lab.rid(), lobby_id, "c"))
    lab.reconnect("a")
    snap = lab.reg.snapshot(lobby_id)
    assert snap is not None and snap.owner == "c"


def test_an_owner_alone_and_away_keeps_the_lobby() -> None:
    lab = Lab()
    lobby_id = lobby(lab, "a", "b")
    lab.disconnect("b")
    lab.disconnect("a")  # nobody connected: the owner stays the owner
    snap = lab.reg.snapshot(lobby_id)
    assert snap is not None and snap.owner == "a"
    assert lab.reg.counters["owner_migrations"] == 0
    lab.reconnect("b")  # b is back first: it takes the lobby while a is away
    snap = lab.reg.snapshot(lobby_id)
    assert snap is not None and snap.owner == "b"
    lab.reconnect("a")
    snap = lab.reg.snapshot(lobby_id)
    assert snap is not None and snap.owner == "a"


def test_the_state_carries_every_seats_tags_and_a_new_seat_its_own() -> None:
    lab = Lab(seats=SEATS)
    lobby_id = lobby(lab, "a", "b")
    handled = lab.do("c", JoinLobby(lab.rid(), lobby_id), SECRET["c"])
    tags = [s for s in handled.sends if isinstance(s.message, SeatTags)]
    to_others = [s for s in tags if s.to == ("a", "b")]
    assert [[t.member_id for t in s.message.tags] for s in to_others] == [["c"]]
    to_c = [s for s in tags if s.to == ("c",)]
    assert [[t.member_id for t in s.message.tags] for s in to_c] == [["a", "b", "c"]]
    assert lab.reg.holds_secret("c", SECRET["c"]) and not lab.reg.holds_secret("c", b"")
    assert not lab.reg.holds_secret("c", SECRET["a"])


def test_without_secrets_no_tags_are_sent() -> None:
    lab = Lab(seats=SEATS)
    reply = lab.ok("x", CreateLobby(lab.rid(), "room", 8, False, {}))
    assert isinstance(reply, LobbyJoined)
    handled = lab.do("y", JoinLobby(lab.rid(), reply.lobby_id))
    assert not [s for s in handled.sends if isinstance(s.message, SeatTags)]
    seat_tags = lab.reg.seat_tags(reply.lobby_id)
    assert seat_tags is not None and seat_tags.tags == ()
