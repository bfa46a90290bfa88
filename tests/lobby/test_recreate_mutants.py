"""Re-creating a lobby from its members' copies, edge by edge: each refusal's code and the
reason a member reads, each limit at its bound and one past it, the seats kept for members
not back yet (their grace time), the owner a copy names, and whose word a copy tag is.

Pure: the registry through `tests.lobby.lab.Lab`, no sockets (in `./dev mutate lobby`'s
selection).
"""

from __future__ import annotations

import attrs

from echo.lobby.limits import LobbyConfig
from echo.lobby.protocol import (
    CreateLobby,
    ErrorCode,
    JoinLobby,
    LeaveLobby,
    LobbyJoined,
    LobbySnapshot,
    MemberState,
    OwnerChanged,
    Presence,
    RecreateLobby,
    SeatTag,
    SeatTags,
    SetLocked,
)
from echo.lobby.state.records import MAX_COPY_VERSION, MAX_SEAT_TAG_BYTES, MAX_SEAT_TAGS
from echo.tickets import TicketKey, TicketSeats
from tests.lobby.lab import Lab
from tests.lobby.test_properties import check_invariants
from tests.lobby.test_recreate import GRACE, RECREATE_CONFIG, WINDOW, home_a, presence, state


def refused(lab: Lab, member: str, req: RecreateLobby, code: ErrorCode, text: str) -> None:
    reply = lab.refused(member, req, code)
    assert reply.message == text


def copy_of(member: str = "b") -> tuple[Lab, int, LobbySnapshot]:
    a, lobby_id = home_a()
    return a, lobby_id, a.replicas[member].snapshot()


def seat(member_id: str, seq: int) -> MemberState:
    return MemberState(member_id, seq, False, Presence.CONNECTED, {})


# --- the copy's own checks -------------------------------------------------------------------


def test_a_copy_that_is_not_a_lobby_is_refused_with_its_reason() -> None:
    _, _, copy = copy_of()
    b = Lab(RECREATE_CONFIG)
    cases = [
        (attrs.evolve(copy, lobby_id=0), ErrorCode.BAD_REQUEST, "lobby id 0 is not a lobby"),
        (
            attrs.evolve(copy, version=MAX_COPY_VERSION + 1),
            ErrorCode.BAD_REQUEST,
            "the copy's version is not believable",
        ),
        (
            attrs.evolve(copy, private=True, join_code=""),
            ErrorCode.BAD_REQUEST,
            "a private lobby has a join code, a public one none",
        ),
        (
            attrs.evolve(copy, private=False, join_code="CODE9"),
            ErrorCode.BAD_REQUEST,
            "a private lobby has a join code, a public one none",
        ),
        (
            attrs.evolve(copy, members=(*copy.members, copy.members[0])),
            ErrorCode.BAD_REQUEST,
            "the copy's members are not a valid lobby",
        ),
        (
            attrs.evolve(copy, max_members=2),  # three members in a lobby of two
            ErrorCode.BAD_REQUEST,
            "the copy's members are not a valid lobby",
        ),
        (
            attrs.evolve(copy, members=(*copy.members, seat("", 7))),
            ErrorCode.BAD_REQUEST,
            "not a member id",
        ),
        (
            attrs.evolve(copy, members=(*copy.members, seat("x" * 65, 7))),
            ErrorCode.BAD_REQUEST,
            "not a member id",
        ),
        (
            attrs.evolve(copy, bans=tuple(f"ban{i}" for i in range(65))),
            ErrorCode.BAN_LIST_FULL,
            "the copy bans too many members",
        ),
        (attrs.evolve(copy, bans=("b",)), ErrorCode.BANNED, "banned from this lobby"),
        (
            attrs.evolve(copy, members=tuple(m for m in copy.members if m.member_id != "b")),
            ErrorCode.NOT_MEMBER,
            "a copy is recreated only by one of its members",
        ),
        (attrs.evolve(copy, name=""), ErrorCode.NAME_INVALID, None),
        (attrs.evolve(copy, max_members=0), ErrorCode.BAD_REQUEST, "max members is 1..64"),
        (
            attrs.evolve(
                copy,
                members=tuple(
                    attrs.evolve(m, attributes={"k" * 40: 1}) if m.member_id == "c" else m
                    for m in copy.members
                ),
            ),
            ErrorCode.ATTRIBUTES_LIMIT,
            "attributes: a key is 1..32 bytes",
        ),
    ]
    for forged, code, text in cases:
        reply = b.refused("b", RecreateLobby(b.rid(), forged), code)
        if text is not None:
            assert reply.message == text, (forged, reply)
    assert b.reg.lobby_ids() == []


