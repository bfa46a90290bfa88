"""The lobby registry's table of lobbies and its search: the listed lobbies' listings in a
search index (`echo.lobby.search_index`), the listings for the topic, and the search request
that pages through this server's lobbies and the other servers' listings.

Pure module: no trio, no clock.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

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
        """Keep `lobby`'s listing in the index, current, exactly while it is `_listable`: every
        change to what a listing shows (members, metadata, size, name) or to whether it is
        listed comes through here."""
        if self._listable(lobby):
            self._index.put(self._listing(lobby))
        else:
            self._index.remove(lobby.lobby_id)

    def _unindex(self, lobby: _Lobby) -> None:
        if lobby.join_code and self._by_code.get(lobby.join_code) == lobby.lobby_id:
            del self._by_code[lobby.join_code]
        self._index.remove(lobby.lobby_id)

    @staticmethod
    def _matches(lobby: _Lobby, filters: Iterable[Filter], *, own_seat: bool = False) -> bool:
        """`own_seat`: the asking member sits in `lobby`, so its seat counts as free."""
        # The rules of search_index.listing_matches, on the lobby itself (with its own seat).
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
        streams = [self._index.matching(req.filters, after)]
        if self._board is not None:
            streams.append(self._board.matching(req.filters, after, now))
        page: list[LobbyListing] = []
        more = False
        last = after
        # Both streams ascend by id, so one cursor pages through this server and the others.
        merged = heapq.merge(*streams, key=_lobby_id) if len(streams) > 1 else streams[0]
        for found in merged:
            lobby_id = found.lobby_id
            if lobby_id == last:
                continue  # a stale remote listing of a lobby that now lives here
            if len(page) == req.limit:
                more = True
                break
            page.append(found)
            last = lobby_id
        next_cursor = last if more else None
        return SearchResults(req.request_id, tuple(page), next_cursor)


def _lobby_id(listing: LobbyListing) -> int:
    return listing.lobby_id
