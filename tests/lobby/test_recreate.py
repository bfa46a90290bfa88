"""A lobby recreated on the next server from its members' copies.

Server A holds the lobby; its members' replicas are fed from A's sends. A dies; the members send
their copies (`LobbyReplica.recreate_request`) to server B, in any order, some copies older than
others. B's merge rule is in `LobbyRegistry._recreate`.
"""

from __future__ import annotations

from typing import Any

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from echo.lobby.limits import LobbyConfig
from echo.lobby.protocol import (
    BanMember,
    CreateLobby,
    ErrorCode,
    JoinByCode,
    JoinLobby,
    LeaveLobby,
    LeaveReason,
    LobbyJoined,
    LobbySnapshot,
    MemberLeft,
    MemberState,
    Presence,
    RecreateLobby,
    SetAttributes,
    SetLocked,
    SetMetadata,
    SetReady,
)
from echo.tickets import TicketKey, TicketSeats
from tests.lobby.lab import CONFIG, FAST, Lab
from tests.lobby.test_properties import MEMBERS, check_invariants, op, populated, run

GRACE = 10.0
WINDOW = 10.0
RECREATE_CONFIG = LobbyConfig(
    indexed_keys=CONFIG.indexed_keys,
    reconnect_grace=GRACE,
    recreate_window=WINDOW,
    create_limit=FAST,
    update_limit=FAST,
    search_limit=FAST,
    chat_limit=FAST,
    join_limit=FAST,
)


def home_a() -> tuple[Lab, int]:
    """Lobby 100 on server A: owner a, then b and c; metadata, attributes, ready, a ban, locked."""
    a = Lab(RECREATE_CONFIG)
    reply = a.ok("a", CreateLobby(a.rid(), "room", 4, False, {"mode": "ffa", "skill": 3}))
    assert isinstance(reply, LobbyJoined)
    lobby_id = reply.lobby_id
    for m in ("b", "c"):
        a.ok(m, JoinLobby(a.rid(), lobby_id))
    a.ok("b", SetAttributes(a.rid(), lobby_id, "b", {"hero": "mage"}))
    a.ok("c", SetReady(a.rid(), lobby_id, "c", True))
    a.ok("a", BanMember(a.rid(), lobby_id, "troll"))
    a.ok("a", SetLocked(a.rid(), lobby_id, True))
    a.check_replicas()
    return a, lobby_id


def recreate(b: Lab, member: str, copy: LobbySnapshot) -> Any:
    return b.do(member, RecreateLobby(b.rid(), copy)).reply


def state(lab: Lab, lobby_id: int) -> LobbySnapshot:
    s = lab.reg.snapshot(lobby_id)
    assert s is not None
    return s


def presence(s: LobbySnapshot) -> dict[str, Presence]:
    return {m.member_id: m.presence for m in s.members}


def test_the_first_copy_recreates_the_lobby_and_keeps_seats_for_the_others() -> None:
    a, lobby_id = home_a()
    before = state(a, lobby_id)
    b = Lab(RECREATE_CONFIG)
    reply = recreate(b, "b", a.replicas["b"].snapshot())
    assert reply == LobbyJoined(reply.request_id, lobby_id)
    s = state(b, lobby_id)
    assert (s.name, s.max_members, s.metadata, s.locked, s.bans) == (
        before.name,
        before.max_members,
        before.metadata,
        True,
        ("troll",),
    )
    assert s.version > before.version
    assert presence(s) == {
        "a": Presence.RECONNECTING,
        "b": Presence.CONNECTED,
        "c": Presence.RECONNECTING,
    }
    assert s.owner == "b"  # the owner is a connected member while a has not come back
    assert s.members[1].attributes == {"hero": "mage"} and s.members[2].ready
    assert b.reg.counters["lobbies_recreated"] == 1
    # The locked lobby is recreated: its members come back even so; others may not join.
    assert isinstance(recreate(b, "c", a.replicas["c"].snapshot()), LobbyJoined)
    b.refused("d", JoinLobby(b.rid(), lobby_id), ErrorCode.LOBBY_LOCKED)
    assert isinstance(recreate(b, "a", a.replicas["a"].snapshot()), LobbyJoined)
    s = state(b, lobby_id)
    assert s.owner == "a"  # the copy's owner gets it back within the window
    assert set(presence(s).values()) == {Presence.CONNECTED}
    assert [m.member_id for m in s.members] == ["a", "b", "c"]
    b.check_replicas()
    check_invariants(b)


