"""The lobby registry, operation by operation and refusal by refusal (echo.lobby.state)."""

from __future__ import annotations

import attrs
import pytest

from echo.lobby.limits import LobbyConfig, RateLimit
from echo.lobby.protocol import (
    AttributesChanged,
    BanMember,
    ChatLine,
    CreateLobby,
    Done,
    ErrorCode,
    FreeSlots,
    JoinByCode,
    JoinLobby,
    KickMember,
    LeaveLobby,
    LeaveReason,
    LobbyJoined,
    LobbySnapshot,
    MemberBanned,
    MemberJoined,
    MemberLeft,
    NumberRange,
    OwnerChanged,
    Presence,
    PresenceChanged,
    QuickJoin,
    Request,
    SearchLobbies,
    SearchResults,
    SendChat,
    SetAttributes,
    SetLocked,
    SetMetadata,
    SetReady,
    StringEquals,
    TransferOwner,
)
from echo.lobby.state import LobbyRegistry
from echo.lobby.state.checks import BUCKET_SWEEP_S
from tests.lobby.lab import CONFIG, FAST, Lab


def create(
    lab: Lab, owner: str = "a", *, size: int = 4, private: bool = False, **meta: object
) -> int:
    reply = lab.ok(owner, CreateLobby(lab.rid(), f"{owner}'s room", size, private, meta))  # type: ignore[arg-type]
    assert isinstance(reply, LobbyJoined)
    return reply.lobby_id


def lobby_with(lab: Lab, *members: str, size: int = 4, **meta: object) -> int:
    lobby_id = create(lab, members[0], size=size, **meta)
    for m in members[1:]:
        lab.ok(m, JoinLobby(lab.rid(), lobby_id))
    return lobby_id


def snap(lab: Lab, lobby_id: int) -> LobbySnapshot:
    s = lab.reg.snapshot(lobby_id)
    assert s is not None
    return s


def ids(s: LobbySnapshot) -> list[str]:
    return [m.member_id for m in s.members]


# --- create ---------------------------------------------------------------------------------


def test_create_makes_the_creator_owner_and_sends_it_the_snapshot() -> None:
    lab = Lab()
    handled = lab.do("a", CreateLobby(lab.rid(), "room", 4, False, {"mode": "ffa"}))
    assert handled.reply == LobbyJoined(1, 100)
    [send] = handled.sends
    assert send.to == ("a",)
    assert isinstance(send.message, LobbySnapshot)
    s = send.message
    assert (s.owner, s.name, s.max_members, s.metadata, ids(s)) == (
        "a",
        "room",
        4,
        {"mode": "ffa"},
        ["a"],
    )
    assert s.join_code == "" and not s.private and not s.locked
    assert lab.reg.lobby_of("a") == 100
    assert lab.reg.counters["lobbies_created"] == 1


def test_private_lobby_is_joined_by_code_only() -> None:
    lab = Lab()
    lobby_id = create(lab, private=True)
    code = snap(lab, lobby_id).join_code
    assert code == "CODE1"
    assert lab.replicas["a"].join_code == code  # members see it, to invite others
    lab.refused("b", JoinLobby(lab.rid(), lobby_id), ErrorCode.PRIVATE_LOBBY)
    lab.refused("b", JoinByCode(lab.rid(), "NOPE"), ErrorCode.NO_SUCH_CODE)
    reply = lab.ok("b", JoinByCode(lab.rid(), code))
    assert isinstance(reply, LobbyJoined) and reply.lobby_id == lobby_id
    assert ids(snap(lab, lobby_id)) == ["a", "b"]
    # Private lobbies are never listed nor quick-joined.
    assert search(lab).listings == ()
    lab.refused("c", QuickJoin(lab.rid(), ()), ErrorCode.NO_MATCH)
    lab.check_replicas()


@pytest.mark.parametrize("name", ["", "x" * 65, "bad\nname", "tab\there"])
def test_create_refuses_a_bad_name(name: str) -> None:
    lab = Lab()
    lab.refused("a", CreateLobby(lab.rid(), name, 4, False, {}), ErrorCode.NAME_INVALID)
    assert lab.reg.lobby_ids() == []


@pytest.mark.parametrize("size", [0, 65])
def test_create_refuses_a_size_out_of_range(size: int) -> None:
    lab = Lab()
    lab.refused("a", CreateLobby(lab.rid(), "r", size, False, {}), ErrorCode.BAD_REQUEST)


@pytest.mark.parametrize(
    "metadata",
    [
        {f"k{i}": i for i in range(21)},  # too many keys
        {"k": "v" * 1025},  # value too long
        {"k" * 33: 1},  # key too long
        {"": 1},  # empty key
        {"mode": "m" * 129},  # indexed value too long
        {f"key{i}": "v" * 300 for i in range(14)},  # 4 KiB in all exceeded
        {"k": True},  # not a str or int
    ],
)
def test_create_refuses_oversized_metadata(metadata: dict[str, object]) -> None:
    lab = Lab()
    lab.refused("a", CreateLobby(lab.rid(), "r", 4, False, metadata), ErrorCode.METADATA_LIMIT)  # type: ignore[arg-type]


