"""Unit tests of loss.py: the repair-time estimator and the gap detector, on real term buffers."""

from __future__ import annotations

import random

import pytest

from echo.transport.config import ReceiverTimers
from echo.transport.frames import UNFRAGMENTED_FLAGS, FrameType
from echo.transport.logbuffer import TermBuffers, insert_packet, position_bits_to_shift, write_frame
from echo.transport.loss import MAX_GAPS, LossDetector, RepairTimer, group_nak_delay

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
