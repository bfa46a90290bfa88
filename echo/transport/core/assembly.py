"""Fragment assembly: complete messages out of an image's rebuilt term (Aeron's
FragmentAssembler over Image.poll).

Pure. A message longer than the MTU arrives as fragments, BEGIN ... END, in consecutive frames
of one term (a message never spans terms). The assembler keeps views of the fragments until
the last one arrives, then joins them: one copy in all. The views stay valid: the term is only
cleaned two terms later.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from echo.transport.core.frames import (
    BEGIN_FLAG,
    DATA_HEADER_LENGTH,
    END_FLAG,
    FRAME_ALIGNMENT,
    UNFRAGMENTED_FLAGS,
    FrameType,
)
from echo.transport.core.logbuffer import FLAGS_SHIFT, FRAME_LENGTH_MASK, TYPE_SHIFT, TermBuffers
from echo.transport.core.message import Message, Origin

Deliver = Callable[[bytes], object]

_ALIGN: Final = FRAME_ALIGNMENT - 1  # (length + _ALIGN) & ~_ALIGN: the 32-byte frame alignment
_PAD: Final = int(FrameType.PAD)
#: BEGIN and END set, as they sit in a header's first word (TermBuffers.words)
_UNFRAGMENTED_WORD: Final = UNFRAGMENTED_FLAGS << FLAGS_SHIFT
#: the most of the term one copy for whole messages takes at a time (FragmentAssembler._poll)
_CHUNK: Final = 16384
#: `poll`'s origin, which it does not use (it hands the handler bare payloads)
_NO_ORIGIN: Final[Origin] = (0, 0, "", "", 0)


class FragmentAssembler:
    """The message being assembled for one image (one session)."""

    __slots__ = ("_fragments", "_next")

    def __init__(self) -> None:
        #: views of the fragments so far, or None between messages
        self._fragments: list[memoryview] | None = None
        #: the term offset where the next fragment must start (else the message is lost)
        self._next = 0

    def poll(
        self,
        log: TermBuffers,
        index: int,
        start: int,
        end: int,
        fragment_limit: int,
        deliver: Deliver,
    ) -> tuple[int, int]:
        """Deliver the complete messages among the frames in [start, end) of term `index` of
        `log`, up to `fragment_limit` fragments; returns (the offset reached, the fragments
        consumed).

        PAD frames are skipped and not counted. A middle or end fragment without its beginning
        (a subscriber that joined mid-message) is consumed and dropped.
        """
        return self._poll(log, index, start, end, fragment_limit, deliver, None)

    def poll_messages(
        self,
        log: TermBuffers,
        index: int,
        start: int,
        end: int,
        fragment_limit: int,
        handler: Callable[[Message], object],
        origin: Origin,
    ) -> tuple[int, int]:
        """`poll`, handing `handler` each message as a `Message(data, *origin)`.

        The subscription's way in: the Message is made here, in the loop, rather than by a
        function called per message (that call cost more than the rest of the delivery,
        interpreted or compiled).
        """
        return self._poll(log, index, start, end, fragment_limit, handler, origin)

    def _poll(
        self,
        log: TermBuffers,
        index: int,
        start: int,
        end: int,
        fragment_limit: int,
        deliver: Callable[[Any], object],
        origin: Origin | None,
    ) -> tuple[int, int]:
        session_id, stream_id, source, source_ip, source_port = (
            _NO_ORIGIN if origin is None else origin
        )
        # A whole message is a slice of `chunk`, a bytes copy of the frames ahead made in one
        # step (slicing bytes costs a fraction of slicing the mmap); fragments are kept as
        # views of the term until the last one arrives. A header's length, flags and type are
        # read as one int64 word (TermBuffers.words); the rebuilt log holds only frames the
        # receiver validated, DATA or PAD with a positive length, so no sign to extend.
        whole = log.maps[index]
        words = log.words[index]
        offset = start
        fragments = 0
        chunk = b""
        chunk_start = chunk_end = start
        while offset < end and fragments < fragment_limit:
            word = words[offset >> 3]
            frame_length = word & FRAME_LENGTH_MASK
            aligned = (frame_length + _ALIGN) & ~_ALIGN
            if word >> TYPE_SHIFT == _PAD:
                offset += aligned
                continue
            message: bytes | None
            if word & _UNFRAGMENTED_WORD == _UNFRAGMENTED_WORD:
                if offset + frame_length <= chunk_end:
                    at = offset - chunk_start
                    message = chunk[at + DATA_HEADER_LENGTH : at + frame_length]
                else:
                    # The next chunk: as many frames of this one's size as may still be
                    # delivered, within _CHUNK, so that a poll copies little more than it
                    # delivers; just this frame (one message, an echo) is sliced on its own.
                    chunk_end = min(
                        end, offset + min(_CHUNK, aligned * (fragment_limit - fragments))
                    )
                    if chunk_end < offset + aligned + FRAME_ALIGNMENT:
                        # (chunk_end now ends short of the next frame's header, so the next
                        # message makes a chunk)
                        message = whole[offset + DATA_HEADER_LENGTH : offset + frame_length]
                    else:
                        chunk_start = offset
                        chunk = whole[chunk_start:chunk_end]
                        message = chunk[DATA_HEADER_LENGTH:frame_length]
            else:
                message = self._on_fragment(
                    log.terms[index][offset + DATA_HEADER_LENGTH : offset + frame_length],
                    (word >> FLAGS_SHIFT) & 0xFF,
                    offset,
                    offset + aligned,
                )
            fragments += 1
            offset += aligned
            if message is not None:
                if origin is None:
                    deliver(message)
                else:
                    deliver(Message(message, session_id, stream_id, source, source_ip, source_port))
        return offset, fragments

    def _on_fragment(
        self, payload: memoryview, flags: int, offset: int, after: int
    ) -> bytes | None:
        """One fragment of a fragmented message, at `offset`, the next frame at `after`: kept
        (a view of the term) until its END fragment, which returns the whole message. A
        fragment that does not follow the one kept (its BEGIN was missed: the subscriber
        joined mid-message) drops what was kept."""
        if flags & BEGIN_FLAG:
            self._fragments = [payload]
            self._next = after
            return None
        kept = self._fragments
        if kept is None or offset != self._next:
            self._fragments = None
            return None
        kept.append(payload)
        self._next = after
        if flags & END_FLAG:
            self._fragments = None
            return b"".join(kept)
        return None

    @property
    def in_progress(self) -> bool:
        """Is a message part-way assembled (its BEGIN seen, its END not yet)?"""
        return self._fragments is not None
