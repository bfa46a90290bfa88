"""The public surface of the transport (DESIGN.md §4).

    async with open_transport(TransportConfig()) as transport:
        pub = await transport.add_publication("aeron:udp?endpoint=127.0.0.1:9000", stream_id=1001)
        sub = await transport.add_subscription("aeron:udp?endpoint=127.0.0.1:9000", stream_id=1001)
        await pub.wait_connected(timeout=5)
        await pub.send(b"hello")
        message = await sub.receive()

These classes hold no protocol logic: they translate calls into the pure state machines that the
driver runs, and wait on the driver's notifications. Sockets stay in driver.py.
"""

from __future__ import annotations

import functools
import ipaddress
import math
import socket
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import NamedTuple

import attrs
import trio

from echo.transport.counters import Counters
from echo.transport.destinations import Address
from echo.transport.driver import Driver, SocketEndpoint, TransportConfig
from echo.transport.flow_control import make_flow_control
from echo.transport.logbuffer import check_term_length
from echo.transport.receiver import (
    Image as ImageState_,
)
from echo.transport.receiver import (
    ImageAvailable,
    ImageUnavailable,
    ReceiveEndpoint,
    StreamInterest,
)
from echo.transport.sender import (
    ADMIN_ACTION,
    BACK_PRESSURED,
    CLOSED,
    MAX_POSITION_EXCEEDED,
    NOT_CONNECTED,
    OFFER_RESULT_NAMES,
    SendEndpoint,
    SendMode,
)
from echo.transport.sender import (
    Publication as PublicationState_,
)
from echo.transport.uri import Address as UriAddress
from echo.transport.uri import ChannelUri, ControlMode, UriError, parse_channel_uri

__all__ = [
    "ADMIN_ACTION",
    "BACK_PRESSURED",
    "CLOSED",
    "MAX_POSITION_EXCEEDED",
    "NOT_CONNECTED",
    "Image",
    "Message",
    "Publication",
    "SendError",
    "Subscription",
    "Transport",
    "TransportConfig",
    "open_transport",
]


class SendError(Exception):
    """`Publication.send` gave up: `code` is Aeron's offer result (NOT_CONNECTED, ...)."""

    def __init__(self, code: int, message: str | None = None) -> None:
        self.code = code
        self.name = OFFER_RESULT_NAMES.get(code, str(code))
        super().__init__(message or f"could not send message: {self.name}")


# session id, stream id, source, source ip, source port: what follows `data` in a Message
_Origin = tuple[int, int, str, str, int]
# Message(data, *origin) without the named tuple's keyword handling: one per message delivered.
_new_message = tuple.__new__