def test_every_bound_of_a_copy_itself_is_accepted() -> None:
    _, lobby_id, copy = copy_of()
    b = Lab(RECREATE_CONFIG)
    edge = attrs.evolve(
        copy,
        version=MAX_COPY_VERSION,
        max_members=5,
        bans=tuple(f"ban{i}" for i in range(64)),
        members=(*copy.members, seat("x" * 64, 3), seat("y", 4)),
    )
    tags = tuple(SeatTag("x" * 64, bytes([i]) * MAX_SEAT_TAG_BYTES) for i in range(1, 4))
    handled = b.do("b", RecreateLobby(b.rid(), edge, seat_tags=tags))
    assert isinstance(handled.reply, LobbyJoined)
    s = state(b, lobby_id)
    assert s.version == MAX_COPY_VERSION + 1
    assert len(s.bans) == 64 and len(s.members) == 5
    assert presence(s)["x" * 64] is Presence.RECONNECTING
    check_invariants(b)


def test_seat_tags_beyond_their_bounds_are_refused() -> None:
    _, _, copy = copy_of()
    b = Lab(RECREATE_CONFIG)
    text = "the copy's seat tags are not a valid lobby's"
    long_tag = (SeatTag("c", b"t" * (MAX_SEAT_TAG_BYTES + 1)),)
    refused(b, "b", RecreateLobby(b.rid(), copy, seat_tags=long_tag), ErrorCode.BAD_REQUEST, text)
    many = tuple(SeatTag("c", bytes([i + 1])) for i in range(MAX_SEAT_TAGS * len(copy.members) + 1))
    refused(b, "b", RecreateLobby(b.rid(), copy, seat_tags=many), ErrorCode.BAD_REQUEST, text)
    enough = many[:-1]
    assert isinstance(b.do("b", RecreateLobby(b.rid(), copy, seat_tags=enough)).reply, LobbyJoined)


# --- this server's own refusals --------------------------------------------------------------


def test_a_full_server_recreates_nothing() -> None:
    _, _, copy = copy_of()
    full = LobbyConfig(
        indexed_keys=RECREATE_CONFIG.indexed_keys,
        max_lobbies=1,
        create_limit=RECREATE_CONFIG.create_limit,
        join_limit=RECREATE_CONFIG.join_limit,
    )
    b = Lab(full, first_id=1)
    b.ok("z", CreateLobby(b.rid(), "here", 4, False, {}))
    refused(
        b,
        "b",
        RecreateLobby(b.rid(), copy),
        ErrorCode.SERVER_FULL,
        "this server holds its maximum number of lobbies",
    )


def test_a_private_copy_whose_code_is_taken_here_is_refused() -> None:
    a = Lab(RECREATE_CONFIG)
    reply = a.ok("a", CreateLobby(a.rid(), "secret", 4, True, {}))
    assert isinstance(reply, LobbyJoined)
    copy = a.replicas["a"].snapshot()
    b = Lab(RECREATE_CONFIG, first_id=500)  # hands out CODE1 too
    b.ok("z", CreateLobby(b.rid(), "mine", 4, True, {}))
    assert state(b, 500).join_code == copy.join_code
    refused(
        b,
        "a",
        RecreateLobby(b.rid(), copy),
        ErrorCode.RECREATE_REFUSED,
        "the copy's join code is taken here",
    )


