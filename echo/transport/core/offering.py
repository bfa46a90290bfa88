"""The offer path: what an application's `offer` runs, compiled with the core.

An offer appends into the pure publication and then decides whether the driver must hear of it
at once (send now, or wake the timer loop) or whether the driver already has the socket to
service on its next pass (the middle of a burst: nothing to do). That decision is made on every
message an application sends, so it lives here, compiled, rather than in the driver's
interpreted channel object: `api.Publication.offer` is `OfferGate.offer` itself, one compiled
call per message instead of three interpreted frames (api, channel, clock).

Pure as the rest of the core: no trio, no clock of its own. The clock (the driver's: the run's
trio clock, a MockClock under tests) and the driver's two actions (`flush`, `wake`) are passed
in; the driver owns `Ticker` and each send socket's `Burst` and updates them as it runs
(driver/loop.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Final

from echo.transport.core.publication import NetworkPublication

#: offers closer together than this are a burst: batch them instead of sending each at once
#: (Driver.flush)
BURST_GAP: Final = 0.0002


class Ticker:
    """The driver's tick: advanced whenever a driver task wakes (a socket was readable, a timer
    was due). Offers made between two ticks were made without the network having a say."""

    __slots__ = ("tick",)

    def __init__(self) -> None:
        self.tick = 0


class Burst:
    """When an offer last sent from one send socket at once (the driver's tick and the time)."""

    __slots__ = ("flush_tick", "last_flush")

    def __init__(self) -> None:
        self.flush_tick = -1
        self.last_flush = -math.inf

    def in_burst(self, tick: int, now: float) -> bool:
        """Does an offer at `now` follow the last one sent at once with nothing in between?"""
        return tick == self.flush_tick and now - self.last_flush < BURST_GAP


class OfferGate:
    """One publication's offer path: its pure state, its socket and the driver's hooks."""

    __slots__ = (
        "_burst",
        "_clock",
        "_flush",
        "_pending",
        "_publication",
        "_socket",
        "_ticker",
        "_wake",
    )

    def __init__(
        self,
        publication: NetworkPublication,
        socket: object,
        burst: Burst,
        pending: set[Any],
        ticker: Ticker,
        clock: Callable[[], float],
        flush: Callable[[Any, NetworkPublication, float], None],
        wake: Callable[[Any], None],
    ) -> None:
        self._publication = publication
        self._socket = socket
        self._burst = burst
        #: the sockets the driver's timer loop services on its next pass
        self._pending = pending
        self._ticker = ticker
        self._clock = clock
        self._flush = flush
        self._wake = wake

    def offer(self, data: bytes | bytearray | memoryview, flush: bool = True) -> int:
        """Append one message; the new position (> 0) or one of Aeron's negative codes."""
        now = self._clock()
        result = self._publication.offer(data, now)
        if result > 0:
            socket = self._socket
            if socket in self._pending and (
                not flush or self._burst.in_burst(self._ticker.tick, now)
            ):
                # The timer loop already has this socket to service on its next pass, and this
                # offer is not one to send at once (flush=False, or the middle of a burst):
                # what flush/wake would do is done, without a call into the driver.
                return result
            if flush:
                self._flush(socket, self._publication, now)
            else:
                # The caller has more to offer right away: let them share datagrams.
                self._wake(socket)
        return result
