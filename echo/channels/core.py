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

import math
from collections.abc import Iterable

from echo.channels import wire
from echo.channels.sending import SendingPeer
from echo.channels.state import (
    ChannelClosedError,
    ChannelSpec,
    ChannelUsageError,
    Delivery,
    Discarded,
    Outgoing,
    OutState,
    _Outgoing,
)
from echo.channels.wire import (
    Absolve,
    AnnounceDropping,
    Apologise,
    Bind,
    Data,
    FreeHandle,
    Guarantee,
    LimitReceiving,
    LimitSending,
    Plead,
)

#: The names users import from here (`echo.channels.state` defines the records).
__all__ = [
    "ChannelClosedError",
    "ChannelPeer",
    "ChannelSpec",
    "ChannelUsageError",
    "Delivery",
    "Discarded",
    "OutState",
    "Outgoing",
]


class ChannelPeer(SendingPeer):
    """One peer's state for every logical channel of one session."""

    def __init__(self, specs: Iterable[ChannelSpec], *, auto_issue: bool = True) -> None:
        """auto_issue=False: guarantees go out only through `issue` (and the cover that must
        precede an ANNOUNCE_DROPPING), which lets tests replay the note's diagrams step by step.
        """
        super().__init__(specs, auto_issue=auto_issue)
        # "Conceptually, the server begins by increasing its capacities from zero."
        for ch in self.incoming.values():
            self._grow(ch, ch.spec.capacity)

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
