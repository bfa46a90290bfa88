"""Unit tests of loss.py: the repair-time estimator and the gap detector, on real term buffers."""

from __future__ import annotations

import math
import random

import pytest

from echo.transport.core.config import ReceiverTimers
from echo.transport.core.frames import UNFRAGMENTED_FLAGS, FrameType
from echo.transport.core.logbuffer import (
    TermBuffers,
    insert_packet,
    position_bits_to_shift,
    write_frame,
)
from echo.transport.core.loss import MAX_GAPS, LossDetector, RepairTimer, group_nak_delay

TERM = 64 * 1024
BITS = position_bits_to_shift(TERM)
FRAME = 160  # a 100-byte message: 32-byte header + payload, aligned to 32
TIMERS = ReceiverTimers()


def frame(index: int) -> bytes:
    """The `index`-th 160-byte DATA frame of term 0, as it arrives off the wire."""
    scratch = memoryview(bytearray(FRAME))
    write_frame(
        scratch,
        0,
        flags=UNFRAGMENTED_FLAGS,
        frame_type=FrameType.DATA,
        session_id=1,
        stream_id=2,
        term_id=0,
        payload=bytes([index % 256]) * (FRAME - 32),
    )
    packet = bytearray(scratch)
    packet[8:12] = (index * FRAME).to_bytes(4, "little")  # the frame's term offset
    return bytes(packet)


def terms_with(received: list[int]) -> TermBuffers:
    log = TermBuffers(TERM)
    for index in received:
        assert insert_packet(log.terms[0], log.lengths[0], index * FRAME, frame(index))
    return log


def detector(group: bool = False, seed: int = 1) -> LossDetector:
    return LossDetector(TIMERS, random.Random(seed), group, RepairTimer(TIMERS))


# ------------------------------------------------------------------ the repair timer


def test_retries_wait_aerons_fixed_delay_until_a_repair_is_measured() -> None:
    timer = RepairTimer(TIMERS)
    assert timer.retry_delay() == pytest.approx(TIMERS.nak_delay * TIMERS.nak_retry_ratio)


def test_the_repair_time_is_smoothed_as_tcp_smooths_rtt() -> None:
    timer = RepairTimer(TIMERS)
    timer.sample(0.002)
    # first sample: srtt = R, rttvar = R / 2; retry = srtt + 4 rttvar (RFC 6298 §2.2)
    assert timer.retry_delay() == pytest.approx(0.002 + 4 * 0.001)
    timer.sample(0.004)
    rttvar = 0.75 * 0.001 + 0.25 * abs(0.002 - 0.004)
    srtt = 0.875 * 0.002 + 0.125 * 0.004
    assert timer.retry_delay() == pytest.approx(srtt + 4 * rttvar)


def test_retries_never_come_sooner_than_the_minimum() -> None:
    timer = RepairTimer(TIMERS)
    timer.sample(0.00001)
    assert timer.retry_delay() == TIMERS.nak_retry_min


def test_a_repair_after_one_nak_is_timed_from_that_nak() -> None:
    timer = RepairTimer(TIMERS)
    timer.on_nak(320, now=1.0)
    timer.on_repair(320, now=1.003)
    assert timer.srtt == pytest.approx(0.003)
    assert 320 not in timer.naked


def test_karn_a_gap_naked_twice_times_nothing() -> None:
    timer = RepairTimer(TIMERS)
    timer.on_nak(320, now=1.0)
    timer.on_nak(320, now=1.01)
    timer.on_repair(320, now=1.011)
    assert timer.srtt is None


def test_data_elsewhere_is_no_repair() -> None:
    timer = RepairTimer(TIMERS)
    timer.on_nak(320, now=1.0)
    timer.on_repair(480, now=1.002)
    assert timer.srtt is None and timer.naked == {320: 1.0}


def test_gaps_left_behind_are_forgotten() -> None:
    timer = RepairTimer(TIMERS)
    timer.on_nak(160, now=1.0)
    timer.on_nak(640, now=1.0)
    timer.forget_below(480)
    assert timer.naked == {640: 1.0}


