"""A subscription's socket lent to the application task that waits on it (driver/lending.py).

Once a task waits in `receive()` / `wait_activity()`, the reader task hands it the socket and
sleeps, so that each datagram wakes the application directly. These tests pin down what must
still hold: a task that walks away does not leave the socket unread, events that do not come
through the socket still wake the waiting task, and several tasks can wait on one endpoint.

They run on the memory network in virtual time: lending turns on a 1 ms idle time
(LEND_IDLE), and over real sockets on a loaded machine a task descheduled for longer rightly
lost the socket between two lines of a test, which then failed. (A memory socket is waited on
through a real descriptor, so the lending path is the same; every real-socket test of the
transport receives through it too.)
"""

from __future__ import annotations

import socket

import trio
import trio.testing

from echo.transport import Publication, Subscription, Transport, TransportConfig, open_transport
from echo.transport.driver.sockets import LEND_IDLE, ReceiveSocket
from echo.transport.testing import Link, MemoryNetwork

STREAM = 1001


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def endpoint_of(subscription: Subscription) -> ReceiveSocket:
    return subscription._channel.socket


async def pair(
    sender: Transport, receiver: Transport, port: int | None = None
) -> tuple[Publication, Subscription]:
    port = port or free_port()
    sub = await receiver.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}", STREAM)
    pub = await sender.add_publication(f"aeron:udp?endpoint=127.0.0.1:{port}", STREAM)
    await pub.wait_connected(timeout=5)
    return pub, sub


async def lend(pub: Publication, sub: Subscription) -> None:
    """Receive until the driver has lent the subscription's socket to this task."""
    with trio.fail_after(5):
        while not endpoint_of(sub).lending.lent:
            await pub.send(b"ping")
            assert (await sub.receive()).data == b"ping"


async def test_a_waiting_task_is_lent_the_socket_and_reads_it_itself(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # In virtual time on the memory network: over real sockets on a loaded machine, a
    # consumer descheduled for more than LEND_IDLE (1 ms) rightly loses the socket, and the
    # last assertion failed now and then.
    net = MemoryNetwork()
    async with (
        open_transport(socket_factory=net) as sender,
        open_transport(socket_factory=net) as receiver,
    ):
        pub, sub = await pair(sender, receiver, port=40123)
        await lend(pub, sub)
        sep = endpoint_of(sub)
        got: list[bytes] = []

        async def consume() -> None:
            for _ in range(100):
                got.append((await sub.receive()).data)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume)
            await trio.testing.wait_all_tasks_blocked()
            assert sep.lending.borrowed  # the consumer itself waits on the socket
            for i in range(100):
                await pub.send(b"%d" % i)
        assert got == [b"%d" % i for i in range(100)]
        assert sep.lending.lent


async def test_a_task_that_walks_away_gives_the_socket_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    net = MemoryNetwork()
    async with (
        open_transport(socket_factory=net) as sender,
        open_transport(socket_factory=net) as receiver,
    ):
        pub, sub = await pair(sender, receiver, port=40123)
        await lend(pub, sub)
        sep = endpoint_of(sub)
        # Nobody waits on the socket any more: within a few lend checks it is the reader's
        # again, and what arrives meanwhile is read and ready for a poll.
        # Lending has no change notification (it is the driver's internal state): look every
        # lend interval, bounded.
        with trio.fail_after(5):
            while sep.lending.lent:  # noqa: ASYNC110
                await trio.sleep(LEND_IDLE)
        await pub.send(b"later")
        got: list[bytes] = []
        with trio.fail_after(5):
            while not got:
                sub.poll(lambda message: got.append(message.data))
                # A game loop's tick: `poll` is what is tested, so no waiting call (that
                # would borrow the socket again) stands in for it; bounded by fail_after.
                await trio.sleep(0.001)
        assert got == [b"later"]


