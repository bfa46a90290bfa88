"""The channel codec: round trips, and hostile bytes that may raise only WireError."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from echo.channels import wire
from echo.channels.core import ChannelPeer, ChannelSpec
from echo.channels.wire import (
    Absolve,
    AnnounceDropping,
    Apologise,
    Bind,
    Data,
    FreeHandle,
    Guarantee,
    HandleRef,
    LimitReceiving,
    LimitSending,
    Plead,
    WireError,
)

ids = st.integers(0, wire.MAX_VARINT)
small = st.integers(0, 1 << 20)
refs = st.builds(HandleRef, ids, ids.map(lambda v: v >> 1), st.booleans())
frames = st.one_of(
    st.builds(Data, ids, st.binary(max_size=300), st.lists(refs, max_size=4).map(tuple)),
    st.builds(Bind, ids, st.binary(max_size=300)),
    st.builds(Guarantee, ids, ids),
    st.builds(Absolve, ids, ids),
    st.builds(Plead, ids, ids),
    st.builds(LimitSending, ids, ids),
    st.builds(LimitReceiving, ids, ids),
    st.builds(AnnounceDropping, ids),
    st.builds(Apologise, ids),
    st.builds(FreeHandle, ids, ids.map(lambda v: v >> 1), st.booleans()),
)


@given(st.lists(frames, min_size=1, max_size=8))
def test_round_trip(batch):
    data = b"".join(wire.encode(f) for f in batch)
    assert wire.decode_frames(data) == batch


def test_known_bytes():
    """The table in docs/channels.md (Wire encoding), byte for byte."""
    assert wire.encode(Data(1, b"hi")) == bytes([0x01, 1, 2]) + b"hi"
    assert wire.encode(Data(1, b"", (HandleRef(2, 3, True),))) == bytes([0x02, 1, 1, 2, 7, 0])
    assert wire.encode(Bind(2, b"v")) == bytes([0x03, 2, 1]) + b"v"
    assert wire.encode(Guarantee(0, 300)) == bytes([0x10, 0, 0xAC, 0x02])
    assert wire.encode(Plead(5, 0)) == bytes([0x12, 5, 0])
    assert wire.encode(AnnounceDropping(7)) == bytes([0x15, 7])
    assert wire.encode(FreeHandle(2, 4, False)) == bytes([0x17, 2, 8])


def test_sizes_count_payload_not_framing():
    assert wire.message_size(Data(0, b"abc")) == 3
    assert wire.message_size(Data(0, b"")) == 1
    assert wire.message_size(Data(0, b"ab", (HandleRef(2, 0, True),))) == 4
    assert wire.message_size(Bind(2, b"")) == 1


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "empty"),
        (b"\x99\x00", "unknown frame kind"),
        (b"\x01\x00\x05ab", "runs past"),
        (b"\x10\x00", "truncated"),
        (b"\x10" + b"\xff" * 12, "longer than 9"),
        (b"\x02\x00\x00\x00", "reference count"),
        (b"\x02\x00\xff\xff\x03", "reference count"),
    ],
)
def test_hostile_bytes(data, why):
    with pytest.raises(WireError, match=why):
        wire.decode_frames(data)


@given(st.binary(max_size=200))
def test_random_bytes_raise_only_wire_error(data):
    try:
        wire.decode_frames(data)
    except WireError:
        pass


@given(st.lists(frames, min_size=1, max_size=4), st.data())
def test_truncated_or_flipped_raise_only_wire_error(batch, data):
    encoded = bytearray(b"".join(wire.encode(f) for f in batch))
    cut = data.draw(st.integers(0, len(encoded)))
    pos = data.draw(st.integers(0, len(encoded) - 1))
    encoded[pos] ^= data.draw(st.integers(1, 255))
    for candidate in (bytes(encoded[:cut]), bytes(encoded)):
        try:
            wire.decode_frames(candidate)
        except WireError:
            pass


@given(st.binary(max_size=200))
def test_peer_survives_any_bytes(data):
    """Garbage closes the session with a reason; it never raises out of receive()."""
    peer = ChannelPeer([ChannelSpec(0, capacity=100), ChannelSpec(2, capacity=50, handles=True)])
    peer.receive(data)
    peer.receive(data)
    assert peer.failure is None or isinstance(peer.failure, str)


@given(st.lists(frames, min_size=1, max_size=3))
def test_never_looks_like_a_session_error(batch):
    """echo.session reserves messages starting with b"ERROR " for close(reason)."""
    assert not b"".join(wire.encode(f) for f in batch).startswith(b"ERROR ")


@given(st.lists(st.tuples(st.integers(0, 200), st.binary(max_size=20000)), min_size=1, max_size=5))
def test_plain_messages_are_framed_as_encode_does_and_received_intact(messages):
    """The per-message paths (header + uncopied body on send, inline parse on receive) put the
    same bytes on the wire as `encode` and deliver what was sent, on one- and multi-byte
    channels and lengths alike."""
    specs = [ChannelSpec(c, capacity=1 << 20) for c in sorted({c for c, _ in messages})]
    sender, receiver = ChannelPeer(specs), ChannelPeer(specs)
    sender.receive(receiver.data_to_send())  # the initial guarantees, both ways
    receiver.receive(sender.data_to_send())
    for channel, payload in messages:
        out = sender.send(channel, payload)
        assert out.body is payload  # queued without a copy
        assert out.header + out.body == wire.encode(Data(channel, payload))
    batch = sender.data_to_send(1 << 30)
    # Channels of one priority share by weight: per channel, the order is the sending order.
    decoded = wire.decode_frames(batch)
    assert len(batch) == sum(len(wire.encode(Data(c, p))) for c, p in messages)
    receiver.receive(batch)
    assert receiver.failure is None
    for channel in {c for c, _ in messages}:
        sent = [p for c, p in messages if c == channel]
        assert [f.payload for f in decoded if f.channel == channel] == sent
        got = []
        while (delivery := receiver.take(channel)) is not None:
            got.append(delivery.data)
        assert got == sent


@given(frames)
def test_every_strict_prefix_of_a_frame_is_refused(frame):
    """A frame cut anywhere is a WireError (echo.codec's Buffer), never an IndexError."""
    data = wire.encode(frame)
    for cut in range(len(data)):
        with pytest.raises(WireError):
            wire.decode_frames(data[:cut])