# ------------------------------------------------------------------ the loss detector


def test_a_gap_is_found_and_first_naked_after_the_nak_delay() -> None:
    loss = detector()
    terms = terms_with([0, 2, 3])
    loss.dirty = True
    loss.scan(terms, BITS, FRAME, 4 * FRAME, now=5.0)
    assert loss.gaps == {(FRAME, FRAME): pytest.approx(5.0 + TIMERS.nak_delay)}
    assert not loss.dirty
    assert loss.due(5.0) == []
    assert loss.due(5.0 + TIMERS.nak_delay) == [(FRAME, FRAME)]
    assert loss.next_deadline() == pytest.approx(5.0 + TIMERS.nak_delay)


def test_no_gap_when_everything_arrived_and_none_past_the_end() -> None:
    loss = detector()
    loss.scan(terms_with([0, 1, 2, 3]), BITS, 0, 4 * FRAME, now=0.0)
    assert loss.gaps == {}
    # A gap beyond `end` (the window past the rebuild position) is not looked for.
    loss.scan(terms_with([0, 1, 3]), BITS, 0, 2 * FRAME, now=0.0)
    assert loss.gaps == {}


def test_a_naked_gap_waits_for_the_retry_delay_and_is_timed() -> None:
    loss = detector()
    loss.scan(terms_with([0, 2]), BITS, FRAME, 3 * FRAME, now=0.0)
    gap = (FRAME, FRAME)
    loss.nak_sent(gap, True, now=1.0)
    assert loss.gaps[gap] == pytest.approx(1.0 + loss.repair.retry_delay())
    assert loss.repair.naked == {FRAME: 1.0}
    # A NAK that could not be sent (the socket was full) retries as late, but times nothing.
    other = detector()
    other.scan(terms_with([0, 2]), BITS, FRAME, 3 * FRAME, now=0.0)
    other.nak_sent(gap, False, now=1.0)
    assert other.repair.naked == {} and other.gaps[gap] == pytest.approx(1.01)


def test_a_known_gap_keeps_its_time_across_rescans() -> None:
    loss = detector()
    terms = terms_with([0, 3])
    loss.scan(terms, BITS, FRAME, 4 * FRAME, now=0.0)
    loss.nak_sent((FRAME, 2 * FRAME), True, now=0.5)
    deadline = loss.gaps[(FRAME, 2 * FRAME)]
    loss.scan(terms, BITS, FRAME, 4 * FRAME, now=0.6)  # new data elsewhere, same gap
    assert loss.gaps == {(FRAME, 2 * FRAME): deadline}


def test_the_rest_of_a_gap_being_repaired_keeps_the_gaps_retry_time() -> None:
    loss = detector()
    loss.scan(terms_with([0, 3]), BITS, FRAME, 4 * FRAME, now=0.0)
    loss.nak_sent((FRAME, 2 * FRAME), True, now=0.5)
    deadline = loss.gaps[(FRAME, 2 * FRAME)]
    # The first half of the resend arrives: the rebuild position moves past it.
    loss.scan(terms_with([0, 1, 3]), BITS, 2 * FRAME, 4 * FRAME, now=0.501)
    assert loss.gaps == {(2 * FRAME, FRAME): deadline}
    # ... and the remnant's repair says nothing about the round trip (Karn), the parent's
    # NAK time is forgotten with the parent.
    assert loss.repair.naked == {2 * FRAME: None}


def test_at_most_max_gaps_are_tracked() -> None:
    count = 2 * MAX_GAPS + 10
    loss = detector()
    loss.scan(terms_with(list(range(0, count, 2))), BITS, FRAME, count * FRAME, now=0.0)
    assert len(loss.gaps) == MAX_GAPS
    assert min(loss.gaps) == (FRAME, FRAME)


