"""`Publication.close_soon`: the caller does not wait for the receivers; the transport drains,
announces end-of-stream and lingers in its own nursery, and `Transport.settle` waits for it."""

from __future__ import annotations

import trio
import trio.testing

from echo.transport import Transport, TransportConfig, open_transport
from echo.transport.testing import Link, MemoryNetwork

URI = "aeron:udp?endpoint=127.0.0.1:7000"


async def test_close_soon_returns_at_once_and_the_transport_delivers_the_rest(
    autojump_clock: trio.testing.MockClock,
) -> None:
    net = MemoryNetwork(seed=3)
    with trio.fail_after(60):
        async with (
            open_transport(socket_factory=net) as receiving,
            open_transport(socket_factory=net) as sending,
        ):
            subscription = await receiving.add_subscription(URI, 7)
            publication = await sending.add_publication(URI, 7)
            await publication.wait_connected()
            net.set_link(Link(loss=0.5))  # what follows needs retransmissions
            for i in range(10):
                assert publication.offer(b"%d" % i) > 0
            started = trio.current_time()
            publication.close_soon(timeout=5.0, last=b"bye")
            assert trio.current_time() == started  # no waiting at all
            assert publication.is_closed
            got: list[bytes] = []

            async def read() -> None:
                while len(got) < 11:
                    got.append((await subscription.receive()).data)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(read)
                await sending.settle(10.0)
                settled = trio.current_time() - started
            assert got == [b"%d" % i for i in range(10)] + [b"bye"]
            assert 0 < settled < 5.0  # acknowledged before the linger's end


async def test_a_dead_receiver_costs_the_linger_in_the_background_only(
    autojump_clock: trio.testing.MockClock,
) -> None:
    net = MemoryNetwork()
    with trio.fail_after(60):
        async with (
            open_transport(socket_factory=net) as receiving,
            open_transport(socket_factory=net) as sending,
        ):
            await receiving.add_subscription(URI, 7)
            publication = await sending.add_publication(URI, 7)
            await publication.wait_connected()
            net.set_link(Link(loss=1.0))  # the receiver is gone without a word
            publication.offer(b"never acknowledged")
            publication.close_soon(timeout=1.0)
            started = trio.current_time()
            await sending.settle(10.0)
            assert 1.0 <= trio.current_time() - started < 1.1  # the linger, then released
            assert not sending._driver.lingering


async def test_closing_the_transport_ends_what_still_lingers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    net = MemoryNetwork()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            receiving = Transport(TransportConfig(), nursery, net)
            sending = Transport(TransportConfig(), nursery, net)
            await receiving.add_subscription(URI, 7)
            publication = await sending.add_publication(URI, 7)
            await publication.wait_connected()
            net.set_link(Link(loss=1.0))
            publication.offer(b"x")
            publication.close_soon(timeout=30.0)
            started = trio.current_time()
            await sending.aclose()
            await receiving.aclose()
        # The nursery did not wait out the 30 s linger: shutting down ended it.
        assert trio.current_time() - started < 1.0


async def test_a_close_after_close_soon_does_not_end_the_stream_before_its_goodbye(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The session server's teardown closes a duologue's publication (timeout 0) right after
    # the application's close(reason) gave it a goodbye to send. When the receiver was not
    # connected yet, the goodbye waited, and that close ended the stream at position 0: a
    # lobby member refused for its token saw "closed by the server", not why.
    net = MemoryNetwork()
    with trio.fail_after(60):
        async with (
            open_transport(socket_factory=net) as receiving,
            open_transport(socket_factory=net) as sending,
        ):
            publication = await sending.add_publication(URI, 7)
            assert not publication.is_connected
            publication.close_soon(timeout=5.0, last=b"bye")
            await publication.close(timeout=0.0)
            subscription = await receiving.add_subscription(URI, 7)
            assert (await subscription.receive()).data == b"bye"
            started = trio.current_time()
            await sending.settle(10.0)
            assert trio.current_time() - started < 5.0  # the end came, acknowledged
