"""The seam between the api and the driver: one channel object per publication/subscription.

The driver wires a stream (sockets, endpoints, the pure state) and hands the api a channel;
`api.Publication` and `api.Subscription` call only their channel (offer, poll, wait, close),
never the driver's sockets, its scheduling or the pure state. The channel is where an
application task meets the driver: it offers into the pure publication and asks the driver to
flush, polls images into messages, and waits for the driver's notification (or on a lent
socket, see sockets.Lending).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

import trio

from echo.transport.core.destinations import Address
from echo.transport.core.message import Message, Origin, format_address
from echo.transport.core.offering import OfferGate, Ticker
from echo.transport.core.receiver import ImageAvailable, ImageEvent, PublicationImage
from echo.transport.core.sender import NetworkPublication
from echo.transport.driver.sockets import LEND_IDLE, DriverSocket, ReceiveSocket, SendSocket

#: `close` waits this long past the linger for the last status messages before it gives up
_CLOSE_GRACE = 1.0

class _Ids(Protocol):
    def next_receiver_id(self) -> int: ...


class ChannelDriver(Protocol):
    """What a channel asks of the driver (loop.Driver is one): the clock, the offer path's
    hooks, the lent socket's reads, and its resources back. A protocol, so that this module
    does not import the driver, which builds on it."""

    now: Callable[[], float]
    pending: set[DriverSocket]
    ticker: Ticker
    nursery: trio.Nursery
    lingering: set[PublicationChannel]
    lingering_done: trio.lowlevel.ParkingLot

    @property
    def ids(self) -> _Ids: ...

    def flush(self, udp: SendSocket, publication: NetworkPublication, now: float) -> None: ...

    def wake(self, udp: DriverSocket) -> None: ...

    async def wait_lent(self, udp: ReceiveSocket, reader: LentReader) -> bool: ...

    def drain_stale(self, udp: ReceiveSocket, now: float) -> None: ...

    def stop_waiting(self, udp: ReceiveSocket) -> None: ...

    def wake_borrower(self, udp: ReceiveSocket) -> None: ...

    def consumed(self, udp: ReceiveSocket, images: list[PublicationImage]) -> None: ...

    def release_publication(self, publication: PublicationChannel) -> None: ...

    def release_subscription(self, subscription: SubscriptionChannel) -> None: ...


class LentReader(Protocol):
    """What `ChannelDriver.wait_lent` asks of the subscription whose socket it reads: has
    what arrived since the read began (`data_before` data datagrams on the socket, the
    subscription's `image_events` then) news for it?"""

    image_events: int

    def has_news(self, data_before: int, events_before: int) -> bool: ...


class Waiters:
    """Wakes every task waiting for 'something changed' on a channel."""

    __slots__ = ("_lot",)

    def __init__(self) -> None:
        self._lot = trio.lowlevel.ParkingLot()

    def notify(self) -> None:
        if self._lot:
            self._lot.unpark_all()

    async def wait(self) -> None:
        await self._lot.park()


class PublicationChannel:
    """One publication as the driver runs it: its pure state on its send socket."""

    def __init__(
        self, driver: ChannelDriver, udp: SendSocket, state: NetworkPublication, uri: str
    ) -> None:
        self._driver = driver
        #: the channel URI it was added with
        self.uri = uri
        self.socket = udp
        self.state = state
        self._waiters = Waiters()
        self.session_id = state.session_id
        self._released = False
        self.stream_id = state.stream_id
        self.max_message_length = state.max_message_length
        self.max_payload_length = state.max_payload
        self.term_length = state.term_length
        self.mtu = state.mtu
        #: the offer path, compiled (offering.py): `offer(data, flush=True)` appends one
        #: message and tells the driver if it must send or wake
        self.offer: Callable[..., int] = OfferGate(
            state,
            udp,
            udp.burst,
            driver.pending,
            driver.ticker,
            driver.now,
            driver.flush,
            driver.wake,
        ).offer

    @property
    def position(self) -> int:
        return self.state.position

    @property
    def local_address(self) -> str:
        return format_address(self.socket.local_address)

    def is_connected(self) -> bool:
        return self.state.is_connected(self._driver.now())

    @property
    def receiver_left(self) -> bool:
        return self.state.receiver_left

    def is_closed(self) -> bool:
        return not self.state.is_active

    def offer_many(self, messages: Iterable[bytes | bytearray | memoryview], flush: bool) -> int:
        driver = self._driver
        now = driver.now()
        count = self.state.offer_many(messages, now)
        if count:
            if flush:
                driver.flush(self.socket, self.state, now)
            else:
                driver.wake(self.socket)
        return count

    async def wait(self) -> None:
        """Until the driver has next serviced this publication's socket."""
        self.socket.waiting.add(self)
        await self._waiters.wait()

    def notify(self) -> None:
        self._waiters.notify()

    # ------------------------------------------------------------ destinations (MDC)

    @property
    def is_manual(self) -> bool:
        return self.socket.endpoint.manual is not None

    def add_destination(self, address: Address) -> None:
        manual = self.socket.endpoint.manual
        if manual is None:
            raise ValueError("add_destination needs control-mode=manual")
        manual.add(address)
        self.state.trigger_setup()
        self._driver.wake(self.socket)

    def remove_destination(self, address: Address) -> None:
        manual = self.socket.endpoint.manual
        if manual is None:
            raise ValueError("remove_destination needs control-mode=manual")
        manual.remove(address)

    @property
    def destinations(self) -> list[Address]:
        return self.socket.endpoint.destinations

    # ------------------------------------------------------------ closing

    async def close(self, timeout: float | None) -> bool:
        """Drain, announce end-of-stream and linger; True if every receiver got everything."""
        driver = self._driver
        if self in driver.lingering:
            # `close_soon` is under way, its goodbye perhaps still waiting for a receiver:
            # beginning the end here would announce it before the goodbye. Wait for that
            # close instead, up to `timeout`.
            with trio.move_on_after(_CLOSE_GRACE if timeout is None else timeout):
                while self in driver.lingering:
                    await driver.lingering_done.park()
            return self.state.delivered
        self._begin_close()
        return await self._linger(timeout)

    def close_soon(
        self, timeout: float | None, first: Callable[[], Awaitable[object]] | None = None
    ) -> None:
        """`close` in the driver's own nursery: returns at once, the stream drains, announces
        its end and lingers (up to `timeout`) in the background, then its resources are
        released. `first` (a last message still to send, say) is awaited before the close."""
        if first is None:
            self._begin_close()
        driver = self._driver
        try:
            driver.nursery.start_soon(self._close_in_background, timeout, first)
        except RuntimeError:  # the transport's nursery is closing: nothing left to linger for
            self.state.abort()
            self._release()
            return
        driver.lingering.add(self)

    async def _close_in_background(
        self, timeout: float | None, first: Callable[[], Awaitable[object]] | None
    ) -> None:
        driver = self._driver
        try:
            if first is not None:
                with trio.move_on_after(_CLOSE_GRACE if timeout is None else timeout):
                    await first()
                self._begin_close()
            await self._linger(timeout)
        finally:
            driver.lingering.discard(self)
            driver.lingering_done.unpark_all()

    def _begin_close(self) -> None:
        self.state.close(self._driver.now())
        self._driver.wake(self.socket)

    async def _linger(self, timeout: float | None) -> bool:
        state = self.state
        limit = state.linger_bound() + _CLOSE_GRACE if timeout is None else timeout
        delivered = False
        with trio.move_on_after(limit):
            while not state.is_done and not self._released:
                delivered = delivered or state.delivered
                await self.wait()
        delivered = delivered or state.delivered
        if state.is_lingering:
            # Out of time while waiting for the receivers' proof, everything sent: still say
            # where the stream ends, or the receivers learn it only from their timeouts.
            self.socket.endpoint.announce_end(state, self.socket.send)
        state.abort()
        self._release()
        return delivered

    def _release(self) -> None:
        """Give the stream's resources back to the driver, once (a publication closed in the
        background may be closed again, at once, by its owner meanwhile)."""
        if not self._released:
            self._released = True
            self._driver.release_publication(self)


class ImageLink:
    """One image of a subscription as the api sees it: read-only facts and `reject`."""

    __slots__ = (
        "_channel",
        "correlation_id",
        "image",
        "join_position",
        "origin",
        "requested_response",
        "session_id",
        "source_address",
        "source_ip",
        "source_port",
        "stream_id",
    )

    def __init__(self, image: PublicationImage, channel: SubscriptionChannel) -> None:
        self.image = image
        self._channel = channel
        self.session_id = image.session_id
        self.stream_id = image.stream_id
        address = image.control_address
        self.source_ip: str = address[0]
        self.source_port: int = address[1]
        self.source_address = format_address(address)
        #: the fields every Message from this image carries after its data
        self.origin: Origin = (
            self.session_id,
            self.stream_id,
            self.source_address,
            self.source_ip,
            self.source_port,
        )
        self.join_position = image.join_position
        #: unique within the transport: what a response publication names to answer this
        #: image (response-correlation-id), Aeron's image correlation id
        self.correlation_id = channel.new_correlation_id()
        self.requested_response = image.requested_response

    @property
    def position(self) -> int:
        return self.image.subscriber_position

    @property
    def is_end_of_stream(self) -> bool:
        return self.image.is_end_of_stream

    @property
    def subscription_socket(self) -> ReceiveSocket:
        return self._channel.socket

    def reject(self) -> None:
        self._channel.reject(self)


class SubscriptionChannel:
    """One subscription (a stream id) as the driver runs it on its receive socket."""

    def __init__(
        self,
        driver: ChannelDriver,
        udp: ReceiveSocket,
        stream_id: int,
        uri: str,
        session_id: int | None = None,
        registration_id: int = 0,
    ) -> None:
        self._driver = driver
        #: the session-id filter it was added with (None: every session of the stream)
        self.session_id = session_id
        #: what a request publication names as its response-correlation-id
        self.registration_id = registration_id
        #: the channel URI it was added with
        self.uri = uri
        self.socket = udp
        self.stream_id = stream_id
        self._waiters = Waiters()
        self.images: list[ImageLink] = []
        self._by_image: dict[int, ImageLink] = {}
        self._round_robin = 0
        self._closed = False
        #: images that came or went, ever (`wait` tells news from a heartbeat by it)
        self.image_events = 0
        #: the api's image callbacks: a link came, a link went (with the reason's name)
        self.on_available: Callable[[ImageLink], None] | None = None
        self.on_unavailable: Callable[[ImageLink, str], None] | None = None

    @property
    def local_address(self) -> str:
        return format_address(self.socket.local_address)

    @property
    def closed(self) -> bool:
        return self._closed or self.socket.closed

    def new_correlation_id(self) -> int:
        return self._driver.ids.next_receiver_id()

    def on_image_event(self, event: ImageEvent) -> None:
        """An image of this stream came or went (the driver, while servicing the socket)."""
        if isinstance(event, ImageAvailable):
            link = ImageLink(event.image, self)
            self.images.append(link)
            self._by_image[id(event.image)] = link
            if self.on_available is not None:
                self.on_available(link)
        else:
            found = self._by_image.pop(id(event.image), None)
            if found is None:
                return
            self.images.remove(found)
            if self.on_unavailable is not None:
                self.on_unavailable(found, event.reason.value)
        self.image_events += 1
        self._waiters.notify()

    def reject(self, link: ImageLink) -> None:
        udp = self.socket
        udp.endpoint.reject_image(link.session_id, link.stream_id, self._driver.now(), udp.send)
        # Not serviced inline: this may run inside an image callback, i.e. inside the driver.
        self._driver.wake(udp)

    def poll(
        self, handler: Callable[[Message], object], fragment_limit: int, fresh: bool = False
    ) -> int:
        """Deliver up to `fragment_limit` fragments' worth of messages; never blocks.

        `fresh`: the caller's `wait` has just returned, so a lent socket was read moments ago
        (or another task is reading it) and is not stale: no clock read for the question."""
        udp = self.socket
        lending = udp.lending
        if not fresh and lending.lent and not lending.borrowed and not udp.closed:
            # Lent, and nobody waits on it: if nobody has for LEND_IDLE, datagrams may wait
            # unread (stale). (The check inline, not the driver's: it runs on every poll.)
            driver = self._driver
            now = driver.now()
            if now - lending.returned_at >= LEND_IDLE:
                driver.drain_stale(udp, now)
        links = self.images
        count = len(links)
        if not count:
            return 0
        fragments = 0
        due: list[PublicationImage] | None = None
        start = self._round_robin % count
        self._round_robin += 1
        for i in range(count):
            link = links[(start + i) % count]
            image = link.image
            if image.rebuild_position <= image.subscriber_position:
                continue  # nothing new
            fragments += image.poll_into(handler, link.origin, fragment_limit - fragments)
            # The image's poll stops at its term's end (Aeron's Image.poll); this one goes on
            # into the next term. A caller takes a short poll to mean it has everything (the
            # session's `receive` then waits for news), and what already arrived past the
            # boundary brings none: the reader would wait for ever.
            while (
                fragments < fragment_limit
                and image.rebuild_position > image.subscriber_position
                and not image.subscriber_position & image.mask
            ):
                position = image.subscriber_position
                fragments += image.poll_into(handler, link.origin, fragment_limit - fragments)
                if image.subscriber_position == position:
                    break
            if image.status_message_due():
                if due is None:
                    due = []
                due.append(image)
            if fragments >= fragment_limit:
                break
        if due:
            # Consumption crossed the window/4 threshold (or freed a sender waiting at the
            # window's edge): the driver sends the SM now, not after a pass of the timer loop;
            # the sender may be idle until it comes.
            self._driver.consumed(udp, due)
        return fragments

    async def wait(self, unless_closed: bool = False) -> bool:
        """Wait until this subscription may have news (data, an image that came or went, the
        end): on the socket, in this task, if the driver lends it (one task switch per
        datagram fewer), else until the driver says so. True when it has waited.

        Reading the lent socket itself, the task goes on waiting while what arrived was not
        news for it: heartbeats, and on a shared port other sessions' datagrams. An idle
        stream's heartbeats would otherwise wake the application several times a second for
        nothing (docs/profile-b4.txt: at 1,000 clients that was most of their wake-ups).

        `unless_closed`: if the subscription is closed, return False at once instead
        (`receive`'s test before it waits, here without a call of its own).
        """
        udp = self.socket
        if unless_closed and (self._closed or udp.closed):
            return False
        if udp.lending.lent and await self._driver.wait_lent(udp, self):
            return True
        lending = udp.lending
        lending.waiters += 1
        if self.session_id is None:
            udp.waiting_all.add(self)
        try:
            await self._waiters.wait()
        finally:
            lending.waiters -= 1
        return True

    def has_news(self, data_before: int, events_before: int) -> bool:
        """Since `data_before` data datagrams on the socket and `events_before` image
        events: did anything come this subscription's `wait` should return for?"""
        # (`closed`'s body inline: one interpreted call fewer per message waited for.)
        if self._closed or self.socket.closed or self.image_events != events_before:
            return True
        if self.session_id is None:
            # Any image of the socket may be ours: did data come at all?
            return self.socket.endpoint.data_received != data_before
        for link in self.images:
            image = link.image
            if image.rebuild_position > image.subscriber_position:
                return True
        return False

    def stop_waiting(self) -> None:
        """The waiting task goes off to do something else (it has what it waited for)."""
        udp = self.socket
        if udp.lending.waiters:
            self._driver.stop_waiting(udp)

    def notify(self) -> None:
        self._waiters.notify()

    def detach(self) -> None:
        """Forget the api's callbacks: they hold the api object, which holds this channel, a
        reference cycle that would keep the socket and its images for the cyclic collector."""
        self.on_available = None
        self.on_unavailable = None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._driver.wake_borrower(self.socket)
        self._driver.release_subscription(self)
        self.detach()
        self._waiters.notify()
