"""The search index answers what a scan answers (hypothesis, the scan kept as the reference).

Three levels, each fed random listing changes and asked random searches after every step:
the bare `SearchIndex` against a sorted scan of the listings it was given; the `ListingBoard`
(other servers' listings: refreshes, withdrawals, expiry) against a model of the records it
was sent; and a registry with a board, whose paged search and quick-join are checked against a
scan of its lobbies' snapshots merged with the board's model, as search was computed before
the index.
"""

from __future__ import annotations

from itertools import islice
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echo.lobby.limits import RateLimit
from echo.lobby.listings import ListingBoard, ListingGone
from echo.lobby.protocol import (
    CreateLobby,
    ErrorCode,
    Filter,
    FreeSlots,
    LeaveLobby,
    LobbyJoined,
    LobbyListing,
    NumberRange,
    Presence,
    QuickJoin,
    Refusal,
    SearchLobbies,
    SearchResults,
    StringEquals,
)
from echo.lobby.search_index import SearchIndex
from tests.lobby.lab import Lab
from tests.lobby.test_properties import MEMBERS, PROPERTY_CONFIG, check_invariants
from tests.lobby.test_properties import filters as registry_filters
from tests.lobby.test_properties import op as registry_op
from tests.lobby.test_properties import run as run_registry_op

# --- the reference: a scan ----------------------------------------------------------------------


def passes(listing: LobbyListing, filters: tuple[Filter, ...]) -> bool:
    """The filter rules, written out again here so that the index's own rule is checked too."""
    for f in filters:
        if isinstance(f, StringEquals):
            v = listing.metadata.get(f.key)
            if not (isinstance(v, str) and v == f.value):
                return False
        elif isinstance(f, NumberRange):
            v = listing.metadata.get(f.key)
            if not (isinstance(v, int) and f.low <= v <= f.high):
                return False
        elif listing.max_members - listing.member_count < f.minimum:
            return False
    return True


def scan(listings: dict[int, LobbyListing], filters: tuple[Filter, ...], after: int) -> list[int]:
    return [i for i in sorted(listings) if i > after and passes(listings[i], filters)]


# --- random listings, changes and searches --------------------------------------------------------

ids = st.integers(1, 40)
values = st.one_of(st.sampled_from(["ffa", "ctf", "duel"]), st.integers(-3, 6))
metadata = st.dictionaries(st.sampled_from(["mode", "skill", "region"]), values, max_size=3)
listing = st.builds(
    LobbyListing,
    ids,
    st.sampled_from(["a", "b"]),
    st.integers(0, 6),  # member count; a hostile remote may claim more than its max
    st.integers(1, 5),
    metadata,
    st.sampled_from(["lobby-b", "lobby-c"]),
)
one_filter = st.one_of(
    st.builds(
        StringEquals,
        st.sampled_from(["mode", "skill", "nokey"]),
        st.sampled_from(["ffa", "ctf", "duel", "1"]),
    ),
    st.builds(
        NumberRange,
        st.sampled_from(["skill", "mode", "region"]),
        st.integers(-4, 7),
        st.integers(-4, 7),
    ),
    st.builds(FreeSlots, st.integers(-2, 6)),
)
filters = st.lists(one_filter, max_size=4).map(tuple)
search = st.tuples(filters, st.integers(-1, 41))


def page_through(matching: Any, limit: int) -> list[int]:
    """Pages of `limit` as the registry cuts them: each resumes after the last id seen."""
    seen: list[int] = []
    after = -1
    while True:
        page = [x.lobby_id for x in islice(matching(after), limit)]
        seen += page
        if len(page) < limit:
            return seen
        after = page[-1]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(st.tuples(st.just("put"), listing), st.tuples(st.just("remove"), ids)),
        max_size=60,
    ),
    st.lists(search, min_size=1, max_size=4),
    st.integers(1, 4),
)
def test_the_index_answers_what_a_scan_of_its_listings_answers(
    changes: list[tuple[str, Any]], searches: list[tuple[tuple[Filter, ...], int]], limit: int
) -> None:
    index = SearchIndex()
    model: dict[int, LobbyListing] = {}
    for kind, arg in changes:
        if kind == "put":
            changed = index.put(arg)
            assert changed == (model.get(arg.lobby_id) != arg)
            model[arg.lobby_id] = arg
        else:
            assert index.remove(arg) == model.pop(arg, None)
        assert list(index.ids()) == sorted(model)
        assert list(index.listings()) == [model[i] for i in sorted(model)]
        assert len(index) == len(model)
        for fs, after in searches:
            assert [x.lobby_id for x in index.matching(fs, after)] == scan(model, fs, after)
            assert page_through(lambda a, fs=fs: index.matching(fs, a), limit) == scan(
                model, fs, -1
            )


