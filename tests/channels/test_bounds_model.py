"""The channels' accounting against a model, under ABSOLVE, PLEAD, LIMIT_SENDING,
LIMIT_RECEIVING, sends (guaranteed and optimistic), receives and resizes in any order.

The resource-management note's server keeps, per channel, a capacity C, used bytes U and
issuable space I; the client holds G guarantees. The model here does not read those books to
predict them: it counts what crossed the wire (every GUARANTEE, ABSOLVE, LIMIT_* frame, decoded
from the session messages the two peers exchange) and what the receiving application holds or
has taken, and after every step checks:

* the books: the server's accepted bytes are the bytes the application took plus those still
  buffered; its absolved bytes are the ABSOLVEs that arrived; its outstanding guarantees
  (C - U - I) are the GUARANTEEs it issued less what it accepted and was absolved of;
* a promise never exceeds the room: what is guaranteed fits the buffer (I >= 0, U <= C), and
  with a LIMIT_RECEIVING the guarantees ever issued, less absolutions, never pass the bound;
* the sender keeps its word: accepted + absolved never pass the LIMIT_SENDING that arrived;
* an honest peer is never failed (both peers here only use the API), whatever raced whom;
* once everything is delivered and processed, the client's G equals the server's C - U - I,
  and every message of a channel without a receiving bound was processed once, in order.
"""

from __future__ import annotations

import collections
import struct

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from echo.channels import wire
from echo.channels.core import ChannelClosedError, ChannelPeer, ChannelSpec, ChannelUsageError
from echo.channels.wire import Absolve, Guarantee, LimitSending

SPECS = [
    ChannelSpec(0, capacity=24),
    ChannelSpec(1, capacity=12, priority=1),
    ChannelSpec(2, capacity=16, own_stream=True),
]
CHANNELS = (0, 1, 2)
PEERS = st.sampled_from([0, 1])
CHANNEL = st.sampled_from(CHANNELS)


class Books:
    """What crossed the wire on one channel in one direction (client -> server), as counted
    from decoded frames: the server's GUARANTEEs issued (queued or sent), the client's
    ABSOLVEs that reached the server, and the last bounds each side announced."""

    def __init__(self) -> None:
        self.granted = 0
        self.absolved_arrived = 0
        self.sending_bound: int | None = None  # LIMIT_SENDING as the server received it
        self.receiving_bound: int | None = None  # LIMIT_RECEIVING as the server sent it
        self.taken = 0  # bytes the server's application took off the buffer


class BoundsModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.peers = [ChannelPeer(SPECS), ChannelPeer(SPECS)]
        self.streams = self.peers[0].streams
        self.pipes: dict[tuple[int, int], collections.deque[bytes]] = {
            (p, k): collections.deque() for p in (0, 1) for k in range(self.streams)
        }
        # books[(p, c)]: channel c from peer p (client) to peer 1-p (server)
        self.books = {(p, c): Books() for p in (0, 1) for c in CHANNELS}
        # GUARANTEE frames already counted (kept alive, so that their ids stay unique)
        self._seen: set[int] = set()
        self._kept: list[Guarantee] = []
        # The guarantees a server issued before the model saw them leave: its initial grant.
        for p in (0, 1):
            self._count_queued_grants(p)
        self.next_id = 0
        self.sent: dict[tuple[int, int], list[int]] = collections.defaultdict(list)
        self.processed: dict[tuple[int, int], list[int]] = collections.defaultdict(list)
        self.held: list[tuple[int, object]] = []

    # ------------------------------------------------------------ the wire, counted

    def _count_queued_grants(self, server: int) -> None:
        """GUARANTEE frames the server queued (issued) and the model has not yet counted."""
        for queue in self.peers[server].controls:
            for frame in queue:
                if isinstance(frame, Guarantee) and id(frame) not in self._seen:
                    self._seen.add(id(frame))
                    self._kept.append(frame)
                    self.books[(1 - server, frame.channel)].granted += frame.amount

    def _transmit(self, p: int, stream: int, max_bytes: int) -> None:
        self._count_queued_grants(p)
        out = self.peers[p].data_to_send(max_bytes, stream)
        if out:
            self.pipes[(p, stream)].append(out)

    def _deliver(self, p: int, stream: int) -> bool:
        """The next session message from p on `stream` reaches 1-p."""
        pipe = self.pipes[(p, stream)]
        if not pipe:
            return False
        data = pipe.popleft()
        for frame in wire.decode_frames(data):
            if isinstance(frame, Absolve):
                self.books[(p, frame.channel)].absolved_arrived += frame.amount
            elif isinstance(frame, LimitSending):
                self.books[(p, frame.channel)].sending_bound = frame.bound
        self.peers[1 - p].receive(data)
        self._count_queued_grants(1 - p)
        return True

    # ------------------------------------------------------------ rules

    @rule(p=PEERS, channel=CHANNEL, size=st.integers(1, 10), optimistic=st.booleans())
    def send(self, p: int, channel: int, size: int, optimistic: bool) -> None:
        self.next_id += 1
        payload = struct.pack(">I", self.next_id) + bytes(max(0, size - 4))
        try:
            self.peers[p].send(channel, payload, optimistic=optimistic)
        except ChannelClosedError:
            return  # past a bound: refused locally, nothing sent
        self.sent[(p, channel)].append(self.next_id)

    @rule(p=PEERS, stream=st.integers(0, 1), max_bytes=st.sampled_from([1, 12, 1 << 16]))
    def transmit(self, p: int, stream: int, max_bytes: int) -> None:
        self._transmit(p, stream, max_bytes)

    @rule(p=PEERS, stream=st.integers(0, 1))
    def deliver(self, p: int, stream: int) -> None:
        self._deliver(p, stream)

    @rule(p=PEERS, channel=CHANNEL, hold=st.booleans())
    def process(self, p: int, channel: int, hold: bool) -> None:
        delivery = self.peers[p].take(channel)
        if delivery is None:
            return
        self.books[(1 - p, channel)].taken += delivery.size
        self.processed[(1 - p, channel)].append(struct.unpack(">I", delivery.data[:4])[0])
        if hold:
            self.held.append((p, delivery))
        else:
            self.peers[p].release(delivery)
        self._count_queued_grants(p)

    @rule(data=st.data())
    def release_held(self, data: st.DataObject) -> None:
        if self.held:
            p, delivery = self.held.pop(data.draw(st.integers(0, len(self.held) - 1)))
            self.peers[p].release(delivery)  # type: ignore[arg-type]
            self._count_queued_grants(p)

    @rule(p=PEERS, channel=CHANNEL, amount=st.integers(1, 12))
    def absolve(self, p: int, channel: int, amount: int) -> None:
        """The client gives guarantees back (ABSOLVE), within what it holds."""
        amount = min(amount, self.peers[p].guarantees(channel))
        if amount <= 0:
            return
        try:
            self.peers[p].absolve(channel, amount)
        except ChannelClosedError:
            pass  # its own sending bound leaves no room for absolution

    @rule(p=PEERS, channel=CHANNEL, goal=st.integers(0, 20))
    def plead(self, p: int, channel: int, goal: int) -> None:
        """The server asks for guarantees back (PLEAD), down to `goal`."""
        self.peers[p].plead(channel, goal)
        self._count_queued_grants(p)

    @rule(p=PEERS, channel=CHANNEL, capacity=st.integers(0, 40))
    def resize(self, p: int, channel: int, capacity: int) -> None:
        self.peers[p].resize(channel, capacity)
        self._count_queued_grants(p)

    @rule(p=PEERS, channel=CHANNEL, more=st.integers(0, 40))
    def limit_sending(self, p: int, channel: int, more: int) -> None:
        """The client promises to send (and absolve) at most `more` further bytes."""
        try:
            self.peers[p].limit_sending(channel, more)
        except ChannelUsageError:
            assert self.peers[p].outgoing[channel].sending_bound is not None  # only tightens

    @rule(p=PEERS, channel=CHANNEL, more=st.integers(0, 40))
    def limit_receiving(self, p: int, channel: int, more: int) -> None:
        """The server promises to accept at most `more` further bytes (a LIMIT_RECEIVING)."""
        ch = self.peers[p].incoming[channel]
        books = self.books[(1 - p, channel)]
        # The bound is a total: what was accepted (taken or still buffered) plus `more`.
        accepted = books.taken + sum(d.size for d in ch.buffer)  # type: ignore[union-attr]
        try:
            self.peers[p].limit_receiving(channel, more)
        except ChannelUsageError:
            # Refused only to loosen a bound, or to go below what is already guaranteed.
            assert (
                books.receiving_bound is not None and accepted + more >= books.receiving_bound
            ) or more < books.granted - accepted - books.absolved_arrived
            return
        books.receiving_bound = accepted + more

    # ------------------------------------------------------------ invariants

    @invariant()
    def honest_peers_are_never_failed(self) -> None:
        for peer in self.peers:
            assert peer.failure is None, peer.failure

    @invariant()
    def the_books_match_the_wire(self) -> None:
        for (client, channel), books in self.books.items():
            server = self.peers[1 - client].incoming[channel]
            buffered = sum(d.size for d in server.buffer)  # type: ignore[union-attr]
            assert server.accepted == books.taken + buffered, (client, channel)
            assert server.absolved == books.absolved_arrived, (client, channel)
            outstanding = server.capacity - server.used - server.issuable
            assert outstanding == books.granted - server.accepted - server.absolved

    @invariant()
    def a_promise_never_exceeds_the_room(self) -> None:
        for (client, channel), books in self.books.items():
            server = self.peers[1 - client].incoming[channel]
            assert server.issuable >= 0 and 0 <= server.used <= server.capacity
            if books.receiving_bound is not None:
                assert books.granted - server.absolved <= books.receiving_bound, (client, channel)
            if books.sending_bound is not None:
                assert server.accepted + server.absolved <= books.sending_bound

    # ------------------------------------------------------------ the end

    def teardown(self) -> None:
        """Everything delivered and processed, buffers back: the two books agree."""
        for p in (0, 1):
            for channel in CHANNELS:
                self.peers[p].resize(channel, 40)
                self._count_queued_grants(p)
        for _ in range(1000):
            for p, delivery in self.held:
                self.peers[p].release(delivery)  # type: ignore[arg-type]
            self.held.clear()
            moved = False
            for p in (0, 1):
                for stream in range(self.streams):
                    self._transmit(p, stream, 1 << 16)
                    while self._deliver(p, stream):
                        moved = True
                for channel in CHANNELS:
                    while (delivery := self.peers[p].take(channel)) is not None:
                        self.books[(1 - p, channel)].taken += delivery.size
                        self.processed[(1 - p, channel)].append(
                            struct.unpack(">I", delivery.data[:4])[0]
                        )
                        self.peers[p].release(delivery)
                        moved = True
                self._count_queued_grants(p)
            if not moved:
                break
        else:
            raise AssertionError("never quiescent")
        self.honest_peers_are_never_failed()
        self.the_books_match_the_wire()
        self.a_promise_never_exceeds_the_room()
        for (client, channel), books in self.books.items():
            out = self.peers[client].outgoing[channel]
            server = self.peers[1 - client].incoming[channel]
            assert out.guarantees == server.capacity - server.used - server.issuable
            sent, done = self.sent[(client, channel)], self.processed[(client, channel)]
            assert done == sent[: len(done)], "processed once each, in order"
            if books.receiving_bound is None:
                assert done == sent, (client, channel)


BoundsModel.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_bounds_against_the_model = BoundsModel.TestCase
