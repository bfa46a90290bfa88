"""The lobby registry's table of lobbies and its search: the listed ids, the index of
equality filters, the listings for the topic, and the search request that pages through
this server's lobbies and the other servers' listings.

Pure module: no trio, no clock.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterable, Iterator

from echo.lobby.protocol import (
    ErrorCode,
    Filter,
    FreeSlots,
    LobbyListing,
    NumberRange,
    Presence,
    Reply,
    SearchLobbies,
    SearchResults,
    StringEquals,
)
from echo.lobby.state.checks import _Checks
from echo.lobby.state.records import (
    _Lobby,
    _refuse,
)


class _Search(_Checks):
    """The lobby table, the search index and listings, and the search request."""

    def _add_lobby(self, lobby: _Lobby) -> None:
        self._lobbies[lobby.lobby_id] = lobby
        if lobby.join_code:
            self._by_code[lobby.join_code] = lobby.lobby_id
        self._index_lobby(lobby)

    def _delete_lobby(self, lobby: _Lobby) -> None:
        self._game_deadlines.pop(lobby.lobby_id, None)
        self._unindex(lobby)
        del self._lobbies[lobby.lobby_id]
        if lobby.join_code:
            self._by_code.pop(lobby.join_code, None)
        self.counters["lobbies_deleted"] += 1

    def _index_lobby(self, lobby: _Lobby) -> None:
        if lobby.join_code and self._by_code.get(lobby.join_code) is None:
            self._by_code[lobby.join_code] = lobby.lobby_id
        self._list_if_live(lobby)
        for key in self.config.indexed_keys:
            v = lobby.metadata.get(key)
            if isinstance(v, str):
                self._index.setdefault((key, v), set()).add(lobby.lobby_id)

    @staticmethod
    def _listable(lobby: _Lobby) -> bool:
        """Should search and quick-join see `lobby`: public, unlocked, and not a ghost (some
        member is connected)?"""
        return (
            not lobby.private
            and not lobby.locked
            and any(m.presence is Presence.CONNECTED for m in lobby.members.values())
        )

    def _list_if_live(self, lobby: _Lobby) -> None:
        """Keep `lobby` in the listed ids exactly while it is `_listable`."""
        listed = self._listed
        at = bisect.bisect_left(listed, lobby.lobby_id)
        present = at < len(listed) and listed[at] == lobby.lobby_id
        if self._listable(lobby):
            if not present:
                listed.insert(at, lobby.lobby_id)
        elif present:
            del listed[at]

    def _unindex(self, lobby: _Lobby) -> None:
        if lobby.join_code and self._by_code.get(lobby.join_code) == lobby.lobby_id:
            del self._by_code[lobby.join_code]
        at = bisect.bisect_left(self._listed, lobby.lobby_id)
        if at < len(self._listed) and self._listed[at] == lobby.lobby_id:
            del self._listed[at]
        for key in self.config.indexed_keys:
            v = lobby.metadata.get(key)
            if isinstance(v, str):
                ids = self._index.get((key, v))
                if ids is not None:
                    ids.discard(lobby.lobby_id)
                    if not ids:
                        del self._index[(key, v)]

    def _candidates(self, filters: Iterable[Filter], after: int = -1) -> Iterator[_Lobby]:
        """Listed lobbies (public, unlocked, not ghosts) with ids above `after`, ascending, that
        may match: narrowed by the index when there is an equality filter."""
        smallest: set[int] | None = None
        for f in filters:
            if isinstance(f, StringEquals):
                ids = self._index.get((f.key, f.value), set())
                if smallest is None or len(ids) < len(smallest):
                    smallest = ids
        # A common value (an eighth of the listed lobbies or more) is found sooner by walking
        # the listed ids than by sorting its whole set.
        if smallest is None or len(smallest) * 8 >= len(self._listed):
            listed = self._listed
            for i in range(bisect.bisect_right(listed, after), len(listed)):
                yield self._lobbies[listed[i]]
            return
        for lobby_id in sorted(i for i in smallest if i > after):
            lobby = self._lobbies[lobby_id]
            if self._listable(lobby):
                yield lobby

    @staticmethod
    def _matches(lobby: _Lobby, filters: Iterable[Filter], *, own_seat: bool = False) -> bool:
        """`own_seat`: the asking member sits in `lobby`, so its seat counts as free."""
        # Kept apart from _listing_matches (same rules): the local walk must not build a
        # listing per lobby it merely looks at.
        taken = len(lobby.members) - (1 if own_seat else 0)
        for f in filters:
            if isinstance(f, StringEquals):
                if lobby.metadata.get(f.key) != f.value:
                    return False
            elif isinstance(f, NumberRange):
                v = lobby.metadata.get(f.key)
                if not isinstance(v, int) or not f.low <= v <= f.high:
                    return False
            elif isinstance(f, FreeSlots):
                if lobby.max_members - taken < f.minimum:
                    return False
        return True

    def _listing(self, lobby: _Lobby) -> LobbyListing:
        indexed = {k: v for k, v in lobby.metadata.items() if k in self.config.indexed_keys}
        return LobbyListing(
            lobby.lobby_id,
            lobby.name,
            len(lobby.members),
            lobby.max_members,
            indexed,
            self.server_id,
        )

    def _fresh_lobby_id(self) -> int:
        for _ in range(100):
            lobby_id = self._new_lobby_id()
            if 0 < lobby_id < 2**64 and lobby_id not in self._lobbies:
                return lobby_id
        raise RuntimeError("the lobby id source keeps returning ids in use")

    def _fresh_code(self) -> str:
        for _ in range(100):
            code = self._new_join_code()
            if code and code not in self._by_code:
                return code
        raise RuntimeError("the join code source keeps returning codes in use")

    def _search(self, member_id: str, req: SearchLobbies, now: float) -> Reply:
        self._rate(member_id, "search", self.config.search_limit, now)
        self._check_filters(req.filters)
        if not 1 <= req.limit <= self.config.max_page:
            _refuse(ErrorCode.BAD_REQUEST, f"a page holds 1..{self.config.max_page} lobbies")
        self.counters["searches"] += 1
        after = req.cursor if req.cursor is not None else -1
        local = (
            (lobby.lobby_id, lobby)
            for lobby in self._candidates(req.filters, after)
            if self._matches(lobby, req.filters)
        )
        streams: list[Iterator[tuple[int, _Lobby | LobbyListing]]] = [local]
        if self._board is not None:
            streams.append(
                (listing.lobby_id, listing)
                for listing in self._board.walk(after, now)
                if _listing_matches(listing, req.filters)
            )
        page: list[_Lobby | LobbyListing] = []
        more = False
        last = after
        # Both streams ascend by id, so one cursor pages through this server and the others.
        for lobby_id, found in heapq.merge(*streams, key=lambda pair: pair[0]):
            if lobby_id == last:
                continue  # a stale remote listing of a lobby that now lives here
            if len(page) == req.limit:
                more = True
                break
            page.append(found)
            last = lobby_id
        next_cursor = last if more else None
        listings = tuple(x if isinstance(x, LobbyListing) else self._listing(x) for x in page)
        return SearchResults(req.request_id, listings, next_cursor)


def _listing_matches(listing: LobbyListing, filters: Iterable[Filter]) -> bool:
    """`_matches` for another server's listing: filters name only indexed keys, which is what
    a listing carries."""
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
