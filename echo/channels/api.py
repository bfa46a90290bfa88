"""The trio driver of a ChannelPeer over one session (anything with send/receive/close)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Protocol

import structlog
import trio

from echo.channels.core import (
    ChannelPeer,
    ChannelSpec,
    ChannelUsageError,
    Delivery,
    Discarded,
    OutState,
)
from echo.channels.wire import HandleRef
from echo.transport import Publication, Subscription

log = structlog.get_logger("echo.channels")


class SessionLike(Protocol):
    """The part of echo.session.Session the channels use: a reliable, ordered message pipe."""

    async def send(self, data: bytes) -> None: ...

    async def receive(self) -> bytes: ...

    async def close(self, reason: str = "") -> None: ...


class ChannelsClosed(Exception):
    """The channels are gone: the session closed, or one peer broke the protocol."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Channel:
    """One logical channel: send to the peer, receive from it, size our receive buffer."""

    def __init__(self, owner: Channels, channel_id: int) -> None:
        self._owner = owner
        self.channel_id = channel_id
        self._current: Delivery | None = None
        # Set when input may have made this channel readable (or the channels closed): a
        # reader waits for its own channel only. (Woken by every change, a server's two idle
        # readers per member woke, and waited again, for every message sent to that member.)
        self._readable: trio.Event | None = None
        peer = owner.peer
        self._out_state = peer.outgoing[channel_id]
        # Our incoming buffer, read directly on the per-message path (None: a handle channel,
        # whose binds are read by the library, not by `receive`).
        incoming = peer.incoming[channel_id]
        self._buffer = None if incoming.spec.handles else incoming.buffer

    async def send(
        self, data: bytes, *, optimistic: bool = False, refs: Sequence[HandleRef] = ()
    ) -> None:
        """Queue `data`; return once it went out under guarantees (will surely be buffered).

        optimistic=True returns once queued (after waiting for room in the local queue); the
        library retransmits it if the peer drops it.
        """
        owner = self._owner
        if optimistic:
            while self._out_state.queued_bytes >= owner.max_queued:
                await owner._wait_change()
        if owner.closed_reason is not None:
            raise ChannelsClosed(owner.closed_reason)
        peer = owner.peer
        out = peer.send(self.channel_id, data, optimistic=optimistic, refs=refs)
        if owner._waiting or owner._writers:
            owner._notify()
        if not optimistic:
            try:
                while out.state is OutState.QUEUED:
                    await owner._wait_change()
            except BaseException:
                # Cancelled (or closed) before it went out: it is not sent at all.
                peer.withdraw(out)
                raise

    def send_nowait(self, data: bytes, *, max_queued: int, defer: bool = False) -> bool:
        """Queue `data` without waiting: it goes out under guarantees, in order after what is
        queued here, as `send`'s would. False (nothing queued) when `max_queued` bytes or more
        already wait on this channel: for a server that must never block on one slow peer and
        decides itself what a backlog means. Raises ChannelsClosed when they are closed.

        defer=True wakes nobody: the caller calls `Channels.flush_nowait()` before it next
        waits, which sends what it queued (several messages in one session message) from the
        caller's own task.
        """
        owner = self._owner
        if owner.closed_reason is not None:
            raise ChannelsClosed(owner.closed_reason)
        if self._out_state.queued_bytes >= max_queued:
            return False
        owner.peer.send(self.channel_id, data)
        if not defer and (owner._waiting or owner._writers):
            owner._notify()
        return True

    async def receive(self) -> Delivery:
        """The next message; the previous one received here counts as processed now.

        Raises trio.EndOfChannel once the peer's sending bound is used up, ChannelsClosed when
        the session is gone.
        """
        owner = self._owner
        if self._current is not None:
            self.done()
        while True:
            delivery = owner.peer.take(self.channel_id)
            if delivery is not None:
                self._current = delivery
                return delivery
            if owner.peer.finished_receiving(self.channel_id):
                raise trio.EndOfChannel
            owner._check_open()
            readable = self._readable
            if readable is None:
                readable = self._readable = trio.Event()
            await readable.wait()

    def done(self, *, defer: bool = False) -> None:
        """Mark the message last received here as processed (frees its buffer space).

        defer=True wakes nobody, as `send_nowait`'s: the guarantees it may free go out with
        the caller's `Channels.flush_nowait()` (with its reply, say), which must follow.
        """
        current = self._current
        if current is not None:
            self._current = None
            owner = self._owner
            owner.peer.release(current)
            if not defer and (owner._waiting or owner._writers):
                owner._notify()

    def __aiter__(self) -> Channel:
        return self

    async def __anext__(self) -> Delivery:
        # `receive` inline for a message already buffered: this runs once per message, and a
        # second coroutine per message is a measurable share of it.
        buffer = self._buffer
        if buffer:
            self.done()
            delivery = buffer.popleft()
            assert isinstance(delivery, Delivery)
            self._current = delivery
            return delivery
        try:
            return await self.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None

    def resize(self, capacity: int) -> None:
        """Set our receive buffer for this channel to `capacity` bytes."""
        self._owner.peer.resize(self.channel_id, capacity)
        self._owner._notify()

    def limit_sending(self, more: int) -> None:
        """Promise the peer at most `more` further bytes from us (0 closes our direction)."""
        self._owner.peer.limit_sending(self.channel_id, more)
        self._owner._notify()

    def limit_receiving(self, more: int) -> None:
        """Promise to accept at most `more` further bytes (cannot undercut guarantees given)."""
        self._owner.peer.limit_receiving(self.channel_id, more)
        self._owner._notify()

    @property
    def guarantees(self) -> int:
        """Bytes we may still send that the peer has promised to buffer."""
        return self._owner.peer.guarantees(self.channel_id)


