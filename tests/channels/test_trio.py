"""The trio layer over an in-memory delayed pipe and over a real transport pair on loopback."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from echo.channels import ChannelsClosed, ChannelSpec, HandleRef, open_channels
from tests.channels.sessions import pipe_pair, transport_pair

CONTROL, BULK, HANDLES = 0, 1, 2
SPECS = [
    ChannelSpec(CONTROL, capacity=1024, priority=0),
    ChannelSpec(BULK, capacity=8 * 1024, priority=1),
    ChannelSpec(HANDLES, capacity=1024, handles=True),
]


async def test_messages_both_ways_in_order(autojump_clock):
    a, b = pipe_pair(delay=0.01)
    got: list[bytes] = []
    async with open_channels(a, SPECS) as ca, open_channels(b, SPECS) as cb:

        async def consume() -> None:
            async for message in cb[BULK]:
                got.append(message.data)
                if len(got) == 200:
                    return

        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume)
            for i in range(200):
                await ca[BULK].send(i.to_bytes(2, "big") * 100)
        await cb[CONTROL].send(b"back")
        assert (await ca[CONTROL].receive()).data == b"back"
    assert got == [i.to_bytes(2, "big") * 100 for i in range(200)]


async def test_guaranteed_send_waits_for_space(autojump_clock):
    a, b = pipe_pair(delay=0.005)
    async with open_channels(a, SPECS) as ca, open_channels(b, SPECS) as cb:
        await ca.wait_for(lambda: ca[BULK].guarantees > 0)  # the initial guarantees arrive
        assert ca[BULK].guarantees == 8 * 1024
        for _ in range(8):
            await ca[BULK].send(b"x" * 1024)
        with trio.move_on_after(1) as scope:
            await ca[BULK].send(b"x" * 1024)  # no space until b processes
        assert scope.cancelled_caught
        await cb[BULK].receive()
        cb[BULK].done()
        # Guarantees are aggregated: a quarter of the buffer (two messages) before an update.
        with trio.move_on_after(1) as scope:
            await ca[BULK].send(b"x" * 1024)
        assert scope.cancelled_caught
        await cb[BULK].receive()
        cb[BULK].done()
        with trio.fail_after(1):
            await ca[BULK].send(b"y" * 1024)


async def test_send_nowait_queues_in_order_and_refuses_past_its_backlog(autojump_clock):
    a, b = pipe_pair(delay=0.005)
    async with open_channels(a, SPECS) as ca, open_channels(b, SPECS) as cb:
        await ca.wait_for(lambda: ca[BULK].guarantees > 0)

        # What waits on the channel counts (not yet handed to the session, or without credit):
        # 4 x 1 KiB fit a 4 KiB backlog, the fifth does not; each goes out in turn.
        def burst(first: int) -> list[bool]:
            send = ca[BULK].send_nowait
            return [send(bytes([first + i]) * 1024, max_queued=4096) for i in range(5)]

        assert burst(0) == [True, True, True, True, False]
        await ca.wait_for(lambda: ca[BULK].guarantees == 4 * 1024)  # they went out
        assert burst(4) == [True, True, True, True, False]
        await ca.wait_for(lambda: ca[BULK].guarantees == 0)
        # No credit left: these wait here for b to consume, and hold the backlog meanwhile.
        assert burst(8) == [True, True, True, True, False]
        got = []
        async for message in cb[BULK]:
            got.append(message.data[0])
            if len(got) == 12:
                break
        assert got == list(range(12))  # in order, nothing lost, the refused one never sent
        await ca[CONTROL].send(b"end")
        assert (await cb[CONTROL].receive()).data == b"end"
        assert cb.peer.take(BULK) is None
    with pytest.raises(ChannelsClosed):
        ca[BULK].send_nowait(b"late", max_queued=1 << 20)


async def test_slow_bulk_consumer_does_not_delay_control(autojump_clock):
    """The motivating scenario: bulk saturated by a 10x slower consumer; control keeps answering."""
    delay = 0.01
    a, b = pipe_pair(delay=delay)
    rtts: list[float] = []
    bulk_sent = [0]
    async with open_channels(a, SPECS) as ca, open_channels(b, SPECS) as cb:

        async def bulk_sender() -> None:
            while True:
                await ca[BULK].send(b"b" * 1000)
                bulk_sent[0] += 1
                await trio.sleep(0.001)  # the workload: a sender of 1,000 messages/s

        async def bulk_consumer() -> None:
            async for _ in cb[BULK]:
                await trio.sleep(0.01)  # 10x slower than the sender

        async def control_echo() -> None:
            async for message in cb[CONTROL]:
                await cb[CONTROL].send(message.data)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(bulk_sender)
            nursery.start_soon(bulk_consumer)
            nursery.start_soon(control_echo)
            # Saturated: the bulk buffer is full (less than a message free) from here on.
            await cb.wait_for(lambda: cb.peer.incoming[BULK].used > 8 * 1024 - 1000)
            start_all, sent_before = trio.current_time(), bulk_sent[0]
            for i in range(50):
                start = trio.current_time()
                await ca[CONTROL].send(i.to_bytes(4, "big"))
                assert (await ca[CONTROL].receive()).data == i.to_bytes(4, "big")
                rtts.append(trio.current_time() - start)
                await trio.sleep(0.05)  # the workload: a ping every 50 ms
            # Bulk really was held to its consumer's pace (100/s), not its own (1000/s).
            rate = (bulk_sent[0] - sent_before) / (trio.current_time() - start_all)
            assert 80 <= rate <= 120
            nursery.cancel_scope.cancel()
    assert max(rtts) <= 2 * delay + 1e-6


async def test_optimistic_overflow_is_retransmitted_in_order(autojump_clock):
    a, b = pipe_pair(delay=0.01)
    specs = [ChannelSpec(CONTROL, capacity=100)]
    async with open_channels(a, specs) as ca, open_channels(b, specs) as cb:
        for i in range(30):
            await ca[CONTROL].send(bytes([i]) * 20, optimistic=True)
        got = []
        async for message in cb[CONTROL]:
            got.append(message.data[0])
            await trio.sleep(0.02)  # the workload: a consumer slower than the sender
            if len(got) == 30:
                break
        assert got == list(range(30))
        assert cb.counters["messages_dropped"] > 0
        assert ca.counters["retransmissions"] > 0


async def test_resize_gives_the_sender_room(autojump_clock):
    a, b = pipe_pair(delay=0.01)
    async with open_channels(a, SPECS) as ca, open_channels(b, SPECS) as cb:
        await ca.wait_for(lambda: ca[CONTROL].guarantees > 0)
        assert ca[CONTROL].guarantees == 1024
        cb[CONTROL].resize(4096)
        await ca.wait_for(lambda: ca[CONTROL].guarantees != 1024)
        assert ca[CONTROL].guarantees == 4096
        cb[CONTROL].resize(100)
        # Shrinking an empty buffer takes a plea and the sender's absolution.
        await cb.wait_for(lambda: cb.peer.incoming[CONTROL].capacity != 4096)
        assert ca[CONTROL].guarantees == 100
        assert cb.peer.incoming[CONTROL].capacity == 100


async def test_limit_sending_zero_ends_the_loop(autojump_clock):
    a, b = pipe_pair(delay=0.01)
    async with open_channels(a, SPECS) as ca, open_channels(b, SPECS) as cb:
        await ca[CONTROL].send(b"last")
        ca[CONTROL].limit_sending(0)
        got = [m.data async for m in cb[CONTROL]]
        assert got == [b"last"]


async def test_handles_over_the_trio_layer(autojump_clock):
    a, b = pipe_pair(delay=0.01)
    async with open_channels(a, SPECS) as ca, open_channels(b, SPECS) as cb:
        handle = await ca.bind(HANDLES, b"shared value")
        await ca[CONTROL].send(b"see", refs=[HandleRef(HANDLES, handle, True)])
        message = await cb[CONTROL].receive()
        (ref,) = message.refs
        assert cb.handle_value(ref.handle_type, ref.handle, mine=False) == b"shared value"
        ca.free(HANDLES, handle)
        cb[CONTROL].done()
        # Three steps: a's proposal, b's confirmation once it released the message; each side
        # deletes the binding when it has both.
        with trio.fail_after(5):
            await cb.wait_for(lambda: not cb.peer.theirs[HANDLES])
            await ca.wait_for(lambda: not ca.peer.own[HANDLES])


async def test_protocol_error_closes_the_session_with_a_reason(autojump_clock):
    a, b = pipe_pair(delay=0.01)
    async with open_channels(b, SPECS) as cb:
        await a.send(b"\x01\x63\x01x")  # DATA on channel 99, which nobody declared
        with pytest.raises(ChannelsClosed, match="unknown channel 99"):
            await cb[CONTROL].receive()
        assert "unknown channel 99" in b.closed_reason
    with pytest.raises(Exception, match="unknown channel 99"):
        while True:
            await a.receive()  # guarantees first, then the close with its reason


async def test_peer_closing_the_session_ends_channel_operations(autojump_clock):
    a, b = pipe_pair(delay=0.01)
    async with open_channels(a, SPECS) as ca:
        await b.close("bye")
        with pytest.raises(ChannelsClosed, match="bye"):
            await ca[CONTROL].receive()


@pytest.mark.parametrize("loss", [0.0, 0.05])
async def test_over_a_real_transport_pair(loss):
    """Bulk saturated by a slow consumer over loopback Aeron streams; control keeps answering."""
    with trio.fail_after(60):
        async with transport_pair(loss=loss, seed=5) as (a, b):
            async with open_channels(a, SPECS) as ca, open_channels(b, SPECS) as cb:
                received = []

                async def bulk_sender() -> None:
                    for i in range(300):
                        await ca[BULK].send(i.to_bytes(4, "big") * 250)

                async def bulk_consumer() -> None:
                    async for message in cb[BULK]:
                        received.append(int.from_bytes(message.data[:4], "big"))
                        await trio.sleep(0.002)  # the workload: a slow consumer
                        if len(received) == 300:
                            return

                async def control_echo() -> None:
                    async for message in cb[CONTROL]:
                        await cb[CONTROL].send(message.data)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(control_echo)
                    async with trio.open_nursery() as bulk:
                        bulk.start_soon(bulk_sender)
                        bulk.start_soon(bulk_consumer)
                        for i in range(20):
                            await ca[CONTROL].send(b"%d" % i)
                            assert (await ca[CONTROL].receive()).data == b"%d" % i
                    nursery.cancel_scope.cancel()
                assert received == list(range(300))


class _NowaitPipe:
    """A pipe end with the `send_nowait` of echo.session.Session: takes a message at once
    while `accepting`, else refuses it (back pressure), as the session's does."""

    def __init__(self, end) -> None:
        self.end = end
        self.accepting = True
        self.direct = 0

    def send_nowait(self, data: bytes) -> bool:
        if not self.accepting:
            return False
        assert self.end.peer is not None
        self.direct += 1
        self.end.sent_messages += 1
        self.end.peer._send.send_nowait((trio.current_time() + self.end.delay, bytes(data), ""))
        return True

    def __getattr__(self, name):
        return getattr(self.end, name)


