"""Image state: rebuilding a publication's log, loss detection, NAKs and status messages.

Pure, like sender.py: `now` is passed in and output goes through an injected `send(datagram,
address) -> bool`. `ReceiveEndpoint` is what Aeron calls a receive channel endpoint plus its data
packet dispatcher: one socket's worth of subscriptions, images, setup elicitation and, for a
multi-destination subscription, the setup-eliciting SMs that register it with the publisher.
"""

from __future__ import annotations

import enum
import heapq
import math
import random
from collections.abc import Callable

import attrs

from echo.transport.counters import Counters
from echo.transport.destinations import Address
from echo.transport.frames import (
    BEGIN_END_AND_EOS_FLAGS,
    BEGIN_FLAG,
    DATA_HEADER_LENGTH,
    DATA_HEADER_STRUCT,
    END_FLAG,
    FRAME_ALIGNMENT,
    MAX_UDP_PAYLOAD_LENGTH,
    SETUP_GROUP_FLAG,
    SM_EOS_FLAG,
    SM_LENGTH,
    SM_SETUP_FLAG,
    UNFRAGMENTED_FLAGS,
    FrameError,
    FrameType,
    Nak,
    Setup,
    StatusMessage,
    parse_data_run_untrusted,
    parse_data_untrusted,
    parse_datagram_untrusted,
)
from echo.transport.logbuffer import (
    PARTITION_COUNT,
    TermBuffers,
    check_term_length,
    compute_max_message_length,
    compute_position,
    i32,
    insert_packet,
    position_bits_to_shift,
    rebuild_offset,
    scan_for_gap,
)
from echo.transport.validation import SM_COOKIE_FLAG, RateLimiter

#: sends one datagram; returns 1 if it left, 0 if it was lost on the way out (send error),
#: or -1 (sender.WOULD_BLOCK): socket buffer full, nothing sent, try again later
Send = Callable[[bytes | memoryview, Address], int]
Deliver = Callable[[bytes], None]

DEFAULT_RECEIVER_WINDOW = 128 * 1024
_MAX_GAPS = 64
# Heartbeats from one position closer together than this are a blocked sender's probes
# (sender.py backs them off from 2 ms; idle heartbeats come every 100 ms or more).
_PROBE_REPEAT = 0.05
_HEADER_FIELDS = DATA_HEADER_STRUCT.unpack_from


@attrs.frozen
class ReceiverTimers:
    status_message_interval: float = 0.2
    liveness_timeout: float = 10.0
    nak_delay: float = 0.0001  # unicast: 100 µs, then retry every nak_delay * 100 (10 ms)
    nak_retry_ratio: int = 100
    #: unicast NAK retries follow the measured repair time (see Image._retry_delay), but never
    #: sooner than this after the last NAK of a gap (a few loopback repair times: 0.1-0.3 ms)
    nak_retry_min: float = 0.0005
    group_nak_max_backoff: float = 0.01
    group_size: int = 10
    setup_elicit_interval: float = 0.2
    mdc_registration_interval: float = 1.0
    cooldown: float = 10.0


def group_nak_delay(rng: random.Random, max_backoff: float, group_size: int) -> float:
    """Aeron's OptimalMulticastDelayGenerator: a random NAK delay in (0, max_backoff].

    Spreading the NAKs of a group over time lets one NAK (and its retransmit, which every
    receiver sees) suppress the rest (reference §2.5).
    """
    lam = math.log(group_size) + 1.0
    t = max_backoff
    factor = (math.exp(lam) - 1.0) * (t / lam)
    x = rng.uniform(0.0, lam / t) + lam / (t * (math.exp(lam) - 1.0))
    delay = (t / lam) * math.log(x * factor)
    return min(max(delay, 0.0), t)


class ImageState(enum.Enum):
    ACTIVE = "active"
    END_OF_STREAM = "end_of_stream"  # the publisher closed and everything was consumed
    TIMED_OUT = "timed_out"  # no packet for the liveness timeout
    CLOSED = "closed"  # the subscription went away


