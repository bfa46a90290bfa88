"""Listings of other lobby servers' lobbies, so that a search sees every server.

Each lobby server publishes, on a topic, a record per listed lobby (public and unlocked) when it
changes and again before `ttl` runs out (soft state, as in echo.topics), and a "gone" record when a
lobby stops being listed. Every lobby server keeps a `ListingBoard` of the records it receives; its
registry's search walks its own lobbies and the board together, in lobby-id order, so one
cursor pages through both. A server that dies stops refreshing and its listings expire.
Each record applies to the board's `SearchIndex` (echo.lobby.search_index) as it arrives: a
search of the board narrows by the index, and nothing is rebuilt when a record comes.

Topic record: u8 version 1, u8 kind; kind 0 is a listing (u64 id, str8 name, u16 members,
u16 max, map indexed metadata, str8 home), kind 1 "gone" (u64 id, str8 home).

Pure module: no trio, no clock.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import Final, TypeAlias

import attrs

from echo.lobby.protocol import Filter, LobbyListing, LobbyProtocolError
from echo.lobby.protocol.fields import _LISTING, _STR8, _U8, _U64, _reader, _Record, _Union
from echo.lobby.protocol.table import _encode
from echo.lobby.search_index import SearchIndex

RECORD_VERSION: Final = 1
_LISTED: Final = 0
_GONE: Final = 1
MAX_RECORD_BYTES: Final = 16 * 1024


@attrs.frozen
class ListingGone:
    lobby_id: int
    home: str


ListingRecord: TypeAlias = LobbyListing | ListingGone

# The lobby codec's table form (echo.lobby.protocol): kind -> record, the listing being the
# search result's.
_RECORD: Final = _Union(
    "listing record",
    {_LISTED: _LISTING, _GONE: _Record(ListingGone, lobby_id=_U64, home=_STR8)},
)


def encode_listing_record(record: ListingRecord) -> bytes:
    """Raises LobbyProtocolError for a record that does not fit."""
    head = bytes((RECORD_VERSION,))
    return _encode(head, _RECORD, record, MAX_RECORD_BYTES, "a listing record of {} bytes")


def parse_listing_record_untrusted(data: bytes | bytearray | memoryview) -> ListingRecord:
    """Decode a topic record. Raises only LobbyProtocolError."""
    if not 2 <= len(data) <= MAX_RECORD_BYTES:
        raise LobbyProtocolError(f"a listing record of {len(data)} bytes")
    r = _reader(data)
    version = _U8.read(r)
    if version != RECORD_VERSION:
        raise LobbyProtocolError(f"unknown listing record version {version}")
    record: ListingRecord = _RECORD.read(r)
    r.check_end()
    if not record.home:
        raise LobbyProtocolError("a listing record names its home server")
    return record


@attrs.define
class _Held:
    listing: LobbyListing
    expires_at: float


class ListingBoard:
    """Other servers' listed lobbies, as last heard; records from `self_id` are ignored (this
    server's own lobbies are searched in its registry)."""

    def __init__(self, self_id: str, *, ttl: float = 10.0) -> None:
        if ttl <= 0:
            raise ValueError("a listing lives a positive time")
        self.self_id = self_id
        self.ttl = ttl
        self._held: dict[int, _Held] = {}
        self._index = SearchIndex()  # the held listings, by id and by what searches ask
        # (expiry, id) per apply, earliest first: `expire` pops what is due instead of looking
        # at every listing; an entry a later refresh superseded is passed over.
        self._due: list[tuple[float, int]] = []

    def __len__(self) -> int:
        return len(self._held)

    def apply(self, record: ListingRecord, now: float) -> None:
        if record.home == self.self_id:
            return
        held = self._held.get(record.lobby_id)
        if isinstance(record, ListingGone):
            # Only the server that listed it may withdraw it: after a failover, the old home's
            # late "gone" must not remove the new home's listing.
            if held is not None and held.listing.home == record.home:
                self._drop(record.lobby_id)
            return
        expires_at = now + self.ttl
        if held is None:
            self._held[record.lobby_id] = _Held(record, expires_at)
            heapq.heappush(self._due, (expires_at, record.lobby_id))
        else:
            # Its entry (due no later than its old expiry) stands unless this one is earlier.
            if expires_at < held.expires_at:
                heapq.heappush(self._due, (expires_at, record.lobby_id))
            held.listing, held.expires_at = record, expires_at
        self._index.put(record)

    def expire(self, now: float) -> None:
        due = self._due
        while due and due[0][0] <= now:
            _, lobby_id = heapq.heappop(due)
            held = self._held.get(lobby_id)
            if held is None:
                continue  # withdrawn or dropped already
            if held.expires_at <= now:
                self._drop(lobby_id)
            else:
                heapq.heappush(due, (held.expires_at, lobby_id))  # refreshed since

    def walk(self, after: int, now: float) -> Iterator[LobbyListing]:
        """Live listings with ids above `after`, ascending."""
        return self.matching((), after, now)

    def matching(
        self, filters: tuple[Filter, ...], after: int, now: float
    ) -> Iterator[LobbyListing]:
        """Live listings with ids above `after` that pass every filter, ascending, narrowed by
        the index. An expired listing the next `expire` will drop is skipped meanwhile."""
        held = self._held
        for listing in self._index.matching(filters, after):
            if held[listing.lobby_id].expires_at > now:
                yield listing

    def _drop(self, lobby_id: int) -> None:
        del self._held[lobby_id]
        self._index.remove(lobby_id)
