"""Aeron UDP frame codecs (reference aeron-protocol.md §1, §2.3, §2.6).

Every multi-byte field is little-endian (§0). Each frame class encodes to the exact bytes an Aeron
1.47 driver puts on the wire; the captures in shared/reference/aeron-captures re-encode byte for
byte. `parse_datagram_untrusted` is the only entry point for bytes from the network: it raises
nothing but `FrameError`, whose `reason` is a short tag the driver uses as a drop-counter name.

Pure module: no trio, no clock, no sockets.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterator
from typing import Final, TypeAlias

import attrs

FRAME_ALIGNMENT: Final = 32
HEADER_LENGTH: Final = 8
DATA_HEADER_LENGTH: Final = 32
SETUP_LENGTH: Final = 40
SM_LENGTH: Final = 36
SM_GTAG_LENGTH: Final = 44
NAK_LENGTH: Final = 28
RTTM_LENGTH: Final = 40
ERR_HEADER_LENGTH: Final = 40
MAX_ERROR_MESSAGE_LENGTH: Final = 1023
# RSP_SETUP (response channels, Aeron 1.44+; ResponseSetupFlyweight.HEADER_LENGTH).
RSP_SETUP_LENGTH: Final = 20
# 65535 - 8 (UDP) - 20 (IPv4), rounded down to 32 (Configuration.MAX_UDP_PAYLOAD_LENGTH).
MAX_UDP_PAYLOAD_LENGTH: Final = 65504

CURRENT_VERSION: Final = 0


class FrameType(enum.IntEnum):
    """Wire type codes (§1.2). PAD..RTTM and RSP_SETUP are decoded; the rest are rejected as
    unknown."""

    PAD = 0x00
    DATA = 0x01
    NAK = 0x02
    SM = 0x03
    ERR = 0x04
    SETUP = 0x05
    RTTM = 0x06
    RES = 0x07
    ATS_DATA = 0x08
    ATS_SM = 0x09
    ATS_SETUP = 0x0A
    RSP_SETUP = 0x0B
    EXT = 0xFFFF


# DATA / PAD flags (§1.3).
BEGIN_FLAG: Final = 0x80
END_FLAG: Final = 0x40
EOS_FLAG: Final = 0x20
UNFRAGMENTED_FLAGS: Final = 0xC0
BEGIN_END_AND_EOS_FLAGS: Final = 0xE0
# SM flags (§1.5).
SM_SETUP_FLAG: Final = 0x80
SM_EOS_FLAG: Final = 0x40
# SETUP flags (§1.4).
SETUP_GROUP_FLAG: Final = 0x40
SETUP_SEND_RESPONSE_FLAG: Final = 0x80
# RTTM flags (§1.7): set by the receiver on a request, cleared on the sender's answer.
RTTM_REPLY_FLAG: Final = 0x80
# ERR flags (§1.8).
ERR_HAS_GROUP_TAG_FLAG: Final = 0x08

COMMON_HEADER_STRUCT: Final = struct.Struct("<iBBH")
# frame_length, version, flags, type, term_offset, session_id, stream_id, term_id, reserved_value
DATA_HEADER_STRUCT: Final = struct.Struct("<iBBHiiiiq")
# ..., term_offset, session_id, stream_id, initial_term_id, active_term_id, term_length, mtu, ttl
SETUP_STRUCT: Final = struct.Struct("<iBBHiiiiiiii")
# ..., session_id, stream_id, consumption term_id, term_offset, receiver_window, receiver_id
SM_STRUCT: Final = struct.Struct("<iBBHiiiiiq")
SM_GTAG_STRUCT: Final = struct.Struct("<iBBHiiiiiqq")
# ..., session_id, stream_id, term_id, term_offset, length
NAK_STRUCT: Final = struct.Struct("<iBBHiiiii")
# ..., session_id, stream_id, echo_timestamp_ns, reception_delta_ns, receiver_id
RTTM_STRUCT: Final = struct.Struct("<iBBHiiqqq")
# ..., session_id, stream_id, receiver_id, group_tag, error_code, error_length
ERR_STRUCT: Final = struct.Struct("<iBBHiiqqii")
# ..., session_id, stream_id, response_session_id
RSP_SETUP_STRUCT: Final = struct.Struct("<iBBHiii")

_I64: Final = struct.Struct("<q")

assert DATA_HEADER_STRUCT.size == DATA_HEADER_LENGTH
assert SETUP_STRUCT.size == SETUP_LENGTH
assert SM_STRUCT.size == SM_LENGTH
assert SM_GTAG_STRUCT.size == SM_GTAG_LENGTH
assert NAK_STRUCT.size == NAK_LENGTH
assert RTTM_STRUCT.size == RTTM_LENGTH
assert ERR_STRUCT.size == ERR_HEADER_LENGTH
assert RSP_SETUP_STRUCT.size == RSP_SETUP_LENGTH
assert COMMON_HEADER_STRUCT.size == HEADER_LENGTH


def align(length: int, alignment: int = FRAME_ALIGNMENT) -> int:
    """Round `length` up to a multiple of `alignment` (a power of two)."""
    return (length + alignment - 1) & ~(alignment - 1)


class FrameError(ValueError):
    """A datagram that is not a valid Aeron frame. `reason` is a snake_case counter name."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def _pack(frame: object, packer: struct.Struct, *values: int) -> bytes:
    try:
        return packer.pack(*values)
    except struct.error as exc:
        # Encoding is local: a field out of its wire range is a programming error, not bad input.
        raise ValueError(f"cannot encode {frame!r}: {exc}") from None


