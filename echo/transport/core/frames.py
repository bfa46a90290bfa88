"""Aeron UDP frame codecs (Aeron's wire-protocol page, its TermScanner): the decoders of untrusted
datagrams, and every name of the wire format (wireformat.py) under one roof.

The frame records, their constants and their encoders live in wireformat.py (local, trusted:
a bad field is a ValueError); they are re-exported here, so `from echo.transport.core.frames import
Setup` keeps working. This module is the other half: bytes from the network.
`parse_datagram_untrusted` is the only general entry point for them (the receiver's data fast
paths are `parse_data_untrusted` and `parse_data_run_untrusted`): each raises nothing but
`FrameError`, whose `reason` is a short tag the driver uses as a drop-counter name, and costs
O(datagram) at most.

Pure module: no trio, no clock, no sockets.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Iterator
from typing import Final, TypeAlias

from echo.transport.core.wireformat import (
    BEGIN_END_AND_EOS_FLAGS,
    BEGIN_FLAG,
    COMMON_HEADER_STRUCT,
    CURRENT_VERSION,
    DATA_HEADER_LENGTH,
    DATA_HEADER_STRUCT,
    END_FLAG,
    EOS_FLAG,
    ERR_HAS_GROUP_TAG_FLAG,
    ERR_HEADER_LENGTH,
    ERR_STRUCT,
    FRAME_ALIGNMENT,
    HEADER_LENGTH,
    MAX_ERROR_MESSAGE_LENGTH,
    MAX_UDP_PAYLOAD_LENGTH,
    NAK_LENGTH,
    NAK_STRUCT,
    REVOKED_FLAG,
    RSP_SETUP_LENGTH,
    RSP_SETUP_STRUCT,
    RTTM_LENGTH,
    RTTM_REPLY_FLAG,
    RTTM_STRUCT,
    SETUP_GROUP_FLAG,
    SETUP_LENGTH,
    SETUP_SEND_RESPONSE_FLAG,
    SETUP_STRUCT,
    SM_EOS_FLAG,
    SM_GTAG_LENGTH,
    SM_GTAG_STRUCT,
    SM_LENGTH,
    SM_SETUP_FLAG,
    SM_STRUCT,
    UNFRAGMENTED_FLAGS,
    DataHeader,
    ErrorFrame,
    Frame,
    FrameType,
    Nak,
    ResponseSetup,
    Rttm,
    Setup,
    StatusMessage,
    align,
)

# The wire format's names are this module's too: every importer of frames keeps working.
__all__ = [
    "BEGIN_END_AND_EOS_FLAGS", "BEGIN_FLAG", "COMMON_HEADER_STRUCT", "CURRENT_VERSION",
    "DATA_HEADER_LENGTH", "DATA_HEADER_STRUCT", "END_FLAG", "EOS_FLAG", "ERR_HAS_GROUP_TAG_FLAG",
    "ERR_HEADER_LENGTH", "ERR_STRUCT", "FRAME_ALIGNMENT", "HEADER_LENGTH",
    "MAX_ERROR_MESSAGE_LENGTH", "MAX_UDP_PAYLOAD_LENGTH", "NAK_LENGTH", "NAK_STRUCT",
    "REVOKED_FLAG", "RSP_SETUP_LENGTH", "RSP_SETUP_STRUCT", "RTTM_LENGTH", "RTTM_REPLY_FLAG",
    "RTTM_STRUCT",
    "SETUP_GROUP_FLAG", "SETUP_LENGTH", "SETUP_SEND_RESPONSE_FLAG", "SETUP_STRUCT", "SM_EOS_FLAG",
    "SM_GTAG_LENGTH", "SM_GTAG_STRUCT", "SM_LENGTH", "SM_SETUP_FLAG", "SM_STRUCT",
    "UNFRAGMENTED_FLAGS", "Buffer", "DataFields", "DataHeader", "ErrorFrame", "Frame",
    "FrameError", "FrameType", "Nak", "ResponseSetup", "Rttm", "Setup", "StatusMessage", "align",
    "iter_data_frames_untrusted", "parse_data_run_untrusted", "parse_data_untrusted",
    "parse_datagram_untrusted",
]


class FrameError(ValueError):
    """A datagram that is not a valid Aeron frame. `reason` is a snake_case counter name."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


