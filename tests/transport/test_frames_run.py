"""The run check of coalesced datagrams (frames.parse_data_run_untrusted) against a reference
written apart from it, on random runs and random damage."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echo.transport.core.frames import (
    DATA_HEADER_LENGTH,
    DATA_HEADER_STRUCT,
    FRAME_ALIGNMENT,
    FrameError,
    FrameType,
    parse_data_run_untrusted,
    parse_data_untrusted,
)

I32 = st.integers(-(2**31), 2**31 - 1)


def reference(data: bytes, segment: int) -> tuple[int, ...] | None:
    """The check as it was first written (before its locals were typed for mypyc)."""
    length = len(data)
    if segment <= 0 or segment % FRAME_ALIGNMENT or length <= segment:
        return None
    first = DATA_HEADER_STRUCT.unpack_from(data, 0)
    (_, _, flags, _, term_offset, session_id, stream_id, term_id, reserved) = first
    if term_offset < 0 or term_offset % FRAME_ALIGNMENT:
        return None
    offset, boundary, expected = 0, segment, term_offset
    while offset < length:
        if offset + DATA_HEADER_LENGTH > length:
            return None
        (fl, version, _, ftype, toff, sid, strm, tid, _) = DATA_HEADER_STRUCT.unpack_from(
            data, offset
        )
        if (
            version != 0
            or ftype != FrameType.DATA
            or fl < DATA_HEADER_LENGTH
            or toff != expected
            or (sid, strm, tid) != (session_id, stream_id, term_id)
        ):
            return None
        step = (fl + 31) & ~31
        offset += step
        expected += step
        if offset > boundary and boundary < length:
            return None
        if offset == boundary:
            boundary += segment
    if offset != length:
        return None
    return (first[0], flags, FrameType.DATA, term_offset, session_id, stream_id, term_id, reserved)


@st.composite
def runs(draw: st.DrawFn) -> tuple[bytes, int]:
    """A valid run (or a near miss): datagrams of whole frames, then maybe one damaged byte."""
    session, stream, term = draw(I32), draw(I32), draw(I32)
    # (up to the last offsets an int32 holds: the uniform check reads offsets and sessions as
    # one int64 and must not let an offset past 2**31 - 1 pass)
    term_offset = draw(st.integers(0, 2**20) | st.integers(2**26 - 64, 2**26 - 1)) * FRAME_ALIGNMENT
    if draw(st.booleans()):
        # One stream's messages of one size: the uniform check's case (_is_uniform_chain).
        payloads = [draw(st.integers(0, 200))] * draw(st.integers(2, 40))
    else:
        payloads = draw(st.lists(st.integers(0, 200), min_size=2, max_size=12))
    frames = []
    offset = term_offset
    for size in payloads:
        frame = bytearray((DATA_HEADER_LENGTH + size + 31) & ~31)
        DATA_HEADER_STRUCT.pack_into(
            frame, 0, DATA_HEADER_LENGTH + size, 0, 0xC0, FrameType.DATA,
            (offset + 2**31) % 2**32 - 2**31, session,  # (past 2**31 - 1 it wraps, as an int32)
            stream, term, draw(st.integers(-5, 5)),
        )
        frames.append(bytes(frame))
        offset += len(frame)
    data = bytearray(b"".join(frames))
    segment = draw(
        st.sampled_from([len(frames[0]), 2 * len(frames[0]), 32, 64, 96, 128, 1408, len(data) // 2])
    )
    if draw(st.booleans()):
        # Damage one byte of some header (or anywhere): the two checks must still agree.
        where = draw(st.integers(0, len(data) - 1))
        data[where] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        data += bytes(draw(st.integers(0, 40)))  # trailing bytes, aligned or not
    return bytes(data), segment


@settings(max_examples=400, deadline=None)
@given(runs())
def test_the_run_check_agrees_with_a_header_by_header_reference(case: tuple[bytes, int]) -> None:
    data, segment = case
    assert parse_data_run_untrusted(data, segment) == reference(data, segment)
    assert parse_data_run_untrusted(memoryview(bytearray(data)), segment) == reference(
        data, segment
    )


def test_a_frame_length_with_its_sign_bit_set_is_no_run() -> None:
    first = DATA_HEADER_STRUCT.pack(64, 0, 0xC0, 1, 0, -1, -2, -3, 0) + bytes(32)
    second = DATA_HEADER_STRUCT.pack(-64, 0, 0xC0, 1, 64, -1, -2, -3, 0) + bytes(32)
    assert parse_data_run_untrusted(first + second, 64) is None
    good = DATA_HEADER_STRUCT.pack(64, 0, 0xC0, 1, 64, -1, -2, -3, 0) + bytes(32)
    assert parse_data_run_untrusted(first + good, 64) == (64, 0xC0, 1, 0, -1, -2, -3, 0)


def reference_datagram(data: bytes) -> object:
    """parse_data_untrusted as first written (frame by frame): the fields, None, or the
    FrameError's reason."""
    length = len(data)
    if length < DATA_HEADER_LENGTH:
        return None
    first = DATA_HEADER_STRUCT.unpack_from(data, 0)
    (_, version, flags, frame_type, term_offset, session_id, stream_id, term_id, reserved) = first
    if version != 0 or frame_type not in (FrameType.DATA, FrameType.PAD):
        return None
    if length % FRAME_ALIGNMENT:
        return "bad_alignment"
    if term_offset < 0 or term_offset % FRAME_ALIGNMENT:
        return "bad_field" if term_offset < 0 else "bad_alignment"
    if frame_type == FrameType.DATA and first[0] == 0:
        return first[:1] + first[2:] if length == DATA_HEADER_LENGTH else "bad_data_chain"
    offset, expected = 0, term_offset
    while offset < length:
        (fl, version, _, ftype, toff, sid, strm, tid, _) = DATA_HEADER_STRUCT.unpack_from(
            data, offset
        )
        if offset and (
            version != 0
            or ftype not in (FrameType.DATA, FrameType.PAD)
            or (sid, strm, tid) != (session_id, stream_id, term_id)
            or toff != expected
        ):
            return "bad_version" if version != 0 else "bad_data_chain"
        if fl < DATA_HEADER_LENGTH:
            return "length_mismatch"
        if ftype == FrameType.DATA:
            step = (fl + 31) & ~31
            if offset + step > length:
                return "length_mismatch"
        elif fl % FRAME_ALIGNMENT or offset + DATA_HEADER_LENGTH != length:
            return "bad_alignment" if fl % FRAME_ALIGNMENT else "bad_data_chain"
        else:
            step = DATA_HEADER_LENGTH
        offset += step
        expected += step
    return (first[0], flags, frame_type, term_offset, session_id, stream_id, term_id, reserved)


