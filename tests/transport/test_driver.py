"""The trio driver through the public API (docs/architecture.md, Test layers): over real loopback
sockets where the kernel's part matters, over the in-memory network (echo.transport.testing) in
virtual time where it is timers and loss that are tested."""

from __future__ import annotations

import random
import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from echo.transport import (
    BACK_PRESSURED,
    NOT_CONNECTED,
    Image,
    Message,
    Publication,
    SendError,
    Subscription,
    open_transport,
)
from echo.transport.core.frames import (
    UNFRAGMENTED_FLAGS,
    DataHeader,
    Nak,
    Setup,
    StatusMessage,
)
from echo.transport.testing import Link, MemoryNetwork

STREAM = 1001
#: any port will do on a memory network: it has nothing else bound
VIRTUAL_PORT = 40123


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def channel(port: int, extra: str = "") -> str:
    return f"aeron:udp?endpoint=127.0.0.1:{port}" + (f"|{extra}" if extra else "")


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def sized(index: int, size: int, rng: random.Random) -> bytes:
    head = struct.pack("<II", index, size)[:size]
    return head + rng.randbytes(max(0, size - len(head)))


@asynccontextmanager
async def connected_pair(
    net: MemoryNetwork, uri: str
) -> AsyncIterator[tuple[Subscription, Publication]]:
    """A subscription and a connected publication of `uri`, each on its own transport of `net`."""
    async with (
        open_transport(socket_factory=net) as rx,
        open_transport(socket_factory=net) as tx,
    ):
        sub = await rx.add_subscription(uri, STREAM)
        pub = await tx.add_publication(uri, STREAM)
        await pub.wait_connected(timeout=5)
        yield sub, pub


async def collect(sub, count: int, into: list[Message]) -> None:  # type: ignore[no-untyped-def]
    async for message in sub:
        into.append(message)
        if len(into) >= count:
            return


async def test_basic_publish_subscribe() -> None:
    port = free_port()
    with trio.fail_after(10):
        async with open_transport() as transport:
            sub = await transport.add_subscription(channel(port), STREAM)
            pub = await transport.add_publication(channel(port), STREAM)
            await pub.wait_connected(timeout=5)
            assert pub.is_connected
            position = await pub.send(b"hello, echo")
            assert position == 64  # 32 + 11 bytes, aligned
            message = await sub.receive()
            assert message.data == b"hello, echo"
            assert message.session_id == pub.session_id
            assert message.stream_id == STREAM
            pub_port = port_of(pub.local_address)
            assert message.source == f"127.0.0.1:{pub_port}"
            assert (message.source_ip, message.source_port) == ("127.0.0.1", pub_port)
            (image,) = sub.images
            assert image.session_id == pub.session_id
            assert image.source_address == f"127.0.0.1:{pub_port}"
            # poll() is the non-blocking way in.
            for text in (b"a", b"b", b"c"):
                await pub.send(text)
            got: list[bytes] = []
            while len(got) < 3:
                if not sub.poll(lambda m: got.append(m.data)):
                    await sub.wait_activity()
            assert got == [b"a", b"b", b"c"]


