"""Fragment assembly: complete messages out of an image's rebuilt term (Aeron's
FragmentAssembler over Image.poll).

Pure. A message longer than the MTU arrives as fragments, BEGIN ... END, in consecutive frames
of one term (a message never spans terms). The assembler keeps views of the fragments until
the last one arrives, then joins them: one copy in all. The views stay valid: the term is only
cleaned two terms later.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Final

from echo.transport.frames import (
    BEGIN_FLAG,
    DATA_HEADER_LENGTH,
    END_FLAG,
    FRAME_ALIGNMENT,
    UNFRAGMENTED_FLAGS,
    FrameType,
)
from echo.transport.message import Message, Origin

Deliver = Callable[[bytes], object]

# The first fields of a data frame header: frame length, version, flags, type (frames.py's
# DATA_HEADER_STRUCT begins the same way); the rest is not needed to assemble.
_HEADER_FIELDS: Final = struct.Struct("<iBBH").unpack_from
_ALIGN: Final = FRAME_ALIGNMENT - 1  # (length + _ALIGN) & ~_ALIGN: the 32-byte frame alignment
_PAD: Final = FrameType.PAD


class FragmentAssembler:
    """The message being assembled for one image (one session)."""

    __slots__ = ("_fragments", "_next")

    def __init__(self) -> None:
        #: views of the fragments so far, or None between messages
        self._fragments: list[memoryview] | None = None
        #: the term offset where the next fragment must start (else the message is lost)
        self._next = 0

    def poll(
        self, term: memoryview, start: int, end: int, fragment_limit: int, deliver: Deliver
    ) -> tuple[int, int]:
        """Deliver the complete messages among the frames in term[start:end], up to
        `fragment_limit` fragments; returns (the offset reached, the fragments consumed).

        PAD frames are skipped and not counted. A middle or end fragment without its beginning
        (a subscriber that joined mid-message) is consumed and dropped.
        """
        offset = start
        fragments = 0
        while offset < end and fragments < fragment_limit:
            frame_length, _, flags, frame_type = _HEADER_FIELDS(term, offset)
            aligned = (frame_length + _ALIGN) & ~_ALIGN
            if frame_type == _PAD:
                offset += aligned
                continue
            payload_start = offset + DATA_HEADER_LENGTH
            payload_end = offset + frame_length
            if flags & UNFRAGMENTED_FLAGS == UNFRAGMENTED_FLAGS:
                deliver(bytes(term[payload_start:payload_end]))
            elif flags & BEGIN_FLAG:
                self._fragments = [term[payload_start:payload_end]]
                self._next = offset + aligned
            elif self._fragments is not None and offset == self._next:
                self._fragments.append(term[payload_start:payload_end])
                self._next = offset + aligned
                if flags & END_FLAG:
                    message = b"".join(self._fragments)
                    self._fragments = None
                    deliver(message)
            else:
                self._fragments = None
            fragments += 1
            offset += aligned
        return offset, fragments

    @property
    def in_progress(self) -> bool:
        """Is a message part-way assembled (its BEGIN seen, its END not yet)?"""
        return self._fragments is not None


# Message(data, *origin) without the named tuple's own __new__, a Python function: tuple's,
# called from C. One per message delivered.
_new_tuple: Final[Callable[..., Any]] = tuple.__new__


class MessageDelivery:
    """Turns assembled payloads into `Message`s for a subscription's handler.

    One per image (its `origin` never changes); the subscription sets `handler` for each
    poll. Called once per message, so it lives here, in a compiled module: an interpreted
    closure cost more than the rest of the delivery.
    """

    __slots__ = ("_origin", "handler")

    def __init__(self, origin: Origin) -> None:
        # Held as objects: typed as ints, compiled code would box the ids anew per message.
        self._origin: tuple[object, object, object, object, object] = origin
        self.handler: Callable[[Message], object] = _ignore

    def __call__(self, data: bytes) -> None:
        session_id, stream_id, source, source_ip, source_port = self._origin
        self.handler(
            _new_tuple(Message, (data, session_id, stream_id, source, source_ip, source_port))
        )


def _ignore(message: Message) -> None:
    """A delivery's handler outside a poll: nothing should arrive then."""


def release_handler(delivery: MessageDelivery) -> None:
    """Forget the handler of the poll that is over (it may hold what holds the image)."""
    delivery.handler = _ignore
