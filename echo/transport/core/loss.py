"""Loss detection for an image: the gaps in its rebuilt log, when to NAK each, and the repair
time that unicast NAK retries wait for (Aeron's LossDetector, with every gap timed).

Pure: `now` is passed in; nothing here sends. `LossDetector.due(now)` says which gaps to NAK
(or, unreliable, to pad over) now; the image builds and sends the NAKs and reports them back
(`nak_sent`), so the repair timer can measure the first NAK of each gap against its repair.
"""

from __future__ import annotations

import math
import random

from echo.transport.core.config import ReceiverTimers
from echo.transport.core.logbuffer import PARTITION_COUNT, TermBuffers, scan_for_gap

#: gaps with their own NAK timer per image (Aeron NAKs one at a time; see LossDetector.scan):
#: a bound on the work a forged frame far ahead can cause, and on the NAKs of one scan
MAX_GAPS = 64
#: the repair-time estimator's gains and the deviations a retry waits beyond the mean: TCP's
#: RTO (RFC 6298 §2: alpha 1/8, beta 1/4, K 4)
RTT_ALPHA = 0.125
RTT_BETA = 0.25
RTO_K = 4

Gap = tuple[int, int]  # (position, length)


def group_nak_delay(rng: random.Random, max_backoff: float, group_size: int) -> float:
    """Aeron's OptimalMulticastDelayGenerator: a random NAK delay in (0, max_backoff].

    Spreading the NAKs of a group over time lets one NAK (and its retransmit, which every
    receiver sees) suppress the rest (Aeron's LossDetector).
    """
    lam = math.log(group_size) + 1.0
    t = max_backoff
    factor = (math.exp(lam) - 1.0) * (t / lam)
    x = rng.uniform(0.0, lam / t) + lam / (t * (math.exp(lam) - 1.0))
    delay = (t / lam) * math.log(x * factor)
    return min(max(delay, 0.0), t)


class RepairTimer:
    """The repair time of one image (first NAK of a gap -> its first byte back), smoothed as
    TCP smooths RTT (RFC 6298): unicast NAK retries wait for it instead of Aeron's fixed 10 ms.

    Karn's rule: a gap NAKed more than once says nothing about the round trip, so only the
    first NAK of a gap is timed.
    """

    __slots__ = ("_timers", "naked", "rttvar", "srtt")

    def __init__(self, timers: ReceiverTimers) -> None:
        self._timers = timers
        self.srtt: float | None = None
        self.rttvar = 0.0
        #: gap start -> when its one and only NAK went, or None once it was NAKed again
        self.naked: dict[int, float | None] = {}

    def retry_delay(self) -> float:
        """How long a unicast gap waits after a NAK before it is NAKed again.

        Aeron waits a fixed nak_delay x 100 (10 ms): on a LAN or loopback, where a repair comes
        back in a fraction of a millisecond, a lost NAK or retransmit then idles the stream for
        10 ms, and at 5 % loss that is most of the time. Here the retry waits for the repair
        time measured on this image, plus four deviations (TCP's RTO), at least
        `nak_retry_min`; until a repair has been measured, Aeron's fixed delay.
        """
        timers = self._timers
        if self.srtt is None:
            return timers.nak_delay * timers.nak_retry_ratio
        return max(timers.nak_retry_min, self.srtt + RTO_K * self.rttvar)

    def sample(self, sample: float) -> None:
        if self.srtt is None:
            self.srtt = sample
            self.rttvar = sample / 2
        else:
            self.rttvar = (1 - RTT_BETA) * self.rttvar + RTT_BETA * abs(self.srtt - sample)
            self.srtt = (1 - RTT_ALPHA) * self.srtt + RTT_ALPHA * sample

    def on_nak(self, position: int, now: float) -> None:
        """A NAK for the gap at `position` went out: time the first, spoil on the second."""
        self.naked[position] = now if position not in self.naked else None

    def on_repair(self, position: int, now: float) -> None:
        """New data at `position` arrived (call only while `naked` is not empty)."""
        nak_time = self.naked.pop(position, None)
        if nak_time is not None:
            self.sample(now - nak_time)

    def forget_below(self, position: int) -> None:
        """Gaps before `position` are gone (filled, or passed by)."""
        naked = self.naked
        if naked:
            for start in [start for start in naked if start < position]:
                del naked[start]


