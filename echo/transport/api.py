"""The public surface of the transport (docs/architecture.md, Public names).

    async with open_transport(TransportConfig()) as transport:
        pub = await transport.add_publication("aeron:udp?endpoint=127.0.0.1:9000", stream_id=1001)
        sub = await transport.add_subscription("aeron:udp?endpoint=127.0.0.1:9000", stream_id=1001)
        await pub.wait_connected(timeout=5)
        await pub.send(b"hello")
        message = await sub.receive()

These classes hold no protocol logic: they translate calls into the pure state machines that the
driver runs, and wait on the driver's notifications. Sockets stay in the driver (driver/loop.py).
"""

from __future__ import annotations

import functools
import ipaddress
import math
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager

import trio

from echo.transport.core.config import TransportConfig
from echo.transport.core.counters import Counters
from echo.transport.core.message import Message, format_address
from echo.transport.core.sender import (
    ADMIN_ACTION,
    BACK_PRESSURED,
    CLOSED,
    MAX_POSITION_EXCEEDED,
    NOT_CONNECTED,
    OFFER_RESULT_NAMES,
)
from echo.transport.core.uri import UriError, parse_channel_uri
from echo.transport.driver.channels import ImageLink, PublicationChannel, SubscriptionChannel
from echo.transport.driver.loop import Driver
from echo.transport.driver.sockets import SocketFactory, open_udp_socket

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
    "format_address",
    "open_transport",
]

#: fragments one `receive` polls into its queue at once (the rest wait for the next call)
_RECEIVE_BATCH = 64


class SendError(Exception):
    """`Publication.send` gave up: `code` is Aeron's offer result (NOT_CONNECTED, ...)."""

    def __init__(self, code: int, message: str | None = None) -> None:
        self.code = code
        self.name = OFFER_RESULT_NAMES.get(code, str(code))
        super().__init__(message or f"could not send message: {self.name}")


class Image:
    """A publication as seen by a subscription (one session)."""

    def __init__(self, link: ImageLink, subscription: Subscription) -> None:
        self._link = link
        self.subscription = subscription
        self.session_id = link.session_id
        self.stream_id = link.stream_id
        self.source_ip: str = link.source_ip
        self.source_port: int = link.source_port
        self.source_address = link.source_address
        self.join_position = link.join_position
        #: what a response publication names (response-correlation-id) to answer this image
        self.correlation_id = link.correlation_id
        #: its publisher asked for a response channel (SETUP flag 0x80, Aeron 1.48)
        self.requested_response = link.requested_response
        self.closed = False
        self.close_reason: str | None = None

    @property
    def position(self) -> int:
        return self._link.position

    @property
    def is_end_of_stream(self) -> bool:
        return self._link.is_end_of_stream

    def reject(self) -> None:
        """Refuse this image: its session is told end-of-stream and ignored for a cool-down.

        Used by a server that accepts a session only from one address (Echo 2.0 duologues).
        """
        self._link.reject()

    def __repr__(self) -> str:
        return (
            f"<Image session={self.session_id} stream={self.stream_id} from {self.source_address}>"
        )