def format_address(address: Address) -> str:
    host, port = address[0], address[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Message(NamedTuple):
    """One message from a subscription. Immutable.

    A named tuple rather than an attrs class: one is made per message delivered, and a tuple
    is made in a third of the time of a frozen attrs instance.
    """

    data: bytes
    session_id: int
    stream_id: int
    #: the image's source identity, "ip:port" (IPv6 in brackets)
    source: str
    source_ip: str
    source_port: int


class Image:
    """A publication as seen by a subscription (one session)."""

    def __init__(self, state: ImageState_, subscription: Subscription) -> None:
        self._state = state
        self.subscription = subscription
        self.session_id = state.session_id
        self.stream_id = state.stream_id
        address = state.control_address
        self.source_ip: str = address[0]
        self.source_port: int = address[1]
        self.source_address = format_address(address)
        #: the fields every Message from this image carries after its data
        self._origin: _Origin = (
            self.session_id,
            self.stream_id,
            self.source_address,
            self.source_ip,
            self.source_port,
        )
        self.join_position = state.join_position
        self.closed = False
        self.close_reason: str | None = None

    @property
    def position(self) -> int:
        return self._state.subscriber_position

    @property
    def is_end_of_stream(self) -> bool:
        return self._state.is_end_of_stream

    def reject(self) -> None:
        """Refuse this image: its session is told end-of-stream and ignored for a cool-down.

        Used by a server that accepts a session only from one address (Echo 2.0 duologues).
        """
        self.subscription._reject(self)

    def __repr__(self) -> str:
        return (
            f"<Image session={self.session_id} stream={self.stream_id} from {self.source_address}>"
        )


async def _resolve(address: UriAddress) -> tuple[int, tuple[str, int]]:  # family, sockaddr
    host = address.host
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        try:
            infos = await trio.socket.getaddrinfo(host, address.port, type=socket.SOCK_DGRAM)
        except OSError as error:
            raise UriError(f"cannot resolve host {host!r}: {error}") from None
        family, _, _, _, sockaddr = infos[0]
        return family, (str(sockaddr[0]), int(sockaddr[1]))
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    return family, (str(ip), address.port)


def _wildcard(family: int) -> tuple[str, int]:
    return ("::", 0) if family == socket.AF_INET6 else ("0.0.0.0", 0)


class _Waiters:
    """Wakes every task waiting for 'something changed' on an endpoint."""

    __slots__ = ("_lot",)

    def __init__(self) -> None:
        self._lot = trio.lowlevel.ParkingLot()

    def notify(self) -> None:
        if self._lot:
            self._lot.unpark_all()

    async def wait(self) -> None:
        await self._lot.park()


class Publication:
    def __init__(
        self, transport: Transport, state: PublicationState_, sep: SocketEndpoint, channel: str
    ) -> None:
        self._transport = transport
        self._state = state
        self._sep = sep
        self._waiters = _Waiters()
        self.channel = channel
        self.session_id = state.session_id
        self.stream_id = state.stream_id
        self.max_message_length = state.max_message_length
        self.max_payload_length = state.max_payload
        self.term_length = state.term_length
        self.mtu = state.mtu

    @property
    def position(self) -> int:
        return self._state.position

    @property
    def is_connected(self) -> bool:
        return self._state.is_connected(trio.current_time())

    @property
    def is_closed(self) -> bool:
        return self._state.state.value != "active"

    def offer(self, data: bytes | bytearray | memoryview, *, flush: bool = True) -> int:
        """Append a message without waiting: the new position (> 0) or a negative code.

        NOT_CONNECTED -1, BACK_PRESSURED -2, ADMIN_ACTION -3 (term rotated: offer again),
        CLOSED -4, MAX_POSITION_EXCEEDED -5. A message longer than `max_message_length`
        raises ValueError. `flush=False` leaves the message for the driver's next pass, so
        that several offers made together go out in as few datagrams as fit.
        """
        driver = self._transport._driver
        now = driver.now()
        result = self._state.offer(data, now)
        if result > 0:
            if flush:
                driver.flush(self._sep, self._state, now)
            else:
                # The caller has more to offer right away: let them share datagrams.
                driver.wake(self._sep)
        return result

    async def send(self, data: bytes | bytearray | memoryview, timeout: float = 0.5) -> int:
        """Offer until accepted or `timeout` passes; raises SendError(code) on give-up."""
        result = self.offer(data)
        if result > 0:
            return result
        deadline = trio.current_time() + timeout
        while result <= 0:
            if result != ADMIN_ACTION:  # a term rotated: offer again at once
                if result in (CLOSED, MAX_POSITION_EXCEEDED):
                    raise SendError(result)
                if trio.current_time() >= deadline:
                    raise SendError(result)
                with trio.move_on_at(deadline):
                    await self._waiters.wait()
            result = self.offer(data)
        return result

    async def wait_connected(self, timeout: float | None = None) -> None:
        """Wait until a receiver has answered (and flow control has its group)."""
        deadline = math.inf if timeout is None else trio.current_time() + timeout
        while not self.is_connected:
            if self.is_closed:
                raise trio.ClosedResourceError("publication is closed")
            if trio.current_time() >= deadline:
                raise TimeoutError(
                    f"publication {self.channel} stream {self.stream_id} not connected "
                    f"after {timeout} s"
                )
            with trio.move_on_at(deadline):
                await self._waiters.wait()

    async def wait_disconnected(self) -> None:
        """Wait until no receiver is left (timeout without SMs, end-of-stream, or closed)."""
        # The driver services the endpoint when the oldest receiver's timeout falls due, and
        # every service wakes these waiters: no polling.
        while self.is_connected:
            await self._waiters.wait()

    def add_destination(self, uri: str) -> None:
        """Manual MDC: send to `aeron:udp?endpoint=host:port` too (an IP literal)."""
        manual = self._sep.endpoint.manual if isinstance(self._sep.endpoint, SendEndpoint) else None
        if manual is None:
            raise UriError(f"{self.channel}: add_destination needs control-mode=manual")
        manual.add(_destination_address(uri))
        self._state.trigger_setup()
        self._transport._driver.wake(self._sep)

    def remove_destination(self, uri: str) -> None:
        manual = self._sep.endpoint.manual if isinstance(self._sep.endpoint, SendEndpoint) else None
        if manual is None:
            raise UriError(f"{self.channel}: remove_destination needs control-mode=manual")
        manual.remove(_destination_address(uri))

    @property
    def destinations(self) -> list[str]:
        endpoint = self._sep.endpoint
        assert isinstance(endpoint, SendEndpoint)
        return [format_address(a) for a in endpoint.destinations]

    def has_destination_host(self, host: str) -> bool:
        """Is some (validated) MDC destination of this publication at IP address `host`?"""
        endpoint = self._sep.endpoint
        assert isinstance(endpoint, SendEndpoint)
        return any(address[0] == host for address in endpoint.destinations)

    @property
    def local_address(self) -> str:
        return format_address(self._sep.local_address)

    async def close(self, timeout: float | None = None) -> bool:
        """Drain, announce end-of-stream and linger; True if every receiver got everything."""
        state = self._state
        state.close(trio.current_time())
        self._transport._driver.wake(self._sep)
        limit = state.timers.linger + 1.0 if timeout is None else timeout
        delivered = False
        with trio.move_on_after(limit):
            while not state.is_done:
                delivered = delivered or state.delivered
                await self._waiters.wait()
        delivered = delivered or state.delivered
        if state.is_lingering:
            # Out of time while waiting for the receivers' proof, everything sent: still say
            # where the stream ends, or the receivers learn it only from their timeouts.
            sender = self._sep.endpoint
            assert isinstance(sender, SendEndpoint)
            state.announce_end(functools.partial(sender.emit_to_all, send=self._sep.send))
        state.abort()
        self._transport._release_publication(self)
        return delivered

    def _notify(self) -> None:
        self._waiters.notify()


def _refuse_response_channels(uri: ChannelUri) -> None:
    # The URI and the frames (RSP_SETUP, SETUP_SEND_RESPONSE_FLAG) are Aeron 1.48's; the
    # matching of responses to requests is not built yet, and a channel that half works
    # would look connected to a peer that waits for its RSP_SETUP.
    if uri.is_response or uri.response_correlation_id is not None:
        raise UriError(
            f"{uri.build()}: response channels (control-mode=response,"
            " response-correlation-id) are not supported by this transport yet"
        )


def _destination_address(uri: str) -> tuple[str, int]:
    parsed = parse_channel_uri(uri)
    if parsed.endpoint is None:
        raise UriError(f"{uri}: a destination needs endpoint=host:port")
    try:
        ip = ipaddress.ip_address(parsed.endpoint.host)
    except ValueError:
        raise UriError(f"{uri}: destination host must be an IP address") from None
    return (str(ip), parsed.endpoint.port)


class Subscription:
    def __init__(
        self,
        transport: Transport,
        sep: SocketEndpoint,
        channel: str,
        stream_id: int,
        on_image_available: Callable[[Image], None] | None,
        on_image_unavailable: Callable[[Image], None] | None,
    ) -> None:
        self._transport = transport
        self._sep = sep
        self._waiters = _Waiters()
        self._images: list[Image] = []
        self._by_state: dict[int, Image] = {}
        self._queue: deque[Message] = deque()
        self._round_robin = 0
        self._closed = False
        self.channel = channel
        self.stream_id = stream_id
        self.on_image_available = on_image_available
        self.on_image_unavailable = on_image_unavailable

    @property
    def images(self) -> list[Image]:
        return list(self._images)

    @property
    def is_connected(self) -> bool:
        return bool(self._images)

    @property
    def local_address(self) -> str:
        return format_address(self._sep.local_address)

    def _on_image_event(self, event: ImageAvailable | ImageUnavailable) -> None:
        if isinstance(event, ImageAvailable):
            image = Image(event.image, self)
            self._images.append(image)
            self._by_state[id(event.image)] = image
            if self.on_image_available is not None:
                self.on_image_available(image)
        else:
            found = self._by_state.pop(id(event.image), None)
            if found is None:
                return
            self._images.remove(found)
            found.closed = True
            found.close_reason = event.reason.value
            if self.on_image_unavailable is not None:
                self.on_image_unavailable(found)
        self._waiters.notify()

    def _reject(self, image: Image) -> None:
        endpoint = self._sep.endpoint
        assert isinstance(endpoint, ReceiveEndpoint)
        driver = self._transport._driver
        endpoint.reject_image(
            image.session_id, image.stream_id, trio.current_time(), self._sep.send
        )
        # Not serviced inline: this may run inside an image callback, i.e. inside the driver.
        driver.wake(self._sep)

    def poll(self, handler: Callable[[Message], object], fragment_limit: int = 10) -> int:
        """Deliver up to `fragment_limit` fragments' worth of messages; never blocks."""
        sep = self._sep
        if sep.lent:
            self._transport._driver.drain_if_stale(sep)
        images = self._images
        count = len(images)
        if not count:
            return 0
        fragments = 0
        due: list[Image] = []
        start = self._round_robin % count
        self._round_robin += 1
        for i in range(count):
            image = images[(start + i) % count]
            state = image._state
            if state.rebuild_position <= state.subscriber_position:
                continue  # nothing new: skip making the delivery function

            def deliver(data: bytes, origin: _Origin = image._origin) -> None:
                handler(_new_message(Message, (data, *origin)))

            fragments += state.poll_messages(deliver, fragment_limit - fragments)
            if state.status_message_due():
                due.append(image)
            if fragments >= fragment_limit:
                break
        if due:
            # Consumption crossed the window/4 threshold (or freed a sender waiting at the
            # window's edge): send the SM now, not after a pass of the timer loop; the sender
            # may be idle until it comes.
            endpoint = sep.endpoint
            assert isinstance(endpoint, ReceiveEndpoint)
            for image in due:
                endpoint.touch(image.session_id, image.stream_id)
            driver = self._transport._driver
            driver.service(sep, driver.now())
        return fragments

    async def wait_activity(self) -> None:
        """Wait until a message may be ready or an image came or went (then `poll`)."""
        await self._wait()
        if self._sep.activity_waiters:
            self._transport._driver.stop_waiting(self._sep)

    async def _wait(self) -> None:
        """Wait until the endpoint has been serviced: on its socket, in this task, if the driver
        lends it (one task switch per datagram fewer), else until the reader task says so."""
        sep = self._sep
        if await self._transport._driver.read_as_application(sep):
            return
        sep.activity_waiters += 1
        try:
            await self._waiters.wait()
        finally:
            sep.activity_waiters -= 1

    async def receive(self) -> Message:
        """Wait for the next message from any image."""
        queue = self._queue
        while not queue:
            if not self.poll(queue.append, fragment_limit=64):
                if self._closed or self._sep.closed:
                    raise trio.EndOfChannel("subscription is closed")
                await self._wait()
        if self._sep.activity_waiters:
            self._transport._driver.stop_waiting(self._sep)
        return queue.popleft()

    def __aiter__(self) -> AsyncIterator[Message]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Message]:
        while True:
            try:
                yield await self.receive()
            except trio.EndOfChannel:
                return

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._transport._driver.wake_borrower(self._sep)
        self._transport._release_subscription(self)
        self._waiters.notify()

    def _notify(self) -> None:
        self._waiters.notify()