_I64: Final = struct.Struct("<q")
#: what the run check reads of a DATA header: frame length, version, (flags skipped) type,
#: term offset, and session, stream and term ids as 12 bytes
_RUN_CHECK_STRUCT: Final = struct.Struct("<iBxHi12s")
_DATA_TYPE: Final = 0x01  # FrameType.DATA
#: the host's ints are the wire's (little-endian): a chain's headers may be read through a
#: native int64 view of the datagram (_is_uniform_chain)
_LITTLE_ENDIAN: Final = sys.byteorder == "little"
_INT32_MAX: Final = 0x7FFFFFFF
_DATA_TYPES: Final = frozenset((FrameType.DATA.value, FrameType.PAD.value))
_KNOWN_TYPES: Final = frozenset(
    (
        FrameType.PAD.value,
        FrameType.DATA.value,
        FrameType.NAK.value,
        FrameType.SM.value,
        FrameType.ERR.value,
        FrameType.SETUP.value,
        FrameType.RTTM.value,
        FrameType.RSP_SETUP.value,
    )
)
_CONTROL_MINIMUM: Final = {
    FrameType.SETUP.value: SETUP_LENGTH,
    FrameType.SM.value: SM_LENGTH,
    FrameType.NAK.value: NAK_LENGTH,
    FrameType.RTTM.value: RTTM_LENGTH,
    FrameType.ERR.value: ERR_HEADER_LENGTH,
    FrameType.RSP_SETUP.value: RSP_SETUP_LENGTH,
}

Buffer: TypeAlias = bytes | bytearray | memoryview


def parse_datagram_untrusted(data: Buffer) -> Frame:
    """Decode one UDP datagram received from the network (untrusted).

    Control frames (SETUP, SM, NAK, RTTM, ERR, RSP_SETUP) come one per datagram. A DATA/PAD
    datagram is a chain of contiguous aligned frames copied from one term (Aeron's TermScanner): the
    whole chain is checked and the first frame's header returned, because the receiver copies the
    datagram into the term at that header's offset (TermRebuilder.insert). Raises only `FrameError`;
    O(len(data)).
    """
    length = len(data)
    if length < HEADER_LENGTH:
        raise FrameError("too_short", f"datagram of {length} bytes is shorter than a header")
    frame_length, version, flags, frame_type = COMMON_HEADER_STRUCT.unpack_from(data, 0)
    if version != CURRENT_VERSION:
        raise FrameError("bad_version", f"version {version}, expected {CURRENT_VERSION}")
    if frame_type not in _KNOWN_TYPES:
        raise FrameError("unknown_type", f"frame type {frame_type:#x} is not supported")
    if frame_type in _DATA_TYPES:
        return _parse_data_chain(data, length)
    _check_control_length(frame_type, frame_length, length)
    if frame_type == FrameType.SM:
        return _parse_status_message(data, frame_length, flags)
    if frame_type == FrameType.SETUP:
        return _parse_setup(data, flags)
    if frame_type == FrameType.NAK:
        return _parse_nak(data, flags)
    if frame_type == FrameType.RTTM:
        return _parse_rttm(data, flags)
    if frame_type == FrameType.RSP_SETUP:
        return _parse_response_setup(data, flags)
    return _parse_error_frame(data, frame_length, flags)


def _check_control_length(frame_type: int, frame_length: int, length: int) -> None:
    """A control frame fills its datagram's first `frame_length` bytes, at least its minimum."""
    minimum = _CONTROL_MINIMUM[frame_type]
    if length < minimum:
        name = FrameType(frame_type).name
        raise FrameError("too_short", f"{name} datagram of {length} bytes, needs {minimum}")
    if not minimum <= frame_length <= length:
        name = FrameType(frame_type).name
        raise FrameError(
            "length_mismatch",
            f"{name} frame_length {frame_length} outside [{minimum}, {length}] (datagram length)",
        )