class Channels:
    """All logical channels of one session; `channels[id]` is a Channel."""

    def __init__(
        self,
        session: SessionLike,
        specs: Iterable[ChannelSpec],
        *,
        max_batch: int,
        max_queued: int,
        on_discarded: Callable[[int, bytes], None] | None,
    ) -> None:
        self.session = session
        self.peer = ChannelPeer(specs)
        self.max_batch = max_batch
        self.max_queued = max_queued
        self.on_discarded = on_discarded
        self.closed_reason: str | None = None
        self._changed = trio.Event()
        self._waiting = 0
        # Idle writers by stream, each with its own wake-up: a change wakes only the writers
        # that now have something to send (woken by every change, the other stream's writer
        # doubled control's round trip on its own stream, and a server's writer woke for
        # every message a member sent it).
        self._writers: dict[int, trio.Event] = {}
        self._channels = {cid: Channel(self, cid) for cid in self.peer.specs}
        # The session's `send_nowait` (echo.session.Session has one), for `flush_nowait`; and
        # a session message it did not take, which the writer sends before anything else.
        self._send_nowait: Callable[[bytes], bool] | None = getattr(session, "send_nowait", None)
        self._held: bytes | None = None

    def __getitem__(self, channel_id: int) -> Channel:
        try:
            return self._channels[channel_id]
        except KeyError:
            raise ChannelUsageError(f"unknown channel {channel_id}") from None

    async def bind(self, handle_type: int, value: bytes, *, optimistic: bool = False) -> int:
        """Bind the next handle of `handle_type` on the peer to `value`.

        Returns the handle; unless optimistic, only once the bind is guaranteed to be bound.
        """
        self._check_open()
        handle = self.peer.bind(handle_type, value, optimistic=optimistic)
        self._notify()
        if not optimistic:
            bind = self.peer.own[handle_type][handle].bind
            while bind is not None and bind.state is OutState.QUEUED:
                await self._wait_change()
        return handle

    def free(self, handle_type: int, handle: int, *, mine: bool = True) -> None:
        """Propose (or confirm) freeing a handle; do not reference it afterwards."""
        self.peer.free(handle_type, handle, mine=mine)
        self._notify()

    def handle_value(self, handle_type: int, handle: int, *, mine: bool) -> bytes:
        return self.peer.handle_value(handle_type, handle, mine=mine)

    @property
    def counters(self) -> dict[str, int]:
        return dict(self.peer.counters)

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        """Wait until `predicate()` holds (guarantees arrived, a buffer filled, ...).

        It is checked now and after every change to these channels' state: input from the
        peer, output, and local operations. Raises ChannelsClosed if they close first.
        """
        while not predicate():
            await self._wait_change()

    def flush_nowait(self) -> None:
        """Send what is queued on the session's own stream now, from the caller's task, when
        the writer is idle and the session takes it without waiting; otherwise (a send under
        way, back pressure) the writer sends it, in order. Never raises: a session that is
        gone closes the channels, as in the writer.

        A server's fan-out: one session message per member and request, with no writer task
        woken per member and message.
        """
        if self.closed_reason is not None:
            return
        peer = self.peer
        send_nowait = self._send_nowait
        writers = self._writers
        if send_nowait is None or 0 not in writers or not peer.has_output(0):
            # (No direct way, or the writer is busy or already woken: it sends in turn.)
            self._notify()
            return
        batch = peer.data_to_send(self.max_batch, 0)
        if peer.events:
            self._after_input()
        try:
            sent = send_nowait(batch)
        except Exception as exc:
            self._closed(f"session closed: {exc}" if str(exc) else "session closed")
            return
        if not sent:
            self._held = batch
            writers.pop(0).set()
        self._notify()

    # ------------------------------------------------------------------ internals

    def _notify(self) -> None:
        writers = self._writers
        if writers:
            peer = self.peer
            for stream in list(writers):
                if self.closed_reason is not None or peer.has_output(stream):
                    writers.pop(stream).set()
        # A fresh Event only when someone waits on the old one: this runs once per message.
        if self._waiting:
            # Those waiting are all woken by this set(); later notifies need a new Event only
            # once someone waits again.
            self._waiting = 0
            self._changed.set()
            self._changed = trio.Event()

    async def _wait_change(self) -> None:
        self._check_open()
        self._waiting += 1
        await self._changed.wait()

    def _check_open(self) -> None:
        if self.closed_reason is not None:
            raise ChannelsClosed(self.closed_reason)

    def _closed(self, reason: str) -> None:
        if self.closed_reason is None:
            self.closed_reason = reason
            self._notify()
            self._wake_readers()

    def _wake_readers(self) -> None:
        """Wake the readers whose channel has something for them (or every reader, closed)."""
        peer = self.peer
        closed = self.closed_reason is not None
        for channel in self._channels.values():
            readable = channel._readable
            if readable is not None and (
                closed
                or peer.incoming[channel.channel_id].buffer
                or peer.finished_receiving(channel.channel_id)
            ):
                channel._readable = None
                readable.set()

    def _after_input(self) -> None:
        peer = self.peer
        # Binding is cheap and its guarantee means "will be bound": bind as they arrive.
        for handle_type in peer.own:
            if peer.pending_binds(handle_type):
                peer.process_binds(handle_type)
        if peer.events:
            events, peer.events = peer.events, []
            for event in events:
                self._report(event)
        self._notify()
        self._wake_readers()

    def _report(self, event: Discarded) -> None:
        frame = event.message.frame
        log.warning("channel_message_discarded", channel=event.message.channel)
        if self.on_discarded is not None and hasattr(frame, "payload"):
            self.on_discarded(event.message.channel, frame.payload)

    async def _reader(self, session: SessionLike) -> None:
        peer = self.peer
        while True:
            try:
                data = await session.receive()
            except Exception as exc:  # the session's own closed error, whatever its type
                self._closed(f"session closed: {exc}" if str(exc) else "session closed")
                return
            peer.receive(data)
            if peer.failure is not None:
                await self._protocol_error(peer.failure)
                return
            self._after_input()

    async def _writer(self, stream: int, session: SessionLike) -> None:
        peer = self.peer
        while True:
            if stream == 0 and self._held is not None:
                # flush_nowait's batch, which the session did not take at once: first.
                batch, self._held = self._held, None
            else:
                if not peer.has_output(stream):
                    if self.closed_reason is not None:
                        return
                    wake = self._writers[stream] = trio.Event()
                    await wake.wait()
                    continue
                batch = peer.data_to_send(self.max_batch, stream)
                if peer.events:
                    self._after_input()
                self._notify()
            try:
                await session.send(batch)
            except Exception as exc:
                self._closed(f"session closed: {exc}" if str(exc) else "session closed")
                return

    async def _protocol_error(self, reason: str) -> None:
        log.warning("channels_protocol_error", reason=reason)
        self._closed(f"channel protocol error: {reason}")
        with contextlib.suppress(Exception):
            await self.session.close(f"channel protocol error: {reason}")


