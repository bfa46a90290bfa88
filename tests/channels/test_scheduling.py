"""What goes on the wire first when the session is the bottleneck: strict priority, then weight."""

from __future__ import annotations

from echo.channels import wire
from echo.channels.core import ChannelPeer, ChannelSpec
from tests.channels.pair import settle


def peers(specs):
    a, b = ChannelPeer(specs), ChannelPeer(specs)
    settle(a, b)
    return a, b


def channels_of(batch: bytes) -> list[int]:
    return [f.channel for f in wire.decode_frames(batch) if isinstance(f, wire.Data)]


def test_strict_priority():
    a, _ = peers(
        [ChannelSpec(0, capacity=1 << 20, priority=0), ChannelSpec(1, capacity=1 << 20, priority=1)]
    )
    for _ in range(50):
        a.send(1, b"b" * 100)
    batch = a.data_to_send(1000)
    assert set(channels_of(batch)) == {1}
    for _ in range(5):
        a.send(0, b"c" * 100)
    # The urgent channel jumps the bulk backlog entirely.
    assert channels_of(a.data_to_send(1000))[:5] == [0] * 5


def test_weighted_sharing_within_a_priority():
    a, _ = peers(
        [
            ChannelSpec(0, capacity=1 << 20, weight=1),
            ChannelSpec(1, capacity=1 << 20, weight=3),
            ChannelSpec(2, capacity=1 << 20, weight=1, priority=5),
        ]
    )
    for _ in range(400):
        a.send(0, b"x" * 100)
        a.send(1, b"y" * 100)
        a.send(2, b"z" * 100)
    sent = [0, 0, 0]
    for _ in range(40):  # a back-pressured session: small messages, both channels backlogged
        for channel in channels_of(a.data_to_send(1000)):
            sent[channel] += 1
    assert sent[2] == 0  # lower priority waits while the others have anything
    assert 2.8 <= sent[1] / sent[0] <= 3.2


def test_an_idle_channel_gets_no_saved_up_credit():
    a, _ = peers([ChannelSpec(0, capacity=1 << 20), ChannelSpec(1, capacity=1 << 20)])
    for _ in range(300):
        a.send(0, b"x" * 100)
    for _ in range(20):
        a.data_to_send(1000)  # channel 0 alone for a while
    for _ in range(300):
        a.send(1, b"y" * 100)
    counts = [0, 0]
    for _ in range(10):
        for channel in channels_of(a.data_to_send(1000)):
            counts[channel] += 1
    assert abs(counts[0] - counts[1]) <= 2  # shares from now on, no burst for channel 1


def test_a_channel_waiting_for_guarantees_does_not_block_others():
    a, _ = peers([ChannelSpec(0, capacity=200), ChannelSpec(1, capacity=1 << 20, priority=1)])
    for _ in range(5):
        a.send(0, b"x" * 100)  # only two fit the guarantees; three wait
    a.send(1, b"y" * 100)
    assert channels_of(a.data_to_send(1 << 16)) == [0, 0, 1]


def test_max_message_aggregates_guarantees_of_an_emptied_buffer():
    """With a declared largest message, a receiver whose buffer just emptied keeps the
    guarantees it freed until a quarter of the buffer is free or the sender holds fewer than
    one largest message; without one, it hands them back after every message."""
    for max_message, frames_back in ((None, 40), (100, 1)):
        a, b = peers([ChannelSpec(0, capacity=4000, max_message=max_message)])
        back = 0
        for _ in range(40):
            a.send(0, b"x" * 30)
            b.receive(a.data_to_send())
            b.release(b.take(0))
            data = b.data_to_send()
            if data:
                back += 1
                a.receive(data)
        assert back == frames_back
        # Never short: a largest message always goes out at once.
        assert a.guarantees(0) >= (max_message or 30)


def test_max_message_never_leaves_the_sender_waiting():
    """Messages of every size up to max_message, each processed at once: none ever waits for
    guarantees (the receiver tops up whenever fewer than max_message remain)."""
    import random

    rng = random.Random(7)
    a, b = peers([ChannelSpec(0, capacity=1000, max_message=300)])
    for _ in range(2000):
        a.send(0, b"y" * rng.randint(0, 300))
        data = a.data_to_send()
        assert data  # it went out: the guarantees covered it
        b.receive(data)
        b.release(b.take(0))
        back = b.data_to_send()
        if back:
            a.receive(back)
    assert b.counters["messages_dropped"] == 0


def test_max_message_is_enforced_on_the_sender():
    import pytest

    from echo.channels.core import ChannelUsageError

    a, _ = peers([ChannelSpec(0, capacity=1000, max_message=300)])
    a.send(0, b"z" * 300)
    with pytest.raises(ChannelUsageError):
        a.send(0, b"z" * 301)
    with pytest.raises(ChannelUsageError):
        ChannelSpec(1, max_message=0)