@settings(max_examples=400, deadline=None)
@given(runs())
def test_a_datagrams_chain_check_agrees_with_a_frame_by_frame_reference(
    case: tuple[bytes, int],
) -> None:
    data, _ = case
    try:
        outcome: object = parse_data_untrusted(data)
    except FrameError as error:
        outcome = error.reason
    assert outcome == reference_datagram(data)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        (8, 4096 + 96 * 5 + 32),  # term offset
        (8, 4096 + 96 * 4),
        (12, 8),  # session
        (16, 1002),  # stream
        (20, -4),  # term
        (0, 20),  # frame length
        (4, 0x0200C000),  # type
    ],
)
def test_one_frame_unlike_the_others_in_a_run_of_one_length_breaks_it(
    field: int, value: int
) -> None:
    """A run of 14 frames of 96 bytes (the uniform check's case) in which the sixth has another
    term offset, session, stream, term or length: no run, and no valid datagram."""
    frames = bytearray()
    for k in range(14):
        frames += DATA_HEADER_STRUCT.pack(96, 0, 0xC0, 1, 4096 + 96 * k, 7, 1001, -5, 0)
        frames += bytes(64)
    assert parse_data_run_untrusted(bytes(frames), 96 * 7) == (96, 0xC0, 1, 4096, 7, 1001, -5, 0)
    assert parse_data_untrusted(bytes(frames)) == (96, 0xC0, 1, 4096, 7, 1001, -5, 0)
    struct.pack_into("<i", frames, 96 * 5 + field, value)
    assert parse_data_run_untrusted(bytes(frames), 96 * 7) is None
    with pytest.raises(FrameError):
        parse_data_untrusted(bytes(frames))
