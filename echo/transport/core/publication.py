"""A publication's sending side (Aeron's NetworkPublication): the log, SETUP, data,
heartbeats, linger, and the receivers it has heard from.

Its parts: the term scanner (scanner.py), the retransmits (retransmit.py), flow control.

Pure: every method takes `now` (seconds); output goes through the caller's `emit(datagram) ->
int` (the driver's socket send, or a test's list). `emit` returns how many datagrams went on
the wire (one per destination; 0 with no destination yet or a failed send), or WOULD_BLOCK
(socket buffer full): the sender stops and tries again on the next poll without losing its
place. Counters add what `emit` returns, so each counts datagrams that left, never attempts.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable
from typing import Final, TypeVar

from echo.transport.core.appender import LogAppender
from echo.transport.core.config import SenderTimers
from echo.transport.core.counters import Counters
from echo.transport.core.flow_control import FlowControl
from echo.transport.core.frames import (
    BEGIN_END_AND_EOS_FLAGS,
    DATA_HEADER_LENGTH,
    RTTM_REPLY_FLAG,
    SETUP_GROUP_FLAG,
    UNFRAGMENTED_FLAGS,
    ErrorFrame,
    Nak,
    Rttm,
    Setup,
    StatusMessage,
)
from echo.transport.core.liveness import ReceiverLiveness
from echo.transport.core.logbuffer import compute_fragmented_length, compute_position, i32
from echo.transport.core.retransmit import RetransmitHandler, resend_due, resend_length
from echo.transport.core.scanner import Emit, TermScanner

_T = TypeVar("_T")

try:
    from mypy_extensions import mypyc_attr
except ImportError:  # mypy's own package (a dev dependency): not needed to run interpreted

    def mypyc_attr(*attrs: str, **kwattrs: object) -> Callable[[_T], _T]:
        return lambda cls: cls

#: what a send returns when the socket buffer is full (nothing sent: try again later)
WOULD_BLOCK: Final = -1


# Aeron's offer() results (Publication.java).
NOT_CONNECTED: Final = -1
BACK_PRESSURED: Final = -2
ADMIN_ACTION: Final = -3
CLOSED: Final = -4
MAX_POSITION_EXCEEDED: Final = -5

OFFER_RESULT_NAMES = {
    NOT_CONNECTED: "NOT_CONNECTED",
    BACK_PRESSURED: "BACK_PRESSURED",
    ADMIN_ACTION: "ADMIN_ACTION",
    CLOSED: "CLOSED",
    MAX_POSITION_EXCEEDED: "MAX_POSITION_EXCEEDED",
}

#: retransmits in flight when the caller names none: Aeron's defaults (one for unicast, where
#: the one receiver retries; sixteen for a group, whose receivers NAK different gaps)
AERON_MAX_RETRANSMITS_UNICAST: Final = 1
AERON_MAX_RETRANSMITS_GROUP: Final = 16
#: a publication may run at most half a term ahead of its slowest receiver (Aeron's term
#: window): the other half and the term before are what it may still have to resend
TERM_WINDOW_DIVISOR: Final = 2
#: `next_deadline` asks for a poll at least this often for that housekeeping (a receiver times
#: out `connection_timeout` after its last SM: a second late at worst is soon enough)
HOUSEKEEPING_INTERVAL: Final = 1.0
#: "the receivers are losing data": a NAK within this long makes the sender probe after
#: every burst (SenderTimers.tail_probe_delay), so a lost tail is NAKed in milliseconds
RECENT_NAK_WINDOW: Final = 1.0
#: a blocked or lingering sender's probes back off by this factor, to the heartbeat interval
PROBE_BACKOFF: Final = 2
#: a current Aeron's answer to end-of-stream may take its conductor's 1 s timer and its 200 ms
#: SM timer: lingering lasts that long after the end while the proof is missing
END_OF_STREAM_ANSWER: Final = 1.3


class PublicationState(enum.Enum):
    ACTIVE = "active"
    DRAINING = "draining"  # closed by the application; sending what is left
    #: all sent; probes until every receiver's SM shows it consumed everything, then
    #: end-of-stream heartbeats until receivers have that too (or the linger time is up)
    LINGERING = "lingering"
    CLOSED = "closed"


# Compiled (compiled.py), yet subclassed by interpreted code: the response channels'
# Request/ResponsePublication (response.py) add a SETUP flag and a receiver of their own.
@mypyc_attr(allow_interpreted_subclasses=True)
class NetworkPublication:
    """One publication's sending side (Aeron's NetworkPublication)."""

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
        #: the log and its tail (appender.py): what `offer` writes
        self.appender = appender = LogAppender(
            session_id=session_id,
            stream_id=stream_id,
            initial_term_id=initial_term_id,
            term_length=term_length,
            mtu=mtu,
        )
        self.session_id = session_id
        self.stream_id = stream_id
        self.initial_term_id = initial_term_id
        self.term_length = term_length
        self.mtu = mtu
        self.max_payload = appender.max_payload
        self.max_message_length = appender.max_message_length
        self.bits = appender.bits
        self.mask = appender.mask
        self.max_position = appender.max_position
        self.log = appender.log
        #: frames out of the log into datagrams (scanner.py)
        self.scanner = TermScanner(appender, mtu)
        self.flow_control = flow_control
        self.counters = counters
        self.is_group = is_group
        self.timers = timers or SenderTimers()
        self.max_retransmits = max_retransmits or (
            AERON_MAX_RETRANSMITS_GROUP if is_group else AERON_MAX_RETRANSMITS_UNICAST
        )
        most = term_length // TERM_WINDOW_DIVISOR
        self.term_window = min(term_window or most, most)
        self.ttl = ttl
        self._start_sending(now)

    def _start_sending(self, now: float) -> None:
        """The sender's state at creation: nothing sent, nobody heard from, a SETUP due."""
        self.state = PublicationState.ACTIVE
        self.sender_position = 0
        self.sender_limit = 0
        self.has_initial_connection = False
        #: the last status message was a receiver's end-of-stream (it closed in order), so a
        #: disconnection that follows is a goodbye, not silence (see api.Publication)
        self.receiver_left = False
        self._setup_pending = True
        self._last_setup = -math.inf
        self._last_send = -math.inf
        self._linger_until = math.inf
        #: lingering: heartbeats say end-of-stream from now on (see _announce_end_due)
        self._announcing_end = False
        #: lingering: announce end-of-stream by then even if some receiver never confirmed
        self._announce_end_by = math.inf
        timers = self.timers
        #: the receivers heard from and their timeouts (liveness.py)
        self.liveness = ReceiverLiveness(timers.connection_timeout, now)
        self._receiver_window = 0
        self.retransmits = RetransmitHandler(
            self.max_retransmits,
            timers.retransmit_linger if self.is_group else timers.unicast_retransmit_linger,
        )
        self._last_nak = -math.inf
        self._acknowledged = 0
        self._probe_at = math.inf
        self._probe_delay = timers.tail_probe_delay
        self._rttm_replies: list[bytes] = []

    # ---------------------------------------------------------------- positions

    @property
    def active_term_id(self) -> int:
        return self.appender.active_term_id

    @property
    def position(self) -> int:
        """The tail: where the next message will be appended."""
        appender = self.appender
        return (appender.term_count << self.bits) + appender.tail_offset

    def is_connected(self, now: float) -> bool:
        if self.state is PublicationState.CLOSED:
            return False
        return self.liveness.is_alive(now) and self.flow_control.has_required_receivers()

    def publisher_limit(self, now: float) -> int:
        if self.is_connected(now):
            return self.sender_position + self.term_window
        return self.sender_position

    # ---------------------------------------------------------------- the application side

    def offer(self, data: bytes | bytearray | memoryview, now: float) -> int:
        """Append one message; returns the new position or one of Aeron's negative codes."""
        if self.state is not PublicationState.ACTIVE:
            return CLOSED
        appender = self.appender
        required = appender.required(len(data))
        position = (appender.term_count << self.bits) + appender.tail_offset
        if position + required >= appender.max_position:
            return MAX_POSITION_EXCEEDED
        # (is_connected, inlined: one call fewer per message, interpreted)
        connected = self.liveness.is_alive(now) and self.flow_control.has_required_receivers()
        if position >= self.sender_position + (self.term_window if connected else 0):
            return BACK_PRESSURED if connected else NOT_CONNECTED
        if not appender.fits(required):
            appender.pad_and_rotate()  # a message never spans terms: the caller offers again
            return ADMIN_ACTION
        return appender.append(data)

    def offer_many(self, messages: Iterable[bytes | bytearray | memoryview], now: float) -> int:
        """Append messages in order until one is refused; returns how many were appended.

        `offer` for each, in one compiled call: a term rotation (ADMIN_ACTION) is taken care
        of here; the first refusal ends the batch (offering the next message says which)."""
        count = 0
        for data in messages:
            result = self.offer(data, now)
            if result == ADMIN_ACTION:
                result = self.offer(data, now)
            if result < 0:
                break
            count += 1
        return count

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

    def linger_bound(self) -> float:
        """The longest a close lingers once all is sent (see END_OF_STREAM_ANSWER)."""
        return max(self.timers.linger, self.timers.linger / 2 + END_OF_STREAM_ANSWER)

    @property
    def is_lingering(self) -> bool:
        """Closed by the application with everything sent: waiting for the receivers."""
        return self.state is PublicationState.LINGERING

    @property
    def is_active(self) -> bool:
        """Open for offers (not closed by the application or the transport)."""
        return self.state is PublicationState.ACTIVE

    @property
    def is_done(self) -> bool:
        return self.state is PublicationState.CLOSED

    @property
    def delivered(self) -> bool:
        """Every live receiver has reported consuming everything offered."""
        tail = self.position
        if self.sender_position < tail:
            return False
        if self.liveness:
            return self.liveness.all_at(tail)
        # Receivers gone (end-of-stream SM or timeout): only what one of them acknowledged.
        return self._acknowledged >= tail

    # ---------------------------------------------------------------- frames from receivers

    def trigger_setup(self) -> None:
        if self.state is not PublicationState.CLOSED and not self._setup_pending:
            self._setup_pending = True
            self._last_setup = -math.inf

    def on_status_message(self, sm: StatusMessage, now: float) -> bool:
        """Take a status message; False if it changed nothing a poll or a waiting channel
        acts on (an idle receiver's periodic SM: only its liveness moved on)."""
        if sm.is_setup_eliciting:
            # A setup-eliciting SM carries no position (term 0, offset 0, window 0): feeding it to
            # flow control would move the limit to garbage, so it only asks for a SETUP.
            self.trigger_setup()
            return True
        sm_position = compute_position(
            sm.consumption_term_id, sm.consumption_term_offset, self.bits, self.initial_term_id
        )
        # A receiver cannot have consumed what was never sent; clamping keeps a forged SM from
        # opening the limit far beyond the data in flight. (Aeron 1.51 rejects an SM more than
        # half a term from the sender position; echo does not: a term-end PAD skipped whole
        # lets the sender pass its limit, so an honest SM can fall just outside, and dropping
        # it stalled a stream at 20 % loss. docs/transport.md.)
        sm_position = max(0, min(sm_position, self.sender_position))
        limit = self.sender_limit
        self.sender_limit = self.flow_control.on_status_message(sm, sm_position, limit, now)
        news = self.sender_limit != limit or sm_position > self._acknowledged or self._setup_pending
        news = news or sm.receiver_window != self._receiver_window or self.receiver_left
        news = news or self.state is not PublicationState.ACTIVE or not self.liveness.is_alive(now)
        news = news or sm.receiver_id not in self.liveness.receivers
        if sm.is_end_of_stream and self._announcing_end:
            # The receiver answers our end-of-stream: Aeron sends the EOS flag once its image
            # has seen end-of-stream with nothing missing up to it (PublicationImage:
            # isEndOfStream && rebuildPosition == hwmPosition), whatever subscriber position
            # the SM carries; it is what Aeron's own publication waits for before it stops
            # lingering (NetworkPublication: hasReceivedUnicastEos).
            sm_position = self.sender_position
        self._acknowledged = max(self._acknowledged, sm_position)
        if sm.is_end_of_stream:
            self.liveness.forget(sm.receiver_id)
            self.receiver_left = True
            return True
        self.receiver_left = False
        self.liveness.on_status_message(sm.receiver_id, sm_position, now)
        self._receiver_window = sm.receiver_window
        news = news or not self.has_initial_connection
        self.has_initial_connection = True
        self._setup_pending = False
        return news

    def on_error_frame(self, frame: ErrorFrame, now: float) -> None:
        # The receiver refused the image: treat it as gone (Aeron marks it end-of-stream).
        self.liveness.forget(frame.receiver_id)

    def on_nak(self, nak: Nak, now: float) -> bool:
        """Take a NAK: True if a resend of it now waits for the next `poll`."""
        # Aeron's RetransmitHandler: a negative length is invalid, a zero one asks for nothing
        if (
            nak.term_offset < 0
            or nak.term_offset > self.term_length - DATA_HEADER_LENGTH
            or nak.length < 0
        ):
            self.counters.invalid("bad_nak")
            return False
        if not nak.length:
            return False
        self._last_nak = now
        position = compute_position(nak.term_id, nak.term_offset, self.bits, self.initial_term_id)
        length = resend_length(
            position,
            min(nak.length, self.term_length - nak.term_offset),
            self.sender_position,
            self.term_length // TERM_WINDOW_DIVISOR
            + compute_fragmented_length(self.max_message_length, self.max_payload),
            max(self._receiver_window, self.mtu) * self.flow_control.retransmit_window_multiple,
        )
        if not length:
            return False
        return self.retransmits.on_nak(position, length, now)

    def on_rttm(self, rttm: Rttm, now: float) -> None:
        if rttm.flags & RTTM_REPLY_FLAG:  # a request for a reply (not itself a reply)
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
        flags = BEGIN_END_AND_EOS_FLAGS if eos else UNFRAGMENTED_FLAGS
        return self.appender.data_header(self.sender_position, flags)

    @property
    def run_segments(self) -> int:
        """Datagrams that may go to `emit` as one run (UDP GSO; 0 or 1: one at a time)."""
        return self.scanner.run_segments

    @run_segments.setter
    def run_segments(self, value: int) -> None:
        self.scanner.run_segments = value

    def _send_range(self, position: int, end: int, emit: Emit) -> int:
        """Send whole frames from `position` until `end`; returns the position reached."""
        scanner = self.scanner
        reached = scanner.send(position, end, emit)
        if scanner.blocked:
            self.counters.send_would_block += 1
        return reached

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

        if self.retransmits:
            resend_due(self.retransmits, now, self.scanner, emit, counters)

        self.send_pending(now, emit)
        if self.liveness.expire(now):
            self.sender_limit = self.flow_control.on_idle(now, self.sender_limit)

        if self.state is PublicationState.DRAINING:
            if self.sender_position >= self.position:
                self.state = PublicationState.LINGERING
                self._linger_until = now + self.timers.linger
                self._announce_end_by = now + self.timers.linger / 2
                self.liveness.start_lingering()
                self._last_send = -math.inf  # a heartbeat at once: where the stream ends
            elif not self.is_connected(now):
                self.state = PublicationState.CLOSED
                return

        lingering = self.state is PublicationState.LINGERING
        if lingering and not self._announcing_end and self._announce_end_due(now):
            self._announcing_end = True
            self._last_send = -math.inf  # announce end-of-stream at once
            if self.liveness and not self.delivered:
                announced = min(now, self._announce_end_by) + END_OF_STREAM_ANSWER
                self._linger_until = max(self._linger_until, announced)
        if (self.has_initial_connection or lingering) and (
            now >= self._last_send + self.timers.heartbeat_interval or now >= self._probe_at
        ):
            self._send_heartbeat(now, emit)

        if lingering and (now >= self._linger_until or not self.liveness):
            # Linger ends early once every receiver has said goodbye (an end-of-stream SM):
            # until then keep announcing end-of-stream, in case those heartbeats were lost.
            self.state = PublicationState.CLOSED

    def repair(self, now: float, emit: Emit) -> None:
        """Send the resends that are due now (the part of `poll` a NAK just read needs)."""
        if self.state is not PublicationState.CLOSED and self.retransmits:
            resend_due(self.retransmits, now, self.scanner, emit, self.counters)

    def _send_heartbeat(self, now: float, emit: Emit) -> None:
        """An idle heartbeat, a probe after data, or end-of-stream while lingering."""
        probing = now >= self._probe_at
        first_at_end = self._last_send == -math.inf  # lingering (or its end-of-stream) began
        sent = emit(self._heartbeat(eos=self._announcing_end))
        if sent >= 0:
            self._last_send = now
            self._probe_at = math.inf
            self.counters.heartbeats_sent += sent
            # Closed and a receiver has not shown the tail (or blocked on flow control): probe,
            # backing off. An echo receiver answers a heartbeat's repeat at once (status.py),
            # so the first from the end comes with its twin; an Aeron one on its SM timer.
            awaiting_proof = self.state is PublicationState.LINGERING and not (
                self._announcing_end or self.liveness.all_caught_up(self.position)
            )
            if awaiting_proof and first_at_end:
                self.counters.heartbeats_sent += max(0, emit(self._heartbeat(eos=False)))
            if awaiting_proof and (first_at_end or not probing):
                self._probe_delay = self.timers.tail_probe_delay
                self._probe_at = now + self._probe_delay
            elif probing and (awaiting_proof or self._flow_blocked()):
                self._probe_delay = min(
                    self._probe_delay * PROBE_BACKOFF, self.timers.heartbeat_interval
                )
                self._probe_at = now + self._probe_delay

    def _announce_end_due(self, now: float) -> bool:
        """May the lingering publication's heartbeats say end-of-stream now? Once every
        receiver has shown it has everything, or sent SMS_WITHOUT_TAIL stale SMs (Aeron 1.4x),
        or at half the linger time: an Aeron 1.15 receiver drops a complete image at the end
        without a last SM (docs/transport.md, "close() returns True only on proof")."""
        if now >= self._announce_end_by:
            return True
        tail = self.position
        return self.liveness.all_caught_up(tail)

    def send_pending(self, now: float, emit: Emit) -> bool:
        """Send new data up to the flow-control limit; True if anything went out.

        The part of `poll` that an offer needs at once (the driver's flush): the timers, the
        SETUP and the retransmits wait for the next full poll.
        """
        appender = self.appender
        position = (appender.term_count << self.bits) + appender.tail_offset
        limit = self.sender_limit if self.sender_limit < position else position
        before = self.sender_position
        if before >= limit or self.state is PublicationState.CLOSED:
            return False
        reached = self.sender_position = self._send_range(before, limit, emit)
        # Datagrams of new data that left (each copy to each destination), not calls made.
        self.counters.data_frames_sent += self.scanner.wire_datagrams
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
        elif timers.probe_after_data or now - self._last_nak < RECENT_NAK_WINDOW:
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
        return room <= 0 or not self.scanner.next_frame_fits(position, room)

    def next_deadline(self, now: float) -> float:
        """The earliest time `poll` has something to do (may be <= now)."""
        if self.state is PublicationState.CLOSED:
            return math.inf
        if self._rttm_replies:
            return now
        sender_position = self.sender_position
        limit = min(self.sender_limit, self.position)
        if sender_position < limit and self.scanner.next_frame_fits(
            sender_position, limit - sender_position
        ):
            return now
        timers = self.timers
        # Housekeeping (receiver and flow-control timeouts): `poll` checks them at most every
        # 0.1 s and a receiver times out `connection_timeout` after its last SM, so a wake-up
        # within a second of either is soon enough.
        deadline = now + HOUSEKEEPING_INTERVAL
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
        if self.retransmits:
            resend = self.retransmits.next_deadline(now)
            if resend <= now:
                return now
            if resend < deadline:
                deadline = resend
        if self.state is PublicationState.LINGERING:
            if self._linger_until < deadline:
                deadline = self._linger_until
            if not self._announcing_end:
                if self._announce_end_due(now):
                    return now
                if self._announce_end_by < deadline:
                    deadline = self._announce_end_by
        liveness = self.liveness
        if liveness.expiry < deadline:
            # (not before the next check: `expire` looks no sooner)
            deadline = max(liveness.expiry, liveness.next_check)
        return deadline

    def release(self) -> None:
        self.log.close()
