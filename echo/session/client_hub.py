"""One all-clients subscription per transport and server, shared by the handshakes in flight.

The server's all-clients channel is multi-destination (the io7m Echo 2.0 guide §4.4): every
reply it sends goes to every subscription registered with its control port, and each client
keeps the replies that start with its own session. A process that opens many sessions on one
transport (a game's bots, a load test, a server of many players' proxies) used to open one
such subscription per handshake: with N handshakes in flight, the server sent each reply
datagram N times to the same host and the process read all N copies, N x N messages in all,
so that a burst of a few hundred joins saturated the client process; its one socket for the
HELLO publications then backed up, their status messages were lost, the publications kept
sending SETUPs and the handshakes timed out (measured: 300 joins on one transport, 147-209 of
them timed out, the socket 8 MB behind).

Here the handshakes of one transport to one server share one subscription, as two Aeron
subscriptions to the same channel share their receive endpoint: the server sees one
destination, sends each datagram once, and the process reads it once and hands each reply to
the handshake whose session it names. A handshake's view of it (`AllClientsView`) has what
the handshake used of its own subscription: `images`, `poll`, `wait_activity` and `close`.
The hub closes its subscription when its last view closes. Resumes (`client_path`) keep a
fresh subscription of their own: they exist because the path may have changed.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import trio

from echo.transport import Image, Message, Subscription, Transport

#: Messages taken from the shared subscription per poll.
_PUMP_BATCH = 256

_HubKey = tuple[str, int, int]  # host, control port, stream id
_hubs: weakref.WeakKeyDictionary[Transport, dict[_HubKey, _Hub]] = weakref.WeakKeyDictionary()


class AllClientsView:
    """One handshake's share of an `_Hub`: the replies that name its session."""

    def __init__(self, hub: _Hub, on_image_gone: Callable[[Image], None]) -> None:
        self._hub = hub
        self.on_image_gone = on_image_gone
        self.inbox: list[Message] = []
        self.prefix: bytes | None = None
        self._event = trio.Event()
        self.closed = False

    @property
    def images(self) -> list[Image]:
        return self._hub.subscription.images

    def expect(self, client_session: int) -> None:
        """Replies starting with ``"<client_session> "`` are this handshake's (its HELLO
        publication's session id, which the server's replies name)."""
        hub = self._hub
        if self.prefix is not None:
            hub.by_prefix.pop(self.prefix, None)
        self.prefix = f"{client_session} ".encode()
        hub.by_prefix[self.prefix] = self

    def poll(self, handler: Callable[[Message], object], fragment_limit: int = 10) -> int:
        """The replies for this handshake that have arrived (reading the shared subscription
        first); never blocks."""
        self._hub.pump()
        taken = self.inbox[:fragment_limit]
        del self.inbox[:fragment_limit]
        for message in taken:
            handler(message)
        return len(taken)

    async def wait_activity(self) -> None:
        """Until a reply for this handshake may be ready or an image came or went."""
        await self._hub.wait(self)

    def wake(self) -> None:
        self._event.set()

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        await self._hub.release(self)


class _Hub:
    """The shared subscription, its views, and which view reads it now."""

    def __init__(self, transport: Transport, key: _HubKey) -> None:
        self.transport = transport
        self.key = key
        self.subscription: Subscription
        self.ready = trio.Event()
        self.views: set[AllClientsView] = set()
        self.by_prefix: dict[bytes, AllClientsView] = {}
        #: the view whose task waits on the subscription now (one at a time)
        self.reader: AllClientsView | None = None
        self.waiting: set[AllClientsView] = set()
        self._images = 0

    def _dispatch(self, message: Message) -> None:
        data = message.data
        view = self.by_prefix.get(bytes(data[: data.find(b" ") + 1]))
        if view is not None:  # a reply to a handshake of another process, or one gone
            view.inbox.append(message)
            view.wake()

    def pump(self) -> None:
        subscription = self.subscription
        while subscription.poll(self._dispatch, _PUMP_BATCH) >= _PUMP_BATCH:
            pass
        images = len(subscription.images)
        if images != self._images:
            # An image came or went: every handshake re-checks where it stands.
            self._images = images
            for view in self.waiting:
                view.wake()

    def on_image_gone(self, image: Image) -> None:
        for view in list(self.views):
            view.on_image_gone(image)
            view.wake()

    async def wait(self, view: AllClientsView) -> None:
        if view.inbox:
            return
        if self.reader is None:
            self.reader = view
            try:
                await self.subscription.wait_activity()
            finally:
                self.reader = None
                self.pump()
                # Hand the reading on: another handshake waits for its reply.
                for other in self.waiting:
                    other.wake()
                    break
            return
        view._event = trio.Event()
        self.waiting.add(view)
        try:
            await view._event.wait()
        finally:
            self.waiting.discard(view)

    async def release(self, view: AllClientsView) -> None:
        self.views.discard(view)
        self.waiting.discard(view)
        if view.prefix is not None and self.by_prefix.get(view.prefix) is view:
            del self.by_prefix[view.prefix]
        if self.reader is view:
            self.reader = None
        for other in self.waiting:
            other.wake()
            break
        if self.views:
            return
        hubs = _hubs.get(self.transport)
        if hubs is not None and hubs.get(self.key) is self:
            del hubs[self.key]
        # Its end-of-stream status message takes us off the server's destinations at once.
        await self.subscription.close()


async def open_view(
    transport: Transport,
    host: str,
    control_port: int,
    stream_id: int,
    on_image_gone: Callable[[Image], None],
) -> AllClientsView:
    """A view of `transport`'s all-clients subscription to `host`:`control_port` (opened now
    if no handshake of this transport has one open)."""
    key = (host, control_port, stream_id)
    hubs = _hubs.setdefault(transport, {})
    while True:
        hub = hubs.get(key)
        if hub is None:
            hub = _Hub(transport, key)
            hubs[key] = hub
            try:
                hub.subscription = await transport.add_subscription(
                    f"aeron:udp?control={host}:{control_port}|control-mode=dynamic",
                    stream_id,
                    on_image_unavailable=hub.on_image_gone,
                )
            except BaseException:
                if hubs.get(key) is hub:
                    del hubs[key]
                raise
            finally:
                hub.ready.set()
            break
        await hub.ready.wait()
        # The hub may have failed to open (its opener's error is the opener's), or opened and
        # closed again while we waited (its only handshake ended at once): attaching to it
        # would wait on a closed subscription until the handshake timed out. Take the
        # transport's current hub, or open one.
        if hubs.get(key) is hub:
            break
    view = AllClientsView(hub, on_image_gone)
    hub.views.add(view)
    return view