def test_a_padded_gap_is_forgotten_and_asks_for_a_rescan() -> None:
    loss = detector()
    loss.scan(terms_with([0, 2]), BITS, FRAME, 3 * FRAME, now=0.0)
    loss.filled((FRAME, FRAME))
    assert loss.gaps == {} and loss.dirty


def test_group_gaps_wait_a_random_delay_within_the_backoff() -> None:
    loss = detector(group=True, seed=3)
    loss.scan(terms_with(list(range(0, 40, 2))), BITS, FRAME, 40 * FRAME, now=0.0)
    deadlines = list(loss.gaps.values())
    assert len(deadlines) == 20  # frames 1, 3, ..., 39 are missing
    assert all(0.0 <= d <= TIMERS.group_nak_max_backoff for d in deadlines)
    assert len(set(deadlines)) > 1  # spread out, so one NAK can suppress the rest


def test_group_nak_delay_stays_in_its_bounds() -> None:
    rng = random.Random(7)
    delays = [group_nak_delay(rng, 0.01, 10) for _ in range(1000)]
    assert all(0.0 <= d <= 0.01 for d in delays)
    assert max(delays) - min(delays) > 0.005


class FractionOfRange(random.Random):
    """A stand-in generator: `uniform(a, b)` is `fraction` of the way from a to b."""

    def __init__(self, fraction: float) -> None:
        super().__init__(0)
        self.fraction = fraction

    def uniform(self, a: float, b: float) -> float:
        return a + self.fraction * (b - a)


@pytest.mark.parametrize("group_size", [1, 10])
@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_group_nak_delay_is_the_truncated_exponential_of_aerons_generator(
    fraction: float, group_size: int
) -> None:
    # Aeron's OptimalMulticastDelayGenerator draws x uniformly from
    # [lambda / (T (e^lambda - 1)), that + lambda / T] and waits (T / lambda) ln(x (e^lambda - 1)
    # T / lambda), lambda = ln(group size) + 1: the inverse of the exponential distribution with
    # rate lambda / T cut off at T. A uniform draw u in [0, 1] waits (T / lambda) ln(1 + u
    # (e^lambda - 1)): 0 at u = 0, T at u = 1, most NAKs late so that the first can suppress them.
    backoff = 0.06
    lam = math.log(group_size) + 1.0
    expected = backoff / lam * math.log(1.0 + fraction * (math.exp(lam) - 1.0))
    delay = group_nak_delay(FractionOfRange(fraction), backoff, group_size)
    assert delay == pytest.approx(expected, abs=1e-12)


# ------------------------------------------------------------------ gaps across scans


def test_without_gaps_no_nak_is_ever_due() -> None:
    loss = detector()
    loss.scan(terms_with([0, 1, 2, 3]), BITS, 0, 4 * FRAME, now=0.0)
    assert loss.next_deadline() == math.inf  # the image sleeps on it: no wake-up for nothing
    loss.scan(terms_with([0, 2]), BITS, FRAME, 3 * FRAME, now=0.0)
    assert loss.gaps
    loss.clear()  # the image caught up: what was missing arrived
    assert loss.next_deadline() == math.inf
    assert loss.due(1e9) == []


def test_a_rescan_keeps_a_naked_gaps_repair_timed() -> None:
    loss = detector()
    terms = terms_with([0, 3])
    loss.scan(terms, BITS, FRAME, 4 * FRAME, now=0.0)
    loss.nak_sent((FRAME, 2 * FRAME), True, now=0.5)
    loss.scan(terms, BITS, FRAME, 4 * FRAME, now=0.6)  # new data elsewhere, the same gap
    # It is the gap that was NAKed, not a remnant of it: its repair still times the round trip.
    assert loss.repair.naked == {FRAME: 0.5}


def test_a_new_gap_after_a_known_one_waits_its_own_nak_delay() -> None:
    loss = detector()
    loss.scan(terms_with([0, 2]), BITS, FRAME, 3 * FRAME, now=0.0)
    loss.nak_sent((FRAME, FRAME), True, now=0.5)
    deadline = loss.gaps[(FRAME, FRAME)]
    # Frames 2 and 4 arrived later, frame 3 is lost: a gap of its own, not part of the first.
    loss.scan(terms_with([0, 2, 4]), BITS, FRAME, 5 * FRAME, now=0.7)
    assert loss.gaps == {
        (FRAME, FRAME): deadline,
        (3 * FRAME, FRAME): pytest.approx(0.7 + TIMERS.nak_delay),
    }


