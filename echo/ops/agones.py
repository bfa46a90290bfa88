"""The Agones SDK's REST contract, as a pure state machine: which call to make, and when.

A game server on Agones talks to the SDK sidecar of its pod over HTTP on
``localhost:$AGONES_SDK_HTTP_PORT`` (9358 by default). The endpoints and bodies follow
Agones' "REST Game Server Client API" page and the SDK's protocol definitions (sdk.proto,
alpha.proto):

    POST /ready                    {}                      once the game server listens
    POST /health                   {}                      every half health period
    POST /allocate                 {}                      the first player on a server not
                                                           allocated yet (self-allocation)
    POST /reserve                  {"seconds": "N"}        on the game's request
    POST /shutdown                 {}                      the last session of an allocated
                                                           game ended, or SIGTERM drained
    GET  /gameserver                                       the GameServer (state, health spec)
    GET  /watch/gameserver                                 the same, one JSON line per change
    POST /alpha/player/connect     {"playerID": "..."}     a session opened
    POST /alpha/player/disconnect  {"playerID": "..."}     a session ended

The sidecar may start after the game server (the page says so: "your REST SDK API calls should
contain some retry logic"): a call the sidecar did not answer is tried again with a doubling
backoff, in order, and nothing that happens to the sidecar ever stops the game. Health pings
are not queued: a missed one is followed by the next. A player call the sidecar refuses (the
capacity is reached, say) is given up and logged; lifecycle calls are tried until they succeed.

Pure: every input carries `now`; the trio driver (echo.ops.agones_driver) makes the calls.
"""

from __future__ import annotations

import enum
import json
import math
from collections import deque
from typing import Any

import attrs

__all__ = [
    "DEFAULT_HEALTH_PERIOD",
    "DEFAULT_HTTP_PORT",
    "Agones",
    "Backoff",
    "Call",
    "Verdict",
    "parse_watch_line",
    "sidecar_port",
]

#: The SDK sidecar's HTTP port when $AGONES_SDK_HTTP_PORT is not set.
DEFAULT_HTTP_PORT = 9358
#: GameServer.spec.health.periodSeconds when the GameServer does not say (Agones' default).
DEFAULT_HEALTH_PERIOD = 5.0
#: Consecutive failed attempts of one call are spaced FIRST, 2 x FIRST, ... up to MAX seconds.
BACKOFF_FIRST = 0.25
BACKOFF_MAX = 5.0

_EMPTY = b"{}"
_ALLOCATED = "Allocated"


class Kind(enum.Enum):
    LIFECYCLE = "lifecycle"  # ready, allocate, reserve, shutdown: tried until they succeed
    QUERY = "query"  # GET /gameserver: tried until it succeeds
    PLAYER = "player"  # tried while the sidecar does not answer; an error answer gives up
    HEALTH = "health"  # never tried again: the next ping follows


@attrs.frozen
class Call:
    """One request to the sidecar."""

    name: str
    method: str
    path: str
    body: bytes | None
    kind: Kind
    player: str | None = None


def _player_call(name: str, path: str, player: str) -> Call:
    body = json.dumps({"playerID": player}).encode()
    return Call(name, "POST", path, body, Kind.PLAYER, player)


READY = Call("ready", "POST", "/ready", _EMPTY, Kind.LIFECYCLE)
HEALTH = Call("health", "POST", "/health", _EMPTY, Kind.HEALTH)
ALLOCATE = Call("allocate", "POST", "/allocate", _EMPTY, Kind.LIFECYCLE)
SHUTDOWN = Call("shutdown", "POST", "/shutdown", _EMPTY, Kind.LIFECYCLE)
GAMESERVER = Call("gameserver", "GET", "/gameserver", None, Kind.QUERY)
WATCH_PATH = "/watch/gameserver"


def reserve_call(seconds: int) -> Call:
    # int64 in the SDK's JSON mapping: a string, as the REST page's example sends it
    return Call("reserve", "POST", "/reserve", json.dumps({"seconds": str(seconds)}).encode(),
                Kind.LIFECYCLE)  # fmt: skip


class Verdict(enum.Enum):
    DONE = "done"
    RETRY = "retry"  # tried again after the backoff
    GIVEN_UP = "given up"
    MISSED = "missed"  # a health ping that got no answer: the next one follows


