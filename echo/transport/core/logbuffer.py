"""Term buffers and the position arithmetic of the Aeron log (Aeron's LogBufferDescriptor).

A stream's log is three terms of a power-of-two length. A *position* is a 64-bit byte count
from the start of the stream; `(term_id, term_offset)` is the same thing on the wire, with
`term_id` an int32 that wraps. Everything here is pure: no clock, no sockets.

Terms are anonymous private mmaps, so a 16 MiB term costs only the pages a stream touches, and a
term is "cleaned" (zeroed) with MADV_DONTNEED instead of writing zeros: a server with a thousand
duologues must not hold three full terms per stream in memory.
"""

from __future__ import annotations

import mmap
import re
import struct
import sys
from typing import Final, Literal, Protocol

from echo.transport.core.frames import (
    BEGIN_FLAG,
    DATA_HEADER_LENGTH,
    DATA_HEADER_STRUCT,
    END_FLAG,
    FRAME_ALIGNMENT,
    UNFRAGMENTED_FLAGS,
    FrameType,
    align,
)

PARTITION_COUNT: Final = 3
TERM_MIN_LENGTH: Final = 64 * 1024
TERM_MAX_LENGTH: Final = 1024 * 1024 * 1024
MAX_MESSAGE_LENGTH_LIMIT: Final = 16 * 1024 * 1024

_NON_ZERO: Final = re.compile(rb"[^\x00]")
#: the host stores ints as the wire does (little-endian): native int views read headers
_LITTLE_ENDIAN: Final = sys.byteorder == "little"
#: a frame header's first 8 bytes as one little-endian int64 (`TermBuffers.words`): the frame
#: length in the low 32 bits, then version, flags (bits 40-47) and type (bits 48-63)
FLAGS_SHIFT: Final = 40
TYPE_SHIFT: Final = 48
FRAME_LENGTH_MASK: Final = 0xFFFFFFFF
_ALIGN: Final = FRAME_ALIGNMENT - 1
_PAD: Final = int(FrameType.PAD)
#: in `lengths`, a header's second int32 holds version, flags and, from this bit, its type
_TYPE_SHIFT_IN_INT32: Final = 16


class IntView(Protocol):
    """A term as little-endian ints of one size (`TermBuffers.lengths`, `.words`).

    The readers that run once per frame (scanner, rebuilder, assembler) read a header this way:
    one item access, where `struct.unpack_from` builds a tuple of every field.
    """

    def __getitem__(self, index: int, /) -> int: ...

    def release(self) -> None: ...


class _LittleEndianView:
    """`IntView` on a big-endian host, where a native view would read the wrong way round."""

    __slots__ = ("_size", "_unpack", "_view")

    def __init__(self, view: memoryview, code: Literal["i", "q"]) -> None:
        self._view = view
        self._unpack = struct.Struct("<" + code).unpack_from
        self._size = struct.calcsize(code)

    def __getitem__(self, index: int, /) -> int:
        value: int = self._unpack(self._view, index * self._size)[0]
        return value

    def release(self) -> None:
        pass


def int_view(
    term: memoryview, code: Literal["i", "q"], little_endian: bool = _LITTLE_ENDIAN
) -> IntView:
    """`term` as little-endian ints of struct format `code` ("i": int32, "q": int64): a native
    cast where the host is little-endian, as the wire is."""
    if little_endian:
        return term.cast(code)
    return _LittleEndianView(term, code)


def i32(value: int) -> int:
    """Wrap to a signed 32-bit int, as Java's int arithmetic does (LogBufferDescriptor)."""
    return ((value + 0x80000000) & 0xFFFFFFFF) - 0x80000000


def check_term_length(term_length: int) -> None:
    if not TERM_MIN_LENGTH <= term_length <= TERM_MAX_LENGTH:
        raise ValueError(
            f"term length {term_length} outside [{TERM_MIN_LENGTH}, {TERM_MAX_LENGTH}]"
        )
    if term_length & (term_length - 1):
        raise ValueError(f"term length {term_length} is not a power of two")


def position_bits_to_shift(term_length: int) -> int:
    return term_length.bit_length() - 1


def compute_position(term_id: int, term_offset: int, bits: int, initial_term_id: int) -> int:
    # The int32 subtraction wraps *before* widening: that is what lets term ids wrap past 2^31 - 1.
    term_count = i32(term_id - initial_term_id)
    return (term_count << bits) + term_offset