def test_a_member_is_in_one_lobby_at_a_time() -> None:
    lab = Lab()
    first = create(lab, "a")
    second = create(lab, "b")
    lab.refused("a", CreateLobby(lab.rid(), "again", 4, False, {}), ErrorCode.ALREADY_IN_LOBBY)
    lab.refused("a", JoinLobby(lab.rid(), second), ErrorCode.ALREADY_IN_LOBBY)
    lab.ok("a", LeaveLobby(lab.rid(), first))
    lab.ok("a", JoinLobby(lab.rid(), second))


def test_a_create_asked_again_is_answered_with_the_lobby_it_made() -> None:
    # Its reply was lost (or came after the member gave up): the same create again.
    lab = Lab()
    request = CreateLobby(lab.rid(), "room", 4, False, {"mode": "duel", "skill": 3})
    made = lab.ok("a", request)
    assert isinstance(made, LobbyJoined)
    lab.ok("b", JoinLobby(lab.rid(), made.lobby_id))
    handled = lab.do("a", attrs.evolve(request, request_id=lab.rid()))
    assert isinstance(handled.reply, LobbyJoined) and handled.reply.lobby_id == made.lobby_id
    assert [s.to for s in handled.sends] == [("a",)]  # its state again, nobody else told
    assert isinstance(handled.sends[0].message, LobbySnapshot)
    assert lab.reg.lobby_ids() == [made.lobby_id] and lab.reg.counters["lobbies_created"] == 1
    # Anything but the very same create is a second lobby: refused.
    for other in (
        CreateLobby(lab.rid(), "room", 4, False, {"mode": "duel"}),
        CreateLobby(lab.rid(), "room", 4, False, {"mode": "duel", "skill": 4}),
        CreateLobby(lab.rid(), "room", 4, False, {"mode": "duel", "skill": True}),  # type: ignore[dict-item]
        CreateLobby(lab.rid(), "room", 5, False, {"mode": "duel", "skill": 3}),
        CreateLobby(lab.rid(), "room", 4, True, {"mode": "duel", "skill": 3}),
        CreateLobby(lab.rid(), "Room", 4, False, {"mode": "duel", "skill": 3}),
    ):
        lab.refused("a", other, ErrorCode.ALREADY_IN_LOBBY)
    # Only its owner's: a member who joined it creating the same lobby is refused.
    lab.refused("b", attrs.evolve(request, request_id=lab.rid()), ErrorCode.ALREADY_IN_LOBBY)
    lab.check_replicas()


def test_a_quick_join_asked_again_is_answered_with_the_lobby_it_joined() -> None:
    lab = Lab()
    lobby_id = lobby_with(lab, "a", "b", size=3, mode="duel")
    ask = QuickJoin(lab.rid(), (StringEquals("mode", "duel"), FreeSlots(1)))
    assert lab.ok("c", ask) == LobbyJoined(ask.request_id, lobby_id)
    # The lobby is full now, but the member's own seat counts as free for its own retry.
    again = attrs.evolve(ask, request_id=lab.rid())
    assert lab.ok("c", again) == LobbyJoined(again.request_id, lobby_id)
    assert len(lab.reg.snapshot(lobby_id).members) == 3
    # A quick-join its lobby does not match is one for another lobby: refused.
    for filters in ((StringEquals("mode", "ffa"),), (FreeSlots(2),)):
        lab.refused("c", QuickJoin(lab.rid(), filters), ErrorCode.ALREADY_IN_LOBBY)
    lab.check_replicas()


def test_a_join_by_code_asked_again_is_answered_with_the_lobby() -> None:
    lab = Lab()
    lobby_id = create(lab, "a", private=True)
    code = lab.reg.snapshot(lobby_id).join_code
    for _ in range(2):
        assert lab.ok("b", JoinByCode(lab.rid(), code)).lobby_id == lobby_id
    assert lab.ok("b", JoinLobby(lab.rid(), lobby_id)).lobby_id == lobby_id  # (private: a member)
    assert lab.reg.counters["joins"] == 1 and lab.reg.counters["joins_repeated"] == 2
    lab.check_replicas()


def test_server_full() -> None:
    lab = Lab(LobbyConfig(max_lobbies=2, create_limit=FAST))
    create(lab, "a")
    create(lab, "b")
    lab.refused("c", CreateLobby(lab.rid(), "r", 4, False, {}), ErrorCode.SERVER_FULL)