def _parse_status_message(data: Buffer, frame_length: int, flags: int) -> StatusMessage:
    (_, _, _, _, session_id, stream_id, term_id, term_offset, window, receiver_id) = (
        SM_STRUCT.unpack_from(data, 0)
    )
    # Aeron sets frame_length 44 exactly when it appends a group tag (StatusMessageFlyweight).
    group_tag = _I64.unpack_from(data, SM_LENGTH)[0] if frame_length >= SM_GTAG_LENGTH else None
    return StatusMessage(
        session_id=session_id,
        stream_id=stream_id,
        consumption_term_id=term_id,
        consumption_term_offset=term_offset,
        receiver_window=window,
        receiver_id=receiver_id,
        group_tag=group_tag,
        flags=flags,
    )


def _parse_setup(data: Buffer, flags: int) -> Setup:
    (_, _, _, _, term_offset, session_id, stream_id, initial, active, term_len, mtu, ttl) = (
        SETUP_STRUCT.unpack_from(data, 0)
    )
    return Setup(
        term_offset=term_offset,
        session_id=session_id,
        stream_id=stream_id,
        initial_term_id=initial,
        active_term_id=active,
        term_length=term_len,
        mtu=mtu,
        ttl=ttl,
        flags=flags,
    )


def _parse_nak(data: Buffer, flags: int) -> Nak:
    (_, _, _, _, session_id, stream_id, term_id, term_offset, nak_length) = (
        NAK_STRUCT.unpack_from(data, 0)
    )
    return Nak(
        session_id=session_id,
        stream_id=stream_id,
        term_id=term_id,
        term_offset=term_offset,
        length=nak_length,
        flags=flags,
    )


def _parse_rttm(data: Buffer, flags: int) -> Rttm:
    (_, _, _, _, session_id, stream_id, echo_ts, delta, receiver_id) = RTTM_STRUCT.unpack_from(
        data, 0
    )
    return Rttm(
        session_id=session_id,
        stream_id=stream_id,
        echo_timestamp_ns=echo_ts,
        reception_delta_ns=delta,
        receiver_id=receiver_id,
        flags=flags,
    )


def _parse_response_setup(data: Buffer, flags: int) -> ResponseSetup:
    (_, _, _, _, session_id, stream_id, response_session_id) = RSP_SETUP_STRUCT.unpack_from(
        data, 0
    )
    return ResponseSetup(
        session_id=session_id,
        stream_id=stream_id,
        response_session_id=response_session_id,
        flags=flags,
    )


def _parse_error_frame(data: Buffer, frame_length: int, flags: int) -> ErrorFrame:
    (_, _, _, _, session_id, stream_id, receiver_id, group_tag, error_code, text_length) = (
        ERR_STRUCT.unpack_from(data, 0)
    )
    if not 0 <= text_length <= MAX_ERROR_MESSAGE_LENGTH:
        raise FrameError(
            "bad_field", f"ERR message length {text_length} outside [0, {MAX_ERROR_MESSAGE_LENGTH}]"
        )
    if ERR_HEADER_LENGTH + text_length > frame_length:
        raise FrameError(
            "length_mismatch",
            f"ERR message of {text_length} bytes does not fit frame_length {frame_length}",
        )
    raw = bytes(data[ERR_HEADER_LENGTH : ERR_HEADER_LENGTH + text_length])
    if not raw.isascii():
        # Aeron writes the message with putStringWithoutLengthAscii: anything else is not Aeron.
        raise FrameError("bad_field", "ERR message is not ASCII")
    return ErrorFrame(
        session_id=session_id,
        stream_id=stream_id,
        receiver_id=receiver_id,
        error_code=error_code,
        message=raw.decode("ascii"),
        group_tag=group_tag if flags & ERR_HAS_GROUP_TAG_FLAG else None,
        flags=flags,
    )


DataFields: TypeAlias = tuple[int, int, int, int, int, int, int, int]


