"""The term scanner's cut of the appender's run of frames of one length (scanner.py
`_cut_run`): the datagrams and runs it makes without reading the frames must be exactly the
ones the scan that reads them makes, wherever sending starts and stops."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from echo.transport.appender import LogAppender
from echo.transport.scanner import TermScanner

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
