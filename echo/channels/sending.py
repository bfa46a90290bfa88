"""The sending direction of a channel peer (the note's "client" side of each channel): it
spends guarantees, absolves, bounds what it sends, apologises and retransmits. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from echo.channels import wire
from echo.channels.receiving import ReceivingPeer
from echo.channels.state import (
    ChannelClosedError,
    ChannelUsageError,
    Discarded,
    Outgoing,
    OutState,
    _Handle,
    _Outgoing,
    _too_large,
)
from echo.channels.wire import (
    Absolve,
    AnnounceDropping,
    Apologise,
    Bind,
    Data,
    Guarantee,
    HandleRef,
    LimitReceiving,
    LimitSending,
    Plead,
)


class SendingPeer(ReceivingPeer):
    """The outgoing half of `ChannelPeer`."""

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