def sidecar_port(environ: dict[str, str] | Any) -> int:
    """The sidecar's HTTP port from $AGONES_SDK_HTTP_PORT (9358 if unset); ValueError if it
    is not a port number."""
    text = environ.get("AGONES_SDK_HTTP_PORT", "").strip()
    if not text:
        return DEFAULT_HTTP_PORT
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise ValueError(f"AGONES_SDK_HTTP_PORT={text!r} is not a port number (1-65535)")
    return int(text)


def parse_watch_line(line: bytes) -> dict[str, Any] | None:
    """A GameServer from one line of /watch/gameserver (``{"result": {...}}``); None for a
    line that is not one (blank, an ``{"error": ...}`` of the stream, garbage)."""
    try:
        decoded = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    result = decoded.get("result") if isinstance(decoded, dict) else None
    return dict(result) if isinstance(result, dict) else None


class Backoff:
    """Delays between attempts: FIRST, doubling, at most MAX; `reset` after a success."""

    def __init__(self, first: float = BACKOFF_FIRST, most: float = BACKOFF_MAX) -> None:
        self.first = first
        self.most = most
        self.failures = 0

    def next_delay(self) -> float:
        delay: float = min(self.most, self.first * 2.0**self.failures)
        self.failures += 1
        return delay

    def reset(self) -> None:
        self.failures = 0


def _health_spec(gameserver: dict[str, Any]) -> tuple[bool | None, float | None]:
    """(disabled, period seconds), each None where GameServer.spec.health does not say."""
    spec = gameserver.get("spec")
    health = spec.get("health") if isinstance(spec, dict) else None
    if not isinstance(health, dict):
        return None, None
    disabled = health.get("disabled") is True
    period = health.get("period_seconds", health.get("periodSeconds"))
    try:
        seconds = float(period) if period is not None else None
    except (TypeError, ValueError):
        seconds = None
    usable = seconds is not None and math.isfinite(seconds) and seconds > 0
    return disabled, seconds if usable else None