def test_create_rate_limit_refuses_then_refills() -> None:
    lab = Lab(LobbyConfig(create_limit=RateLimit(rate=0.5, burst=2)))
    lobby_id = create(lab, "a")
    lab.ok("a", LeaveLobby(lab.rid(), lobby_id))
    lobby_id = create(lab, "a")
    lab.ok("a", LeaveLobby(lab.rid(), lobby_id))
    lab.refused("a", CreateLobby(lab.rid(), "r", 4, False, {}), ErrorCode.RATE_LIMITED)
    lab.advance(1.9)  # 0.95 tokens: still not one
    lab.refused("a", CreateLobby(lab.rid(), "r", 4, False, {}), ErrorCode.RATE_LIMITED)
    lab.advance(0.2)
    create(lab, "a")
    # Another member has its own bucket.
    create(lab, "b")


# --- join and leave -------------------------------------------------------------------------


def test_join_tells_the_others_and_sends_the_joiner_the_state() -> None:
    lab = Lab()
    lobby_id = lobby_with(lab, "a", "b")
    handled = lab.do("c", JoinLobby(lab.rid(), lobby_id))
    assert handled.reply == LobbyJoined(handled.reply.request_id, lobby_id)
    joined, snapshot = handled.sends
    assert joined.to == ("a", "b")
    assert isinstance(joined.message, MemberJoined) and joined.message.member.member_id == "c"
    assert snapshot.to == ("c",) and isinstance(snapshot.message, LobbySnapshot)
    assert ids(snapshot.message) == ["a", "b", "c"]
    lab.check_replicas()


def test_join_refusals() -> None:
    lab = Lab()
    lobby_id = lobby_with(lab, "a", "b", size=2)
    lab.refused("x", JoinLobby(lab.rid(), 999), ErrorCode.NO_SUCH_LOBBY)
    lab.refused("c", JoinLobby(lab.rid(), lobby_id), ErrorCode.LOBBY_FULL)
    lab.ok("b", LeaveLobby(lab.rid(), lobby_id))
    lab.ok("a", SetLocked(lab.rid(), lobby_id, True))
    lab.refused("c", JoinLobby(lab.rid(), lobby_id), ErrorCode.LOBBY_LOCKED)
    lab.ok("a", SetLocked(lab.rid(), lobby_id, False))
    lab.ok("c", JoinLobby(lab.rid(), lobby_id))
    lab.check_replicas()


def test_a_retried_join_resends_the_state_without_changing_it() -> None:
    lab = Lab()
    lobby_id = lobby_with(lab, "a", "b")
    version = snap(lab, lobby_id).version
    handled = lab.do("b", JoinLobby(lab.rid(), lobby_id))
    assert isinstance(handled.reply, LobbyJoined)
    [send] = handled.sends
    assert send.to == ("b",) and send.message == snap(lab, lobby_id)
    assert snap(lab, lobby_id).version == version


def test_leave_tells_everyone_including_the_leaver() -> None:
    lab = Lab()
    lobby_id = lobby_with(lab, "a", "b", "c")
    handled = lab.do("c", LeaveLobby(lab.rid(), lobby_id))
    assert isinstance(handled.reply, Done)
    [send] = handled.sends
    assert send.to == ("a", "b", "c")
    assert send.message == MemberLeft(lobby_id, send.message.version, "c", LeaveReason.LEFT)  # type: ignore[union-attr]
    assert lab.replicas["c"].closed
    assert lab.reg.lobby_of("c") is None
    lab.refused("c", LeaveLobby(lab.rid(), lobby_id), ErrorCode.NOT_MEMBER)
    lab.check_replicas()


def test_the_last_member_leaving_deletes_the_lobby_and_frees_its_code() -> None:
    lab = Lab()
    lobby_id = create(lab, "a", private=True)
    code = snap(lab, lobby_id).join_code
    lab.ok("a", LeaveLobby(lab.rid(), lobby_id))
    assert lab.reg.lobby_ids() == []
    assert lab.reg.counters["lobbies_deleted"] == 1
    lab.refused("b", JoinByCode(lab.rid(), code), ErrorCode.NO_SUCH_CODE)
    lab.refused("b", JoinLobby(lab.rid(), lobby_id), ErrorCode.NO_SUCH_LOBBY)


# --- owner-only operations ------------------------------------------------------------------


def owner_only_requests(lobby_id: int) -> list[Request]:
    return [
        SetMetadata(7, lobby_id, {"mode": "ctf"}),
        SetLocked(7, lobby_id, True),
        KickMember(7, lobby_id, "c"),
        BanMember(7, lobby_id, "c"),
        TransferOwner(7, lobby_id, "b"),
    ]


@pytest.mark.parametrize("index", range(5))
def test_owner_only_operations_by_a_non_owner_are_refused(index: int) -> None:
    lab = Lab()
    lobby_id = lobby_with(lab, "a", "b", "c")
    before = snap(lab, lobby_id)
    request = owner_only_requests(lobby_id)[index]
    lab.refused("b", request, ErrorCode.NOT_OWNER)
    lab.refused("outsider", request, ErrorCode.NOT_MEMBER)
    assert snap(lab, lobby_id) == before


