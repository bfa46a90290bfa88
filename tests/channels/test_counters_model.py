"""The channels' counters against what crossed the wire, under the accounting model's rules.

The counters are what an operator reads (`echo.ops` exports them): a counter that adds twice,
resets, or counts under the wrong name tells them a story that did not happen. This runs the
rules of test_bounds_model.BoundsModel (sends, guaranteed and optimistic, in any interleaving
with ABSOLVE, PLEAD, LIMIT_* and resizes) and checks, after every step, each peer's counters
against frames decoded from the session messages:

* `messages_sent`: DATA frames that left the peer (retransmissions included);
* `messages_received` + `messages_dropped`: DATA frames that reached it (each one is either
  buffered for the application or dropped while the channel is dropping or full);
* `guarantees_issued`: the bytes of every GUARANTEE it queued;
* `retransmissions`: messages re-queued after an ANNOUNCE_DROPPING; once quiet (and with no
  receiving bound holding them back), every one of them went out again (a DATA frame whose
  message id had been sent before);
* no `protocol_errors` and no names outside the documented set.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis.stateful import invariant

from echo.channels import wire
from echo.channels.wire import Data
from tests.channels.test_bounds_model import CHANNELS, BoundsModel

KNOWN = {
    "messages_sent",
    "messages_received",
    "messages_dropped",
    "messages_discarded",
    "messages_discarded_by_peer",
    "guarantees_issued",
    "retransmissions",
    "protocol_errors",
    "handles_deleted",
}


class CountersModel(BoundsModel):
    def __init__(self) -> None:
        super().__init__()
        self.data_sent = [0, 0]
        self.data_arrived = [0, 0]
        self.resent = [0, 0]
        self.ids_seen: set[tuple[int, int, bytes]] = set()

    def _transmit(self, p: int, stream: int, max_bytes: int) -> None:
        self._count_queued_grants(p)
        out = self.peers[p].data_to_send(max_bytes, stream)
        if not out:
            return
        self.pipes[(p, stream)].append(out)
        for frame in wire.decode_frames(out):
            if isinstance(frame, Data):
                self.data_sent[p] += 1
                key = (p, frame.channel, frame.payload[:4])
                if key in self.ids_seen:
                    self.resent[p] += 1
                self.ids_seen.add(key)

    def _deliver(self, p: int, stream: int) -> bool:
        pipe = self.pipes[(p, stream)]
        if pipe:
            frames = wire.decode_frames(pipe[0])
            self.data_arrived[1 - p] += sum(isinstance(f, Data) for f in frames)
        return super()._deliver(p, stream)

    @invariant()
    def check_counters(self) -> None:
        for p, peer in enumerate(self.peers):
            self._count_queued_grants(p)
            counters = peer.counters
            assert set(counters) <= KNOWN, set(counters) - KNOWN
            assert counters["protocol_errors"] == 0
            assert counters["messages_sent"] == self.data_sent[p]
            assert (
                counters["messages_received"] + counters["messages_dropped"] == self.data_arrived[p]
            )
            granted = sum(self.books[(1 - p, c)].granted for c in CHANNELS)
            assert counters["guarantees_issued"] == granted
            assert self.resent[p] <= counters["retransmissions"]
            assert counters["messages_discarded"] == counters["messages_discarded_by_peer"] == 0

    def teardown(self) -> None:
        super().teardown()
        self.check_counters()
        for p, peer in enumerate(self.peers):
            # quiet: every message that reached the application was counted once
            processed = sum(len(self.processed[(1 - p, c)]) for c in CHANNELS)
            assert peer.counters["messages_received"] == processed
            # a re-queued message went out again unless a receiving bound kept it back
            if all(self.books[(p, c)].receiving_bound is None for c in CHANNELS):
                assert peer.counters["retransmissions"] == self.resent[p]


CountersModel.TestCase.settings = settings(
    max_examples=30,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_counters_against_the_wire = CountersModel.TestCase
