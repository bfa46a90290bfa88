"""Listings across lobby servers: the topic record, the board, and one search over both."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echo.lobby.listings import (
    ListingBoard,
    ListingGone,
    encode_listing_record,
    parse_listing_record_untrusted,
)
from echo.lobby.protocol import (
    CreateLobby,
    FreeSlots,
    JoinLobby,
    LeaveLobby,
    LobbyJoined,
    LobbyListing,
    LobbyProtocolError,
    NumberRange,
    SearchLobbies,
    SearchResults,
    SetLocked,
    SetMetadata,
    StringEquals,
)
from tests.lobby.lab import CONFIG, Lab

REMOTE = LobbyListing(7, "far room", 2, 4, {"mode": "ffa", "skill": 3}, "lobby-b")


@pytest.mark.parametrize(
    ("record", "golden"),
    [
        # Pinned before the lobby codec became table-driven: its refactoring kept every byte.
        (
            LobbyListing(77, "room", 3, 8, {"mode": "ffa", "skill": -1}, "lobby-b"),
            "0100000000000000004d04726f6f6d0003000802046d6f646500000366666105736b696c6c01ffffffff"
            "ffffffff076c6f6262792d62",
        ),
        (ListingGone(2**64 - 1, "h"), "0101ffffffffffffffff0168"),
    ],
)
def test_records_keep_their_bytes(record: LobbyListing | ListingGone, golden: str) -> None:
    assert encode_listing_record(record).hex() == golden
    assert parse_listing_record_untrusted(bytes.fromhex(golden)) == record


def test_records_round_trip_and_refuse_hostile_bytes() -> None:
    for record in (REMOTE, ListingGone(7, "lobby-b")):
        data = encode_listing_record(record)
        assert data[0] == 1 and parse_listing_record_untrusted(data) == record
        for cut in range(len(data)):
            with pytest.raises(LobbyProtocolError):
                parse_listing_record_untrusted(data[:cut])
        with pytest.raises(LobbyProtocolError):
            parse_listing_record_untrusted(data + b"\x00")
    with pytest.raises(LobbyProtocolError):
        parse_listing_record_untrusted(encode_listing_record(ListingGone(7, "")))  # no home
    with pytest.raises(LobbyProtocolError):
        parse_listing_record_untrusted(b"\x02" + encode_listing_record(REMOTE)[1:])


@settings(max_examples=300)
@given(st.binary(max_size=300))
def test_random_record_bytes_raise_only_the_protocol_error(data: bytes) -> None:
    try:
        parse_listing_record_untrusted(data)
    except LobbyProtocolError:
        pass


def test_the_board_holds_soft_state() -> None:
    board = ListingBoard("lobby-a", ttl=10.0)
    board.apply(REMOTE, 0.0)
    board.apply(LobbyListing(3, "mine", 1, 4, {}, "lobby-a"), 0.0)  # our own: ignored
    board.apply(LobbyListing(9, "other", 1, 4, {}, "lobby-c"), 5.0)
    assert [x.lobby_id for x in board.walk(-1, 6.0)] == [7, 9]
    assert [x.lobby_id for x in board.walk(7, 6.0)] == [9]
    assert [x.lobby_id for x in board.walk(-1, 10.0)] == [9]  # 7 not refreshed: gone
    board.apply(REMOTE, 10.0)  # refreshed again
    board.apply(ListingGone(7, "lobby-c"), 10.0)  # only its home withdraws it
    assert [x.lobby_id for x in board.walk(-1, 11.0)] == [7, 9]
    board.apply(ListingGone(7, "lobby-b"), 11.0)
    assert [x.lobby_id for x in board.walk(-1, 11.0)] == [9]
    board.expire(15.0)
    assert len(board) == 0


def create(lab: Lab, owner: str, **meta: object) -> int:
    reply = lab.ok(owner, CreateLobby(lab.rid(), owner, 4, False, meta))  # type: ignore[arg-type]
    assert isinstance(reply, LobbyJoined)
    return reply.lobby_id


def test_one_search_pages_through_this_server_and_the_others() -> None:
    board = ListingBoard("lobby-a", ttl=10.0)
    lab = Lab(CONFIG, first_id=10, board=board, server_id="lobby-a")
    here = [create(lab, f"o{i}", mode="ffa", skill=i) for i in range(3)]  # 10, 11, 12
    for lobby_id, skill in ((5, 1), (11, 2), (20, 3)):  # 11: stale, it lives here now
        board.apply(LobbyListing(lobby_id, "far", 4, 4, {"mode": "ffa", "skill": skill}, "b"), 0.0)
    seen: list[tuple[int, str]] = []
    cursor = None
    while True:
        reply = lab.ok("s", SearchLobbies(lab.rid(), (StringEquals("mode", "ffa"),), cursor, 2))
        assert isinstance(reply, SearchResults)
        seen += [(x.lobby_id, x.home) for x in reply.listings]
        cursor = reply.next_cursor
        if cursor is None:
            break
    assert seen == [
        (5, "b"),
        (here[0], "lobby-a"),
        (here[1], "lobby-a"),
        (here[2], "lobby-a"),
        (20, "b"),
    ]
    found = lab.ok(
        "s", SearchLobbies(lab.rid(), (FreeSlots(1), NumberRange("skill", 1, 3)), None, 50)
    )
    assert isinstance(found, SearchResults)
    assert [x.lobby_id for x in found.listings] == [11, 12]  # the full remote ones are out
    lab.advance(10.0)
    found = lab.ok("s", SearchLobbies(lab.rid(), (), None, 50))
    assert isinstance(found, SearchResults) and [x.lobby_id for x in found.listings] == here


def test_listing_changes_tell_the_topic_what_changed() -> None:
    lab = Lab(CONFIG, first_id=10, server_id="lobby-a")
    a = create(lab, "a", mode="ffa")
    b = create(lab, "b", mode="ctf")
    changed, gone = lab.reg.listing_changes()
    assert [x.lobby_id for x in changed] == [a, b] and gone == []
    assert all(x.home == "lobby-a" for x in changed)
    assert lab.reg.listing_changes() == ([], [])  # nothing new
    lab.ok("c", JoinLobby(lab.rid(), a))
    lab.ok("b", SetMetadata(lab.rid(), b, {"mode": "ffa"}))
    changed, gone = lab.reg.listing_changes()
    assert [(x.lobby_id, x.member_count, x.metadata["mode"]) for x in changed] == [
        (a, 2, "ffa"),
        (b, 1, "ffa"),
    ]
    lab.ok("a", SetLocked(lab.rid(), a, True))
    lab.ok("b", LeaveLobby(lab.rid(), b))
    assert lab.reg.listing_changes() == ([], [ListingGone(a, "lobby-a"), ListingGone(b, "lobby-a")])
    lab.ok("a", SetLocked(lab.rid(), a, False))
    changed, _ = lab.reg.listing_changes()
    assert [x.lobby_id for x in changed] == [a]
    assert [x.lobby_id for x in lab.reg.listings()] == [a]
    # What the registry publishes, another server's board takes as is.
    other = ListingBoard("lobby-b")
    for x in lab.reg.listings():
        other.apply(parse_listing_record_untrusted(encode_listing_record(x)), 0.0)
    assert [x.lobby_id for x in other.walk(-1, 1.0)] == [a]