@contextlib.asynccontextmanager
async def open_channels(
    session: SessionLike,
    specs: Iterable[ChannelSpec],
    *,
    max_batch: int = 16 * 1024,
    max_queued: int = 256 * 1024,
    on_discarded: Callable[[int, bytes], None] | None = None,
) -> AsyncIterator[Channels]:
    """Run logical channels over `session` for the duration of the block.

    Both peers must declare the same channel ids. The session stays open on exit (it is the
    caller's); a protocol error by either side closes it with the reason.
    """
    channels = Channels(
        session, specs, max_batch=max_batch, max_queued=max_queued, on_discarded=on_discarded
    )
    async with contextlib.AsyncExitStack() as stack:
        streams: list[SessionLike] = [session]
        for stream in range(1, channels.peer.streams):
            streams.append(await stack.enter_async_context(_open_substream(session, stream)))
        async with trio.open_nursery() as nursery:
            for stream, stream_session in enumerate(streams):
                nursery.start_soon(channels._reader, stream_session)
                nursery.start_soon(channels._writer, stream, stream_session)
            try:
                yield channels
            finally:
                nursery.cancel_scope.cancel()
                channels._closed("channels closed locally")


class _AeronSubstream:
    """Stream `k` of an echo.session session: a publication and a subscription on the
    session's own channel URIs (the same ports, the same session id: the transport shares the
    sockets, and a NAT mapping the session opened serves it too) with stream id + k.

    Aeron delivers each stream in order on its own, so a datagram lost on one stream delays
    nothing on another: that is the whole point (ChannelSpec.own_stream).
    """

    def __init__(
        self, publication: Publication, subscription: Subscription, send_timeout: float
    ) -> None:
        self.publication = publication
        self.subscription = subscription
        self.send_timeout = send_timeout

    async def send(self, data: bytes) -> None:
        publication = self.publication
        if publication.offer(data) <= 0:
            if not publication.is_connected:
                # The peer's subscription to this stream is not up yet: wait for it (the
                # session's own stream is, so the peer is there).
                await publication.wait_connected(timeout=SUBSTREAM_CONNECT_TIMEOUT)
            await publication.send(data, timeout=self.send_timeout)

    async def receive(self) -> bytes:
        return bytes((await self.subscription.receive()).data)

    async def close(self, reason: str = "") -> None:
        # The session's own stream carries the close reason; this one just ends.
        await self.subscription.close()
        await self.publication.close(timeout=0)