class Image:
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
        self.window = min(rcv_wnd, term_length // 2)
        self.log = TermBuffers(term_length)
        self.terms = self.log.terms

        join = compute_position(active_term_id, term_offset, self.bits, initial_term_id)
        self.join_position = join
        self.subscriber_position = join
        self.rebuild_position = join
        self.hwm = join
        self.last_sm_position = join
        # What the SM before the last one let the sender send up to: a sender that probes at
        # that edge never got our last SM (see on_data).
        self._previous_grant = join + self.window
        # The last heartbeat: where and when (two from one position in quick succession are a
        # blocked sender's probes).
        self._heartbeat_position = -1
        self._heartbeat_time = -math.inf
        #: the window edge a blocked sender waits at until it hears of our latest SM
        self._unconfirmed_edge: int | None = None
        self._confirm_delay = 0.0
        self._join_term = join >> self.bits
        self._subscriber_term = self._join_term
        self.state = ImageState.ACTIVE
        self.eos_position: int | None = None
        self._last_packet = now
        self._sm_deadline = now  # the first SM goes out at once: it is what connects the sender
        # Known gaps (position, length) -> when to NAK them next; rescanned only after new data.
        self._gaps: dict[tuple[int, int], float] = {}
        self._loss_dirty = False
        # Repair time (first NAK of a gap -> its first byte back), smoothed as TCP smooths
        # RTT (RFC 6298): unicast NAK retries wait for it instead of Aeron's fixed 10 ms.
        # Gap start -> when its one and only NAK went, or None once it was NAKed again
        # (Karn: a repair after a retry says nothing about the round trip).
        self._nak_times: dict[int, float | None] = {}
        self._srtt: float | None = None
        self._rttvar = 0.0
        self._last_window_update = -math.inf
        # Anti-amplification: the source of a SETUP is not validated (it may be forged), so
        # the image never sends it more bytes than it has received from it.
        self.budgeted = budgeted
        self.budget = 0
        self.starved = False
        # The fragments of the message being assembled, as views of the term (they stay put
        # until the term is cleaned, two terms later): joined once, one copy in all.
        self._builder: list[memoryview] | None = None
        self._builder_next = 0
        self.created = now

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
            (((term_id - self.initial_term_id + 0x80000000) & 0xFFFFFFFF) - 0x80000000)
            << self.bits
        ) + term_offset
        window_end = self.last_sm_position + self.term_length // 2
        if heartbeat:
            self.counters.heartbeats_received += 1
            if self.subscriber_position <= position <= window_end:
                if position > self.hwm:
                    self.hwm = position
                    self._loss_dirty = True
                if flags == BEGIN_END_AND_EOS_FLAGS:
                    self.eos_position = position
            edge = position + self.mtu
            probing = (
                position == self._heartbeat_position
                and now - self._heartbeat_time < _PROBE_REPEAT
            )
            self._heartbeat_position = position
            self._heartbeat_time = now
            if (
                edge >= self.last_sm_position + self.window
                or edge >= self._previous_grant
                or probing
                # The sender stopped where we have consumed everything, which our last SM
                # did not say yet: a closing publication waits for that proof of delivery
                # before it announces end-of-stream (sender.py, _announce_end_due). Sent
                # now, it moves the periodic SM back by an interval, so it costs nothing.
                or self.last_sm_position < position == self.subscriber_position
            ):
                # The sender idles at the edge of the window we gave it, or of the one before
                # (then our last SM, which moved it, was lost), or it probes again and again
                # from one position (a blocked sender backs its probes off from 2 ms; an idle
                # one beats every 100 ms or more): it waits for an SM, perhaps after several
                # were lost. Answer now (at most once a millisecond), not at the periodic SM.
                self._sm_deadline = min(
                    self._sm_deadline, max(now, self._last_window_update + 0.001)
                )
            return True
        length = len(packet)
        if position < self.last_sm_position:
            self.counters.flow_control_underruns += 1
            return True
        if position + length > window_end:
            self.counters.flow_control_overruns += 1
            return True
        if term_offset + length > self.term_length:
            self.counters.invalid("beyond_term")
            return True
        term = self.terms[(position >> self.bits) % PARTITION_COUNT]
        if not insert_packet(term, term_offset, packet):
            self.counters.duplicate_data += 1
            return True
        if self._nak_times:
            nak_time = self._nak_times.pop(position, None)
            if nak_time is not None:
                self._repair_sample(now - nak_time)
        end = position + length
        if end > self.hwm:
            self.hwm = end
            if self._unconfirmed_edge is not None and end > self._unconfirmed_edge:
                self._unconfirmed_edge = None  # the sender has our SM: it sends beyond
        if position <= self.rebuild_position:
            if whole_data and end > self.rebuild_position:
                self.rebuild_position = end
            if self.rebuild_position < self.hwm or not whole_data:
                self._advance_rebuild()
        self._loss_dirty = True
        return (
            self.rebuild_position < self.hwm
            or bool(self._gaps)
            or now >= self._sm_deadline
            or self.eos_position is not None
        )

    def on_setup(self, now: float) -> None:
        # A repeated SETUP means our SM was lost: answer soon.
        self._last_packet = now
        self._sm_deadline = min(self._sm_deadline, now)

    def _advance_rebuild(self) -> None:
        while self.rebuild_position < self.hwm:
            position = self.rebuild_position
            term = self.terms[(position >> self.bits) % PARTITION_COUNT]
            offset = position & self.mask
            limit = min(self.term_length, offset + (self.hwm - position))
            reached = rebuild_offset(term, offset, limit)
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
        term = self.terms[(position >> self.bits) % PARTITION_COUNT]
        start = position & self.mask
        end = min(self.term_length, start + available)
        offset = start
        fragments = 0
        while offset < end and fragments < fragment_limit:
            frame_length, _, flags, frame_type, *_ = _HEADER_FIELDS(term, offset)
            aligned = (frame_length + 31) & ~31
            if frame_type == FrameType.PAD:
                offset += aligned
                continue
            payload_start = offset + DATA_HEADER_LENGTH
            payload_end = offset + frame_length
            if flags & UNFRAGMENTED_FLAGS == UNFRAGMENTED_FLAGS:
                deliver(bytes(term[payload_start:payload_end]))
            elif flags & BEGIN_FLAG:
                self._builder = [term[payload_start:payload_end]]
                self._builder_next = offset + aligned
            elif self._builder is not None and offset == self._builder_next:
                self._builder.append(term[payload_start:payload_end])
                self._builder_next = offset + aligned
                if flags & END_FLAG:
                    message = b"".join(self._builder)
                    self._builder = None
                    deliver(message)
            else:
                # A middle or end fragment without its beginning (we joined mid-message).
                self._builder = None
            fragments += 1
            offset += aligned
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

    def _gap_delay(self, first: bool) -> float:
        if self.is_group:
            return group_nak_delay(
                self.rng, self.timers.group_nak_max_backoff, self.timers.group_size
            )
        if first:
            return self.timers.nak_delay
        return self._retry_delay()

    def _retry_delay(self) -> float:
        """How long a unicast gap waits after a NAK before it is NAKed again.

        Aeron waits a fixed nak_delay x 100 (10 ms): on a LAN or loopback, where a repair comes
        back in a fraction of a millisecond, a lost NAK or retransmit then idles the stream for
        10 ms, and at 5 % loss that is most of the time. Here the retry waits for the repair
        time measured on this image, plus four deviations (TCP's RTO), at least
        `nak_retry_min`; until a repair has been measured, Aeron's fixed delay.
        """
        timers = self.timers
        if self._srtt is None:
            return timers.nak_delay * timers.nak_retry_ratio
        return max(timers.nak_retry_min, self._srtt + 4 * self._rttvar)

    def _repair_sample(self, sample: float) -> None:
        if self._srtt is None:
            self._srtt = sample
            self._rttvar = sample / 2
        else:
            self._rttvar = 0.75 * self._rttvar + 0.25 * abs(self._srtt - sample)
            self._srtt = 0.875 * self._srtt + 0.125 * sample

    def credit(self, size: int) -> None:
        self.budget += size
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
        if now - self._last_packet > self.timers.liveness_timeout:
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
        elif self._gaps:
            self._gaps = {}

        consumption = self.subscriber_position
        if not self.starved and (
            now >= self._sm_deadline or self._window_update_due(consumption, now)
        ):
            sent = self._send(self._status_message(), send)
            if sent >= 0:
                counters.status_messages_sent += sent
                old_grant = self.last_sm_position + self.window
                if consumption + self.window > old_grant:
                    self._previous_grant = old_grant  # (a repeat of the same grant is not news)
                self.last_sm_position = consumption
                self._last_window_update = now
                interval = self.timers.status_message_interval
                if consumption + self.window > old_grant and self.hwm + self.mtu >= old_grant:
                    # This SM frees a sender that used up its window. If it is lost, the
                    # sender waits for it: repeat it after a repair time (backing off) until
                    # data from beyond the old edge shows it arrived.
                    self._unconfirmed_edge = old_grant
                    self._confirm_delay = self._retry_delay()
                elif self._unconfirmed_edge is not None:
                    self._confirm_delay = min(2 * self._confirm_delay, interval)
                if self._unconfirmed_edge is not None:
                    interval = min(interval, self._confirm_delay)
                self._sm_deadline = now + interval

    def _scan_gaps(self, now: float) -> None:
        """Find up to `_MAX_GAPS` gaps between the rebuild position and the high-water mark.

        Aeron's LossDetector NAKs one gap at a time; under heavy loss that costs a round trip
        per gap, so every gap in the window gets its own NAK timer here.
        """
        gaps: dict[tuple[int, int], float] = {}
        previous_gaps = self._gaps
        nak_times = self._nak_times
        position = self.rebuild_position
        # A legitimate sender never runs more than our window past what we reported, so gaps
        # are only looked for that far: a forged frame far ahead cannot make us scan (or NAK)
        # megabytes of an empty term.
        hwm = min(self.hwm, self.rebuild_position + self.window)
        while position < hwm and len(gaps) < _MAX_GAPS:
            term = self.terms[(position >> self.bits) % PARTITION_COUNT]
            offset = position & self.mask
            limit = min(self.term_length, offset + (hwm - position))
            found = scan_for_gap(term, offset, limit)
            if found is None:
                if limit < self.term_length:
                    break
                position += self.term_length - offset
                continue
            gap_offset, gap_length = found
            gap = (position - offset + gap_offset, gap_length)
            deadline = previous_gaps.get(gap)
            if deadline is None:
                parent = _enclosing(previous_gaps, gap) if previous_gaps else None
                if parent is None:
                    deadline = now + self._gap_delay(first=True)
                else:
                    # What is left of a gap being repaired (the resend has partly arrived):
                    # it keeps the gap's retry time instead of being NAKed again at once.
                    deadline = previous_gaps[parent]
                    if parent[0] in nak_times:
                        nak_times[gap[0]] = None
            gaps[gap] = deadline
            position = gap[0] + gap_length
        self._gaps = gaps
        self._loss_dirty = False
        if nak_times:
            # Forget the NAK times of gaps that are gone (filled, or passed by).
            for start in [start for start in nak_times if start < self.rebuild_position]:
                del nak_times[start]

    def status_message_due(self) -> bool:
        """Has consumption moved far enough that the sender should hear of it now?"""
        progress = self.subscriber_position - self.last_sm_position
        return progress >= self.window >> 2 or (
            progress > 0 and self.hwm + self.mtu >= self.last_sm_position + self.window
        )

    def _window_update_due(self, consumption: int, now: float) -> bool:
        progress = consumption - self.last_sm_position
        if progress <= 0:
            return False
        if progress >= self.window >> 2:
            return True
        # The sender has used (nearly) all the window we gave it and is waiting: tell it about
        # what we consumed now rather than at the next periodic SM (TCP's window update).
        # At most one such SM per millisecond, so a slow reader does not send one per message.
        return self.hwm + self.mtu >= self.last_sm_position + self.window and (
            now >= self._last_window_update + 0.001
        )

    def _detect_loss(self, now: float, send: Send) -> None:
        if self._loss_dirty:
            self._scan_gaps(now)
        for gap, deadline in list(self._gaps.items()):
            if now < deadline:
                continue
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
                del self._gaps[gap]
                self._advance_rebuild()
                self._loss_dirty = True
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
                # The first NAK of a gap times its repair; a second spoils the sample.
                self._nak_times[position] = now if position not in self._nak_times else None
            self._gaps[gap] = now + self._gap_delay(first=False)

    def next_deadline(self, now: float) -> float:
        if self.state is not ImageState.ACTIVE:
            return now
        liveness = self._last_packet + self.timers.liveness_timeout
        if self.starved:
            return liveness  # nothing can be sent before the source sends us more
        deadline = min(self._sm_deadline, liveness)
        if self.is_end_of_stream:
            return now
        if self.rebuild_position < self.hwm:
            if self._loss_dirty:
                return now
            for gap_deadline in self._gaps.values():
                deadline = min(deadline, gap_deadline)
        elif self._gaps:
            return now
        if self._window_update_due(self.subscriber_position, now):
            return now
        if (
            self.subscriber_position > self.last_sm_position
            and self.hwm + self.mtu >= self.last_sm_position + self.window
        ):
            deadline = min(deadline, self._last_window_update + 0.001)
        return deadline

    def say_goodbye(self, send: Send) -> None:
        """Repeat the end-of-stream SM for a lingering publisher (budgeted like any SM)."""
        sent = self._send(self._status_message(SM_EOS_FLAG), send)
        if sent > 0:
            self.counters.status_messages_sent += sent

    def close(self, send: Send) -> None:
        """The subscription is going: tell the sender (an end-of-stream SM) and stop."""
        if self.state is ImageState.ACTIVE:
            sent = self._send(self._status_message(SM_EOS_FLAG), send)
            if sent > 0:
                self.counters.status_messages_sent += sent
            self.state = ImageState.CLOSED


