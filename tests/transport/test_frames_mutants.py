"""Frame codec rules that mutation testing (./dev mutate frames wireformat) showed no fast test
held (the records and encoders are wireformat.py's, the untrusted decoders frames.py's).

The receiver's two fast paths, `parse_data_untrusted` and `parse_data_run_untrusted` (UDP GRO),
were only exercised through the sender and the driver; here each of their checks is held on
its own. The rest pins what a drop-counter reason alone does not: the words an operator reads.
"""

from __future__ import annotations

import struct

import pytest

from echo.transport.core.frames import (
    COMMON_HEADER_STRUCT,
    DATA_HEADER_STRUCT,
    ERR_HAS_GROUP_TAG_FLAG,
    ERR_STRUCT,
    MAX_ERROR_MESSAGE_LENGTH,
    UNFRAGMENTED_FLAGS,
    DataHeader,
    ErrorFrame,
    FrameError,
    FrameType,
    Nak,
    ResponseSetup,
    Rttm,
    Setup,
    StatusMessage,
    iter_data_frames_untrusted,
    parse_data_run_untrusted,
    parse_data_untrusted,
    parse_datagram_untrusted,
)

SESSION, STREAM, TERM = 7, 1001, 3


def frame(
    length: int,
    term_offset: int,
    *,
    flags: int = UNFRAGMENTED_FLAGS,
    frame_type: int = FrameType.DATA,
    version: int = 0,
    session: int = SESSION,
    stream: int = STREAM,
    term: int = TERM,
    reserved: int = 0,
) -> bytes:
    """One frame: header plus zero payload, padded to 32 (a PAD is its header alone)."""
    header = DATA_HEADER_STRUCT.pack(
        length, version, flags, frame_type, term_offset, session, stream, term, reserved
    )
    if frame_type == FrameType.PAD or length < 32:
        return header
    return header + bytes(((length + 31) & ~31) - 32)


def run(frame_lengths: list[int], term_offset: int = 0) -> bytes:
    data = b""
    offset = term_offset
    for length in frame_lengths:
        data += frame(length, offset)
        offset += (length + 31) & ~31
    return data


# ------------------------------------------------------------------ parse_data_untrusted


def test_the_fast_path_returns_the_first_headers_fields() -> None:
    wire = frame(100, 64, flags=0x80, reserved=-5) + frame(40, 192, flags=0x40)
    assert parse_data_untrusted(wire) == (100, 0x80, FrameType.DATA, 64, SESSION, STREAM, TERM, -5)
    pad = frame(4096, 128, frame_type=FrameType.PAD)
    assert parse_data_untrusted(pad) == (4096, 0xC0, FrameType.PAD, 128, SESSION, STREAM, TERM, 0)


def test_the_fast_path_leaves_everything_else_to_the_full_parser() -> None:
    assert parse_data_untrusted(frame(64, 0)[:31]) is None
    assert parse_data_untrusted(frame(64, 0, version=1)) is None
    sm = StatusMessage(SESSION, STREAM, TERM, 0, 4096, 9).encode()
    assert parse_data_untrusted(sm) is None
    assert parse_data_untrusted(frame(32, 0, frame_type=FrameType.NAK)) is None


def test_the_fast_path_checks_the_whole_chain() -> None:
    with pytest.raises(FrameError) as raised:
        parse_data_untrusted(frame(64, 0) + bytes(1))
    assert raised.value.reason == "bad_alignment"
    with pytest.raises(FrameError) as raised:
        parse_data_untrusted(frame(64, 0) + frame(64, 0))
    assert raised.value.reason == "bad_data_chain"


# ------------------------------------------------------------------ parse_data_run_untrusted


def test_a_run_of_whole_datagrams_is_one_chain() -> None:
    data = run([64, 64, 64, 64])  # two datagrams of 128 bytes, two frames each
    assert parse_data_run_untrusted(data, 128) == (
        64, UNFRAGMENTED_FLAGS, FrameType.DATA, 0, SESSION, STREAM, TERM, 0
    )
    # The last datagram may be shorter than a segment.
    assert parse_data_run_untrusted(run([128, 128, 64], 256), 128) == (
        128, UNFRAGMENTED_FLAGS, FrameType.DATA, 256, SESSION, STREAM, TERM, 0
    )


