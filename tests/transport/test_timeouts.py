"""The driver's timeouts at their default lengths, in virtual time on the memory network:
image liveness (10 s), publication connection (5 s) and linger (5 s) cost no real seconds, so
they are tested as configured, not shortened, and to within one status-message interval (the
real clock's scheduling noise does not enter)."""

from __future__ import annotations

import trio
import trio.testing

from echo.transport import (
    NOT_CONNECTED,
    Image,
    Publication,
    Subscription,
    Transport,
    TransportConfig,
    open_transport,
)
from echo.transport.driver.channels import _CLOSE_GRACE
from echo.transport.testing import Link, MemoryNetwork

STREAM = 1001
PORT = 40123
URI = f"aeron:udp?endpoint=127.0.0.1:{PORT}"
DEFAULTS = TransportConfig()
#: every timer loop rounds to its next deadline: the heartbeat and SM intervals bound how late
#: a timeout is noticed (status_message_interval 0.2 s is the longer of the two)
SLACK = DEFAULTS.status_message_interval


def address_of(publication: Publication) -> tuple[str, int]:
    host, port = publication.local_address.rsplit(":", 1)
    return ("127.0.0.1" if host == "0.0.0.0" else host, int(port))


async def connected(
    net: MemoryNetwork, rx: Transport, tx: Transport, **callbacks: object
) -> tuple[Publication, Subscription]:
    sub = await rx.add_subscription(URI, STREAM, **callbacks)  # type: ignore[arg-type]
    pub = await tx.add_publication(URI, STREAM)
    await pub.wait_connected(timeout=5)
    await pub.send(b"hello")
    assert (await sub.receive()).data == b"hello"
    return pub, sub


async def test_an_image_times_out_after_the_liveness_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    net = MemoryNetwork()
    gone = trio.Event()
    unavailable: list[Image] = []

    def on_unavailable(image: Image) -> None:
        unavailable.append(image)
        gone.set()

    with trio.fail_after(60):
        async with (
            open_transport(socket_factory=net) as rx,
            open_transport(socket_factory=net) as tx,
        ):
            _, sub = await connected(net, rx, tx, on_image_unavailable=on_unavailable)
            # The path from the publisher breaks: no data, heartbeat or SETUP arrives again.
            net.set_link(Link(loss=1.0), destination=("127.0.0.1", PORT))
            cut = trio.current_time()
            await gone.wait()
            waited = trio.current_time() - cut
            assert (
                DEFAULTS.image_liveness_timeout <= waited <= DEFAULTS.image_liveness_timeout + SLACK
            )
            assert unavailable[0].close_reason == "timed_out"
            assert sub.images == []


async def test_a_publication_is_disconnected_after_the_connection_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    net = MemoryNetwork()
    timeout = DEFAULTS.publication_connection_timeout
    with trio.fail_after(60):
        async with (
            open_transport(socket_factory=net) as rx,
            open_transport(socket_factory=net) as tx,
        ):
            pub, _ = await connected(net, rx, tx)
            # The receiver's status messages stop reaching the publisher.
            net.set_link(Link(loss=1.0), destination=address_of(pub))
            cut = trio.current_time()
            # Deliberately let virtual time pass to just before, then just after, the timeout
            # (counted from the last SM, which came at most one SM interval before the cut).
            await trio.sleep_until(cut + timeout - SLACK - 0.01)
            assert pub.is_connected and pub.offer(b"still connected") > 0
            await trio.sleep_until(cut + timeout + SLACK)
            assert not pub.is_connected
            assert pub.offer(b"into the void") == NOT_CONNECTED


async def test_close_lingers_for_the_linger_when_no_receiver_proves_delivery(
    autojump_clock: trio.testing.MockClock,
) -> None:
    net = MemoryNetwork()
    with trio.fail_after(60):
        async with (
            open_transport(socket_factory=net) as rx,
            open_transport(socket_factory=net) as tx,
        ):
            pub, _ = await connected(net, rx, tx)
            net.set_link(Link(loss=1.0), destination=address_of(pub))  # no SM comes back
            assert pub.offer(b"unproven") > 0
            started = trio.current_time()
            assert await pub.close() is False
            waited = trio.current_time() - started
            # It gave up when the linger ran out, not at the api's grace after it.
            assert (
                DEFAULTS.linger
                <= waited
                <= DEFAULTS.linger + SLACK
                < DEFAULTS.linger + _CLOSE_GRACE
            )


async def test_close_returns_at_once_when_the_receiver_proves_delivery(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The counterpart of the test above on a path with a 5 ms one-way delay: close waits
    # round trips for the receiver's end-of-stream proof, not the 5 s linger.
    net = MemoryNetwork(link=Link(delay=0.005))
    with trio.fail_after(60):
        async with (
            open_transport(socket_factory=net) as rx,
            open_transport(socket_factory=net) as tx,
        ):
            pub, sub = await connected(net, rx, tx)
            await pub.send(b"last words")
            assert (await sub.receive()).data == b"last words"
            started = trio.current_time()
            assert await pub.close() is True
            waited = trio.current_time() - started
            # Two 10 ms round trips (the end-of-stream heartbeat, the receiver's EOS SM), in
            # virtual time exactly: far inside the linger.
            assert waited < 0.05
