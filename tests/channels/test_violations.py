"""A peer that breaks the rules of the resource-management note fails the session with a reason,
never raises."""

from __future__ import annotations

import pytest

from echo.channels import wire
from echo.channels.core import ChannelClosedError, ChannelPeer, ChannelSpec, ChannelUsageError
from echo.channels.wire import (
    Absolve,
    AnnounceDropping,
    Apologise,
    Data,
    FreeHandle,
    Guarantee,
    HandleRef,
    LimitReceiving,
    LimitSending,
)
from tests.channels.pair import peers, settle, state, step


def fed(*frames, capacity=10):
    peer = ChannelPeer([ChannelSpec(0, capacity=capacity), ChannelSpec(2, capacity=10,
                                                                      handles=True)])
    peer.receive(b"".join(wire.encode(f) for f in frames))
    return peer


@pytest.mark.parametrize(
    ("frames", "reason"),
    [
        ((Data(9, b"x"),), "unknown channel 9"),
        ((Guarantee(9, 1),), "unknown channel 9"),
        ((LimitSending(0, 5), LimitSending(0, 5)), "loosens or repeats"),
        ((LimitSending(0, 5), LimitSending(0, 6)), "loosens or repeats"),
        ((LimitReceiving(0, 5), LimitReceiving(0, 7)), "loosens or repeats"),
        ((LimitSending(0, 3), Data(0, b"abcd")), "past the peer's own sending bound"),
        ((Absolve(0, 11),), "exceeds the 10 guaranteed"),
        ((AnnounceDropping(0),), "a guaranteed message was dropped"),
        ((Apologise(0),), "not dropping"),
        ((Data(0, b"x", (HandleRef(2, 0, False),)),), "freed or unknown handle"),
        ((FreeHandle(2, 0, True),), "unknown or already freed"),
        ((Data(2, b"x"),), "wrong message kind"),
    ],
)
def test_violation_is_a_reason(frames, reason):
    peer = fed(*frames)
    assert peer.failure is not None and reason in peer.failure
    assert peer.data_to_send() == b""  # a failed peer says nothing more


def test_message_past_our_receiving_bound_is_dropped_not_accepted():
    """Past the bound, a message cannot have been guaranteed (guarantees stay within it): it
    was optimistic, perhaps sent before the LIMIT_RECEIVING reached the client. Dropped and
    announced like any optimistic overflow; the bound holds and nobody is failed for a race."""
    client, server = peers(10, auto_issue=True)
    settle(client, server)
    server.limit_receiving(0, 10)
    step(server, client)
    raw = wire.encode(Data(0, b"x" * 11))  # optimistic, past the bound
    server.receive(raw)
    assert server.failure is None
    assert server.incoming[0].accepted == 0 and server.take(0) is None
    assert server.counters["messages_dropped"] == 1
    assert AnnounceDropping(0) in wire.decode_frames(server.data_to_send())


def test_an_optimistic_message_crossing_a_limit_receiving_fails_nobody():
    """The race the model test found: the client's optimistic message is on the wire when the
    server bounds what it receives to what it has guaranteed (nothing, after a shrink)."""
    client, server = peers(24, auto_issue=True)
    settle(client, server)
    server.resize(0, 0)  # pleads for everything back
    step(server, client)
    step(client, server)  # the absolution
    assert client.guarantees(0) == 0 and server.incoming[0].outstanding == 0
    client.send(0, b"x" * 10, optimistic=True)
    in_flight = client.data_to_send()
    server.limit_receiving(0, 0)
    server.receive(in_flight)
    assert server.failure is None and server.incoming[0].accepted == 0
    step(server, client)  # LIMIT_RECEIVING, then ANNOUNCE_DROPPING: the client refunds
    assert client.failure is None and client.closed_for_sending(0)
    step(client, server)  # its APOLOGISE; the message waits for guarantees that never come
    assert server.failure is None and not server.incoming[0].dropping
    assert server.incoming[0].accepted == 0


def test_guaranteed_message_dropped_is_detected_by_the_client():
    client, server = peers(10, auto_issue=True)
    settle(client, server)
    client.send(0, b"abc")
    step(client, server)
    client.receive(wire.encode(AnnounceDropping(0)))  # a lying server
    assert "guaranteed message was dropped" in client.failure


def test_local_misuse_raises():
    client, server = peers(10, auto_issue=True)
    with pytest.raises(ChannelUsageError):
        client.send(5, b"x")
    with pytest.raises(ChannelUsageError):
        client.bind(0, b"x")
    settle(client, server)
    client.limit_sending(0, 4)
    with pytest.raises(ChannelUsageError, match="only tighten"):
        client.limit_sending(0, 4)
    with pytest.raises(ChannelClosedError):
        client.send(0, b"abcde")
    with pytest.raises(ChannelUsageError, match="plead first"):
        server.limit_receiving(0, 3)  # 10 bytes are already guaranteed


def test_bounds_close_a_channel_both_ways():
    """limit_sending(0): the receiver sees the channel finished once its buffer is empty."""
    client, server = peers(10, auto_issue=True)
    settle(client, server)
    client.send(0, b"abc")
    client.limit_sending(0, 0)
    settle(client, server)
    assert client.closed_for_sending(0)
    assert not server.finished_receiving(0)
    server.release(server.take(0))
    assert server.finished_receiving(0)
    # The server's bound: plead everything back, then accept nothing more.
    client2, server2 = peers(10, auto_issue=True)
    settle(client2, server2)
    server2.resize(0, 0)
    settle(client2, server2)
    assert client2.guarantees(0) == 0 and state(server2) == (0, 0, 0)
    server2.limit_receiving(0, 0)
    settle(client2, server2)
    assert client2.closed_for_sending(0)
    with pytest.raises(ChannelClosedError):
        client2.send(0, b"x", optimistic=True)