class Transport:
    """Publications and subscriptions over UDP, run by one driver (see `open_transport`)."""

    def __init__(self, config: TransportConfig, nursery: trio.Nursery) -> None:
        self.config = config
        self._driver = Driver(config, nursery)
        self._publications: dict[SocketEndpoint, list[Publication]] = {}
        self._subscriptions: dict[SocketEndpoint, dict[int, Subscription]] = {}
        self._closed = False

    @property
    def counters(self) -> Counters:
        return self._driver.counters

    def _check_open(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("transport is closed")

    def _session_taken(self, session_id: int) -> bool:
        return any(
            pub.session_id == session_id for pubs in self._publications.values() for pub in pubs
        )

    async def add_publication(self, channel: str, stream_id: int) -> Publication:
        self._check_open()
        uri = parse_channel_uri(channel)
        uri.check_publication()
        _refuse_response_channels(uri)
        config = self.config
        driver = self._driver
        multi = uri.control_mode is not None
        flow_control = make_flow_control(uri.fc, multi_destination=multi)
        term_length = uri.term_length or config.term_length
        check_term_length(term_length)
        mtu = uri.mtu or config.mtu

        if uri.control_mode is ControlMode.DYNAMIC:
            assert uri.control is not None
            family, bind = await _resolve(uri.control)
            key: object = ("pub-mdc", bind)
            mode = SendMode.DYNAMIC
            remote = None
        elif uri.control_mode is ControlMode.MANUAL:
            if uri.control is not None:
                family, bind = await _resolve(uri.control)
                key = ("pub-mdc", bind)
            else:
                family, bind = socket.AF_INET, ("0.0.0.0", 0)
                key = ("pub-manual", object())
            mode = SendMode.MANUAL
            remote = None
        else:
            assert uri.endpoint is not None
            family, remote = await _resolve(uri.endpoint)
            bind = _wildcard(family)
            key = ("pub", remote)
            mode = SendMode.UNICAST

        sep = driver.endpoints.get(key)
        if sep is None or not isinstance(sep.endpoint, SendEndpoint):
            sock = await driver.open_socket(bind, family)
            new_sender = SendEndpoint(
                mode=mode,
                counters=driver.counters,
                remote=remote,
                destination_timeout=config.destination_timeout,
                max_destinations=config.max_destinations,
                cookies=driver.cookies,
                limiter=driver.limiter,
            )
            sep = SocketEndpoint(sock, new_sender, key)
            driver.register(sep)
            self._publications[sep] = []
        endpoint = sep.endpoint
        assert isinstance(endpoint, SendEndpoint)

        if uri.session_id is not None:
            session_id = uri.session_id
            if self._session_taken(session_id):
                raise UriError(
                    f"{channel}: existing publication has clashing session-id {session_id}"
                )
        else:
            session_id = driver.next_session_id(self._session_taken)
        initial_term_id = (
            uri.init_term_id if uri.init_term_id is not None else driver.initial_term_id()
        )
        state = PublicationState_(
            session_id=session_id,
            stream_id=stream_id,
            initial_term_id=initial_term_id,
            term_length=term_length,
            mtu=mtu,
            flow_control=flow_control,
            counters=driver.counters,
            now=trio.current_time(),
            is_group=multi,
            timers=config.sender_timers(),
            max_retransmits=config.max_retransmits,
            ttl=0,
        )
        if uri.linger is not None:
            state.timers = attrs.evolve(state.timers, linger=uri.linger)
        endpoint.add(state)
        publication = Publication(self, state, sep, channel)
        self._publications[sep].append(publication)
        sep.listeners.append(publication._notify)
        driver.wake(sep)
        return publication

    async def add_subscription(
        self,
        channel: str,
        stream_id: int,
        *,
        on_image_available: Callable[[Image], None] | None = None,
        on_image_unavailable: Callable[[Image], None] | None = None,
    ) -> Subscription:
        self._check_open()
        uri = parse_channel_uri(channel)
        uri.check_subscription()
        _refuse_response_channels(uri)
        config = self.config
        driver = self._driver
        control: tuple[str, int] | None = None
        family: int = socket.AF_INET
        if uri.control is not None:
            family, control = await _resolve(uri.control)
        if uri.endpoint is not None:
            family, bind = await _resolve(uri.endpoint)
            key: object = ("sub", bind, control)
        else:
            bind = _wildcard(family)
            key = ("sub", object(), control)

        sep = driver.endpoints.get(key)
        if sep is None or not isinstance(sep.endpoint, ReceiveEndpoint):
            sock = await driver.open_socket(bind, family)
            new_receiver = ReceiveEndpoint(
                counters=driver.counters,
                receiver_id=driver.next_receiver_id(),
                now=trio.current_time(),
                control=control,
                group_tag=uri.gtag,
                timers=config.receiver_timers(uri.nak_delay),
                rng=driver.rng,
                limit_amplification=config.validate_addresses,
                max_images=config.max_images,
                limiter=driver.limiter,
            )
            sep = SocketEndpoint(sock, new_receiver, key)
            self._subscriptions[sep] = {}
            sep.on_image_event = functools.partial(self._dispatch_image_event, sep)
            sep.listeners.append(functools.partial(self._notify_subscriptions, sep))
            driver.register(sep)
        endpoint = sep.endpoint
        assert isinstance(endpoint, ReceiveEndpoint)
        interest = StreamInterest(
            stream_id=stream_id,
            session_id=uri.session_id,
            reliable=uri.reliable,
            rcv_wnd=uri.rcv_wnd or config.rcv_wnd,
            group_tag=uri.gtag,
            max_term_length=config.max_receiver_term_length,
        )
        endpoint.add_interest(interest, trio.current_time())
        subscription = Subscription(
            self, sep, channel, stream_id, on_image_available, on_image_unavailable
        )
        self._subscriptions[sep][stream_id] = subscription
        driver.wake(sep)
        return subscription

    def _dispatch_image_event(
        self, sep: SocketEndpoint, event: ImageAvailable | ImageUnavailable
    ) -> None:
        subscription = self._subscriptions.get(sep, {}).get(event.image.stream_id)
        if subscription is not None:
            subscription._on_image_event(event)

    def _notify_subscriptions(self, sep: SocketEndpoint) -> None:
        for subscription in self._subscriptions.get(sep, {}).values():
            subscription._notify()

    def _release_publication(self, publication: Publication) -> None:
        sep = publication._sep
        endpoint = sep.endpoint
        assert isinstance(endpoint, SendEndpoint)
        endpoint.remove(publication._state)
        pubs = self._publications.get(sep, [])
        if publication in pubs:
            pubs.remove(publication)
        if publication._notify in sep.listeners:
            sep.listeners.remove(publication._notify)
        if not pubs:
            self._publications.pop(sep, None)
            self._driver.unregister(sep)

    def _release_subscription(self, subscription: Subscription) -> None:
        sep = subscription._sep
        endpoint = sep.endpoint
        assert isinstance(endpoint, ReceiveEndpoint)
        endpoint.remove_interest(subscription.stream_id, sep.send)
        self._driver.service(sep, trio.current_time())
        subs = self._subscriptions.get(sep, {})
        subs.pop(subscription.stream_id, None)
        if not subs:
            self._subscriptions.pop(sep, None)
            self._driver.unregister(sep)

    async def aclose(self) -> None:
        """Close everything at once, telling peers: EOS heartbeats and EOS status messages."""
        if self._closed:
            return
        self._closed = True
        for sep, pubs in list(self._publications.items()):
            for publication in pubs:
                sender = sep.endpoint
                assert isinstance(sender, SendEndpoint)
                publication._state.announce_end(
                    functools.partial(sender.emit_to_all, send=sep.send)
                )
        for sep in list(self._subscriptions):
            endpoint = sep.endpoint
            assert isinstance(endpoint, ReceiveEndpoint)
            endpoint.close(sep.send)
        self._driver.close()


@asynccontextmanager
async def open_transport(config: TransportConfig | None = None) -> AsyncIterator[Transport]:
    """Run a transport for the duration of the block; everything is closed on exit."""
    async with trio.open_nursery() as nursery:
        transport = Transport(config or TransportConfig(), nursery)
        nursery.start_soon(transport._driver.timer_loop)
        try:
            yield transport
        finally:
            await transport.aclose()
            nursery.cancel_scope.cancel()
