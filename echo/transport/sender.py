"""Publication state: the log, SETUP, data, heartbeats, retransmits and linger (reference §2).

Pure: every method takes `now` (seconds) and output goes through an `emit(datagram) -> int`
callback that the caller supplies (the driver's socket send, or a test's list). `emit` returns
how many datagrams went on the wire (one per destination; 0 when there is no destination yet or
the send failed), or WOULD_BLOCK when the datagram could not be handed to the network (socket
buffer full); the sender then stops and tries again on the next poll instead of losing its
place. Counters add what `emit` returns, so each counts datagrams that left, never attempts.
"""

from __future__ import annotations

import enum
import functools
import math
import struct
from typing import Protocol

import attrs

from echo.transport.counters import Counters
from echo.transport.destinations import Address, DynamicDestinations, ManualDestinations
from echo.transport.flow_control import FlowControl
from echo.transport.frames import (
    BEGIN_END_AND_EOS_FLAGS,
    DATA_HEADER_LENGTH,
    DATA_HEADER_STRUCT,
    SETUP_GROUP_FLAG,
    SM_LENGTH,
    UNFRAGMENTED_FLAGS,
    ErrorFrame,
    FrameError,
    FrameType,
    Nak,
    Rttm,
    Setup,
    StatusMessage,
    parse_datagram_untrusted,
)
from echo.transport.logbuffer import (
    PARTITION_COUNT,
    TermBuffers,
    append_message,
    compute_fragmented_length,
    compute_max_message_length,
    compute_position,
    i32,
    max_possible_position,
    position_bits_to_shift,
    scan_for_availability,
    write_pad,
)
from echo.transport.validation import SM_COOKIE_FLAG, CookieJar, RateLimiter

#: what a send returns when the socket buffer is full (nothing sent: try again later)
WOULD_BLOCK = -1


class Emit(Protocol):
    """Hands one datagram to the network, or, with `segment`, a run of datagrams of `segment`
    bytes each (the last may be shorter) lying back to back in `datagram`. Returns how many
    datagrams left (all destinations together), or WOULD_BLOCK: the socket buffer is full,
    try again later."""

    def __call__(self, datagram: bytes | memoryview, segment: int = 0) -> int: ...


# Aeron's offer() results (Publication.java).
NOT_CONNECTED = -1
BACK_PRESSURED = -2
ADMIN_ACTION = -3
CLOSED = -4
MAX_POSITION_EXCEEDED = -5

OFFER_RESULT_NAMES = {
    NOT_CONNECTED: "NOT_CONNECTED",
    BACK_PRESSURED: "BACK_PRESSURED",
    ADMIN_ACTION: "ADMIN_ACTION",
    CLOSED: "CLOSED",
    MAX_POSITION_EXCEEDED: "MAX_POSITION_EXCEEDED",
}

# Bound the datagrams one poll may send so that one busy stream cannot starve the others.
_MAX_DATAGRAMS_PER_POLL = 512
# A run of datagrams handed over at once (UDP GSO) stays within one UDP payload.
_MAX_RUN_BYTES = 65000
_FRAME_LENGTH_AND_TYPE = struct.Struct("<i2xH")


@attrs.frozen
class SenderTimers:
    setup_interval: float = 0.1
    heartbeat_interval: float = 0.1
    connection_timeout: float = 5.0
    linger: float = 5.0
    retransmit_linger: float = 0.01
    #: unicast: a NAK is normally a receiver's retry, which waits for its measured repair time
    #: and at least 0.5 ms (ReceiverTimers.nak_retry_min), so duplicates are ignored only briefly
    unicast_retransmit_linger: float = 0.00025
    #: after data, while NAKs have been seen in the last second, send a heartbeat this soon
    #: so that a lost tail (the last datagrams before the sender stops) is NAKed quickly
    #: instead of after the 100 ms idle heartbeat
    tail_probe_delay: float = 0.002
    #: also probe after every burst of data (one heartbeat when the stream goes quiet): with a
    #: long idle heartbeat this keeps a lost last message from waiting a whole interval
    probe_after_data: bool = False


class PublicationState(enum.Enum):
    ACTIVE = "active"
    DRAINING = "draining"  # closed by the application; sending what is left
    #: all sent; heartbeats until every receiver's SM shows it consumed everything, then
    #: end-of-stream heartbeats until receivers have that too (or the linger time is up)
    LINGERING = "lingering"
    CLOSED = "closed"


@attrs.define
class _Retransmit:
    position: int
    length: int
    sent: bool = False
    linger_until: float = 0.0


@attrs.define
class _ReceiverLiveness:
    last_sm: float
    position: int
    #: SMs since the publication started lingering (see Publication._announce_end_due)
    sms_lingering: int = 0