@attrs.frozen
class StreamInterest:
    """What a subscription asked for on an endpoint."""

    stream_id: int
    session_id: int | None = None
    reliable: bool = True
    rcv_wnd: int = DEFAULT_RECEIVER_WINDOW
    group_tag: int | None = None
    max_term_length: int = 1 << 30


@attrs.frozen
class ImageAvailable:
    image: Image


@attrs.frozen
class ImageUnavailable:
    image: Image
    reason: ImageState


ImageEvent = ImageAvailable | ImageUnavailable


class ReceiveEndpoint:
    """One data socket's subscriptions and images (Aeron's ReceiveChannelEndpoint + dispatcher)."""

    def __init__(
        self,
        *,
        counters: Counters,
        receiver_id: int,
        now: float,
        control: Address | None = None,
        group_tag: int | None = None,
        timers: ReceiverTimers | None = None,
        rng: random.Random | None = None,
        limit_amplification: bool = True,
        max_images: int = 1024,
        limiter: RateLimiter | None = None,
    ) -> None:
        self.counters = counters
        self.limiter = limiter or RateLimiter()
        self.receiver_id = receiver_id
        self.limit_amplification = limit_amplification
        self._cookie = (0, 0)
        self.control = control
        self.group_tag = group_tag
        self.timers = timers or ReceiverTimers()
        self.rng = rng or random.Random()
        self.interests: dict[int, StreamInterest] = {}
        self.images: dict[tuple[int, int], Image] = {}
        self.events: list[ImageEvent] = []
        self._cooldown: dict[tuple[int, int], float] = {}
        self._elicited: dict[tuple[int, int], float] = {}
        self._pending: list[tuple[tuple[int, int], Address]] = []
        self._next_registration = now
        # Each image's next deadline, and a heap of (deadline, key) with stale entries left
        # in place (an entry counts only while it matches `_deadlines`): the endpoint's next
        # deadline and the images due are found in O(log images), not by looking at all of them.
        self._deadlines: dict[tuple[int, int], float] = {}
        self._deadline_heap: list[tuple[float, tuple[int, int]]] = []
        self._finished: dict[tuple[int, int], Image] = {}
        self._goodbyes: list[Image] = []
        self._touched: set[tuple[int, int]] = set()
        self._next_cleanup = now
        self.max_images = max_images

    # ---------------------------------------------------------------- subscriptions

    def add_interest(self, interest: StreamInterest, now: float) -> None:
        if interest.stream_id in self.interests:
            raise ValueError(
                f"stream {interest.stream_id} already has a subscription on this channel"
            )
        self.interests[interest.stream_id] = interest
        # Register with a multi-destination publisher at once rather than at the next tick.
        self._next_registration = now

    def remove_interest(self, stream_id: int, send: Send) -> None:
        self.interests.pop(stream_id, None)
        for key, image in list(self.images.items()):
            if key[1] == stream_id:
                image.close(send)
                self._drop_image(key, image, ImageState.CLOSED, now=None)

    def reject_image(self, session_id: int, stream_id: int, now: float, send: Send) -> None:
        """The application refuses this image: say goodbye and ignore the session for a while."""
        key = (session_id, stream_id)
        image = self.images.get(key)
        if image is not None:
            image.close(send)
            self._drop_image(key, image, ImageState.CLOSED, now)

    # ---------------------------------------------------------------- network input

    def on_datagram(self, data: bytes | memoryview, source: Address, now: float) -> None:
        """Handle one datagram from the network (untrusted)."""
        try:
            fields = parse_data_untrusted(data)
            frame = parse_datagram_untrusted(data) if fields is None else None
        except FrameError as error:
            self.counters.invalid(error.reason)
            return
        if fields is not None:
            frame_length, flags, frame_type, term_offset, session_id, stream_id, term_id, _ = (
                fields
            )
            key = (session_id, stream_id)
            heartbeat = frame_length == 0 and frame_type == FrameType.DATA
            image = self.images.get(key)
            if image is not None:
                image.budget += len(data)
                starved = image.starved
                image.starved = False
                if image.on_data(heartbeat, flags, term_offset, term_id, data, now) or starved:
                    self._touched.add(key)
                return
            finished = self._finished.get(key)
            if finished is not None:
                if heartbeat and flags == BEGIN_END_AND_EOS_FLAGS:
                    finished.credit(len(data))
                    self._goodbyes.append(finished)
                return
            if self.limit_amplification and len(data) < SM_LENGTH:
                # Eliciting a SETUP costs a 36-byte SM: never answer a smaller datagram (a
                # forged 32-byte heartbeat) with it.
                self.counters.amplification_limited += 1
                return
            self._on_unknown_data(key, source, now)
        elif isinstance(frame, Setup):
            self._on_setup(frame, source, now, len(data))
        elif (
            isinstance(frame, StatusMessage)
            and frame.flags & SM_COOKIE_FLAG
            and self.control is not None
            and source[:2] == self.control[:2]
        ):
            # The MDC publisher asks us to prove our address: echo its cookie at once.
            self._cookie = (frame.consumption_term_id, frame.consumption_term_offset)
            self.counters.cookies_received += 1
            self._next_registration = now
        else:
            # SMs and NAKs belong on a publication's socket; RTTM replies are not used here.
            self.counters.invalid("unexpected_on_receive_channel")

    def on_datagram_run(
        self, data: bytes | memoryview, segment: int, source: Address, now: float
    ) -> int:
        """Datagrams of `segment` bytes read together (UDP GRO), untrusted: handled as one if
        they continue one another on an image we have; returns how many, 0 if not handled
        (the caller then hands them to `on_datagram` one by one)."""
        fields = parse_data_run_untrusted(data, segment)
        if fields is None:
            return 0
        _, flags, _, term_offset, session_id, stream_id, term_id, _ = fields
        key = (session_id, stream_id)
        image = self.images.get(key)
        if image is None:
            return 0
        image.budget += len(data)
        starved = image.starved
        image.starved = False
        if image.on_data(False, flags, term_offset, term_id, data, now, whole_data=True) or starved:
            self._touched.add(key)
        return -(-len(data) // segment)

    def _wanted(self, session_id: int, stream_id: int) -> StreamInterest | None:
        interest = self.interests.get(stream_id)
        if interest is None:
            self.counters.unknown_session_drops += 1
            return None
        if interest.session_id is not None and interest.session_id != session_id:
            # A session filter is silent: the other session learns nothing (reference §5).
            self.counters.session_filter_drops += 1
            return None
        return interest

    def _on_unknown_data(self, key: tuple[int, int], source: Address, now: float) -> None:
        if self._wanted(*key) is None or self._cooldown.get(key, -math.inf) > now:
            return
        # Data of a session we have no image for (its SETUP was lost, or we joined an MDC stream
        # late): ask its source for a SETUP, at most once per interval.
        if now < self._elicited.get(key, -math.inf) + self.timers.setup_elicit_interval:
            return
        # ...and at a bounded rate per source host: a flood of forged data for ever-new
        # sessions must not become a flood of SMs towards the forged address.
        if not self.limiter.allow(str(source[0]), now):
            self.counters.rate_limited += 1
            return
        self._elicited[key] = now
        self._pending.append((key, source))

    def _on_setup(self, frame: Setup, source: Address, now: float, size: int) -> None:
        counters = self.counters
        counters.setups_received += 1
        key = (frame.session_id, frame.stream_id)
        image = self.images.get(key)
        if image is not None:
            image.credit(size)
            image.on_setup(now)
            self._touched.add(key)
            return
        interest = self._wanted(*key)
        if interest is None or self._cooldown.get(key, -math.inf) > now:
            return
        problem = _check_setup(frame, interest)
        if problem is None and len(self.images) >= self.max_images:
            problem = "too_many_images"

        if problem is not None:
            counters.invalid(problem)
            return
        image = Image(
            session_id=frame.session_id,
            stream_id=frame.stream_id,
            initial_term_id=frame.initial_term_id,
            active_term_id=frame.active_term_id,
            term_offset=frame.term_offset,
            term_length=frame.term_length,
            mtu=frame.mtu,
            control_address=source,
            receiver_id=self.receiver_id,
            counters=counters,
            now=now,
            rcv_wnd=interest.rcv_wnd,
            is_group=bool(frame.flags & SETUP_GROUP_FLAG),
            reliable=interest.reliable,
            group_tag=interest.group_tag if interest.group_tag is not None else self.group_tag,
            timers=self.timers,
            rng=self.rng,
            budgeted=self.limit_amplification,
        )
        image.credit(size)
        self.images[key] = image
        self._touched.add(key)
        self._elicited.pop(key, None)
        counters.images_created += 1
        self.events.append(ImageAvailable(image))

    def _drop_image(
        self, key: tuple[int, int], image: Image, reason: ImageState, now: float | None
    ) -> None:
        self._deadlines.pop(key, None)
        if self.images.pop(key, None) is None:
            return
        self.counters.images_closed += 1
        if now is not None:
            # Stragglers of a finished session must not elicit a SETUP and resurrect it.
            self._cooldown[key] = now + self.timers.cooldown
            if reason is ImageState.END_OF_STREAM:
                # Kept to answer the publisher's end-of-stream heartbeats while it lingers, in
                # case our goodbye (an EOS status message) was lost: Aeron's image LINGER state.
                self._finished[key] = image
        self.events.append(ImageUnavailable(image, reason))

    # ---------------------------------------------------------------- output and timers

    def poll(self, now: float, send: Send) -> None:
        counters = self.counters
        if self.control is not None and self.interests and now >= self._next_registration:
            self._next_registration = now + self.timers.mdc_registration_interval
            # Register (and stay registered) as a destination of the MDC publisher: session 0,
            # stream 0, SETUP flag, window 0 (reference §3). It goes from this data socket, so
            # the publisher learns the NAT mapping that leads back here. Not once every stream
            # has its image: the images' own SMs, from this socket and receiver id, keep us a
            # destination, and a registration would be one more datagram a second for nothing.
            if not self._has_every_image():
                registration = StatusMessage(
                    session_id=0,
                    stream_id=0,
                    consumption_term_id=self._cookie[0],
                    consumption_term_offset=self._cookie[1],
                    receiver_window=0,
                    receiver_id=self.receiver_id,
                    group_tag=self.group_tag,
                    flags=SM_SETUP_FLAG,
                ).encode()
                sent = send(registration, self.control)
                if sent > 0:
                    counters.setup_elicitations_sent += sent
        pending = self._pending
        if pending:
            for (session_id, stream_id), source in pending:
                elicit = StatusMessage(
                    session_id=session_id,
                    stream_id=stream_id,
                    consumption_term_id=0,
                    consumption_term_offset=0,
                    receiver_window=0,
                    receiver_id=self.receiver_id,
                    group_tag=self.group_tag,
                    flags=SM_SETUP_FLAG,
                ).encode()
                sent = send(elicit, source)
                if sent > 0:
                    counters.setup_elicitations_sent += sent
            pending.clear()
        for finished in self._goodbyes:
            finished.say_goodbye(send)
        self._goodbyes.clear()
        # Only images that received something or whose timer is due: an endpoint with many
        # images (the all-clients channel under a flood of forged SETUPs) must not cost
        # O(images) per datagram.
        deadlines = self._deadlines
        heap = self._deadline_heap
        due = self._touched
        if heap and heap[0][0] <= now:
            due = set(due)
            while heap and heap[0][0] <= now:
                deadline, key = heapq.heappop(heap)
                if deadlines.get(key) == deadline:
                    del deadlines[key]  # its entry is gone: whatever comes next is pushed
                    due.add(key)
        if due:
            self._touched = set()
            for key in due:
                image = self.images.get(key)
                if image is None:
                    deadlines.pop(key, None)
                    continue
                image.poll(now, send)
                if image.state is not ImageState.ACTIVE:
                    deadlines.pop(key, None)
                    self._drop_image(key, image, image.state, now)
                    continue
                deadline = image.next_deadline(now)
                if deadlines.get(key) != deadline:
                    deadlines[key] = deadline
                    heapq.heappush(heap, (deadline, key))
            if len(heap) > 2 * len(deadlines) + 64:
                # Mostly stale entries (deadlines that moved): rebuild from the live ones.
                heap[:] = [(deadline, key) for key, deadline in deadlines.items()]
                heapq.heapify(heap)
        if now >= self._next_cleanup:
            self._next_cleanup = now + 1.0
            if self._cooldown:
                self._cooldown = {k: t for k, t in self._cooldown.items() if t > now}
                self._finished = {k: i for k, i in self._finished.items() if k in self._cooldown}
            horizon = now - self.timers.setup_elicit_interval
            self._elicited = {k: t for k, t in self._elicited.items() if t > horizon}

    def _has_every_image(self) -> bool:
        """Does every stream subscribed to here have an image (a publication it hears)?"""
        if len(self.images) < len(self.interests):
            return False
        streams = {stream for _, stream in self.images}
        return all(stream in streams for stream in self.interests)

    def quiet(self) -> bool:
        """Did the datagrams since the last poll leave nothing to do before the next timer?

        (In-order data for an image: nothing to send, no image came or went.)
        """
        return not (self._touched or self._pending or self._goodbyes or self.events)

    def touch(self, session_id: int, stream_id: int) -> None:
        """The application consumed from this image: look at it on the next poll."""
        self._touched.add((session_id, stream_id))

    def next_deadline(self, now: float) -> float:
        if self._pending or self._touched or self._goodbyes:
            return now
        deadline = self._next_cleanup if (self._cooldown or self._elicited) else math.inf
        if self.control is not None and self.interests:
            deadline = min(deadline, self._next_registration)
        heap = self._deadline_heap
        deadlines = self._deadlines
        while heap and deadlines.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)  # stale
        if heap and heap[0][0] < deadline:
            deadline = heap[0][0]
        return deadline

    def close(self, send: Send) -> None:
        for key, image in list(self.images.items()):
            image.close(send)
            self._drop_image(key, image, ImageState.CLOSED, now=None)