def test_a_gap_that_grew_is_naked_afresh() -> None:
    # Tail loss: the sender's heartbeats move the high-water mark on over frames that never
    # came, so the gap at the end grows; its new part has not been NAKed yet (Aeron: a gap
    # whose offset or length changed is a new gap, its timer starts again).
    loss = detector()
    loss.scan(terms_with([0]), BITS, FRAME, 3 * FRAME, now=0.0)
    loss.nak_sent((FRAME, 2 * FRAME), True, now=0.5)
    loss.scan(terms_with([0]), BITS, FRAME, 5 * FRAME, now=0.6)
    assert loss.gaps == {(FRAME, 4 * FRAME): pytest.approx(0.6 + TIMERS.nak_delay)}


def test_what_is_left_when_a_resends_end_arrives_first_keeps_the_gaps_time() -> None:
    loss = detector()
    loss.scan(terms_with([0, 3]), BITS, FRAME, 4 * FRAME, now=0.0)
    loss.nak_sent((FRAME, 2 * FRAME), True, now=0.5)
    deadline = loss.gaps[(FRAME, 2 * FRAME)]
    # The resend's second frame overtook its first: the gap's start is still missing.
    loss.scan(terms_with([0, 2, 3]), BITS, FRAME, 4 * FRAME, now=0.501)
    assert loss.gaps == {(FRAME, FRAME): deadline}


def test_the_middle_of_a_longer_gap_being_repaired_keeps_its_time() -> None:
    loss = detector()
    loss.scan(terms_with([0, 1, 2, 3, 6]), BITS, 4 * FRAME, 7 * FRAME, now=0.0)
    loss.nak_sent((4 * FRAME, 2 * FRAME), True, now=0.5)
    deadline = loss.gaps[(4 * FRAME, 2 * FRAME)]
    loss.scan(terms_with([0, 1, 2, 3, 4, 6]), BITS, 5 * FRAME, 7 * FRAME, now=0.501)
    assert loss.gaps == {(5 * FRAME, FRAME): deadline}
    loss = detector()
    loss.scan(terms_with([0, 4]), BITS, FRAME, 5 * FRAME, now=0.0)
    loss.nak_sent((FRAME, 3 * FRAME), True, now=0.5)
    deadline = loss.gaps[(FRAME, 3 * FRAME)]
    loss.scan(terms_with([0, 1, 4]), BITS, 2 * FRAME, 5 * FRAME, now=0.501)
    assert loss.gaps == {(2 * FRAME, 2 * FRAME): deadline}


def put_frame(log: TermBuffers, index: int, offset: int, length: int) -> None:
    """A received DATA frame of `length` bytes at `offset` of term `index`."""
    write_frame(
        log.terms[index],
        offset,
        flags=UNFRAGMENTED_FLAGS,
        frame_type=FrameType.DATA,
        session_id=1,
        stream_id=2,
        term_id=index,
        payload=bytes(length - 32),
    )


def test_gaps_are_found_in_the_next_term_past_a_complete_rest_of_this_one() -> None:
    log = TermBuffers(TERM)
    put_frame(log, 0, 0, FRAME)  # term 0: frame, gap, then frames up to its end
    put_frame(log, 0, 2 * FRAME, TERM - 2 * FRAME)
    put_frame(log, 1, 0, FRAME)  # term 1: frame, gap, frame
    put_frame(log, 1, 2 * FRAME, FRAME)
    loss = detector()
    loss.scan(log, BITS, FRAME, TERM + 3 * FRAME, now=0.0)
    assert set(loss.gaps) == {(FRAME, FRAME), (TERM + FRAME, FRAME)}
