"""The lobby search's index: listed lobbies by id, by indexed value, by number and by free seats.

A search asks for "the listed lobbies with ids above the cursor that pass every filter, in
ascending id, at most `limit` of them" (echo.lobby.state, docs/lobby.md "How search works").
`SearchIndex` answers it without looking at every lobby: it holds one `LobbyListing` per listed
lobby and keeps, next to them, sorted postings that a listing change updates in place:

- every id, ascending (the walk of a search with no narrower filter);
- per (key, string value): the ids whose listing has that value (`StringEquals`);
- per key: (integer value, id) pairs, ascending (`NumberRange`: one bisection counts and finds
  the lobbies in a range);
- per free-seat count (max_members - member_count): the ids with that many free seats
  (`FreeSlots`: the union of the buckets at or above the minimum, merged in id order).

A search picks its driver, the narrowest of these for its filters: an ordered posting is walked
from the cursor and stops as soon as the page is full; a range holding under a quarter of that
posting's ids is gathered and sorted instead; a filter nothing can pass answers at once. Each
candidate is then checked against every filter (`listing_matches`, the same rule a scan
applies), so the choice of driver changes the cost and never the answer. The registry keeps
one index for its own listed lobbies, and `echo.lobby.listings.ListingBoard` one for the other
servers' listings, each updated by the listing change itself (a put or a remove), never
rebuilt.

Pure module: no trio, no clock.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from typing import Final

from sortedcontainers import SortedList

from echo.lobby.protocol import Filter, FreeSlots, LobbyListing, NumberRange, StringEquals

#: Above every lobby id (u64 on the wire): the high end of a (value, id) bisection.
_ID_CEILING: Final = 2**64
#: A range is gathered and sorted rather than an ordered posting walked when it holds fewer
#: than 1/_GATHER of that posting's ids: gathering costs every id in the range, a walk stops
#: when the page is full, so a walk wins unless the range is much the narrower.
_GATHER: Final = 4


def listing_matches(listing: LobbyListing, filters: Iterable[Filter]) -> bool:
    """Does `listing` pass every filter? Filters name only indexed keys, which is what a listing
    carries. The one rule both the index and a scan apply."""
    for f in filters:
        if isinstance(f, StringEquals):
            if listing.metadata.get(f.key) != f.value:
                return False
        elif isinstance(f, NumberRange):
            v = listing.metadata.get(f.key)
            if not isinstance(v, int) or not f.low <= v <= f.high:
                return False
        elif isinstance(f, FreeSlots):
            if listing.max_members - listing.member_count < f.minimum:
                return False
    return True


def _after(ids: SortedList, after: int) -> Iterator[int]:
    """The ids of a sorted posting above `after`, ascending."""
    it: Iterator[int] = ids.irange(minimum=after, inclusive=(False, True))
    return it


class SearchIndex:
    """Listings by lobby id, with the postings a search narrows by (module docstring)."""

    def __init__(self) -> None:
        self._entries: dict[int, LobbyListing] = {}
        self._ids = SortedList()
        self._equal: dict[tuple[str, str], SortedList] = {}
        self._numbers: dict[str, SortedList] = {}  # key -> (value, id), ascending
        self._free: dict[int, SortedList] = {}  # free seats -> ids
        self._free_counts = SortedList()  # the keys of _free, ascending

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, lobby_id: object) -> bool:
        return lobby_id in self._entries

    def get(self, lobby_id: int) -> LobbyListing | None:
        return self._entries.get(lobby_id)

    def ids(self) -> Iterator[int]:
        """Every indexed id, ascending."""
        it: Iterator[int] = iter(self._ids)
        return it

    def listings(self) -> Iterator[LobbyListing]:
        """Every listing, in ascending id."""
        entries = self._entries
        return (entries[i] for i in self._ids)

    # --- changes -------------------------------------------------------------------------------

    def put(self, listing: LobbyListing) -> bool:
        """Index `listing`, replacing the one held for its id; False if that one was equal (the
        index is unchanged)."""
        lobby_id = listing.lobby_id
        old = self._entries.get(lobby_id)
        if old is not None:
            if old == listing:
                return False
            self._unpost(old)
        else:
            self._ids.add(lobby_id)
        self._entries[lobby_id] = listing
        self._post(listing)
        return True

    def remove(self, lobby_id: int) -> LobbyListing | None:
        """Drop `lobby_id`'s listing (None if none was held)."""
        old = self._entries.pop(lobby_id, None)
        if old is not None:
            self._ids.remove(lobby_id)
            self._unpost(old)
        return old

    def _post(self, listing: LobbyListing) -> None:
        lobby_id = listing.lobby_id
        for key, v in listing.metadata.items():
            if isinstance(v, str):
                posting = self._equal.get((key, v))
                if posting is None:
                    posting = self._equal[key, v] = SortedList()
                posting.add(lobby_id)
            elif isinstance(v, int):
                numbers = self._numbers.get(key)
                if numbers is None:
                    numbers = self._numbers[key] = SortedList()
                numbers.add((v, lobby_id))
        free = listing.max_members - listing.member_count
        bucket = self._free.get(free)
        if bucket is None:
            bucket = self._free[free] = SortedList()
            self._free_counts.add(free)
        bucket.add(lobby_id)

    def _unpost(self, listing: LobbyListing) -> None:
        lobby_id = listing.lobby_id
        for key, v in listing.metadata.items():
            if isinstance(v, str):
                posting = self._equal[key, v]
                posting.remove(lobby_id)
                if not posting:
                    del self._equal[key, v]
            elif isinstance(v, int):
                numbers = self._numbers[key]
                numbers.remove((v, lobby_id))
                if not numbers:
                    del self._numbers[key]
        free = listing.max_members - listing.member_count
        bucket = self._free[free]
        bucket.remove(lobby_id)
        if not bucket:
            del self._free[free]
            self._free_counts.remove(free)

    # --- search --------------------------------------------------------------------------------

    def matching(self, filters: tuple[Filter, ...], after: int = -1) -> Iterator[LobbyListing]:
        """The listings with ids above `after` that pass every filter, in ascending id: the same
        answer as checking every listing, lazily (a page takes what it needs)."""
        entries = self._entries
        for lobby_id in self._driver(filters, after):
            listing = entries[lobby_id]
            if listing_matches(listing, filters):
                yield listing

    def _driver(self, filters: tuple[Filter, ...], after: int) -> Iterator[int]:
        """Ids above `after`, ascending, that include every match: the narrowest source."""
        walk: Iterator[int] | None = None
        size = len(self._ids)
        narrowest_range: tuple[int, int, SortedList] | None = None
        range_size = size + 1
        for f in filters:
            if isinstance(f, StringEquals):
                posting = self._equal.get((f.key, f.value))
                if posting is None:
                    return iter(())
                if len(posting) < size:
                    walk, size = _after(posting, after), len(posting)
            elif isinstance(f, FreeSlots):
                at = self._free_counts.bisect_left(f.minimum)
                buckets = [self._free[c] for c in self._free_counts[at:]]
                total = sum(len(b) for b in buckets)
                if total == 0:
                    return iter(())
                if total < size:
                    walk, size = _merged(buckets, after), total
            elif isinstance(f, NumberRange):
                numbers = self._numbers.get(f.key)
                if numbers is None or f.low > f.high:
                    return iter(())
                lo = numbers.bisect_left((f.low,))
                hi = numbers.bisect_right((f.high, _ID_CEILING))
                if hi <= lo:
                    return iter(())
                if hi - lo < range_size:
                    narrowest_range, range_size = (lo, hi, numbers), hi - lo
        if narrowest_range is not None and range_size * _GATHER < size:
            lo, hi, numbers = narrowest_range
            return iter(sorted(i for _, i in numbers.islice(lo, hi) if i > after))
        return walk if walk is not None else _after(self._ids, after)


def _merged(buckets: list[SortedList], after: int) -> Iterator[int]:
    if len(buckets) == 1:
        return _after(buckets[0], after)
    return heapq.merge(*(_after(b, after) for b in buckets))
