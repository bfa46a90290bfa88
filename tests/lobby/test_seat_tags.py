"""Seat tags (the pure core): a seat is bound to its client's hello secret on every server.

A seat's tag is a keyed hash of the secret of the client that took it; members keep the tags in
their copies, so the server that re-creates a lobby gives each seat back to its own client even
if that client never learned its seat. A member's copy is its word, so a re-creator's tags must
let nobody else in. And a repeat of the request that seated a member spends no rate budget.
"""

from __future__ import annotations

import hashlib

import attrs
import pytest

from echo.lobby.limits import LobbyConfig, RateLimit
from echo.lobby.protocol import (
    CreateLobby,
    ErrorCode,
    JoinByCode,
    JoinLobby,
    LeaveLobby,
    LobbyJoined,
    Presence,
    QuickJoin,
    RecreateLobby,
    Request,
    SeatTag,
    SeatTags,
    SetReady,
    StringEquals,
)
from echo.tickets import TicketKey, TicketSeats
from tests.lobby.lab import CONFIG, FAST, Lab

NOW = 1_800_000_000.0
KEY = TicketKey(1, b"k" * 32)
SEATS = TicketSeats(KEY, ttl=3600.0, clock=lambda: NOW)
SECRET = {m: hashlib.sha256(m.encode()).digest()[:16] for m in ("a", "b", "c", "x")}
TAGGED = attrs.evolve(CONFIG, reconnect_grace=10.0, recreate_window=10.0)


def home(*members: str) -> tuple[Lab, int]:
    """A lobby on server A: `a` creates it, then `members` join, each on a session with its
    own secret."""
    a = Lab(TAGGED, seats=SEATS)
    reply = a.ok("a", CreateLobby(a.rid(), "room", 4, False, {"mode": "duel"}), SECRET["a"])
    assert isinstance(reply, LobbyJoined)
    for m in members:
        a.ok(m, JoinLobby(a.rid(), reply.lobby_id), SECRET[m])
    return a, reply.lobby_id


def presence(lab: Lab, lobby_id: int, member: str) -> Presence:
    snapshot = lab.reg.snapshot(lobby_id)
    assert snapshot is not None
    return next(m.presence for m in snapshot.members if m.member_id == member)


def test_tags_are_keyed_bound_to_the_seat_and_survive_a_key_rotation() -> None:
    tag = SEATS.tag(7, "b", SECRET["b"])
    assert len(tag) == 17 and tag[0] == KEY.key_id
    assert SEATS.tag_matches(tag, 7, "b", SECRET["b"])
    assert not SEATS.tag_matches(tag, 7, "b", SECRET["x"])  # another client
    assert not SEATS.tag_matches(tag, 8, "b", SECRET["b"])  # another lobby
    assert not SEATS.tag_matches(tag, 7, "x", SECRET["b"])  # another member
    assert not SEATS.tag_matches(tag, 7, "b", b"")  # no secret is nobody's
    for bad in (b"", tag[:-1], tag + b"\x00", bytes([9]) + tag[1:]):
        assert not SEATS.tag_matches(bad, 7, "b", SECRET["b"])
    # Not a plain hash: what anyone could compute from a secret of their own matches nothing.
    plain = bytes([1]) + hashlib.sha256(SECRET["x"]).digest()[:16]
    assert not SEATS.tag_matches(plain, 7, "b", SECRET["x"])
    # After a rotation the servers still hold the old key: tags made with it still count.
    rotated = TicketSeats(
        TicketKey(2, b"n" * 32), ttl=3600.0, clock=lambda: NOW, retired={1: KEY.secret}
    )
    assert rotated.tag_matches(tag, 7, "b", SECRET["b"])
    assert rotated.tag(7, "b", SECRET["b"])[0] == 2