def compute_term_begin_position(term_id: int, bits: int, initial_term_id: int) -> int:
    return i32(term_id - initial_term_id) << bits


def compute_term_id(position: int, bits: int, initial_term_id: int) -> int:
    return i32((position >> bits) + initial_term_id)


def compute_max_message_length(term_length: int) -> int:
    return min(term_length >> 3, MAX_MESSAGE_LENGTH_LIMIT)


def max_possible_position(term_length: int) -> int:
    return term_length << 31


def partition_index(position: int, bits: int) -> int:
    return (position >> bits) % PARTITION_COUNT


def compute_fragmented_length(length: int, max_payload: int) -> int:
    """Bytes a message of `length` occupies in the term once fragmented (FrameDescriptor)."""
    full, remainder = divmod(length, max_payload)
    total = full * align(max_payload + DATA_HEADER_LENGTH)
    if remainder > 0 or length == 0:
        total += align(remainder + DATA_HEADER_LENGTH)
    return total


class TermBuffers:
    """Three terms of `term_length` bytes, lazily backed by the OS.

    Each term is seen four ways: `maps` (the mmap: a slice of it is a `bytes` copy, made in
    one step), `terms` (a byte memoryview: in-place slices, writes), `lengths` (int32s:
    `lengths[offset >> 2]` is the length of the frame at `offset`) and `words` (int64s:
    `words[offset >> 3]` is its length, flags and type, see FLAGS_SHIFT).
    """

    __slots__ = ("lengths", "maps", "term_length", "terms", "words")

    def __init__(self, term_length: int) -> None:
        check_term_length(term_length)
        self.term_length = term_length
        self.maps = [
            mmap.mmap(-1, term_length, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            for _ in range(PARTITION_COUNT)
        ]
        self.terms = [memoryview(m) for m in self.maps]
        self.lengths = [int_view(view, "i") for view in self.terms]
        self.words = [int_view(view, "q") for view in self.terms]

    def clean(self, index: int) -> None:
        """Zero a whole term: MADV_DONTNEED on a private anonymous map gives fresh zero pages."""
        try:
            self.maps[index].madvise(mmap.MADV_DONTNEED)
        except (AttributeError, OSError):  # pragma: no cover - non-Linux fallback
            self.terms[index][:] = bytes(self.term_length)

    def close(self) -> None:
        for views in (self.lengths, self.words):
            for view in views:
                view.release()
        for view in self.terms:
            view.release()
        for m in self.maps:
            m.close()


def write_frame(
    term: memoryview,
    term_offset: int,
    *,
    flags: int,
    frame_type: int,
    session_id: int,
    stream_id: int,
    term_id: int,
    payload: bytes | bytearray | memoryview,
) -> int:
    """Write one frame (header + payload); returns its aligned length."""
    length = len(payload)
    frame_length = DATA_HEADER_LENGTH + length
    start = term_offset + DATA_HEADER_LENGTH
    term[start : start + length] = payload
    DATA_HEADER_STRUCT.pack_into(
        term,
        term_offset,
        frame_length,
        0,
        flags,
        frame_type,
        term_offset,
        session_id,
        stream_id,
        term_id,
        0,
    )
    return align(frame_length)


def write_pad(
    term: memoryview, term_offset: int, *, session_id: int, stream_id: int, term_id: int
) -> None:
    """Fill `[term_offset, term_length)` with one PAD frame (only its header is written)."""
    DATA_HEADER_STRUCT.pack_into(
        term,
        term_offset,
        len(term) - term_offset,
        0,
        UNFRAGMENTED_FLAGS,
        FrameType.PAD,
        term_offset,
        session_id,
        stream_id,
        term_id,
        0,
    )


def append_message(
    term: memoryview,
    term_offset: int,
    data: bytes | bytearray | memoryview,
    max_payload: int,
    *,
    session_id: int,
    stream_id: int,
    term_id: int,
) -> int:
    """Append a (possibly fragmented) message at `term_offset`; returns the new tail offset.

    The caller has checked that `compute_fragmented_length(len(data))` fits in the term.
    """
    length = len(data)
    if length <= max_payload:
        return term_offset + write_frame(
            term,
            term_offset,
            flags=UNFRAGMENTED_FLAGS,
            frame_type=FrameType.DATA,
            session_id=session_id,
            stream_id=stream_id,
            term_id=term_id,
            payload=data,
        )
    # Fragments (Aeron's TermAppender): full ones of `max_payload` bytes, then the rest. Written in
    # one loop with the header packed in place: this runs once per fragment.
    view = memoryview(data)
    pack_into = DATA_HEADER_STRUCT.pack_into
    frame_length = DATA_HEADER_LENGTH + max_payload
    step = (frame_length + FRAME_ALIGNMENT - 1) & ~(FRAME_ALIGNMENT - 1)
    offset = term_offset
    flags = BEGIN_FLAG
    data_type = FrameType.DATA
    for consumed in range(0, length - max_payload, max_payload):
        start = offset + DATA_HEADER_LENGTH
        term[start : start + max_payload] = view[consumed : consumed + max_payload]
        pack_into(
            term, offset, frame_length, 0, flags, data_type, offset, session_id, stream_id,
            term_id, 0,
        )
        flags = 0
        offset += step
    last = length - (length - 1) // max_payload * max_payload
    return offset + write_frame(
        term,
        offset,
        flags=flags | END_FLAG,
        frame_type=FrameType.DATA,
        session_id=session_id,
        stream_id=stream_id,
        term_id=term_id,
        payload=view[length - last :],
    )


def scan_for_availability(
    lengths: IntView, term_offset: int, max_length: int, term_length: int
) -> tuple[int, int]:
    """How many bytes of whole aligned frames can go in one datagram (Aeron's TermScanner).

    Returns `(available, padding)`: `available` bytes start at `term_offset`; a PAD frame
    contributes only its header and `padding` is the rest of it, which the sender skips.
    `lengths` is a publication's own log (`TermBuffers.lengths`).
    """
    available = 0
    padding = 0
    offset = term_offset
    while offset < term_length:
        frame_length = lengths[offset >> 2]
        if frame_length <= 0:
            break
        aligned = (frame_length + _ALIGN) & ~_ALIGN
        # A PAD always runs to the end of the term: only a frame that does is looked at twice.
        if (
            offset + aligned == term_length
            and lengths[(offset >> 2) + 1] >> _TYPE_SHIFT_IN_INT32 == _PAD
        ):
            padding = aligned - DATA_HEADER_LENGTH
            aligned = DATA_HEADER_LENGTH
        available += aligned
        if available > max_length:
            available -= aligned
            padding = 0
            break
        if padding or available >= max_length:
            break
        offset += aligned
    return available, padding


def insert_packet(
    term: memoryview | mmap.mmap, lengths: IntView, term_offset: int, packet: bytes | memoryview
) -> bool:
    """Copy a received datagram into the term unless its first slot is already filled.

    Aeron's TermRebuilder: a retransmit of frames already held is harmless, because the
    bytes at a given offset of a stream never change. (The term is best given as its mmap,
    `TermBuffers.maps`: slice assignment to it is a plain copy, to a memoryview it first
    compares the two buffers' formats.)
    """
    if lengths[term_offset >> 2]:
        return False
    term[term_offset : term_offset + len(packet)] = packet
    return True


def rebuild_offset(lengths: IntView, term_offset: int, limit_offset: int) -> int:
    """Walk complete frames from `term_offset`; returns the offset of the first empty slot."""
    offset = term_offset
    while offset < limit_offset:
        frame_length = lengths[offset >> 2]
        if frame_length <= 0:
            break
        offset += (frame_length + _ALIGN) & ~_ALIGN
    return offset


def scan_for_gap(
    term: memoryview, lengths: IntView, term_offset: int, limit_offset: int
) -> tuple[int, int] | None:
    """Find the first gap in `[term_offset, limit_offset)` (Aeron's TermGapScanner).

    Returns `(gap_offset, gap_length)` or None. A gap runs from the first empty slot to the
    next slot that holds a frame (or to `limit_offset`).
    """
    begin = rebuild_offset(lengths, term_offset, limit_offset)
    if begin >= limit_offset:
        return None
    # Every received frame starts on a 32-byte slot with a non-zero length, and nothing inside a
    # gap has been written, so the next non-zero byte marks the end of the gap. The regex finds
    # it in C, in place, without copying the region or looping over slots in Python.
    found = _NON_ZERO.search(term, begin, limit_offset)
    if found is None:
        length = limit_offset - begin
    else:
        zeros = found.start() - begin
        length = zeros - (zeros % FRAME_ALIGNMENT)
    if length <= 0:
        length = FRAME_ALIGNMENT
    return begin, length
