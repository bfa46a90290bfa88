"""The pure core as a driver other than trio sees it (docs/architecture.md, "The transport's
seam"): a publication and a subscription driven only by the core's pull calls,
`datagrams_to_send(now)`, `handle_timer(now)`, `next_deadline(now)` and `next_event()`, with
`on_datagram(data, source, now)` the one way in. No trio, no socket, no clock: the test is the
driver and `now` is a float it moves."""

from __future__ import annotations

import math
import random

from echo.transport.core.counters import Counters
from echo.transport.core.flow_control import UnicastFlowControl
from echo.transport.core.frames import DataHeader, Setup, StatusMessage, parse_datagram_untrusted
from echo.transport.core.outbox import Outbox
from echo.transport.core.receiver import (
    ImageAvailable,
    ImageUnavailable,
    ReceiveEndpoint,
    StreamInterest,
)
from echo.transport.core.sender import NetworkPublication, SendEndpoint, SendMode

RECEIVER = ("10.0.0.2", 40124)
SENDER = ("10.0.0.1", 40123)
SESSION, STREAM = 7, 1001


class Core:
    """One sender core and one receiver core, carried across by hand."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sender = SendEndpoint(mode=SendMode.UNICAST, counters=Counters(), remote=RECEIVER)
        self.publication = NetworkPublication(
            session_id=SESSION,
            stream_id=STREAM,
            initial_term_id=0,
            term_length=64 * 1024,
            mtu=1408,
            flow_control=UnicastFlowControl(),
            counters=self.sender.counters,
            now=0.0,
        )
        self.sender.add(self.publication)
        self.receiver = ReceiveEndpoint(
            counters=Counters(), receiver_id=99, now=0.0, rng=random.Random(1)
        )
        self.receiver.add_interest(StreamInterest(stream_id=STREAM), 0.0)
        self.data: list[bytes] = []
        self.control: list[bytes] = []
        self.received: list[bytes] = []

    def exchange(self) -> int:
        """Each side's datagrams due now, carried to the other; how many moved."""
        moved = 0
        for datagram, address in self.sender.datagrams_to_send(self.now):
            assert address == RECEIVER and isinstance(datagram, bytes)
            self.data.append(datagram)
            self.receiver.on_datagram(datagram, SENDER, self.now)
            moved += 1
        for datagram, address in self.receiver.datagrams_to_send(self.now):
            assert address == SENDER and isinstance(datagram, bytes)
            self.control.append(datagram)
            self.sender.on_datagram(datagram, RECEIVER, self.now)
            moved += 1
        for image in self.receiver.images.values():
            image.poll_messages(self.received.append, 64)
            if image.status_message_due():
                self.receiver.touch(image.session_id, image.stream_id)
        return moved

    def run(self, until: float) -> None:
        """Exchange until quiet, then move `now` to the next deadline either side asks for."""
        while self.now < until:
            while self.exchange():
                pass
            deadline = min(
                self.sender.next_deadline(self.now), self.receiver.next_deadline(self.now)
            )
            self.now = min(until, max(deadline, self.now + 1e-4))


def test_two_cores_exchange_messages_through_the_pull_calls_alone() -> None:
    core = Core()
    core.run(until=0.05)  # SETUP, the first SM: the image is there, the publication connected
    assert core.receiver.has_events
    available = core.receiver.next_event()
    assert isinstance(available, ImageAvailable) and available.image.session_id == SESSION
    assert core.receiver.next_event() is None  # taken: the core forgets it
    assert core.publication.is_connected(core.now)
    messages = [bytes([i]) * (100 + i) for i in range(50)]
    for message in messages:
        assert core.publication.offer(message, core.now) > 0
    core.run(until=core.now + 0.05)
    assert core.received == messages
    # What went over the wire is Aeron's: data frames one way, status messages the other.
    kinds = {type(parse_datagram_untrusted(d)) for d in core.data}
    assert DataHeader in kinds and Setup in kinds
    assert {type(parse_datagram_untrusted(d)) for d in core.control} == {StatusMessage}


def test_handle_timer_queues_and_datagrams_to_send_hands_them_over_once() -> None:
    core = Core()
    # At 0 the publication owes its SETUP: the timer queues it, the next call hands it over
    # (with anything else due by then), and the one after has nothing left.
    core.sender.handle_timer(0.0)
    first = core.sender.datagrams_to_send(0.0)
    assert len(first) == 1
    assert list(core.sender.datagrams_to_send(0.0)) == []
    # Nothing due before the next deadline; at it, the SETUP is sent again (no SM came).
    deadline = core.sender.next_deadline(0.0)
    assert 0.0 < deadline < math.inf
    assert list(core.sender.datagrams_to_send(deadline - 1e-6)) == []
    assert [d for d, _ in core.sender.datagrams_to_send(deadline)] == [first[0][0]]


def test_image_events_come_out_once_each_in_order() -> None:
    core = Core()
    core.run(until=0.05)
    assert isinstance(core.receiver.next_event(), ImageAvailable)
    core.receiver.reject_image(SESSION, STREAM, core.now, Outbox().send)
    gone = core.receiver.take_events()
    assert [type(e) for e in gone] == [ImageUnavailable]
    assert not core.receiver.has_events
    assert core.receiver.take_events() == [] and core.receiver.next_event() is None


def test_the_outbox_copies_and_splits_runs() -> None:
    outbox = Outbox()
    term = bytearray(b"abcdefgh")
    assert outbox.send(memoryview(term)[:4], RECEIVER) == 1
    term[0:4] = b"XXXX"  # the term buffer is overwritten later: the queued copy is not
    assert outbox.send(memoryview(term)[4:], RECEIVER, segment=3) == 2  # a run: 3 + 1 bytes
    assert len(outbox) == 3
    assert outbox.take() == [(b"abcd", RECEIVER), (b"efg", RECEIVER), (b"h", RECEIVER)]
    assert outbox.take() == [] and len(outbox) == 0
