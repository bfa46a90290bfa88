"""An image: one publication (session) as a subscription sees it (Aeron's PublicationImage).

It rebuilds the publication's log from DATA frames, and asks its parts what to send: the loss
detector which gaps to NAK (loss.py), the status scheduler when to send a status message
(status.py), the fragment assembler what messages are complete (assembly.py). Pure, like
publication.py: `now` is passed in and output goes through an injected `send(datagram,
address) -> int`; an image never sends a source more than AMPLIFICATION_FACTOR times what it
received from it (budgeted).
"""

from __future__ import annotations

import enum
import math
import random
from collections.abc import Callable
from typing import Final

from echo.transport.core.assembly import FragmentAssembler
from echo.transport.core.config import DEFAULT_RECEIVER_WINDOW, ReceiverTimers
from echo.transport.core.counters import Counters
from echo.transport.core.destinations import Address
from echo.transport.core.frames import (
    DATA_HEADER_STRUCT,
    EOS_FLAG,
    REVOKED_FLAG,
    SM_EOS_FLAG,
    UNFRAGMENTED_FLAGS,
    FrameType,
    Nak,
    ResponseSetup,
    StatusMessage,
)
from echo.transport.core.logbuffer import (
    PARTITION_COUNT,
    TermBuffers,
    compute_position,
    i32,
    insert_packet,
    position_bits_to_shift,
    rebuild_offset,
)
from echo.transport.core.loss import LossDetector, RepairTimer
from echo.transport.core.message import Message, Origin
from echo.transport.core.status import StatusScheduler

#: sends one datagram; returns 1 if it left, 0 if it was lost on the way out (send error),
#: or -1 (sender.WOULD_BLOCK): socket buffer full, nothing sent, try again later
Send = Callable[[bytes | memoryview, Address], int]
Deliver = Callable[[bytes], object]

#: the window a receiver offers is at most half a term: a sender may run that far past the
#: consumption position, into the next term but never into the partition being cleaned
_WINDOW_TERM_DIVISOR: Final = 2
# i32 wrap of a term-id difference (compute_position, inlined on the per-datagram path)
_I32_SIGN: Final = 0x80000000
_U32: Final = 0xFFFFFFFF
#: a budgeted image may send the (unvalidated) source of its SETUP at most this many times the
#: bytes it received from it: RFC 9000 §8.1's bound for an unvalidated address. At 1 a 40-byte
#: SETUP could not pay for a group-tagged (44-byte) first SM, which then waited for the next
#: SETUP, nor for a first SM and an end-of-stream SM, so an image closed right after its SETUP
#: left its publisher lingering. 3 keeps a forged source an amplifier of at most 3x.
AMPLIFICATION_FACTOR: Final = 3


class ImageState(enum.Enum):
    ACTIVE = "active"
    END_OF_STREAM = "end_of_stream"  # the publisher closed and everything was consumed
    TIMED_OUT = "timed_out"  # no packet for the liveness timeout
    CLOSED = "closed"  # the subscription went away


