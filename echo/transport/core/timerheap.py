"""The driver's timers: when each socket must next be serviced, and when each lent socket's
lend check falls due, for the one timer loop of a transport (driver/loop.py).

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

Timer slack. A deadline set at least LAZY_AHEAD ahead (an idle heartbeat, a status message,
a registration, a destination's expiry: the idle cadence, 0.1-2 s ahead) is lazy: it may be
met up to SLACK late, so that one wake-up serves every lazy deadline within SLACK of the first
(Linux gives timers slack for the same reason). A server of 1,200 idle members had about 2,000
such deadlines a second, almost each a wake-up of its own: a cancel scope expired, a Cancelled
delivered and caught, a pass of trio's scheduler (~14 µs); with SLACK = 5 ms a wake-up serves
several. A deadline set closer than LAZY_AHEAD (a probe 2 ms after data, a NAK's delay, a
retransmit, a lend check) is precise: the loop wakes for it on time. The two kinds are kept in
two heaps; the alarm is the earlier of the first precise deadline and the first lazy one plus
SLACK, and each wake-up serves every deadline of both that has come.

Idle slots. A deadline set at least IDLE_AHEAD ahead (0.4 s: the idle heartbeats and status
messages of sessions and lobbies, 0.5-2 s apart, and liveness expiries) is met up to
IDLE_SLACK (25 ms) late, in a third heap: a server of a thousand idle sessions has about 2,000
such deadlines a second, and with 5 ms of slack each wake-up served ten of them (about 200
wake-ups a second); with 25 ms, fifty (about 40). The interval of such a deadline stretches by
at most IDLE_SLACK / IDLE_AHEAD (6 %); Aeron's own cadence (100-200 ms) stays in the lazy slots.
"""

from __future__ import annotations

import heapq
import itertools
import math
from typing import Generic, Protocol, TypeVar, cast


class Alarm(Protocol):
    """What the sleeping timer loop sleeps in: a deadline that may be moved (trio's
    `CancelScope` is one)."""

    deadline: float


class Lendable(Protocol):
    """A lent socket's lend check (driver.sockets.Lending)."""

    check_at: float


class Handle(Protocol):
    """What the heaps hold instead of the item itself (driver.sockets.TimerHandle): a closed
    socket empties it, so an entry left in a heap does not keep it alive."""

    @property
    def socket(self) -> Timed | None: ...


class Timed(Protocol):
    """What the heap schedules (driver.sockets.DriverSocket): the fields it keeps on it.
    (Protocols, so that this pure module imports nothing of the driver.)"""

    scheduled: float
    queued: float
    queued_tier: int

    @property
    def timer_handle(self) -> Handle: ...

    @property
    def lending(self) -> Lendable | None: ...


T = TypeVar("T", bound=Timed)
_Heap = list[tuple[float, int, Handle]]

#: a deadline set at least this far ahead is lazy (may be met up to SLACK late)
LAZY_AHEAD = 0.05
#: how late a lazy deadline may be met: a tenth of LAZY_AHEAD, a few thousandths of an idle
#: heartbeat's interval
SLACK = 0.005
#: a deadline set at least this far ahead is idle (may be met up to IDLE_SLACK late)
IDLE_AHEAD = 0.4
#: how late an idle deadline may be met: a sixteenth of IDLE_AHEAD
IDLE_SLACK = 0.025
#: the heaps' tiers (DriverSocket.queued_tier) and how late each may be met
PRECISE, LAZY, IDLE = 0, 1, 2
_SLACKS = (0.0, SLACK, IDLE_SLACK)


def tier_of(ahead: float) -> int:
    """The tier of a deadline set `ahead` seconds ahead."""
    if ahead < LAZY_AHEAD:
        return PRECISE
    return LAZY if ahead < IDLE_AHEAD else IDLE