def test_members_copies_carry_the_tags_and_the_next_server_honours_the_secret() -> None:
    a, lobby_id = home("b", "c")
    # Every member's copy has every seat's tag (the server sends them after each snapshot
    # and MemberJoined), never a secret.
    for m in ("a", "b", "c"):
        replica = a.replicas[m]
        assert set(replica.seat_tags) == {"a", "b", "c"}
        for who, (tag,) in replica.seat_tags.items():
            assert SEATS.tag_matches(tag, lobby_id, who, SECRET[who])
        copy = replica.recreate_request(1)
        assert {t.member_id for t in copy.seat_tags} == {"a", "b", "c"}
        assert all(SECRET[who] not in t.tag for who in SECRET for t in copy.seat_tags)
    # The home dies; a's copy re-creates the lobby on B; b never learned its seat.
    b = Lab(TAGGED, seats=SEATS)
    b.ok("a", a.replicas["a"].recreate_request(b.rid()), SECRET["a"])
    assert presence(b, lobby_id, "b") is Presence.RECONNECTING
    assert b.reg.holds_secret("b", SECRET["b"])  # what a hello of b's own client shows
    assert not b.reg.holds_secret("b", SECRET["x"])
    assert not b.reg.holds_secret("b", b"")
    assert not b.reg.holds_secret("c", SECRET["b"])
    # A session that was open before the seat existed (so no hello checked it) takes the
    # seat with its client's secret, and nobody else's session does.
    b.refused("b", JoinLobby(b.rid(), lobby_id), ErrorCode.NOT_MEMBER, SECRET["x"])
    b.refused("b", JoinLobby(b.rid(), lobby_id), ErrorCode.NOT_MEMBER)
    joined = b.ok("b", JoinLobby(b.rid(), lobby_id), SECRET["b"])
    assert isinstance(joined, LobbyJoined) and SEATS.check(joined.seat, lobby_id, "b")
    assert presence(b, lobby_id, "b") is Presence.CONNECTED
    # The tags go on to the next copies: c's replica on B has them all.
    assert set(b.replicas["a"].seat_tags) == {"a", "b", "c"}


def test_a_hostile_recreator_cannot_forge_a_seat_it_could_take() -> None:
    a, lobby_id = home("b", "c")
    # x sits in the lobby too and re-creates it first, with a copy whose tag for b is one of
    # its own making: a plain hash of its secret, its own tag, a tag under a key it guessed.
    a.ok("x", JoinLobby(a.rid(), lobby_id), SECRET["x"])
    copy = a.replicas["x"].recreate_request(1)
    guessed = TicketSeats(KEY.__class__(1, b"g" * 32), ttl=3600.0, clock=lambda: NOW)
    forged_tags = (
        SeatTag("b", bytes([1]) + hashlib.sha256(SECRET["x"]).digest()[:16]),
        SeatTag("b", SEATS.tag(lobby_id, "x", SECRET["x"])),
        SeatTag("b", guessed.tag(lobby_id, "b", SECRET["x"])),
        *(t for t in copy.seat_tags if t.member_id != "b"),
    )
    newer = attrs.evolve(copy.snapshot, version=copy.snapshot.version + 50, owner="x")
    b = Lab(TAGGED, seats=SEATS)
    b.ok("x", RecreateLobby(b.rid(), newer, copy.seat, forged_tags), SECRET["x"])
    # None of them lets x (or anyone but b's own client) in as b ...
    assert not b.reg.holds_secret("b", SECRET["x"])
    # ... nor does a session naming b that was open before the lobby came here: it cannot
    # take the seat, leave it, or act for b.
    for request in (
        JoinLobby(b.rid(), lobby_id),
        LeaveLobby(b.rid(), lobby_id),
        SetReady(b.rid(), lobby_id, "b", True),
        CreateLobby(b.rid(), "room", 4, False, {"mode": "duel"}),
        QuickJoin(b.rid(), (StringEquals("mode", "duel"),)),
    ):
        code = ErrorCode.ALREADY_IN_LOBBY if isinstance(request, CreateLobby) else None
        b.refused("b", request, code or ErrorCode.NOT_MEMBER, SECRET["x"])
    assert presence(b, lobby_id, "b") is Presence.RECONNECTING
    # What x can do: its copy is only one of the copies. An honest copy (c's, older) adds b's
    # true tag to the seat, and b's own client gets in; x's forged tags were only noise.
    b.ok("c", a.replicas["c"].recreate_request(b.rid()), SECRET["c"])
    assert b.reg.holds_secret("b", SECRET["b"])
    assert not b.reg.holds_secret("b", SECRET["x"])
    b.ok("b", JoinLobby(b.rid(), lobby_id), SECRET["b"])
    assert presence(b, lobby_id, "b") is Presence.CONNECTED
    # The newest copy's fields won (rule 1): x owns it while within the window.
    snapshot = b.reg.snapshot(lobby_id)
    assert snapshot is not None and snapshot.owner == "x"


