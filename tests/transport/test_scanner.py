"""Unit tests of scanner.py: the sender's scan of its log for whole frames to put in datagrams
(Aeron's TermScanner), the runs of equal datagrams handed over at once (UDP GSO), and whether
the next frame fits the flow-control window.

The log is written by the publication's own appender; each test states the frames (by their
aligned length) and checks the datagrams `emit` is handed, byte for byte where it matters.
The last tests hold the scanner's cut of the appender's run of frames of one length
(`_cut_run`) to the scan that reads every frame: the same datagrams and runs, wherever sending
starts and stops.
"""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from echo.transport.core.appender import LogAppender
from echo.transport.core.scanner import TermScanner

TERM = 64 * 1024
WOULD_BLOCK = -1  # publication.WOULD_BLOCK: the socket buffer is full


def log_of(frames: list[int], *, mtu: int = 1408, term_length: int = TERM) -> LogAppender:
    """A publication's log holding one unfragmented message per entry of `frames`, each a
    frame of that (aligned) length, every message of other bytes."""
    log = LogAppender(
        session_id=7, stream_id=1001, initial_term_id=0, term_length=term_length, mtu=mtu
    )
    for i, frame in enumerate(frames):
        log.append(bytes([i % 251 + 1]) * (frame - 32))
    return log


def scanner_of(log: LogAppender, mtu: int, run_segments: int = 0) -> TermScanner:
    scanner = TermScanner(log, mtu)
    if run_segments:
        scanner.run_segments = run_segments
    return scanner