#: How long the first message on an own stream waits for the peer's subscription to it.
SUBSTREAM_CONNECT_TIMEOUT = 10.0
#: How long an own stream's send retries under back pressure before the channels close
#: (the peer's reader drains its streams into the channel buffers, so this is rare).
SUBSTREAM_SEND_TIMEOUT = 2.0


_SESSION_ID = re.compile(r"session-id=(-?\d+)")


def _substream_uri(uri: str, stream: int) -> str:
    """The session's channel URI for its stream `stream`: a session id of its own, the
    session's + stream (as a signed 32-bit id). Both peers derive the same; the transport
    keeps one session id per publication, and the session-id filter of the subscriptions keeps
    out every other sender, as on the session's own stream."""

    def shifted(match: re.Match[str]) -> str:
        value = (int(match.group(1)) + stream + (1 << 31)) % (1 << 32) - (1 << 31)
        return f"session-id={value}"

    return _SESSION_ID.sub(shifted, uri)


@contextlib.asynccontextmanager
async def _open_substream(session: SessionLike, stream: int) -> AsyncIterator[SessionLike]:
    """Stream `stream` of `session`: its own `open_substream(stream)` if it has one (test
    pipes), else an Aeron stream beside an echo.session.Session's (see _AeronSubstream)."""
    opener = getattr(session, "open_substream", None)
    if opener is not None:
        async with opener(stream) as substream:
            yield substream
        return
    transport = getattr(session, "transport", None)
    own_pub = getattr(session, "publication", None)
    own_sub = getattr(session, "subscription", None)
    if transport is None or own_pub is None or own_sub is None:
        raise ChannelUsageError(
            "channels with own_stream need a session with transport, publication and "
            "subscription (echo.session.Session) or open_substream"
        )
    if any(
        "control-mode=response" in uri or "response-correlation-id" in uri
        for uri in (own_pub.channel, own_sub.channel)
    ):
        # A second stream of a response channel would need its own request/response pairing
        # (RSP_SETUP) on both ends; without it the server's side never connects. Say so now
        # rather than let the session time out.
        raise ChannelUsageError(
            "own_stream needs per-client duologue ports: this session runs on shared ports "
            "(an Aeron response channel), which carry one stream per session"
        )
    stream_id = (own_pub.stream_id + stream) & 0x7FFFFFFF
    subscription = await transport.add_subscription(
        _substream_uri(own_sub.channel, stream), stream_id
    )
    try:
        publication = await transport.add_publication(
            _substream_uri(own_pub.channel, stream), stream_id
        )
    except BaseException:
        await subscription.close()
        raise
    substream = _AeronSubstream(publication, subscription, SUBSTREAM_SEND_TIMEOUT)
    try:
        yield substream
    finally:
        with trio.CancelScope(shield=True):
            with contextlib.suppress(Exception):
                await substream.close()


__all__ = ["Channel", "Channels", "ChannelsClosed", "SessionLike", "open_channels"]