def test_a_run_reports_the_first_frames_flags_and_reserved_value() -> None:
    data = frame(128, 0, flags=0x80, reserved=11) + frame(128, 128, flags=0x40)
    assert parse_data_run_untrusted(data, 128) == (
        128, 0x80, FrameType.DATA, 0, SESSION, STREAM, TERM, 11
    )


@pytest.mark.parametrize("segment", [0, -128, 100, 129])
def test_a_segment_size_that_is_no_frame_boundary_is_no_run(segment: int) -> None:
    assert parse_data_run_untrusted(run([64, 64, 64, 64]), segment) is None


def test_one_datagram_is_no_run() -> None:
    assert parse_data_run_untrusted(run([64, 64]), 128) is None
    assert parse_data_run_untrusted(run([64, 64]), 256) is None


def test_a_run_starting_at_a_bad_offset_is_no_run() -> None:
    assert parse_data_run_untrusted(run([64, 64], term_offset=-64), 64) is None
    bad = bytearray(run([64, 64], term_offset=64))
    struct.pack_into("<i", bad, 8, 65)  # first term offset not aligned
    assert parse_data_run_untrusted(bytes(bad), 64) is None


def test_a_truncated_last_header_is_no_run() -> None:
    assert parse_data_run_untrusted(run([64, 64]) + bytes(16), 64) is None


@pytest.mark.parametrize(
    "second",
    [
        frame(64, 64, version=1),
        frame(64, 64, frame_type=FrameType.PAD) + bytes(32),
        frame(0, 64) + bytes(32),  # a heartbeat in the middle of a run
        frame(16, 64) + bytes(32),  # below a header's length
        frame(64, 96),  # not where the first frame ends
        frame(64, 64, session=SESSION + 1),
        frame(64, 64, stream=STREAM + 1),
        frame(64, 64, term=TERM + 1),
    ],
)
def test_any_break_in_the_chain_is_no_run(second: bytes) -> None:
    assert len(second) == 64
    assert parse_data_run_untrusted(run([64, 64]), 64) is not None
    assert parse_data_run_untrusted(frame(64, 0) + second, 64) is None


def test_a_frame_across_a_datagram_end_is_no_run() -> None:
    # Three 96-byte frames cut into 128-byte segments: the second frame crosses the first end.
    assert parse_data_run_untrusted(run([96, 96, 96, 96]), 128) is None
    # The same frames in 192-byte segments are whole datagrams.
    assert parse_data_run_untrusted(run([96, 96, 96, 96]), 192) is not None


def test_a_last_frame_longer_than_the_data_is_no_run() -> None:
    data = bytearray(run([64, 64, 64]))
    struct.pack_into("<i", data, 128, 96)  # the last frame claims 96 bytes of 64
    assert parse_data_run_untrusted(bytes(data), 64) is None


def test_a_run_continues_across_several_segments() -> None:
    # Six datagrams: each boundary is checked in turn, not only the first.
    assert parse_data_run_untrusted(run([64] * 12), 128) is not None
    data = bytearray(run([64] * 12))
    struct.pack_into("<i", data, 5 * 128 + 64, 96)  # the last datagram's second frame overruns
    assert parse_data_run_untrusted(bytes(data), 128) is None


# ------------------------------------------------------------------ encode and ERR