class Publication:
    def __init__(self, channel_object: PublicationChannel, channel: str) -> None:
        self._channel = channel_object
        self.channel = channel
        self.session_id = channel_object.session_id
        self.stream_id = channel_object.stream_id
        self.max_message_length = channel_object.max_message_length
        self.max_payload_length = channel_object.max_payload_length
        self.term_length = channel_object.term_length
        self.mtu = channel_object.mtu
        # `offer` below, as the channel's compiled offer path itself: the method is what the
        # docs and type checkers read, this is what runs (one call per message, not two
        # interpreted frames around it).
        self.offer = channel_object.offer  # type: ignore[method-assign]

    @property
    def position(self) -> int:
        return self._channel.position

    @property
    def is_connected(self) -> bool:
        return self._channel.is_connected()

    @property
    def is_closed(self) -> bool:
        return self._channel.is_closed()

    @property
    def receiver_left(self) -> bool:
        """The last status message was a receiver's end-of-stream: a disconnection that
        follows is that receiver closing in order, not silence (no status message for the
        connection timeout)."""
        return self._channel.receiver_left

    def offer(self, data: bytes | bytearray | memoryview, *, flush: bool = True) -> int:
        """Append a message without waiting: the new position (> 0) or a negative code.

        NOT_CONNECTED -1, BACK_PRESSURED -2, ADMIN_ACTION -3 (term rotated: offer again),
        CLOSED -4, MAX_POSITION_EXCEEDED -5. A message longer than `max_message_length`
        raises ValueError. `flush=False` leaves the message for the driver's next pass, so
        that several offers made together go out in as few datagrams as fit.
        """
        return self._channel.offer(data, flush)

    def offer_many(
        self, messages: Iterable[bytes | bytearray | memoryview], *, flush: bool = True
    ) -> int:
        """Append several messages without waiting; returns how many were appended.

        Each message is its own message on the wire, exactly as if `offer` had been called for
        each in turn, at a fraction of the cost per message (one call into the transport for
        the batch): for a game loop that has a tick's worth of updates to send. Messages are
        taken in order until one is refused; fewer than all means the first one left was
        refused, and `offer(it)` returns why (BACK_PRESSURED, NOT_CONNECTED, ...). A term
        rotation (ADMIN_ACTION) is handled inside. A message longer than `max_message_length`
        raises ValueError (the ones before it are appended). `flush` as for `offer`.
        """
        return self._channel.offer_many(messages, flush)

    async def send(self, data: bytes | bytearray | memoryview, timeout: float = 0.5) -> int:
        """Offer until accepted or `timeout` passes; raises SendError(code) on give-up."""
        result = self._channel.offer(data, True)
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
                    await self._channel.wait()
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
                await self._channel.wait()

    async def wait_disconnected(self) -> None:
        """Wait until no receiver is left (timeout without SMs, end-of-stream, or closed)."""
        # The driver services the publication when the oldest receiver's timeout falls due,
        # and every service wakes these waiters: no polling.
        while self.is_connected:
            await self._channel.wait()

    def add_destination(self, uri: str) -> None:
        """Manual MDC: send to `aeron:udp?endpoint=host:port` too (an IP literal)."""
        if not self._channel.is_manual:
            raise UriError(f"{self.channel}: add_destination needs control-mode=manual")
        self._channel.add_destination(_destination_address(uri))

    def remove_destination(self, uri: str) -> None:
        if not self._channel.is_manual:
            raise UriError(f"{self.channel}: remove_destination needs control-mode=manual")
        self._channel.remove_destination(_destination_address(uri))

    @property
    def destinations(self) -> list[str]:
        return [format_address(a) for a in self._channel.destinations]

    def has_destination_host(self, host: str) -> bool:
        """Is some (validated) MDC destination of this publication at IP address `host`?"""
        return any(address[0] == host for address in self._channel.destinations)

    @property
    def local_address(self) -> str:
        return self._channel.local_address

    async def close(self, timeout: float | None = None) -> bool:
        """Drain, announce end-of-stream and linger; True if every receiver got everything."""
        return await self._channel.close(timeout)

    def close_soon(self, timeout: float | None = None, *, last: bytes | None = None) -> None:
        """`close` without waiting for the receivers: returns at once, and the transport
        drains, announces end-of-stream and lingers (up to `timeout`) in the background, then
        releases the stream. `last`, if given, is offered first (a goodbye): at once if the
        stream takes it, else retried in the background within the same `timeout`.
        `Transport.settle` waits for what is still lingering."""
        if self.is_closed:
            return
        if last is not None and self._channel.offer(last, True) > 0:
            last = None
        self._channel.close_soon(
            timeout, None if last is None else functools.partial(self._send_quietly, last)
        )

    async def _send_quietly(self, data: bytes) -> None:
        try:
            await self.send(data, timeout=math.inf)  # bounded by close_soon's timeout
        except (SendError, trio.ClosedResourceError):
            pass


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
        channel_object: SubscriptionChannel,
        channel: str,
        on_image_available: Callable[[Image], None] | None,
        on_image_unavailable: Callable[[Image], None] | None,
    ) -> None:
        self._channel = channel_object
        self._images: list[Image] = []
        self._by_link: dict[int, Image] = {}
        self._queue: deque[Message] = deque()
        self.channel = channel
        self.stream_id = channel_object.stream_id
        #: what a request publication names (response-correlation-id) to be answered here
        self.registration_id = channel_object.registration_id
        self.on_image_available = on_image_available
        self.on_image_unavailable = on_image_unavailable
        channel_object.on_available = self._on_available
        channel_object.on_unavailable = self._on_unavailable

    @property
    def images(self) -> list[Image]:
        return list(self._images)

    @property
    def is_connected(self) -> bool:
        return bool(self._images)

    @property
    def local_address(self) -> str:
        return self._channel.local_address

    def _on_available(self, link: ImageLink) -> None:
        image = Image(link, self)
        self._images.append(image)
        self._by_link[id(link)] = image
        if self.on_image_available is not None:
            self.on_image_available(image)

    def _on_unavailable(self, link: ImageLink, reason: str) -> None:
        image = self._by_link.pop(id(link), None)
        if image is None:
            return
        self._images.remove(image)
        image.closed = True
        image.close_reason = reason
        if self.on_image_unavailable is not None:
            self.on_image_unavailable(image)

    def poll(self, handler: Callable[[Message], object], fragment_limit: int = 10) -> int:
        """Deliver up to `fragment_limit` fragments' worth of messages; never blocks.

        Fewer than `fragment_limit` means everything that had arrived was delivered (a poll
        goes on across term boundaries, unlike Aeron's `Image.poll`): wait for news then."""
        return self._channel.poll(handler, fragment_limit)

    async def wait_activity(self) -> None:
        """Wait until a message may be ready or an image came or went (then `poll`)."""
        channel = self._channel
        await channel.wait()
        channel.stop_waiting()

    async def receive(self) -> Message:
        """Wait for the next message from any image."""
        queue = self._queue
        channel = self._channel
        fresh = False
        while not queue:
            if not channel.poll(queue.append, _RECEIVE_BATCH, fresh):
                # (The channel tells a closed subscription instead of waiting.)
                if not await channel.wait(True):
                    raise trio.EndOfChannel("subscription is closed")
                # (Just read: the poll after a wait need not ask whether the socket is stale.)
                fresh = True
        channel.stop_waiting()
        return queue.popleft()

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Message:
        # `receive` itself, its end ending the iteration (not an async generator around it:
        # that cost a generator frame to resume and a second coroutine per message).
        try:
            return await self.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None

    async def close(self) -> None:
        self._channel.close()


