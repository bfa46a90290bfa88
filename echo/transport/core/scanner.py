"""The sender's term scanner: whole frames out of a publication's log into datagrams (Aeron's
TermScanner), and runs of equal datagrams for one system call (UDP GSO). Where the appender's
run of frames of one length lies (appender.py: `run_offset`, `run_step`), the datagrams are
counted out of it instead of read frame by frame: the same datagrams, fewer steps per message.

Pure: the datagrams go to an `emit` the caller supplies (publication.py's Emit); nothing here
counts or schedules.
"""

from __future__ import annotations

from typing import Final, Protocol

from echo.transport.core.appender import LogAppender
from echo.transport.core.frames import DATA_HEADER_LENGTH, FRAME_ALIGNMENT
from echo.transport.core.logbuffer import PARTITION_COUNT, IntView, scan_for_availability

# Bound the datagrams one call may send so that one busy stream cannot starve the others.
MAX_DATAGRAMS_PER_SCAN: Final = 512
# A run of datagrams handed over at once (UDP GSO) stays within one UDP payload.
MAX_RUN_BYTES: Final = 65000
_ALIGN: Final = FRAME_ALIGNMENT - 1  # (length + _ALIGN) & ~_ALIGN: the 32-byte frame alignment


class Emit(Protocol):
    """Hands one datagram to the network, or, with `segment`, a run of datagrams of `segment`
    bytes each (the last may be shorter) lying back to back in `datagram`. Returns how many
    datagrams left (all destinations together), or WOULD_BLOCK (-1): the socket buffer is
    full, try again later."""

    def __call__(self, datagram: bytes | memoryview, segment: int = 0) -> int: ...


class TermScanner:
    """Sends frames of one log (3 terms of `1 << bits` bytes) in MTU-sized datagrams."""

    __slots__ = (
        "appender",
        "bits",
        "blocked",
        "lengths",
        "mask",
        "mtu",
        "run_segments",
        "term_length",
        "terms",
        "wire_datagrams",
    )

    def __init__(self, appender: LogAppender, mtu: int) -> None:
        #: the log's writer: its run of frames of one length is cut into datagrams without
        #: reading their headers (`_next_send`)
        self.appender = appender
        self.terms = appender.log.terms
        self.lengths = appender.log.lengths
        self.bits = bits = appender.bits
        self.term_length = 1 << bits
        self.mask = self.term_length - 1
        self.mtu = mtu
        #: datagrams that may go to `emit` as one run (0 or 1: one at a time); set when the
        #: socket can send runs (UDP GSO)
        self.run_segments = 0
        #: what the last `send` put on the wire, and whether it stopped on a full socket
        self.wire_datagrams = 0
        self.blocked = False

    def send(self, position: int, end: int, emit: Emit) -> int:
        """Send whole frames from `position` until `end`; returns the position reached.

        Each datagram is as many whole frames as fit in the MTU. With `run_segments` set,
        datagrams that follow one another in the term with the same length (the last of a run
        may be shorter) go to `emit` together as one run, which the driver sends with one
        system call (UDP GSO): the datagrams on the wire are the same.
        """
        sent = 0
        wire = 0
        self.blocked = False
        bits = self.bits
        mask = self.mask
        while position < end and sent < MAX_DATAGRAMS_PER_SCAN:
            offset = position & mask
            available, padding, stop, count = self._next_send(position, offset, end - position)
            if available == 0:
                break
            term = self.terms[(position >> bits) % PARTITION_COUNT]
            copies = emit(term[offset:stop], available) if count > 1 else emit(term[offset:stop])
            if copies < 0:
                self.blocked = True
                break
            wire += copies
            sent += count
            position += stop - offset + padding
        self.wire_datagrams = wire
        return position

    def _next_send(self, position: int, offset: int, room: int) -> tuple[int, int, int, int]:
        """What goes out next from `position` (at `offset` of its term), with `room` bytes to
        the limit: the first datagram's bytes (0: nothing), the PAD bytes it stands for, where
        the datagram (or the run of datagrams) ends in the term, and how many datagrams."""
        appender = self.appender
        step = appender.run_step
        start = appender.run_offset
        tail = appender.tail_offset
        if (
            start <= offset <= tail
            and step
            and position >> self.bits == appender.term_count
            and (offset - start) % step == 0
        ):
            return self._cut_run(offset, room, step, tail - offset)
        lengths = self.lengths[(position >> self.bits) % PARTITION_COUNT]
        available, padding = scan_for_availability(
            lengths, offset, min(self.mtu, room), self.term_length
        )
        stop = offset + available
        count = 1
        if available and self.run_segments > 1 and not padding:
            stop, count = self._extend_run(lengths, stop, available, room)
        return available, padding, stop, count

    def _cut_run(self, offset: int, room: int, step: int, rest: int) -> tuple[int, int, int, int]:
        """`_next_send` inside the appender's run of frames of `step` bytes, `rest` bytes of
        which follow `offset`: the datagrams the scan and `_extend_run` would make of them,
        counted instead of read (a datagram is as many whole frames as fit in the MTU and the
        room, a run as many datagrams as fit in MAX_RUN_BYTES, the last one maybe shorter)."""
        # (two-argument mins: compiled, those are plain comparisons)
        room = min(room, rest)
        per_datagram = min(self.mtu, room) // step
        available = per_datagram * step
        if available == 0 or self.run_segments <= 1:
            return available, 0, offset + available, 1
        frames = min(room, MAX_RUN_BYTES) // step
        count = min(self.run_segments, -(-frames // per_datagram))
        return available, 0, offset + min(frames, count * per_datagram) * step, count

    def _extend_run(
        self, lengths: IntView, stop: int, segment: int, room: int
    ) -> tuple[int, int]:
        """How far a run of `segment`-byte datagrams, the first of which ends at `stop`, goes
        (see send)."""
        count = 1
        limit = stop - segment + min(room, MAX_RUN_BYTES)
        mtu = self.mtu
        term_length = self.term_length
        run_segments = self.run_segments
        # A frame of `segment` bytes fills a datagram by itself when not even a bare header
        # would fit beside it: then each such frame is one datagram, no scan needed.
        alone = segment + DATA_HEADER_LENGTH > mtu
        while count < run_segments and stop < limit:
            if alone and stop + segment <= limit and stop + segment < term_length:
                # The common case of a big message: a datagram that is one full-size fragment.
                # (Short of the term's end it cannot be a PAD, which always runs to the end.)
                if (lengths[stop >> 2] + _ALIGN) & ~_ALIGN == segment:
                    stop += segment
                    count += 1
                    continue
            more, padding = scan_for_availability(
                lengths, stop, min(mtu, limit - stop), term_length
            )
            if more == 0 or padding or more > segment:
                break  # the term's end, the flow-control limit, a PAD, or a longer datagram
            stop += more
            count += 1
            if more < segment:
                break  # a shorter datagram ends the run
        return stop, count

    def next_frame_fits(self, position: int, room: int) -> bool:
        """Does the frame at `position` fit in `room` bytes (flow control)?

        Aeron sends only whole frames, so a limit that falls inside the next frame leaves
        the sender with nothing to send until an SM moves it.
        """
        lengths = self.lengths[(position >> self.bits) % PARTITION_COUNT]
        available, _ = scan_for_availability(
            lengths, position & self.mask, min(self.mtu, room), self.term_length
        )
        return available > 0