class LossDetector:
    """The gaps between an image's rebuild position and its high-water mark, each with the
    time it is to be NAKed next."""

    __slots__ = ("_group", "_rng", "_timers", "dirty", "gaps", "repair")

    def __init__(
        self, timers: ReceiverTimers, rng: random.Random, is_group: bool, repair: RepairTimer
    ) -> None:
        self._timers = timers
        self._rng = rng
        self._group = is_group
        self.repair = repair
        #: known gaps -> when to NAK them next; rescanned only after new data (`dirty`)
        self.gaps: dict[Gap, float] = {}
        self.dirty = False

    def delay(self, first: bool) -> float:
        """How long a gap waits before its first NAK, or after a NAK before the next."""
        if self._group:
            timers = self._timers
            return group_nak_delay(self._rng, timers.group_nak_max_backoff, timers.group_size)
        if first:
            return self._timers.nak_delay
        return self.repair.retry_delay()

    def scan(
        self,
        log: TermBuffers,
        bits: int,
        position: int,
        end: int,
        now: float,
    ) -> None:
        """Find up to MAX_GAPS gaps in `terms` from `position` (the rebuild position) up to
        `end`.

        Aeron's LossDetector NAKs one gap at a time; under heavy loss that costs a round trip
        per gap, so every gap in the window gets its own NAK timer here. A gap seen before
        keeps its time; what is left of a gap being repaired (the resend has partly arrived)
        keeps its parent's, instead of being NAKed again at once.
        """
        term_length = 1 << bits
        mask = term_length - 1
        rebuild_position = position
        gaps: dict[Gap, float] = {}
        previous = self.gaps
        naked = self.repair.naked
        while position < end and len(gaps) < MAX_GAPS:
            index = (position >> bits) % PARTITION_COUNT
            offset = position & mask
            limit = min(term_length, offset + (end - position))
            found = scan_for_gap(log.terms[index], log.lengths[index], offset, limit)
            if found is None:
                if limit < term_length:
                    break
                position += term_length - offset
                continue
            gap_offset, gap_length = found
            gap = (position - offset + gap_offset, gap_length)
            deadline = previous.get(gap)
            if deadline is None:
                parent = _enclosing(previous, gap) if previous else None
                if parent is None:
                    deadline = now + self.delay(first=True)
                else:
                    deadline = previous[parent]
                    if parent[0] in naked:
                        naked[gap[0]] = None  # a remnant's repair times nothing
            gaps[gap] = deadline
            position = gap[0] + gap_length
        self.gaps = gaps
        self.dirty = False
        self.repair.forget_below(rebuild_position)

    def due(self, now: float) -> list[Gap]:
        """The gaps whose NAK (or, unreliable, whose padding) is due."""
        return [gap for gap, deadline in self.gaps.items() if now >= deadline]

    def nak_sent(self, gap: Gap, sent: bool, now: float) -> None:
        """The gap's NAK went out (`sent`), or could not: either way it waits for a retry."""
        if sent:
            self.repair.on_nak(gap[0], now)
        self.gaps[gap] = now + self.delay(first=False)

    def filled(self, gap: Gap) -> None:
        """The gap was padded over (reliable=false): forget it and rescan."""
        del self.gaps[gap]
        self.dirty = True

    def next_deadline(self) -> float:
        return min(self.gaps.values(), default=math.inf)

    def clear(self) -> None:
        if self.gaps:
            self.gaps = {}


def _enclosing(gaps: dict[Gap, float], gap: Gap) -> Gap | None:
    """The gap of `gaps` that contains all of `gap`, if any (there are at most MAX_GAPS)."""
    start, length = gap
    for key in gaps:
        if key[0] <= start and start + length <= key[0] + key[1]:
            return key
    return None