def _enclosing(
    gaps: dict[tuple[int, int], float], gap: tuple[int, int]
) -> tuple[int, int] | None:
    """The gap of `gaps` that contains all of `gap`, if any (there are at most _MAX_GAPS)."""
    start, length = gap
    for key in gaps:
        if key[0] <= start and start + length <= key[0] + key[1]:
            return key
    return None


def _check_setup(frame: Setup, interest: StreamInterest) -> str | None:
    """Why a SETUP from the network cannot make an image, or None if it can."""
    try:
        check_term_length(frame.term_length)
    except ValueError:
        return "bad_setup_term_length"
    if frame.term_length > interest.max_term_length:
        return "setup_term_too_long"
    mtu = frame.mtu
    if (
        mtu <= DATA_HEADER_LENGTH
        or mtu % FRAME_ALIGNMENT
        or mtu > MAX_UDP_PAYLOAD_LENGTH
        or mtu > compute_max_message_length(frame.term_length)
    ):
        return "bad_setup_mtu"
    if (
        frame.term_offset < 0
        or frame.term_offset % FRAME_ALIGNMENT
        or frame.term_offset >= frame.term_length
    ):
        return "bad_setup_offset"
    if i32(frame.active_term_id - frame.initial_term_id) < 0:
        return "bad_setup_term_id"
    return None