class PublicationImage:
    """One publication (session) as seen by a subscription: Aeron's PublicationImage."""

    def __init__(
        self,
        *,
        session_id: int,
        stream_id: int,
        initial_term_id: int,
        active_term_id: int,
        term_offset: int,
        term_length: int,
        mtu: int,
        control_address: Address,
        receiver_id: int,
        counters: Counters,
        now: float,
        rcv_wnd: int = DEFAULT_RECEIVER_WINDOW,
        is_group: bool = False,
        reliable: bool = True,
        group_tag: int | None = None,
        timers: ReceiverTimers | None = None,
        rng: random.Random | None = None,
        budgeted: bool = False,
    ) -> None:
        self.session_id = session_id
        self.stream_id = stream_id
        self.initial_term_id = initial_term_id
        self.term_length = term_length
        self.mtu = mtu
        self.control_address = control_address
        self.receiver_id = receiver_id
        self.counters = counters
        self.is_group = is_group
        self.reliable = reliable
        self.group_tag = group_tag
        self.timers = timers or ReceiverTimers()
        self.rng = rng or random.Random()
        self.bits = position_bits_to_shift(term_length)
        self.mask = term_length - 1
        self.window = min(rcv_wnd, term_length // _WINDOW_TERM_DIVISOR)
        self.log = TermBuffers(term_length)
        self.terms = self.log.terms
        join = compute_position(active_term_id, term_offset, self.bits, initial_term_id)
        self._start_receiving(join, now)
        # Anti-amplification: the source of a SETUP is not validated (it may be forged), so
        # the image never sends it more than AMPLIFICATION_FACTOR times the bytes it has
        # received from it (`budget`: what it may still send).
        self.budgeted = budgeted
        self.budget = 0
        self.starved = False
        #: its SETUP carried SETUP_SEND_RESPONSE_FLAG (a request publication, response.py)
        self.requested_response = False
        #: set while a response publication answers this image and has not heard from its
        #: receiver: RSP_SETUP goes out on every SM interval (PublicationImage.responseSessionId)
        self.response_session_id: int | None = None
        self.next_response_setup = math.inf

    def _start_receiving(self, join: int, now: float) -> None:
        """The receiver's state at the join position: nothing rebuilt beyond it, an SM due."""
        self.join_position = join
        self.subscriber_position = join
        self.rebuild_position = join
        self.hwm = join
        self.status = StatusScheduler(
            join, self.window, self.mtu, self.timers.status_message_interval, now
        )
        self._join_term = join >> self.bits
        self._subscriber_term = self._join_term
        self.state = ImageState.ACTIVE
        self.eos_position: int | None = None
        #: the publisher revoked the stream (a heartbeat with EOS and REVOKED): see _revoke
        self.revoked = False
        self._last_packet = now
        # Gaps and when to NAK them; the repair time NAK retries wait for (loss.py).
        self.repair = RepairTimer(self.timers)
        self.loss = LossDetector(self.timers, self.rng, self.is_group, self.repair)
        self.assembler = FragmentAssembler()

    # ---------------------------------------------------------------- network input

    def on_data(
        self,
        heartbeat: bool,
        flags: int,
        term_offset: int,
        term_id: int,
        packet: bytes | memoryview,
        now: float,
        whole_data: bool = False,
    ) -> bool:
        """A DATA/PAD datagram of this session (already validated by the frame parser).

        `whole_data`: the packet is known to be complete DATA frames only (a coalesced run),
        so the rebuild position can move past it without walking its frames. Returns whether
        `poll` has anything to look at now: not after data that simply arrived in order.
        """
        self._last_packet = now
        # compute_position, inlined: this runs for every datagram.
        position = (
            (((term_id - self.initial_term_id + _I32_SIGN) & _U32) - _I32_SIGN)
            << self.bits
        ) + term_offset
        if heartbeat:
            return self._on_heartbeat(position, flags, now)
        length = len(packet)
        sm_position = self.status.last_sm_position
        if position < sm_position:
            self.counters.flow_control_underruns += 1
            return True
        if position + length > sm_position + self.term_length // _WINDOW_TERM_DIVISOR:
            self.counters.flow_control_overruns += 1
            return True
        if term_offset + length > self.term_length:
            self.counters.invalid("beyond_term")
            return True
        index = (position >> self.bits) % PARTITION_COUNT
        log = self.log
        if not insert_packet(log.maps[index], log.lengths[index], term_offset, packet):
            self.counters.duplicate_data += 1
            return True
        return self._on_inserted(position, position + length, now, whole_data)

    def _on_heartbeat(self, position: int, flags: int, now: float) -> bool:
        """A heartbeat at `position`: where the sender stopped (end-of-stream with its flags).
        True if `poll` has something to do: not for an idle stream's heartbeat, which only
        moves the image's liveness on (docs/transport.md, "The idle cadence")."""
        self.counters.heartbeats_received += 1
        status = self.status
        news = False
        window_end = status.last_sm_position + self.term_length // _WINDOW_TERM_DIVISOR
        # A sender passes the window's edge by a term-end PAD it skips whole (its header fits,
        # the rest of the term does not), and then waits at the next term's start. Ignored,
        # that heartbeat hid a lost tail behind the edge for good: no gap, no NAK, a stall.
        # So a heartbeat at the first term start beyond the edge counts too (the loss scan
        # still stops at the window, so the NAK does not reach past it).
        if self.subscriber_position <= position <= window_end or (
            not position & self.mask and 0 < position - window_end < self.term_length
        ):
            if position > self.hwm:
                self.hwm = position
                self.loss.dirty = True
                news = True
            if flags & EOS_FLAG:  # the EOS bit alone, as Aeron's receiver tests it
                news = True
                if flags & REVOKED_FLAG:
                    self._revoke(position)
                elif self.eos_position is None:
                    self.eos_position = position
        deadline = status.deadline
        status.on_heartbeat(position, now)
        # (A status message brought forward: the poll that sends it must come sooner.)
        return news or status.deadline < deadline

    def _revoke(self, position: int) -> None:
        """The publisher revoked the stream (Aeron 1.48): what it had not sent is gone, so the
        image ends where its data is whole; what came in order up to there is still read."""
        if self.eos_position is None or self.eos_position > self.rebuild_position:
            if not self.revoked:
                self.revoked = True
                self.counters.images_revoked += 1
            self.eos_position = min(position, self.rebuild_position)

    def _on_inserted(self, position: int, end: int, now: float, whole_data: bool) -> bool:
        """Data for [position, end) went into the term: move the high-water mark and the
        rebuild position; True if `poll` has something to do (see on_data)."""
        if self.repair.naked:
            self.repair.on_repair(position, now)
        status = self.status
        if end > self.hwm:
            self.hwm = end
            status.on_new_data(end)
        rebuild = self.rebuild_position
        if position <= rebuild:
            if whole_data and end > rebuild:
                self.rebuild_position = rebuild = end
            if rebuild < self.hwm or not whole_data:
                self._advance_rebuild()
        self.loss.dirty = True
        return (
            self.rebuild_position < self.hwm
            or bool(self.loss.gaps)
            or now >= status.deadline
            or self.eos_position is not None
        )

    def on_setup(self, now: float) -> None:
        # A repeated SETUP means our SM was lost: answer soon.
        self._last_packet = now
        self.status.on_setup(now)

    def _advance_rebuild(self) -> None:
        while self.rebuild_position < self.hwm:
            position = self.rebuild_position
            lengths = self.log.lengths[(position >> self.bits) % PARTITION_COUNT]
            offset = position & self.mask
            limit = min(self.term_length, offset + (self.hwm - position))
            reached = rebuild_offset(lengths, offset, limit)
            if reached == offset:
                break
            self.rebuild_position = position + (reached - offset)
        if self.rebuild_position > self.hwm:
            # A PAD frame's header stands for the rest of its term.
            self.hwm = self.rebuild_position

    # ---------------------------------------------------------------- the application side

    def poll_messages(self, deliver: Deliver, fragment_limit: int) -> int:
        """Deliver complete messages from the rebuilt log; returns the fragments consumed.

        Like Aeron's Image.poll with a FragmentAssembler: never crosses a term boundary in one
        call, skips PAD frames, and reassembles B..E fragments per session.
        """
        position = self.subscriber_position
        available = self.rebuild_position - position
        if available <= 0:
            return 0
        index = (position >> self.bits) % PARTITION_COUNT
        start = position & self.mask
        end = min(self.term_length, start + available)
        offset, fragments = self.assembler.poll(
            self.log, index, start, end, fragment_limit, deliver
        )
        self.subscriber_position = position + (offset - start)
        self._clean_behind()
        return fragments

    def poll_into(
        self, handler: Callable[[Message], object], origin: Origin, fragment_limit: int
    ) -> int:
        """`poll_messages` for a subscription: `handler` gets each as `Message(data, *origin)`."""
        position = self.subscriber_position
        available = self.rebuild_position - position
        if available <= 0:
            return 0
        index = (position >> self.bits) % PARTITION_COUNT
        start = position & self.mask
        end = min(self.term_length, start + available)
        offset, fragments = self.assembler.poll_messages(
            self.log, index, start, end, fragment_limit, handler, origin
        )
        self.subscriber_position = position + (offset - start)
        self._clean_behind()
        return fragments

    def _clean_behind(self) -> None:
        term_count = self.subscriber_position >> self.bits
        if term_count == self._subscriber_term:
            return
        self._subscriber_term = term_count
        # Data can arrive up to half a term past the SM position, i.e. into the next term, whose
        # partition last held the term three back. Zero it before anything lands there.
        upcoming = term_count + 1
        if upcoming - PARTITION_COUNT >= self._join_term:
            self.log.clean(upcoming % PARTITION_COUNT)

    @property
    def is_end_of_stream(self) -> bool:
        return self.eos_position is not None and self.subscriber_position >= self.eos_position

    # ---------------------------------------------------------------- output and timers

    def _status_message(self, flags: int = 0) -> bytes:
        position = self.subscriber_position
        return StatusMessage(
            session_id=self.session_id,
            stream_id=self.stream_id,
            consumption_term_id=i32(self.initial_term_id + (position >> self.bits)),
            consumption_term_offset=position & self.mask,
            receiver_window=self.window,
            receiver_id=self.receiver_id,
            group_tag=self.group_tag,
            flags=flags,
        ).encode()

    def credit(self, size: int) -> None:
        """`size` bytes came from the source: it may be sent AMPLIFICATION_FACTOR times that."""
        self.budget += AMPLIFICATION_FACTOR * size
        self.starved = False

    def _send(self, datagram: bytes, send: Send) -> int:
        if self.budgeted:
            if self.budget < len(datagram):
                # Nothing more may go to this source until it sends us something: stop
                # asking to be polled (the next datagram from it credits us and polls us).
                self.counters.amplification_limited += 1
                self.starved = True
                return -1
            self.budget -= len(datagram)
        return send(datagram, self.control_address)

    def poll(self, now: float, send: Send) -> None:
        if self.state is not ImageState.ACTIVE:
            return
        counters = self.counters
        # The same sum next_deadline returns: with `now - last > timeout` the timer loop woke
        # at that deadline, found nothing expired and was due again at once, spinning until
        # the clock moved on (forever under a MockClock, which moves only when all idle).
        if now >= self._last_packet + self.timers.liveness_timeout:
            self.state = ImageState.TIMED_OUT
            return
        if self.is_end_of_stream:
            # Tell the sender we have it all and are going: it can stop lingering.
            sent = self._send(self._status_message(SM_EOS_FLAG), send)
            if sent > 0:
                counters.status_messages_sent += sent
            self.state = ImageState.END_OF_STREAM
            return

        if self.rebuild_position < self.hwm:
            self._detect_loss(now, send)
        else:
            self.loss.clear()

        if now >= self.next_response_setup:
            self._send_response_setup(now, send)

        consumption = self.subscriber_position
        status = self.status
        if not self.starved and status.due(consumption, self.hwm, now):
            sent = self._send(self._status_message(), send)
            if sent >= 0:
                counters.status_messages_sent += sent
                status.sent(consumption, self.hwm, now, self.repair.retry_delay())

    def _send_response_setup(self, now: float, send: Send) -> None:
        response_session_id = self.response_session_id
        if response_session_id is None:
            self.next_response_setup = math.inf
            return
        frame = ResponseSetup(
            session_id=self.session_id,
            stream_id=self.stream_id,
            response_session_id=response_session_id,
        ).encode()
        sent = self._send(frame, send)
        if sent >= 0:
            self.counters.response_setups_sent += sent
            self.next_response_setup = now + self.timers.status_message_interval

    @property
    def last_sm_position(self) -> int:
        """The consumption position our last status message reported."""
        return self.status.last_sm_position

    def status_message_due(self) -> bool:
        """Has consumption moved far enough that the sender should hear of it now?"""
        return self.status.threshold_reached(self.subscriber_position, self.hwm)

    def _detect_loss(self, now: float, send: Send) -> None:
        loss = self.loss
        if loss.dirty:
            # A legitimate sender never runs more than our window past what we reported, so
            # gaps are only looked for that far: a forged frame far ahead cannot make us scan
            # (or NAK) megabytes of an empty term.
            end = min(self.hwm, self.rebuild_position + self.window)
            loss.scan(self.log, self.bits, self.rebuild_position, end, now)
        for gap in loss.due(now):
            position, length = gap
            term_id = i32(self.initial_term_id + (position >> self.bits))
            gap_offset = position & self.mask
            if not self.reliable:
                # reliable=false: give up on the gap and pad over it (Aeron's tryFillGap).
                term = self.terms[(position >> self.bits) % PARTITION_COUNT]
                DATA_HEADER_STRUCT.pack_into(
                    term,
                    gap_offset,
                    length,
                    0,
                    UNFRAGMENTED_FLAGS,
                    FrameType.PAD,
                    gap_offset,
                    self.session_id,
                    self.stream_id,
                    term_id,
                    0,
                )
                loss.filled(gap)
                self._advance_rebuild()
                continue
            nak = Nak(
                session_id=self.session_id,
                stream_id=self.stream_id,
                term_id=term_id,
                term_offset=gap_offset,
                length=length,
            )
            sent = self._send(nak.encode(), send)
            if sent >= 0:
                self.counters.naks_sent += sent
            loss.nak_sent(gap, sent >= 0, now)

    def next_deadline(self, now: float) -> float:
        if self.state is not ImageState.ACTIVE:
            return now
        liveness = self._last_packet + self.timers.liveness_timeout
        if self.starved:
            return liveness  # nothing can be sent before the source sends us more
        status = self.status
        deadline = min(status.deadline, liveness, self.next_response_setup)
        if self.is_end_of_stream:
            return now
        if self.rebuild_position < self.hwm:
            if self.loss.dirty:
                return now
            deadline = min(deadline, self.loss.next_deadline())
        elif self.loss.gaps:
            return now
        consumption = self.subscriber_position
        if status.window_update_due(consumption, self.hwm, now):
            return now
        return min(deadline, status.window_update_at(consumption, self.hwm))

    def say_goodbye(self, send: Send) -> None:
        """Repeat the end-of-stream SM for a lingering publisher (budgeted like any SM)."""
        sent = self._send(self._status_message(SM_EOS_FLAG), send)
        if sent > 0:
            self.counters.status_messages_sent += sent

    def release_terms(self) -> None:
        """Everything was consumed (END_OF_STREAM): give the terms' pages back at once.

        A finished image lingers for the receiver's cooldown (to answer the publisher's
        end-of-stream heartbeats, Aeron's LINGER), and that needs its positions only. Under
        churn, thousands of finished images lingered with their three mapped terms each, and
        the touched pages of those maps were most of the server's RSS growth.
        """
        try:
            self.log.close()
        except BufferError:  # pragma: no cover - a view of a term still held elsewhere
            pass  # its maps go when it does

    def close(self, send: Send) -> None:
        """The subscription is going: tell the sender (an end-of-stream SM) and stop."""
        if self.state is ImageState.ACTIVE:
            sent = self._send(self._status_message(SM_EOS_FLAG), send)
            if sent > 0:
                self.counters.status_messages_sent += sent
            self.state = ImageState.CLOSED