async def test_poll_reads_a_lent_socket_nobody_waits_on(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # A game loop that polls between receives must see fresh data even before the socket goes
    # back to the reader: `poll` reads a lent socket that nobody has waited on for a while.
    # (Virtual time: on a loaded machine the real clock ran past the lend checks on its own.)
    net = MemoryNetwork()
    async with (
        open_transport(socket_factory=net) as sender,
        open_transport(socket_factory=net) as receiver,
    ):
        pub, sub = await pair(sender, receiver, port=40123)
        await lend(pub, sub)
        sep = endpoint_of(sub)
        for i in range(5):
            assert pub.offer(b"%d" % i) > 0
        # The sender's driver sends the burst (on this network it is in the receiver's socket
        # at once); the receiving side has nobody waiting on its socket.
        await trio.testing.wait_all_tasks_blocked()
        # The application is busy (no checkpoint, so no task runs and nothing is read or given
        # back) for longer than the lend idle time...
        autojump_clock.jump(3 * LEND_IDLE)
        assert sep.lending.lent and not sep.lending.borrowed
        got: list[bytes] = []
        sub.poll(lambda message: got.append(message.data))
        # ...and its next poll reads the socket itself.
        assert got == [b"%d" % i for i in range(5)]


async def test_poll_after_the_driver_closed_a_lent_socket_does_not_touch_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # A client that polls while its transport shuts down: the socket was lent, then closed
    # under it. Polling must not ask the closed socket anything (its descriptor is -1).
    net = MemoryNetwork()
    async with (
        open_transport(socket_factory=net) as sender,
        open_transport(socket_factory=net) as receiver,
    ):
        pub, sub = await pair(sender, receiver, port=40123)
        await lend(pub, sub)
        sep = endpoint_of(sub)
        receiver._driver.close()
        assert sep.closed and sep.sock.fileno() == -1
        autojump_clock.jump(2 * LEND_IDLE)  # past the idle time that makes poll read
        assert sub.poll(lambda message: None) == 0


async def test_an_image_that_times_out_wakes_the_task_waiting_on_the_lent_socket(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # On the memory network in virtual time: the 10 s liveness timeout costs nothing, and the
    # lent socket's descriptor is the memory socket's doorbell, woken the same way.
    net = MemoryNetwork()
    config = TransportConfig()
    async with open_transport(config, socket_factory=net) as receiver:
        gone = trio.Event()
        port = 40123
        sub = await receiver.add_subscription(
            f"aeron:udp?endpoint=127.0.0.1:{port}",
            STREAM,
            on_image_unavailable=lambda image: gone.set(),
        )
        async with open_transport(config, socket_factory=net) as sender:
            pub = await sender.add_publication(f"aeron:udp?endpoint=127.0.0.1:{port}", STREAM)
            await pub.wait_connected(timeout=5)
            await lend(pub, sub)
            # Pull the cable: the sender's sockets vanish without an end-of-stream.
            sender._driver.close()
        cut = trio.current_time()
        with trio.fail_after(30):
            while sub.images:
                await sub.wait_activity()  # waits on the lent socket; nothing arrives on it
        assert gone.is_set()
        # Woken at the timeout itself, not by something that happened to come later.
        timeout = config.image_liveness_timeout
        assert timeout <= trio.current_time() - cut <= timeout + config.status_message_interval


async def test_closing_the_subscription_ends_a_receive_waiting_on_the_lent_socket(
    autojump_clock: trio.testing.MockClock,
) -> None:
    net = MemoryNetwork()
    async with (
        open_transport(socket_factory=net) as sender,
        open_transport(socket_factory=net) as receiver,
    ):
        pub, sub = await pair(sender, receiver, port=40123)
        await lend(pub, sub)
        ended = trio.Event()

        async def consume() -> None:
            try:
                await sub.receive()
            except trio.EndOfChannel:
                ended.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume)
            await trio.testing.wait_all_tasks_blocked()
            assert endpoint_of(sub).lending.borrowed
            await sub.close()
            with trio.fail_after(5):
                await ended.wait()


async def test_two_tasks_waiting_on_one_subscription_both_get_messages(
    autojump_clock: trio.testing.MockClock,
) -> None:
    net = MemoryNetwork()
    async with (
        open_transport(socket_factory=net) as sender,
        open_transport(socket_factory=net) as receiver,
    ):
        pub, sub = await pair(sender, receiver, port=40123)
        await lend(pub, sub)
        got: list[tuple[str, bytes]] = []
        all_in = trio.Event()

        async def consume(name: str) -> None:
            while True:
                message = await sub.receive()
                got.append((name, message.data))
                if len(got) == 40:
                    all_in.set()
                await trio.sleep(0.002)  # busy elsewhere: the other task takes the next one

        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume, "a")
            nursery.start_soon(consume, "b")
            await trio.testing.wait_all_tasks_blocked()
            for i in range(40):
                await pub.send(b"%d" % i)
                await trio.sleep(0.001)  # pacing: one message at a time for the two waiters
            with trio.fail_after(5):
                await all_in.wait()
            nursery.cancel_scope.cancel()
        assert sorted(int(data) for _, data in got) == list(range(40))
        assert {name for name, _ in got} == {"a", "b"}