def test_the_copy_of_a_member_whose_hello_came_first_still_brings_its_tags() -> None:
    a, lobby_id = home("b", "c")
    # c's copy (its tag for b a forgery) re-creates the lobby; a's hello takes a's seat back
    # with its seat before a's copy arrives, so that copy is only a resync ...
    hostile = a.replicas["c"].recreate_request(1)
    forged = tuple(
        SeatTag("b", b"\x01" + b"f" * 16) if t.member_id == "b" else t for t in hostile.seat_tags
    )
    b = Lab(TAGGED, seats=SEATS)
    b.ok("c", attrs.evolve(hostile, request_id=b.rid(), seat_tags=forged), SECRET["c"])
    b.reconnect("a")
    assert not b.reg.holds_secret("b", SECRET["b"])
    # ... whose tags still count for the seats not yet claimed, and reach every member.
    b.ok("a", a.replicas["a"].recreate_request(b.rid()), SECRET["a"])
    assert b.reg.holds_secret("b", SECRET["b"])
    assert b.replicas["c"].seat_tags["b"] == (
        b"\x01" + b"f" * 16,
        a.replicas["a"].seat_tags["b"][0],
    )
    # Once per sender: the same member's copies again, with other tags, add nothing.
    before = b.reg.seat_tags(lobby_id)
    junk = tuple(SeatTag(t.member_id, b"\x01" + b"j" * 16) for t in forged)
    for sender in ("a", "c"):
        copy = b.replicas[sender].recreate_request(b.rid())
        b.ok(sender, attrs.evolve(copy, seat_tags=junk), SECRET[sender])
    assert b.reg.seat_tags(lobby_id) == before


def test_a_seat_taken_by_another_client_is_that_clients_on_the_next_server_too() -> None:
    a, lobby_id = home("b")
    # b's seat taken by another client of b's (its hello showed the seat; the driver then
    # binds the seat to that session): its previous client's secret no longer takes it, and
    # the members' copies learn the new tag.
    new = SECRET["x"]
    a.deliver(a.reg.bind_secret("b", new))
    assert a.reg.holds_secret("b", new) and not a.reg.holds_secret("b", SECRET["b"])
    assert a.replicas["a"].seat_tags["b"] == (SEATS.tag(lobby_id, "b", new),)
    assert a.reg.bind_secret("b", new) == ()  # (the same client again: nothing to tell)
    assert a.reg.bind_secret("b", b"") == ()  # (a client without a secret changes nothing)
    b = Lab(TAGGED, seats=SEATS)
    b.ok("a", a.replicas["a"].recreate_request(b.rid()), SECRET["a"])
    assert b.reg.holds_secret("b", new) and not b.reg.holds_secret("b", SECRET["b"])


def test_a_copy_holds_a_bounded_number_of_tags() -> None:
    a, lobby_id = home("b")
    copy = a.replicas["a"].recreate_request(1)
    flood = tuple(SeatTag("b", bytes([1, i]) * 8 + b"\x00") for i in range(9))
    b = Lab(TAGGED, seats=SEATS)
    b.refused(
        "a",
        RecreateLobby(b.rid(), copy.snapshot, copy.seat, flood),
        ErrorCode.BAD_REQUEST,
        SECRET["a"],
    )
    long = (SeatTag("b", b"t" * 65),)
    b.refused(
        "a",
        RecreateLobby(b.rid(), copy.snapshot, copy.seat, long),
        ErrorCode.BAD_REQUEST,
        SECRET["a"],
    )
    # One tag per member and copy counts (the first), so one copy cannot crowd a seat.
    some = tuple(SeatTag("b", bytes([1, i]) * 8 + b"\x00") for i in range(4))
    b.ok("a", RecreateLobby(b.rid(), copy.snapshot, copy.seat, some), SECRET["a"])
    tags = b.reg.seat_tags(lobby_id)
    assert isinstance(tags, SeatTags)
    assert [t.tag for t in tags.tags if t.member_id == "b"] == [some[0].tag]