def test_a_newer_private_copy_whose_code_is_taken_here_is_refused() -> None:
    a, lobby_id, old = copy_of("c")
    b = Lab(RECREATE_CONFIG, first_id=900)
    b.ok("z", CreateLobby(b.rid(), "mine", 4, True, {}))
    taken = state(b, 900).join_code
    assert isinstance(b.do("c", RecreateLobby(b.rid(), old)).reply, LobbyJoined)
    newer = attrs.evolve(
        a.replicas["b"].snapshot(), private=True, join_code=taken, version=old.version + 5
    )
    refused(
        b,
        "b",
        RecreateLobby(b.rid(), newer),
        ErrorCode.RECREATE_REFUSED,
        "the copy's join code is taken here",
    )
    # The lobby's own code is no conflict: a newer private copy keeps it.
    own = attrs.evolve(newer, join_code="MINE1")
    assert isinstance(b.do("b", RecreateLobby(b.rid(), own)).reply, LobbyJoined)
    assert state(b, lobby_id).join_code == "MINE1"
    again = attrs.evolve(own, version=own.version + 1)
    assert isinstance(b.do("a", RecreateLobby(b.rid(), _as(again, "a"))).reply, LobbyJoined)
    assert state(b, lobby_id).join_code == "MINE1"


def _as(copy: LobbySnapshot, member: str) -> LobbySnapshot:
    assert any(m.member_id == member for m in copy.members)
    return copy


def test_a_lobby_that_lives_here_is_not_taken_over_by_a_copy() -> None:
    _, lobby_id, copy = copy_of()
    native = Lab(RECREATE_CONFIG, first_id=lobby_id)
    native.ok("owner", CreateLobby(native.rid(), "mine", 4, False, {}))
    refused(
        native,
        "b",
        RecreateLobby(native.rid(), copy),
        ErrorCode.RECREATE_REFUSED,
        "this lobby lives here and is not recovering",
    )


def test_with_seats_a_copy_without_its_members_seat_is_refused_with_its_reason() -> None:
    seats = TicketSeats(TicketKey(3, b"s" * 32), ttl=3600.0, clock=lambda: 1_800_000_000.0)
    _, _, copy = copy_of()
    b = Lab(RECREATE_CONFIG, seats=seats)
    refused(
        b,
        "b",
        RecreateLobby(b.rid(), copy),
        ErrorCode.RECREATE_REFUSED,
        "no valid seat of this member in this lobby",
    )


def test_a_merge_past_255_bans_is_refused_and_255_is_kept() -> None:
    a, lobby_id, copy = copy_of()
    wide = LobbyConfig(
        indexed_keys=RECREATE_CONFIG.indexed_keys,
        max_bans=255,
        reconnect_grace=GRACE,
        recreate_window=WINDOW,
        join_limit=RECREATE_CONFIG.join_limit,
    )
    b = Lab(wide)
    mine = attrs.evolve(copy, bans=tuple(f"p{i}" for i in range(200)))
    assert isinstance(b.do("b", RecreateLobby(b.rid(), mine)).reply, LobbyJoined)
    c_copy = a.replicas["c"].snapshot()
    over = attrs.evolve(c_copy, bans=tuple(f"q{i}" for i in range(56)))  # 200 + 56 = 256
    refused(
        b,
        "c",
        RecreateLobby(b.rid(), over),
        ErrorCode.BAN_LIST_FULL,
        "the copies together ban too many members",
    )
    fits = attrs.evolve(c_copy, bans=tuple(f"q{i}" for i in range(55)))  # 255
    assert isinstance(b.do("c", RecreateLobby(b.rid(), fits)).reply, LobbyJoined)
    assert len(state(b, lobby_id).bans) == 255


def test_a_member_banned_by_an_earlier_copy_cannot_merge_its_own() -> None:
    a, _, copy = copy_of()
    b = Lab(RECREATE_CONFIG)
    banning_c = attrs.evolve(copy, bans=(*copy.bans, "c"))
    assert isinstance(b.do("b", RecreateLobby(b.rid(), banning_c)).reply, LobbyJoined)
    refused(
        b,
        "c",
        RecreateLobby(b.rid(), a.replicas["c"].snapshot()),
        ErrorCode.BANNED,
        "banned from this lobby",
    )


def test_a_merge_that_would_displace_an_arrived_member_says_the_lobby_is_full() -> None:
    a = Lab(RECREATE_CONFIG)
    reply = a.ok("a", CreateLobby(a.rid(), "duo", 2, False, {}))
    assert isinstance(reply, LobbyJoined)
    lobby_id = reply.lobby_id
    old = a.replicas["a"].snapshot()
    a.ok("b", JoinLobby(a.rid(), lobby_id))
    b = Lab(RECREATE_CONFIG)
    b.do("a", RecreateLobby(b.rid(), old))
    b.ok("x", JoinLobby(b.rid(), lobby_id))
    refused(
        b,
        "b",
        RecreateLobby(b.rid(), a.replicas["b"].snapshot()),
        ErrorCode.LOBBY_FULL,
        "the recreated lobby is full",
    )