def test_a_search_walks_the_narrowest_posting_and_stops_with_the_page() -> None:
    """The point of the index: a page of a rare value does not look at the common ones, and a
    page of a common value stops once it is full."""
    index = SearchIndex()
    for i in range(1, 1001):
        mode = "rare" if i % 100 == 0 else "common"
        index.put(LobbyListing(i, "x", 8 if i % 2 else 7, 8, {"mode": mode, "skill": i}, "h"))
    looked: list[int] = []
    entries = index._entries

    class Counting(dict[int, LobbyListing]):
        def __getitem__(self, key: int) -> LobbyListing:
            looked.append(key)
            return entries[key]

    index._entries = Counting(entries)
    rare = list(index.matching((StringEquals("mode", "rare"),)))
    assert [x.lobby_id for x in rare] == list(range(100, 1001, 100))
    assert looked == list(range(100, 1001, 100))  # only the rare posting was read
    looked.clear()
    first = list(islice(index.matching((StringEquals("mode", "common"),)), 20))
    assert len(first) == 20 and len(looked) == 20  # a walk that stopped with the page
    looked.clear()
    free = list(index.matching((FreeSlots(1), StringEquals("mode", "common"))))
    assert all(x.lobby_id % 2 == 0 for x in free) and len(looked) == 500  # the free bucket only
    looked.clear()
    ranged = list(index.matching((NumberRange("skill", 10, 14), StringEquals("mode", "common"))))
    assert [x.lobby_id for x in ranged] == [10, 11, 12, 13, 14]
    assert looked == [10, 11, 12, 13, 14]  # the range was narrower than the posting: gathered
    looked.clear()
    assert list(index.matching((StringEquals("mode", "none"),))) == [] and looked == []


# --- the board: other servers' listings --------------------------------------------------------

record = st.one_of(
    st.tuples(st.just("listing"), listing),
    st.tuples(
        st.just("gone"), st.builds(ListingGone, ids, st.sampled_from(["lobby-b", "lobby-c"]))
    ),
    st.tuples(
        st.just("own"),
        listing.map(
            lambda x: LobbyListing(
                x.lobby_id, x.name, x.member_count, x.max_members, x.metadata, "lobby-a"
            )
        ),
    ),
    st.tuples(st.just("wait"), st.floats(0.0, 6.0)),
    st.tuples(st.just("expire"), st.none()),
)


