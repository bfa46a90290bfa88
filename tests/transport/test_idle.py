"""Idle streams cost their application nothing (docs/profile-b4.txt).

An idle stream still carries the protocol's own traffic: heartbeats from its publisher, status
messages from its receiver. None of it is anything the application can act on, so none of it
may wake an application task: not the task reading its lent socket itself (sockets.Lending),
not a task parked on a subscription of a shared port, not the tasks parked on publications.
Data must still wake them at once. Virtual time on the memory network (Aeron's default cadence:
a heartbeat every 100 ms), so that many idle intervals pass in no time.
"""

from __future__ import annotations

import trio
import trio.testing

from echo.transport import Publication, open_transport
from echo.transport.driver.channels import PublicationChannel
from echo.transport.driver.sockets import LEND_BUSY, LEND_IDLE, Lending
from echo.transport.testing import MemoryNetwork
from tests.transport.test_lending import endpoint_of, lend, pair

STREAM = 1001
PORT = 40123


async def test_heartbeats_do_not_wake_the_task_reading_its_lent_socket(
    autojump_clock: trio.testing.MockClock,
) -> None:
    net = MemoryNetwork()
    async with (
        open_transport(socket_factory=net) as sender,
        open_transport(socket_factory=net) as receiver,
    ):
        pub, sub = await pair(sender, receiver, port=PORT)
        await lend(pub, sub)
        wakes: list[float] = []
        got: list[bytes] = []
        woken = trio.Event()

        async def reader() -> None:
            while True:
                await sub.wait_activity()
                wakes.append(trio.current_time())
                sub.poll(lambda message: got.append(message.data), 10)
                if got:
                    woken.set()
                    return

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            await trio.testing.wait_all_tasks_blocked()
            assert endpoint_of(sub).lending.borrowed  # the reader waits on the socket itself
            heartbeats = receiver.counters.heartbeats_received
            await trio.sleep(5.0)
            # ~50 idle heartbeats came through the socket the reader waits on ...
            assert receiver.counters.heartbeats_received - heartbeats >= 40
            # ... and woke it not once
            assert wakes == []
            sent_at = trio.current_time()
            assert pub.offer(b"news") > 0
            with trio.fail_after(1):
                await woken.wait()
        assert got == [b"news"]
        assert len(wakes) == 1
        assert wakes[0] - sent_at < 0.01  # data still wakes it at once


