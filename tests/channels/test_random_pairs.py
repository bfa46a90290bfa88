"""Random interleavings of two symmetric peers with the channel invariants after every step."""

from __future__ import annotations

import collections
import struct

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from echo.channels.core import ChannelPeer, ChannelSpec, ChannelUsageError, Delivery
from echo.channels.wire import HandleRef

SPECS = [
    ChannelSpec(0, capacity=20),
    ChannelSpec(1, capacity=10, priority=1, weight=3),
    ChannelSpec(2, capacity=24, handles=True),
]
DATA_CHANNELS = (0, 1)
PEERS = st.sampled_from([0, 1])


class TwoPeers(RuleBasedStateMachine):
    specs = SPECS
    #: channels that carry data messages, and those of them that may carry handle references
    data_channels = DATA_CHANNELS
    ref_channels = DATA_CHANNELS

    def __init__(self) -> None:
        super().__init__()
        self.peers = [ChannelPeer(self.specs), ChannelPeer(self.specs)]
        self.streams = self.peers[0].streams
        # in_flight[(i, stream)]: messages from peer i to peer 1-i on one stream (a reliable,
        # ordered pipe each; the streams are independent of one another).
        self.in_flight: dict[tuple[int, int], collections.deque[bytes]] = {
            (p, k): collections.deque() for p in (0, 1) for k in range(self.streams)
        }
        self.next_id = 0
        self.sent: dict[tuple[int, int], list[int]] = collections.defaultdict(list)
        self.processed: dict[tuple[int, int], list[int]] = collections.defaultdict(list)
        self.discarded: set[int] = set()
        self.held: list[tuple[int, Delivery]] = []

    # ---------------------------------------------------------------- actions

    def _payload(self, size: int) -> tuple[int, bytes]:
        self.next_id += 1
        return self.next_id, struct.pack(">I", self.next_id) + bytes(size - 4)

    def _refs(self, p: int, data: st.DataObject, channel: int) -> list[HandleRef]:
        if channel not in self.ref_channels:
            return []
        peer = self.peers[p]
        usable = [
            HandleRef(2, h, True)
            for h, e in peer.own[2].items()
            if not (e.local_free or e.sent_free or e.peer_freed)
        ]
        usable += [
            HandleRef(2, h, False)
            for h, e in peer.theirs[2].items()
            if not (e.local_free or e.sent_free or e.peer_freed)
        ]
        if not usable or not data.draw(st.booleans()):
            return []
        return [data.draw(st.sampled_from(usable))]

    @rule(
        p=PEERS,
        channel=st.data(),
        size=st.integers(6, 12),
        optimistic=st.booleans(),
        data=st.data(),
    )
    def send(
        self, p: int, channel: st.DataObject | int, size: int, optimistic: bool, data: st.DataObject
    ) -> None:
        if not isinstance(channel, int):
            channel = channel.draw(st.sampled_from(self.data_channels))
        refs = self._refs(p, data, channel)
        ident, payload = self._payload(size - 2 * len(refs))
        self.peers[p].send(channel, payload, optimistic=optimistic, refs=refs)
        self.sent[(p, channel)].append(ident)

    @rule(p=PEERS, count=st.integers(1, 6), data=st.data())
    def burst(self, p: int, count: int, data: st.DataObject) -> None:
        """Optimistic messages straight onto the wire: the way buffers overflow."""
        channel = data.draw(st.sampled_from(self.data_channels))
        for _ in range(count):
            self.send(p, channel, data.draw(st.integers(6, 12)), True, data)
        self._transmit_all(p)

    @rule(p=PEERS, count=st.integers(1, 5), channel=st.sampled_from(DATA_CHANNELS))
    def bind_and_use(self, p: int, count: int, channel: int) -> None:
        """Optimistic binds and, at once, a message using the last: the note's optimistic
        reference, which the peer discards when that bind was dropped."""
        handles = [self.peers[p].bind(2, b"v" * 8, optimistic=True) for _ in range(count)]
        self._transmit_all(p)
        ident, payload = self._payload(8)
        ref = HandleRef(2, handles[-1], True)
        self.peers[p].send(channel, payload, optimistic=True, refs=[ref])
        self.sent[(p, channel)].append(ident)
        self._transmit_all(p)

    @rule(p=PEERS, size=st.integers(1, 8), optimistic=st.booleans())
    def bind(self, p: int, size: int, optimistic: bool) -> None:
        self.peers[p].bind(2, bytes([p]) * size, optimistic=optimistic)

    @rule(p=PEERS, mine=st.booleans(), data=st.data())
    def free(self, p: int, mine: bool, data: st.DataObject) -> None:
        table = (self.peers[p].own if mine else self.peers[p].theirs)[2]
        candidates = [h for h, e in table.items() if not e.local_free]
        if candidates:
            self.peers[p].free(2, data.draw(st.sampled_from(candidates)), mine=mine)

    @rule(p=PEERS, max_bytes=st.sampled_from([1, 8, 30, 1 << 16]), data=st.data())
    def transmit(self, p: int, max_bytes: int, data: st.DataObject) -> None:
        stream = data.draw(st.integers(0, self.streams - 1))
        out = self.peers[p].data_to_send(max_bytes, stream)
        if out:
            self.in_flight[(p, stream)].append(out)

    def _transmit_all(self, p: int) -> None:
        for stream in range(self.streams):
            out = self.peers[p].data_to_send(1 << 16, stream)
            if out:
                self.in_flight[(p, stream)].append(out)

    @rule(p=PEERS, data=st.data())
    def deliver(self, p: int, data: st.DataObject) -> None:
        stream = data.draw(st.integers(0, self.streams - 1))
        if self.in_flight[(p, stream)]:
            self.peers[1 - p].receive(self.in_flight[(p, stream)].popleft())
            self._collect_events()

    @rule(p=PEERS, channel=st.data(), hold=st.booleans())
    def process(self, p: int, channel: st.DataObject, hold: bool) -> None:
        channel = channel.draw(st.sampled_from(self.data_channels))
        delivery = self.peers[p].take(channel)
        if delivery is None:
            return
        self.processed[(1 - p, channel)].append(struct.unpack(">I", delivery.data[:4])[0])
        if hold:
            self.held.append((p, delivery))
        else:
            self.peers[p].release(delivery)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def release_held(self, data: st.DataObject) -> None:
        p, delivery = self.held.pop(data.draw(st.integers(0, len(self.held) - 1)))
        self.peers[p].release(delivery)

    @rule(p=PEERS)
    def process_binds(self, p: int) -> None:
        self.peers[p].process_binds(2)

    @rule(p=PEERS, channel=st.data(), capacity=st.integers(0, 60))
    def resize(self, p: int, channel: st.DataObject, capacity: int) -> None:
        self.peers[p].resize(channel.draw(st.sampled_from([*self.data_channels, 2])), capacity)

    @rule(p=PEERS, channel=st.data(), goal=st.integers(0, 20))
    def plead(self, p: int, channel: st.DataObject, goal: int) -> None:
        self.peers[p].plead(channel.draw(st.sampled_from([*self.data_channels, 2])), goal)

    @rule(p=PEERS, channel=st.data(), amount=st.integers(1, 10))
    def absolve(self, p: int, channel: st.DataObject, amount: int) -> None:
        channel = channel.draw(st.sampled_from(self.data_channels))
        try:
            self.peers[p].absolve(channel, amount)
        except ChannelUsageError:
            assert amount > self.peers[p].guarantees(channel)

    @rule()
    def quiesce(self) -> None:
        """Restore every buffer, drain everything, and compare the two peers' books."""
        for p in (0, 1):
            for channel, spec in ((s.channel_id, s) for s in self.specs):
                # Bindings hold their bytes until freed: room for every bind a run can make.
                self.peers[p].resize(channel, 10_000 if spec.handles else max(spec.capacity, 40))
        for _ in range(1000):
            for p, delivery in self.held:
                self.peers[p].release(delivery)
            self.held.clear()
            moved = False
            for p in (0, 1):
                for stream in range(self.streams):
                    queue = self.in_flight[(p, stream)]
                    while queue:
                        self.peers[1 - p].receive(queue.popleft())
                        moved = True
                    out = self.peers[p].data_to_send(1 << 16, stream)
                    if out:
                        queue.append(out)
                        moved = True
                self.peers[p].process_binds(2)
            self._collect_events()
            if not moved and not self._drain_buffers():
                break
        else:
            raise AssertionError("never quiescent")
        self.check_no_failure()
        for p in (0, 1):
            me, other = self.peers[p], self.peers[1 - p]
            for channel in (*self.data_channels, 2):
                out, inc = me.outgoing[channel], other.incoming[channel]
                assert not out.queue and not out.unconfirmed
                assert out.guarantees == inc.capacity - inc.used - inc.issuable, (p, channel)
            for channel in self.data_channels:
                expected = [i for i in self.sent[(p, channel)] if i not in self.discarded]
                assert self.processed[(p, channel)] == expected
            # Both sides hold the same bindings of the handles p created.
            assert set(me.own[2]) == set(other.theirs[2])
            # Every message the peer discarded for a dropped bind, p inferred, and no other.
            assert me.counters["messages_discarded_by_peer"] == other.counters["messages_discarded"]

    def teardown(self) -> None:
        self.quiesce()

    def _drain_buffers(self) -> bool:
        drained = False
        for p in (0, 1):
            for channel in self.data_channels:
                while (delivery := self.peers[p].take(channel)) is not None:
                    self.processed[(1 - p, channel)].append(
                        struct.unpack(">I", delivery.data[:4])[0]
                    )
                    self.peers[p].release(delivery)
                    drained = True
        return drained

    def _collect_events(self) -> None:
        for peer in self.peers:
            for event in peer.events:
                self.discarded.add(struct.unpack(">I", event.message.frame.payload[:4])[0])
            peer.events.clear()

    # ---------------------------------------------------------------- invariants

    @invariant()
    def check_no_failure(self) -> None:
        for peer in self.peers:
            assert peer.failure is None, peer.failure

    @invariant()
    def uncovered_bytes_match_the_deficit(self) -> None:
        for peer in self.peers:
            for ch in peer.outgoing.values():
                assert sum(o.uncovered for o in ch.unconfirmed) == max(0, -ch.guarantees)

    @invariant()
    def buffers_within_capacity(self) -> None:
        for peer in self.peers:
            for ch in peer.incoming.values():
                assert 0 <= ch.used <= ch.capacity
                assert ch.issuable >= 0

    @invariant()
    def processed_once_in_order(self) -> None:
        for key, ids in self.processed.items():
            assert ids == sorted(set(ids)), key
            assert set(ids) <= set(self.sent[key])
            assert not set(ids) & self.discarded

    @invariant()
    def handles_never_dangle(self) -> None:
        for p, delivery in self.held:
            for ref in delivery.refs:
                table = self.peers[p].theirs if ref.sender_created else self.peers[p].own
                entry = table[2].get(ref.handle)
                assert entry is not None and entry.refcount > 0
        for peer in self.peers:
            for table in (peer.own[2], peer.theirs[2]):
                for entry in table.values():
                    assert entry.refcount >= 0 and entry.out_refs >= 0


TwoPeers.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_two_peers = TwoPeers.TestCase


class TwoPeersTwoStreams(TwoPeers):
    """The same, with channel 3 on a stream of its own: its messages and control frames travel
    apart from stream 0's and overtake them, or fall behind, in any order."""

    specs = [*SPECS, ChannelSpec(3, capacity=16, priority=1, own_stream=True)]
    data_channels = (0, 1, 3)
    ref_channels = DATA_CHANNELS


TwoPeersTwoStreams.TestCase.settings = TwoPeers.TestCase.settings
test_two_peers_two_streams = TwoPeersTwoStreams.TestCase