def test_set_metadata_applies_changes_and_reindexes() -> None:
    lab = Lab()
    lobby_id = create(lab, "a", mode="ffa", skill=5, notes="x")
    lab.ok("a", SetMetadata(lab.rid(), lobby_id, {"mode": "ctf", "notes": None, "new": 1}))
    assert snap(lab, lobby_id).metadata == {"mode": "ctf", "skill": 5, "new": 1}
    found = lab.ok("b", SearchLobbies(lab.rid(), (StringEquals("mode", "ffa"),), None, 10))
    assert isinstance(found, SearchResults) and found.listings == ()
    found = lab.ok("b", SearchLobbies(lab.rid(), (StringEquals("mode", "ctf"),), None, 10))
    assert isinstance(found, SearchResults) and [x.lobby_id for x in found.listings] == [lobby_id]
    # A change that changes nothing sends nothing.
    version = snap(lab, lobby_id).version
    assert lab.do("a", SetMetadata(lab.rid(), lobby_id, {"mode": "ctf", "gone": None})).sends == ()
    assert snap(lab, lobby_id).version == version
    lab.refused(
        "a",
        SetMetadata(lab.rid(), lobby_id, {f"k{i}": i for i in range(18)}),
        ErrorCode.METADATA_LIMIT,
    )
    assert snap(lab, lobby_id).metadata == {"mode": "ctf", "skill": 5, "new": 1}
    lab.check_replicas()


def test_kick_removes_and_tells_the_member_who_may_come_back() -> None:
    lab = Lab()
    lobby_id = lobby_with(lab, "a", "b", "c")
    handled = lab.do("a", KickMember(lab.rid(), lobby_id, "c"))
    [send] = handled.sends
    assert "c" in send.to and isinstance(send.message, MemberLeft)
    assert send.message.reason is LeaveReason.KICKED
    assert lab.replicas["c"].closed
    lab.refused("a", KickMember(lab.rid(), lobby_id, "c"), ErrorCode.NO_SUCH_MEMBER)
    lab.refused("a", KickMember(lab.rid(), lobby_id, "a"), ErrorCode.BAD_REQUEST)
    lab.ok("c", JoinLobby(lab.rid(), lobby_id))
    lab.check_replicas()


def test_ban_removes_for_the_lobbys_life() -> None:
    lab = Lab()
    lobby_id = lobby_with(lab, "a", "b", "c")
    handled = lab.do("a", BanMember(lab.rid(), lobby_id, "c"))
    banned, left = handled.sends
    assert isinstance(banned.message, MemberBanned) and "c" in banned.to
    assert isinstance(left.message, MemberLeft) and left.message.reason is LeaveReason.BANNED
    assert snap(lab, lobby_id).bans == ("c",)
    lab.refused("c", JoinLobby(lab.rid(), lobby_id), ErrorCode.BANNED)
    # Ahead of time, for someone not present; and banning twice is harmless.
    lab.ok("a", BanMember(lab.rid(), lobby_id, "d"))
    lab.ok("a", BanMember(lab.rid(), lobby_id, "d"))
    assert snap(lab, lobby_id).bans == ("c", "d")
    lab.refused("d", JoinLobby(lab.rid(), lobby_id), ErrorCode.BANNED)
    lab.refused("d", QuickJoin(lab.rid(), ()), ErrorCode.NO_MATCH)
    lab.refused("a", BanMember(lab.rid(), lobby_id, "a"), ErrorCode.BAD_REQUEST)
    lab.check_replicas()


def test_ban_of_a_private_lobby_holds_for_its_code_too() -> None:
    lab = Lab()
    lobby_id = create(lab, "a", private=True)
    code = snap(lab, lobby_id).join_code
    lab.ok("b", JoinByCode(lab.rid(), code))
    lab.ok("a", BanMember(lab.rid(), lobby_id, "b"))
    lab.refused("b", JoinByCode(lab.rid(), code), ErrorCode.BANNED)


def test_ban_list_full() -> None:
    lab = Lab(LobbyConfig(max_bans=2, update_limit=FAST, create_limit=FAST))
    lobby_id = create(lab, "a")
    lab.ok("a", BanMember(lab.rid(), lobby_id, "x"))
    lab.ok("a", BanMember(lab.rid(), lobby_id, "y"))
    lab.refused("a", BanMember(lab.rid(), lobby_id, "z"), ErrorCode.BAN_LIST_FULL)


def test_transfer_ownership() -> None:
    lab = Lab()
    lobby_id = lobby_with(lab, "a", "b", "c")
    handled = lab.do("a", TransferOwner(lab.rid(), lobby_id, "c"))
    [send] = handled.sends
    assert send.message == OwnerChanged(lobby_id, snap(lab, lobby_id).version, "c")
    assert snap(lab, lobby_id).owner == "c"
    lab.refused("a", SetLocked(lab.rid(), lobby_id, True), ErrorCode.NOT_OWNER)
    lab.refused("c", TransferOwner(lab.rid(), lobby_id, "zz"), ErrorCode.NO_SUCH_MEMBER)
    lab.disconnect("b")
    lab.refused("c", TransferOwner(lab.rid(), lobby_id, "b"), ErrorCode.MEMBER_NOT_CONNECTED)
    lab.check_replicas()