class Publication:
    """One publication's sending side: what NetworkPublication does in Aeron's driver."""

    def __init__(
        self,
        *,
        session_id: int,
        stream_id: int,
        initial_term_id: int,
        term_length: int,
        mtu: int,
        flow_control: FlowControl,
        counters: Counters,
        now: float,
        is_group: bool = False,
        timers: SenderTimers | None = None,
        max_retransmits: int | None = None,
        term_window: int | None = None,
        ttl: int = 0,
    ) -> None:
        self.session_id = session_id
        self.stream_id = stream_id
        self.initial_term_id = initial_term_id
        self.term_length = term_length
        self.mtu = mtu
        self.max_payload = mtu - DATA_HEADER_LENGTH
        self.max_message_length = compute_max_message_length(term_length)
        if mtu > self.max_message_length:
            raise ValueError(f"mtu {mtu} is larger than the maximum message length of the term")
        self.bits = position_bits_to_shift(term_length)
        self.mask = term_length - 1
        self.max_position = max_possible_position(term_length)
        self.flow_control = flow_control
        self.counters = counters
        self.is_group = is_group
        self.timers = timers or SenderTimers()
        self.max_retransmits = max_retransmits or (16 if is_group else 1)
        self.term_window = min(term_window or term_length // 2, term_length // 2)
        self.ttl = ttl
        self.log = TermBuffers(term_length)
        #: datagrams that may go to `emit` as one run (0 or 1: one at a time); the send
        #: endpoint sets it when its socket can send runs (UDP GSO)
        self.run_segments = 0
        #: datagrams the current `_send_range` call put on the wire (for the counters)
        self.wire_datagrams = 0

        self.state = PublicationState.ACTIVE
        self._term_count = 0
        self.tail_offset = 0
        self.sender_position = 0
        self.sender_limit = 0
        self.has_initial_connection = False
        self._setup_pending = True
        self._last_setup = -math.inf
        self._last_send = -math.inf
        self._linger_until = math.inf
        #: lingering: heartbeats say end-of-stream from now on (see _announce_end_due)
        self._announcing_end = False
        #: lingering: announce end-of-stream by then even if some receiver never confirmed
        self._announce_end_by = math.inf
        self._receivers: dict[int, _ReceiverLiveness] = {}
        #: the latest SM time of any receiver in `_receivers` (-inf if none): is_connected
        #: runs on every offer, so it must not look at every receiver
        self._newest_sm = -math.inf
        #: no receiver times out before this (see _expire_receivers)
        self._receiver_expiry = math.inf
        self._receiver_window = 0
        self._retransmits: list[_Retransmit] = []
        self._last_nak = -math.inf
        self._acknowledged = 0
        self._next_expiry_check = now
        self._probe_at = math.inf
        self._probe_delay = self.timers.tail_probe_delay
        self._rttm_replies: list[bytes] = []
        self._created = now

    # ---------------------------------------------------------------- positions

    @property
    def active_term_id(self) -> int:
        return i32(self.initial_term_id + self._term_count)

    @property
    def position(self) -> int:
        """The tail: where the next message will be appended."""
        return (self._term_count << self.bits) + self.tail_offset

    def is_connected(self, now: float) -> bool:
        if self.state is PublicationState.CLOSED:
            return False
        alive = now - self.timers.connection_timeout <= self._newest_sm
        return alive and self.flow_control.has_required_receivers()

    def publisher_limit(self, now: float) -> int:
        if self.is_connected(now):
            return self.sender_position + self.term_window
        return self.sender_position

    def _forget_receiver(self, receiver_id: int) -> None:
        if self._receivers.pop(receiver_id, None) is not None:
            self._newest_sm = max((r.last_sm for r in self._receivers.values()), default=-math.inf)

    # ---------------------------------------------------------------- the application side

    def offer(self, data: bytes | bytearray | memoryview, now: float) -> int:
        """Append one message; returns the new position or one of Aeron's negative codes."""
        if self.state is not PublicationState.ACTIVE:
            return CLOSED
        length = len(data)
        if length > self.max_message_length:
            raise ValueError(
                f"message of {length} bytes exceeds the maximum message length "
                f"{self.max_message_length} (min(term length / 8, 16 MiB))"
            )
        term_offset = self.tail_offset
        position = (self._term_count << self.bits) + term_offset
        max_payload = self.max_payload
        if length <= max_payload:
            required = (length + DATA_HEADER_LENGTH + 31) & ~31
        else:
            required = compute_fragmented_length(length, max_payload)
        if position + required >= self.max_position:
            return MAX_POSITION_EXCEEDED
        connected = self.is_connected(now)
        if position >= self.sender_position + (self.term_window if connected else 0):
            return BACK_PRESSURED if connected else NOT_CONNECTED
        index = self._term_count % PARTITION_COUNT
        term = self.log.terms[index]
        if term_offset + required > self.term_length:
            # A message never spans terms: pad out this one, rotate, and let the caller retry.
            if term_offset < self.term_length:
                write_pad(
                    term,
                    term_offset,
                    session_id=self.session_id,
                    stream_id=self.stream_id,
                    term_id=self.active_term_id,
                )
            self._rotate()
            return ADMIN_ACTION
        self.tail_offset = append_message(
            term,
            term_offset,
            data,
            max_payload,
            session_id=self.session_id,
            stream_id=self.stream_id,
            term_id=self.active_term_id,
        )
        return (self._term_count << self.bits) + self.tail_offset

    def _rotate(self) -> None:
        self._term_count += 1
        self.tail_offset = 0
        if self._term_count >= PARTITION_COUNT:
            # The partition we move into last held the term three back: the sender position is
            # within half a term of the tail, so nothing there can still be sent or resent.
            self.log.clean(self._term_count % PARTITION_COUNT)

    def close(self, now: float) -> None:
        if self.state is PublicationState.ACTIVE:
            self.state = PublicationState.DRAINING

    def announce_end(self, emit: Emit) -> None:
        """Transport shutdown: one end-of-stream heartbeat at the sender position, then stop."""
        if self.state is not PublicationState.CLOSED:
            sent = emit(self._heartbeat(eos=True))
            if sent > 0:
                self.counters.heartbeats_sent += sent
        self.state = PublicationState.CLOSED

    def abort(self) -> None:
        """Stop at once, without linger (transport shutdown)."""
        self.state = PublicationState.CLOSED

    @property
    def is_lingering(self) -> bool:
        """Closed by the application with everything sent: waiting for the receivers."""
        return self.state is PublicationState.LINGERING

    @property
    def is_done(self) -> bool:
        return self.state is PublicationState.CLOSED

    @property
    def delivered(self) -> bool:
        """Every live receiver has reported consuming everything offered."""
        tail = self.position
        if self.sender_position < tail:
            return False
        if self._receivers:
            return all(r.position >= tail for r in self._receivers.values())
        # Receivers gone (end-of-stream SM or timeout): only what one of them acknowledged.
        return self._acknowledged >= tail

    # ---------------------------------------------------------------- frames from receivers

    def trigger_setup(self) -> None:
        if self.state is not PublicationState.CLOSED and not self._setup_pending:
            self._setup_pending = True
            self._last_setup = -math.inf

    def on_status_message(self, sm: StatusMessage, now: float) -> None:
        if sm.is_setup_eliciting:
            # A setup-eliciting SM carries no position (term 0, offset 0, window 0): feeding it to
            # flow control would move the limit to garbage, so it only asks for a SETUP.
            self.trigger_setup()
            return
        sm_position = compute_position(
            sm.consumption_term_id, sm.consumption_term_offset, self.bits, self.initial_term_id
        )
        # A receiver cannot have consumed what was never sent; clamping keeps a forged SM from
        # opening the limit far beyond the data in flight.
        sm_position = max(0, min(sm_position, self.sender_position))
        self.sender_limit = self.flow_control.on_status_message(
            sm, sm_position, self.sender_limit, now
        )
        if sm.is_end_of_stream and self._announcing_end:
            # The receiver answers our end-of-stream: Aeron sends the EOS flag once its image
            # has seen end-of-stream with nothing missing up to it (PublicationImage:
            # isEndOfStream && rebuildPosition == hwmPosition), whatever subscriber position
            # the SM carries; it is what Aeron's own publication waits for before it stops
            # lingering (NetworkPublication: hasReceivedUnicastEos).
            sm_position = self.sender_position
        self._acknowledged = max(self._acknowledged, sm_position)
        if sm.is_end_of_stream:
            self._forget_receiver(sm.receiver_id)
            return
        receiver = self._receivers.get(sm.receiver_id)
        if receiver is None:
            self._receivers[sm.receiver_id] = _ReceiverLiveness(now, sm_position)
            expiry = now + self.timers.connection_timeout
            if expiry < self._receiver_expiry:
                self._receiver_expiry = expiry
        else:
            receiver.last_sm = now
            receiver.position = max(receiver.position, sm_position)
            receiver.sms_lingering += 1
        if now > self._newest_sm:
            self._newest_sm = now
        self._receiver_window = sm.receiver_window
        if not self.has_initial_connection:
            self.has_initial_connection = True
        self._setup_pending = False

    def on_error_frame(self, frame: ErrorFrame, now: float) -> None:
        # The receiver refused the image: treat it as gone (Aeron marks it end-of-stream).
        self._forget_receiver(frame.receiver_id)

    def on_nak(self, nak: Nak, now: float) -> None:
        if (
            nak.term_offset < 0
            or nak.term_offset > self.term_length - DATA_HEADER_LENGTH
            or nak.length <= 0
        ):
            self.counters.invalid("bad_nak")
            return
        self._last_nak = now
        position = compute_position(nak.term_id, nak.term_offset, self.bits, self.initial_term_id)
        # Aeron's floor is `senderPosition - termLength/2 - maxMessageLength`, but a term-end PAD
        # is skipped whole, so the sender position can pass the limit (SM position + window <=
        # term/2) by up to the PAD, i.e. a max-size message's *fragmented* length less 64: with
        # a window of term/2 the gap at the SM position then fell below the floor and its NAKs
        # were ignored forever. Widening the floor by the headers keeps that gap resendable; it
        # is still far inside the two terms the sender has not cleaned.
        bottom = (
            self.sender_position
            - self.term_length // 2
            - compute_fragmented_length(self.max_message_length, self.max_payload)
        )
        if position >= self.sender_position or position < max(0, bottom):
            return
        window_cap = (
            max(self._receiver_window, self.mtu) * self.flow_control.retransmit_window_multiple
        )
        length = min(
            nak.length,
            self.term_length - nak.term_offset,
            self.sender_position - position,
            window_cap,
        )
        end = position + length
        live = [a for a in self._retransmits if not a.sent or now < a.linger_until]
        for action in live:
            # While a retransmit lingers, NAKs overlapping it are ignored: they are most likely
            # duplicates from a receiver (or a group) that has not seen the resend yet.
            if position < action.position + action.length and action.position < end:
                return
        self._retransmits = live
        if len(live) >= self.max_retransmits:
            return
        self._retransmits.append(_Retransmit(position, length))

    def on_rttm(self, rttm: Rttm, now: float) -> None:
        if rttm.flags & 0x80:
            reply = Rttm(
                session_id=self.session_id,
                stream_id=self.stream_id,
                echo_timestamp_ns=rttm.echo_timestamp_ns,
                reception_delta_ns=0,
                receiver_id=rttm.receiver_id,
                flags=0,
            )
            self._rttm_replies.append(reply.encode())

    # ---------------------------------------------------------------- output

    def setup_frame(self) -> bytes:
        offset = self.sender_position & self.mask
        term_id = i32(self.initial_term_id + (self.sender_position >> self.bits))
        return Setup(
            term_offset=offset,
            session_id=self.session_id,
            stream_id=self.stream_id,
            initial_term_id=self.initial_term_id,
            active_term_id=term_id,
            term_length=self.term_length,
            mtu=self.mtu,
            ttl=self.ttl,
            flags=SETUP_GROUP_FLAG if self.is_group else 0,
        ).encode()

    def _heartbeat(self, eos: bool) -> bytes:
        frame = bytearray(DATA_HEADER_LENGTH)
        DATA_HEADER_STRUCT.pack_into(
            frame,
            0,
            0,
            0,
            BEGIN_END_AND_EOS_FLAGS if eos else UNFRAGMENTED_FLAGS,
            FrameType.DATA,
            self.sender_position & self.mask,
            self.session_id,
            self.stream_id,
            i32(self.initial_term_id + (self.sender_position >> self.bits)),
            0,
        )
        return bytes(frame)

    def _send_range(self, position: int, end: int, emit: Emit) -> int:
        """Send whole frames from `position` until `end`; returns the position reached.

        Each datagram is as many whole frames as fit in the MTU (Aeron's TermScanner). With
        `run_segments` set, datagrams that follow one another in the term with the same length
        (the last of a run may be shorter) go to `emit` together as one run, which the driver
        sends with one system call (UDP GSO): the datagrams on the wire are the same.
        """
        sent = 0
        mtu = self.mtu
        run_segments = self.run_segments
        while position < end and sent < _MAX_DATAGRAMS_PER_POLL:
            term = self.log.terms[(position >> self.bits) % PARTITION_COUNT]
            offset = position & self.mask
            available, padding = scan_for_availability(term, offset, min(mtu, end - position))
            if available == 0:
                break
            stop = offset + available
            count = 1
            if run_segments > 1 and not padding:
                stop, count = self._extend_run(term, offset, stop, available, end - position)
            copies = emit(term[offset:stop], available) if count > 1 else emit(term[offset:stop])
            if copies < 0:
                self.counters.send_would_block += 1
                break
            self.wire_datagrams += copies
            sent += count
            position += stop - offset + padding
        return position

    def _extend_run(
        self, term: memoryview, offset: int, stop: int, segment: int, room: int
    ) -> tuple[int, int]:
        """How far a run of `segment`-byte datagrams starting at `offset` goes (see above)."""
        count = 1
        limit = offset + min(room, _MAX_RUN_BYTES)
        mtu = self.mtu
        unpack_from = _FRAME_LENGTH_AND_TYPE.unpack_from
        # A frame of `segment` bytes fills a datagram by itself when not even a bare header
        # would fit beside it: then each such frame is one datagram, no scan needed.
        alone = segment + DATA_HEADER_LENGTH > mtu
        while count < self.run_segments and stop < limit:
            if alone and stop + segment <= limit:
                # The common case of a big message: a datagram that is one full-size fragment.
                frame_length, frame_type = unpack_from(term, stop)
                if frame_type == FrameType.DATA and (frame_length + 31) & ~31 == segment:
                    stop += segment
                    count += 1
                    continue
            more, padding = scan_for_availability(term, stop, min(mtu, limit - stop))
            if more == 0 or padding or more > segment:
                break  # the term's end, the flow-control limit, a PAD, or a longer datagram
            stop += more
            count += 1
            if more < segment:
                break  # a shorter datagram ends the run
        return stop, count

    def poll(self, now: float, emit: Emit) -> None:
        if self.state is PublicationState.CLOSED:
            return
        counters = self.counters

        while self._rttm_replies:
            sent = emit(self._rttm_replies[0])
            if sent < 0:
                break
            self._rttm_replies.pop(0)
            counters.rttm_replies_sent += sent

        if self._setup_pending and now >= self._last_setup + self.timers.setup_interval:
            sent = emit(self.setup_frame())
            if sent >= 0:
                self._last_setup = now
                counters.setups_sent += sent

        if self._retransmits:
            self._service_retransmits(now, emit)

        self.send_pending(now, emit)
        self._expire_receivers(now)

        if self.state is PublicationState.DRAINING:
            if self.sender_position >= self.position:
                self.state = PublicationState.LINGERING
                self._linger_until = now + self.timers.linger
                self._announce_end_by = now + self.timers.linger / 2
                for receiver in self._receivers.values():
                    receiver.sms_lingering = 0
                self._last_send = -math.inf  # a heartbeat at once: where the stream ends
            elif not self.is_connected(now):
                self.state = PublicationState.CLOSED
                return

        lingering = self.state is PublicationState.LINGERING
        if lingering and not self._announcing_end and self._announce_end_due(now):
            self._announcing_end = True
            self._last_send = -math.inf  # announce end-of-stream at once
        if (self.has_initial_connection or lingering) and (
            now >= self._last_send + self.timers.heartbeat_interval or now >= self._probe_at
        ):
            probing = now >= self._probe_at
            sent = emit(self._heartbeat(eos=self._announcing_end))
            if sent >= 0:
                self._last_send = now
                self._probe_at = math.inf
                counters.heartbeats_sent += sent
                if probing and self._flow_blocked():
                    # Still blocked on flow control: probe again, backing off.
                    self._probe_delay = min(self._probe_delay * 2, self.timers.heartbeat_interval)
                    self._probe_at = now + self._probe_delay

        if lingering and (now >= self._linger_until or not self._receivers):
            # Linger ends early once every receiver has said goodbye (an end-of-stream SM):
            # until then keep announcing end-of-stream, in case those heartbeats were lost.
            self.state = PublicationState.CLOSED

    def _announce_end_due(self, now: float) -> bool:
        """May the lingering publication's heartbeats say end-of-stream now?

        Once every receiver has shown it has everything, or had the time to: an Aeron 1.15
        receiver that sees end-of-stream with its image complete drops the image and sends no
        SM again, and its SMs report a new position only after consuming a quarter of its
        window or on its SM timer (200 ms), so an immediate end-of-stream left close() without
        proof of what had arrived. Plain heartbeats keep the image alive and its timer SMs
        report the subscriber position. Aeron 1.4x repeats a stale position on its timer
        (only the quarter-window rule moves it) but answers end-of-stream with an EOS SM once
        its image is complete, which on_status_message takes as proof: so two SMs without the
        end are enough waiting. Half the linger time bounds it for a receiver that sends none.
        """
        if now >= self._announce_end_by:
            return True
        tail = self.position
        return all(
            r.position >= tail or r.sms_lingering >= 2 for r in self._receivers.values()
        )

    def send_pending(self, now: float, emit: Emit) -> bool:
        """Send new data up to the flow-control limit; True if anything went out.

        The part of `poll` that an offer needs at once (the driver's flush): the timers, the
        SETUP and the retransmits wait for the next full poll.
        """
        position = (self._term_count << self.bits) + self.tail_offset
        limit = self.sender_limit if self.sender_limit < position else position
        before = self.sender_position
        if before >= limit or self.state is PublicationState.CLOSED:
            return False
        self.wire_datagrams = 0
        reached = self.sender_position = self._send_range(before, limit, emit)
        # Datagrams of new data that left (each copy to each destination), not calls made.
        self.counters.data_frames_sent += self.wire_datagrams
        if reached == before:
            return False
        self._last_send = now
        timers = self.timers
        if self._flow_blocked():
            # Blocked at the window's edge: a heartbeat right behind the data tells the
            # receiver where we stopped, so a lost tail is NAKed at once instead of after a
            # probe delay (under loss that is once a window); repeated, backing off, while the
            # window stays shut, in case the SM that would open it was lost.
            self._probe_delay = timers.tail_probe_delay
            self._probe_at = now
        elif timers.probe_after_data or now - self._last_nak < 1.0:
            # A probe heartbeat soon after data: if the last datagrams were lost, the receiver
            # learns of it in milliseconds rather than at the idle heartbeat.
            self._probe_delay = timers.tail_probe_delay
            self._probe_at = now + self._probe_delay
        return True

    def _flow_blocked(self) -> bool:
        """Is there data to send that flow control holds back (the next frame does not fit)?"""
        position = self.sender_position
        if position >= self.position:
            return False
        room = self.sender_limit - position
        return room <= 0 or not self._next_frame_fits(room)

    def _next_frame_fits(self, room: int) -> bool:
        """Does the frame at the sender position fit in `room` bytes (flow control)?

        Aeron sends only whole frames, so a limit that falls inside the next frame leaves
        the sender with nothing to send until an SM moves it: not a reason to be polled now.
        """
        position = self.sender_position
        term = self.log.terms[(position >> self.bits) % PARTITION_COUNT]
        available, _ = scan_for_availability(term, position & self.mask, min(self.mtu, room))
        return available > 0

    def _service_retransmits(self, now: float, emit: Emit) -> None:
        keep: list[_Retransmit] = []
        for action in self._retransmits:
            if not action.sent:
                self.wire_datagrams = 0
                reached = self._send_range(action.position, action.position + action.length, emit)
                if self.wire_datagrams:
                    # One retransmit action (Aeron's unit: a NAK answered) that put something
                    # on the wire; with no destination or a full buffer nothing was resent.
                    self.counters.retransmits_sent += 1
                    self.counters.retransmitted_bytes += reached - action.position
                action.sent = True
                action.linger_until = now + (
                    self.timers.retransmit_linger
                    if self.is_group
                    else self.timers.unicast_retransmit_linger
                )
                keep.append(action)
            elif now < action.linger_until:
                keep.append(action)
        self._retransmits = keep

    def _expire_receivers(self, now: float) -> None:
        # Timeouts are seconds long: checking them a few times a second is plenty, and keeps
        # a publication with many receivers from paying O(receivers) on every poll.
        if now < self._next_expiry_check:
            return
        self._next_expiry_check = now + 0.1
        timeout = self.timers.connection_timeout
        receivers = self._receivers
        oldest = min((r.last_sm for r in receivers.values()), default=math.inf)
        if oldest < now - timeout:
            deadline = now - timeout
            receivers = self._receivers = {
                k: r for k, r in receivers.items() if r.last_sm >= deadline
            }
            self._newest_sm = max((r.last_sm for r in receivers.values()), default=-math.inf)
            oldest = min((r.last_sm for r in receivers.values()), default=math.inf)
        # SMs only move a receiver's time later, so this is a lower bound on when the next
        # one can time out: next_deadline wakes us then, never late, at worst early.
        self._receiver_expiry = oldest + timeout
        self.sender_limit = self.flow_control.on_idle(now, self.sender_limit)

    def next_deadline(self, now: float) -> float:
        """The earliest time `poll` has something to do (may be <= now)."""
        if self.state is PublicationState.CLOSED:
            return math.inf
        if self._rttm_replies:
            return now
        sender_position = self.sender_position
        limit = min(self.sender_limit, self.position)
        if sender_position < limit and self._next_frame_fits(limit - sender_position):
            return now
        timers = self.timers
        # Housekeeping (receiver and flow-control timeouts): `poll` checks them at most every
        # 0.1 s and a receiver times out `connection_timeout` after its last SM, so a wake-up
        # within a second of either is soon enough.
        deadline = now + 1.0
        if self._setup_pending:
            setup = self._last_setup + timers.setup_interval
            if setup < deadline:
                deadline = setup
        if self.has_initial_connection or self.state is PublicationState.LINGERING:
            heartbeat = self._last_send + timers.heartbeat_interval
            if heartbeat < deadline:
                deadline = heartbeat
            if self._probe_at < deadline:
                deadline = self._probe_at
        for action in self._retransmits:
            if not action.sent:
                return now
            if action.linger_until < deadline:
                deadline = action.linger_until
        if self.state is PublicationState.LINGERING:
            if self._linger_until < deadline:
                deadline = self._linger_until
            if not self._announcing_end:
                if self._announce_end_due(now):
                    return now
                if self._announce_end_by < deadline:
                    deadline = self._announce_end_by
        if self._receiver_expiry < deadline:
            deadline = max(self._receiver_expiry, self._next_expiry_check)
        return deadline

    def release(self) -> None:
        self.log.close()


class SendMode(enum.Enum):
    UNICAST = "unicast"
    DYNAMIC = "dynamic"
    MANUAL = "manual"


class Send(Protocol):
    """Sends one datagram (or a run of `segment`-byte datagrams, see Emit) to `address`;
    returns how many datagrams left, or WOULD_BLOCK."""

    def __call__(
        self, datagram: bytes | memoryview, address: Address, segment: int = 0
    ) -> int: ...



class SendEndpoint:
    """The publications sharing one socket and where their datagrams go (SendChannelEndpoint).

    Unicast: one remote address. MDC dynamic: destinations learnt from SMs on this (control)
    socket. MDC manual: destinations the application adds.
    """

    def __init__(
        self,
        *,
        mode: SendMode,
        counters: Counters,
        remote: Address | None = None,
        destination_timeout: float = 5.0,
        max_destinations: int = 1024,
        cookies: CookieJar | None = None,
        limiter: RateLimiter | None = None,
        run_segments: int = 0,
    ) -> None:
        self.mode = mode
        #: what each publication's `run_segments` is (see Publication._send_range)
        self.run_segments = run_segments
        #: set: dynamic destinations must echo a cookie before they are added (validation.py)
        self.cookies = cookies
        self.limiter = limiter or RateLimiter()
        # Replies to one address (cookie challenges, SETUPs for a new MDC destination), sent on
        # the next poll: (datagram, address, the counter it counts in).
        self._replies: list[tuple[bytes, Address, str]] = []
        self.counters = counters
        self.remote = remote
        self.publications: dict[tuple[int, int], Publication] = {}
        self.dynamic = (
            DynamicDestinations(timeout=destination_timeout, max_destinations=max_destinations)
            if mode is SendMode.DYNAMIC
            else None
        )
        self.manual = ManualDestinations() if mode is SendMode.MANUAL else None
        self._emit_send: Send | None = None
        self._emit: Emit = self._no_emit

    @staticmethod
    def _no_emit(datagram: bytes | memoryview, segment: int = 0) -> int:
        return 0

    def emitter(self, send: Send) -> Emit:
        """`emit(datagram)` that sends to every destination through `send` (made once)."""
        if send is not self._emit_send:
            remote = self.remote
            if self.mode is SendMode.UNICAST and remote is not None:

                def emit(datagram: bytes | memoryview, segment: int = 0) -> int:
                    if segment:
                        return send(datagram, remote, segment)
                    return send(datagram, remote)

                self._emit = emit
            else:
                self._emit = functools.partial(self.emit_to_all, send=send)
            self._emit_send = send
        return self._emit

    def forget_send(self) -> None:
        """Drop the cached emitter (the socket is closed; it only kept the endpoint alive)."""
        self._emit_send = None
        self._emit = self._no_emit

    def flush(self, publication: Publication, now: float, send: Send) -> None:
        """Send what `publication` has just been offered (see `Publication.send_pending`)."""
        publication.send_pending(now, self.emitter(send))

    @property
    def destinations(self) -> list[Address]:
        if self.dynamic is not None:
            return self.dynamic.addresses
        if self.manual is not None:
            return self.manual.addresses
        return [self.remote] if self.remote is not None else []

    def add(self, publication: Publication) -> None:
        key = (publication.session_id, publication.stream_id)
        if key in self.publications:
            raise ValueError(
                f"a publication with session-id {publication.session_id} on stream "
                f"{publication.stream_id} already exists on this channel"
            )
        self.publications[key] = publication
        publication.run_segments = self.run_segments

    def remove(self, publication: Publication) -> None:
        self.publications.pop((publication.session_id, publication.stream_id), None)

    def on_datagram(self, data: bytes | memoryview, source: Address, now: float) -> None:
        """Handle one datagram from the network (untrusted)."""
        counters = self.counters
        try:
            frame = parse_datagram_untrusted(data)
        except FrameError as error:
            counters.invalid(error.reason)
            return
        if isinstance(frame, StatusMessage):
            counters.status_messages_received += 1
            if self.dynamic is not None:
                if self.cookies is not None and not self.dynamic.contains(
                    frame.receiver_id, source
                ):
                    if not self._admit(frame, source, len(data), now):
                        return
                outcome = self.dynamic.on_status_message(frame.receiver_id, source, now)
                if outcome == "added":
                    counters.destinations_added += 1
                elif outcome == "refused":
                    counters.destinations_refused += 1
                    return
                if frame.is_end_of_stream:
                    if self.dynamic.remove_receiver(frame.receiver_id, source):
                        counters.destinations_removed += 1
                if frame.is_setup_eliciting:
                    # A destination asks for a SETUP (it has just registered, or has no image
                    # yet): answer that address at once, and it alone. Aeron marks every
                    # publication for a SETUP to every destination at the next 100 ms tick:
                    # a new receiver waited for it, and with a thousand destinations each
                    # newcomer cost a thousand SETUPs.
                    if frame.session_id == 0 and frame.stream_id == 0:
                        wanted = list(self.publications.values())
                    else:
                        found = self.publications.get((frame.session_id, frame.stream_id))
                        wanted = [found] if found is not None else []
                    # A validated destination has shown it receives at `source`: no limit.
                    # Without validation the source may be forged: at most the per-host rate
                    # of replies to strangers.
                    if self.cookies is not None or self.limiter.allow(str(source[0]), now):
                        for each in wanted:
                            if not each.is_done:
                                self._replies.append((each.setup_frame(), source, "setups_sent"))
                    else:
                        counters.rate_limited += 1
                    return
            if frame.session_id == 0 and frame.stream_id == 0:
                if frame.is_setup_eliciting:
                    for each in self.publications.values():
                        each.trigger_setup()
                return
            publication = self.publications.get((frame.session_id, frame.stream_id))
            if publication is None:
                counters.unknown_session_drops += 1
                return
            publication.on_status_message(frame, now)
        elif isinstance(frame, Nak):
            counters.naks_received += 1
            if not self._validated(source):
                return
            publication = self.publications.get((frame.session_id, frame.stream_id))
            if publication is None:
                counters.unknown_session_drops += 1
                return
            publication.on_nak(frame, now)
        elif isinstance(frame, Rttm):
            if not self._validated(source):
                return
            publication = self.publications.get((frame.session_id, frame.stream_id))
            if publication is not None:
                publication.on_rttm(frame, now)
        elif isinstance(frame, ErrorFrame):
            publication = self.publications.get((frame.session_id, frame.stream_id))
            if publication is not None:
                publication.on_error_frame(frame, now)
        else:
            # DATA, SETUP and the rest flow towards subscriptions, never into a publication.
            counters.invalid("unexpected_on_send_channel")

    def _validated(self, source: Address) -> bool:
        """May a NAK or RTTM from `source` make this endpoint send?

        A retransmit or an RTTM reply goes to every destination: with validation on, only a
        destination's own address may ask for one, so a forged NAK (28 bytes) cannot make the
        publication resend a window's worth of data to all its receivers.
        """
        if self.cookies is None or self.dynamic is None or self.dynamic.has_address(source):
            return True
        self.counters.unvalidated_drops += 1
        return False

    def _admit(self, sm: StatusMessage, source: Address, size: int, now: float) -> bool:
        """A stranger's SM: admit it only with a valid cookie, else answer with a challenge.

        Nothing else from an unvalidated address is acted on, so a forged source gets at most
        one challenge per SM, never larger than the SM (amplification factor <= 1).
        """
        assert self.cookies is not None
        cookie = (sm.consumption_term_id, sm.consumption_term_offset)
        registration = sm.session_id == 0 and sm.stream_id == 0 and sm.is_setup_eliciting
        if registration and self.cookies.check(source, sm.receiver_id, cookie, now):
            return True
        self.counters.unvalidated_drops += 1
        if registration and size >= SM_LENGTH and self.limiter.allow(str(source[0]), now):
            first, second = self.cookies.make(source, sm.receiver_id, now)
            challenge = StatusMessage(
                session_id=0,
                stream_id=0,
                consumption_term_id=first,
                consumption_term_offset=second,
                receiver_window=0,
                receiver_id=sm.receiver_id,
                flags=SM_COOKIE_FLAG,
            ).encode()
            self._replies.append((challenge, source, "cookie_challenges_sent"))
        elif registration:
            self.counters.rate_limited += 1
        return False

    def poll(self, now: float, send: Send) -> None:
        if self._replies:
            counters = self.counters
            for datagram, address, counter in self._replies:
                sent = send(datagram, address)
                if sent > 0:
                    setattr(counters, counter, getattr(counters, counter) + sent)
            self._replies.clear()
        if self.dynamic is not None:
            removed = self.dynamic.expire(now)
            if removed:
                self.counters.destinations_removed += removed
        emit = self.emitter(send)
        for publication in list(self.publications.values()):
            publication.poll(now, emit)

    def emit_to_all(self, datagram: bytes | memoryview, segment: int = 0, *, send: Send) -> int:
        """Send one datagram (or run) to every destination: the datagrams that left, or
        WOULD_BLOCK if any send would block (the caller retries; the others get a duplicate).
        No destination yet: 0, nothing went on the wire."""
        total = 0
        blocked = False
        for address in self.destinations:
            sent = send(datagram, address, segment) if segment else send(datagram, address)
            if sent < 0:
                blocked = True
            else:
                total += sent
        if blocked:
            # What did leave is counted by the socket (datagrams_sent); the frame's own
            # counter waits for the retry that reaches everyone.
            return WOULD_BLOCK
        return total

    def set_run_segments(self, run_segments: int) -> None:
        """Runs of datagrams on (the socket can send them) or off (it cannot, after all)."""
        self.run_segments = run_segments
        for publication in self.publications.values():
            publication.run_segments = run_segments

    def next_deadline(self, now: float) -> float:
        if self._replies:
            return now
        deadline = math.inf
        for publication in self.publications.values():
            deadline = min(deadline, publication.next_deadline(now))
        if self.dynamic is not None:
            expiry = self.dynamic.next_expiry()
            if expiry is not None:
                deadline = min(deadline, expiry)
        return deadline
