"""ChannelPeer's local API at its edges (echo.channels.core): declarations, streams, withdraw,
absolve, has_output and the one-failure rule, each pinned where a slip would show."""

from __future__ import annotations

import pytest

from echo.channels import wire
from echo.channels.core import (
    ChannelClosedError,
    ChannelPeer,
    ChannelSpec,
    ChannelUsageError,
    OutState,
)
from echo.channels.wire import Absolve, Guarantee, HandleRef, LimitSending
from tests.channels.pair import peers, settle, step


def frames(peer: ChannelPeer, stream: int = 0) -> list[wire.Frame]:
    data = peer.data_to_send(1 << 16, stream)
    return list(wire.decode_frames(data)) if data else []


def test_a_channel_id_declared_twice_is_refused() -> None:
    with pytest.raises(ChannelUsageError, match=r"^duplicate channel id$"):
        ChannelPeer([ChannelSpec(3, capacity=1), ChannelSpec(3, capacity=2)])


def test_each_own_stream_channel_gets_the_next_stream_in_id_order() -> None:
    peer = ChannelPeer(
        [
            ChannelSpec(7, capacity=8, own_stream=True),
            ChannelSpec(0, capacity=8),
            ChannelSpec(4, capacity=8, own_stream=True),
        ]
    )
    assert peer.streams == 3
    assert peer.stream_of == {0: 0, 4: 1, 7: 2}
    assert len(peer.controls) == 3
    assert ChannelPeer([ChannelSpec(0, capacity=8)]).streams == 1


def test_a_message_over_max_message_is_refused_with_the_sizes() -> None:
    peer = ChannelPeer([ChannelSpec(5, capacity=64, max_message=8)])
    peer.send(5, b"x" * 8)
    with pytest.raises(
        ChannelUsageError, match=r"^a message of 9 bytes on channel 5, whose max_message is 8$"
    ):
        peer.send(5, b"x" * 9)


def test_a_peer_fails_once_and_counts_one_protocol_error() -> None:
    peer = ChannelPeer([ChannelSpec(0, capacity=10)])
    peer.receive(wire.encode(Guarantee(9, 1)))
    first = peer.failure
    assert first is not None and "unknown channel 9" in first
    peer.receive(wire.encode(Guarantee(8, 1)))
    assert peer.failure == first
    assert peer.counters["protocol_errors"] == 1


def test_has_output_by_stream_and_after_failure() -> None:
    specs = [ChannelSpec(0, capacity=0), ChannelSpec(1, capacity=0, own_stream=True)]
    peer = ChannelPeer(specs)
    assert not peer.has_output()
    assert not peer.has_output(0) and not peer.has_output(1)
    # a guaranteed message without guarantees waits: nothing to send
    peer.send(1, b"abc")
    assert not peer.has_output() and not peer.has_output(1)
    # an optimistic one goes now, on its channel's stream only
    peer.send(1, b"def", optimistic=True)
    assert not peer.has_output()  # the head of the queue is the guaranteed one
    other = ChannelPeer(specs)
    other.send(1, b"def", optimistic=True)
    assert other.has_output() and other.has_output(1) and not other.has_output(0)
    # a control frame counts as output on its own stream
    other.limit_sending(0, 5)
    assert other.has_output(0)
    other.receive(wire.encode(Guarantee(9, 1)))  # a violation: failed
    assert other.failure is not None
    assert not other.has_output() and not other.has_output(0) and not other.has_output(1)


def test_withdraw_takes_back_only_a_queued_data_message() -> None:
    client, server = peers(10, auto_issue=True)
    out = client.send(0, b"abcd")  # no guarantees yet: it waits in the queue
    assert client.withdraw(out) is True
    assert client.outgoing[0].queued_bytes == 0
    assert not client.outgoing[0].queue
    assert client.withdraw(out) is False  # not there any more
    settle(client, server)
    sent = client.send(0, b"efgh")
    assert step(client, server)
    assert sent.state is not OutState.QUEUED
    assert client.withdraw(sent) is False  # gone out already
    assert server.take(0) is not None


def test_withdraw_refuses_a_bind() -> None:
    client, _server = peers(10, handles=True)
    client.bind(0, b"v")
    bind = client.outgoing[0].queue[0]
    assert bind.handle is not None
    assert client.withdraw(bind) is False
    assert list(client.outgoing[0].queue) == [bind]


def test_absolve_within_the_guarantees_held() -> None:
    client, server = peers(10, auto_issue=True)
    settle(client, server)
    assert client.guarantees(0) == 10
    with pytest.raises(ChannelUsageError, match=r"^can absolve 1\.\.10, not 0$"):
        client.absolve(0, 0)
    with pytest.raises(ChannelUsageError, match=r"^can absolve 1\.\.10, not 11$"):
        client.absolve(0, 11)
    client.absolve(0, 10)  # all of them
    assert client.guarantees(0) == 0
    assert client.outgoing[0].absolved == 10
    assert frames(client) == [Absolve(0, 10)]