# --- owner migration ------------------------------------------------------------------------


def test_owner_leaving_hands_over_to_the_earliest_joined_connected_member() -> None:
    lab = Lab()
    lobby_id = lobby_with(lab, "a", "b", "c", "d")
    lab.disconnect("b")  # earliest after a, but not connected: skipped
    lab.ok("a", LeaveLobby(lab.rid(), lobby_id))
    assert snap(lab, lobby_id).owner == "c"
    assert lab.reg.counters["owner_migrations"] == 1
    lab.check_replicas()


def test_owner_dropping_hands_over_at_once_and_gets_it_back_with_its_seat() -> None:
    lab = Lab()
    lobby_id = lobby_with(lab, "a", "b", "c")
    lab.disconnect("a")
    assert snap(lab, lobby_id).owner == "b"  # owner-only requests are never left unanswered
    # a's seat comes back (a NAT that forgot its mapping, a new network): ownership follows
    # the member, not its address.
    sends = lab.reconnect("a")
    assert snap(lab, lobby_id).owner == "a"
    assert any(isinstance(s.message, OwnerChanged) and s.to == ("b", "c") for s in sends)
    assert lab.reg.counters["owner_migrations"] == 2
    lab.check_replicas()
    for m in ("a", "b", "c"):
        lab.disconnect(m)
    # a dropping handed it to b, b dropping to c, the last connected; c dropping had nobody
    # better to give it to.
    assert snap(lab, lobby_id).owner == "c"
    lab.reconnect("a")
    assert snap(lab, lobby_id).owner == "a"  # the only connected member takes it
    lab.reconnect("c")
    assert snap(lab, lobby_id).owner == "c"  # the last owner whose session dropped
    lab.check_replicas()


def test_a_dropped_owner_does_not_get_back_what_was_given_away_or_left() -> None:
    lab = Lab()
    lobby_id = lobby_with(lab, "a", "b", "c")
    lab.disconnect("a")
    lab.ok("b", TransferOwner(lab.rid(), lobby_id, "c"))  # on purpose: c's now
    lab.reconnect("a")
    assert snap(lab, lobby_id).owner == "c"
    lab.disconnect("c")
    assert snap(lab, lobby_id).owner == "a"
    lab.ok("c", LeaveLobby(lab.rid(), lobby_id))  # its seat back, then gone: no claim left
    lab.disconnect("a")
    lab.reconnect("a")
    assert snap(lab, lobby_id).owner == "a"
    lab.check_replicas()


# --- attributes, ready, chat ----------------------------------------------------------------


def test_attributes_are_set_by_their_member_only() -> None:
    lab = Lab()
    lobby_id = lobby_with(lab, "a", "b")
    handled = lab.do("b", SetAttributes(lab.rid(), lobby_id, "b", {"hero": "mage", "lvl": 3}))
    [send] = handled.sends
    assert isinstance(send.message, AttributesChanged) and send.to == ("a", "b")
    lab.ok("b", SetAttributes(lab.rid(), lobby_id, "b", {"lvl": None}))
    assert snap(lab, lobby_id).members[1].attributes == {"hero": "mage"}
    lab.refused("a", SetAttributes(lab.rid(), lobby_id, "b", {"hero": "x"}), ErrorCode.OTHER_MEMBER)
    lab.refused(
        "b",
        SetAttributes(lab.rid(), lobby_id, "b", {"big": "x" * 1100}),
        ErrorCode.ATTRIBUTES_LIMIT,
    )
    lab.refused(
        "b",
        SetAttributes(lab.rid(), lobby_id, "b", {f"k{i}": i for i in range(11)}),
        ErrorCode.ATTRIBUTES_LIMIT,
    )
    lab.refused("c", SetAttributes(lab.rid(), lobby_id, "c", {}), ErrorCode.NOT_MEMBER)
    assert snap(lab, lobby_id).members[1].attributes == {"hero": "mage"}
    lab.check_replicas()


def test_ready_is_set_by_its_member_only() -> None:
    lab = Lab()
    lobby_id = lobby_with(lab, "a", "b")
    lab.ok("b", SetReady(lab.rid(), lobby_id, "b", True))
    assert [m.ready for m in snap(lab, lobby_id).members] == [False, True]
    lab.refused("b", SetReady(lab.rid(), lobby_id, "a", True), ErrorCode.OTHER_MEMBER)
    assert lab.do("b", SetReady(lab.rid(), lobby_id, "b", True)).sends == ()
    lab.check_replicas()


