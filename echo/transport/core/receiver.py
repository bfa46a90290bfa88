"""The receive side of a socket: Aeron's receive channel endpoint plus its data packet
dispatcher: one socket's worth of subscriptions (stream interests), images (image.py), setup
elicitation and, for a multi-destination subscription, the setup-eliciting SMs that register it
with the publisher. Pure: `now` is passed in, output goes through an injected `send`.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Sequence

import attrs

from echo.transport.core.config import DEFAULT_RECEIVER_WINDOW, DEFAULTS, ReceiverTimers
from echo.transport.core.counters import Counters
from echo.transport.core.destinations import Address
from echo.transport.core.frames import (
    EOS_FLAG,
    SETUP_GROUP_FLAG,
    SETUP_SEND_RESPONSE_FLAG,
    SM_LENGTH,
    SM_SETUP_FLAG,
    FrameError,
    FrameType,
    Setup,
    StatusMessage,
    parse_data_run_untrusted,
    parse_data_untrusted,
    parse_datagram_untrusted,
)
from echo.transport.core.image import (
    AMPLIFICATION_FACTOR,
    Deliver,
    ImageState,
    PublicationImage,
    Send,
)
from echo.transport.core.outbox import NOTHING, Datagram, Outbox
from echo.transport.core.validation import SM_COOKIE_FLAG, RateLimiter, setup_problem

#: the endpoint forgets cool-downs and elicitation times this often
_CLEANUP_INTERVAL = 1.0
#: the deadline heap is rebuilt when stale entries outnumber live ones by 2:1 plus this slack
_HEAP_SLACK = 64

__all__ = [
    "DEFAULT_RECEIVER_WINDOW",
    "Deliver",
    "ImageAvailable",
    "ImageEvent",
    "ImageState",
    "ImageUnavailable",
    "PublicationImage",
    "ReceiveEndpoint",
    "ReceiverTimers",
    "Send",
    "StreamInterest",
]


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
    image: PublicationImage


@attrs.frozen
class ImageUnavailable:
    image: PublicationImage
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
        max_images: int = DEFAULTS.max_images,
        limiter: RateLimiter | None = None,
        response: bool = False,
    ) -> None:
        self.counters = counters
        #: a response subscription's endpoint (control-mode=response): its streams wait for
        #: the publisher's RSP_SETUP before they elicit a SETUP (response.py)
        self.response = response
        self.response_pending: dict[int, StreamInterest] = {}
        self.limiter = limiter or RateLimiter()
        self.receiver_id = receiver_id
        self.limit_amplification = limit_amplification
        self._cookie = (0, 0)
        self.control = control
        self.group_tag = group_tag
        self.timers = timers or ReceiverTimers()
        self.rng = rng or random.Random()
        #: by (stream id, session id or None): Aeron's session-specific subscriptions share a
        #: channel with one another and with an all-sessions subscription of the stream
        self.interests: dict[tuple[int, int | None], StreamInterest] = {}
        self._streams: dict[int, int] = {}
        self.images: dict[tuple[int, int], PublicationImage] = {}
        #: images that came or went, oldest first, until the driver takes them (next_event)
        self._events: list[ImageEvent] = []
        #: are there events to take? (read by the driver after each service, without a call)
        self.has_events = False
        #: what handle_timer decided to send, until datagrams_to_send takes it
        self._outbox = Outbox()
        self._queue: Send = self._outbox.send
        self._cooldown: dict[tuple[int, int], float] = {}
        self._elicited: dict[tuple[int, int], float] = {}
        self._pending: list[tuple[tuple[int, int], Address]] = []
        self._next_registration = now
        #: the last registration found every stream with its image: none is due until an
        #: interest or a cookie comes, or an image goes (see _register)
        self._registered = False
        # Each image's next deadline, and a heap of (deadline, key) with stale entries left
        # in place (an entry counts only while it matches `_deadlines`): the endpoint's next
        # deadline and the images due are found in O(log images), not by looking at all of them.
        self._deadlines: dict[tuple[int, int], float] = {}
        self._deadline_heap: list[tuple[float, tuple[int, int]]] = []
        self._finished: dict[tuple[int, int], PublicationImage] = {}
        self._goodbyes: list[PublicationImage] = []
        self._touched: set[tuple[int, int]] = set()
        #: images that received data since the socket's subscriptions were last told
        #: (sockets.ReceiveSocket.notify_subscriptions wakes only theirs). Heartbeats are not
        #: news for the application (nothing to poll), so they do not count: an idle stream's
        #: heartbeats wake no subscriber (docs/profile-b4.txt).
        self.fresh: set[tuple[int, int]] = set()
        #: something read since the last poll may need one; an idle stream's heartbeat, which
        #: only moves its image's liveness on, does not (docs/transport.md, "The idle
        #: cadence"): the driver skips the service after it
        self.news = False
        #: data datagrams handed to images, ever: a task that read the socket itself
        #: (channels.SubscriptionChannel.wait) compares it to know whether anything came
        self.data_received = 0
        self._next_cleanup = now
        self.max_images = max_images

    # ---------------------------------------------------------------- subscriptions

    def add_interest(self, interest: StreamInterest, now: float) -> None:
        stream_id = interest.stream_id
        key = (stream_id, interest.session_id)
        if key in self.interests or stream_id in self.response_pending:
            raise ValueError(f"stream {stream_id} already has a subscription on this channel")
        if self.response:
            # DriverConductor: a response subscription joins the receiver only once the
            # request publication's RSP_SETUP arrives (on_response_setup).
            self.response_pending[stream_id] = interest
            return
        self._arm(interest, now)

    def _arm(self, interest: StreamInterest, now: float) -> None:
        stream_id = interest.stream_id
        self.interests[(stream_id, interest.session_id)] = interest
        self._streams[stream_id] = self._streams.get(stream_id, 0) + 1
        # Register with a multi-destination publisher at once rather than at the next tick.
        self._next_registration = now
        self._registered = False

    def on_response_setup(self, stream_id: int, session_id: int, now: float) -> None:
        """The request publication heard RSP_SETUP: the response stream is `session_id`.

        A pending interest takes that session (DriverConductor.responseSetup); one that has
        it already elicits a SETUP again (Receiver.onRequestSetup)."""
        pending = self.response_pending.pop(stream_id, None)
        if pending is not None:
            if pending.session_id is None:
                pending = attrs.evolve(pending, session_id=session_id)
            self._arm(pending, now)
        elif any(stream == stream_id for stream, _ in self.interests):
            self._next_registration = now
            self._registered = False

    def remove_interest(self, stream_id: int, send: Send, session_id: int | None = None) -> None:
        self.response_pending.pop(stream_id, None)
        # A response subscription's interest took its session from RSP_SETUP.
        keys = [k for k in self.interests if k[0] == stream_id] if self.response else []
        for key in keys or [(stream_id, session_id)]:
            if self.interests.pop(key, None) is None:
                continue
            left = self._streams[stream_id] - 1
            if left:
                self._streams[stream_id] = left
            else:
                del self._streams[stream_id]
        for key, image in list(self.images.items()):
            if key[1] != stream_id or (stream_id, key[0]) in self.interests:
                continue  # another stream, or a session-specific subscription's image
            if session_id is not None and key[0] != session_id:
                continue
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
        news = self.news
        self.news = True
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
                image.budget += AMPLIFICATION_FACTOR * len(data)  # image.credit, inlined
                starved = image.starved
                image.starved = False
                if not heartbeat:
                    self.fresh.add(key)
                    self.data_received += 1
                if image.on_data(heartbeat, flags, term_offset, term_id, data, now) or starved:
                    self._touched.add(key)
                elif heartbeat:
                    self.news = news  # only the image's liveness moved on
                return
            finished = self._finished.get(key)
            if finished is not None:
                if heartbeat and flags & EOS_FLAG:
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
            self._registered = False
        else:
            # SMs and NAKs belong on a publication's socket; RTTM replies are not used here.
            self.counters.invalid("unexpected_on_receive_channel")

    def on_datagram_run(
        self, data: bytes | memoryview, segment: int, source: Address, now: float
    ) -> int:
        """Datagrams of `segment` bytes read together (UDP GRO), untrusted: handled as one if
        they continue one another on an image we have; returns how many, 0 if not handled
        (the caller then hands them to `on_datagram` one by one)."""
        self.news = True
        fields = parse_data_run_untrusted(data, segment)
        if fields is None:
            return 0
        _, flags, _, term_offset, session_id, stream_id, term_id, _ = fields
        key = (session_id, stream_id)
        image = self.images.get(key)
        if image is None:
            return 0
        image.budget += AMPLIFICATION_FACTOR * len(data)  # image.credit, inlined
        starved = image.starved
        image.starved = False
        self.fresh.add(key)
        self.data_received += 1
        if image.on_data(False, flags, term_offset, term_id, data, now, whole_data=True) or starved:
            self._touched.add(key)
        return -(-len(data) // segment)

    def _wanted(self, session_id: int, stream_id: int) -> StreamInterest | None:
        interests = self.interests
        interest = interests.get((stream_id, session_id)) or interests.get((stream_id, None))
        if interest is None:
            if stream_id in self._streams:
                # A session filter is silent: the other session learns nothing (as in Aeron).
                self.counters.session_filter_drops += 1
            else:
                self.counters.unknown_session_drops += 1
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
        problem = setup_problem(frame, interest.max_term_length)
        if problem is None and len(self.images) >= self.max_images:
            problem = "too_many_images"

        if problem is not None:
            counters.invalid(problem)
            return
        image = PublicationImage(
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
        image.requested_response = bool(frame.flags & SETUP_SEND_RESPONSE_FLAG)
        self.images[key] = image
        self._touched.add(key)
        self._elicited.pop(key, None)
        counters.images_created += 1
        self._events.append(ImageAvailable(image))
        self.has_events = True

    def _drop_image(
        self, key: tuple[int, int], image: PublicationImage, reason: ImageState, now: float | None
    ) -> None:
        self._deadlines.pop(key, None)
        if self.images.pop(key, None) is None:
            return
        self.counters.images_closed += 1
        self._registered = False  # (a stream without its image: register again)
        if now is not None:
            # Stragglers of a finished session must not elicit a SETUP and resurrect it.
            self._cooldown[key] = now + self.timers.cooldown
            if reason is ImageState.END_OF_STREAM:
                # Kept to answer the publisher's end-of-stream heartbeats while it lingers, in
                # case our goodbye (an EOS status message) was lost: Aeron's image LINGER state.
                # That needs no terms: their memory goes back now, not after the cooldown.
                image.release_terms()
                self._finished[key] = image
        self._events.append(ImageUnavailable(image, reason))
        self.has_events = True

    # ---------------------------------------------------------------- output and timers

    def handle_timer(self, now: float) -> None:
        """Act on what is due at `now` (the timers, and what the datagrams and the
        application's consumption since left to do); what that sends waits for
        `datagrams_to_send`."""
        self.poll(now, self._queue)

    def datagrams_to_send(self, now: float) -> Sequence[Datagram]:
        """Everything to send as of `now`, oldest first: what `handle_timer` queued, and what
        is due at `now` (as `handle_timer(now)`). The driver writes them to its socket."""
        outbox = self._outbox
        self.poll(now, self._queue)
        if not outbox.queued:
            return NOTHING
        return outbox.take()

    def poll(self, now: float, send: Send) -> None:
        self.news = False
        if (
            self.control is not None
            and self.interests
            and not self._registered
            and now >= self._next_registration
        ):
            self._register(now, send)
        if self._pending:
            self._elicit_setups(send)
        for finished in self._goodbyes:
            finished.say_goodbye(send)
        self._goodbyes.clear()
        self._poll_images(now, send)
        if now >= self._next_cleanup:
            self._clean_up(now)

    def _elicitation(self, session_id: int, stream_id: int, cookie: tuple[int, int]) -> bytes:
        """A setup-eliciting SM (SETUP flag, window 0); session 0, stream 0 registers with an
        MDC publisher (Aeron's dynamic MDC)."""
        return StatusMessage(
            session_id=session_id,
            stream_id=stream_id,
            consumption_term_id=cookie[0],
            consumption_term_offset=cookie[1],
            receiver_window=0,
            receiver_id=self.receiver_id,
            group_tag=self.group_tag,
            flags=SM_SETUP_FLAG,
        ).encode()

    def _register(self, now: float, send: Send) -> None:
        """Register (and stay registered) as a destination of the MDC publisher.

        It goes from this data socket, so the publisher learns the NAT mapping that leads back
        here. Not once every stream has its image: the images' own SMs, from this socket and
        receiver id, keep us a destination, and a registration would be one more datagram a
        second for nothing. Nor a wake-up a second to find that out: once every stream has its
        image, registrations are not due (`_registered`) until an image goes, an interest
        comes or the publisher sends a cookie.
        """
        assert self.control is not None
        self._next_registration = now + self.timers.mdc_registration_interval
        if self.response:
            # A response publication answers only an SM naming its own session and stream
            # (SendChannelEndpoint: no MDC registration on a response channel); it sends to
            # that SM's source, which is this socket's NAT mapping.
            complete = True
            for stream_id, session_id in self.interests:
                if session_id is not None and (session_id, stream_id) not in self.images:
                    complete = False
                    sent = send(self._elicitation(session_id, stream_id, (0, 0)), self.control)
                    if sent > 0:
                        self.counters.setup_elicitations_sent += sent
            self._registered = complete
        elif not self._has_every_image():
            sent = send(self._elicitation(0, 0, self._cookie), self.control)
            if sent > 0:
                self.counters.setup_elicitations_sent += sent
        else:
            self._registered = True

    def _elicit_setups(self, send: Send) -> None:
        """Ask the sources of data without an image for their SETUP."""
        counters = self.counters
        for (session_id, stream_id), source in self._pending:
            sent = send(self._elicitation(session_id, stream_id, (0, 0)), source)
            if sent > 0:
                counters.setup_elicitations_sent += sent
        self._pending.clear()

    def _poll_images(self, now: float, send: Send) -> None:
        """Poll the images that received something or whose timer is due: an endpoint with
        many images (the all-clients channel under a flood of forged SETUPs) must not cost
        O(images) per datagram."""
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
        if not due:
            return
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
        if len(heap) > 2 * len(deadlines) + _HEAP_SLACK:
            # Mostly stale entries (deadlines that moved): rebuild from the live ones.
            heap[:] = [(deadline, key) for key, deadline in deadlines.items()]
            heapq.heapify(heap)

    def _clean_up(self, now: float) -> None:
        self._next_cleanup = now + _CLEANUP_INTERVAL
        if self._cooldown:
            self._cooldown = {k: t for k, t in self._cooldown.items() if t > now}
            self._finished = {k: i for k, i in self._finished.items() if k in self._cooldown}
        if self._elicited:
            horizon = now - self.timers.setup_elicit_interval
            self._elicited = {k: t for k, t in self._elicited.items() if t > horizon}

    def _has_every_image(self) -> bool:
        """Does every stream subscribed to here have an image (a publication it hears)?"""
        if len(self.images) < len(self.interests):
            return False
        streams = {stream for _, stream in self.images}
        return all(
            stream in streams if session is None else (session, stream) in self.images
            for stream, session in self.interests
        )

    def quiet(self) -> bool:
        """Did the datagrams since the last poll leave nothing to do before the next timer?

        (In-order data for an image: nothing to send, no image came or went.)
        """
        return not (self._touched or self._pending or self._goodbyes or self._events)

    def next_event(self) -> ImageEvent | None:
        """The oldest image event not yet taken (an image came or went), or None: the core
        answers, the driver asks (aioquic's `QuicConnection.next_event`)."""
        events = self._events
        if not events:
            return None
        event = events.pop(0)
        self.has_events = bool(events)
        return event

    def take_events(self) -> list[ImageEvent]:
        """Every image event not yet taken, oldest first (`next_event` until None, at once:
        what the driver does after each service)."""
        events = self._events
        if events:
            self._events = []
            self.has_events = False
        return events

    def touch(self, session_id: int, stream_id: int) -> None:
        """The application consumed from this image: look at it on the next poll."""
        self._touched.add((session_id, stream_id))

    def next_deadline(self, now: float) -> float:
        if self._pending or self._touched or self._goodbyes:
            return now
        deadline = self._next_cleanup if (self._cooldown or self._elicited) else math.inf
        if self.control is not None and self.interests and not self._registered:
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
