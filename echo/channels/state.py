"""The pure state of one peer of the resource-management note: the channels' declarations,
each direction's state per channel, the messages and handles, and the peer's tables
(`PeerState`), which `echo.channels.receiving`, `echo.channels.sending` and finally
`echo.channels.core.ChannelPeer` build on. No trio, no clock.
"""

from __future__ import annotations

import collections
import enum
from collections.abc import Iterable

import attrs

from echo.channels import wire
from echo.channels.wire import Bind, Data, FreeHandle, HandleRef

#: `_Incoming.low_water` of a channel without `max_message`: above any possible guarantee
_NO_LOW_WATER = 1 << 62


class ChannelUsageError(Exception):
    """A local misuse of the channel API (not a peer's fault)."""


class ChannelClosedError(ChannelUsageError):
    """The channel's bound (ours or the peer's) allows no more bytes."""


@attrs.frozen
class ChannelSpec:
    """One logical channel, the same declaration on both peers.

    capacity: this peer's receive buffer for it (bytes of encoded messages).
    priority: lower is more urgent, strictly (what this peer sends when back-pressured).
    weight:   share among channels of the same priority.
    handles:  the channel carries BindHandle messages; its id is the handle type.
    own_stream: the channel travels on a transport stream of its own (head-of-line isolation:
              a datagram lost on another channel's stream never delays it). Everything that
              concerns it (its messages, guarantees, pleas, bounds, drop notices, apologies)
              goes on that stream, so its ordering rules hold; it cannot be a handle channel
              nor carry handle references (a reference must never overtake its bind).
    max_message: the largest message (`wire.message_size`) either peer sends on it, when the
              application knows one (None: up to the capacity). Sending a larger one is a
              usage error. It lets a receiver whose buffer just emptied hold back guarantees
              while the sender still has at least this many: a sender can never be waiting
              for more, so they wait for a quarter of the buffer instead of going back one
              small control message per message processed (a lobby member answered each chat
              line it read with its own datagram to the server).
    """

    channel_id: int
    capacity: int = 64 * 1024
    priority: int = 0
    weight: int = 1
    handles: bool = False
    own_stream: bool = False
    max_message: int | None = None

    def __attrs_post_init__(self) -> None:
        if not 0 <= self.channel_id <= wire.MAX_VARINT:
            raise ChannelUsageError(f"channel id {self.channel_id} out of range")
        if self.capacity < 0 or self.weight < 1:
            raise ChannelUsageError("capacity must be >= 0 and weight >= 1")
        if self.own_stream and self.handles:
            raise ChannelUsageError("a handle channel travels on the session's own stream")
        if self.max_message is not None and self.max_message < 1:
            raise ChannelUsageError("max_message must be >= 1")


class OutState(enum.Enum):
    QUEUED = "queued"  # waiting for guarantees (or its turn) before going on the wire
    UNCONFIRMED = "unconfirmed"  # on the wire with optimistic bytes not yet covered
    SETTLED = "settled"  # covered by guarantees: it was (or will surely be) buffered
    DISCARDED = "discarded"  # referenced a handle whose bind was dropped (see module doc)


class Outgoing:
    """A message this peer sends, followed until it is settled.

    A plain slotted class, not attrs: one is made per message on the hot path. Its wire bytes
    are `header` + `body`: for a plain DATA frame the header is the kind, channel and length
    bytes and the body is the payload itself, so queueing a message copies nothing (the one copy
    is into the session message); every other frame is all header.
    """

    __slots__ = ("_frame", "body", "channel", "dep_failed", "deps", "handle", "header",
                 "optimistic", "payload", "refs", "size", "state", "transmissions", "uncovered",
                 "wire_len")

    def __init__(
        self,
        channel: int,
        header: bytes,
        body: bytes,
        size: int,
        optimistic: bool,
        *,
        frame: Data | Bind | None = None,
        handle: int | None = None,
    ) -> None:
        self.channel = channel
        self.header = header
        self.body = body
        self.wire_len = len(header) + len(body)
        self.size = size
        self.optimistic = optimistic
        self.state = OutState.QUEUED
        self.uncovered = 0
        self.transmissions = 0
        self._frame = frame
        if frame is None:
            self.refs: tuple[HandleRef, ...] = ()
            self.payload = body
        elif isinstance(frame, Data):
            self.refs = frame.refs
            self.payload = frame.payload
        else:
            self.refs = ()
            self.payload = frame.value
        self.handle = handle  # for a Bind: the handle it creates
        # Own handles it references whose binds were unconfirmed when it went out:
        # (handle_type, handle) -> the bind's Outgoing and its transmission count then.
        # None until the first such reference (most messages never have one).
        self.deps: dict[tuple[int, int], tuple[Outgoing, int]] | None = None
        self.dep_failed = False

    @property
    def frame(self) -> Data | Bind:
        """The record of this message (made on demand: plain messages go without one)."""
        if self._frame is None:
            self._frame = Data(self.channel, self.payload, self.refs)
        return self._frame

    def __repr__(self) -> str:
        return f"Outgoing({self.frame!r}, {self.state.value})"


class Delivery:
    """A buffered message handed to the application; `release` it when processed."""

    __slots__ = ("channel", "data", "refs", "released", "size")

    def __init__(self, channel: int, data: bytes, refs: tuple[HandleRef, ...], size: int) -> None:
        self.channel = channel
        self.data = data
        self.refs = refs
        self.size = size
        self.released = False

    def __repr__(self) -> str:
        return f"Delivery(channel={self.channel}, data={self.data!r}, refs={self.refs!r})"