def test_absolve_past_the_own_sending_bound_is_refused() -> None:
    client, server = peers(10, auto_issue=True)
    settle(client, server)
    client.limit_sending(0, 4)
    assert frames(client) == [LimitSending(0, 4)]
    client.absolve(0, 4)  # exactly the bound
    with pytest.raises(ChannelClosedError, match=r"^absolution past our own sending bound$"):
        client.absolve(0, 1)
    assert client.guarantees(0) == 6


# --- usage errors name the mistake --------------------------------------------------------


def test_usage_errors_say_what_was_wrong() -> None:
    peer = ChannelPeer([ChannelSpec(0, capacity=4), ChannelSpec(2, capacity=4, handles=True)])
    with pytest.raises(ChannelUsageError, match=r"^unknown channel 9$"):
        peer.send(9, b"x")
    with pytest.raises(ChannelUsageError, match=r"^use bind\(\) on a handle channel$"):
        peer.send(2, b"x")
    with pytest.raises(
        ChannelUsageError, match=r"^a handle channel is read through process_binds$"
    ):
        peer.take(2)
    with pytest.raises(ChannelUsageError, match=r"^target must be >= 0$"):
        peer.plead(0, -1)
    peer.plead(0, 0)  # zero is a target


def test_channel_spec_bounds_are_inclusive() -> None:
    assert ChannelSpec(wire.MAX_VARINT, capacity=1).channel_id == wire.MAX_VARINT
    with pytest.raises(ChannelUsageError, match=r"out of range"):
        ChannelSpec(wire.MAX_VARINT + 1, capacity=1)
    assert ChannelSpec(0, capacity=1, max_message=1).max_message == 1
    with pytest.raises(ChannelUsageError, match=r"^max_message must be >= 1$"):
        ChannelSpec(0, capacity=1, max_message=0)


def test_a_freed_handle_cannot_be_referred_to() -> None:
    specs = [ChannelSpec(0, capacity=16), ChannelSpec(2, capacity=16, handles=True)]
    client, server = ChannelPeer(specs), ChannelPeer(specs)
    settle(client, server)
    handle = client.bind(2, b"value")
    assert client.handle_value(2, handle, mine=True) == b"value"
    with pytest.raises(ChannelUsageError, match=rf"^no handle {handle} of type 2$"):
        client.handle_value(2, handle, mine=False)
    client.free(2, handle, mine=True)
    with pytest.raises(ChannelUsageError, match=rf"^handle {handle} of type 2 is freed$"):
        client.send(0, b"x", refs=[HandleRef(2, handle, True)])


# --- the receive path's shortcut against the general decoder ------------------------------


@pytest.mark.parametrize("size", [1, 127, 128, 200, 255, 256, 16383, 16384, 16385, 20000])
def test_every_length_arrives_whole(size: int) -> None:
    client, server = peers(2 * size + 8, auto_issue=True)
    settle(client, server)
    payload = bytes(i % 251 for i in range(size))
    client.send(0, payload)
    client.send(0, b"after")
    settle(client, server)
    first, second = server.take(0), server.take(0)
    assert first is not None and first.data == payload and first.size == size
    assert second is not None and second.data == b"after"
    assert server.failure is None


@pytest.mark.parametrize("channel", [127, 128, 300])
def test_a_channel_id_past_one_byte_is_read_whole(channel: int) -> None:
    specs = [ChannelSpec(0, capacity=64), ChannelSpec(channel, capacity=64)]
    client, server = ChannelPeer(specs), ChannelPeer(specs)
    settle(client, server)
    client.send(channel, b"abc")
    client.send(0, b"zero")
    settle(client, server)
    got = server.take(channel)
    assert got is not None and (got.channel, got.data) == (channel, b"abc")
    zero = server.take(0)
    assert zero is not None and zero.data == b"zero"


def test_a_message_past_the_receiving_bound_is_dropped_not_buffered() -> None:
    client, server = peers(10)  # no guarantees issued: whatever comes is optimistic
    server.limit_receiving(0, 3)
    client.send(0, b"12345", optimistic=True)  # before the bound reached the client
    assert step(client, server)
    assert server.take(0) is None
    assert server.incoming[0].accepted == 0
    assert server.counters["messages_dropped"] == 1
    assert server.failure is None


def test_finished_receiving_counts_absolved_bytes_in_the_bound() -> None:
    client, server = peers(10, auto_issue=True)
    settle(client, server)
    client.absolve(0, 2)
    client.limit_sending(0, 3)  # sent 0 + absolved 2 + 3
    client.send(0, b"abc")
    settle(client, server)
    assert not server.finished_receiving(0)  # the message is still buffered
    delivery = server.take(0)
    assert delivery is not None
    server.release(delivery)
    assert server.finished_receiving(0)