async def test_an_idle_stream_keeps_its_socket_with_the_reader(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # A task waiting on an idle stream is not lent the socket (sockets.LEND_BUSY): heartbeats
    # would wake it, and re-arm the socket in trio's epoll set, one by one. The driver's reader
    # takes them with the rest of its ready sockets, and tells nobody. Data wakes the task at
    # once, and an occasional message (one a second) does not make the stream busy.
    net = MemoryNetwork()
    async with (
        open_transport(socket_factory=net) as sender,
        open_transport(socket_factory=net) as receiver,
    ):
        pub, sub = await pair(sender, receiver, port=PORT)
        lending = endpoint_of(sub).lending
        got: list[bytes] = []
        wakes: list[float] = []

        async def reader() -> None:
            while True:
                await sub.wait_activity()
                wakes.append(trio.current_time())
                sub.poll(lambda message: got.append(message.data), 10)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            heartbeats = receiver.counters.heartbeats_received
            await trio.sleep(5.0)
            assert receiver.counters.heartbeats_received - heartbeats >= 40
            assert wakes == []
            assert not lending.lent
            for i in range(5):
                sent_at = trio.current_time()
                assert pub.offer(b"%d" % i) > 0
                with trio.fail_after(1):
                    while len(got) <= i:  # noqa: ASYNC110 (bounded; virtual time)
                        await trio.sleep(0.0001)
                assert wakes[-1] - sent_at < 0.01
                assert not lending.lent
                await trio.sleep(1.0)
            nursery.cancel_scope.cancel()
        assert got == [b"%d" % i for i in range(5)]
        assert len(wakes) == 5


async def test_a_borrower_gives_back_the_socket_of_a_stream_gone_quiet(
    autojump_clock: trio.testing.MockClock,
) -> None:
    net = MemoryNetwork()
    async with (
        open_transport(socket_factory=net) as sender,
        open_transport(socket_factory=net) as receiver,
    ):
        pub, sub = await pair(sender, receiver, port=PORT)
        await lend(pub, sub)  # a busy stream: lent
        lending = endpoint_of(sub).lending
        got: list[bytes] = []

        async def reader() -> None:
            while True:
                got.append((await sub.receive()).data)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            await trio.testing.wait_all_tasks_blocked()
            assert lending.borrowed
            # The first idle heartbeat (100 ms) after LEND_BUSY without data: given back.
            await trio.sleep(0.2 + LEND_BUSY)
            assert not lending.lent
            assert pub.offer(b"later") > 0
            with trio.fail_after(1):
                while not got:  # noqa: ASYNC110 (bounded; virtual time)
                    await trio.sleep(0.0001)
            nursery.cancel_scope.cancel()
        assert got == [b"later"]


async def test_heartbeats_of_one_session_wake_no_task_waiting_on_a_shared_port(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Two session-specific subscriptions on one port (a server's shared duologue port): the
    # tasks that do not hold the socket are parked until the driver tells them, which it now
    # does for their own session's data only.
    net = MemoryNetwork()
    async with (
        open_transport(socket_factory=net) as sender,
        open_transport(socket_factory=net) as receiver,
    ):
        channel = f"aeron:udp?endpoint=127.0.0.1:{PORT}"
        subs = [
            await receiver.add_subscription(f"{channel}|session-id={session}", STREAM)
            for session in (7, 8)
        ]
        pubs = [
            await sender.add_publication(f"{channel}|session-id={session}", STREAM)
            for session in (7, 8)
        ]
        for pub in pubs:
            await pub.wait_connected(timeout=5)
        assert endpoint_of(subs[0]) is endpoint_of(subs[1])
        wakes = [0, 0]
        got: list[list[bytes]] = [[], []]

        async def reader(index: int) -> None:
            sub = subs[index]
            while True:
                await sub.wait_activity()
                wakes[index] += 1
                sub.poll(lambda message: got[index].append(message.data), 10)

        async with trio.open_nursery() as nursery:
            for index in (0, 1):
                nursery.start_soon(reader, index)
            await trio.sleep(5.0)
            assert wakes == [0, 0]  # 2 x ~50 heartbeats: nobody woke
            assert pubs[1].offer(b"for 8") > 0
            with trio.fail_after(1):
                while not got[1]:  # noqa: ASYNC110 (bounded; virtual time)
                    await trio.sleep(0.001)
            await trio.sleep(1.0)
            nursery.cancel_scope.cancel()
        assert got == [[], [b"for 8"]]
        assert wakes[0] == 0  # the other session's data and heartbeats did not wake it


async def test_a_service_tells_only_the_publications_a_task_waits_on(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Many publications on one send socket (a server's shared response port): every status
    # message serviced the socket, which told each of its publications; now only those that
    # a task waits on are told, and those still are.
    net = MemoryNetwork()
    async with (
        open_transport(socket_factory=net) as sender,
        open_transport(socket_factory=net) as receiver,
    ):
        channel = f"aeron:udp?endpoint=127.0.0.1:{PORT}"
        for i in range(1, 12):
            await receiver.add_subscription(channel, STREAM + i)
        pubs: list[Publication] = [
            await sender.add_publication(channel, STREAM + i) for i in range(1, 11)
        ]
        for pub in pubs:
            await pub.wait_connected(timeout=5)
        told: dict[int, int] = {}
        for pub in pubs:
            state: PublicationChannel = pub._channel

            def counted(key: int = pub.stream_id, original=state.notify) -> None:  # type: ignore[no-untyped-def]
                told[key] = told.get(key, 0) + 1
                original()

            state.notify = counted  # type: ignore[method-assign]
        # No task waits on any of them: 2 s of status messages (and heartbeats) tell none.
        status = sender.counters.status_messages_received
        await trio.sleep(2.0)
        assert sender.counters.status_messages_received - status >= 10
        assert told == {}
        # A task waiting on one of them (for its receiver) is told, and only it.
        late = await sender.add_publication(channel, STREAM + 11)
        assert pubs[0]._channel.socket is late._channel.socket
        with trio.fail_after(5):
            await late.wait_connected()
        assert late.is_connected
        assert told == {}
        # ... and a task waiting on one of the ten (its close waits for the receiver's last
        # status message) is told as before.
        with trio.fail_after(10):
            assert await pubs[0].close()
        assert told.get(STREAM + 1, 0) >= 1
        assert set(told) == {STREAM + 1}


def test_a_lend_check_that_falls_due_is_not_due_again_at_once() -> None:
    # By rounding, `now - returned_at < LEND_IDLE` held while `returned_at + LEND_IDLE <= now`
    # did too: the check answered "look again at returned_at + LEND_IDLE", which was now, and
    # the timer loop spun (found by the shared-port test above, in virtual time).
    lending = Lending()
    returned_at = 457.45942256749106
    now = returned_at + LEND_IDLE
    assert now - returned_at < LEND_IDLE  # the rounding this is about
    lending.lend(returned_at)
    again = lending.check(now)
    assert again is None or again > now
    # ... and a socket nobody waited on for LEND_IDLE goes back; one still in use does not.
    assert lending.check(returned_at + 2 * LEND_IDLE) is None
    lending.borrowed = True
    later = lending.check(now)
    assert later is not None and later > now