def test_seats_not_claimed_within_the_grace_period_are_dropped() -> None:
    a, lobby_id = home_a()
    b = Lab(RECREATE_CONFIG)
    recreate(b, "c", a.replicas["c"].snapshot())
    b.now = 3.0
    recreate(b, "b", a.replicas["b"].snapshot())
    assert b.reg.next_deadline() == GRACE
    sends = b.advance(GRACE - 3.0)
    assert [s.message.member_id for s in sends if isinstance(s.message, MemberLeft)] == ["a"]
    assert all(
        s.message.reason is LeaveReason.DISPLACED
        for s in sends
        if isinstance(s.message, MemberLeft)
    )
    s = state(b, lobby_id)
    assert [m.member_id for m in s.members] == ["b", "c"]
    assert s.owner == "c"  # the first to arrive took it, and stays: it is connected
    # After the window, the owner named by the copy no longer takes the lobby back.
    b.now = WINDOW + 1
    b.refused("a", RecreateLobby(b.rid(), a.replicas["a"].snapshot()), ErrorCode.RECREATE_REFUSED)
    b.check_replicas()


def test_the_newest_copy_wins_and_nobody_who_arrived_is_lost() -> None:
    a, lobby_id = home_a()
    stale_c = a.replicas["c"].snapshot()  # c's copy stops here: it misses what follows
    a.ok("a", SetMetadata(a.rid(), lobby_id, {"mode": "ctf"}))
    a.ok("a", SetLocked(a.rid(), lobby_id, False))
    a.ok("d", JoinLobby(a.rid(), lobby_id))
    a.ok("b", LeaveLobby(a.rid(), lobby_id))
    newest = state(a, lobby_id)
    b = Lab(RECREATE_CONFIG)
    recreate(b, "c", stale_c)  # the old copy arrives first: b holds a seat, d does not exist
    assert set(presence(state(b, lobby_id))) == {"a", "b", "c"}
    # The old copy was locked: e cannot join yet. Unlock is only in the newer copy.
    b.refused("e", JoinLobby(b.rid(), lobby_id), ErrorCode.LOBBY_LOCKED)
    recreate(b, "d", a.replicas["d"].snapshot())
    s = state(b, lobby_id)
    assert s.metadata == newest.metadata and not s.locked
    # b left at A (the newer copy says so) and had not come back: it is not resurrected.
    assert [m.member_id for m in s.members] == ["a", "c", "d"]
    assert presence(s) == {
        "a": Presence.RECONNECTING,
        "c": Presence.CONNECTED,
        "d": Presence.CONNECTED,
    }
    # A newcomer joins the recreated lobby; an older copy arriving later changes nothing of
    # the lobby's fields and loses nobody.
    b.ok("e", JoinLobby(b.rid(), lobby_id))
    recreate(b, "a", stale_c)  # every copy of one version is the same, whoever holds it
    s = state(b, lobby_id)
    assert s.metadata == newest.metadata
    assert [m.member_id for m in s.members] == ["a", "c", "d", "e"]
    assert s.owner == "a"
    b.check_replicas()
    check_invariants(b)


def test_a_member_who_joined_the_recreated_lobby_survives_a_newer_copy() -> None:
    a, lobby_id = home_a()
    a.ok("a", SetLocked(a.rid(), lobby_id, False))
    old = a.replicas["c"].snapshot()
    a.ok("a", SetMetadata(a.rid(), lobby_id, {"mode": "ctf"}))
    b = Lab(RECREATE_CONFIG)
    recreate(b, "c", old)
    b.ok("newcomer", JoinLobby(b.rid(), lobby_id))
    recreate(b, "a", a.replicas["a"].snapshot())
    s = state(b, lobby_id)
    assert [m.member_id for m in s.members] == ["a", "b", "c", "newcomer"]
    assert s.metadata["mode"] == "ctf"
    assert b.reg.lobby_of("newcomer") == lobby_id
    b.check_replicas()
    check_invariants(b)


