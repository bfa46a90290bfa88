"""Data handles as the resource-management note describes them: consecutive numbers, three-step
FreeHandle with reference counts, optimistic references resolved by processing pending binds
first."""

from __future__ import annotations

import pytest

from echo.channels.core import ChannelPeer, ChannelSpec, ChannelUsageError, OutState
from echo.channels.wire import FreeHandle, HandleRef
from tests.channels.pair import settle, step

SPECS = [ChannelSpec(0, capacity=100), ChannelSpec(2, capacity=20, handles=True)]


def pair(bind_capacity=20):
    specs = [ChannelSpec(0, capacity=100), ChannelSpec(2, capacity=bind_capacity, handles=True)]
    a, b = ChannelPeer(specs), ChannelPeer(specs)
    settle(a, b)
    return a, b


def test_handles_are_consecutive_and_bound_in_order():
    a, b = pair()
    assert [a.bind(2, bytes([i])) for i in range(3)] == [0, 1, 2]
    settle(a, b)
    assert b.pending_binds(2) == 3  # buffered, not yet processed
    assert b.process_binds(2) == [0, 1, 2]
    assert b.live_handles(2, mine=False) == {0: b"\x00", 1: b"\x01", 2: b"\x02"}
    assert a.live_handles(2, mine=True) == b.live_handles(2, mine=False)


def test_reference_processes_pending_binds_first():
    a, b = pair()
    h = a.bind(2, b"value", optimistic=True)
    a.send(0, b"use", optimistic=True, refs=[HandleRef(2, h, True)])
    settle(a, b)
    # b never ran process_binds: the reference did it.
    assert b.pending_binds(2) == 0
    delivery = b.take(0)
    assert delivery.refs == (HandleRef(2, h, True),)
    assert b.handle_value(2, h, mine=False) == b"value"


def test_three_step_free_waits_for_buffered_references():
    a, b = pair()
    h = a.bind(2, b"v")
    settle(a, b)
    b.process_binds(2)
    a.send(0, b"m", refs=[HandleRef(2, h, True)])
    settle(a, b)
    held = b.take(0)
    a.free(2, h, mine=True)  # step 1: proposal; a will not refer to h any more
    step(a, b)
    assert b.theirs[2][h].peer_freed  # step 2: b marks it and confirms
    assert b.control[-1] == FreeHandle(2, h, False)
    step(b, a)  # step 3: a marks it; nothing of a's references it: gone
    assert h not in a.own[2]
    assert h in b.theirs[2]  # still referenced by a buffered message
    with pytest.raises(ChannelUsageError):
        a.send(0, b"x", refs=[HandleRef(2, h, True)])
    b.release(held)
    assert h not in b.theirs[2]
    # The binding's bytes went back to the bind channel: its guarantees return.
    settle(a, b)
    assert a.guarantees(2) == 20


def test_concurrent_proposals_confirm_each_other():
    a, b = pair()
    h = a.bind(2, b"v")
    settle(a, b)
    b.process_binds(2)
    a.free(2, h, mine=True)
    b.free(2, h, mine=False)
    from_a, from_b = a.data_to_send(), b.data_to_send()
    b.receive(from_a)
    a.receive(from_b)
    assert h not in a.own[2] and h not in b.theirs[2]
    # No third FreeHandle: each proposal was the other's confirmation.
    assert not any(isinstance(f, FreeHandle) for f in [*a.control, *b.control])
    assert a.failure is None and b.failure is None


def test_free_waits_for_own_unconfirmed_references():
    """A proposal never overtakes a message of ours that may still be retransmitted."""
    a, b = pair()
    h = a.bind(2, b"v")
    settle(a, b)
    b.resize(0, 0)  # no room on channel 0: the next message stays unconfirmed
    settle(a, b)
    out = a.send(0, b"m", optimistic=True, refs=[HandleRef(2, h, True)])
    a.free(2, h, mine=True)
    assert not any(isinstance(f, FreeHandle) for f in a.control)
    step(a, b)  # dropped by b
    b.resize(0, 100)
    settle(a, b)
    assert out.state is OutState.SETTLED
    assert h not in a.own[2]  # freed after the retransmission landed
    delivery = b.take(0)
    assert delivery.data == b"m" and b.theirs[2][h].refcount == 1
    b.release(delivery)
    assert h not in b.theirs[2]


def test_reference_to_dropped_bind_is_discarded_and_reported():
    """The bind channel is full: the optimistic bind is dropped, the message using it is
    discarded by b and a infers it from the ANNOUNCE_DROPPING, exactly once."""
    a, b = pair(bind_capacity=4)
    first = a.bind(2, b"1234")
    settle(a, b)
    late = a.bind(2, b"xy", optimistic=True)
    user = a.send(0, b"use", optimistic=True, refs=[HandleRef(2, late, True)])
    settle(a, b)
    assert b.counters["messages_discarded"] == 1
    assert [e.message for e in a.events] == [user]
    assert user.state is OutState.DISCARDED
    assert b.take(0) is None
    # The bind itself is retransmitted once there is room, with the same number.
    b.process_binds(2)
    b.resize(2, 10)
    settle(a, b)
    b.process_binds(2)
    assert b.live_handles(2, mine=False) == {first: b"1234", late: b"xy"}


def test_guaranteed_reference_waits_for_its_bind_and_is_never_discarded():
    a, b = pair(bind_capacity=4)
    a.bind(2, b"1234")
    settle(a, b)
    late = a.bind(2, b"xy", optimistic=True)  # will be dropped: the bind channel is full
    user = a.send(0, b"use", refs=[HandleRef(2, late, True)])  # not optimistic
    settle(a, b)
    assert user.state is OutState.QUEUED  # held back: its bind is not sure to be bound
    assert b.counters["messages_discarded"] == 0 and not a.events
    b.resize(2, 10)
    settle(a, b)
    assert user.state is OutState.SETTLED
    delivery = b.take(0)
    assert delivery.data == b"use" and b.handle_value(2, late, mine=False) == b"xy"