# --- what a recreated lobby holds -------------------------------------------------------------


def test_seats_kept_for_the_others_last_the_grace_period_from_the_copys_arrival() -> None:
    a, lobby_id, copy = copy_of()
    b = Lab(RECREATE_CONFIG)
    b.now = 4.0
    b.do("b", RecreateLobby(b.rid(), copy))
    assert b.reg.next_deadline() == 4.0 + GRACE
    assert b.reg._reconnecting == {"a": 4.0 + GRACE, "c": 4.0 + GRACE}
    b.now = 6.0
    b.do("c", RecreateLobby(b.rid(), a.replicas["c"].snapshot()))
    assert b.reg._reconnecting == {"a": 4.0 + GRACE}
    b.now = 4.0 + GRACE - 0.5
    assert b.advance(0.0) == ()
    assert "a" in presence(state(b, lobby_id))
    b.advance(0.5)
    assert list(presence(state(b, lobby_id))) == ["b", "c"]


def test_a_newer_copy_gives_seats_not_yet_claimed_a_grace_from_its_own_arrival() -> None:
    a, lobby_id = home_a()
    old = a.replicas["b"].snapshot()
    a.ok("a", SetLocked(a.rid(), lobby_id, False))
    a.ok("d", JoinLobby(a.rid(), lobby_id))
    b = Lab(RECREATE_CONFIG)
    b.do("b", RecreateLobby(b.rid(), old))
    b.now = 5.0
    b.do("c", RecreateLobby(b.rid(), a.replicas["c"].snapshot()))  # newer: it knows d
    assert presence(state(b, lobby_id))["d"] is Presence.RECONNECTING
    assert b.reg._reconnecting["d"] == 5.0 + GRACE
    assert b.reg._reconnecting["a"] == 5.0 + GRACE


def test_the_first_to_arrive_owns_the_lobby_until_the_copys_owner_returns() -> None:
    a, lobby_id, copy = copy_of()
    b = Lab(RECREATE_CONFIG)
    handled = b.do("b", RecreateLobby(b.rid(), copy))
    assert state(b, lobby_id).owner == "b"
    # Told by the snapshot, not by a separate OwnerChanged (there was no owner here before).
    assert not [s for s in handled.sends if isinstance(s.message, OwnerChanged)]
    assert b.reg.counters["owner_migrations"] == 1
    handled = b.do("c", RecreateLobby(b.rid(), a.replicas["c"].snapshot()))
    assert state(b, lobby_id).owner == "b"
    handled = b.do("a", RecreateLobby(b.rid(), a.replicas["a"].snapshot()))
    assert state(b, lobby_id).owner == "a"
    assert not [s for s in handled.sends if isinstance(s.message, OwnerChanged)]
    assert b.reg.counters["owner_migrations"] == 2
    assert b.reg.counters["recreate_merges"] == 2
    b.check_replicas()


def test_a_recreated_lobby_numbers_its_members_in_the_copys_order() -> None:
    a, lobby_id, copy = copy_of("c")
    b = Lab(RECREATE_CONFIG)
    shuffled = attrs.evolve(copy, members=tuple(reversed(copy.members)))
    b.do("c", RecreateLobby(b.rid(), shuffled))
    s = state(b, lobby_id)
    assert [(m.member_id, m.join_seq) for m in s.members] == [("a", 0), ("b", 1), ("c", 2)]
    b.do("a", RecreateLobby(b.rid(), a.replicas["a"].snapshot()))
    assert [m.join_seq for m in state(b, lobby_id).members] == list(
        range(len(state(b, lobby_id).members))
    )


def test_a_copys_tags_are_its_senders_word_one_per_seat_and_sender() -> None:
    _, lobby_id, copy = copy_of()
    b = Lab(RECREATE_CONFIG)
    tags = (SeatTag("c", b"first"), SeatTag("c", b"second"), SeatTag("a", b""))
    handled = b.do("b", RecreateLobby(b.rid(), copy, seat_tags=tags))
    assert isinstance(handled.reply, LobbyJoined)
    held = b.reg._lobbies[lobby_id].members
    assert held["c"].tags == {"b": b"first"}  # the first tag of c, in b's name
    assert held["a"].tags == {}  # an empty tag is none
    sent = [s.message for s in handled.sends if isinstance(s.message, SeatTags)]
    assert sent == [SeatTags(lobby_id, (SeatTag("c", b"first"),))]


