"""The compact binary encoding of logical-channel frames on a session's byte messages.

One session message carries one or more frames back to back. Every frame is a one-byte kind
followed by unsigned LEB128 varints (and, for DATA and BIND, the payload bytes):

    DATA               01 channel len payload
    DATA_REFS          02 channel n (handle_type handle*2+sender_created)*n len payload
    BIND               03 handle_type len value
    GUARANTEE          10 channel amount
    ABSOLVE            11 channel amount
    PLEAD              12 channel target
    LIMIT_SENDING      13 channel bound          (absolute, see core.py)
    LIMIT_RECEIVING    14 channel bound          (absolute, see core.py)
    ANNOUNCE_DROPPING  15 channel
    APOLOGISE          16 channel
    FREE_HANDLE        17 handle_type handle*2+mine

DATA, DATA_REFS and BIND belong to a logical channel; the other kinds are the resource-management
note's control messages and belong to none. The size of a channel message, the unit of every
guarantee, is `message_size`: its payload bytes plus 2 per handle reference, at least 1 (so an empty
message still costs buffer space). Framing bytes do not count: they are never buffered.

`decode_frames` parses untrusted bytes and raises nothing but `WireError`.
"""

from __future__ import annotations

import enum

import attrs

from echo.codec import MAX_VARINT as MAX_VARINT  # varints are capped at 63 bits (9 bytes)
from echo.codec import Buffer, CodecError


class WireError(CodecError):
    """Bytes that are not a well-formed sequence of channel frames."""


class Kind(enum.IntEnum):
    # Every kind is below 0x20: a channel message never starts with b"ERROR ", which
    # echo.session reserves for close(reason).
    DATA = 0x01
    DATA_REFS = 0x02
    BIND = 0x03
    GUARANTEE = 0x10
    ABSOLVE = 0x11
    PLEAD = 0x12
    LIMIT_SENDING = 0x13
    LIMIT_RECEIVING = 0x14
    ANNOUNCE_DROPPING = 0x15
    APOLOGISE = 0x16
    FREE_HANDLE = 0x17


@attrs.frozen
class HandleRef:
    """A reference, inside a channel message, to a data handle.

    `sender_created` is seen from the peer that sends the message: True when that peer created
    (bound) the handle, False when the message's receiver did.
    """

    handle_type: int
    handle: int
    sender_created: bool


@attrs.frozen
class Data:
    channel: int
    payload: bytes
    refs: tuple[HandleRef, ...] = ()


@attrs.frozen
class Bind:
    """BindHandle: travels on the logical channel whose id is its handle type."""

    handle_type: int
    value: bytes

    @property
    def channel(self) -> int:
        return self.handle_type


@attrs.frozen
class Guarantee:
    channel: int
    amount: int


@attrs.frozen
class Absolve:
    channel: int
    amount: int


@attrs.frozen
class Plead:
    channel: int
    target: int


@attrs.frozen
class LimitSending:
    channel: int
    bound: int


@attrs.frozen
class LimitReceiving:
    channel: int
    bound: int


@attrs.frozen
class AnnounceDropping:
    channel: int


@attrs.frozen
class Apologise:
    channel: int


@attrs.frozen
class FreeHandle:
    handle_type: int
    handle: int
    mine: bool


ChannelMessage = Data | Bind
Control = (
    Guarantee
    | Absolve
    | Plead
    | LimitSending
    | LimitReceiving
    | AnnounceDropping
    | Apologise
    | FreeHandle
)
Frame = ChannelMessage | Control

_AMOUNT_KINDS: dict[type, Kind] = {
    Guarantee: Kind.GUARANTEE,
    Absolve: Kind.ABSOLVE,
    LimitSending: Kind.LIMIT_SENDING,
    LimitReceiving: Kind.LIMIT_RECEIVING,
}


def message_size(frame: Data | Bind) -> int:
    """The bytes a channel message occupies in the receiver's buffer (both peers agree)."""
    if isinstance(frame, Bind):
        return max(1, len(frame.value))
    return max(1, len(frame.payload) + 2 * len(frame.refs))


