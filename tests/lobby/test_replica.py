"""A member's copy of its lobby: version order, gaps, leaving (echo.lobby.replica).

That a replica fed the registry's sends equals the server's state is checked by every registry
test through `Lab.check_replicas` and by the random-operations property.
"""

from __future__ import annotations

from echo.lobby.protocol import (
    AttributesChanged,
    LeaveReason,
    LobbySnapshot,
    LockChanged,
    MemberBanned,
    MemberJoined,
    MemberLeft,
    MemberState,
    MetadataChanged,
    OwnerChanged,
    Presence,
    PresenceChanged,
    ReadyChanged,
    RecreateLobby,
)
from echo.lobby.replica import ApplyResult, LobbyReplica

A = MemberState("a", 0, False, Presence.CONNECTED, {})
START = LobbySnapshot(7, 5, "room", 4, False, "", False, "a", {"mode": "ffa"}, (), (A,))


def test_updates_apply_in_version_order() -> None:
    r = LobbyReplica("a", START)
    b = MemberState("b", 1, False, Presence.CONNECTED, {})
    steps = [
        MemberJoined(7, 6, b),
        OwnerChanged(7, 7, "b"),
        MetadataChanged(7, 8, {"mode": None, "skill": 3}),
        LockChanged(7, 9, True),
        AttributesChanged(7, 10, "b", {"hero": "mage"}),
        ReadyChanged(7, 11, "b", True),
        PresenceChanged(7, 12, "b", Presence.RECONNECTING),
        MemberBanned(7, 13, "troll"),
    ]
    for update in steps:
        assert r.apply(update) is ApplyResult.APPLIED
    s = r.snapshot()
    assert s.version == 13 and s.owner == "b" and s.locked and s.bans == ("troll",)
    assert s.metadata == {"skill": 3}
    assert s.members[1] == MemberState("b", 1, True, Presence.RECONNECTING, {"hero": "mage"})


def test_old_duplicate_and_missing_versions() -> None:
    r = LobbyReplica("a", START)
    assert r.apply(LockChanged(7, 5, True)) is ApplyResult.STALE
    assert r.apply(LockChanged(7, 7, True)) is ApplyResult.GAP
    assert r.snapshot() == START  # unchanged by either
    assert r.apply(LockChanged(8, 6, True)) is ApplyResult.OTHER_LOBBY
    # A snapshot heals the gap; an older snapshot is ignored.
    newer = LobbySnapshot(7, 9, "room", 4, False, "", True, "a", {}, (), (A,))
    assert r.apply(newer) is ApplyResult.APPLIED and r.snapshot() == newer
    assert r.apply(START) is ApplyResult.STALE and r.snapshot() == newer
    assert r.apply(LockChanged(7, 10, False)) is ApplyResult.APPLIED


def test_leaving_closes_the_replica() -> None:
    r = LobbyReplica("a", START)
    assert r.apply(MemberLeft(7, 6, "a", LeaveReason.KICKED)) is ApplyResult.LEFT
    assert r.closed
    assert r.apply(LockChanged(7, 7, True)) is ApplyResult.CLOSED


def test_recreate_request_carries_the_copy() -> None:
    r = LobbyReplica("a", START)
    r.apply(LockChanged(7, 6, True))
    assert r.recreate_request(99) == RecreateLobby(99, r.snapshot())
    assert r.recreate_request(99).snapshot.locked