@attrs.define
class _Handle:
    value: bytes
    size: int  # bytes of its BIND (server side), released when the binding is deleted
    refcount: int = 0  # buffered incoming messages that reference it
    out_refs: int = 0  # own unconfirmed outgoing messages that reference it
    bind: Outgoing | None = None  # own handles: the bind, until it is settled
    local_free: bool = False  # the application asked to free it
    sent_free: bool = False
    peer_freed: bool = False  # the peer's FREE_HANDLE arrived: it will not refer to it again


@attrs.define
class _Incoming:
    """The note's server side of one channel."""

    spec: ChannelSpec
    capacity: int
    target: int
    used: int = 0
    issuable: int = 0
    buffer: collections.deque[Delivery | Bind] = attrs.field(factory=collections.deque)
    bind_sizes: collections.deque[int] = attrs.field(factory=collections.deque)
    dropping: bool = False
    accepted: int = 0  # bytes buffered since the channel opened
    absolved: int = 0
    sending_bound: int | None = None  # the client's LIMIT_SENDING total
    receiving_bound: int | None = None  # our LIMIT_RECEIVING total
    # With an empty buffer, guarantees are topped up while the client holds fewer than this
    # (spec.max_message; without one, always: the client may wait for a message of any size).
    low_water: int = _NO_LOW_WATER

    @property
    def outstanding(self) -> int:
        """Guarantees the client holds (after everything in flight lands)."""
        return self.capacity - self.used - self.issuable


@attrs.define
class _Outgoing:
    """The note's client side of one channel."""

    spec: ChannelSpec
    guarantees: int = 0
    queue: collections.deque[Outgoing] = attrs.field(factory=collections.deque)
    unconfirmed: collections.deque[Outgoing] = attrs.field(factory=collections.deque)
    sent: int = 0  # bytes put on the wire and not refunded: pessimistically "accepted"
    absolved: int = 0
    sending_bound: int | None = None
    receiving_bound: int | None = None  # the server's LIMIT_RECEIVING total
    vtime: float = 0.0
    queued_bytes: int = 0
    stream: int = 0


@attrs.frozen
class Discarded:
    """Event: a message of ours referenced a handle whose bind was dropped; it was not processed."""

    message: Outgoing




class PeerState:
    """One peer's tables for every logical channel of one session: the specs, both directions'
    state per channel, the streams, the control queues, the handles, the counters."""

    def __init__(self, specs: Iterable[ChannelSpec], *, auto_issue: bool = True) -> None:
        specs = list(specs)
        self.auto_issue = auto_issue
        ids = [s.channel_id for s in specs]
        if len(set(ids)) != len(ids):
            raise ChannelUsageError("duplicate channel id")
        self.specs = {s.channel_id: s for s in specs}
        self.incoming = {s.channel_id: _Incoming(s, 0, s.capacity) for s in specs}
        for ch in self.incoming.values():
            if ch.spec.max_message is not None:
                ch.low_water = ch.spec.max_message
        self.outgoing = {s.channel_id: _Outgoing(s) for s in specs}
        # Stream 0 is the session's own; each own_stream channel gets the next, in id order
        # (both peers declare the same specs, so they agree on the numbering).
        self.stream_of = {s.channel_id: 0 for s in specs}
        for index, spec in enumerate(sorted((s for s in specs if s.own_stream),
                                            key=lambda s: s.channel_id)):
            self.stream_of[spec.channel_id] = index + 1
        self.streams = 1 + sum(1 for s in specs if s.own_stream)
        self._out_list = list(self.outgoing.values())
        # Channels compete (priority, then weight) only with those on the same stream.
        self._by_priority: dict[tuple[int, int], list[_Outgoing]] = collections.defaultdict(list)
        for out_ch in self._out_list:
            out_ch.stream = self.stream_of[out_ch.spec.channel_id]
            self._by_priority[(out_ch.stream, out_ch.spec.priority)].append(out_ch)
        #: control frames per stream; `control` is stream 0's
        self.controls: list[collections.deque[wire.Control]] = [
            collections.deque() for _ in range(self.streams)]
        self.control = self.controls[0]
        self.failure: str | None = None
        self.events: list[Discarded] = []
        # Messages covered on their own channel that wait to learn whether a bind they rely on
        # was dropped.
        self._waiting_deps: list[Outgoing] = []
        self.counters: collections.Counter[str] = collections.Counter()
        # Handles per type: created by us (the peer stores them) and by the peer (we store them).
        self.own: dict[int, dict[int, _Handle]] = {}
        self.theirs: dict[int, dict[int, _Handle]] = {}
        self.next_own: dict[int, int] = {}
        self.next_theirs: dict[int, int] = {}
        for s in specs:
            if s.handles:
                self.own[s.channel_id] = {}
                self.theirs[s.channel_id] = {}
                self.next_own[s.channel_id] = 0
                self.next_theirs[s.channel_id] = 0

    # ------------------------------------------------------------------ helpers

    def _in(self, channel: int) -> _Incoming:
        try:
            return self.incoming[channel]
        except KeyError:
            raise ChannelUsageError(f"unknown channel {channel}") from None

    def _out(self, channel: int) -> _Outgoing:
        try:
            return self.outgoing[channel]
        except KeyError:
            raise ChannelUsageError(f"unknown channel {channel}") from None

    def _ctl(self, frame: wire.Control) -> None:
        """Queue a control frame on the stream of the channel it concerns."""
        assert not isinstance(frame, FreeHandle)
        self.controls[self.stream_of[frame.channel]].append(frame)

    def _fail(self, reason: str) -> None:
        if self.failure is None:
            self.failure = reason
            self.counters["protocol_errors"] += 1




def _too_large(spec: ChannelSpec, size: int) -> None:
    raise ChannelUsageError(
        f"a message of {size} bytes on channel {spec.channel_id}, whose max_message is "
        f"{spec.max_message}")
