"""The registry's read-outs (echo.lobby.state): the census the metrics scrape, listings and
the running game of a lobby, with exact figures, so that a count that resets or adds twice
shows (tests/ops reads them only through a networked server)."""

from __future__ import annotations

from echo.lobby.protocol import (
    BanMember,
    CreateLobby,
    ErrorCode,
    FreeSlots,
    JoinLobby,
    LeaveLobby,
    LobbyJoined,
    LobbyListing,
    NumberRange,
    Presence,
    QuickJoin,
    SetLocked,
    StringEquals,
)
from echo.lobby.search_index import listing_matches as _listing_matches
from tests.lobby.lab import Lab


def create(lab: Lab, owner: str, *, private: bool = False) -> int:
    reply = lab.ok(owner, CreateLobby(lab.rid(), f"{owner}'s", 8, private, {}))
    assert isinstance(reply, LobbyJoined)
    return reply.lobby_id


def test_the_census_counts_every_lobby_and_every_seat() -> None:
    lab = Lab()
    listed = [create(lab, "ann"), create(lab, "bob"), create(lab, "cy")]
    create(lab, "dee", private=True)
    create(lab, "eve", private=True)
    locked = create(lab, "fay", private=True)
    lab.ok("fay", SetLocked(lab.rid(), locked, True))
    for member, lobby in (("g1", listed[0]), ("g2", listed[0]), ("g3", listed[1])):
        lab.ok(member, JoinLobby(lab.rid(), lobby))
    lab.disconnect("g1")
    lab.disconnect("dee")
    lobbies, seats = lab.reg.census()
    assert lobbies == {"listed": 3, "private": 2, "locked": 1}
    assert seats == {Presence.CONNECTED: 7, Presence.RECONNECTING: 2}


def test_an_empty_registry_counts_nothing() -> None:
    lobbies, seats = Lab().reg.census()
    assert lobbies == {"listed": 0, "private": 0, "locked": 0}
    assert seats == {Presence.CONNECTED: 0, Presence.RECONNECTING: 0}


def test_listing_and_game_of_a_lobby_by_its_id() -> None:
    lab = Lab()
    first = create(lab, "ann")
    second = create(lab, "bob")
    listing = lab.reg.listing(second)
    assert listing is not None
    assert (listing.lobby_id, listing.name, listing.member_count) == (second, "bob's", 1)
    assert lab.reg.listing(first) is not None and lab.reg.listing(first).name == "ann's"
    assert lab.reg.listing(12345) is None
    assert lab.reg.game_of(first) is None  # no game started
    assert lab.reg.game_of(12345) is None


def test_another_servers_listing_is_filtered_like_a_local_lobby() -> None:
    # the search over listings from the other servers of the ring (their indexed keys only)
    listing = LobbyListing(7, "far", 3, 5, {"mode": "duel", "skill": 10})
    assert _listing_matches(listing, ())
    assert _listing_matches(listing, (NumberRange("skill", 10, 10),))  # both ends inclusive
    assert _listing_matches(listing, (NumberRange("skill", 5, 10), NumberRange("skill", 10, 20)))
    assert not _listing_matches(listing, (NumberRange("skill", 11, 20),))
    assert not _listing_matches(listing, (NumberRange("skill", 0, 9),))
    assert not _listing_matches(listing, (NumberRange("mode", 0, 9),))  # not a number
    assert not _listing_matches(listing, (NumberRange("rank", 0, 9),))  # not there
    assert _listing_matches(listing, (StringEquals("mode", "duel"),))
    assert not _listing_matches(listing, (StringEquals("mode", "team"),))
    assert _listing_matches(listing, (FreeSlots(2),))  # 5 - 3 free: exactly enough
    assert not _listing_matches(listing, (FreeSlots(3),))
    assert not _listing_matches(listing, (StringEquals("mode", "duel"), FreeSlots(3)))


def test_a_match_is_seated_in_a_private_full_lobby_owned_by_its_first_member() -> None:
    lab = Lab()
    old = create(lab, "bob")
    lab.ok("cat", JoinLobby(lab.rid(), old))
    members = {"ann": b"s-ann", "bob": b"s-bob", "cat": b"s-cat"}
    lobby_id, sends = lab.reg.seat_match(
        members, lab.now, name="ranked 3v3", metadata={"mode": "duel"}, ready=True
    )
    lab.deliver(sends)
    assert lobby_id != old
    assert lab.reg.snapshot(old) is None  # its last members left it for the match
    snap = lab.reg.snapshot(lobby_id)
    assert snap is not None
    assert (snap.name, snap.max_members) == ("ranked 3v3", 3)
    assert snap.private and not snap.locked
    assert snap.owner == "ann" and snap.version == 1
    assert dict(snap.metadata) == {"mode": "duel"}
    assert [m.member_id for m in snap.members] == ["ann", "bob", "cat"]
    assert all(m.ready for m in snap.members)
    assert snap.bans == ()
    for member in members:
        assert lab.reg.lobby_of(member) == lobby_id
        assert lab.replicas[member].lobby_id == lobby_id  # each was sent the lobby
    assert lab.reg.counters["lobbies_matched"] == 1


def test_quick_join_fills_the_fullest_lobby_then_the_lowest_id() -> None:
    lab = Lab()
    first, second, third = create(lab, "ann"), create(lab, "bob"), create(lab, "cy")
    reply = lab.ok("dee", QuickJoin(lab.rid(), ()))
    assert isinstance(reply, LobbyJoined) and reply.lobby_id == first  # a tie: lowest id
    lab.ok("eve", JoinLobby(lab.rid(), third))
    lab.ok("fay", JoinLobby(lab.rid(), third))
    reply = lab.ok("gus", QuickJoin(lab.rid(), ()))
    assert isinstance(reply, LobbyJoined) and reply.lobby_id == third  # the fullest
    assert second < third


def test_banning_what_is_not_a_member_id_is_a_bad_request() -> None:
    lab = Lab()
    lobby = create(lab, "ann")
    lab.refused("ann", BanMember(lab.rid(), lobby, ""), ErrorCode.BAD_REQUEST)
    too_long = "x" * (lab.reg.config.max_member_id_bytes + 1)
    lab.refused("ann", BanMember(lab.rid(), lobby, too_long), ErrorCode.BAD_REQUEST)
    longest = "x" * lab.reg.config.max_member_id_bytes
    lab.ok("ann", BanMember(lab.rid(), lobby, longest))


def test_every_deleted_lobby_is_counted() -> None:
    lab = Lab()
    lobbies = [create(lab, owner) for owner in ("ann", "bob", "cy")]
    for owner, lobby in zip(("ann", "bob"), lobbies, strict=False):
        lab.ok(owner, LeaveLobby(lab.rid(), lobby))
    assert lab.reg.counters["lobbies_deleted"] == 2
    assert lab.reg.lobby_ids() == [lobbies[2]]
