"""Channels on streams of their own (ChannelSpec.own_stream): head-of-line isolation."""

from __future__ import annotations

import pytest

from echo.channels import wire
from echo.channels.core import ChannelPeer, ChannelSpec, ChannelUsageError
from echo.channels.wire import HandleRef

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