def test_chat_fans_out_to_connected_members() -> None:
    lab = Lab()
    lobby_id = lobby_with(lab, "a", "b", "c")
    lab.disconnect("c")
    handled = lab.do("b", SendChat(lab.rid(), lobby_id, "gl hf"))
    assert isinstance(handled.reply, Done)
    assert [(s.to, s.message) for s in handled.sends] == [
        (("a", "b"), ChatLine(lobby_id, "b", "gl hf"))
    ]
    assert lab.reg.counters["chat_lines"] == 1 and lab.reg.counters["chat_deliveries"] == 2
    lab.refused("b", SendChat(lab.rid(), lobby_id, ""), ErrorCode.CHAT_LIMIT)
    lab.refused("b", SendChat(lab.rid(), lobby_id, "x" * 257), ErrorCode.CHAT_LIMIT)
    lab.refused("b", SendChat(lab.rid(), lobby_id, "fake\nline"), ErrorCode.CHAT_LIMIT)
    lab.refused("z", SendChat(lab.rid(), lobby_id, "hi"), ErrorCode.NOT_MEMBER)


def test_a_chat_flood_hits_the_rate_limit_and_is_counted() -> None:
    lab = Lab(
        LobbyConfig(chat_limit=RateLimit(rate=4.0, burst=8), create_limit=FAST, join_limit=FAST)
    )
    lobby_id = lobby_with(lab, "a", "b")
    results = [lab.do("b", SendChat(lab.rid(), lobby_id, f"spam {i}")).reply for i in range(100)]
    assert sum(isinstance(r, Done) for r in results) == 8
    assert lab.reg.refusals[ErrorCode.RATE_LIMITED] == 92
    assert len(lab.chat["a"]) == 8
    # The flood does not cost the other member its own budget.
    assert isinstance(lab.do("a", SendChat(lab.rid(), lobby_id, "stop")).reply, Done)
    lab.advance(0.5)  # two tokens back
    replies = [lab.do("b", SendChat(lab.rid(), lobby_id, "again")).reply for _ in range(3)]
    assert [isinstance(r, Done) for r in replies] == [True, True, False]


@pytest.mark.parametrize(
    ("kind", "make"),
    [
        ("update", lambda lid: SetReady(0, lid, "a", True)),
        ("search", lambda lid: SearchLobbies(0, (), None, 5)),
    ],
)
def test_update_and_search_are_rate_limited(kind: str, make: object) -> None:
    limit = RateLimit(rate=1.0, burst=3)
    config = LobbyConfig(update_limit=limit, search_limit=limit)
    lab = Lab(config)
    lobby_id = create(lab, "a")
    outcomes = []
    for i in range(6):
        req = make(lobby_id)  # type: ignore[operator]
        ready = i % 2 == 0
        if isinstance(req, SetReady):
            req = SetReady(lab.rid(), lobby_id, "a", ready)
        else:
            req = SearchLobbies(lab.rid(), (), None, 5)
        outcomes.append(lab.do("a", req).reply)
    assert [type(r).__name__ for r in outcomes].count("Refusal") == 3, kind
    assert lab.reg.refusals[ErrorCode.RATE_LIMITED] == 3


# --- presence and reconnection --------------------------------------------------------------


def test_reconnection_within_the_grace_period_keeps_the_seat() -> None:
    lab = Lab(
        LobbyConfig(reconnect_grace=5.0, create_limit=FAST, join_limit=FAST, update_limit=FAST)
    )
    lobby_id = lobby_with(lab, "a", "b", size=2)
    [send] = lab.disconnect("b")
    assert send.to == ("a",) and isinstance(send.message, PresenceChanged)
    assert send.message.presence is Presence.RECONNECTING
    assert lab.reg.next_deadline() == 5.0  # (before the rate buckets' sweep at 10 s)
    lab.refused("c", JoinLobby(lab.rid(), lobby_id), ErrorCode.LOBBY_FULL)  # the seat is kept
    lab.ok("a", SetMetadata(lab.rid(), lobby_id, {"x": 1}))  # b misses this update...
    assert lab.advance(4.0) == ()
    sends = lab.reconnect("b")
    assert sends[-1].to == ("b",) and isinstance(sends[-1].message, LobbySnapshot)
    assert lab.replicas["b"].metadata == {"x": 1}  # ...and has it from the snapshot
    assert lab.reg.next_deadline() == BUCKET_SWEEP_S  # the grace period's end went with it
    assert lab.advance(5.0) == ()
    assert ids(snap(lab, lobby_id)) == ["a", "b"]
    lab.check_replicas()


def test_the_grace_period_ending_drops_the_member_and_migrates_the_owner() -> None:
    lab = Lab(LobbyConfig(reconnect_grace=10.0, create_limit=FAST, join_limit=FAST))
    lobby_id = lobby_with(lab, "a", "b")
    lab.disconnect("b")
    lab.now = 1.0
    lab.disconnect("a")
    assert snap(lab, lobby_id).owner == "a"  # nobody connected to take over
    lab.now = 4.0
    lab.reconnect("b")
    assert snap(lab, lobby_id).owner == "b"
    assert lab.advance(5.0) == ()  # b's grace would end at 10, a's at 11
    sends = lab.advance(2.0)
    [left] = sends
    assert left.message == MemberLeft(
        lobby_id, snap(lab, lobby_id).version, "a", LeaveReason.DROPPED
    )
    assert lab.reg.lobby_of("a") is None
    lab.disconnect("b")
    lab.advance(10.0)
    assert lab.reg.lobby_ids() == []  # empty lobby deleted
    assert lab.reg.counters["members_expired"] == 2