@attrs.frozen(slots=True)
class DataHeader:
    """The 32-byte header of a DATA or PAD frame (§1.3). `frame_length` is unaligned."""

    frame_length: int
    flags: int
    term_offset: int
    session_id: int
    stream_id: int
    term_id: int
    reserved_value: int = 0
    type: FrameType = FrameType.DATA

    @property
    def is_heartbeat(self) -> bool:
        return self.type == FrameType.DATA and self.frame_length == 0

    @property
    def is_end_of_stream(self) -> bool:
        # Aeron compares the whole flags byte (DataHeaderFlyweight.isEndOfStream).
        return self.flags == BEGIN_END_AND_EOS_FLAGS

    @property
    def is_pad(self) -> bool:
        return self.type == FrameType.PAD

    def encode(self) -> bytes:
        """The 32 header bytes only; the payload (and its zero padding) follows on the wire."""
        return _pack(
            self,
            DATA_HEADER_STRUCT,
            self.frame_length,
            CURRENT_VERSION,
            self.flags,
            self.type,
            self.term_offset,
            self.session_id,
            self.stream_id,
            self.term_id,
            self.reserved_value,
        )


@attrs.frozen(slots=True)
class Setup:
    """SETUP (§1.4): sent by a publication until a receiver answers with an SM."""

    term_offset: int
    session_id: int
    stream_id: int
    initial_term_id: int
    active_term_id: int
    term_length: int
    mtu: int
    ttl: int = 0
    flags: int = 0

    def encode(self) -> bytes:
        return _pack(
            self,
            SETUP_STRUCT,
            SETUP_LENGTH,
            CURRENT_VERSION,
            self.flags,
            FrameType.SETUP,
            self.term_offset,
            self.session_id,
            self.stream_id,
            self.initial_term_id,
            self.active_term_id,
            self.term_length,
            self.mtu,
            self.ttl,
        )