@pytest.mark.parametrize(("capacity", "issued"), [(8, [Guarantee(0, 2)]), (9, [])])
def test_a_release_issues_at_a_quarter_of_the_buffer(
    capacity: int, issued: list[Guarantee]
) -> None:
    client, server = peers(capacity, auto_issue=True)
    settle(client, server)
    client.send(0, b"ab")
    client.send(0, b"cd")
    settle(client, server)
    assert server.incoming[0].used == 4
    delivery = server.take(0)
    assert delivery is not None
    server.release(delivery)
    # one message is still buffered: a guarantee goes out only once a quarter is free
    assert server.incoming[0].used == 2
    assert server.incoming[0].issuable == (0 if issued else 2)
    assert [f for f in frames(server) if isinstance(f, Guarantee)] == issued


# --- pleas, bounds and growth ------------------------------------------------------------


def test_a_plea_is_answered_down_to_its_target_and_no_further() -> None:
    client, server = peers(10, auto_issue=True)
    settle(client, server)
    server.plead(0, 6)
    assert step(server, client)
    assert client.guarantees(0) == 6 and client.outgoing[0].absolved == 4
    server.plead(0, 4)
    assert step(server, client)
    assert client.guarantees(0) == 4 and client.outgoing[0].absolved == 6
    for target in (4, 9):  # the client has no more than that already: ignored
        server.plead(0, target)
        assert step(server, client)
    assert list(client.control) == [Absolve(0, 4), Absolve(0, 2)]


def test_a_plea_stops_at_the_senders_own_bound() -> None:
    client, server = peers(10, auto_issue=True)
    settle(client, server)
    client.send(0, b"12345")  # queued, not yet on the wire
    client.limit_sending(0, 3)  # 5 queued + 3 more: the bound is 8
    server.plead(0, 0)
    assert step(server, client)
    assert [f for f in client.control if isinstance(f, Absolve)] == [Absolve(0, 3)]
    server.plead(0, 0)  # nothing left under the bound: no empty ABSOLVE
    assert step(server, client)
    assert [f for f in client.control if isinstance(f, Absolve)] == [Absolve(0, 3)]
    settle(client, server)
    assert client.failure is None and server.failure is None


def test_a_sending_bound_below_what_already_arrived_fails_the_peer() -> None:
    def server_fed(bound: int) -> ChannelPeer:
        server = ChannelPeer([ChannelSpec(0, capacity=10)])
        server.receive(
            wire.encode(wire.Data(0, b"abc"))
            + wire.encode(Absolve(0, 4))
            + wire.encode(LimitSending(0, bound))
        )
        return server

    failed = server_fed(6)
    assert failed.failure == "LIMIT_SENDING on channel 0 below bytes already sent"
    assert server_fed(7).failure is None  # 3 accepted + 4 absolved: exactly the bound


def test_growing_a_busy_buffer_issues_the_new_room_at_once() -> None:
    client, server = peers(40, auto_issue=True)
    settle(client, server)
    client.send(0, b"abcd")
    settle(client, server)  # buffered, not taken: guarantees would be aggregated
    assert not server.control
    server.resize(0, 44)
    assert list(server.control) == [Guarantee(0, 4)]


# --- bytes in, bytes out ----------------------------------------------------------------


def test_a_payload_is_taken_as_it_was_when_sent() -> None:
    client, server = peers(64, auto_issue=True)
    settle(client, server)
    buffer = bytearray(b"abc")
    client.send(0, buffer)
    buffer[:] = b"xyz"  # the caller reuses its buffer before the message went out
    settle(client, server)
    got = server.take(0)
    assert got is not None and got.data == b"abc" and type(got.data) is bytes


@pytest.mark.parametrize("kind", [bytearray, memoryview])
def test_a_session_message_of_any_buffer_type_delivers_bytes(kind: type) -> None:
    client, server = peers(64, auto_issue=True)
    settle(client, server)
    client.send(0, b"hello")
    client.send(0, b"there")
    server.receive(kind(client.data_to_send()))
    got = [server.take(0), server.take(0)]
    assert [d.data for d in got if d is not None] == [b"hello", b"there"]
    assert all(d is not None and type(d.data) is bytes for d in got)


@pytest.mark.parametrize("first", [128, 129, 200])
def test_a_two_byte_length_followed_by_another_message(first: int) -> None:
    # a length read wrongly would still fall inside the session message and cut it elsewhere
    client, server = peers(2048, auto_issue=True)
    settle(client, server)
    one, two = bytes([1]) * first, bytes([2]) * 300
    client.send(0, one)
    client.send(0, two)
    assert step(client, server)
    got = [server.take(0), server.take(0)]
    assert [d.data for d in got if d is not None] == [one, two]
