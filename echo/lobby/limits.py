"""The lobby's configuration of sizes and rates, and the token bucket that enforces the rates.

Defaults follow what the services developers already know (their public documentation):
Unity Lobby's per-player rates (create 2 per 6 s, update 5 per 5 s, query 1 per s) and its data
sizes (20 lobby properties, 128 B for an indexed one, 10 player properties), PlayFab's 4 KiB of
lobby data, Steam's 50 results per search.

Pure module: no trio, no clock.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class RateLimit:
    """A token bucket: `burst` requests at once, refilled at `rate` per second."""

    rate: float
    burst: float

    def __attrs_post_init__(self) -> None:
        if not (self.rate > 0 and self.burst >= 1):
            raise ValueError(f"a rate limit needs rate > 0 and burst >= 1, not {self!r}")


class TokenBucket:
    """One member's budget for one kind of request; `now` is the caller's clock in seconds."""

    __slots__ = ("last", "limit", "tokens")

    def __init__(self, limit: RateLimit, now: float) -> None:
        self.limit = limit
        self.tokens = limit.burst
        self.last = now

    def _refill(self, now: float) -> None:
        # A clock that steps back must not mint tokens nor drain them.
        elapsed = max(0.0, now - self.last)
        self.tokens = min(self.limit.burst, self.tokens + elapsed * self.limit.rate)
        self.last = max(self.last, now)

    def take(self, now: float) -> bool:
        """Spend one token if there is one; False means the request is over the rate."""
        self._refill(now)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False

    def wait(self, now: float) -> float:
        """Seconds from `now` until the next token (0 if there is one): a refused client's
        retry-after."""
        self._refill(now)
        return max(0.0, (1.0 - self.tokens) / self.limit.rate)

    def is_full(self, now: float) -> bool:
        """A full bucket carries no information and can be forgotten (memory follows use)."""
        self._refill(now)
        return self.tokens >= self.limit.burst


@attrs.frozen
class LobbyConfig:
    """Every size and rate of one lobby server, declared once."""

    max_lobbies: int = 10_000
    max_members_cap: int = 64  # the largest `max_members` a lobby may ask for
    max_name_bytes: int = 64
    max_member_id_bytes: int = 64
    max_metadata_keys: int = 20
    max_key_bytes: int = 32
    max_value_bytes: int = 1024
    max_metadata_bytes: int = 4096  # keys + values; an integer counts 8 bytes
    # Metadata keys a search may filter on. Only these travel in listings, which keeps a page
    # (and a topic's listing record) small; their string values are bounded tighter.
    indexed_keys: frozenset[str] = frozenset()
    max_indexed_value_bytes: int = 128
    max_attribute_keys: int = 10
    max_attributes_bytes: int = 1024
    max_chat_bytes: int = 256
    max_bans: int = 64
    max_filters: int = 8
    max_page: int = 50
    # A dropped member keeps its seat this long (the session library's resume window).
    reconnect_grace: float = 20.0
    # After a lobby is recreated here from a member's copy, further copies are merged into it
    # for this long (members re-create within 5 s of losing the home).
    recreate_window: float = 10.0
    # Chat text kept for each member away from its seat (reconnecting, or not yet arrived on
    # a re-created lobby's new home), handed to it when it is back (echo.lobby.heldchat).
    held_chat_bytes: int = 16 * 1024
    create_limit: RateLimit = RateLimit(rate=2 / 6, burst=2)
    update_limit: RateLimit = RateLimit(rate=1.0, burst=5)
    search_limit: RateLimit = RateLimit(rate=1.0, burst=3)
    chat_limit: RateLimit = RateLimit(rate=4.0, burst=8)
    # Start only when every connected member but the owner is ready (the ready state's use).
    start_requires_ready: bool = True
    # Joins are limited too: it bounds how fast a client can guess private join codes.
    join_limit: RateLimit = RateLimit(rate=1.0, burst=5)
    # The very create, join or quick-join that seated the member, asked again (its reply was
    # lost): not counted against the limits above, so a member retrying under load cannot
    # rate-limit itself, but bounded too, as each is answered with a whole snapshot.
    repeat_limit: RateLimit = RateLimit(rate=2.0, burst=10)
    # A started game's longest life: until its result comes, a player who crashed gets a
    # fresh ticket (`RequestTicket`); after it, the lobby ends the game itself ("timed_out").
    game_life: float = 3 * 3600.0
    # A game server's result for a lobby this server does not hold is kept this long (at most
    # `max_held_results` of them): the lobby's home may have died, and its members be on their
    # way to re-create it here with its running game (echo.lobby.gameloop).
    result_hold: float = 30.0
    max_held_results: int = 1024

    def __attrs_post_init__(self) -> None:
        for name in (
            "max_lobbies",
            "max_members_cap",
            "max_name_bytes",
            "max_member_id_bytes",
            "max_key_bytes",
            "max_chat_bytes",
            "max_filters",
            "max_page",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.max_members_cap > 0xFFFF or self.max_bans > 255 or self.max_page > 255:
            raise ValueError("max_members_cap, max_bans or max_page exceeds its wire field")
        if self.max_name_bytes > 255 or self.max_key_bytes > 255 or self.max_member_id_bytes > 255:
            raise ValueError("names, keys and member ids travel as str8: at most 255 bytes")
        if self.max_metadata_keys > 255 or self.max_attribute_keys > 255:
            raise ValueError("a map holds at most 255 keys on the wire")
        if self.held_chat_bytes < 0:
            raise ValueError("held_chat_bytes cannot be negative")
        if self.reconnect_grace < 0 or self.recreate_window < 0:
            raise ValueError("grace periods cannot be negative")
        if self.game_life <= 0:
            raise ValueError("a game lives a positive time")
        if self.result_hold < 0 or self.max_held_results < 1:
            raise ValueError("result_hold cannot be negative, max_held_results is at least 1")