def test_a_retried_copy_adds_its_senders_tags_once_and_tells_the_lobby() -> None:
    a, lobby_id, copy = copy_of()
    b = Lab(RECREATE_CONFIG)
    b.do("b", RecreateLobby(b.rid(), copy))
    c_copy = a.replicas["c"].snapshot()
    b.do("c", RecreateLobby(b.rid(), c_copy))
    handled = b.do("c", RecreateLobby(b.rid(), c_copy, seat_tags=(SeatTag("a", b"ta"),)))
    assert isinstance(handled.reply, LobbyJoined)
    assert b.reg._lobbies[lobby_id].members["a"].tags == {"c": b"ta"}
    told = [s for s in handled.sends if s.message == SeatTags(lobby_id, (SeatTag("a", b"ta"),))]
    assert told and set(told[0].to) == {"b", "c"}
    again = b.do("c", RecreateLobby(b.rid(), c_copy, seat_tags=(SeatTag("a", b"ta"),)))
    assert not [s for s in again.sends if isinstance(s.message, SeatTags) and s.to == ("b", "c")]
    # A tag for a seat its member has claimed already is not added.
    b.do("c", RecreateLobby(b.rid(), c_copy, seat_tags=(SeatTag("b", b"tb"),)))
    assert b.reg._lobbies[lobby_id].members["b"].tags == {}


# --- merges: who is kept, in which seat, with whose tags ----------------------------------------


def test_a_member_who_moved_on_here_gets_no_seat_and_may_merge_its_copy_later() -> None:
    a, lobby_id, copy = copy_of()
    b = Lab(RECREATE_CONFIG, first_id=700)
    b.ok("a", CreateLobby(b.rid(), "elsewhere", 4, False, {}))  # a is in another lobby here
    b.do("b", RecreateLobby(b.rid(), copy))
    s = state(b, lobby_id)
    assert [m.member_id for m in s.members] == ["b", "c"]  # a (first by join order) skipped
    assert s.owner == "b" and b.reg.lobby_of("a") == 700
    # a leaves that lobby and sends its copy (the same version) within the window: it is
    # seated as it was in its copy, and takes back the lobby its copy says it owns.
    b.ok("a", LeaveLobby(b.rid(), 700))
    handled = b.do("a", RecreateLobby(b.rid(), a.replicas["a"].snapshot()))
    assert isinstance(handled.reply, LobbyJoined)
    s = state(b, lobby_id)
    assert [(m.member_id, m.presence) for m in s.members] == [
        ("b", Presence.CONNECTED),
        ("c", Presence.RECONNECTING),
        ("a", Presence.CONNECTED),
    ]
    assert s.owner == "a"
    b.check_replicas()
    check_invariants(b)


def test_an_older_copy_seats_its_sender_with_its_own_ready_state_and_attributes() -> None:
    a, lobby_id = home_a()
    old_c = a.replicas["c"].snapshot()  # c: ready
    a.ok("c", LeaveLobby(a.rid(), lobby_id))
    b = Lab(RECREATE_CONFIG)
    b.do("b", RecreateLobby(b.rid(), a.replicas["b"].snapshot()))  # the newer copy: no c
    assert "c" not in presence(state(b, lobby_id))
    assert isinstance(b.do("c", RecreateLobby(b.rid(), old_c)).reply, LobbyJoined)
    s = state(b, lobby_id)
    mine = {m.member_id: m for m in s.members}["c"]
    assert mine.ready and mine.presence is Presence.CONNECTED and mine.join_seq == 2
    assert b.reg._reconnecting == {"a": GRACE}
    b.check_replicas()


def test_a_newer_copy_that_shrinks_the_lobby_displaces_unclaimed_seats_only() -> None:
    _, lobby_id, copy = copy_of()  # a, b, c in a lobby of 4
    b = Lab(RECREATE_CONFIG)
    b.do("b", RecreateLobby(b.rid(), copy))  # b here; a and c kept
    a_and_c = tuple(m for m in copy.members if m.member_id != "b")
    smaller = attrs.evolve(copy, version=copy.version + 1, max_members=2, members=a_and_c)
    assert isinstance(b.do("c", RecreateLobby(b.rid(), smaller)).reply, LobbyJoined)
    s = state(b, lobby_id)
    # a (kept, unclaimed) goes; c (the sender) and b (arrived) stay.
    assert [m.member_id for m in s.members] == ["c", "b"] and s.max_members == 2
    assert "a" not in b.reg._reconnecting
    check_invariants(b)