def parse_data_untrusted(data: Buffer) -> DataFields | None:
    """The receiver's fast path: a DATA/PAD datagram's first header as a plain tuple (untrusted).

    Returns `(frame_length, flags, type, term_offset, session_id, stream_id, term_id,
    reserved_value)` after checking the whole chain exactly as `parse_datagram_untrusted` does,
    without building a `DataHeader`; None when the datagram does not start with a version-0
    DATA or PAD header (a control frame, or something `parse_datagram_untrusted` will name).
    Raises only `FrameError`.
    """
    length = len(data)
    if length < DATA_HEADER_LENGTH:
        return None
    fields = DATA_HEADER_STRUCT.unpack_from(data, 0)
    if fields[1] != CURRENT_VERSION or fields[3] not in _DATA_TYPES:
        return None
    _check_data_chain(data, length, fields)
    return (
        fields[0],
        fields[2],
        fields[3],
        fields[4],
        fields[5],
        fields[6],
        fields[7],
        fields[8],
    )


def parse_data_run_untrusted(data: Buffer, segment: int) -> DataFields | None:
    """A coalesced read of datagrams of `segment` bytes (UDP GRO) as one chain, if it is one.

    Returns the first header's fields (as `parse_data_untrusted`) when every datagram of the
    run is a valid chain of whole DATA frames and the datagrams continue each other: one
    session, stream and term, each frame where the previous one ends, no frame across a
    datagram's end. The run can then be handled as one datagram. Anything else (a PAD, a
    heartbeat, a gap, another session, a malformed frame) returns None, and the caller takes
    the datagrams one by one, with their own checks and counters. Never raises.
    """
    length = len(data)
    if segment <= 0 or segment % FRAME_ALIGNMENT or length <= segment:
        return None
    if length % FRAME_ALIGNMENT:
        return None  # frames are aligned: a chain of them ends on a multiple of 32
    first = DATA_HEADER_STRUCT.unpack_from(data, 0)
    session_id: int
    stream_id: int
    term_id: int
    (_, _, flags, _, term_offset, session_id, stream_id, term_id, reserved) = first
    if term_offset < 0 or term_offset % FRAME_ALIGNMENT:
        return None
    if _is_uniform_chain(data, length, segment, first):
        return (first[0], flags, _DATA_TYPE, term_offset, session_id, stream_id, term_id, reserved)
    # Each header as only what the check reads (the 12 bytes of session, stream and term ids
    # as one bytes, compared in one step): fewer ints made and unboxed per frame than all nine
    # fields of the header.
    unpack_from = _RUN_CHECK_STRUCT.unpack_from
    ids = bytes(data[12:24])
    offset = 0
    boundary = segment
    expected: int = term_offset
    data_type = _DATA_TYPE
    # Typed, so that compiled code compares the unpacked fields as ints, not as objects.
    fl: int
    version: int
    ftype: int
    toff: int
    frame_ids: bytes
    while offset < length:
        (fl, version, ftype, toff, frame_ids) = unpack_from(data, offset)
        if (
            version != CURRENT_VERSION
            or ftype != data_type
            or fl < DATA_HEADER_LENGTH
            or toff != expected
            or frame_ids != ids
        ):
            return None
        step = (fl + 31) & ~31
        offset += step
        expected += step
        if offset > boundary and boundary < length:
            return None  # a frame across the end of a datagram
        if offset == boundary:
            boundary += segment
    if offset != length:
        return None
    return (first[0], flags, data_type, term_offset, session_id, stream_id, term_id, reserved)


