"""A pure sender/receiver pair with a scripted clock and a hand-moved network (DESIGN.md §6.2).

Datagrams are moved by the test: each one passes through `fate(direction, index, data)`, which
returns how many copies arrive (0 = lost, 2 = duplicated); `reorder` shuffles each batch.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from echo.transport.counters import Counters
from echo.transport.flow_control import UnicastFlowControl
from echo.transport.receiver import ReceiveEndpoint, ReceiverTimers, StreamInterest
from echo.transport.sender import Publication, SendEndpoint, SenderTimers, SendMode

SENDER = ("10.0.0.1", 40000)
RECEIVER = ("10.0.0.2", 9000)
STREAM = 1001

Fate = Callable[[str, int, bytes], int]


def keep_all(direction: str, index: int, data: bytes) -> int:
    return 1


class Pair:
    def __init__(
        self,
        *,
        term_length: int = 64 * 1024,
        mtu: int = 1408,
        initial_term_id: int = 7,
        session_id: int = 42,
        fate: Fate = keep_all,
        reorder: random.Random | None = None,
        session_filter: int | None = None,
        rcv_wnd: int = 128 * 1024,
    ) -> None:
        self.now = 0.0
        self.counters_tx = Counters()
        self.counters_rx = Counters()
        self.fate = fate
        self.reorder = reorder
        self.sent: dict[str, int] = {"tx": 0, "rx": 0}
        self.wire: list[tuple[str, bytes]] = []  # everything sent, for assertions
        self.sender = SendEndpoint(
            mode=SendMode.UNICAST, counters=self.counters_tx, remote=RECEIVER
        )
        self.publication = Publication(
            session_id=session_id,
            stream_id=STREAM,
            initial_term_id=initial_term_id,
            term_length=term_length,
            mtu=mtu,
            flow_control=UnicastFlowControl(),
            counters=self.counters_tx,
            now=self.now,
            timers=SenderTimers(),
            max_retransmits=16,
        )
        self.sender.add(self.publication)
        self.receiver = ReceiveEndpoint(
            counters=self.counters_rx,
            receiver_id=99,
            now=self.now,
            timers=ReceiverTimers(),
            rng=random.Random(1),
            limit_amplification=False,
        )
        self.receiver.add_interest(
            StreamInterest(stream_id=STREAM, session_id=session_filter, rcv_wnd=rcv_wnd), self.now
        )
        self.to_rx: list[bytes] = []
        self.to_tx: list[bytes] = []
        self.delivered: list[bytes] = []

    # -- the network
    def _send_tx(self, data: bytes | memoryview, address: object) -> bool:
        self._carry("tx", bytes(data), self.to_rx)
        return True

    def _send_rx(self, data: bytes | memoryview, address: object) -> bool:
        self._carry("rx", bytes(data), self.to_tx)
        return True

    def _carry(self, direction: str, data: bytes, queue: list[bytes]) -> None:
        index = self.sent[direction]
        self.sent[direction] += 1
        self.wire.append((direction, data))
        queue.extend([data] * self.fate(direction, index, data))

    def step(self) -> None:
        """Poll both sides once and deliver what is on the wire."""
        self.sender.poll(self.now, self._send_tx)
        batch, self.to_rx = self.to_rx, []
        if self.reorder is not None:
            self.reorder.shuffle(batch)
        for data in batch:
            self.receiver.on_datagram(data, SENDER, self.now)
        self.receiver.poll(self.now, self._send_rx)
        for image in list(self.receiver.images.values()):
            image.poll_messages(self.delivered.append, 1000)
        self.receiver.poll(self.now, self._send_rx)
        batch, self.to_tx = self.to_tx, []
        if self.reorder is not None:
            self.reorder.shuffle(batch)
        for data in batch:
            self.sender.on_datagram(data, RECEIVER, self.now)

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.step()

    def run_until(self, predicate: Callable[[], bool], max_time: float = 60.0) -> None:
        end = self.now + max_time
        self.step()
        while not predicate():
            if self.now > end:
                raise AssertionError(f"not reached by t={self.now:.3f}")
            deadline = min(
                self.sender.next_deadline(self.now), self.receiver.next_deadline(self.now)
            )
            self.now = max(self.now + 0.0001, min(deadline, self.now + 0.05))
            self.step()

    def offer_all(self, messages: list[bytes], max_time: float = 120.0) -> None:
        """Offer every message (retrying as an application would) while the clock runs."""
        pending = list(messages)
        end = self.now + max_time
        while pending:
            result = self.publication.offer(pending[0], self.now)
            if result > 0 or result == -3:
                if result > 0:
                    pending.pop(0)
                continue
            if self.now > end:
                raise AssertionError(f"offer stuck with {len(pending)} left ({result})")
            self.now += 0.001
            self.step()
