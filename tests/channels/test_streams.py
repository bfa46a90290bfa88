"""Channels on streams of their own (ChannelSpec.own_stream): head-of-line isolation."""

from __future__ import annotations

import pytest
import trio

from echo.channels import open_channels, wire
from echo.channels.core import ChannelPeer, ChannelSpec, ChannelUsageError
from echo.channels.wire import HandleRef
from tests.channels.sessions import pipe_pair, transport_pair

CONTROL, BULK = 0, 1

SPECS = [
    ChannelSpec(0, capacity=100),
    ChannelSpec(2, capacity=100, handles=True),
    ChannelSpec(3, capacity=30, priority=1, own_stream=True),
    ChannelSpec(1, capacity=100, own_stream=True),
]


def move(src: ChannelPeer, dst: ChannelPeer, stream: int) -> None:
    while data := src.data_to_send(1 << 16, stream):
        dst.receive(data)


def test_streams_are_numbered_by_channel_id_and_carry_only_their_own_frames():
    a, b = ChannelPeer(SPECS), ChannelPeer(SPECS)
    assert a.streams == 3
    assert a.stream_of == {0: 0, 2: 0, 1: 1, 3: 2}
    # The initial guarantees: each on the stream of its channel.
    for stream, channels in ((0, {0, 2}), (1, {1}), (2, {3})):
        frames = wire.decode_frames(a.data_to_send(1 << 16, stream))
        assert {f.channel for f in frames} == channels
        assert all(isinstance(f, wire.Guarantee) for f in frames)
    a.receive(b.data_to_send(1 << 16, 0))
    a.receive(b.data_to_send(1 << 16, 1))
    a.send(0, b"zero")
    a.send(1, b"one")
    assert wire.decode_frames(a.data_to_send(1 << 16, 1)) == [wire.Data(1, b"one")]
    assert wire.decode_frames(a.data_to_send(1 << 16, 0)) == [wire.Data(0, b"zero")]


def test_an_own_stream_channel_needs_nothing_from_a_stalled_stream_0():
    """Stream 0 never moves (a lost datagram not yet repaired, for ever): channel 3 still runs
    its whole cycle of overflow, drop notice, apology and retransmission on its own stream."""
    a, b = ChannelPeer(SPECS), ChannelPeer(SPECS)
    move(b, a, 2)  # channel 3's initial guarantees
    assert a.guarantees(3) == 30
    for i in range(10):  # 100 optimistic bytes into a 30-byte buffer
        a.send(3, bytes([i]) * 10, optimistic=True)
    got = []
    for _ in range(100):
        move(a, b, 2)
        while (delivery := b.take(3)) is not None:
            got.append(delivery.data[0])
            b.release(delivery)
        move(b, a, 2)
        if len(got) == 10:
            break
    assert got == list(range(10))
    assert b.counters["messages_dropped"] > 0 and a.counters["retransmissions"] > 0
    assert a.failure is None and b.failure is None
    assert a.has_output(0) and b.has_output(0)  # stream 0's own frames, still waiting


def test_own_stream_channels_refuse_handle_references():
    a = ChannelPeer(SPECS)
    handle = a.bind(2, b"value")
    with pytest.raises(ChannelUsageError, match="own stream"):
        a.send(1, b"x", refs=[HandleRef(2, handle, True)])
    a.send(0, b"x", refs=[HandleRef(2, handle, True)])  # on stream 0, with its bind: fine
    with pytest.raises(ChannelUsageError):
        ChannelSpec(4, handles=True, own_stream=True)


# ---------------------------------------------------------------------- over trio


async def test_an_own_stream_channel_is_not_held_up_by_a_slow_stream_0(autojump_clock):
    """Stream 0 takes 0.5 s one way (a loss being repaired, say); the control channel's own
    stream takes 10 ms: its round trips take 20 ms, and bulk still arrives, in order."""
    a, b = pipe_pair(delay=0.5, substream_delay=0.01)
    specs = [
        ChannelSpec(CONTROL, capacity=1024, own_stream=True),
        ChannelSpec(BULK, capacity=8 * 1024, priority=1),
    ]
    async with open_channels(a, specs) as ca, open_channels(b, specs) as cb:

        async def control_echo() -> None:
            async for message in cb[CONTROL]:
                await cb[CONTROL].send(message.data)

        got: list[bytes] = []

        async def bulk_consumer() -> None:
            async for message in cb[BULK]:
                got.append(message.data)
                if len(got) == 20:
                    return

        async with trio.open_nursery() as nursery:
            nursery.start_soon(control_echo)
            nursery.start_soon(bulk_consumer)
            await ca.wait_for(lambda: ca[CONTROL].guarantees > 0)
            for i in range(20):
                await ca[BULK].send(b"%d" % i, optimistic=True)
            for i in range(10):
                start = trio.current_time()
                await ca[CONTROL].send(b"ping %d" % i)
                assert (await ca[CONTROL].receive()).data == b"ping %d" % i
                assert trio.current_time() - start <= 2 * 0.01 + 1e-6
            await cb.wait_for(lambda: len(got) == 20)
            nursery.cancel_scope.cancel()
    assert got == [b"%d" % i for i in range(20)]


@pytest.mark.parametrize("loss", [0.0, 0.05])
async def test_own_streams_over_a_real_transport_pair(loss):
    """Aeron streams beside the pair's own (same ports, stream id + 1), under loss."""
    specs = [
        ChannelSpec(CONTROL, capacity=1024, own_stream=True),
        ChannelSpec(BULK, capacity=8 * 1024, priority=1),
    ]
    on_stream_0: set[int] = set()

    def watch(session) -> None:
        send = session.send

        async def watched(data: bytes) -> None:
            on_stream_0.update(
                f.channel for f in wire.decode_frames(data) if not isinstance(f, wire.FreeHandle)
            )
            await send(data)

        session.send = watched

    with trio.fail_after(60):
        async with transport_pair(loss=loss, seed=7) as (a, b):
            watch(a)
            watch(b)
            async with open_channels(a, specs) as ca, open_channels(b, specs) as cb:
                received = []

                async def bulk_sender() -> None:
                    for i in range(200):
                        await ca[BULK].send(i.to_bytes(4, "big") * 250)

                async def bulk_consumer() -> None:
                    async for message in cb[BULK]:
                        received.append(int.from_bytes(message.data[:4], "big"))
                        if len(received) == 200:
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
                assert received == list(range(200))
    # Nothing of the control channel travelled on the pair's own stream, either way.
    assert on_stream_0 and CONTROL not in on_stream_0
