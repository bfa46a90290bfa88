"""The Aeron wire format (Aeron's wire-protocol page; Aeron's flyweights): lengths, type codes,
flags, struct layouts, and the frame records that encode to exactly those bytes.

Every multi-byte field is little-endian (as Aeron's flyweights write them). Each frame class encodes
to the exact bytes an Aeron 1.47 driver puts on the wire; the captures in tests/data/aeron-captures
re-encode byte for byte. This is the trusted, local half of the codecs: a field out of its wire
range is a programming error (ValueError). Bytes from the network are decoded by frames.py, whose
functions raise only `FrameError`; everything here is importable from there too.

Pure module: no trio, no clock, no sockets.
"""

from __future__ import annotations

import enum
import struct
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
    """Wire type codes (HeaderFlyweight). PAD..RTTM and RSP_SETUP are decoded; the rest are rejected
    as unknown."""

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


# DATA / PAD flags (DataHeaderFlyweight).
BEGIN_FLAG: Final = 0x80
END_FLAG: Final = 0x40
EOS_FLAG: Final = 0x20
#: with EOS on a heartbeat: the publisher revoked the stream (Aeron 1.48 `Publication#revoke`):
#: what was not yet sent is gone, and receivers end the image at once
REVOKED_FLAG: Final = 0x10
UNFRAGMENTED_FLAGS: Final = 0xC0
BEGIN_END_AND_EOS_FLAGS: Final = 0xE0
# SM flags (StatusMessageFlyweight).
SM_SETUP_FLAG: Final = 0x80
SM_EOS_FLAG: Final = 0x40
# SETUP flags (SetupFlyweight).
SETUP_GROUP_FLAG: Final = 0x40
SETUP_SEND_RESPONSE_FLAG: Final = 0x80
# RTTM flags (RttMeasurementFlyweight): set by the receiver on a request, cleared on the answer.
RTTM_REPLY_FLAG: Final = 0x80
# ERR flags (ErrorFlyweight).
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


def _pack(frame: object, packer: struct.Struct, *values: int) -> bytes:
    try:
        return packer.pack(*values)
    except struct.error as exc:
        # Encoding is local: a field out of its wire range is a programming error, not bad input.
        raise ValueError(f"cannot encode {frame!r}: {exc}") from None


@attrs.frozen(slots=True)
class DataHeader:
    """The 32-byte header of a DATA or PAD frame (DataHeaderFlyweight); `frame_length` unaligned."""

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
    """SETUP (SetupFlyweight): sent by a publication until a receiver answers with an SM."""

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
    """SM (StatusMessageFlyweight). With a group tag the frame is 44 bytes, else 36."""

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
    """NAK (NakFlyweight): a receiver asks again for `length` bytes at `term_offset`, `term_id`."""

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
    """RTT measurement (RttMeasurementFlyweight): RTTM_REPLY_FLAG on a request, not on answers."""

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
    """ERR (ErrorFlyweight): a receiver's rejection of an image, 40 bytes + ASCII message.

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