@pytest.mark.parametrize(
    "record",
    [
        DataHeader(frame_length=2**31, flags=0, term_offset=0, session_id=0, stream_id=0,
                   term_id=0),
        Setup(term_offset=0, session_id=2**31, stream_id=0, initial_term_id=0, active_term_id=0,
              term_length=65536, mtu=1408),
        StatusMessage(2**31, 0, 0, 0, 0, 0),
        StatusMessage(2**31, 0, 0, 0, 0, 0, group_tag=1),
        Nak(session_id=2**31, stream_id=0, term_id=0, term_offset=0, length=0),
        Rttm(session_id=2**31, stream_id=0, echo_timestamp_ns=0, reception_delta_ns=0,
             receiver_id=0),
        ErrorFrame(session_id=2**31, stream_id=0, receiver_id=0, error_code=0, message="x"),
        ResponseSetup(session_id=0, stream_id=0, response_session_id=2**31),
    ],
)
def test_an_encode_error_names_the_record(record: object) -> None:
    with pytest.raises(ValueError) as raised:
        record.encode()  # type: ignore[attr-defined]
    assert str(raised.value).startswith(f"cannot encode {record!r}: ")


def test_the_group_tag_flag_keeps_the_other_err_flags() -> None:
    err = ErrorFrame(
        session_id=1, stream_id=2, receiver_id=3, error_code=4, message="m", group_tag=5, flags=3
    )
    assert err.flags == 3 | ERR_HAS_GROUP_TAG_FLAG


def test_an_untagged_err_carries_a_zero_group_tag() -> None:
    wire = ErrorFrame(session_id=1, stream_id=2, receiver_id=3, error_code=4, message="m").encode()
    assert ERR_STRUCT.unpack_from(wire)[7] == 0


def _err(message: bytes, *, text_length: int | None = None) -> bytes:
    length = len(message) if text_length is None else text_length
    return ERR_STRUCT.pack(40 + len(message), 0, 0, FrameType.ERR, 1, 2, 3, 0, 4, length) + message


def test_the_longest_err_message_parses() -> None:
    longest = b"e" * MAX_ERROR_MESSAGE_LENGTH
    parsed = parse_datagram_untrusted(_err(longest))
    assert isinstance(parsed, ErrorFrame)
    assert parsed.message == longest.decode()


@pytest.mark.parametrize(
    ("wire", "reason", "detail"),
    [
        (_err(b"x", text_length=1024), "bad_field", "ERR message length 1024 outside [0, 1023]"),
        (_err(b"abc", text_length=4), "length_mismatch",
         "ERR message of 4 bytes does not fit frame_length 43"),
        (_err(b"\xc3\xa9"), "bad_field", "ERR message is not ASCII"),
    ],
)
def test_err_rejections_say_why(wire: bytes, reason: str, detail: str) -> None:
    with pytest.raises(FrameError) as raised:
        parse_datagram_untrusted(wire)
    assert (raised.value.reason, raised.value.detail) == (reason, detail)


@pytest.mark.parametrize(
    ("wire", "detail"),
    [
        (frame(64, 0) + frame(16, 64) + bytes(32),
         "DATA at datagram offset 64: frame_length 16 < 32"),
        (frame(64, 0) + frame(96, 64)[:64],
         "DATA at datagram offset 64: frame_length 96 overruns the 128-byte datagram"),
        (frame(64, 0) + frame(16, 64, frame_type=FrameType.PAD),
         "PAD at datagram offset 64: frame_length 16 < 32"),
    ],
)
def test_chain_rejections_say_where(wire: bytes, detail: str) -> None:
    with pytest.raises(FrameError) as raised:
        parse_datagram_untrusted(wire)
    assert (raised.value.reason, raised.value.detail) == ("length_mismatch", detail)


def test_iterating_a_control_frame_names_it() -> None:
    with pytest.raises(FrameError) as raised:
        iter_data_frames_untrusted(Nak(1, 2, 3, 0, 64).encode())
    assert (raised.value.reason, raised.value.detail) == (
        "not_data",
        "Nak is not a DATA/PAD datagram",
    )


# ------------------------------------------------------------------ what each rejection says