@attrs.frozen(slots=True)
class StatusMessage:
    """SM (§1.5). With a group tag the frame is 44 bytes, else 36."""

    session_id: int
    stream_id: int
    consumption_term_id: int
    consumption_term_offset: int
    receiver_window: int
    receiver_id: int
    group_tag: int | None = None
    flags: int = 0

    @property
    def is_setup_eliciting(self) -> bool:
        return bool(self.flags & SM_SETUP_FLAG)

    @property
    def is_end_of_stream(self) -> bool:
        return bool(self.flags & SM_EOS_FLAG)

    def encode(self) -> bytes:
        if self.group_tag is None:
            return _pack(
                self,
                SM_STRUCT,
                SM_LENGTH,
                CURRENT_VERSION,
                self.flags,
                FrameType.SM,
                self.session_id,
                self.stream_id,
                self.consumption_term_id,
                self.consumption_term_offset,
                self.receiver_window,
                self.receiver_id,
            )
        return _pack(
            self,
            SM_GTAG_STRUCT,
            SM_GTAG_LENGTH,
            CURRENT_VERSION,
            self.flags,
            FrameType.SM,
            self.session_id,
            self.stream_id,
            self.consumption_term_id,
            self.consumption_term_offset,
            self.receiver_window,
            self.receiver_id,
            self.group_tag,
        )


@attrs.frozen(slots=True)
class Nak:
    """NAK (§1.6): the receiver asks for `length` bytes from `term_offset` of `term_id` again."""

    session_id: int
    stream_id: int
    term_id: int
    term_offset: int
    length: int
    flags: int = 0

    def encode(self) -> bytes:
        return _pack(
            self,
            NAK_STRUCT,
            NAK_LENGTH,
            CURRENT_VERSION,
            self.flags,
            FrameType.NAK,
            self.session_id,
            self.stream_id,
            self.term_id,
            self.term_offset,
            self.length,
        )


@attrs.frozen(slots=True)
class Rttm:
    """RTT measurement (§1.7). RTTM_REPLY_FLAG on a request, cleared on the answer."""

    session_id: int
    stream_id: int
    echo_timestamp_ns: int
    reception_delta_ns: int
    receiver_id: int
    flags: int = 0

    def encode(self) -> bytes:
        return _pack(
            self,
            RTTM_STRUCT,
            RTTM_LENGTH,
            CURRENT_VERSION,
            self.flags,
            FrameType.RTTM,
            self.session_id,
            self.stream_id,
            self.echo_timestamp_ns,
            self.reception_delta_ns,
            self.receiver_id,
        )


def _check_error_message(message: str) -> None:
    if not message.isascii():
        raise ValueError(f"error frame message must be ASCII: {message!r}")
    if len(message) > MAX_ERROR_MESSAGE_LENGTH:
        raise ValueError(
            f"error frame message is {len(message)} bytes, max {MAX_ERROR_MESSAGE_LENGTH}"
        )


@attrs.frozen(slots=True)
class ErrorFrame:
    """ERR (§1.8): a receiver's rejection of an image, 40 bytes + ASCII message.

    The HAS_GROUP_TAG flag is kept equal to `group_tag is not None`: that is what decides whether
    the group tag field means anything on the wire, so the object can never contradict itself.
    The message is checked in `__attrs_post_init__` rather than by an attrs validator: mypyc
    compiles this class to a native class, whose fields cannot carry `attrs.field(...)`.
    """

    session_id: int
    stream_id: int
    receiver_id: int
    error_code: int
    message: str
    group_tag: int | None = None
    flags: int = 0

    def __attrs_post_init__(self) -> None:
        _check_error_message(self.message)
        flags = self.flags & ~ERR_HAS_GROUP_TAG_FLAG
        if self.group_tag is not None:
            flags |= ERR_HAS_GROUP_TAG_FLAG
        object.__setattr__(self, "flags", flags)

    @property
    def frame_length(self) -> int:
        return ERR_HEADER_LENGTH + len(self.message)

    def encode(self) -> bytes:
        text = self.message.encode("ascii")
        header = _pack(
            self,
            ERR_STRUCT,
            ERR_HEADER_LENGTH + len(text),
            CURRENT_VERSION,
            self.flags,
            FrameType.ERR,
            self.session_id,
            self.stream_id,
            self.receiver_id,
            0 if self.group_tag is None else self.group_tag,
            self.error_code,
            len(text),
        )
        return header + text


