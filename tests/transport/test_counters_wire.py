"""Every frame counter counts datagrams that went on the wire, not attempts.

A dynamic-MDC publication makes a SETUP every 100 ms from the start, but until a receiver
registers it has nowhere to send it: counting the attempt gave setups_sent = 199 while 20
datagrams had left the socket. Here a recording `send` stands for the socket; every counter
must equal what it recorded, with no destination, one, two, and sends that fail.
"""

from __future__ import annotations

import collections

from echo.transport.core.counters import Counters
from echo.transport.core.flow_control import MaxMulticastFlowControl
from echo.transport.core.frames import (
    SM_SETUP_FLAG,
    DataHeader,
    FrameType,
    Setup,
    StatusMessage,
    parse_datagram_untrusted,
)
from echo.transport.core.sender import WOULD_BLOCK, NetworkPublication, SendEndpoint, SendMode

STREAM = 1001
SESSION = 31


class Wire:
    """The socket: records what leaves, or fails (an error loses the datagram)."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, object]] = []
        self.failing = False
        self.blocked = False

    def send(self, datagram: bytes | memoryview, address: object, segment: int = 0) -> int:
        assert not segment
        if self.blocked:
            return WOULD_BLOCK
        if self.failing:
            return 0
        self.sent.append((bytes(datagram), address))
        return 1

    def kinds(self) -> collections.Counter[str]:
        counts: collections.Counter[str] = collections.Counter()
        for datagram, _ in self.sent:
            frame = parse_datagram_untrusted(datagram)
            if isinstance(frame, Setup):
                counts["setup"] += 1
            elif isinstance(frame, DataHeader) and frame.is_heartbeat:
                counts["heartbeat"] += 1
            elif isinstance(frame, DataHeader) and frame.type == FrameType.DATA:
                counts["data"] += 1
        return counts


def registration(receiver_id: int) -> bytes:
    return StatusMessage(
        session_id=0,
        stream_id=0,
        consumption_term_id=0,
        consumption_term_offset=0,
        receiver_window=0,
        receiver_id=receiver_id,
        flags=SM_SETUP_FLAG,
    ).encode()


def status(receiver_id: int) -> bytes:
    return StatusMessage(
        session_id=SESSION,
        stream_id=STREAM,
        consumption_term_id=0,
        consumption_term_offset=0,
        receiver_window=1 << 16,
        receiver_id=receiver_id,
    ).encode()


def test_frame_counters_equal_the_datagrams_that_left() -> None:
    counters = Counters()
    endpoint = SendEndpoint(mode=SendMode.DYNAMIC, counters=counters)
    publication = NetworkPublication(
        session_id=SESSION,
        stream_id=STREAM,
        initial_term_id=0,
        term_length=1 << 16,
        mtu=1408,
        flow_control=MaxMulticastFlowControl(),
        counters=counters,
        now=0.0,
    )
    endpoint.add(publication)
    wire = Wire()

    def run(start: float, seconds: float) -> float:
        now = start
        while now < start + seconds:
            endpoint.poll(now, wire.send)
            now = round(now + 0.01, 6)
        return now

    def check() -> None:
        kinds = wire.kinds()
        assert counters.setups_sent == kinds["setup"]
        assert counters.heartbeats_sent == kinds["heartbeat"]
        assert counters.data_frames_sent == kinds["data"]

    # Two seconds with nobody registered: twenty SETUP rounds, not one datagram.
    now = run(0.0, 2.0)
    assert wire.sent == []
    assert counters.setups_sent == 0
    check()

    # A send error loses the datagram: nothing on the wire, nothing counted.
    endpoint.on_datagram(registration(1), ("10.0.0.1", 4000), now)
    wire.failing = True
    now = run(now, 0.5)
    assert counters.setups_sent == 0
    wire.failing = False

    # Two destinations: the newcomer's own SETUP at once, then each round is two datagrams.
    endpoint.on_datagram(registration(2), ("10.0.0.2", 4000), now)
    now = run(now, 0.15)
    assert counters.setups_sent >= 3
    assert {address for _, address in wire.sent} == {("10.0.0.1", 4000), ("10.0.0.2", 4000)}
    check()
    for receiver_id, host in ((1, "10.0.0.1"), (2, "10.0.0.2")):
        endpoint.on_datagram(status(receiver_id), (host, 4000), now)
    assert publication.offer(b"x" * 100, now) > 0
    assert publication.offer(b"y" * 3000, now) > 0  # three datagrams
    now = run(now, 0.5)
    assert counters.data_frames_sent == 2 * 4  # four datagrams to each of two destinations
    assert counters.heartbeats_sent >= 2 * 4  # heartbeats every 100 ms, to both
    check()

    # A full socket buffer sends nothing and counts nothing; the retry does both.
    assert publication.offer(b"z" * 100, now) > 0
    wire.blocked = True
    now = run(now, 0.05)
    assert counters.data_frames_sent == 8
    wire.blocked = False
    now = run(now, 0.05)
    assert counters.data_frames_sent == 10
    check()
