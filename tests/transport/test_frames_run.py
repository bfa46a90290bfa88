"""The run check of coalesced datagrams (frames.parse_data_run_untrusted) against a reference
written apart from it, on random runs and random damage."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from echo.transport.frames import (
    DATA_HEADER_LENGTH,
    DATA_HEADER_STRUCT,
    FRAME_ALIGNMENT,
    FrameType,
    parse_data_run_untrusted,
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
    term_offset = draw(st.integers(0, 2**20)) * FRAME_ALIGNMENT
    payloads = draw(st.lists(st.integers(0, 200), min_size=2, max_size=12))
    frames = []
    offset = term_offset
    for size in payloads:
        frame = bytearray((DATA_HEADER_LENGTH + size + 31) & ~31)
        DATA_HEADER_STRUCT.pack_into(
            frame, 0, DATA_HEADER_LENGTH + size, 0, 0xC0, FrameType.DATA, offset, session,
            stream, term, draw(st.integers(-5, 5)),
        )
        frames.append(bytes(frame))
        offset += len(frame)
    data = bytearray(b"".join(frames))
    segment = draw(st.sampled_from([len(frames[0]), 32, 64, 96, 128, 1408, len(data) // 2]))
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