@attrs.frozen(slots=True)
class ResponseSetup:
    """RSP_SETUP (response channels, Aeron 1.44+, general availability 1.48): 20 bytes.

    A receiver whose image came from a SETUP with SETUP_SEND_RESPONSE_FLAG sends it to that
    publication's control address, naming the session of the response publication made for it
    (aeron_udp_protocol.h aeron_response_setup_header_t; aeron_receive_channel_endpoint.c
    aeron_receive_channel_endpoint_send_response_setup writes flags 0).
    """

    session_id: int
    stream_id: int
    response_session_id: int
    flags: int = 0

    def encode(self) -> bytes:
        return _pack(
            self,
            RSP_SETUP_STRUCT,
            RSP_SETUP_LENGTH,
            CURRENT_VERSION,
            self.flags,
            FrameType.RSP_SETUP,
            self.session_id,
            self.stream_id,
            self.response_session_id,
        )


Frame: TypeAlias = DataHeader | Setup | StatusMessage | Nak | Rttm | ErrorFrame | ResponseSetup

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
    datagram is a chain of contiguous aligned frames copied from one term (§2.6): the whole chain
    is checked and the first frame's header returned, because the receiver copies the datagram
    into the term at that header's offset (TermRebuilder.insert). Raises only `FrameError`;
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

    minimum = _CONTROL_MINIMUM[frame_type]
    name = FrameType(frame_type).name
    if length < minimum:
        raise FrameError("too_short", f"{name} datagram of {length} bytes, needs {minimum}")
    if not minimum <= frame_length <= length:
        raise FrameError(
            "length_mismatch",
            f"{name} frame_length {frame_length} outside [{minimum}, {length}] (datagram length)",
        )

    if frame_type == FrameType.SM:
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
    if frame_type == FrameType.SETUP:
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
    if frame_type == FrameType.NAK:
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
    if frame_type == FrameType.RTTM:
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
    if frame_type == FrameType.RSP_SETUP:
        (_, _, _, _, session_id, stream_id, response_session_id) = RSP_SETUP_STRUCT.unpack_from(
            data, 0
        )
        return ResponseSetup(
            session_id=session_id,
            stream_id=stream_id,
            response_session_id=response_session_id,
            flags=flags,
        )
    return _parse_error_frame(data, frame_length, flags)


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
    unpack_from = DATA_HEADER_STRUCT.unpack_from
    first = unpack_from(data, 0)
    (_, _, flags, _, term_offset, session_id, stream_id, term_id, reserved) = first
    if term_offset < 0 or term_offset % FRAME_ALIGNMENT:
        return None
    offset = 0
    boundary = segment
    expected = term_offset
    data_type = FrameType.DATA.value
    while offset < length:
        if offset + DATA_HEADER_LENGTH > length:
            return None
        (fl, version, _, ftype, toff, sid, strm, tid, _) = unpack_from(data, offset)
        if (
            version != CURRENT_VERSION
            or ftype != data_type
            or fl < DATA_HEADER_LENGTH
            or toff != expected
            or sid != session_id
            or strm != stream_id
            or tid != term_id
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


def _parse_data_chain(data: Buffer, length: int) -> DataHeader:
    """Check a DATA/PAD datagram frame by frame (§2.3, §2.6); return the first header."""
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
        if aligned == length and frame_length >= DATA_HEADER_LENGTH:
            return  # one whole frame fills the datagram: the common case, nothing more to check
    _check_chain_frame(frame_length, frame_type, 0, length)
    offset = align(frame_length) if frame_type == FrameType.DATA else length
    expected_term_offset = term_offset + offset
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
    # PAD: its frame_length covers the rest of the term, but only its header is sent (§2.6),
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