class Transport:
    """Publications and subscriptions over UDP, run by one driver (see `open_transport`),
    whose timer loop runs in `nursery` from now on."""

    def __init__(
        self,
        config: TransportConfig,
        nursery: trio.Nursery,
        socket_factory: SocketFactory = open_udp_socket,
    ) -> None:
        self.config = config
        self._driver = Driver(config, nursery, socket_factory)
        self._closed = False
        nursery.start_soon(self._driver.timer_loop)

    @property
    def counters(self) -> Counters:
        return self._driver.counters

    def _check_open(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("transport is closed")

    async def add_publication(self, channel: str, stream_id: int) -> Publication:
        self._check_open()
        return Publication(await self._driver.add_publication(channel, stream_id), channel)

    async def add_subscription(
        self,
        channel: str,
        stream_id: int,
        *,
        on_image_available: Callable[[Image], None] | None = None,
        on_image_unavailable: Callable[[Image], None] | None = None,
    ) -> Subscription:
        self._check_open()
        channel_object = await self._driver.add_subscription(channel, stream_id)
        return Subscription(channel_object, channel, on_image_available, on_image_unavailable)

    async def settle(self, timeout: float) -> None:
        """Wait (at most `timeout` seconds) until the publications closed with `close_soon`
        have finished lingering: before closing a transport whose last messages should still
        reach their receivers."""
        driver = self._driver
        with trio.move_on_after(timeout):
            while driver.lingering:
                await driver.lingering_done.park()

    async def aclose(self) -> None:
        """Close everything at once, telling peers: EOS heartbeats and EOS status messages."""
        if self._closed:
            return
        self._closed = True
        self._driver.shut_down()


@asynccontextmanager
async def open_transport(
    config: TransportConfig | None = None, *, socket_factory: SocketFactory = open_udp_socket
) -> AsyncIterator[Transport]:
    """Run a transport for the duration of the block; everything is closed on exit.

    `socket_factory` opens the transport's UDP sockets (sockets.open_udp_socket): a test or a
    demo can hand it one that loses datagrams, as a network would.
    """
    async with trio.open_nursery() as nursery:
        transport = Transport(config or TransportConfig(), nursery, socket_factory)
        try:
            yield transport
        finally:
            await transport.aclose()
            nursery.cancel_scope.cancel()