def test_bans_from_every_copy_hold() -> None:
    a, lobby_id = home_a()
    a.ok("a", SetLocked(a.rid(), lobby_id, False))
    old = a.replicas["c"].snapshot()  # c's copy does not know b is banned
    a.ok("a", BanMember(a.rid(), lobby_id, "b"))
    b = Lab(RECREATE_CONFIG)
    recreate(b, "c", old)
    recreate(b, "b", old)  # b arrives with the old copy, where it is not banned
    assert "b" in presence(state(b, lobby_id))
    handled = b.do("a", RecreateLobby(b.rid(), a.replicas["a"].snapshot()))
    assert isinstance(handled.reply, LobbyJoined)
    s = state(b, lobby_id)
    assert "b" not in presence(s) and set(s.bans) == {"troll", "b"}
    told = [x for x in handled.sends if x.to == ("b",)]
    assert told and isinstance(told[0].message, MemberLeft)
    assert told[0].message.reason is LeaveReason.BANNED
    b.refused("b", RecreateLobby(b.rid(), old), ErrorCode.BANNED)
    check_invariants(b)


def test_recreate_refusals() -> None:
    a, lobby_id = home_a()
    copy = a.replicas["b"].snapshot()
    b = Lab(RECREATE_CONFIG)
    b.refused("stranger", RecreateLobby(b.rid(), copy), ErrorCode.NOT_MEMBER)
    b.refused("troll", RecreateLobby(b.rid(), copy), ErrorCode.BANNED)
    forged = attrs.evolve(copy, private=True, join_code="")
    b.refused("b", RecreateLobby(b.rid(), forged), ErrorCode.BAD_REQUEST)
    twice = attrs.evolve(copy, members=copy.members + copy.members[:1])
    b.refused("b", RecreateLobby(b.rid(), twice), ErrorCode.BAD_REQUEST)
    huge = attrs.evolve(copy, metadata={"k": "x" * 5000})
    b.refused("b", RecreateLobby(b.rid(), huge), ErrorCode.METADATA_LIMIT)
    b.refused(
        "b", RecreateLobby(b.rid(), attrs.evolve(copy, version=2**64 - 1)), ErrorCode.BAD_REQUEST
    )
    zero = attrs.evolve(copy, lobby_id=0)
    b.refused("b", RecreateLobby(b.rid(), zero), ErrorCode.BAD_REQUEST)
    # A lobby that lives on this server normally cannot be taken over by a copy.
    native = Lab(RECREATE_CONFIG, first_id=lobby_id)
    native.ok("owner", CreateLobby(native.rid(), "mine", 4, False, {}))
    native.refused("b", RecreateLobby(native.rid(), copy), ErrorCode.RECREATE_REFUSED)
    # A member of it sending a copy is just given the state again.
    assert isinstance(
        native.do("owner", RecreateLobby(native.rid(), _with_member(copy, "owner"))).reply,
        LobbyJoined,
    )
    assert state(native, lobby_id).name == "mine"


def _with_member(s: LobbySnapshot, member: str) -> LobbySnapshot:
    extra = MemberState(member, 99, False, Presence.CONNECTED, {})
    return attrs.evolve(s, members=(*s.members, extra))


def test_a_full_recreated_lobby_displaces_unclaimed_seats_never_arrived_members() -> None:
    a = Lab(RECREATE_CONFIG)
    reply = a.ok("a", CreateLobby(a.rid(), "duo", 2, False, {}))
    assert isinstance(reply, LobbyJoined)
    lobby_id = reply.lobby_id
    old = a.replicas["a"].snapshot()  # a alone
    a.ok("b", JoinLobby(a.rid(), lobby_id))
    b = Lab(RECREATE_CONFIG)
    recreate(b, "a", old)
    b.ok("x", JoinLobby(b.rid(), lobby_id))  # the lobby is now full on B: a and x
    b.refused("b", RecreateLobby(b.rid(), a.replicas["b"].snapshot()), ErrorCode.LOBBY_FULL)
    assert [m.member_id for m in state(b, lobby_id).members] == ["a", "x"]
    check_invariants(b)


