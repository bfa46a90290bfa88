"""A publication's log appender (Aeron's TermAppender with its HeaderWriter): where the tail
is, how a message becomes frames at the tail of the active term, and the term rotation.

Pure and single-threaded: a frame is written whole before anyone reads it, so, unlike Aeron's
appender, it need not write its length last. NetworkPublication (publication.py) decides whether
a message may be appended (flow control, closing); this module only writes.

A DATA header is: frame length, version, flags, type (8 bytes that depend only on the payload's
length, for an unfragmented frame); term offset; session id, stream id, term id (12 bytes that
change once a term); a reserved 0. So a whole unfragmented frame, header and payload, is written
by one `pack_into` whose only integer is the term offset (struct converts an int field with
arithmetic, a bytes field with a copy).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Final

from echo.transport.core.frames import (
    DATA_HEADER_LENGTH,
    DATA_HEADER_STRUCT,
    FRAME_ALIGNMENT,
    UNFRAGMENTED_FLAGS,
    FrameType,
)
from echo.transport.core.logbuffer import (
    PARTITION_COUNT,
    TermBuffers,
    append_message,
    compute_fragmented_length,
    compute_max_message_length,
    i32,
    max_possible_position,
    position_bits_to_shift,
    write_pad,
)

_ALIGN: Final = FRAME_ALIGNMENT - 1  # (length + _ALIGN) & ~_ALIGN: the 32-byte frame alignment
#: frame length, version, flags, type of an unfragmented DATA frame
_FRAME_START: Final = struct.Struct("<iBBH")
#: session id, stream id, term id
_IDS: Final = struct.Struct("<iii")
#: a header without its payload: frame start, term offset, ids, reserved
_HEADER: Final = struct.Struct("<8si12s8x")
#: an unfragmented frame of one payload length: `pack_into(term, offset, frame start, term
#: offset, ids, payload)` of a "<8si12s8x{n}s" struct, and its frame start (made once)
_Packing = tuple[Callable[..., None], bytes]
#: the packings by payload length, shared; bounded: past that, header and payload are written
#: apart
_PACKINGS: Final[dict[int, _Packing]] = {}
_MAX_PACKINGS: Final = 4096


def _frame_start(length: int) -> bytes:
    return _FRAME_START.pack(DATA_HEADER_LENGTH + length, 0, UNFRAGMENTED_FLAGS, FrameType.DATA)


def _packing(length: int) -> _Packing:
    return struct.Struct(f"<8si12s8x{length}s").pack_into, _frame_start(length)


class LogAppender:
    """The tail of one publication's log (3 terms of `term_length` bytes)."""

    __slots__ = (
        "_frame_start",
        "_ids",
        "_pack_into",
        "_packed_length",
        "_term",
        "bits",
        "initial_term_id",
        "log",
        "mask",
        "max_message_length",
        "max_payload",
        "max_position",
        "run_offset",
        "run_step",
        "session_id",
        "stream_id",
        "tail_offset",
        "term_count",
        "term_length",
    )

    def __init__(
        self, *, session_id: int, stream_id: int, initial_term_id: int, term_length: int, mtu: int
    ) -> None:
        self.session_id = session_id
        self.stream_id = stream_id
        self.initial_term_id = initial_term_id
        self.term_length = term_length
        self.max_payload = mtu - DATA_HEADER_LENGTH
        self.max_message_length = compute_max_message_length(term_length)
        if mtu > self.max_message_length:
            raise ValueError(f"mtu {mtu} is larger than the maximum message length of the term")
        self.bits = position_bits_to_shift(term_length)
        self.mask = term_length - 1
        self.max_position = max_possible_position(term_length)
        self.log = TermBuffers(term_length)
        #: terms filled so far (the active term is `term_count % PARTITION_COUNT`)
        self.term_count = 0
        self.tail_offset = 0
        #: the header's session id, stream id and term id, as they are written
        self._ids = b""
        #: the active term (`log.terms[term_count % PARTITION_COUNT]`)
        self._term = self.log.terms[0]
        #: the packing of the payload length appended last (a stream's messages are mostly of
        #: one length): no lookup in _PACKINGS per message; -1: none yet
        self._packed_length = -1
        self._pack_into: Callable[..., None] = _HEADER.pack_into
        self._frame_start = b""
        #: the frames in [run_offset, tail_offset) of the active term are unfragmented DATA
        #: frames of `run_step` bytes each (aligned): the scanner cuts them into datagrams
        #: without reading their headers (scanner.py). The run starts anew where a frame of
        #: another length is appended, after a fragmented message and with each new term.
        self.run_offset = 0
        self.run_step = 0
        self._set_term_ids()

    @property
    def position(self) -> int:
        """The tail: where the next message will be appended."""
        return (self.term_count << self.bits) + self.tail_offset

    @property
    def active_term_id(self) -> int:
        return i32(self.initial_term_id + self.term_count)

    def required(self, length: int) -> int:
        """Bytes a message of `length` occupies in the term (aligned, fragmented if need be);
        ValueError if it is longer than a message may be."""
        if length <= self.max_payload:
            return (length + DATA_HEADER_LENGTH + _ALIGN) & ~_ALIGN
        if length > self.max_message_length:
            raise ValueError(
                f"message of {length} bytes exceeds the maximum message length "
                f"{self.max_message_length} (min(term length / 8, 16 MiB))"
            )
        return compute_fragmented_length(length, self.max_payload)

    def fits(self, required: int) -> bool:
        """Does a message of `required` bytes fit in what is left of the active term?"""
        return self.tail_offset + required <= self.term_length

    def append(self, data: bytes | bytearray | memoryview) -> int:
        """Append a message that `fits`; returns the new tail position."""
        offset = self.tail_offset
        length = len(data)
        if length <= self.max_payload:
            term = self._term
            if length == self._packed_length and isinstance(data, (bytes, bytearray)):
                # (offset as one object: compiled, an int passed twice is boxed twice)
                at: object = offset
                self._pack_into(term, at, self._frame_start, at, self._ids, data)
            else:
                self._append_unfragmented(term, offset, data, length)
            offset += (DATA_HEADER_LENGTH + length + _ALIGN) & ~_ALIGN
        else:
            offset = append_message(
                self._term,
                offset,
                data,
                self.max_payload,
                session_id=self.session_id,
                stream_id=self.stream_id,
                term_id=self.active_term_id,
            )
            self.run_offset = offset
        self.tail_offset = offset
        return (self.term_count << self.bits) + offset

    def _append_unfragmented(
        self, term: memoryview, offset: int, data: bytes | bytearray | memoryview, length: int
    ) -> None:
        """`append` of one frame whose payload length is not the one packed last (or whose
        data is a memoryview): with its length's packing, which becomes the one kept."""
        step = (DATA_HEADER_LENGTH + length + _ALIGN) & ~_ALIGN
        if step != self.run_step:
            self.run_offset = offset
            self.run_step = step
        packing = _PACKINGS.get(length)
        if packing is None and len(_PACKINGS) < _MAX_PACKINGS:
            packing = _PACKINGS[length] = _packing(length)
        if packing is not None and isinstance(data, (bytes, bytearray)):
            pack_into, frame_start = packing
            pack_into(term, offset, frame_start, offset, self._ids, data)
            self._packed_length = length
            self._pack_into = pack_into
            self._frame_start = frame_start
        else:
            payload = offset + DATA_HEADER_LENGTH
            term[payload : payload + length] = data
            _HEADER.pack_into(term, offset, _frame_start(length), offset, self._ids)
            # (append's shortcut writes frames of the length packed last without a word to
            # the run: only while that length is the run's)
            self._packed_length = -1

    def pad_and_rotate(self) -> None:
        """A message does not fit: pad out the active term and move to the next one (a message
        never spans terms)."""
        offset = self.tail_offset
        if offset < self.term_length:
            write_pad(
                self.log.terms[self.term_count % PARTITION_COUNT],
                offset,
                session_id=self.session_id,
                stream_id=self.stream_id,
                term_id=self.active_term_id,
            )
        self.term_count += 1
        self.tail_offset = 0
        self._set_term_ids()
        if self.term_count >= PARTITION_COUNT:
            # The partition we move into last held the term three back: the sender position is
            # within half a term of the tail, so nothing there can still be sent or resent.
            self.log.clean(self.term_count % PARTITION_COUNT)

    def data_header(self, position: int, flags: int) -> bytes:
        """A DATA header with no payload (a heartbeat) at `position`."""
        frame = bytearray(DATA_HEADER_LENGTH)
        DATA_HEADER_STRUCT.pack_into(
            frame,
            0,
            0,
            0,
            flags,
            FrameType.DATA,
            position & self.mask,
            self.session_id,
            self.stream_id,
            i32(self.initial_term_id + (position >> self.bits)),
            0,
        )
        return bytes(frame)

    def _set_term_ids(self) -> None:
        """A new active term: its ids as the headers carry them, and its buffer."""
        self._ids = _IDS.pack(self.session_id, self.stream_id, self.active_term_id)
        self._term = self.log.terms[self.term_count % PARTITION_COUNT]
        self.run_offset = self.tail_offset

    def set_tail(self, term_count: int, tail_offset: int) -> None:
        """Move the tail (tests: a stream near the end of its positions)."""
        self.term_count = term_count
        self.tail_offset = tail_offset
        self._set_term_ids()