def test_a_dropped_member_can_claim_its_seat_by_joining_again() -> None:
    lab = Lab()
    lobby_id = create(lab, "a", private=True)
    lab.ok("b", JoinByCode(lab.rid(), snap(lab, lobby_id).join_code))
    lab.disconnect("b")
    lab.ok("b", JoinLobby(lab.rid(), lobby_id))  # its own seat: the code is not needed
    assert snap(lab, lobby_id).members[1].presence is Presence.CONNECTED
    lab.check_replicas()


def test_full_rate_buckets_are_forgotten_at_the_deadline_the_driver_waits_for() -> None:
    """The server calls `expire` only at `next_deadline`. Rate buckets must set one while any
    are kept, or a server keeps a bucket for every member it ever rate-checked (the one-hour
    soak's lobby servers kept about 65,000 more an hour)."""
    lab = Lab(LobbyConfig(chat_limit=RateLimit(rate=1.0, burst=2), create_limit=FAST))
    assert lab.reg.next_deadline() is None
    lobby_id = create(lab, "a")
    first_bucket = lab.now
    lab.ok("a", SendChat(lab.rid(), lobby_id, "one"))
    lab.ok("a", SendChat(lab.rid(), lobby_id, "two"))
    lab.refused("a", SendChat(lab.rid(), lobby_id, "three"), ErrorCode.RATE_LIMITED)
    sweep = lab.reg.next_deadline()
    assert sweep == first_bucket + BUCKET_SWEEP_S
    # A bucket used just before the sweep is not full at it: kept, and the next sweep set.
    lab.advance(sweep - 0.5 - lab.now)
    assert ("a", "chat") in lab.reg._buckets  # (a look before the deadline sweeps nothing)
    lab.ok("a", SendChat(lab.rid(), lobby_id, "four"))
    lab.advance(sweep - lab.now)
    assert list(lab.reg._buckets) == [("a", "chat")]
    assert lab.reg.next_deadline() == sweep + BUCKET_SWEEP_S
    lab.advance(BUCKET_SWEEP_S)
    assert lab.reg._buckets == {}
    assert lab.reg.next_deadline() is None  # nothing left to look at


# --- search and quick-join ------------------------------------------------------------------


def search(lab: Lab, *filters: object, limit: int = 50, cursor: int | None = None) -> SearchResults:
    reply = lab.ok("searcher", SearchLobbies(lab.rid(), tuple(filters), cursor, limit))  # type: ignore[arg-type]
    assert isinstance(reply, SearchResults)
    return reply


def test_search_filters() -> None:
    lab = Lab()
    ffa_low = lobby_with(lab, "a", size=2, mode="ffa", skill=10, secret="s")
    ffa_high = lobby_with(lab, "b", "b2", size=2, mode="ffa", skill=50)
    ctf = create(lab, "c", mode="ctf", skill=30)
    locked = create(lab, "d", mode="ffa", skill=10)
    lab.ok("d", SetLocked(lab.rid(), locked, True))

    def found(*filters: object) -> list[int]:
        return [x.lobby_id for x in search(lab, *filters).listings]

    assert found() == [ffa_low, ffa_high, ctf]  # locked is not listed
    assert found(StringEquals("mode", "ffa")) == [ffa_low, ffa_high]
    assert found(NumberRange("skill", 20, 50)) == [ffa_high, ctf]
    assert found(StringEquals("mode", "ffa"), NumberRange("skill", 0, 20)) == [ffa_low]
    assert found(FreeSlots(1)) == [ffa_low, ctf]
    assert found(FreeSlots(2)) == [ctf]
    assert found(NumberRange("mode", 0, 100)) == []  # a string never matches a range
    assert found(StringEquals("skill", "10")) == []  # nor an integer an equality on text
    [listing] = search(lab, StringEquals("mode", "ctf")).listings
    assert (listing.name, listing.member_count, listing.max_members) == ("c's room", 1, 4)
    listing = search(lab, NumberRange("skill", 10, 10)).listings[0]
    assert listing.metadata == {"mode": "ffa", "skill": 10}  # unindexed "secret" not listed


def test_search_refusals() -> None:
    lab = Lab()
    lab.refused(
        "s",
        SearchLobbies(lab.rid(), (StringEquals("secret", "x"),), None, 5),
        ErrorCode.FILTER_INVALID,
    )
    lab.refused(
        "s",
        SearchLobbies(lab.rid(), (NumberRange("skill", 5, 4),), None, 5),
        ErrorCode.FILTER_INVALID,
    )
    lab.refused(
        "s", SearchLobbies(lab.rid(), (FreeSlots(1),) * 9, None, 5), ErrorCode.FILTER_INVALID
    )
    lab.refused("s", SearchLobbies(lab.rid(), (), None, 0), ErrorCode.BAD_REQUEST)
    lab.refused("s", SearchLobbies(lab.rid(), (), None, 51), ErrorCode.BAD_REQUEST)
    lab.refused("s", QuickJoin(lab.rid(), (StringEquals("secret", "x"),)), ErrorCode.FILTER_INVALID)