class Wire:
    """An `emit` that records what it is handed, as (bytes, segment), and answers as a socket
    would: `copies` per datagram that left (one per destination), or WOULD_BLOCK once `room`
    calls have been taken."""

    def __init__(self, copies: int = 1, room: int = 1 << 30) -> None:
        self.copies = copies
        self.room = room
        self.calls: list[tuple[bytes, int]] = []

    def __call__(self, datagram: bytes | memoryview, segment: int = 0) -> int:
        if len(self.calls) >= self.room:
            return WOULD_BLOCK
        data = bytes(datagram)
        self.calls.append((data, segment))
        datagrams = -(-len(data) // segment) if segment else 1
        return datagrams * self.copies

    @property
    def shape(self) -> list[tuple[int, int]]:
        """Each call as (bytes handed over, segment): segment 0 is a single datagram."""
        return [(len(data), segment) for data, segment in self.calls]

    @property
    def datagrams(self) -> list[bytes]:
        """The datagrams on the wire, runs cut at their segments."""
        out: list[bytes] = []
        for data, segment in self.calls:
            step = segment or len(data)
            out.extend(data[start : start + step] for start in range(0, len(data), step))
        return out


def test_a_new_scanner_has_put_nothing_on_the_wire_and_is_not_blocked() -> None:
    # What a driver may read before the first send (to wait for a writable socket, say).
    scanner = scanner_of(log_of([64]), mtu=192)
    assert scanner.wire_datagrams == 0 and not scanner.blocked


def test_a_datagram_is_as_many_whole_frames_as_fit_in_the_mtu() -> None:
    log = log_of([64] * 7)
    wire = Wire()
    scanner = scanner_of(log, mtu=192)  # a new scanner: one datagram at a time
    assert scanner.send(0, 448, wire) == 448
    term = bytes(log.log.terms[0])
    assert wire.calls == [(term[0:192], 0), (term[192:384], 0), (term[384:448], 0)]
    assert scanner.wire_datagrams == 3 and not scanner.blocked


def test_the_end_stops_the_scan_after_the_last_whole_frame_before_it() -> None:
    # The flow-control limit falls inside the fourth frame after `position`: only whole
    # frames go, and the scan reports where it stopped.
    log = log_of([64] * 10)
    wire = Wire()
    assert scanner_of(log, mtu=192).send(64, 64 + 3 * 64 + 32, wire) == 256
    assert wire.calls == [(bytes(log.log.terms[0][64:256]), 0)]


def test_a_run_stops_after_the_last_whole_datagram_before_the_end() -> None:
    # Datagrams of three frames; the end falls inside the second one: it waits, and the
    # first goes alone (a run is never a single datagram).
    log = log_of([64] * 12)
    wire = Wire()
    assert scanner_of(log, mtu=192, run_segments=64).send(64, 64 + 192 + 32, wire) == 256
    assert wire.shape == [(192, 0)]
    # The end inside the third: a run of two.
    wire = Wire()
    assert scanner_of(log, mtu=192, run_segments=64).send(64, 64 + 384 + 32, wire) == 448
    assert wire.shape == [(384, 192)]


def test_a_run_of_full_datagrams_stops_at_the_end() -> None:
    # Full-size fragments, one per datagram; the end falls inside the third.
    log = log_of([1408] * 5)
    wire = Wire()
    assert scanner_of(log, mtu=1408, run_segments=64).send(0, 2 * 1408 + 100, wire) == 2816
    assert wire.shape == [(2816, 1408)]
    assert wire.datagrams == [bytes(log.log.terms[0][i : i + 1408]) for i in (0, 1408)]


def test_wire_datagrams_counts_every_copy_that_left() -> None:
    # Two destinations: each datagram leaves twice.
    log = log_of([64] * 7)
    scanner = scanner_of(log, mtu=192)
    assert scanner.send(0, 448, Wire(copies=2)) == 448
    assert scanner.wire_datagrams == 6
    # In runs, each datagram of the run counts.
    scanner = scanner_of(log, mtu=192, run_segments=64)
    assert scanner.send(0, 448, Wire(copies=2)) == 448
    assert scanner.wire_datagrams == 6
    # And it is what the last send put on the wire, not a running total.
    assert scanner.send(448, 448, Wire()) == 448
    assert scanner.wire_datagrams == 0


def test_a_datagram_no_destination_took_still_moves_the_scan_on() -> None:
    # emit answers 0 when there is no destination yet: nothing is on the wire but the socket
    # is not full either, so the sender goes on (Aeron sends to no one).
    log = log_of([64] * 7)
    scanner = scanner_of(log, mtu=192)
    wire = Wire(copies=0)
    assert scanner.send(0, 448, wire) == 448
    assert len(wire.calls) == 3
    assert scanner.wire_datagrams == 0 and not scanner.blocked


def test_a_full_socket_stops_the_scan_at_the_datagram_it_refused() -> None:
    log = log_of([64] * 7)
    scanner = scanner_of(log, mtu=192)
    assert scanner.send(0, 448, Wire(room=1)) == 192
    assert scanner.blocked and scanner.wire_datagrams == 1
    # Once the socket drains, the scan resumes there and is no longer blocked.
    wire = Wire()
    assert scanner.send(192, 448, wire) == 448
    assert not scanner.blocked
    assert wire.datagrams == [bytes(log.log.terms[0][192:384]), bytes(log.log.terms[0][384:448])]


def test_one_scan_sends_at_most_512_datagrams() -> None:
    log = log_of([64] * 600)
    wire = Wire()
    assert scanner_of(log, mtu=64).send(0, 600 * 64, wire) == 512 * 64
    assert len(wire.calls) == 512


def test_the_512_datagrams_of_a_scan_count_those_in_runs() -> None:
    log = log_of([64] * 600)
    wire = Wire()
    assert scanner_of(log, mtu=64, run_segments=64).send(0, 600 * 64, wire) == 512 * 64
    assert wire.shape == [(64 * 64, 64)] * 8


def test_a_run_is_at_most_run_segments_datagrams() -> None:
    log = log_of([1408] * 10)
    wire = Wire()
    assert scanner_of(log, mtu=1408, run_segments=4).send(0, 10 * 1408, wire) == 10 * 1408
    assert wire.shape == [(4 * 1408, 1408), (4 * 1408, 1408), (2 * 1408, 1408)]
    # Two is the shortest run there is.
    wire = Wire()
    assert scanner_of(log, mtu=1408, run_segments=2).send(0, 5 * 1408, wire) == 5 * 1408
    assert wire.shape == [(2 * 1408, 1408), (2 * 1408, 1408), (1408, 0)]


def test_datagrams_of_several_frames_run_and_a_shorter_one_ends_the_run() -> None:
    # Frames of 64 in datagrams of 192: three full datagrams, then two frames that leave no
    # room for the frame of 160 after them.
    log = log_of([64] * 11 + [160])
    wire = Wire()
    assert scanner_of(log, mtu=192, run_segments=64).send(0, 864, wire) == 864
    assert wire.shape == [(704, 192), (160, 0)]
    term = bytes(log.log.terms[0])
    cuts = [0, 192, 384, 576, 704, 864]
    assert wire.datagrams == [term[a:b] for a, b in pairwise(cuts)]


def test_runs_of_datagrams_of_several_frames_are_at_most_run_segments_long() -> None:
    log = log_of([64] * 15)
    wire = Wire()
    assert scanner_of(log, mtu=192, run_segments=3).send(0, 15 * 64, wire) == 15 * 64
    assert wire.shape == [(3 * 192, 192), (2 * 192, 192)]


def test_a_longer_datagram_is_not_part_of_the_run_before_it() -> None:
    # 96 alone (96 + 160 > 224), then 160 alone, then 192: each longer than the one before.
    log = log_of([96, 160, 192])
    wire = Wire()
    assert scanner_of(log, mtu=224, run_segments=64).send(0, 448, wire) == 448
    assert wire.shape == [(96, 0), (160, 0), (192, 0)]


def test_a_frame_that_leaves_room_for_a_header_does_not_fill_its_datagram_alone() -> None:
    # In an MTU of 192 a frame of 160 leaves room for an empty frame (32 bytes): the second
    # datagram is 160 + 32, longer than the first, so the two are not a run.
    log = log_of([160, 160, 32])
    wire = Wire()
    assert scanner_of(log, mtu=192, run_segments=64).send(0, 352, wire) == 352
    assert wire.shape == [(160, 0), (192, 0)]


def test_a_run_stays_within_one_udp_payload() -> None:
    log = log_of([8192] * 10, mtu=8192, term_length=1 << 20)
    wire = Wire()
    assert scanner_of(log, mtu=8192, run_segments=64).send(0, 10 * 8192, wire) == 10 * 8192
    assert wire.shape == [(7 * 8192, 8192), (3 * 8192, 8192)]  # 7 * 8192 <= 65000 < 8 * 8192


def full_term_then_pad(pad: int) -> LogAppender:
    """A log whose first term is frames of 1024 bytes up to a PAD of `pad` bytes at its end,
    then, in the second term, one frame of 64."""
    log = log_of([1024] * ((TERM - pad) // 1024), mtu=1024)
    assert log.tail_offset == TERM - pad
    log.pad_and_rotate()
    log.append(bytes(32))
    return log


def test_a_pad_goes_as_its_header_and_the_scan_goes_on_in_the_next_term() -> None:
    log = full_term_then_pad(pad=2048)
    wire = Wire()
    pad = TERM - 2048
    assert scanner_of(log, mtu=1024).send(pad - 1024, TERM + 64, wire) == TERM + 64
    term = bytes(log.log.terms[0])
    # The frame before the PAD, the PAD's header only (the rest is skipped), the next term.
    assert wire.datagrams == [
        term[pad - 1024 : pad],
        term[pad : pad + 32],
        bytes(log.log.terms[1][:64]),
    ]
    assert [segment for _, segment in wire.calls] == [0, 0, 0]


def test_a_pad_the_length_of_a_full_datagram_is_not_one_of_the_run() -> None:
    # The last frame of the term is a PAD exactly as long as the full datagrams before it: it
    # still goes as its header alone, after the run.
    log = full_term_then_pad(pad=1024)
    wire = Wire()
    scanner = scanner_of(log, mtu=1024, run_segments=64)
    assert scanner.send(10 * 1024, TERM + 64, wire) == TERM + 64
    pad = TERM - 1024
    assert wire.shape == [(pad - 10 * 1024, 1024), (32, 0), (64, 0)]
    assert wire.calls[1][0] == bytes(log.log.terms[0][pad : pad + 32])


def test_the_next_frame_fits_only_a_room_as_long_as_it() -> None:
    # In the second term, to tell its partition from the others.
    log = log_of([64] * 2)
    log.pad_and_rotate()
    log.append(bytes(32))
    log.append(bytes(128))  # a frame of 160 at TERM + 64
    scanner = scanner_of(log, mtu=1408)
    assert scanner.next_frame_fits(TERM + 64, 160)
    assert scanner.next_frame_fits(TERM + 64, 1 << 20)  # bounded by the MTU
    assert not scanner.next_frame_fits(TERM + 64, 159)
    assert not scanner.next_frame_fits(TERM + 224, 1408)  # nothing appended there yet


# ---------------------------------------------- the appender's run, cut without reading it

TERM_LENGTH = 1 << 18

Sent = tuple[int, list[tuple[bytes, int]], int, bool]


def send(scanner: TermScanner, position: int, end: int, refuse_after: int) -> Sent:
    """What `scanner.send` puts out from `position` to `end`: the position reached, the
    datagrams or runs (with their segment), the wire count and whether it was blocked (the
    emit refuses after `refuse_after` calls, as a full socket buffer would)."""
    out: list[tuple[bytes, int]] = []

    def emit(datagram: bytes | memoryview, segment: int = 0) -> int:
        if len(out) >= refuse_after:
            return -1
        out.append((bytes(datagram), segment))
        return 1

    reached = scanner.send(position, end, emit)
    return reached, out, scanner.wire_datagrams, scanner.blocked


def send_reading(scanner: TermScanner, position: int, end: int, refuse_after: int) -> Sent:
    """`send` with the appender's run hidden: every frame read."""
    appender = scanner.appender
    kept = appender.run_offset
    appender.run_offset = appender.tail_offset + 1  # no offset is in the run
    try:
        return send(scanner, position, end, refuse_after)
    finally:
        appender.run_offset = kept


@settings(max_examples=200, deadline=None)
@given(
    mtu=st.sampled_from([96, 192, 512, 1408, 4096]),
    run_segments=st.sampled_from([0, 1, 2, 3, 64]),
    # Runs of messages of one length (now and then a fragmented one), each maybe sent early.
    groups=st.lists(
        st.tuples(st.sampled_from([0, 1, 33, 64, 200, 1300, 5000]), st.integers(1, 300)),
        max_size=10,
    ),
    data=st.data(),
)
def test_the_run_is_cut_as_the_scan_reads_it(
    mtu: int, run_segments: int, groups: list[tuple[int, int]], data: st.DataObject
) -> None:
    appender = LogAppender(
        session_id=7, stream_id=9, initial_term_id=5, term_length=TERM_LENGTH, mtu=mtu
    )
    scanner = TermScanner(appender, mtu)
    scanner.run_segments = run_segments
    sent = 0
    sizes = [size for size, repeat in groups for _ in range(repeat)]
    sends = set(data.draw(st.lists(st.integers(0, len(sizes)), max_size=8)))
    for index, size in enumerate(sizes):
        message = bytes([index % 251]) * size
        if not appender.fits(appender.required(size)):
            appender.pad_and_rotate()
        appender.append(message)
        if index not in sends and index != len(sizes) - 1:
            continue
        tail = appender.position
        # New data up to a limit that may fall anywhere (flow control), maybe refused midway.
        end = data.draw(st.integers(sent, tail))
        refuse_after = data.draw(st.sampled_from([1, 2, 1000]))
        expected = send_reading(scanner, sent, end, refuse_after)
        assert send(scanner, sent, end, refuse_after) == expected
        sent = expected[0]
        # A resend from anywhere still in the log (a NAK's offset need not be a frame's).
        oldest = max(0, (appender.term_count - 1) * TERM_LENGTH)
        start = data.draw(st.integers(min(oldest, sent), sent))
        end = data.draw(st.integers(start, sent))
        assert send(scanner, start, end, 1000) == send_reading(scanner, start, end, 1000)


def test_a_run_stops_at_the_most_one_system_call_takes() -> None:
    appender = LogAppender(
        session_id=7, stream_id=9, initial_term_id=5, term_length=TERM_LENGTH, mtu=1408
    )
    scanner = TermScanner(appender, 1408)
    scanner.run_segments = 64
    for index in range(100):
        appender.append(bytes([index]) * 1300)  # a datagram each (1,344 bytes)
    reached, out, _, _ = expected = send_reading(scanner, 0, appender.position, 1000)
    assert send(scanner, 0, appender.position, 1000) == expected
    assert reached == appender.position
    assert [len(run) // segment for run, segment in out] == [48, 48, 4]  # 48 x 1,344 <= 65,000