async def test_flush_nowait_sends_from_the_callers_task_in_order(autojump_clock):
    a, b = pipe_pair(delay=0.005)
    session = _NowaitPipe(a)
    async with open_channels(session, SPECS) as ca, open_channels(b, SPECS) as cb:
        await ca.wait_for(lambda: ca[CONTROL].guarantees > 0)
        await trio.testing.wait_all_tasks_blocked()  # the writer is idle
        before = a.sent_messages
        for i in range(3):
            assert ca[CONTROL].send_nowait(bytes([i]), max_queued=1 << 20, defer=True)
        assert a.sent_messages == before  # deferred: nobody woken, nothing sent yet
        ca.flush_nowait()
        assert a.sent_messages == before + 1 and session.direct == 1  # one session message
        # Back pressure: the batch is held for the writer, which sends it before what follows.
        session.accepting = False
        for i in range(3, 5):
            ca[CONTROL].send_nowait(bytes([i]), max_queued=1 << 20, defer=True)
        ca.flush_nowait()
        for i in range(5, 7):
            ca[CONTROL].send_nowait(bytes([i]), max_queued=1 << 20, defer=True)
        ca.flush_nowait()  # the writer is awake: it is left to the writer
        assert session.direct == 1
        got = []
        for _ in range(7):
            got.append((await cb[CONTROL].receive()).data[0])
        assert got == list(range(7))