def _is_uniform_chain(
    data: Buffer,
    length: int,
    segment: int,
    first: tuple[int, int, int, int, int, int, int, int, int],
) -> bool:
    """Is `data`, whose first header is `first`, DATA frames of one length, whole in each
    datagram of `segment` bytes, alike in their first 8 header bytes (length, version, flags,
    type) and in session, stream and term, each at the term offset where the one before ends?
    One stream's messages of one size: the common chain, checked a header word at a time down
    all its frames (strided int64 views of the data: no Python object per frame but its term
    offset's). False only says the frames are not all alike: the caller then checks them one
    by one."""
    (frame_length, version, _, frame_type, term_offset, _, _, _, _) = first
    step = (frame_length + 31) & ~31
    if (
        version != CURRENT_VERSION
        or frame_type != _DATA_TYPE
        or frame_length < DATA_HEADER_LENGTH
        or length % step
        or segment % step
        or term_offset + length > _INT32_MAX
        or not _LITTLE_ENDIAN
    ):
        return False
    count = length // step
    stride = step >> 3
    words = memoryview(data).cast("q")
    # Each frame's words 0 and 2 (length to type; stream and term ids) are the next one's.
    others = (length >> 3) - stride  # the words before the last frame's
    if (
        words[0:others:stride] != words[stride::stride]
        or words[2:others:stride] != words[2 + stride :: stride]
    ):
        return False
    # The sessions (int32 3) too; and the term offsets (int32 2), as one int: less its first
    # int32, less its last, it is `step` in every int32, i.e. times 2**32 - 1 it is
    # `(step << rest) - step`. (Exactly: the offsets are below 2**31 - step, as term_offset +
    # length fits an int32, so no int32 of the difference borrows from the next.)
    ints = words.cast("B").cast("i")
    stride <<= 1
    if ints[3 : others << 1 : stride] != ints[3 + stride :: stride]:
        return False
    column = int.from_bytes(ints[2::stride].tobytes(), "little")
    rest = (count - 1) * 32
    difference = (column >> 32) - (column & ((1 << rest) - 1))
    return difference * 0xFFFFFFFF == (step << rest) - step


def _parse_data_chain(data: Buffer, length: int) -> DataHeader:
    """Check a DATA/PAD datagram frame by frame (Aeron's TermScanner); return the first header."""
    if length < DATA_HEADER_LENGTH:
        raise FrameError(
            "too_short", f"data datagram of {length} bytes, needs {DATA_HEADER_LENGTH}"
        )
    fields = DATA_HEADER_STRUCT.unpack_from(data, 0)
    _check_data_chain(data, length, fields)
    (frame_length, _, flags, frame_type, term_offset, session_id, stream_id, term_id, reserved) = (
        fields
    )
    return DataHeader(
        frame_length=frame_length,
        flags=flags,
        term_offset=term_offset,
        session_id=session_id,
        stream_id=stream_id,
        term_id=term_id,
        reserved_value=reserved,
        type=FrameType.DATA if frame_type == FrameType.DATA else FrameType.PAD,
    )


def _check_data_chain(
    data: Buffer, length: int, first: tuple[int, int, int, int, int, int, int, int, int]
) -> None:
    """Validate every frame of a DATA/PAD datagram whose first header is `first`."""
    if length % FRAME_ALIGNMENT:
        raise FrameError(
            "bad_alignment", f"data datagram of {length} bytes is not a multiple of 32"
        )
    (frame_length, _, _, frame_type, term_offset, session_id, stream_id, term_id, _) = first
    if term_offset < 0:
        raise FrameError("bad_field", f"negative term_offset {term_offset}")
    if term_offset % FRAME_ALIGNMENT:
        raise FrameError("bad_alignment", f"term_offset {term_offset} is not a multiple of 32")
    if frame_type == FrameType.DATA:
        if frame_length == 0:
            # A heartbeat is a lone header (DataHeaderFlyweight.isHeartbeat: length == 32).
            if length != DATA_HEADER_LENGTH:
                raise FrameError(
                    "bad_data_chain", f"heartbeat in a datagram of {length} bytes, expected 32"
                )
            return
        aligned = (frame_length + 31) & ~31
        if frame_length >= DATA_HEADER_LENGTH and (
            aligned == length  # one whole frame fills the datagram: nothing more to check
            or _is_uniform_chain(data, length, length, first)
        ):
            return
    _check_chain_frame(frame_length, frame_type, 0, length)
    offset = align(frame_length) if frame_type == FrameType.DATA else length
    _check_following_frames(
        data, length, offset, term_offset + offset, session_id, stream_id, term_id
    )