def test_a_kept_seat_is_claimed_with_its_seat_after_the_window() -> None:
    a, lobby_id = home("b")
    b = Lab(TAGGED, seats=SEATS)
    b.ok("a", a.replicas["a"].recreate_request(b.rid()))
    b.now = 10.5  # the window is over, b's seat still kept (no tags: a had no secret here)
    b.replicas["b"] = a.replicas["b"]
    # (Not its copy's fields any more, but its seat is its own: shown, it is taken.)
    joined = b.ok("b", a.replicas["b"].recreate_request(b.rid()))
    assert isinstance(joined, LobbyJoined)
    assert presence(b, lobby_id, "b") is Presence.CONNECTED


# --- a repeat spends no rate budget -----------------------------------------------------------

SLOW = RateLimit(rate=1 / 600, burst=2)
LIMITED = attrs.evolve(
    CONFIG, create_limit=SLOW, join_limit=SLOW, search_limit=SLOW, repeat_limit=FAST
)


@pytest.mark.parametrize("kind", ["create", "join", "code", "quick", "recreate"])
def test_the_request_that_seated_the_member_asked_again_spends_no_budget(kind: str) -> None:
    lab = Lab(LIMITED, seats=SEATS)
    private = lab.ok("a", CreateLobby(lab.rid(), "room", 4, True, {"mode": "duel"}))
    public = lab.ok("p", CreateLobby(lab.rid(), "open", 4, False, {"mode": "duel"}))
    assert isinstance(private, LobbyJoined) and isinstance(public, LobbyJoined)
    snapshot = lab.reg.snapshot(private.lobby_id)
    assert snapshot is not None
    member, request, where = {
        "create": ("a", CreateLobby(0, "room", 4, True, {"mode": "duel"}), private.lobby_id),
        "join": ("b", JoinLobby(0, public.lobby_id), public.lobby_id),
        "code": ("b", JoinByCode(0, snapshot.join_code), private.lobby_id),
        "quick": ("b", QuickJoin(0, (StringEquals("mode", "duel"),)), public.lobby_id),
        "recreate": ("b", JoinByCode(0, snapshot.join_code), private.lobby_id),
    }[kind]
    if kind != "create":  # (a's create was its first)
        lab.ok(member, attrs.evolve(request, request_id=lab.rid()))
    # One of the two tokens of the burst is spent; the same request asked again, many times
    # (a reply lost again and again under load), spends none, refilled or not.
    for _ in range(20):
        if kind == "recreate":
            repeat: Request = lab.replicas[member].recreate_request(lab.rid())
        else:
            repeat = attrs.evolve(request, request_id=lab.rid())
        reply = lab.ok(member, repeat)
        assert isinstance(reply, LobbyJoined) and reply.lobby_id == where
    assert lab.reg.refusals[ErrorCode.RATE_LIMITED] == 0
    # Distinct requests still spend it: the one token left, then refused.
    lab.ok(member, LeaveLobby(lab.rid(), where))
    distinct = {
        "create": lambda i: CreateLobby(lab.rid(), f"room {i}", 4, False, {}),
        "join": lambda i: JoinLobby(lab.rid(), 999_000 + i),
        "code": lambda i: JoinByCode(lab.rid(), f"NONE{i}"),
        "quick": lambda i: QuickJoin(lab.rid(), (StringEquals("mode", f"none {i}"),)),
        "recreate": lambda i: JoinLobby(lab.rid(), 999_000 + i),
    }[kind]
    first = lab.do(member, distinct(0)).reply
    assert getattr(first, "code", None) is not ErrorCode.RATE_LIMITED, first
    lab.refused(member, distinct(1), ErrorCode.RATE_LIMITED)


def test_a_flood_of_repeats_is_bounded_by_its_own_budget() -> None:
    config = attrs.evolve(CONFIG, repeat_limit=RateLimit(rate=1.0, burst=3))
    lab = Lab(config)
    made = lab.ok("a", CreateLobby(lab.rid(), "room", 4, False, {}))
    assert isinstance(made, LobbyJoined)
    for _ in range(3):
        lab.ok("a", JoinLobby(lab.rid(), made.lobby_id))
    refusal = lab.refused("a", JoinLobby(lab.rid(), made.lobby_id), ErrorCode.RATE_LIMITED)
    assert "repeat" in refusal.message
    # Its other budgets are untouched meanwhile (FAST), and the repeat budget refills.
    lab.now += 1.0
    lab.ok("a", JoinLobby(lab.rid(), made.lobby_id))


def test_lobby_config_declares_the_repeat_limit() -> None:
    assert isinstance(LobbyConfig().repeat_limit, RateLimit)