def encode(frame: Frame) -> bytes:
    """The bytes of one frame. Raises ValueError for a value no frame can carry (local misuse)."""
    if type(frame) is Data and not frame.refs and frame.channel < 0x80:
        # The hot path: a plain message on one of the first 128 channels.
        n = len(frame.payload)
        if n < 0x80:
            return bytes((Kind.DATA, frame.channel, n)) + frame.payload
        if n < 0x4000:
            return bytes((Kind.DATA, frame.channel, (n & 0x7F) | 0x80, n >> 7)) + frame.payload
    out = Buffer()
    if isinstance(frame, Data):
        if frame.refs:
            out.push_uint8(Kind.DATA_REFS)
            out.push_varint(frame.channel)
            out.push_varint(len(frame.refs))
            for ref in frame.refs:
                out.push_varint(ref.handle_type)
                out.push_varint(ref.handle * 2 + int(ref.sender_created))
        else:
            out.push_uint8(Kind.DATA)
            out.push_varint(frame.channel)
        out.push_bytes_varint(frame.payload)
    elif isinstance(frame, Bind):
        out.push_uint8(Kind.BIND)
        out.push_varint(frame.handle_type)
        out.push_bytes_varint(frame.value)
    elif isinstance(frame, Guarantee | Absolve | LimitSending | LimitReceiving):
        out.push_uint8(_AMOUNT_KINDS[type(frame)])
        out.push_varint(frame.channel)
        out.push_varint(
            frame.bound if isinstance(frame, LimitSending | LimitReceiving) else frame.amount
        )
    elif isinstance(frame, Plead):
        out.push_uint8(Kind.PLEAD)
        out.push_varint(frame.channel)
        out.push_varint(frame.target)
    elif isinstance(frame, AnnounceDropping):
        out.push_uint8(Kind.ANNOUNCE_DROPPING)
        out.push_varint(frame.channel)
    elif isinstance(frame, Apologise):
        out.push_uint8(Kind.APOLOGISE)
        out.push_varint(frame.channel)
    elif isinstance(frame, FreeHandle):
        out.push_uint8(Kind.FREE_HANDLE)
        out.push_varint(frame.handle_type)
        out.push_varint(frame.handle * 2 + int(frame.mine))
    else:  # pragma: no cover - the union is closed
        raise TypeError(f"not a channel frame: {frame!r}")
    return out.data


def plain_header(channel: int, length: int) -> bytes:
    """The bytes of a DATA frame (no references) that precede its `length` payload bytes."""
    if channel < 0x80:
        if length < 0x80:
            return bytes((Kind.DATA, channel, length))
        if length < 0x4000:
            return bytes((Kind.DATA, channel, (length & 0x7F) | 0x80, length >> 7))
    out = Buffer()
    out.push_uint8(Kind.DATA)
    out.push_varint(channel)
    out.push_varint(length)
    return out.data


def decode_frames(data: bytes) -> list[Frame]:
    """Parse one session message (untrusted bytes) into its frames.

    Raises only WireError; the work is O(len(data)).
    """
    return [Data(*f) if isinstance(f, tuple) else f for f in decode_frames_raw(data)]


def decode_frames_raw(data: bytes) -> list[Frame | tuple[int, bytes]]:
    """decode_frames, but a plain DATA frame (no references) is a (channel, payload) tuple.

    Untrusted bytes; raises only WireError.
    """
    if not data:
        raise WireError("empty message")
    raw = bytes(data)
    frames: list[Frame | tuple[int, bytes]] = []
    pos, end = 0, len(raw)
    while pos < end:
        frame, pos = decode_frame(raw, pos)
        frames.append(frame)
    return frames


def decode_frame(raw: bytes, pos: int) -> tuple[Frame | tuple[int, bytes], int]:
    """The frame that starts at `pos` in `raw` (untrusted bytes), and the position after it.

    A plain DATA frame (no references) is a (channel, payload) tuple. Raises only WireError
    (`pos` must be inside `raw`); the work is O(the frame's length).
    """
    end = len(raw)
    code = raw[pos]
    # The hot path: DATA with a one-byte channel and a one- or two-byte length.
    if code == 0x01 and pos + 3 < end and raw[pos + 1] < 0x80:
        n = raw[pos + 2]
        start = pos + 3
        if n >= 0x80:
            n2 = raw[pos + 3]
            if n2 < 0x80:
                n = (n & 0x7F) | (n2 << 7)
                start = pos + 4
            else:
                n = -1
        if n >= 0 and start + n <= end:
            return (raw[pos + 1], raw[start : start + n]), start + n
    reader = Buffer(raw, error=WireError)
    reader.seek(pos + 1)
    varint = reader.pull_varint
    frame: Frame
    if code == Kind.DATA:
        channel = varint()
        return (channel, reader.pull_bytes_varint()), reader.tell()
    elif code == Kind.DATA_REFS:
        channel = varint()
        count = varint()
        # Every ref takes at least two bytes: a count beyond that is a lie, not a big loop.
        if count == 0 or count * 2 > reader.remaining:
            raise WireError(f"bad reference count {count}")
        refs = []
        for _ in range(count):
            handle_type = varint()
            packed = varint()
            refs.append(HandleRef(handle_type, packed >> 1, bool(packed & 1)))
        frame = Data(channel, reader.pull_bytes_varint(), tuple(refs))
    elif code == Kind.BIND:
        handle_type = varint()
        frame = Bind(handle_type, reader.pull_bytes_varint())
    elif code == Kind.GUARANTEE:
        frame = Guarantee(varint(), varint())
    elif code == Kind.ABSOLVE:
        frame = Absolve(varint(), varint())
    elif code == Kind.PLEAD:
        frame = Plead(varint(), varint())
    elif code == Kind.LIMIT_SENDING:
        frame = LimitSending(varint(), varint())
    elif code == Kind.LIMIT_RECEIVING:
        frame = LimitReceiving(varint(), varint())
    elif code == Kind.ANNOUNCE_DROPPING:
        frame = AnnounceDropping(varint())
    elif code == Kind.APOLOGISE:
        frame = Apologise(varint())
    elif code == Kind.FREE_HANDLE:
        handle_type = varint()
        packed = varint()
        frame = FreeHandle(handle_type, packed >> 1, bool(packed & 1))
    else:
        raise WireError(f"unknown frame kind 0x{code:02x}")
    return frame, reader.tell()
