"""The trio driver of a ChannelPeer over one session (anything with send/receive/close)."""

from __future__ import annotations

import contextlib
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
        if owner._waiting:
            owner._notify()
        if not optimistic:
            try:
                while out.state is OutState.QUEUED:
                    await owner._wait_change()
            except BaseException:
                # Cancelled (or closed) before it went out: it is not sent at all.
                peer.withdraw(out)
                raise

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
            await owner._wait_change()

    def done(self) -> None:
        """Mark the message last received here as processed (frees its buffer space)."""
        current = self._current
        if current is not None:
            self._current = None
            owner = self._owner
            owner.peer.release(current)
            if owner._waiting:
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
        self._channels = {cid: Channel(self, cid) for cid in self.peer.specs}

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

    # ------------------------------------------------------------------ internals

    def _notify(self) -> None:
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

    def _report(self, event: Discarded) -> None:
        frame = event.message.frame
        log.warning("channel_message_discarded", channel=event.message.channel)
        if self.on_discarded is not None and hasattr(frame, "payload"):
            self.on_discarded(event.message.channel, frame.payload)

    async def _reader(self) -> None:
        peer = self.peer
        while True:
            try:
                data = await self.session.receive()
            except Exception as exc:  # the session's own closed error, whatever its type
                self._closed(f"session closed: {exc}" if str(exc) else "session closed")
                return
            peer.receive(data)
            if peer.failure is not None:
                await self._protocol_error(peer.failure)
                return
            self._after_input()

    async def _writer(self) -> None:
        peer = self.peer
        while True:
            while not peer.has_output():
                if self.closed_reason is not None:
                    return
                self._waiting += 1
                await self._changed.wait()
            batch = peer.data_to_send(self.max_batch)
            if peer.events:
                self._after_input()
            self._notify()
            try:
                await self.session.send(batch)
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
    async with trio.open_nursery() as nursery:
        nursery.start_soon(channels._reader)
        nursery.start_soon(channels._writer)
        try:
            yield channels
        finally:
            nursery.cancel_scope.cancel()
            channels._closed("channels closed locally")


__all__ = ["Channel", "Channels", "ChannelsClosed", "SessionLike", "open_channels"]
