"""The pure state machine of one peer of the resource-management note (logical channels,
guarantees, data handles: the note "Resource Management").

No trio, no clock: nothing in the protocol depends on time. The peer is symmetric: every
declared channel exists in both directions; for its *incoming* direction this peer is the note's
"server" (it buffers, issues guarantees, pleads, bounds what it accepts, drops and announces),
for its *outgoing* direction it is the "client" (it spends guarantees, absolves, bounds what it
sends, apologises, retransmits). A control message's kind says which direction it concerns
(GUARANTEE is always server -> client, ABSOLVE always client -> server, ...), so the wire needs
no role bit.

Feed the session's messages to `receive(data)`; take what to send with `data_to_send(max)`.
A peer violation sets `failure` (a sentence for the session's close reason) and the peer stops;
no exception escapes `receive`. Local misuse (an unknown channel, a bound that loosens) raises
`ChannelUsageError`.

Interpretations of the note (docs/channels.md repeats them):

* Sizes are `wire.message_size`: payload bytes (+2 per handle reference, at least 1).
* Server state per incoming channel: capacity C, buffered bytes U (including a message the
  application has taken but not yet released: "fully processed" means released), issuable I.
  The client's remaining guarantees G equal C - U - I once nothing is in flight; the tests
  check exactly this.
* A message is buffered when it fits in C - U (never partially) and the channel is not dropping;
  otherwise it is dropped and the channel drops everything until the APOLOGISE. Before the
  ANNOUNCE_DROPPING the server issues exactly the guarantees that cover the optimistic bytes it
  buffered (brings C-U-I up to 0), and no more: a larger grant could cover the dropped message
  in the client's first-in-first-out accounting and make it think the message arrived. Between
  the drop and the announce (one step here) nothing else is issued.
* The client keeps every message that is not fully covered by guarantees; on ANNOUNCE_DROPPING
  all of them were dropped: it refunds their full sizes, sends APOLOGISE, and retransmits them,
  in order, before anything newer on that channel; the retransmissions wait for guarantees
  (resent optimistically, a message too big for the buffer would loop forever).
  ANNOUNCE_DROPPING when nothing is uncovered means the server dropped a guaranteed message:
  a protocol error.
* Bounds are carried as absolute totals since the channel opened: LIMIT_SENDING(n) means
  "accepted bytes + absolved bytes will never exceed n", LIMIT_RECEIVING(n) "accepted bytes will
  never exceed n". This is the note's relative bound plus what was already counted, and it
  removes the ambiguity of bytes in flight when the bound is sent. Dropped bytes do not count
  (they are refunded, and retransmitted). "Strictly tightening" = a smaller total.
  A client estimates its usage pessimistically (bytes in flight count as accepted), so it never
  sends past the server's bound once it knows it; a message past its own sending bound is a
  protocol error, one past the receiving bound is dropped as an optimistic overflow (it may
  have crossed the LIMIT_RECEIVING on the wire; guarantees never pass the bound).
* Shrinking (`resize` down) first withdraws unissued space, then keeps released bytes out of
  the issuable pool, and pleads for the rest; an ABSOLVE beyond the shrink still wanted gives
  the surplus back as fresh issuable space.
* Data handles: a BIND is buffered on its handle type's channel and bound when the application
  (or a reference that needs it) processes it; its bytes stay used until the handle is deleted,
  so that channel's capacity bounds the memory of live bindings ("guarantees mean will be
  bound"). A reference to a handle above the highest bound first processes pending binds; if
  the handle is still unbound the message is discarded, counted as instantly processed (its
  bytes become issuable, so guarantees stay exact), and the client learns it from the bind
  channel's ANNOUNCE_DROPPING: it reports such a message as `discarded` (event) rather than
  retransmitting it, which would reorder its channel.
* A peer sends its FREE_HANDLE (proposal or confirmation) only once none of its own messages
  that reference the handle are still unconfirmed, so a retransmission can never refer to a
  handle after the peer promised not to. A binding is deleted when the peer's FREE_HANDLE has
  arrived, this peer's own has been sent, and no buffered message references it.
"""

from __future__ import annotations

import collections
import enum
import math
from collections.abc import Iterable, Sequence

import attrs

from echo.channels import wire
from echo.channels.wire import (
    Absolve,
    AnnounceDropping,
    Apologise,
    Bind,
    Data,
    FreeHandle,
    Guarantee,
    HandleRef,
    LimitReceiving,
    LimitSending,
    Plead,
)

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