def test_a_copy_that_bans_a_member_removes_it_and_forgets_its_held_chat() -> None:
    from echo.lobby.protocol import SendChat

    a, lobby_id = home_a()
    old = a.replicas["b"].snapshot()
    a.ok("c", LeaveLobby(a.rid(), lobby_id))  # the newer copies say c left
    b = Lab(RECREATE_CONFIG)
    b.do("b", RecreateLobby(b.rid(), old))
    b.ok("b", SendChat(b.rid(), lobby_id, "anyone?"))
    assert b.reg.held_chat.waiting("c") == 1 and b.reg.held_chat.waiting("a") == 1
    b.do("a", RecreateLobby(b.rid(), a.replicas["a"].snapshot()))
    assert "c" not in presence(state(b, lobby_id))
    assert b.reg.held_chat.waiting("c") == 0
    assert b.reg.lobby_of("c") is None and "c" not in b.reg._reconnecting


def test_the_owner_banned_by_a_newer_copy_hands_the_lobby_to_that_copys_sender() -> None:
    from echo.lobby.protocol import BanMember

    a, lobby_id = home_a()
    old = a.replicas["b"].snapshot()
    a.ok("a", BanMember(a.rid(), lobby_id, "b"))
    b = Lab(RECREATE_CONFIG)
    b.do("b", RecreateLobby(b.rid(), old))
    assert state(b, lobby_id).owner == "b" and b.reg.counters["owner_migrations"] == 1
    b.do("c", RecreateLobby(b.rid(), a.replicas["c"].snapshot()))
    s = state(b, lobby_id)
    assert s.owner == "c" and "b" not in presence(s)
    # b hears that it was banned as the next version it expects, not a gap to resync.
    assert b.replicas["b"].closed and b.gaps == []
    # The copy's sender is the owner at once: not a migration of the owner rule.
    assert b.reg.counters["owner_migrations"] == 1


def test_a_seat_kept_by_several_copies_keeps_each_senders_tag() -> None:
    a, lobby_id, old = copy_of("b")
    b = Lab(RECREATE_CONFIG)
    b.do("b", RecreateLobby(b.rid(), old, seat_tags=(SeatTag("c", b"from-b"),)))
    newer = attrs.evolve(a.replicas["a"].snapshot(), version=old.version + 1)
    b.do("a", RecreateLobby(b.rid(), newer, seat_tags=(SeatTag("c", b"from-a"),)))
    held = b.reg._lobbies[lobby_id].members["c"]
    assert held.tags == {"b": b"from-b", "a": b"from-a"}
    assert not held.arrived and held.presence is Presence.RECONNECTING


def test_an_older_copy_adds_its_senders_tag_to_the_seats_not_yet_claimed() -> None:
    a, lobby_id, newest = copy_of("b")
    b = Lab(RECREATE_CONFIG)
    b.do("b", RecreateLobby(b.rid(), attrs.evolve(newest, version=newest.version + 1)))
    b.do("c", RecreateLobby(b.rid(), a.replicas["c"].snapshot(), seat_tags=(SeatTag("a", b"t"),)))
    assert b.reg._lobbies[lobby_id].members["a"].tags == {"c": b"t"}


def test_a_recreate_spends_the_join_budget() -> None:
    from echo.lobby.limits import RateLimit

    _, lobby_id, copy = copy_of()
    slow = attrs.evolve(RECREATE_CONFIG, join_limit=RateLimit(rate=0.001, burst=1))
    b = Lab(slow, first_id=800)
    b.ok("z", CreateLobby(b.rid(), "other", 4, False, {}))
    b.do("b", RecreateLobby(b.rid(), copy))
    b.ok("b", LeaveLobby(b.rid(), lobby_id))
    reply = b.refused("b", JoinLobby(b.rid(), 800), ErrorCode.RATE_LIMITED)
    assert reply.message.startswith("too many join requests")