def _check_following_frames(
    data: Buffer,
    length: int,
    offset: int,
    expected_term_offset: int,
    session_id: int,
    stream_id: int,
    term_id: int,
) -> None:
    """The frames after a datagram's first, from `offset`: each of the first frame's stream
    and term, where the one before ends, and whole (as TermAppender writes them)."""
    # Typed, so that compiled code compares the unpacked fields as ints, not as objects.
    fl: int
    version: int
    ftype: int
    toff: int
    sid: int
    strm: int
    tid: int
    while offset < length:
        (fl, version, _, ftype, toff, sid, strm, tid, _) = DATA_HEADER_STRUCT.unpack_from(
            data, offset
        )
        if version != CURRENT_VERSION:
            raise FrameError("bad_version", f"frame at datagram offset {offset}: version {version}")
        if ftype not in _DATA_TYPES:
            raise FrameError(
                "bad_data_chain", f"frame at datagram offset {offset}: type {ftype:#x} in data"
            )
        if sid != session_id or strm != stream_id or tid != term_id:
            raise FrameError(
                "bad_data_chain",
                f"frame at datagram offset {offset}: session/stream/term {sid}/{strm}/{tid}"
                f" differ from the first frame's {session_id}/{stream_id}/{term_id}",
            )
        if toff != expected_term_offset:
            raise FrameError(
                "bad_data_chain",
                f"frame at datagram offset {offset}: term_offset {toff},"
                f" expected {expected_term_offset}",
            )
        _check_chain_frame(fl, ftype, offset, length)
        step = align(fl) if ftype == FrameType.DATA else DATA_HEADER_LENGTH
        offset += step
        expected_term_offset += step


def _check_chain_frame(frame_length: int, frame_type: int, offset: int, length: int) -> None:
    if frame_type == FrameType.DATA:
        if frame_length < DATA_HEADER_LENGTH:
            # Zero is a heartbeat, which travels alone; anything else below 32 is no frame.
            raise FrameError(
                "length_mismatch",
                f"DATA at datagram offset {offset}: frame_length {frame_length} < 32",
            )
        if offset + align(frame_length) > length:
            raise FrameError(
                "length_mismatch",
                f"DATA at datagram offset {offset}: frame_length {frame_length} overruns the"
                f" {length}-byte datagram",
            )
        return
    # PAD: its frame_length covers the rest of the term, but only its header is sent (TermScanner),
    # so it must be the datagram's last 32 bytes.
    if frame_length < DATA_HEADER_LENGTH:
        raise FrameError(
            "length_mismatch", f"PAD at datagram offset {offset}: frame_length {frame_length} < 32"
        )
    if frame_length % FRAME_ALIGNMENT:
        raise FrameError(
            "bad_alignment",
            f"PAD at datagram offset {offset}: frame_length {frame_length} not a multiple of 32",
        )
    if offset + DATA_HEADER_LENGTH != length:
        raise FrameError("bad_data_chain", f"PAD at datagram offset {offset} is not the last frame")


def iter_data_frames_untrusted(data: Buffer) -> Iterator[DataHeader]:
    """Every frame header of a DATA/PAD datagram (untrusted), after validating the whole chain.

    Raises `FrameError` (reason "not_data" for a control frame) before yielding anything.
    """
    first = parse_datagram_untrusted(data)
    if not isinstance(first, DataHeader):
        raise FrameError("not_data", f"{type(first).__name__} is not a DATA/PAD datagram")
    headers = [first]
    offset = DATA_HEADER_LENGTH if first.is_heartbeat or first.is_pad else align(first.frame_length)
    length = len(data)
    while offset < length:
        (fl, _, flags, ftype, toff, sid, strm, tid, reserved) = DATA_HEADER_STRUCT.unpack_from(
            data, offset
        )
        headers.append(
            DataHeader(
                frame_length=fl,
                flags=flags,
                term_offset=toff,
                session_id=sid,
                stream_id=strm,
                term_id=tid,
                reserved_value=reserved,
                type=FrameType.DATA if ftype == FrameType.DATA else FrameType.PAD,
            )
        )
        offset += align(fl) if ftype == FrameType.DATA else DATA_HEADER_LENGTH
    return iter(headers)
