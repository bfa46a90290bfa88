"""The lobby table and its search at their edges (echo.lobby.state.search): the ids and codes
a lobby gets, the page sizes and the cursor, the filters' inclusive bounds, a retried quick
join that counts its own seat as free, and a deleted lobby's code.

Pure: the registry through `tests.lobby.lab.Lab`, no sockets (in `./dev mutate lobby`'s
selection).
"""

from __future__ import annotations

import itertools

import attrs
import pytest

from echo.lobby.limits import RateLimit
from echo.lobby.protocol import (
    CreateLobby,
    ErrorCode,
    FreeSlots,
    JoinByCode,
    JoinLobby,
    LeaveLobby,
    LobbyJoined,
    NumberRange,
    QuickJoin,
    SearchLobbies,
    SearchResults,
    SetLocked,
    StringEquals,
)
from echo.lobby.state import LobbyRegistry
from tests.lobby.lab import CONFIG, Lab


def create(
    lab: Lab, owner: str, metadata: dict[str, str | int] | None = None, size: int = 4
) -> int:
    reply = lab.ok(owner, CreateLobby(lab.rid(), f"{owner}'s", size, False, metadata or {}))
    assert isinstance(reply, LobbyJoined)
    return reply.lobby_id


def search(lab: Lab, *filters: object, cursor: int | None = None, limit: int = 50) -> SearchResults:
    reply = lab.ok("seeker", SearchLobbies(lab.rid(), tuple(filters), cursor, limit))  # type: ignore[arg-type]
    assert isinstance(reply, SearchResults)
    return reply


def test_a_lobby_id_is_never_0_nor_past_u64_nor_one_in_use() -> None:
    ids = iter([0, 2**64, 5, 5, 2**64 - 1])
    reg = LobbyRegistry(CONFIG, new_lobby_id=lambda: next(ids))
    first = reg.handle("a", CreateLobby(1, "r", 4, False, {}), 0.0).reply
    second = reg.handle("b", CreateLobby(2, "r", 4, False, {}), 0.0).reply
    assert isinstance(first, LobbyJoined) and isinstance(second, LobbyJoined)
    assert (first.lobby_id, second.lobby_id) == (5, 2**64 - 1)


def test_an_id_source_that_keeps_repeating_itself_is_an_error() -> None:
    reg = LobbyRegistry(CONFIG, new_lobby_id=lambda: 9)
    reg.handle("a", CreateLobby(1, "r", 4, False, {}), 0.0)
    with pytest.raises(RuntimeError, match=r"^the lobby id source keeps returning ids in use$"):
        reg.handle("b", CreateLobby(2, "r", 4, False, {}), 0.0)
    tries = itertools.count()
    stuck = LobbyRegistry(CONFIG, new_lobby_id=lambda: 0 if next(tries) < 99 else 7)
    reply = stuck.handle("a", CreateLobby(1, "r", 4, False, {}), 0.0).reply
    assert isinstance(reply, LobbyJoined) and reply.lobby_id == 7  # the 100th try counts


def test_a_join_code_is_never_empty_nor_one_in_use() -> None:
    codes = iter(["", "AAAA", "AAAA", "BBBB"])
    reg = LobbyRegistry(CONFIG, new_join_code=lambda: next(codes))
    for i, member in enumerate(("a", "b")):
        reg.handle(member, CreateLobby(i, "r", 4, True, {}), 0.0)
    found = sorted(s.join_code for s in map(reg.snapshot, reg.lobby_ids()) if s is not None)
    assert found == ["AAAA", "BBBB"]
    stuck = LobbyRegistry(CONFIG, new_join_code=lambda: "")
    with pytest.raises(RuntimeError, match=r"^the join code source keeps returning codes in use$"):
        stuck.handle("a", CreateLobby(1, "r", 4, True, {}), 0.0)