class Agones:
    """What the game server owes the sidecar, decided from the game's events and the
    GameServer the sidecar reports.

    The driver reports: `listening`, `session_opened`/`session_closed` (a player id each),
    `gameserver_seen` (from GET /gameserver or the watch), `request_shutdown` (SIGTERM after
    the drain); it asks `next_call(now)` for a call to make, reports its answer with
    `completed`, and sleeps until `wake_at()` or the next event.

    allocate_on_first_player: a session opening on a server not Allocated calls /allocate, so
        that a fleet scaling down never deletes a server with a player on it.
    shutdown_when_empty: the last session of an allocated game (one that had a player) ending
        calls /shutdown: one game per GameServer, Agones' model.
    """

    def __init__(
        self,
        *,
        health_period: float = DEFAULT_HEALTH_PERIOD,
        allocate_on_first_player: bool = True,
        shutdown_when_empty: bool = True,
        backoff_first: float = BACKOFF_FIRST,
        backoff_max: float = BACKOFF_MAX,
    ) -> None:
        self.health_period = health_period
        self.health_disabled = False
        self.allocate_on_first_player = allocate_on_first_player
        self.shutdown_when_empty = shutdown_when_empty
        #: the GameServer's state as last reported ("Ready", "Allocated", ...), None before
        self.state: str | None = None
        #: players connected, as the game knows them (the sidecar learns them in order)
        self.players: set[str] = set()
        self.allocated = False
        #: a player was on the server since it was allocated
        self.played = False
        self.ready = False
        self.shutdown_requested = False
        #: /shutdown answered (or given up: see `give_up_shutdown`)
        self.shut_down = False
        self._queue: deque[Call] = deque()
        self._backoff = Backoff(backoff_first, backoff_max)
        self._retry_at = 0.0
        self._in_flight: Call | None = None
        self._next_health: float | None = None
        self._allocate_queued = False

    # ------------------------------------------------------------------ the game's events

    def listening(self, now: float) -> None:
        """The game server listens: Ready, learn the GameServer, start the health pings."""
        if self._next_health is None:
            self._queue.extend((READY, GAMESERVER))
            self._next_health = now

    def session_opened(self, player: str, now: float) -> None:
        if player in self.players or self.shut_down:
            return
        self.players.add(player)
        if not self.allocated and self.allocate_on_first_player and not self._allocate_queued:
            self._allocate_queued = True
            self._queue.append(ALLOCATE)
        if self.allocated or self._allocate_queued:
            self.played = True
        self._queue.append(_player_call("player_connect", "/alpha/player/connect", player))

    def session_closed(self, player: str, now: float) -> None:
        if player not in self.players:
            return
        self.players.discard(player)
        pending = [c for c in self._queue if c.player == player and c is not self._in_flight]
        if pending and pending[-1].name == "player_connect":
            # Never told the sidecar it came: it need not hear that it left.
            self._queue.remove(pending[-1])
        else:
            self._queue.append(_player_call("player_disconnect", "/alpha/player/disconnect",
                                            player))  # fmt: skip
        self._maybe_game_over(now)

    def _maybe_game_over(self, now: float) -> None:
        if self.shutdown_when_empty and self.allocated and self.played and not self.players:
            self.request_shutdown(now)

    def gameserver_seen(self, gameserver: dict[str, Any], now: float) -> tuple[str | None, str]:
        """A GameServer from the sidecar: (state before, state now)."""
        before = self.state
        status = gameserver.get("status")
        state = status.get("state") if isinstance(status, dict) else None
        if isinstance(state, str) and state:
            self.state = state
            if state == _ALLOCATED and not self.allocated:
                self.allocated = True
                self.played = self.played or bool(self.players)
                self._maybe_game_over(now)
        disabled, period = _health_spec(gameserver)
        if disabled is not None:
            self.health_disabled = disabled
        if period is not None:
            self.health_period = period
            if self._next_health is not None:
                self._next_health = min(self._next_health, now + self.health_interval)
        return before, self.state or ""

    def request_shutdown(self, now: float) -> None:
        """Queue /shutdown after whatever the sidecar still has to hear."""
        if not self.shutdown_requested:
            self.shutdown_requested = True
            self._queue.append(SHUTDOWN)

    def allocate(self, now: float) -> None:
        if not self.allocated and not self._allocate_queued:
            self._allocate_queued = True
            self._queue.append(ALLOCATE)

    def reserve(self, seconds: int, now: float) -> None:
        if seconds < 0:
            raise ValueError(f"reserve: seconds must be >= 0, got {seconds}")
        self._queue.append(reserve_call(seconds))

    def give_up_shutdown(self) -> None:
        """The game server goes without the sidecar having heard /shutdown (it never
        answered within the bound): nothing more is sent."""
        self.shut_down = True
        self._queue.clear()

    # ------------------------------------------------------------------ the driver's side

    @property
    def health_interval(self) -> float:
        return self.health_period / 2

    @property
    def idle(self) -> bool:
        """Nothing queued and nothing in flight."""
        return not self._queue and self._in_flight is None

    def next_call(self, now: float) -> Call | None:
        """The call to make now, if any (the queue's head first, in order, once its backoff
        is over; else a due health ping)."""
        if self._in_flight is not None:
            return None
        if self._queue and now >= self._retry_at:
            self._in_flight = self._queue[0]
            return self._in_flight
        if self._health_due(now):
            self._next_health = now + self.health_interval
            self._in_flight = HEALTH
            return HEALTH
        return None

    def _health_due(self, now: float) -> bool:
        return (
            self._next_health is not None
            and now >= self._next_health
            and not self.health_disabled
            and not self.shut_down
        )

    def wake_at(self) -> float | None:
        """When `next_call` may next have something (None: only a new event will)."""
        if self._in_flight is not None:
            return None
        times = []
        if self._queue:
            times.append(self._retry_at)
        if self._next_health is not None and not self.health_disabled and not self.shut_down:
            times.append(self._next_health)
        return min(times) if times else None

    def completed(self, call: Call, status: int | None, body: bytes, now: float) -> Verdict:
        """The sidecar's answer to `call` (status None: it did not answer at all)."""
        assert call is self._in_flight, (call, self._in_flight)
        self._in_flight = None
        ok = status is not None and 200 <= status < 300
        if call.kind is Kind.HEALTH:
            return Verdict.DONE if ok else Verdict.MISSED
        if not ok and (status is None or call.kind is not Kind.PLAYER):
            self._retry_at = now + self._backoff.next_delay()
            return Verdict.RETRY
        self._backoff.reset()
        self._queue.popleft()
        if ok:
            self._succeeded(call, body, now)
            return Verdict.DONE
        return Verdict.GIVEN_UP

    def _succeeded(self, call: Call, body: bytes, now: float) -> None:
        if call is READY:
            self.ready = True
        elif call is ALLOCATE:
            if not self.allocated:
                self.allocated = True
                self.played = self.played or bool(self.players)
                self._maybe_game_over(now)
        elif call is SHUTDOWN:
            self.shut_down = True
        elif call is GAMESERVER:
            try:
                gameserver = json.loads(body)
            except (ValueError, UnicodeDecodeError):
                return
            if isinstance(gameserver, dict):
                self.gameserver_seen(gameserver, now)
