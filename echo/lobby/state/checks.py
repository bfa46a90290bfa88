"""The lobby registry's checks: rate limits, the lookups that refuse (no such lobby, not a
member, not the owner) and the limits on names, metadata, attributes and filters.

Pure module: no trio, no clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import Final

from echo.lobby.games import GameServerDirectory
from echo.lobby.heldchat import HeldChat
from echo.lobby.limits import LobbyConfig, RateLimit, TokenBucket
from echo.lobby.listings import ListingBoard
from echo.lobby.protocol import (
    I64_MAX,
    I64_MIN,
    ErrorCode,
    Filter,
    NumberRange,
    StringEquals,
    Value,
)
from echo.lobby.search_index import SearchIndex
from echo.lobby.state.records import (
    Seats,
    Send,
    Tickets,
    _has_control,
    _Lobby,
    _Member,
    _refuse,
    _utf8_len,
    _value_bytes,
)

#: How often `expire` looks for rate buckets that are full again (and forgets them) while any
#: are kept: a bucket of the default limits refills within 6 s of its last use.
BUCKET_SWEEP_S: Final = 10.0


class _State:
    """The registry's fields, declared for the layers of `LobbyRegistry` (each module of this
    package adds one concern on top of the one below); `LobbyRegistry.__init__` sets them."""

    config: LobbyConfig
    server_id: str
    refusals: Counter[ErrorCode]
    counters: Counter[str]
    _new_match_id: Callable[[], int]
    _game_deadlines: dict[int, float]
    _seats: Seats | None
    _games: GameServerDirectory | None
    _tickets: Tickets | None
    _board: ListingBoard | None
    _published: dict[int, int]
    _new_lobby_id: Callable[[], int]
    _new_join_code: Callable[[], str]
    _lobbies: dict[int, _Lobby]
    _by_code: dict[str, int]
    _where: dict[str, int]
    _index: SearchIndex
    _buckets: dict[tuple[str, str], TokenBucket]
    _bucket_sweep_at: float | None
    _reconnecting: dict[str, float]
    held_chat: HeldChat
    _out: list[Send]
    _secret: bytes


class _Checks(_State):
    """Rate limits, lookups that refuse, and the limits on names, maps and filters."""

    def _rate(
        self, member_id: str, kind: str, limit: RateLimit, now: float, *, repeat: bool = False
    ) -> None:
        """Spend a token of `kind`, or refuse RATE_LIMITED, the text ending with when the next
        token comes ("(retry in 0.250 s)"). A `repeat` (the very create or
        join that seated the member, asked again because its reply was lost) spends from the
        member's repeat budget instead: a member retrying under load must not use up the
        budget of its real requests, and a flood of repeats (each answered with a snapshot)
        is still bounded."""
        if repeat:
            kind, limit = "repeat", self.config.repeat_limit
        key = (member_id, kind)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = TokenBucket(limit, now)
            if self._bucket_sweep_at is None:  # `expire` forgets it once it is full again
                self._bucket_sweep_at = now + BUCKET_SWEEP_S
        if not bucket.take(now):
            # The wait ends the text: a client paces itself by it (LobbyClient.search_all).
            wait = bucket.wait(now)
            _refuse(
                ErrorCode.RATE_LIMITED,
                f"too many {kind} requests; slow down (retry in {wait:.3f} s)",
            )

    def _lobby(self, lobby_id: int) -> _Lobby:
        lobby = self._lobbies.get(lobby_id)
        if lobby is None:
            _refuse(ErrorCode.NO_SUCH_LOBBY, "no such lobby")
        return lobby

    def _lobby_of_member(self, member_id: str) -> _Lobby | None:
        lobby_id = self._where.get(member_id)
        return None if lobby_id is None else self._lobbies[lobby_id]

    def _membership(self, member_id: str, lobby_id: int) -> tuple[_Lobby, _Member]:
        lobby = self._lobby(lobby_id)
        member = lobby.members.get(member_id)
        if member is None:
            _refuse(ErrorCode.NOT_MEMBER, "not a member of this lobby")
        if not member.arrived:
            # A seat a re-created lobby keeps for a member who has not come back: until it is
            # claimed (a join with its client's secret, its copy, or a hello with its seat),
            # a session naming that member is not it.
            _refuse(ErrorCode.NOT_MEMBER, "this seat is kept for a member who has not come back")
        return lobby, member

    def _owned(self, member_id: str, lobby_id: int) -> _Lobby:
        lobby, _ = self._membership(member_id, lobby_id)
        if lobby.owner != member_id:
            _refuse(ErrorCode.NOT_OWNER, "only the lobby's owner may do this")
        return lobby

    def _not_elsewhere(self, member_id: str, allowed: int | None) -> None:
        where = self._where.get(member_id)
        if where is not None and where != allowed:
            _refuse(ErrorCode.ALREADY_IN_LOBBY, f"already in lobby {where}; leave it first")

    def _check_name(self, name: str) -> None:
        size = _utf8_len(name)
        if not 1 <= size <= self.config.max_name_bytes or _has_control(name):
            _refuse(
                ErrorCode.NAME_INVALID,
                f"a lobby name is 1..{self.config.max_name_bytes} bytes without control characters",
            )

    def _check_max_members(self, n: int) -> None:
        if not 1 <= n <= self.config.max_members_cap:
            _refuse(ErrorCode.BAD_REQUEST, f"max members is 1..{self.config.max_members_cap}")

    def _check_map(self, values: Mapping[str, Value], *, max_keys: int, max_total: int) -> str:
        """Why `values` breaks the limits, or "" if it does not."""
        if len(values) > max_keys:
            return f"at most {max_keys} keys"
        total = 0
        for key, v in values.items():
            key_size = _utf8_len(key)
            if not 1 <= key_size <= self.config.max_key_bytes:
                return f"a key is 1..{self.config.max_key_bytes} bytes"
            if isinstance(v, bool) or not isinstance(v, str | int):
                return "a value is a string or an integer"
            if isinstance(v, int) and not I64_MIN <= v <= I64_MAX:
                return "an integer value is a signed 64-bit integer"
            size = _value_bytes(v)
            if isinstance(v, str) and size > self.config.max_value_bytes:
                return f"a value is at most {self.config.max_value_bytes} bytes"
            total += key_size + size
        if total > max_total:
            return f"at most {max_total} bytes in all"
        return ""

    def _check_metadata(self, metadata: Mapping[str, Value]) -> None:
        why = self._check_map(
            metadata,
            max_keys=self.config.max_metadata_keys,
            max_total=self.config.max_metadata_bytes,
        )
        if not why:
            for key in self.config.indexed_keys:
                v = metadata.get(key)
                if isinstance(v, str) and _utf8_len(v) > self.config.max_indexed_value_bytes:
                    why = (
                        f"indexed key {key!r} holds at most "
                        f"{self.config.max_indexed_value_bytes} bytes"
                    )
                    break
        if why:
            _refuse(ErrorCode.METADATA_LIMIT, f"metadata: {why}")

    def _check_attributes(self, attributes: Mapping[str, Value]) -> None:
        why = self._check_map(
            attributes,
            max_keys=self.config.max_attribute_keys,
            max_total=self.config.max_attributes_bytes,
        )
        if why:
            _refuse(ErrorCode.ATTRIBUTES_LIMIT, f"attributes: {why}")

    def _check_filters(self, filters: tuple[Filter, ...]) -> None:
        if len(filters) > self.config.max_filters:
            _refuse(ErrorCode.FILTER_INVALID, f"at most {self.config.max_filters} filters")
        for f in filters:
            if isinstance(f, StringEquals | NumberRange) and f.key not in self.config.indexed_keys:
                _refuse(ErrorCode.FILTER_INVALID, f"{f.key!r} is not an indexed key")
            if isinstance(f, NumberRange) and f.low > f.high:
                _refuse(ErrorCode.FILTER_INVALID, "a range's low end is above its high end")