class ChannelPeer:
    """One peer's state for every logical channel of one session."""

    def __init__(self, specs: Iterable[ChannelSpec], *, auto_issue: bool = True) -> None:
        """auto_issue=False: guarantees go out only through `issue` (and the cover that must
        precede an ANNOUNCE_DROPPING), which lets tests replay the note's diagrams step by step.
        """
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
        # "Conceptually, the server begins by increasing its capacities from zero."
        for ch in self.incoming.values():
            self._grow(ch, ch.spec.capacity)

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

    # ------------------------------------------------------------------ server side

    def _grow(self, ch: _Incoming, amount: int) -> None:
        ch.capacity += amount
        ch.issuable += amount
        self._issue(ch, force=True)

    def _issue(self, ch: _Incoming, force: bool = False, amount: int | None = None) -> None:
        """Send guarantees for issuable space, aggregated (the note allows occasional updates)."""
        if ch.dropping or ch.issuable <= 0 or (amount is None and not self.auto_issue):
            return
        amount = ch.issuable if amount is None else min(amount, ch.issuable)
        if ch.receiving_bound is not None:
            # Never promise more than the bound still lets us accept.
            amount = min(amount, ch.receiving_bound - ch.accepted - ch.outstanding)
        if amount <= 0:
            return
        if not force and amount * 4 < ch.capacity and (
            ch.buffer or ch.outstanding >= ch.low_water
        ):
            return  # more releases will follow, or the client cannot be short: aggregate
        ch.issuable -= amount
        self._ctl(Guarantee(ch.spec.channel_id, amount))
        self.counters["guarantees_issued"] += amount

    def _release_bytes(self, ch: _Incoming, size: int) -> None:
        ch.used -= size
        shrink = min(size, ch.capacity - ch.target) if ch.capacity > ch.target else 0
        # Processing without issuing guarantees shrinks the buffer (seed: "Processing a message
        # without issuing guarantees for it allows the server to shrink its buffer").
        ch.capacity -= shrink
        ch.issuable += size - shrink
        self._issue(ch)

    def issue(self, channel: int, amount: int | None = None) -> None:
        """Issue guarantees now (all issuable space, or `amount` of it)."""
        ch = self._in(channel)
        self._issue(ch, force=True, amount=ch.issuable if amount is None else amount)

    def resize(self, channel: int, capacity: int) -> None:
        """Set the receive buffer of `channel` to `capacity` bytes (grows now, shrinks as able)."""
        ch = self._in(channel)
        if capacity < 0:
            raise ChannelUsageError("capacity must be >= 0")
        ch.target = capacity
        if capacity >= ch.capacity:
            self._grow(ch, capacity - ch.capacity)
            return
        excess = ch.capacity - capacity
        withdrawn = min(excess, max(ch.issuable, 0))
        ch.capacity -= withdrawn
        ch.issuable -= withdrawn
        excess -= withdrawn
        # Buffered bytes shrink the buffer as they are processed; only the rest needs a plea
        # (seed: processing cannot shrink an empty buffer).
        excess -= ch.used
        if excess > 0 and ch.outstanding > 0:
            self._plead(ch, max(0, ch.outstanding - excess))

    def plead(self, channel: int, target: int) -> None:
        """Ask the client to absolve us down to `target` remaining guarantees.

        The buffer is meant to shrink by what we plead for: the capacity target drops by it, and
        whatever the client does not absolve is taken from processed messages later.
        """
        ch = self._in(channel)
        if target < 0:
            raise ChannelUsageError("target must be >= 0")
        ch.target = min(ch.target, ch.capacity - max(0, ch.outstanding - target))
        self._plead(ch, target)

    def _plead(self, ch: _Incoming, target: int) -> None:
        self._ctl(Plead(ch.spec.channel_id, target))

    def limit_receiving(self, channel: int, more: int) -> None:
        """Promise to accept at most `more` further bytes on `channel`."""
        ch = self._in(channel)
        bound = ch.accepted + more
        if ch.receiving_bound is not None and bound >= ch.receiving_bound:
            raise ChannelUsageError("a receiving bound may only tighten")
        if more < max(ch.outstanding, 0):
            raise ChannelUsageError(
                f"bound {more} is below the {ch.outstanding} bytes already guaranteed; plead first"
            )
        ch.receiving_bound = bound
        self._ctl(LimitReceiving(channel, bound))

    def take(self, channel: int) -> Delivery | None:
        """The next buffered message of `channel` (its bytes stay used until `release`)."""
        ch = self._in(channel)
        if ch.spec.handles:
            raise ChannelUsageError("a handle channel is read through process_binds")
        if not ch.buffer:
            return None
        item = ch.buffer.popleft()
        assert isinstance(item, Delivery)
        return item

    def release(self, delivery: Delivery) -> None:
        """The application has fully processed `delivery`: free its space and handle counts."""
        if delivery.released:
            return
        delivery.released = True
        ch = self.incoming[delivery.channel]
        size = delivery.size
        if ch.capacity == ch.target and not ch.dropping and self.auto_issue:
            # The common case of _release_bytes + _issue, inline: this runs once per message.
            ch.used -= size
            ch.issuable += size
            if ch.receiving_bound is None and (
                ch.issuable * 4 >= ch.capacity
                or (not ch.buffer and ch.capacity - ch.used - ch.issuable < ch.low_water)
            ):
                amount = ch.issuable
                ch.issuable = 0
                self._ctl(Guarantee(ch.spec.channel_id, amount))
                self.counters["guarantees_issued"] += amount
        else:
            self._release_bytes(ch, size)
        for ref in delivery.refs:
            table = self.theirs if ref.sender_created else self.own
            handle = table[ref.handle_type][ref.handle]
            handle.refcount -= 1
            # The sender's "created by me" is our "theirs" table.
            self._maybe_delete(ref.handle_type, not ref.sender_created, ref.handle)

    def pending_binds(self, handle_type: int) -> int:
        return len(self._in(handle_type).buffer)

    def process_binds(self, handle_type: int, limit: int | None = None) -> list[int]:
        """Bind pending BindHandle messages of `handle_type` in order; return the new handles."""
        ch = self._in(handle_type)
        if not ch.spec.handles:
            raise ChannelUsageError(f"channel {handle_type} carries no handles")
        bound: list[int] = []
        while ch.buffer and (limit is None or len(bound) < limit):
            item = ch.buffer.popleft()
            size = ch.bind_sizes.popleft()
            assert isinstance(item, Bind)
            handle = self.next_theirs[handle_type]
            self.next_theirs[handle_type] = handle + 1
            self.theirs[handle_type][handle] = _Handle(item.value, size)
            bound.append(handle)
        return bound

    def handle_value(self, handle_type: int, handle: int, *, mine: bool) -> bytes:
        table = (self.own if mine else self.theirs).get(handle_type)
        if table is None or handle not in table:
            raise ChannelUsageError(f"no handle {handle} of type {handle_type}")
        return table[handle].value

    def live_handles(self, handle_type: int, *, mine: bool) -> dict[int, bytes]:
        return {h: e.value for h, e in (self.own if mine else self.theirs)[handle_type].items()}

    def _on_channel_message(self, frame: Data | Bind, size: int) -> None:
        channel = frame.channel
        ch = self.incoming.get(channel)
        if ch is None:
            self._fail(f"message on unknown channel {channel}")
            return
        if isinstance(frame, Bind) != ch.spec.handles:
            self._fail(f"wrong message kind for channel {channel}")
            return
        if ch.dropping:
            self.counters["messages_dropped"] += 1
            return
        if ch.sending_bound is not None and ch.accepted + ch.absolved + size > ch.sending_bound:
            self._fail(f"message past the peer's own sending bound on channel {channel}")
            return
        past_bound = ch.receiving_bound is not None and ch.accepted + size > ch.receiving_bound
        if past_bound or size > ch.capacity - ch.used:
            # A guaranteed message always fits (C - U >= C - U - I); the server cannot tell a
            # guaranteed one from an optimistic one, the client checks (see _on_announce).
            # Never a partial message: drop it and everything until the apology.
            # Past our LIMIT_RECEIVING, too: guarantees never pass the bound (accepted +
            # outstanding <= bound), so such a message was sent optimistically, before the
            # client heard of the bound (it crossed the LIMIT_RECEIVING on the wire). An honest
            # client: dropped and announced as any optimistic overflow, never a failure; it
            # retransmits only under guarantees, which stay within the bound.
            self.counters["messages_dropped"] += 1
            ch.dropping = True
            cover = max(0, -ch.outstanding)
            if cover:
                ch.issuable -= cover
                self._ctl(Guarantee(channel, cover))
                self.counters["guarantees_issued"] += cover
            self._ctl(AnnounceDropping(channel))
            return
        ch.used += size
        ch.accepted += size
        if isinstance(frame, Bind):
            ch.buffer.append(frame)
            ch.bind_sizes.append(size)
            if ch.outstanding < 0:
                # An optimistic bind that fit: cover it now. Bind bytes are released only when
                # handles are deleted, so no later processing would trigger the guarantee.
                self._issue(ch, force=True)
            return
        for ref in frame.refs:
            verdict = self._check_ref(ref)
            if verdict is None:
                return  # failed
            if not verdict:
                # The bind it needs was dropped: discard, as processed at once.
                self.counters["messages_discarded"] += 1
                self._release_bytes(ch, size)
                return
        for ref in frame.refs:
            table = self.theirs if ref.sender_created else self.own
            table[ref.handle_type][ref.handle].refcount += 1
        ch.buffer.append(Delivery(channel, frame.payload, frame.refs, size))
        self.counters["messages_received"] += 1

    def _check_ref(self, ref: HandleRef) -> bool | None:
        """True: bound; False: its bind was dropped; None: a violation (failed)."""
        kind = ref.handle_type
        if kind not in self.own:
            self._fail(f"reference to unknown handle type {kind}")
            return None
        if ref.sender_created:
            table = self.theirs[kind]
            if ref.handle >= self.next_theirs[kind]:
                # Seed: process pending binds first; still unbound means the bind was dropped.
                self.process_binds(kind)
                if ref.handle >= self.next_theirs[kind]:
                    return False
        else:
            table = self.own[kind]
        entry = table.get(ref.handle)
        if entry is None or entry.peer_freed:
            self._fail(f"reference to freed or unknown handle {ref.handle} of type {kind}")
            return None
        return True

    def _on_absolve(self, frame: Absolve) -> None:
        ch = self.incoming.get(frame.channel)
        if ch is None:
            self._fail(f"ABSOLVE on unknown channel {frame.channel}")
            return
        if frame.amount > ch.outstanding:
            self._fail(f"ABSOLVE of {frame.amount} exceeds the {ch.outstanding} guaranteed")
            return
        ch.absolved += frame.amount
        if ch.sending_bound is not None and ch.accepted + ch.absolved > ch.sending_bound:
            self._fail(f"ABSOLVE past the peer's own sending bound on channel {frame.channel}")
            return
        ch.capacity -= frame.amount
        if ch.capacity < ch.target:
            self._grow(ch, ch.target - ch.capacity)  # absolved more than we still wanted

    def _on_limit_sending(self, frame: LimitSending) -> None:
        ch = self.incoming.get(frame.channel)
        if ch is None:
            self._fail(f"LIMIT_SENDING on unknown channel {frame.channel}")
            return
        if ch.sending_bound is not None and frame.bound >= ch.sending_bound:
            self._fail(f"LIMIT_SENDING on channel {frame.channel} loosens or repeats the bound")
            return
        if frame.bound < ch.accepted + ch.absolved:
            self._fail(f"LIMIT_SENDING on channel {frame.channel} below bytes already sent")
            return
        ch.sending_bound = frame.bound

    def _on_apologise(self, frame: Apologise) -> None:
        ch = self.incoming.get(frame.channel)
        if ch is None or not ch.dropping:
            self._fail(f"APOLOGISE on channel {frame.channel} that is not dropping")
            return
        ch.dropping = False
        self._issue(ch, force=True)

    # ------------------------------------------------------------------ client side

    def send(
        self,
        channel: int,
        payload: bytes,
        *,
        optimistic: bool = False,
        refs: Sequence[HandleRef] = (),
    ) -> Outgoing:
        """Queue a message. Non-optimistic ones wait for guarantees before going out."""
        ch = self.outgoing.get(channel)
        if ch is None:
            raise ChannelUsageError(f"unknown channel {channel}")
        if ch.spec.handles:
            raise ChannelUsageError("use bind() on a handle channel")
        if type(payload) is not bytes:
            payload = bytes(payload)
        if not refs:
            # The per-message path: no record, no copy of the payload.
            n = len(payload)
            if ch.spec.max_message is not None and n > ch.spec.max_message:
                _too_large(ch.spec, n)
            out = Outgoing(channel, wire.plain_header(channel, n), payload, n or 1, optimistic)
            if ch.sending_bound is not None or ch.receiving_bound is not None:
                self._check_sendable(ch, out.size)
            self._enqueue(ch, out)
            return out
        if ch.stream != 0:
            raise ChannelUsageError(
                f"channel {channel} has its own stream: its messages cannot refer to handles "
                "(a reference must never overtake its bind)")
        for ref in refs:
            entry = self._ref_entry(ref)
            if entry.local_free or entry.peer_freed or entry.sent_free:
                raise ChannelUsageError(f"handle {ref.handle} of type {ref.handle_type} is freed")
        frame = Data(channel, payload, tuple(refs))
        out = Outgoing(channel, wire.encode(frame), b"", wire.message_size(frame), optimistic,
                       frame=frame)
        if ch.spec.max_message is not None and out.size > ch.spec.max_message:
            _too_large(ch.spec, out.size)
        if ch.sending_bound is not None or ch.receiving_bound is not None:
            self._check_sendable(ch, out.size)
        for ref in refs:
            self._ref_entry(ref).out_refs += 1
        self._enqueue(ch, out)
        return out

    def withdraw(self, out: Outgoing) -> bool:
        """Take back a data message that has not gone out yet; False if it is too late.

        Binds cannot be withdrawn: the handle numbers after them are already promised.
        """
        ch = self._out(out.channel)
        if out.state is not OutState.QUEUED or out.handle is not None or out not in ch.queue:
            return False
        ch.queue.remove(out)
        ch.queued_bytes -= out.size
        self._drop_out_refs(out)
        return True

    def bind(self, handle_type: int, value: bytes, *, optimistic: bool = False) -> int:
        """Bind the next handle of `handle_type` to `value` on the peer; return it."""
        ch = self._out(handle_type)
        if not ch.spec.handles:
            raise ChannelUsageError(f"channel {handle_type} carries no handles")
        frame = Bind(handle_type, bytes(value))
        handle = self.next_own[handle_type]
        out = Outgoing(handle_type, wire.encode(frame), b"", wire.message_size(frame), optimistic,
                       frame=frame, handle=handle)
        if ch.spec.max_message is not None and out.size > ch.spec.max_message:
            _too_large(ch.spec, out.size)
        self._check_sendable(ch, out.size)
        self.next_own[handle_type] = handle + 1
        # The bind counts as a reference of its own handle until settled: no FREE before it.
        self.own[handle_type][handle] = _Handle(frame.value, out.size, out_refs=1, bind=out)
        self._enqueue(ch, out)
        return handle

    def _ref_entry(self, ref: HandleRef) -> _Handle:
        tables = self.own if ref.sender_created else self.theirs
        table = tables.get(ref.handle_type)
        entry = None if table is None else table.get(ref.handle)
        if entry is None:
            raise ChannelUsageError(f"no handle {ref.handle} of type {ref.handle_type}")
        return entry

    def _check_sendable(self, ch: _Outgoing, size: int) -> None:
        committed = ch.sent + ch.queued_bytes + size
        if (ch.sending_bound is not None and committed + ch.absolved > ch.sending_bound) or (
            ch.receiving_bound is not None and committed > ch.receiving_bound
        ):
            raise ChannelClosedError(f"channel {ch.spec.channel_id} is closed by a bound")

    def _enqueue(self, ch: _Outgoing, out: Outgoing) -> None:
        group = (ch.stream, ch.spec.priority)
        if not ch.queue and not ch.unconfirmed and len(self._by_priority[group]) > 1:
            # An idle channel joins at the current virtual time, with no saved-up credit.
            ch.vtime = max(ch.vtime, self._min_vtime(group))
        ch.queue.append(out)
        ch.queued_bytes += out.size

    def _min_vtime(self, group: tuple[int, int]) -> float:
        times = [c.vtime for c in self._by_priority[group] if c.queue]
        return min(times, default=0.0)

    def absolve(self, channel: int, amount: int) -> None:
        ch = self._out(channel)
        if not 0 < amount <= ch.guarantees:
            raise ChannelUsageError(f"can absolve 1..{ch.guarantees}, not {amount}")
        if ch.sending_bound is not None and (
            ch.sent + ch.queued_bytes + ch.absolved + amount > ch.sending_bound
        ):
            raise ChannelClosedError("absolution past our own sending bound")
        ch.guarantees -= amount
        ch.absolved += amount
        self._ctl(Absolve(channel, amount))

    def limit_sending(self, channel: int, more: int) -> None:
        """Promise to send (and absolve) at most `more` further bytes on `channel`."""
        ch = self._out(channel)
        bound = ch.sent + ch.absolved + ch.queued_bytes + more
        if ch.sending_bound is not None and bound >= ch.sending_bound:
            raise ChannelUsageError("a sending bound may only tighten")
        ch.sending_bound = bound
        self._ctl(LimitSending(channel, bound))

    def guarantees(self, channel: int) -> int:
        return self._out(channel).guarantees

    def closed_for_sending(self, channel: int) -> bool:
        ch = self._out(channel)
        committed = ch.sent + ch.queued_bytes
        return (ch.sending_bound is not None and committed + ch.absolved >= ch.sending_bound) or (
            ch.receiving_bound is not None and committed >= ch.receiving_bound
        )

    def finished_receiving(self, channel: int) -> bool:
        """The peer's sending bound is used up and nothing is left buffered."""
        ch = self._in(channel)
        return (ch.sending_bound is not None and ch.accepted + ch.absolved >= ch.sending_bound
                and not ch.buffer)

    def _on_guarantee(self, frame: Guarantee) -> None:
        ch = self.outgoing.get(frame.channel)
        if ch is None:
            self._fail(f"GUARANTEE on unknown channel {frame.channel}")
            return
        # The optimistic bytes not yet covered always total max(0, -guarantees) (asserted by
        # the random tests): no need to sum the queue, which grows with optimistic sending.
        total = max(0, -ch.guarantees)
        ch.guarantees += frame.amount
        cover = total - max(0, -ch.guarantees)
        while cover > 0 and ch.unconfirmed:
            head = ch.unconfirmed[0]
            take = min(cover, head.uncovered)
            head.uncovered -= take
            cover -= take
            if head.uncovered == 0:
                ch.unconfirmed.popleft()
                self._settle(head)

    def _on_announce(self, frame: AnnounceDropping) -> None:
        ch = self.outgoing.get(frame.channel)
        if ch is None:
            self._fail(f"ANNOUNCE_DROPPING on unknown channel {frame.channel}")
            return
        if not ch.unconfirmed:
            self._fail(f"ANNOUNCE_DROPPING on channel {frame.channel}: a guaranteed message "
                       "was dropped")
            return
        dropped = list(ch.unconfirmed)
        ch.unconfirmed.clear()
        for out in dropped:
            ch.guarantees += out.size
            ch.sent -= out.size
            ch.queued_bytes += out.size
            out.state = OutState.QUEUED
            out.uncovered = 0
            # The retransmission waits for guarantees: resent optimistically, a message that
            # cannot fit would be dropped, apologised for and resent without end.
            out.optimistic = False
            self.counters["retransmissions"] += 1
            out.deps = None  # recomputed when it goes out again
            out.dep_failed = False
            if out.handle is not None:
                self._bind_failed(frame.channel, out)
        ch.queue.extendleft(reversed(dropped))
        self._ctl(Apologise(frame.channel))

    def _bind_failed(self, handle_type: int, bind: Outgoing) -> None:
        """A dropped bind: every message that went out relying on this transmission is lost."""
        assert bind.handle is not None
        key = (handle_type, bind.handle)
        for ch in self.outgoing.values():
            for out in ch.unconfirmed:
                dep = None if out.deps is None else out.deps.get(key)
                if dep is not None and dep == (bind, bind.transmissions):
                    out.dep_failed = True
            for out in list(self._waiting_deps):
                dep = None if out.deps is None else out.deps.get(key)
                if dep is not None and dep == (bind, bind.transmissions):
                    self._waiting_deps.remove(out)
                    self._discard(out)

    def _settle(self, out: Outgoing) -> None:
        """Covered by guarantees: buffered for sure (or discarded for a dropped bind)."""
        if out.dep_failed:
            self._discard(out)
            return
        if out.deps and any(d[0].state != OutState.SETTLED for d in out.deps.values()):
            self._waiting_deps.append(out)
            return
        out.state = OutState.SETTLED
        self._drop_out_refs(out)
        if out.handle is not None:
            entry = self.own[out.channel][out.handle]
            entry.bind = None
            # Messages waiting on this bind are now known to be fine.
            key = (out.channel, out.handle)
            for waiting in list(self._waiting_deps):
                if waiting.deps is not None and key in waiting.deps:
                    del waiting.deps[key]
                    if not any(d[0].state != OutState.SETTLED for d in waiting.deps.values()):
                        self._waiting_deps.remove(waiting)
                        waiting.state = OutState.SETTLED
                        self._drop_out_refs(waiting)

    def _discard(self, out: Outgoing) -> None:
        out.state = OutState.DISCARDED
        self.counters["messages_discarded_by_peer"] += 1
        self._drop_out_refs(out)
        self.events.append(Discarded(out))

    def _drop_out_refs(self, out: Outgoing) -> None:
        if out.handle is not None:
            key_refs: tuple[HandleRef, ...] = (HandleRef(out.channel, out.handle, True),)
        else:
            key_refs = out.refs
        for ref in key_refs:
            tables = self.own if ref.sender_created else self.theirs
            entry = tables[ref.handle_type].get(ref.handle)
            if entry is not None:
                entry.out_refs -= 1
                self._maybe_send_free(ref.handle_type, ref.sender_created, ref.handle)

    def _on_limit_receiving(self, frame: LimitReceiving) -> None:
        ch = self.outgoing.get(frame.channel)
        if ch is None:
            self._fail(f"LIMIT_RECEIVING on unknown channel {frame.channel}")
            return
        if ch.receiving_bound is not None and frame.bound >= ch.receiving_bound:
            self._fail(f"LIMIT_RECEIVING on channel {frame.channel} loosens or repeats the bound")
            return
        ch.receiving_bound = frame.bound

    def _on_plead(self, frame: Plead) -> None:
        ch = self.outgoing.get(frame.channel)
        if ch is None:
            self._fail(f"PLEAD on unknown channel {frame.channel}")
            return
        # "If the client already has fewer guarantees ... it simply ignores the request."
        if ch.guarantees > frame.target:
            amount = ch.guarantees - frame.target
            if ch.sending_bound is not None:
                # Absolution counts against our own sending bound (the note): never past it.
                amount = min(amount, ch.sending_bound - ch.sent - ch.queued_bytes - ch.absolved)
            if amount <= 0:
                return
            ch.guarantees -= amount
            ch.absolved += amount
            self._ctl(Absolve(frame.channel, amount))

    # ------------------------------------------------------------------ handles

    def free(self, handle_type: int, handle: int, *, mine: bool) -> None:
        """Propose to free (or confirm freeing) a handle; we stop referring to it from now."""
        tables = self.own if mine else self.theirs
        table = tables.get(handle_type)
        entry = None if table is None else table.get(handle)
        if entry is None:
            raise ChannelUsageError(f"no handle {handle} of type {handle_type}")
        entry.local_free = True
        self._maybe_send_free(handle_type, mine, handle)

    def _maybe_send_free(self, handle_type: int, mine: bool, handle: int) -> None:
        entry = (self.own if mine else self.theirs)[handle_type].get(handle)
        if entry is None or entry.sent_free or not entry.local_free or entry.out_refs > 0:
            return
        entry.sent_free = True
        self.controls[0].append(FreeHandle(handle_type, handle, mine))
        self._maybe_delete(handle_type, mine, handle)

    def _maybe_delete(self, handle_type: int, mine: bool, handle: int) -> None:
        table = (self.own if mine else self.theirs)[handle_type]
        entry = table.get(handle)
        if entry is None:
            return
        if entry.peer_freed and entry.sent_free and entry.refcount == 0:
            del table[handle]
            self.counters["handles_deleted"] += 1
            if not mine:
                # The binding's memory is free: its bytes go back to the bind channel.
                self._release_bytes(self.incoming[handle_type], entry.size)

    def _on_free(self, frame: FreeHandle) -> None:
        kind = frame.handle_type
        if kind not in self.own:
            self._fail(f"FREE_HANDLE of unknown handle type {kind}")
            return
        # The sender's "mine" is our "theirs".
        mine = not frame.mine
        if not mine and frame.handle >= self.next_theirs[kind]:
            self.process_binds(kind)
        table = (self.own if mine else self.theirs)[kind]
        entry = table.get(frame.handle)
        if entry is None or entry.peer_freed:
            self._fail(f"FREE_HANDLE of unknown or already freed handle {frame.handle}")
            return
        entry.peer_freed = True
        entry.local_free = True  # a proposal is answered with our own FREE_HANDLE
        self._maybe_send_free(kind, mine, frame.handle)
        self._maybe_delete(kind, mine, frame.handle)

    # ------------------------------------------------------------------ I/O

    def receive(self, data: bytes) -> None:
        """Process one session message from the peer (untrusted bytes). Never raises.

        Frames are processed as they are parsed; a malformed frame stops the message there and
        fails the peer (the session closes, so what came before it no longer matters).
        """
        if self.failure is not None:
            return
        if not data:
            self._fail("malformed channel message: empty message")
            return
        raw = data if type(data) is bytes else bytes(data)
        incoming = self.incoming
        pos, end = 0, len(raw)
        fast = 0
        try:
            while pos < end:
                # The per-message path: a plain DATA frame with a one-byte channel and a one- or
                # two-byte length, buffered without making a record (wire.decode_frame's hot
                # path and _on_channel_message's common case, inline).
                if raw[pos] == 0x01 and pos + 3 < end:
                    channel = raw[pos + 1]
                    n = raw[pos + 2]
                    start = pos + 3
                    if n >= 0x80:
                        n2 = raw[start]
                        n = (n & 0x7F) | (n2 << 7) if n2 < 0x80 else end
                        start += 1
                    stop = start + n
                    ch = incoming.get(channel)
                    if (stop <= end and channel < 0x80 and ch is not None and not ch.dropping
                            and not ch.spec.handles and ch.sending_bound is None
                            and ch.receiving_bound is None
                            and (n or 1) <= ch.capacity - ch.used):
                        size = n or 1
                        ch.used += size
                        ch.accepted += size
                        ch.buffer.append(Delivery(channel, raw[start:stop], (), size))
                        fast += 1
                        pos = stop
                        continue
                frame, pos = wire.decode_frame(raw, pos)
                if isinstance(frame, tuple):
                    frame = Data(*frame)
                self._dispatch(frame)
                if self.failure is not None:
                    break
        except wire.WireError as exc:
            self._fail(f"malformed channel message: {exc}")
        self.counters["messages_received"] += fast

    def _dispatch(self, frame: wire.Frame) -> None:
        if isinstance(frame, Data | Bind):
            self._on_channel_message(frame, wire.message_size(frame))
        elif isinstance(frame, Guarantee):
            self._on_guarantee(frame)
        elif isinstance(frame, AnnounceDropping):
            self._on_announce(frame)
        elif isinstance(frame, Absolve):
            self._on_absolve(frame)
        elif isinstance(frame, Plead):
            self._on_plead(frame)
        elif isinstance(frame, LimitSending):
            self._on_limit_sending(frame)
        elif isinstance(frame, LimitReceiving):
            self._on_limit_receiving(frame)
        elif isinstance(frame, Apologise):
            self._on_apologise(frame)
        elif isinstance(frame, FreeHandle):
            self._on_free(frame)

    def has_output(self, stream: int | None = None) -> bool:
        """Something to send (on `stream`, or on any)."""
        if self.failure is not None:
            return False
        if stream is None:
            return any(self.controls) or any(self._eligible(ch) for ch in self._out_list)
        if self.controls[stream]:
            return True
        # A plain loop, empty queues skipped without a call: the trio layer asks this at every
        # change (a server's fan-out: once per message queued).
        for ch in self._out_list:
            if ch.queue and ch.stream == stream and self._eligible(ch):
                return True
        return False

    def _eligible(self, ch: _Outgoing) -> bool:
        if not ch.queue:
            return False
        head = ch.queue[0]
        if not head.optimistic and ch.guarantees < head.size:
            return False
        if head.refs:
            for ref in head.refs:
                if ref.sender_created:
                    bind = self.own[ref.handle_type][ref.handle].bind
                    # Never refer to a handle before its (re)transmitted bind is on the wire;
                    # a guaranteed message waits until the bind is sure to be bound, so that
                    # it can never be discarded for a dropped bind.
                    if bind is not None and (
                        bind.state == OutState.QUEUED
                        or (not head.optimistic and bind.state != OutState.SETTLED)
                    ):
                        return False
        return True

    def data_to_send(self, max_bytes: int = 64 * 1024, stream: int = 0) -> bytes:
        """The next message for `stream`: control first, then channel messages by
        priority/weight. Stream 0 is the session itself; see ChannelSpec.own_stream.

        Empty when there is nothing to send. At least one frame even if it exceeds max_bytes.
        """
        if self.failure is not None:
            return b""
        # The frames are gathered as a list of parts and joined once: the payload of a plain
        # message is copied exactly once on this side, into the session message.
        parts: list[bytes] = []
        length = 0
        control = self.controls[stream]
        while control and (not parts or length < max_bytes):
            frame = wire.encode(control.popleft())
            parts.append(frame)
            length += len(frame)
        while length < max_bytes:
            ch = self._pick(stream)
            if ch is None:
                break
            length = self._send_run(ch, parts, length, max_bytes)
            if length < 0:
                break
        return b"".join(parts)

    def _send_run(self, ch: _Outgoing, parts: list[bytes], length: int, max_bytes: int) -> int:
        """Put messages of `ch` into `parts` until another eligible channel of its priority is
        due (the same choice as picking per message, without the per-message scan), `ch` stalls
        or the session message is full. Returns the new length, -1 when full.
        """
        due = self._next_due(ch)
        queue = ch.queue
        unconfirmed = ch.unconfirmed
        weight = ch.spec.weight
        control = self.controls[ch.stream]
        append = parts.append
        plain_sent = 0
        while True:
            msg = queue[0]
            n = msg.wire_len
            if length and length + n > max_bytes:
                length = -1
                break
            queue.popleft()
            size = msg.size
            ch.queued_bytes -= size
            append(msg.header)
            append(msg.body)
            length += n
            if msg.refs or msg.handle is not None:
                self._transmitted(ch, msg)
                while control and length < max_bytes:
                    frame = wire.encode(control.popleft())
                    append(frame)
                    length += len(frame)
            else:
                # _transmitted for a message without handles, inline: this runs per message.
                before = ch.guarantees
                ch.guarantees = before - size
                ch.sent += size
                msg.transmissions += 1
                plain_sent += 1
                if before >= size:
                    msg.state = OutState.SETTLED
                else:
                    msg.uncovered = size - max(0, before)
                    msg.state = OutState.UNCONFIRMED
                    unconfirmed.append(msg)
            ch.vtime += size / weight
            if length >= max_bytes:
                length = -1
                break
            if ch.vtime > due or not queue:
                break
            head = queue[0]
            if not head.optimistic and ch.guarantees < head.size:
                break
            if head.refs and not self._eligible(ch):
                break
        if plain_sent:
            self.counters["messages_sent"] += plain_sent
        return length

    def _next_due(self, picked: _Outgoing) -> float:
        """The virtual time at which another eligible channel of the same priority is due."""
        due = math.inf
        for ch in self._by_priority[(picked.stream, picked.spec.priority)]:
            if ch is not picked and ch.vtime < due and self._eligible(ch):
                due = ch.vtime
        return due

    def _pick(self, stream: int = 0) -> _Outgoing | None:
        best: _Outgoing | None = None
        for ch in self._out_list:
            if ch.stream != stream or not self._eligible(ch):
                continue
            if best is None or (ch.spec.priority, ch.vtime) < (best.spec.priority, best.vtime):
                best = ch
        return best

    def _transmitted(self, ch: _Outgoing, msg: Outgoing) -> None:
        before = ch.guarantees
        ch.guarantees -= msg.size
        ch.sent += msg.size
        msg.transmissions += 1
        self.counters["messages_sent"] += 1
        if msg.handle is None and not msg.refs:
            if before >= msg.size:
                msg.state = OutState.SETTLED  # the common case: guaranteed, no handles
                return
        else:
            for ref in msg.refs:
                if ref.sender_created:
                    bind = self.own[ref.handle_type][ref.handle].bind
                    if bind is not None and bind.state != OutState.SETTLED:
                        if msg.deps is None:
                            msg.deps = {}
                        msg.deps[(ref.handle_type, ref.handle)] = (bind, bind.transmissions)
        msg.uncovered = msg.size - max(0, min(before, msg.size))
        if msg.uncovered:
            msg.state = OutState.UNCONFIRMED
            ch.unconfirmed.append(msg)
        else:
            self._settle(msg)


def _too_large(spec: ChannelSpec, size: int) -> None:
    raise ChannelUsageError(
        f"a message of {size} bytes on channel {spec.channel_id}, whose max_message is "
        f"{spec.max_message}")