def test_paging_is_stable_while_lobbies_come_and_go() -> None:
    lab = Lab(first_id=10)
    owners = [f"o{i}" for i in range(7)]
    made = [create(lab, o, mode="ffa") for o in owners]  # ids 10..16
    page = search(lab, StringEquals("mode", "ffa"), limit=3)
    assert [x.lobby_id for x in page.listings] == made[:3] and page.next_cursor == made[2]
    # Meanwhile: one already seen and one not yet seen are deleted; one is created.
    lab.ok("o1", LeaveLobby(lab.rid(), made[1]))
    lab.ok("o4", LeaveLobby(lab.rid(), made[4]))
    added = create(lab, "late", mode="ffa")  # id 17
    seen = [x.lobby_id for x in page.listings]
    cursor = page.next_cursor
    while cursor is not None:
        page = search(lab, StringEquals("mode", "ffa"), limit=3, cursor=cursor)
        seen += [x.lobby_id for x in page.listings]
        cursor = page.next_cursor
    assert seen == [10, 11, 12, 13, 15, 16, added]  # no repeats, nothing that lived is skipped


def test_quick_join_fills_the_fullest_matching_lobby() -> None:
    lab = Lab(first_id=10)
    small = lobby_with(lab, "a", size=4, mode="ffa")
    fuller = lobby_with(lab, "b", "b2", "b3", size=4, mode="ffa")
    full = lobby_with(lab, "c", "c2", size=2, mode="ffa")
    other_mode = lobby_with(lab, "d", "d2", "d3", size=8, mode="ctf")
    reply = lab.ok("q1", QuickJoin(lab.rid(), (StringEquals("mode", "ffa"),)))
    assert isinstance(reply, LobbyJoined) and reply.lobby_id == fuller
    assert lab.reg.lobby_of("q1") == fuller
    # fuller is now full; the next one goes to small, never to full or other_mode.
    lab.ok("q2", QuickJoin(lab.rid(), (StringEquals("mode", "ffa"),)))
    assert lab.reg.lobby_of("q2") == small
    lab.ok("q3", QuickJoin(lab.rid(), ()))
    assert lab.reg.lobby_of("q3") == other_mode  # 3 members beat small's 2
    assert full in lab.reg.lobby_ids()
    lab.refused("q4", QuickJoin(lab.rid(), (StringEquals("mode", "none"),)), ErrorCode.NO_MATCH)
    lab.check_replicas()


def test_refusals_are_counted_by_code() -> None:
    lab = Lab()
    lobby_id = lobby_with(lab, "a", "b")
    lab.refused("b", SetLocked(lab.rid(), lobby_id, True), ErrorCode.NOT_OWNER)
    lab.refused("b", SetLocked(lab.rid(), lobby_id, True), ErrorCode.NOT_OWNER)
    lab.refused("z", JoinLobby(lab.rid(), 12345), ErrorCode.NO_SUCH_LOBBY)
    assert dict(lab.reg.refusals) == {ErrorCode.NOT_OWNER: 2, ErrorCode.NO_SUCH_LOBBY: 1}


def test_default_config_builds_and_ids_are_random_and_nonzero() -> None:
    reg = LobbyRegistry(LobbyConfig(indexed_keys=CONFIG.indexed_keys))
    seen = set()
    for i in range(20):
        handled = reg.handle(f"m{i}", CreateLobby(1, "r", 2, True, {}), 0.0)
        assert isinstance(handled.reply, LobbyJoined)
        seen.add(handled.reply.lobby_id)
        s = reg.snapshot(handled.reply.lobby_id)
        assert s is not None and len(s.join_code) == 8
    assert len(seen) == 20 and 0 not in seen


def test_search_by_a_rare_value_uses_the_index_and_pages_the_same() -> None:
    lab = Lab(first_id=10)
    rare = []
    for i in range(40):
        lobby_id = create(lab, f"o{i}", mode="rare" if i in (5, 17, 30) else "common")
        if i in (5, 17, 30):
            rare.append(lobby_id)
    lab.ok("o30", SetLocked(lab.rid(), rare[2], True))  # locked: indexed but not listed
    page = search(lab, StringEquals("mode", "rare"), limit=1)
    assert [x.lobby_id for x in page.listings] == [rare[0]] and page.next_cursor == rare[0]
    page = search(lab, StringEquals("mode", "rare"), limit=1, cursor=page.next_cursor)
    assert [x.lobby_id for x in page.listings] == [rare[1]] and page.next_cursor is None
    common = search(lab, StringEquals("mode", "common"), FreeSlots(3), limit=50)
    assert len(common.listings) == 37 and common.next_cursor is None
