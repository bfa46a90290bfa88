"""The driver's timers: when each socket must next be serviced, and when each lent socket's
lend check falls due, for the one timer loop of a transport (driver.py).

A socket has at most one live entry in the heap, at `udp.queued`, never later than
`udp.scheduled`, the time it must next be serviced. A deadline brought nearer pushes a new
entry (the old one no longer counts: its time differs from `udp.queued`). A deadline moved
later, which every offer that goes out at once does (the probe and the idle heartbeat move
on), only updates `udp.scheduled`: the entry stays where it is and is moved on when it comes
up (lazy deletion), without the socket being serviced. The heap used to keep the earlier entry
and wake the loop to service the socket then, for nothing (tests/transport/test_scheduling.py).

The loop sleeps in a cancel scope whose deadline is its alarm (`sleeping`). A deadline that
moves changes the alarm instead of waking the loop to re-arm: 1.5 µs here, against ~15 µs for
a wake-up and a pass of the loop. No clock is read: `now` is passed in.
"""

from __future__ import annotations

import heapq
import itertools
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import trio

    from echo.transport.sockets import DriverSocket, TimerHandle

_Heap = list[tuple[float, int, "TimerHandle"]]


class TimerHeap:
    """Socket deadlines and lend checks, and the timer loop's alarm."""

    def __init__(self) -> None:
        # Entries hold a socket through its `TimerHandle`, which a closed socket empties.
        self._heap: _Heap = []
        self._lend_checks: _Heap = []
        self._seq = itertools.count()
        #: when the sleeping loop wakes unless woken sooner (-inf while it runs)
        self.sleep_until = math.inf
        self._alarm: trio.CancelScope | None = None

    # ---------------------------------------------------------------- the loop's alarm

    def sleeping(self, alarm: trio.CancelScope) -> None:
        """The loop goes to sleep in `alarm`, until its deadline (`next_alarm()`)."""
        self._alarm = alarm
        self.sleep_until = alarm.deadline

    def awake(self) -> None:
        self._alarm = None
        self.sleep_until = -math.inf

    def _set_alarm(self, when: float) -> None:
        alarm = self._alarm
        if alarm is not None:
            self.sleep_until = when
            alarm.deadline = when

    def next_alarm(self) -> float:
        """When the loop must next wake: a socket's deadline or a lend check."""
        timeout = self._next_deadline()
        checks = self._lend_checks
        if checks and checks[0][0] < timeout:
            timeout = checks[0][0]
        return timeout

    # ---------------------------------------------------------------- sockets

    def schedule(self, udp: DriverSocket, deadline: float, now: float) -> None:
        """`deadline` (> now) is when `udp` must next be serviced: its whole deadline."""
        udp.scheduled = deadline
        queued = udp.queued
        if deadline < queued:
            self._queue(udp, deadline)
        elif queued == self.sleep_until and queued - now <= deadline - queued:
            # The loop sleeps until this socket's old deadline and would wake then for
            # nothing: move its alarm on. Only once the old time is nearer than the deadline
            # moved, not on every offer (offers 100 µs apart each push a 2 ms probe on by
            # 100 µs): about once per half probe delay.
            self._set_alarm(self.next_alarm())

    def _queue(self, udp: DriverSocket, deadline: float) -> None:
        udp.queued = deadline
        heapq.heappush(self._heap, (deadline, next(self._seq), udp.timer_handle))
        if deadline < self.sleep_until:
            self._set_alarm(deadline)  # the loop sleeps until later: bring its alarm forward

    def due(self, now: float) -> list[DriverSocket]:
        """The sockets whose deadline has come (each is then unscheduled)."""
        heap = self._heap
        due: list[DriverSocket] = []
        while heap and heap[0][0] <= now:
            queued, _, handle = heapq.heappop(heap)
            udp = handle.socket
            if udp is None or queued != udp.queued:
                continue  # a closed socket's, or superseded by a nearer entry
            udp.queued = math.inf
            scheduled = udp.scheduled
            if scheduled <= now:
                udp.scheduled = math.inf
                due.append(udp)
            elif scheduled != math.inf:
                # Its deadline moved later since: follow it there, nothing is due now.
                udp.queued = scheduled
                heapq.heappush(heap, (scheduled, next(self._seq), handle))
        return due

    def _next_deadline(self) -> float:
        """The earliest socket deadline. Entries that no longer count are dropped on the way,
        and one whose socket's deadline moved later is moved there, so that the loop never
        goes to sleep towards a time at which nothing is due."""
        heap = self._heap
        while heap:
            queued, _, handle = heap[0]
            udp = handle.socket
            if udp is None or queued != udp.queued:
                heapq.heappop(heap)
                continue
            scheduled = udp.scheduled
            if scheduled == queued:
                return queued
            if scheduled == math.inf:
                udp.queued = math.inf
                heapq.heappop(heap)
            else:
                udp.queued = scheduled
                heapq.heapreplace(heap, (scheduled, next(self._seq), handle))
        return math.inf

    # ---------------------------------------------------------------- lend checks

    def queue_lend_check(self, udp: DriverSocket, when: float) -> None:
        """Check at `when` whether the lent socket `udp` is still in use (sockets.Lending)."""
        assert udp.lending is not None
        udp.lending.check_at = when
        heapq.heappush(self._lend_checks, (when, next(self._seq), udp.timer_handle))
        if when < self.sleep_until:
            self._set_alarm(when)

    def lend_checks_due(self, now: float) -> list[DriverSocket]:
        """The sockets whose pending lend check has come (each is then unscheduled)."""
        checks = self._lend_checks
        due: list[DriverSocket] = []
        while checks and checks[0][0] <= now:
            when, _, handle = heapq.heappop(checks)
            udp = handle.socket
            lending = udp.lending if udp is not None else None
            if udp is None or lending is None or when != lending.check_at:
                continue
            lending.check_at = math.inf
            due.append(udp)
        return due