class BoardModel:
    """What the board should hold: the records it was sent, under its rules, without an index."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self.held: dict[int, tuple[LobbyListing, float]] = {}

    def apply(self, rec: LobbyListing | ListingGone, now: float) -> None:
        if rec.home == "lobby-a":
            return
        if isinstance(rec, ListingGone):
            if rec.lobby_id in self.held and self.held[rec.lobby_id][0].home == rec.home:
                del self.held[rec.lobby_id]
        else:
            self.held[rec.lobby_id] = (rec, now + self.ttl)

    def expire(self, now: float) -> None:
        self.held = {i: h for i, h in self.held.items() if h[1] > now}

    def live(self, now: float) -> dict[int, LobbyListing]:
        return {i: x for i, (x, expires_at) in self.held.items() if expires_at > now}


@settings(max_examples=300, deadline=None)
@given(st.lists(record, max_size=60), st.lists(search, min_size=1, max_size=3))
def test_the_board_answers_what_a_scan_of_its_records_answers(
    records: list[tuple[str, Any]], searches: list[tuple[tuple[Filter, ...], int]]
) -> None:
    board = ListingBoard("lobby-a", ttl=10.0)
    model = BoardModel(10.0)
    now = 0.0
    for kind, arg in records:
        if kind == "wait":
            now += arg
        elif kind == "expire":
            board.expire(now)
            model.expire(now)
            assert len(board) == len(model.held)
        else:
            board.apply(arg, now)
            model.apply(arg, now)
        live = model.live(now)
        assert [x.lobby_id for x in board.walk(-1, now)] == sorted(live)
        for fs, after in searches:
            got = [x.lobby_id for x in board.matching(fs, after, now)]
            assert got == scan(live, fs, after)
            assert [board._held[i].listing for i in got] == [live[i] for i in got]


def test_expiry_drops_only_what_was_not_refreshed() -> None:
    board = ListingBoard("lobby-a", ttl=10.0)
    far = LobbyListing(7, "far", 1, 4, {"mode": "ffa"}, "lobby-b")
    board.apply(far, 0.0)
    board.apply(LobbyListing(8, "near", 1, 4, {"mode": "ffa"}, "lobby-b"), 0.0)
    board.apply(far, 8.0)  # refreshed: lives to 18
    board.expire(10.0)
    assert [x.lobby_id for x in board.matching((StringEquals("mode", "ffa"),), -1, 10.0)] == [7]
    board.apply(ListingGone(7, "lobby-b"), 11.0)
    board.apply(far, 12.0)  # listed again after a withdrawal: lives to 22
    board.expire(18.0)
    assert len(board) == 1
    board.expire(22.0)
    assert len(board) == 0 and list(board.walk(-1, 22.0)) == []


# --- the registry: its own lobbies and the board, one search ----------------------------------

# Searches without end at one instant: the search rate limit is not what is tested here.
CONFIG = attrs.evolve(PROPERTY_CONFIG, search_limit=RateLimit(1e9, 1e9))


def valid(fs: tuple[Filter, ...]) -> bool:
    """Would the registry take these filters (indexed keys, ranges low to high)?"""
    return all(
        isinstance(f, FreeSlots)
        or (f.key in CONFIG.indexed_keys and (not isinstance(f, NumberRange) or f.low <= f.high))
        for f in fs
    )


def listed_here(lab: Lab) -> dict[int, LobbyListing]:
    """The registry's listed lobbies by a scan of every lobby's snapshot."""
    out: dict[int, LobbyListing] = {}
    for lobby_id in lab.reg.lobby_ids():
        s = lab.reg.snapshot(lobby_id)
        assert s is not None
        if s.private or s.locked or all(m.presence is not Presence.CONNECTED for m in s.members):
            continue
        indexed = {k: v for k, v in s.metadata.items() if k in CONFIG.indexed_keys}
        out[lobby_id] = LobbyListing(
            lobby_id, s.name, len(s.members), s.max_members, indexed, "lobby-a"
        )
    return out


def scanned_pages(
    lab: Lab, model: BoardModel, fs: tuple[Filter, ...], limit: int
) -> list[list[LobbyListing]]:
    """Search as it was computed before the index: every lobby here and every live listing of
    the board checked, merged in id order (this server's copy first when both have an id)."""
    here, there = listed_here(lab), model.live(lab.now)
    merged: list[LobbyListing] = []
    for lobby_id in sorted(set(here) | set(there)):
        if lobby_id in here and passes(here[lobby_id], fs):
            merged.append(here[lobby_id])
        elif lobby_id in there and passes(there[lobby_id], fs):
            merged.append(there[lobby_id])
    return [merged[i : i + limit] for i in range(0, len(merged), limit)] or [[]]


def expected_quick_join(lab: Lab, member: str, fs: tuple[Filter, ...]) -> int | None:
    best: tuple[int, int] | None = None
    for lobby_id, x in listed_here(lab).items():
        s = lab.reg.snapshot(lobby_id)
        assert s is not None
        if x.member_count < x.max_members and member not in s.bans and passes(x, fs):
            if best is None or (x.member_count, -lobby_id) > (best[0], -best[1]):
                best = (x.member_count, lobby_id)
    return None if best is None else best[1]


remote = st.one_of(
    st.tuples(
        st.just("remote"),
        listing.map(
            lambda x: LobbyListing(
                x.lobby_id + 90, x.name, x.member_count, x.max_members, x.metadata, x.home
            )
        ),
    ),  # ids 91..130: some are this server's (100 up)
    st.tuples(
        st.just("remote_gone"),
        st.builds(ListingGone, ids.map(lambda i: i + 90), st.sampled_from(["lobby-b", "lobby-c"])),
    ),
    st.tuples(st.just("board_expire")),
)
quick_checked = st.tuples(st.just("quick_checked"), st.sampled_from(MEMBERS), registry_filters)
# Half registry operations, a third remote records, the rest checked quick-joins. (The registry
# op "search" checks against this server's lobbies alone: check_searches below checks every
# search against this server's and the board's.)
step = st.integers(0, 5).flatmap(
    lambda k: (
        registry_op.filter(lambda s: s[0] != "search")
        if k < 3
        else remote
        if k < 5
        else quick_checked
    )
)


def check_searches(lab: Lab, model: BoardModel, fs: tuple[Filter, ...]) -> None:
    for limit in (1, 2, 50):
        pages: list[list[LobbyListing]] = []
        cursor = None
        while True:
            # (straight to the registry: Lab.do's checks of every reply cost more than this)
            reply = lab.reg.handle("searcher", SearchLobbies(0, fs, cursor, limit), lab.now).reply
            assert isinstance(reply, SearchResults)
            pages.append(list(reply.listings))
            cursor = reply.next_cursor
            if cursor is None:
                break
        assert pages == scanned_pages(lab, model, fs, limit)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(step, min_size=10, max_size=50),
    st.lists(st.one_of(registry_filters, filters), min_size=1, max_size=3),
)
def test_the_registry_searches_as_the_scan_did(
    steps: list[tuple[Any, ...]], searches: list[tuple[Filter, ...]]
) -> None:
    board = ListingBoard("lobby-a", ttl=10.0)
    model = BoardModel(10.0)
    lab = Lab(CONFIG, board=board, server_id="lobby-a")
    for owner, size, mode in (("m0", 4, "ffa"), ("m1", 3, "ctf"), ("m2", 2, "ffa")):
        reply = lab.ok(owner, CreateLobby(lab.rid(), owner, size, False, {"mode": mode}))
        assert isinstance(reply, LobbyJoined)
    for s in steps:
        if s[0] == "remote":
            board.apply(s[1], lab.now)
            model.apply(s[1], lab.now)
        elif s[0] == "remote_gone":
            board.apply(s[1], lab.now)
            model.apply(s[1], lab.now)
        elif s[0] == "board_expire":
            board.expire(lab.now)
            model.expire(lab.now)
        elif s[0] == "quick_checked":
            _, member, fs = s
            seated = lab.reg.lobby_of(member)
            if seated is not None:
                lab.do(member, LeaveLobby(lab.rid(), seated))
            if valid(fs):
                want = expected_quick_join(lab, member, fs)
                reply = lab.do(member, QuickJoin(lab.rid(), fs)).reply
                if want is None:
                    assert isinstance(reply, Refusal) and reply.code is ErrorCode.NO_MATCH
                else:
                    assert isinstance(reply, LobbyJoined) and reply.lobby_id == want
        else:
            run_registry_op(lab, s)
        check_invariants(lab)
        for fs in searches:
            if valid(fs):
                check_searches(lab, model, fs)


