"""No ghost lobbies: a lobby none of whose members is connected leaves search, quick-join and
the listings topic at once, keeps its seats for the grace period, and is listed again when a
member is connected again (pure registry, `now` passed in)."""

from __future__ import annotations

from echo.lobby.listings import ListingGone
from echo.lobby.protocol import (
    ErrorCode,
    JoinLobby,
    LeaveLobby,
    LobbyJoined,
    Presence,
    QuickJoin,
    SearchLobbies,
    SearchResults,
    SetLocked,
    StringEquals,
)
from tests.lobby.lab import CONFIG, Lab
from tests.lobby.test_state import create, lobby_with, snap


def found(lab: Lab, *filters: StringEquals, by: str = "seeker") -> list[int]:
    reply = lab.ok(by, SearchLobbies(lab.rid(), tuple(filters), None, 50))
    assert isinstance(reply, SearchResults)
    return [listing.lobby_id for listing in reply.listings]


def published(lab: Lab) -> tuple[set[int], set[int]]:
    """The lobby ids the listings topic would hear about now: (changed, gone)."""
    changed, gone = lab.reg.listing_changes()
    assert all(isinstance(g, ListingGone) for g in gone)
    return {c.lobby_id for c in changed}, {g.lobby_id for g in gone}


def test_a_lobby_whose_last_connected_member_dropped_is_not_found() -> None:
    lab = Lab()
    ghost = lobby_with(lab, "a", "b", mode="ffa")
    other = lobby_with(lab, "c", mode="ffa")
    assert found(lab) == [ghost, other]
    assert published(lab) == ({ghost, other}, set())
    lab.disconnect("a")
    assert found(lab) == [ghost, other]  # b is still there: not a ghost
    lab.disconnect("b")
    assert found(lab) == [other]
    assert found(lab, StringEquals("mode", "ffa")) == [other]
    assert published(lab) == (set(), {ghost})
    # Quick-join does not put a player alone in it either.
    lab.ok("c", LeaveLobby(lab.rid(), other))
    lab.refused("seeker", QuickJoin(lab.rid(), ()), ErrorCode.NO_MATCH)
    # Its seats are kept all the same, for the grace period.
    s = snap(lab, ghost)
    assert [m.presence for m in s.members] == [Presence.RECONNECTING] * 2
    lab.check_replicas()


def test_a_ghost_comes_back_when_a_member_returns_within_its_grace() -> None:
    lab = Lab()
    ghost = lobby_with(lab, "a", "b")
    lab.disconnect("a")
    lab.disconnect("b")
    lab.advance(CONFIG.reconnect_grace - 1.0)
    assert found(lab) == []
    published(lab)
    lab.reconnect("b")
    assert found(lab) == [ghost]
    assert published(lab) == ({ghost}, set())
    reply = lab.ok("seeker", QuickJoin(lab.rid(), ()))
    assert isinstance(reply, LobbyJoined) and reply.lobby_id == ghost
    # a never came back: its seat goes at the end of its grace; the lobby stays (b, seeker).
    lab.advance(1.5)
    assert [m.member_id for m in snap(lab, ghost).members] == ["b", "seeker"]
    assert found(lab, by="x") == [ghost]
    lab.check_replicas()


def test_a_ghost_nobody_returns_to_is_deleted_after_the_grace() -> None:
    lab = Lab()
    ghost = lobby_with(lab, "a")
    lab.disconnect("a")
    assert found(lab) == []
    lab.advance(CONFIG.reconnect_grace + 0.1)
    assert lab.reg.snapshot(ghost) is None
    assert found(lab) == []


def test_a_player_who_joins_a_ghost_by_id_brings_it_back() -> None:
    lab = Lab()
    ghost = lobby_with(lab, "a")
    lab.disconnect("a")
    assert found(lab) == []
    lab.ok("b", JoinLobby(lab.rid(), ghost))  # it knew the id (a friend's invitation)
    assert found(lab) == [ghost]
    lab.check_replicas()


def test_the_indexed_search_path_skips_ghosts_too() -> None:
    """A rare value is searched through the metadata index, not the listed ids: the same rule."""
    lab = Lab()
    rare = lobby_with(lab, "r", mode="rare")
    common = [create(lab, f"m{i}", mode="common") for i in range(10)]
    assert found(lab, StringEquals("mode", "rare")) == [rare]
    lab.disconnect("r")
    assert found(lab, StringEquals("mode", "rare")) == []
    assert found(lab) == common
    lab.reconnect("r")
    assert found(lab, StringEquals("mode", "rare")) == [rare]


def test_a_locked_lobby_stays_unlisted_when_its_member_returns() -> None:
    lab = Lab()
    lobby_id = lobby_with(lab, "a", "b")
    lab.ok("a", SetLocked(lab.rid(), lobby_id, True))
    lab.disconnect("a")
    lab.disconnect("b")
    lab.reconnect("a")
    assert found(lab) == []
    lab.ok("a", SetLocked(lab.rid(), lobby_id, False))
    assert found(lab) == [lobby_id]