def test_a_deleted_private_lobby_frees_its_code() -> None:
    lab = Lab()
    reply = lab.ok("a", CreateLobby(lab.rid(), "r", 4, True, {}))
    assert isinstance(reply, LobbyJoined)
    snap = lab.reg.snapshot(reply.lobby_id)
    assert snap is not None
    lab.ok("a", LeaveLobby(lab.rid(), reply.lobby_id))
    lab.refused("b", JoinByCode(lab.rid(), snap.join_code), ErrorCode.NO_SUCH_CODE)
    assert lab.reg.counters["lobbies_deleted"] == 1


def test_a_page_holds_1_to_max_page_lobbies() -> None:
    lab = Lab()
    text = "a page holds 1..50 lobbies"
    for bad in (0, 51):
        reply = lab.refused("s", SearchLobbies(lab.rid(), (), None, bad), ErrorCode.BAD_REQUEST)
        assert reply.message == text
    ids = [create(lab, f"o{i}") for i in range(3)]
    assert [x.lobby_id for x in search(lab, limit=1).listings] == ids[:1]
    assert [x.lobby_id for x in search(lab, limit=50).listings] == ids
    assert lab.reg.counters["searches"] == 2


def test_the_cursor_pages_through_every_lobby_once() -> None:
    lab = Lab()
    ids = [create(lab, f"o{i}") for i in range(5)]
    seen: list[int] = []
    page = search(lab, limit=2)
    while True:
        seen += [x.lobby_id for x in page.listings]
        if page.next_cursor is None:
            break
        assert page.next_cursor == seen[-1]
        page = search(lab, cursor=page.next_cursor, limit=2)
    assert seen == ids
    exact = search(lab, limit=5)  # exactly a page: no further page announced
    assert len(exact.listings) == 5 and exact.next_cursor is None


def test_number_ranges_include_both_ends_and_strings_match_exactly() -> None:
    lab = Lab()
    low = create(lab, "a", {"skill": 3, "mode": "ffa"})
    high = create(lab, "b", {"skill": 7, "mode": "ctf"})
    create(lab, "c", {"skill": "7"})  # not a number
    ranged = search(lab, NumberRange("skill", 3, 7))
    assert [x.lobby_id for x in ranged.listings] == [low, high]
    assert [x.lobby_id for x in search(lab, NumberRange("skill", 4, 7)).listings] == [high]
    assert [x.lobby_id for x in search(lab, NumberRange("skill", 3, 6)).listings] == [low]
    assert [x.lobby_id for x in search(lab, StringEquals("mode", "ctf")).listings] == [high]


def test_a_retried_quick_join_counts_its_own_seat_as_free() -> None:
    lab = Lab()
    duo = create(lab, "a", {"mode": "duel"}, size=2)
    first = lab.ok("b", QuickJoin(lab.rid(), (StringEquals("mode", "duel"), FreeSlots(1))))
    assert isinstance(first, LobbyJoined) and first.lobby_id == duo
    # Full now, but b's own seat is free to b: its retry is answered with the same lobby.
    again = lab.ok("b", QuickJoin(lab.rid(), (StringEquals("mode", "duel"), FreeSlots(1))))
    assert isinstance(again, LobbyJoined) and again.lobby_id == duo
    assert lab.reg.counters["joins_repeated"] == 1
    # A retry whose filters the lobby no longer meets is a new quick join, refused.
    lab.refused("b", QuickJoin(lab.rid(), (FreeSlots(2),)), ErrorCode.ALREADY_IN_LOBBY)


def test_a_lobby_with_no_connected_member_is_not_listed() -> None:
    lab = Lab()
    lobby_id = create(lab, "a")
    lab.ok("b", JoinLobby(lab.rid(), lobby_id))
    lab.disconnect("a")
    assert [x.lobby_id for x in search(lab).listings] == [lobby_id]
    lab.disconnect("b")
    assert search(lab).listings == ()
    lab.reconnect("a")
    listing = search(lab).listings[0]
    assert (listing.lobby_id, listing.member_count, listing.max_members) == (lobby_id, 2, 4)