@pytest.mark.parametrize("limit", [1, 3])
def test_a_stale_remote_copy_of_a_lobby_here_is_not_listed_twice(limit: int) -> None:
    board = ListingBoard("lobby-a", ttl=10.0)
    lab = Lab(CONFIG, first_id=10, board=board, server_id="lobby-a")
    lab.ok("o", CreateLobby(lab.rid(), "here", 4, False, {"mode": "ffa"}))  # id 10
    board.apply(LobbyListing(10, "old home", 1, 4, {"mode": "ffa"}, "lobby-b"), 0.0)
    board.apply(LobbyListing(11, "there", 1, 4, {"mode": "ffa"}, "lobby-b"), 0.0)
    model = BoardModel(10.0)
    model.apply(LobbyListing(10, "old home", 1, 4, {"mode": "ffa"}, "lobby-b"), 0.0)
    model.apply(LobbyListing(11, "there", 1, 4, {"mode": "ffa"}, "lobby-b"), 0.0)
    check_searches(lab, model, (StringEquals("mode", "ffa"),))
    reply = lab.ok("s", SearchLobbies(lab.rid(), (), None, limit))
    assert isinstance(reply, SearchResults)
    assert [(x.lobby_id, x.home) for x in reply.listings] == [(10, "lobby-a"), (11, "lobby-b")][
        :limit
    ]