@pytest.mark.parametrize(
    ("wire", "reason", "detail"),
    [
        (bytes(5), "too_short", "datagram of 5 bytes is shorter than a header"),
        # A whole common header is enough to name the version and the type.
        (COMMON_HEADER_STRUCT.pack(8, 1, 0, FrameType.SM), "bad_version", "version 1, expected 0"),
        (COMMON_HEADER_STRUCT.pack(8, 0, 0, FrameType.SM), "too_short",
         "SM datagram of 8 bytes, needs 36"),
        (frame(64, 0, version=3), "bad_version", "version 3, expected 0"),
        (Nak(1, 2, 3, 0, 64).encode()[:27], "too_short", "NAK datagram of 27 bytes, needs 28"),
        (struct.pack("<i", 29) + Nak(1, 2, 3, 0, 64).encode()[4:], "length_mismatch",
         "NAK frame_length 29 outside [28, 28] (datagram length)"),
        (frame(64, 0)[:31], "too_short", "data datagram of 31 bytes, needs 32"),
        (frame(64, 0) + bytes(1), "bad_alignment",
         "data datagram of 65 bytes is not a multiple of 32"),
        (frame(64, -32), "bad_field", "negative term_offset -32"),
        (frame(64, 65), "bad_alignment", "term_offset 65 is not a multiple of 32"),
        (frame(0, 0) + bytes(32), "bad_data_chain",
         "heartbeat in a datagram of 64 bytes, expected 32"),
        (frame(64, 0) + frame(64, 64, version=2), "bad_version",
         "frame at datagram offset 64: version 2"),
        (frame(64, 0) + frame(64, 64, frame_type=FrameType.SM), "bad_data_chain",
         "frame at datagram offset 64: type 0x3 in data"),
        (frame(64, 0) + frame(64, 64, session=SESSION + 1), "bad_data_chain",
         "frame at datagram offset 64: session/stream/term 8/1001/3 differ from the first"
         " frame's 7/1001/3"),
        (frame(64, 0) + frame(64, 96), "bad_data_chain",
         "frame at datagram offset 64: term_offset 96, expected 64"),
        (frame(64, 0) + frame(100, 64, frame_type=FrameType.PAD), "bad_alignment",
         "PAD at datagram offset 64: frame_length 100 not a multiple of 32"),
        (frame(64, 0, frame_type=FrameType.PAD) + frame(64, 64), "bad_data_chain",
         "PAD at datagram offset 0 is not the last frame"),
    ],
)
def test_every_rejection_says_what_and_where(wire: bytes, reason: str, detail: str) -> None:
    # The reason is the drop counter's name; the detail is what an operator reads in the log.
    with pytest.raises(FrameError) as raised:
        parse_datagram_untrusted(wire)
    assert (raised.value.reason, raised.value.detail) == (reason, detail)
    assert str(raised.value) == f"{reason}: {detail}"


def test_an_empty_err_message_parses() -> None:
    parsed = parse_datagram_untrusted(_err(b""))
    assert isinstance(parsed, ErrorFrame)
    assert (parsed.error_code, parsed.message) == (4, "")


@pytest.mark.parametrize(
    ("lengths", "segment"),
    [
        ([64, 32], 64),  # the last datagram a lone frame of a bare header
        ([32, 32, 64], 64),  # bare-header frames inside a datagram of the run
    ],
)
def test_a_run_may_hold_frames_of_a_bare_header(lengths: list[int], segment: int) -> None:
    # A frame of 32 bytes is a DATA frame with an empty payload (an empty message), not a
    # heartbeat (frame_length 0) nor a truncated header.
    assert parse_data_run_untrusted(run(lengths), segment) == (
        lengths[0], UNFRAGMENTED_FLAGS, FrameType.DATA, 0, SESSION, STREAM, TERM, 0
    )


@pytest.mark.parametrize("data", [b"", bytes(16), bytes(31)])
def test_no_segment_size_is_no_run_even_for_a_runt(data: bytes) -> None:
    # The run parser never raises: without a segment size there is no run to look into, and
    # the datagram is left to the full parser with its own checks and counters.
    assert parse_data_run_untrusted(data, 0) is None
    assert parse_data_run_untrusted(data, -32) is None
