"""Sessions for the channel tests and benchmark: anything with send/receive/close.

`pipe_pair`: an in-memory reliable ordered pipe with an optional one-way delay (modelled with
trio sleeps, so autojump_clock makes it exact). `transport_pair`: two echo.transport
publication/subscription pairs on loopback, one per direction, wrapped in the same shape (with
`loss`, each transport's sockets drop that fraction of what they receive, tests/transport/lossy.py;
Aeron repairs it).
"""

from __future__ import annotations

import contextlib
import math
import socket
from collections.abc import AsyncIterator

import trio

from echo.transport import Publication, Subscription, Transport, TransportConfig, open_transport
from tests.transport.lossy import LossyNetwork


class PipeClosed(Exception):
    """The stand-in for echo.session.SessionClosed."""


class PipeSession:
    def __init__(self, delay: float, substream_delay: float | None = None) -> None:
        self.delay = delay
        self.substream_delay = delay if substream_delay is None else substream_delay
        self.peer: PipeSession | None = None
        self._substreams: dict[int, PipeSession] = {}
        self._send, self._receive = trio.open_memory_channel[tuple[float, bytes | None, str]](
            math.inf
        )
        self.closed_reason: str | None = None
        self.sent_messages = 0

    async def send(self, data: bytes) -> None:
        if self.closed_reason is not None:
            raise PipeClosed(self.closed_reason)
        assert self.peer is not None
        self.sent_messages += 1
        self.peer._send.send_nowait((trio.current_time() + self.delay, bytes(data), ""))
        await trio.lowlevel.checkpoint()

    async def receive(self) -> bytes:
        if self.closed_reason is not None:
            raise PipeClosed(self.closed_reason)
        due, data, reason = await self._receive.receive()
        await trio.sleep_until(due)
        if data is None:
            self.closed_reason = reason
            raise PipeClosed(reason)
        return data

    async def close(self, reason: str = "") -> None:
        if self.closed_reason is None:
            self.closed_reason = reason
            assert self.peer is not None
            self.peer._send.send_nowait((trio.current_time() + self.delay, None, reason))
        await trio.lowlevel.checkpoint()

    @contextlib.asynccontextmanager
    async def open_substream(self, stream: int) -> AsyncIterator[PipeSession]:
        """Another independent pipe between the same two ends (ChannelSpec.own_stream)."""
        if stream not in self._substreams:
            assert self.peer is not None
            mine, theirs = pipe_pair(self.substream_delay)
            self._substreams[stream], self.peer._substreams[stream] = mine, theirs
        yield self._substreams[stream]


def pipe_pair(
    delay: float = 0.0, substream_delay: float | None = None
) -> tuple[PipeSession, PipeSession]:
    """Two ends of a pipe with `delay` one way; streams opened beside it (own_stream
    channels) have `substream_delay`, by default the same."""
    a, b = PipeSession(delay, substream_delay), PipeSession(delay, substream_delay)
    a.peer, b.peer = b, a
    return a, b


class TransportSession:
    """One direction out (a publication), one in (a subscription). `transport`,
    `publication` and `subscription` as echo.session.Session names them, so that channels
    with own streams open theirs beside it the same way."""

    def __init__(self, transport: Transport, pub: Publication, sub: Subscription) -> None:
        self.pub, self.sub = pub, sub
        self.transport, self.publication, self.subscription = transport, pub, sub
        self.closed_reason: str | None = None

    async def send(self, data: bytes) -> None:
        await self.pub.send(data, timeout=30)

    async def receive(self) -> bytes:
        if self.closed_reason is not None:
            raise PipeClosed(self.closed_reason)
        return bytes((await self.sub.receive()).data)

    async def close(self, reason: str = "") -> None:
        self.closed_reason = reason


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.asynccontextmanager
async def transport_pair(
    config: TransportConfig | None = None,
    stream_id: int = 0x2044F00C,
    *,
    loss: float = 0.0,
    seed: int = 0,
) -> AsyncIterator[tuple[TransportSession, TransportSession]]:
    config = config or TransportConfig()
    port_a, port_b = free_port(), free_port()
    uri_a = f"aeron:udp?endpoint=127.0.0.1:{port_a}"
    uri_b = f"aeron:udp?endpoint=127.0.0.1:{port_b}"
    async with (
        open_transport(config, socket_factory=LossyNetwork(loss, seed)) as ta,
        open_transport(config, socket_factory=LossyNetwork(loss, seed + 1)) as tb,
    ):
        sub_a = await ta.add_subscription(uri_a, stream_id)
        sub_b = await tb.add_subscription(uri_b, stream_id)
        pub_ab = await ta.add_publication(uri_b, stream_id)
        pub_ba = await tb.add_publication(uri_a, stream_id)
        await pub_ab.wait_connected(timeout=10)
        await pub_ba.wait_connected(timeout=10)
        yield TransportSession(ta, pub_ab, sub_a), TransportSession(tb, pub_ba, sub_b)
