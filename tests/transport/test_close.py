"""Nothing is lost in silence on close: what was offered is delivered or reported as failed."""

from __future__ import annotations

import random

import trio
import trio.testing

from echo.transport import open_transport
from echo.transport.testing import Link, MemoryNetwork

PORT = 40123  # any: the memory network has nothing else bound


async def test_close_delivers_everything_offered_even_with_loss(
    autojump_clock: trio.testing.MockClock,
) -> None:
    channel = f"aeron:udp?endpoint=127.0.0.1:{PORT}|term-length=1m"
    rng = random.Random(3)
    messages = [rng.randbytes(rng.randint(1, 3000)) for _ in range(1000)]
    net = MemoryNetwork(seed=5, link=Link(loss=0.2, delay=0.0005))
    async with (
        open_transport(socket_factory=net) as receiver_side,
        open_transport(socket_factory=net) as sender_side,
    ):
        sub = await receiver_side.add_subscription(channel, 1001)
        pub = await sender_side.add_publication(channel, 1001)
        await pub.wait_connected(timeout=5)
        received: list[bytes] = []

        async def consume() -> None:
            async for message in sub:
                received.append(message.data)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume)
            for message in messages:
                await pub.send(message, timeout=10)
            # Close at once, with much still in flight and some of it lost: close drains.
            with trio.fail_after(30):
                delivered = await pub.close()
            with trio.fail_after(10):
                while len(received) < len(messages):
                    await sub.wait_activity()
            nursery.cancel_scope.cancel()
        assert delivered is True
        assert received == messages


async def test_close_after_the_receiver_vanished_reports_failure(
    autojump_clock: trio.testing.MockClock,
) -> None:
    channel = f"aeron:udp?endpoint=127.0.0.1:{PORT}"
    net = MemoryNetwork()
    async with open_transport(socket_factory=net) as sender_side:
        pub = await sender_side.add_publication(channel, 1001)
        async with open_transport(socket_factory=net) as receiver_side:
            await receiver_side.add_subscription(channel, 1001)
            await pub.wait_connected(timeout=5)
            receiver_side._driver.close()  # gone without a word
        # Still "connected" for the 5 s connection timeout: the offer is accepted...
        assert pub.offer(b"into the void") > 0
        # ...but close does not pretend it arrived.
        started = trio.current_time()
        assert await pub.close(timeout=1.0) is False
        assert trio.current_time() - started == 1.0  # virtual time: exactly its timeout
