"""The receiving direction of a channel peer (the note's "server" side of each channel): it
buffers, issues guarantees, pleads, bounds what it accepts, drops and announces; and the data
handles both directions share (binds, references, the three-step FREE_HANDLE). Pure.
"""

from __future__ import annotations

from echo.channels.state import ChannelUsageError, Delivery, PeerState, _Handle, _Incoming
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


class ReceivingPeer(PeerState):
    """The incoming half of `ChannelPeer`, and the handles."""

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