class TimerHeap(Generic[T]):
    """Socket deadlines and lend checks, and the timer loop's alarm."""

    def __init__(self) -> None:
        # Entries hold a socket through its `TimerHandle`, which a closed socket empties. A
        # socket's live entry is in one of the three (at `udp.queued`, `udp.queued_tier`).
        self._heap: _Heap = []  # precise deadlines
        self._lazy: _Heap = []  # lazy deadlines (LAZY_AHEAD, SLACK)
        self._idle: _Heap = []  # idle deadlines (IDLE_AHEAD, IDLE_SLACK)
        self._heaps = (self._heap, self._lazy, self._idle)
        self._lend_checks: _Heap = []
        self._seq = itertools.count()
        #: when the sleeping loop wakes unless woken sooner (-inf while it runs)
        self.sleep_until = math.inf
        #: the deadline that alarm is for (a lazy one's alarm is SLACK later)
        self.sleep_for = math.inf
        self._next_for = math.inf
        self._alarm: Alarm | None = None

    # ---------------------------------------------------------------- the loop's alarm

    def sleeping(self, alarm: Alarm) -> None:
        """The loop goes to sleep in `alarm`, until its deadline (`next_alarm()`)."""
        self._alarm = alarm
        self.sleep_until = alarm.deadline
        self.sleep_for = self._next_for if alarm.deadline != math.inf else math.inf

    def awake(self) -> None:
        self._alarm = None
        self.sleep_until = -math.inf
        self.sleep_for = -math.inf

    def _set_alarm(self, when: float, deadline: float) -> None:
        """Wake the sleeping loop at `when`, for `deadline` (`when`, or a lazy one's SLACK
        later)."""
        alarm = self._alarm
        if alarm is not None:
            self.sleep_until = when
            self.sleep_for = deadline
            alarm.deadline = when

    def next_alarm(self) -> float:
        """When the loop must next wake: a precise deadline, a lazy one SLACK after it, an
        idle one IDLE_SLACK after it, or a lend check."""
        deadline = self._next_deadline(self._heap, PRECISE)
        timeout = deadline
        for tier in (LAZY, IDLE):
            first = self._next_deadline(self._heaps[tier], tier)
            if first + _SLACKS[tier] < timeout:
                deadline = first
                timeout = first + _SLACKS[tier]
        checks = self._lend_checks
        if checks and checks[0][0] < timeout:
            deadline = timeout = checks[0][0]
        self._next_for = deadline
        return timeout

    # ---------------------------------------------------------------- sockets

    def schedule(self, udp: T, deadline: float, now: float) -> None:
        """`deadline` (> now) is when `udp` must next be serviced: its whole deadline."""
        udp.scheduled = deadline
        queued = udp.queued
        ahead = deadline - now  # (tier_of, inline: this runs for many offers)
        tier = PRECISE if ahead < LAZY_AHEAD else LAZY if ahead < IDLE_AHEAD else IDLE
        if deadline < queued or udp.queued_tier > tier:
            # (Moved later, but from an entry with more slack to a deadline that must be met
            # sooner: a probe after the data that pushed an idle heartbeat on. Its own tier.)
            self._queue(udp, deadline, tier)
        elif queued == self.sleep_for and queued - now <= deadline - queued:
            # The loop sleeps until this socket's old deadline and would wake then for
            # nothing: move its alarm on. Only once the old time is nearer than the deadline
            # moved, not on every offer (offers 100 µs apart each push a 2 ms probe on by
            # 100 µs): about once per half probe delay.
            self._set_alarm(self.next_alarm(), self._next_for)

    def _queue(self, udp: T, deadline: float, tier: int) -> None:
        udp.queued = deadline
        udp.queued_tier = tier
        heapq.heappush(self._heaps[tier], (deadline, next(self._seq), udp.timer_handle))
        when = deadline + _SLACKS[tier]
        if when < self.sleep_until:
            self._set_alarm(when, deadline)  # the loop sleeps until later: bring it forward

    def due(self, now: float) -> list[T]:
        """The sockets whose deadline has come, of any tier (each is then unscheduled)."""
        due: list[T] = []
        for tier, heap in enumerate(self._heaps):
            while heap and heap[0][0] <= now:
                queued, _, handle = heapq.heappop(heap)
                udp = handle.socket
                if udp is None or queued != udp.queued or udp.queued_tier != tier:
                    continue  # a closed socket's, or superseded by another entry
                udp.queued = math.inf
                scheduled = udp.scheduled
                if scheduled <= now:
                    udp.scheduled = math.inf
                    due.append(cast(T, udp))
                elif scheduled != math.inf:
                    # Its deadline moved later since: follow it there, nothing is due now.
                    # (Moved later, it is at least as far ahead as it was: same heap.)
                    udp.queued = scheduled
                    heapq.heappush(heap, (scheduled, next(self._seq), handle))
        return due

    def _next_deadline(self, heap: _Heap, tier: int) -> float:
        """The earliest socket deadline in `heap` (of `tier`). Entries that no longer count
        are dropped on the way, and one whose socket's deadline moved later is moved there,
        so that the loop never goes to sleep towards a time at which nothing is due. (An
        entry counts while its time is the socket's `queued` and its heap the socket's
        `queued_tier`: a deadline moved from a lazy entry to a precise one at the same time
        leaves two entries of one time.)"""
        while heap:
            queued, _, handle = heap[0]
            udp = handle.socket
            if udp is None or queued != udp.queued or udp.queued_tier != tier:
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

    def queue_lend_check(self, udp: T, when: float) -> None:
        """Check at `when` whether the lent socket `udp` is still in use (sockets.Lending)."""
        assert udp.lending is not None
        udp.lending.check_at = when
        heapq.heappush(self._lend_checks, (when, next(self._seq), udp.timer_handle))
        if when < self.sleep_until:
            self._set_alarm(when, when)

    def lend_checks_due(self, now: float) -> list[T]:
        """The sockets whose pending lend check has come (each is then unscheduled)."""
        checks = self._lend_checks
        due: list[T] = []
        while checks and checks[0][0] <= now:
            when, _, handle = heapq.heappop(checks)
            udp = handle.socket
            lending = udp.lending if udp is not None else None
            if udp is None or lending is None or when != lending.check_at:
                continue
            lending.check_at = math.inf
            due.append(cast(T, udp))
        return due