def test_lobby_id_1_is_a_lobby_id_and_a_search_without_a_cursor_lists_it() -> None:
    ids = iter([1, 2])
    lab = Lab()
    lab.reg = LobbyRegistry(CONFIG, new_lobby_id=lambda: next(ids))
    assert create(lab, "a") == 1
    assert create(lab, "b") == 2
    assert [x.lobby_id for x in search(lab).listings] == [1, 2]
    assert [x.lobby_id for x in search(lab, cursor=1).listings] == [2]


def test_the_101st_try_of_an_id_or_code_source_is_not_made() -> None:
    tries = itertools.count()
    ids = LobbyRegistry(CONFIG, new_lobby_id=lambda: 0 if next(tries) < 100 else 7)
    with pytest.raises(RuntimeError, match="the lobby id source keeps returning ids in use"):
        ids.handle("a", CreateLobby(1, "r", 4, False, {}), 0.0)
    tries = itertools.count()
    codes = LobbyRegistry(CONFIG, new_join_code=lambda: "" if next(tries) < 100 else "AAAA")
    with pytest.raises(RuntimeError, match="the join code source keeps returning codes in use"):
        codes.handle("a", CreateLobby(1, "r", 4, True, {}), 0.0)


def test_a_retried_quick_join_checks_number_ranges_with_both_ends_included() -> None:
    lab = Lab()
    duo = create(lab, "a", {"mode": "duel", "skill": 5}, size=2)
    first = lab.ok("b", QuickJoin(lab.rid(), (StringEquals("mode", "duel"),)))
    assert isinstance(first, LobbyJoined) and first.lobby_id == duo
    # b's retries are checked against the lobby itself (its own seat counted as free).
    for low, high in ((5, 5), (4, 5), (5, 6)):
        again = lab.ok("b", QuickJoin(lab.rid(), (NumberRange("skill", low, high),)))
        assert isinstance(again, LobbyJoined) and again.lobby_id == duo
    for low, high in ((6, 9), (1, 4)):
        lab.refused(
            "b",
            QuickJoin(lab.rid(), (NumberRange("skill", low, high),)),
            ErrorCode.ALREADY_IN_LOBBY,
        )
    # A string value is in no number range.
    lab.refused(
        "b",
        QuickJoin(lab.rid(), (NumberRange("mode", -(2**63), 2**63 - 1),)),
        ErrorCode.ALREADY_IN_LOBBY,
    )


def test_a_quick_join_and_a_search_spend_one_budget() -> None:
    lab = Lab(attrs.evolve(CONFIG, search_limit=RateLimit(rate=0.001, burst=2)))
    lab.refused("b", QuickJoin(lab.rid(), (StringEquals("mode", "none"),)), ErrorCode.NO_MATCH)
    lab.ok("b", SearchLobbies(lab.rid(), (), None, 10))  # the budget's second token
    lab.refused("b", SearchLobbies(lab.rid(), (), None, 10), ErrorCode.RATE_LIMITED)
    lab.ok("c", SearchLobbies(lab.rid(), (), None, 10))  # a budget per member


def test_a_private_lobby_locked_and_unlocked_keeps_its_join_code() -> None:
    lab = Lab()
    reply = lab.ok("a", CreateLobby(lab.rid(), "r", 4, True, {}))
    assert isinstance(reply, LobbyJoined)
    snap = lab.reg.snapshot(reply.lobby_id)
    assert snap is not None and snap.join_code
    lab.ok("a", SetLocked(lab.rid(), reply.lobby_id, True))
    lab.ok("a", SetLocked(lab.rid(), reply.lobby_id, False))
    joined = lab.ok("b", JoinByCode(lab.rid(), snap.join_code))
    assert isinstance(joined, LobbyJoined) and joined.lobby_id == reply.lobby_id