async def test_ten_thousand_random_messages_with_20_percent_loss(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Exactly once and in order, 1 B .. 8 KiB, with 20 % of datagrams lost in both directions
    (data, SETUPs and heartbeats one way; SMs and NAKs the other)."""
    rng = random.Random(20261122)
    messages = [sized(i, rng.randint(1, 8192), rng) for i in range(10_000)]
    net = MemoryNetwork(seed=7, link=Link(loss=0.2))
    uri = channel(VIRTUAL_PORT, "term-length=1m")
    received: list[Message] = []
    started = trio.current_time()
    with trio.fail_after(120):
        async with (
            open_transport(socket_factory=net) as rx,
            open_transport(socket_factory=net) as tx,
        ):
            sub = await rx.add_subscription(uri, STREAM)
            pub = await tx.add_publication(uri, STREAM)
            await pub.wait_connected(timeout=5)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(collect, sub, len(messages), received)
                for data in messages:
                    await pub.send(data, timeout=10)
            elapsed = trio.current_time() - started
            rx_counters = rx.counters.snapshot()
            tx_counters = tx.counters.snapshot()
    print(
        f"\n10,000 messages ({sum(map(len, messages)) / 1e6:.1f} MB) at 20 % loss: "
        f"{elapsed:.2f} s virtual; naks sent {rx_counters['naks_sent']}, "
        f"retransmits {tx_counters['retransmits_sent']}"
    )
    assert len(received) == len(messages)
    for index, (want, have) in enumerate(zip(messages, received, strict=True)):
        assert have.data == want, f"message {index} differs"
    assert 0.18 < net.counters.lost / net.counters.sent < 0.22
    assert rx_counters["naks_sent"] > 0 and tx_counters["retransmits_sent"] > 0


@pytest.mark.parametrize("seed", [1, 2])
async def test_exactly_once_in_order_under_duplication_reordering_and_loss(
    autojump_clock: trio.testing.MockClock, seed: int
) -> None:
    """The network duplicates 10 %, holds 10 % back behind what follows and loses 5 %: the
    subscription still sees every message once, in order."""
    rng = random.Random(seed)
    messages = [sized(i, rng.randint(1, 3000), rng) for i in range(1500)]
    # (No jitter: every datagram due at its own instant costs a pass of trio's scheduler, and
    # the held-back ones already come after what was sent later.)
    net = MemoryNetwork(seed=seed, link=Link(loss=0.05, duplicate=0.1, reorder=0.1, delay=0.001))
    uri = channel(VIRTUAL_PORT, "term-length=64k")
    received: list[Message] = []
    with trio.fail_after(60):
        async with (
            open_transport(socket_factory=net) as rx,
            open_transport(socket_factory=net) as tx,
        ):
            sub = await rx.add_subscription(uri, STREAM)
            pub = await tx.add_publication(uri, STREAM)
            await pub.wait_connected(timeout=5)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(collect, sub, len(messages), received)
                for data in messages:
                    await pub.send(data, timeout=10)
            # Nothing more arrives once the stream is quiet: duplicates of delivered data and
            # late retransmits are recognised, never delivered twice.
            await trio.sleep(1.0)  # virtual: past every held-back and duplicated datagram
            assert sub.poll(received.append, fragment_limit=100) == 0
            assert rx.counters.invalid_by_reason["internal_error"] == 0
    assert [m.data for m in received] == messages
    assert net.counters.duplicated > 50 and net.counters.reordered > 50


async def test_term_rotation_and_term_id_wrap(autojump_clock: trio.testing.MockClock) -> None:
    rng = random.Random(5)
    messages = [sized(i, rng.randint(1, 8192), rng) for i in range(400)]
    uri = channel(VIRTUAL_PORT, "term-length=64k|init-term-id=2147483646")
    net = MemoryNetwork(seed=11, link=Link(loss=0.1))
    received: list[Message] = []
    with trio.fail_after(60):
        async with connected_pair(net, uri) as (sub, pub):
            assert pub.term_length == 65536 and pub.max_message_length == 8192
            async with trio.open_nursery() as nursery:
                nursery.start_soon(collect, sub, len(messages), received)
                for data in messages:
                    await pub.send(data, timeout=10)
            # ~1.6 MB through 64 KiB terms: the term id went 2^31-2, 2^31-1, -2^31, ...
            assert pub.position > 20 * 65536
            assert pub._channel.state.active_term_id < 0
    assert [m.data for m in received] == messages


async def test_offer_many_delivers_each_message_in_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rng = random.Random(3)
    uri = channel(VIRTUAL_PORT, "term-length=64k")
    net = MemoryNetwork(seed=5)
    batches = [[sized(b * 100 + i, rng.randint(1, 3000), rng) for i in range(50)] for b in range(8)]
    received: list[Message] = []
    with trio.fail_after(60):
        async with connected_pair(net, uri) as (sub, pub):
            assert pub.offer_many([]) == 0
            refused = 0
            async with trio.open_nursery() as nursery:
                nursery.start_soon(collect, sub, sum(map(len, batches)), received)
                for batch in batches:
                    left = batch
                    while left:
                        taken = pub.offer_many(left, flush=False)
                        left = left[taken:]
                        if left:  # refused (the window is full): offer says why, send waits
                            refused += 1
                            assert pub.offer(left[0]) == BACK_PRESSURED
                            await pub.send(left[0], timeout=10)
                            left = left[1:]
                    await trio.lowlevel.checkpoint()
    assert refused > 0  # ~75 KB a batch against a 32 KiB window
    assert [m.data for m in received] == [data for batch in batches for data in batch]
    assert {m.session_id for m in received} == {pub.session_id}


async def test_send_without_a_receiver_raises_not_connected(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(5):
        async with open_transport(socket_factory=MemoryNetwork()) as transport:
            pub = await transport.add_publication(channel(VIRTUAL_PORT), STREAM)
            assert pub.offer(b"x") == NOT_CONNECTED
            started = trio.current_time()
            with pytest.raises(SendError) as info:
                await pub.send(b"x", timeout=0.3)
            assert info.value.code == NOT_CONNECTED
            assert info.value.name == "NOT_CONNECTED"
            assert "NOT_CONNECTED" in str(info.value)
            # Virtual time: the give-up is at the timeout, not "some time after it".
            assert trio.current_time() - started == pytest.approx(0.3, abs=0.01)
            assert not pub.is_connected


async def test_wait_connected_times_out(autojump_clock: trio.testing.MockClock) -> None:
    with trio.fail_after(5):
        async with open_transport(socket_factory=MemoryNetwork()) as transport:
            pub = await transport.add_publication(channel(VIRTUAL_PORT), STREAM)
            started = trio.current_time()
            with pytest.raises(TimeoutError, match=r"not connected after 0\.2 s"):
                await pub.wait_connected(timeout=0.2)
            assert trio.current_time() - started == pytest.approx(0.2)


async def test_message_longer_than_the_maximum_is_refused() -> None:
    port = free_port()
    uri = channel(port, "term-length=64k")
    with trio.fail_after(10):
        async with open_transport() as transport:
            sub = await transport.add_subscription(uri, STREAM)
            pub = await transport.add_publication(uri, STREAM)
            await pub.wait_connected(timeout=5)
            assert pub.max_message_length == 8192
            with pytest.raises(ValueError, match="exceeds the maximum message length 8192"):
                pub.offer(bytes(8193))
            with pytest.raises(ValueError, match="exceeds the maximum message length"):
                await pub.send(bytes(10_000))
            await pub.send(bytes(8192))
            message = await sub.receive()
            assert message.data == bytes(8192)


def garbage(rng: random.Random, session_id: int) -> list[bytes]:
    data = DataHeader(64, UNFRAGMENTED_FLAGS, 0, session_id, STREAM, 0).encode() + bytes(32)
    sm = StatusMessage(session_id, STREAM, 0, 0, 1 << 20, 42).encode()
    nak = Nak(session_id, STREAM, 0, 0, 1024).encode()
    setup = Setup(0, 77, STREAM, 0, 0, 65536, 1408).encode()
    items = [
        b"",
        b"\x00",
        data[:31],
        data[:40],
        sm[:35],
        nak[:27],
        setup[:39],
        struct.pack("<i", 2**31 - 1) + data[4:],
        struct.pack("<i", 2**31 - 1) + sm[4:],
        struct.pack("<i", 2**31 - 1) + nak[4:],
        struct.pack("<i", 2**31 - 1) + setup[4:],
        data[:4] + b"\x09" + data[5:],  # bad version
    ]
    items += [bytes([1]) + rng.randbytes(rng.randint(0, 200)) for _ in range(40)]
    return items


async def test_garbage_datagrams_are_counted_and_the_stream_keeps_working() -> None:
    port = free_port()
    rng = random.Random(3)
    with trio.fail_after(15):
        async with open_transport() as rx, open_transport() as tx:
            sub = await rx.add_subscription(channel(port), STREAM)
            pub = await tx.add_publication(channel(port), STREAM)
            await pub.wait_connected(timeout=5)
            await pub.send(b"before")
            assert (await sub.receive()).data == b"before"
            junk = garbage(rng, pub.session_id)
            rx_before = rx.counters.invalid_frames
            tx_before = tx.counters.invalid_frames
            pub_port = port_of(pub.local_address)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as attacker:
                for datagram in junk:
                    attacker.sendto(datagram, ("127.0.0.1", port))
                    attacker.sendto(datagram, ("127.0.0.1", pub_port))
            expected = len(junk)
            # Loopback sendto has queued every datagram on both sockets by now: once every task
            # is blocked again, both readers have drained them.
            await trio.testing.wait_all_tasks_blocked(cushion=0.05)
            assert rx.counters.invalid_frames - rx_before == expected
            assert tx.counters.invalid_frames - tx_before == expected
            assert rx.counters.invalid_by_reason["internal_error"] == 0
            assert tx.counters.invalid_by_reason["internal_error"] == 0
            for i in range(50):
                await pub.send(b"after %d" % i)
            got = [(await sub.receive()).data for _ in range(50)]
            assert got == [b"after %d" % i for i in range(50)]
            assert pub.is_connected and len(sub.images) == 1


async def test_image_callbacks_fire_available_and_unavailable_at_eos() -> None:
    port = free_port()
    available: list[Image] = []
    unavailable: list[Image] = []
    went = trio.Event()

    def on_unavailable(image: Image) -> None:
        unavailable.append(image)
        went.set()

    with trio.fail_after(10):
        async with open_transport() as rx, open_transport() as tx:
            sub = await rx.add_subscription(
                channel(port),
                STREAM,
                on_image_available=available.append,
                on_image_unavailable=on_unavailable,
            )
            pub = await tx.add_publication(channel(port), STREAM)
            await pub.wait_connected(timeout=5)
            (image,) = available
            assert image.session_id == pub.session_id
            assert image.source_port == port_of(pub.local_address)
            await pub.send(b"last words")
            assert (await sub.receive()).data == b"last words"
            started = trio.current_time()
            assert await pub.close() is True
            await went.wait()
            # The receiver's EOS SM ended the linger early: far sooner than the 5 s linger.
            assert trio.current_time() - started < 2.0
            assert unavailable == [image]
            assert image.closed and image.close_reason == "end_of_stream"
            assert sub.images == []


async def test_two_publications_give_two_images_with_distinct_sessions() -> None:
    port = free_port()
    with trio.fail_after(10):
        async with open_transport() as rx, open_transport() as tx, open_transport() as tx2:
            sub = await rx.add_subscription(channel(port), STREAM)
            first = await tx.add_publication(channel(port), STREAM)
            second = await tx.add_publication(channel(port), STREAM)  # same socket
            third = await tx2.add_publication(channel(port), STREAM)  # another socket
            sessions = {first.session_id, second.session_id, third.session_id}
            assert len(sessions) == 3
            for pub in (first, second, third):
                await pub.wait_connected(timeout=5)
            assert {image.session_id for image in sub.images} == sessions
            for i in range(20):
                for pub in (first, second, third):
                    await pub.send(b"%d:%d" % (pub.session_id, i))
            got: dict[int, list[bytes]] = {s: [] for s in sessions}
            for _ in range(60):
                message = await sub.receive()
                got[message.session_id].append(message.data)
            for pub in (first, second, third):
                assert got[pub.session_id] == [b"%d:%d" % (pub.session_id, i) for i in range(20)]
            sources = {image.session_id: image.source_port for image in sub.images}
            assert sources[first.session_id] == sources[second.session_id]
            assert sources[third.session_id] != sources[first.session_id]


async def test_closed_streams_are_freed_without_the_cyclic_collector() -> None:
    # A server closes thousands of duologues: each closed endpoint's socket and term buffers
    # must go when the last reference does, not at a full collection 100-200 ms long.
    import gc
    import weakref

    from echo.transport.core.image import PublicationImage
    from echo.transport.core.publication import NetworkPublication

    def alive(kind: type) -> int:
        # The pure state may be compiled (mypyc's native classes take no weak references):
        # count the live instances the collector tracks instead.
        return sum(1 for thing in gc.get_objects() if isinstance(thing, kind))

    gc.collect()
    gc.disable()
    try:
        before = alive(NetworkPublication), alive(PublicationImage)
        port = free_port()
        async with open_transport() as transport:
            sub = await transport.add_subscription(channel(port), STREAM)
            pub = await transport.add_publication(channel(port), STREAM)
            await pub.wait_connected(timeout=5)
            await pub.send(b"x")
            assert (await sub.receive()).data == b"x"
            endpoints = [weakref.ref(sub._channel.socket), weakref.ref(pub._channel.socket)]
            # they hold the term buffers
            assert (alive(NetworkPublication), alive(PublicationImage)) == (
                before[0] + 1,
                before[1] + 1,
            )
            await pub.close(timeout=1)
            await sub.close()
            del sub, pub
            # The reader tasks end at their next scheduling: let them.
            await trio.testing.wait_all_tasks_blocked()
            assert [ref() for ref in endpoints] == [None, None]
            assert (alive(NetworkPublication), alive(PublicationImage)) == before
    finally:
        gc.enable()


async def test_iterating_a_subscription_ends_when_it_is_closed(autojump_clock) -> None:  # type: ignore[no-untyped-def]
    net = MemoryNetwork(seed=5)
    async with open_transport(socket_factory=net) as transport:
        sub = await transport.add_subscription(channel(VIRTUAL_PORT), STREAM)
        pub = await transport.add_publication(channel(VIRTUAL_PORT), STREAM)
        await pub.wait_connected(timeout=5)
        got: list[bytes] = []

        async def consume() -> None:
            async for message in sub:
                got.append(message.data)
                if len(got) == 2:
                    await sub.close()

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(consume)
                for data in (b"one", b"two"):
                    await pub.send(data)
        # The loop ended (the nursery closed) without an error once the subscription did.
        assert got == [b"one", b"two"]
        with pytest.raises(trio.EndOfChannel):
            await sub.receive()


async def test_a_poll_delivers_what_arrived_past_a_term_boundary(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # A poll that returns fewer fragments than its limit has delivered everything there was:
    # receive loops (the session's, the hub's) then wait for news. The image's own poll stops
    # at a term's end (as Aeron's Image.poll does), so one whose messages straddled a term
    # boundary, all arrived before the poll, delivered the first term's part and left the rest:
    # no datagram was left to come and wake the reader (heartbeats do not), and the Echo 2.0
    # client waited for an echo that sat in its log (the wire test's 66/150 in CI).
    uri = channel(VIRTUAL_PORT, "term-length=64k")
    net = MemoryNetwork(seed=7)
    message = bytes(1000)
    with trio.fail_after(60):
        async with connected_pair(net, uri) as (sub, pub):
            # Up to 10 messages short of the term's end, read as they come ...
            while pub.position < 65536 - 10 * 1056:
                await pub.send(message, timeout=5)
                await sub.receive()
            # ... then 20 more, which cross into the next term, left unread until all are in.
            for _ in range(20):
                await pub.send(message, timeout=5)
            assert pub.position > 65536
            image = sub._channel.images[0].image
            while image.rebuild_position < pub.position:
                await sub.wait_activity()
            received: list[Message] = []
            assert sub.poll(received.append, fragment_limit=1000) == 20
            assert len(received) == 20