async def test_a_cancelled_receive_leaves_the_socket_usable(
    autojump_clock: trio.testing.MockClock,
) -> None:
    net = MemoryNetwork()
    async with (
        open_transport(socket_factory=net) as sender,
        open_transport(socket_factory=net) as receiver,
    ):
        pub, sub = await pair(sender, receiver, port=40123)
        await lend(pub, sub)
        for _ in range(20):
            with trio.move_on_after(0.001):
                await sub.receive()  # nothing comes: cancelled while waiting on the socket
        await pub.send(b"after")
        with trio.fail_after(5):
            assert (await sub.receive()).data == b"after"


async def test_closing_a_subscription_without_images_ends_a_receive_on_the_lent_socket(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Two subscriptions share one socket (one channel, two streams). The task waiting on the
    # stream that has no image borrows the socket; closing that subscription makes no image
    # event, so closing must wake the task by itself.
    net = MemoryNetwork()
    async with (
        open_transport(socket_factory=net) as sender,
        open_transport(socket_factory=net) as receiver,
    ):
        pub, sub = await pair(sender, receiver, port=40123)
        other = await receiver.add_subscription(sub.channel, STREAM + 1)
        assert endpoint_of(other) is endpoint_of(sub)
        ended = trio.Event()

        async def consume() -> None:
            try:
                await other.receive()
            except trio.EndOfChannel:
                ended.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume)
            with trio.fail_after(5):
                while not endpoint_of(other).lending.borrowed:
                    await pub.send(b"for the other stream's neighbour")
                    await sub.receive()
                    await trio.testing.wait_all_tasks_blocked()
            assert not other.images
            await other.close()
            # At once, not at the next heartbeat that happens to make the socket readable.
            await trio.testing.wait_all_tasks_blocked()
            assert ended.is_set()


async def test_timers_still_run_while_in_order_data_skips_servicing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # A borrower reading in-order data leaves the endpoint unserviced (nothing is due): the
    # periodic status messages must still go out on their timer, and a message that arrives
    # out of order (a gap) still gets its NAK. (Virtual time on a 1 ms path: each message of
    # the loop below waits out the path's delay, which is what moves the clock.)
    config = TransportConfig(status_message_interval=0.05)
    net = MemoryNetwork(link=Link(delay=0.001))
    async with (
        open_transport(config, socket_factory=net) as sender,
        open_transport(config, socket_factory=net) as receiver,
    ):
        pub, sub = await pair(sender, receiver, port=40123)
        await lend(pub, sub)
        sms_before = receiver.counters.status_messages_sent
        start = trio.current_time()
        count = 0
        while trio.current_time() - start < 0.5:
            await pub.send(b"%d" % count)
            assert (await sub.receive()).data == b"%d" % count
            count += 1
        assert endpoint_of(sub).lending.lent
        sms = receiver.counters.status_messages_sent - sms_before
        assert sms >= 0.5 / 0.05 - 2, (sms, count)