# --- property: any copies, any order ---------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(st.lists(op, min_size=5, max_size=50), st.data())
def test_recreating_from_any_copies_in_any_order(steps: list[tuple[Any, ...]], data: Any) -> None:
    a = populated()
    history: dict[str, list[LobbySnapshot]] = {m: [] for m in MEMBERS}
    for step in steps:
        run(a, step)
        for m, replica in a.replicas.items():
            if not replica.closed and a.reg.lobby_of(m) == replica.lobby_id:
                history[m].append(replica.snapshot())
    lobbies = a.reg.lobby_ids()
    if not lobbies:
        return
    lobby_id = data.draw(st.sampled_from(lobbies))
    final = state(a, lobby_id)
    senders = [m.member_id for m in final.members if m.presence is Presence.CONNECTED]
    copies = {}
    for m in senders:
        mine = [c for c in history[m] if c.lobby_id == lobby_id] or [a.replicas[m].snapshot()]
        copies[m] = data.draw(st.sampled_from(mine))
    order = data.draw(st.permutations(senders))
    b = Lab(RECREATE_CONFIG)
    replies = {m: recreate(b, m, copies[m]) for m in order}
    if not replies:
        return
    sent_bans = set().union(*(set(c.bans) for c in copies.values()))
    s = state(b, lobby_id)
    newest = max(copies.values(), key=lambda c: c.version)
    assert s.metadata == newest.metadata and s.name == newest.name
    assert set(s.bans) == sent_bans
    here = set(presence(s))
    for m in order:
        if isinstance(replies[m], LobbyJoined) and m not in sent_bans:
            assert m in here, f"{m} arrived and was lost"
    for m in here - set(order):
        assert presence(s)[m] is Presence.RECONNECTING
    check_invariants(b)


def test_with_seats_only_a_member_of_the_lobby_recreates_it() -> None:
    clock_now = [1_800_000_000.0]
    seats = TicketSeats(TicketKey(3, b"s" * 32), ttl=3600.0, clock=lambda: clock_now[0])
    a = Lab(RECREATE_CONFIG, seats=seats)
    reply = a.ok("a", CreateLobby(a.rid(), "room", 4, True, {}))
    assert isinstance(reply, LobbyJoined) and seats.check(reply.seat, reply.lobby_id, "a")
    lobby_id = reply.lobby_id
    a.ok("b", JoinByCode(a.rid(), state(a, lobby_id).join_code))
    other = a.ok("x", CreateLobby(a.rid(), "other", 4, False, {}))
    assert isinstance(other, LobbyJoined)
    copy = a.replicas["b"].snapshot()
    b = Lab(RECREATE_CONFIG, seats=seats)
    # A stranger who learned the id forges a copy naming itself: no seat, no lobby.
    forged = attrs.evolve(
        copy,
        owner="eve",
        version=copy.version + 100,
        members=(*copy.members, MemberState("eve", 9, False, Presence.CONNECTED, {})),
    )
    b.refused("eve", RecreateLobby(b.rid(), forged), ErrorCode.RECREATE_REFUSED)
    # Someone else's seat, or a seat of another lobby, does not do either.
    b.refused(
        "eve", RecreateLobby(b.rid(), forged, a.replicas["b"].seat), ErrorCode.RECREATE_REFUSED
    )
    b.refused(
        "eve", RecreateLobby(b.rid(), forged, a.replicas["x"].seat), ErrorCode.RECREATE_REFUSED
    )
    b.refused("b", RecreateLobby(b.rid(), copy, a.replicas["x"].seat), ErrorCode.RECREATE_REFUSED)
    assert b.reg.lobby_ids() == []
    # The member's own request, seat included, works; B hands out its own seats.
    handled = b.do("b", a.replicas["b"].recreate_request(b.rid()))
    assert isinstance(handled.reply, LobbyJoined)
    assert seats.check(handled.reply.seat, lobby_id, "b")
    assert isinstance(b.do("a", a.replicas["a"].recreate_request(b.rid())).reply, LobbyJoined)
    assert state(b, lobby_id).owner == "a"
    # Seats expire: a copy kept past the seat's life recreates nothing.
    clock_now[0] += 3600.0
    late = Lab(RECREATE_CONFIG, seats=seats)
    late.refused("b", a.replicas["b"].recreate_request(late.rid()), ErrorCode.RECREATE_REFUSED)


def test_the_window_includes_its_last_instant() -> None:
    a, lobby_id = home_a()
    b = Lab(RECREATE_CONFIG)
    recreate(b, "b", a.replicas["b"].snapshot())
    b.now = WINDOW  # the window's last instant: copies still merge, the owner still returns
    assert isinstance(recreate(b, "a", a.replicas["a"].snapshot()), LobbyJoined)
    assert state(b, lobby_id).owner == "a"
