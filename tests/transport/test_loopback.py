"""The trio driver over real loopback sockets (DESIGN.md §6 layer 4)."""

from __future__ import annotations

import random
import socket
import struct

import pytest
import trio

from echo.transport import (
    NOT_CONNECTED,
    Image,
    SendError,
    TransportConfig,
    UriError,
    open_transport,
)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_ten_thousand_messages_of_random_sizes_with_20_percent_loss() -> None:
    port = free_port()
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}|term-length=1m"
    rng = random.Random(11)
    messages = [rng.randbytes(rng.randint(1, 8192)) for _ in range(10_000)]
    config = TransportConfig(test_receive_loss=0.2, seed=3)
    async with open_transport(config) as rx, open_transport(config) as tx:
        sub = await rx.add_subscription(channel, 1001)
        pub = await tx.add_publication(channel, 1001)
        await pub.wait_connected(timeout=10)

        async def produce() -> None:
            for message in messages:
                await pub.send(message, timeout=30)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(produce)
            for index, expected in enumerate(messages):
                with trio.fail_after(30):
                    message = await sub.receive()
                assert message.data == expected, index
        assert rx.counters.dropped_by_test_loss > 0.15 * rx.counters.datagrams_received
        assert rx.counters.naks_sent > 0 and tx.counters.retransmits_sent > 0


async def test_term_rotation_and_term_id_wrap_over_real_sockets() -> None:
    port = free_port()
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}|term-length=64k|init-term-id=2147483646"
    async with open_transport() as transport:
        sub = await transport.add_subscription(channel, 1001)
        pub = await transport.add_publication(channel, 1001)
        await pub.wait_connected(timeout=5)
        count = 200  # 200 x ~4 KiB = 12 terms of 64 KiB: the term id wraps past 2^31 - 1

        async def produce() -> None:
            for i in range(count):
                await pub.send(struct.pack("<I", i) + bytes(4000), timeout=5)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(produce)
            for i in range(count):
                with trio.fail_after(5):
                    assert struct.unpack_from("<I", (await sub.receive()).data)[0] == i
        assert pub.position > 11 * 64 * 1024
        assert pub._state.active_term_id < 0  # wrapped


async def test_send_without_a_receiver_raises_not_connected() -> None:
    async with open_transport() as transport:
        pub = await transport.add_publication(f"aeron:udp?endpoint=127.0.0.1:{free_port()}", 1)
        assert pub.offer(b"x") == NOT_CONNECTED
        with pytest.raises(SendError) as error:
            await pub.send(b"x", timeout=0.2)
        assert error.value.code == NOT_CONNECTED and error.value.name == "NOT_CONNECTED"
        with pytest.raises(TimeoutError, match="not connected"):
            await pub.wait_connected(timeout=0.2)


async def test_too_long_a_message_and_bad_uris_are_refused_clearly() -> None:
    async with open_transport() as transport:
        pub = await transport.add_publication(
            f"aeron:udp?endpoint=127.0.0.1:{free_port()}|term-length=64k", 1
        )
        with pytest.raises(ValueError, match="maximum message length"):
            pub.offer(bytes(8193))
        with pytest.raises(UriError, match="term-length"):
            await transport.add_publication("aeron:udp?endpoint=127.0.0.1:9|term-length=1000", 1)


async def test_garbage_on_every_socket_is_counted_and_the_stream_goes_on() -> None:
    port = free_port()
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}"
    async with open_transport() as transport:
        sub = await transport.add_subscription(channel, 1001)
        pub = await transport.add_publication(channel, 1001)
        await pub.wait_connected(timeout=5)
        pub_port = int(pub.local_address.rsplit(":", 1)[1])
        rng = random.Random(1)
        junk = [rng.randbytes(rng.randrange(0, 100)) for _ in range(300)]
        junk += [struct.pack("<iBBH", 2**31 - 1, 0, 0xC0, 1) + bytes(24)] * 10
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as attacker:
            for datagram in junk:
                attacker.sendto(datagram, ("127.0.0.1", port))
                attacker.sendto(datagram, ("127.0.0.1", pub_port))
        await pub.send(b"still here")
        with trio.fail_after(5):
            assert (await sub.receive()).data == b"still here"
        assert transport.counters.invalid_frames >= 500


async def test_image_callbacks_and_two_publishers() -> None:
    port = free_port()
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}"
    seen: list[tuple[str, Image]] = []
    async with open_transport() as rx, open_transport() as tx:
        sub = await rx.add_subscription(
            channel,
            1001,
            on_image_available=lambda image: seen.append(("up", image)),
            on_image_unavailable=lambda image: seen.append(("down", image)),
        )
        first = await tx.add_publication(channel, 1001)
        second = await tx.add_publication(channel, 1001)
        await first.wait_connected(timeout=5)
        await second.wait_connected(timeout=5)
        assert first.session_id != second.session_id
        assert {image.session_id for image in sub.images} == {first.session_id, second.session_id}
        await first.send(b"one")
        with trio.fail_after(5):
            message = await sub.receive()
        assert message.session_id == first.session_id and message.source.startswith("127.0.0.1:")
        assert await first.close() is True
        with trio.fail_after(5):
            while len([kind for kind, _ in seen if kind == "down"]) < 1:
                await sub.wait_activity()
        down = [image for kind, image in seen if kind == "down"]
        assert down[0].session_id == first.session_id and down[0].close_reason == "end_of_stream"
