"""Nothing is lost in silence on close: what was offered is delivered or reported as failed."""

from __future__ import annotations

import random
import socket

import trio

from echo.transport import open_transport
from tests.transport.lossy import LossyNetwork


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_close_delivers_everything_offered_even_with_loss() -> None:
    port = free_port()
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}|term-length=1m"
    rng = random.Random(3)
    messages = [rng.randbytes(rng.randint(1, 3000)) for _ in range(1000)]
    async with (
        open_transport(socket_factory=LossyNetwork(0.2, seed=5)) as receiver_side,
        open_transport(socket_factory=LossyNetwork(0.2, seed=6)) as sender_side,
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


async def test_close_after_the_receiver_vanished_reports_failure() -> None:
    port = free_port()
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}"
    async with open_transport() as sender_side:
        pub = await sender_side.add_publication(channel, 1001)
        async with open_transport() as receiver_side:
            await receiver_side.add_subscription(channel, 1001)
            await pub.wait_connected(timeout=5)
            receiver_side._driver.close()  # gone without a word
        # Still "connected" for the 5 s connection timeout: the offer is accepted...
        assert pub.offer(b"into the void") > 0
        # ...but close does not pretend it arrived.
        with trio.fail_after(5):
            assert await pub.close(timeout=1.0) is False
