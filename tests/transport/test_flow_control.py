"""Sender flow control strategies ("Flow Control in Aeron"), driven by hand with a scripted clock.

The driver tests in test_mdc.py show the strategies at work over sockets; these pin the rules
themselves: which receiver sets the limit, which SMs count, when a receiver is forgotten.
"""

from __future__ import annotations

import pytest

from echo.transport.core.flow_control import (
    FLOW_CONTROL_RECEIVER_TIMEOUT,
    MaxMulticastFlowControl,
    MinMulticastFlowControl,
    UnicastFlowControl,
    make_flow_control,
)
from echo.transport.core.frames import SM_EOS_FLAG, StatusMessage
from echo.transport.core.uri import FlowControlSpec

WINDOW = 1000


def sm(
    receiver_id: int, *, window: int = WINDOW, group_tag: int | None = None, flags: int = 0
) -> StatusMessage:
    return StatusMessage(
        session_id=1,
        stream_id=2,
        consumption_term_id=0,
        consumption_term_offset=0,
        receiver_window=window,
        receiver_id=receiver_id,
        group_tag=group_tag,
        flags=flags,
    )


# ------------------------------------------------------------------ unicast and max


def test_unicast_limit_is_position_plus_window_and_never_goes_back() -> None:
    fc = UnicastFlowControl()
    assert fc.on_status_message(sm(1), 5000, sender_limit=0, now=0.0) == 6000
    # An older (reordered) SM must not pull the limit back: data up to it may be sent already.
    assert fc.on_status_message(sm(1), 4000, sender_limit=6000, now=0.1) == 6000
    assert fc.on_status_message(sm(1, window=3000), 4000, sender_limit=6000, now=0.2) == 7000


def test_unicast_idle_keeps_the_limit_and_needs_no_receivers() -> None:
    fc = UnicastFlowControl()
    assert fc.on_idle(now=1e6, sender_limit=1234) == 1234
    assert fc.has_required_receivers()


def test_retransmit_window_multiples() -> None:
    # Aeron: unicast and min/tagged allow retransmits over 16 windows, max over 4.
    # Read from instances: compiled (mypyc) classes keep these as per-instance defaults.
    assert UnicastFlowControl().retransmit_window_multiple == 16
    assert MaxMulticastFlowControl().retransmit_window_multiple == 4
    assert MinMulticastFlowControl().retransmit_window_multiple == 16


def test_max_follows_the_fastest_receiver() -> None:
    fc = MaxMulticastFlowControl()
    limit = fc.on_status_message(sm(1), 1000, sender_limit=0, now=0.0)
    limit = fc.on_status_message(sm(2), 9000, sender_limit=limit, now=0.0)
    limit = fc.on_status_message(sm(1), 1000, sender_limit=limit, now=0.0)
    assert limit == 9000 + WINDOW


# ------------------------------------------------------------------ min


def test_min_follows_the_slowest_receiver() -> None:
    fc = MinMulticastFlowControl()
    assert fc.on_status_message(sm(1), 9000, sender_limit=0, now=0.0) == 9000 + WINDOW
    assert fc.on_status_message(sm(2), 2000, sender_limit=10000, now=0.0) == 2000 + WINDOW
    # The slow one catches up past the fast one: the fast one now holds the limit.
    assert fc.on_status_message(sm(2), 12000, sender_limit=3000, now=0.1) == 9000 + WINDOW


def test_min_receiver_position_only_moves_forward() -> None:
    fc = MinMulticastFlowControl()
    fc.on_status_message(sm(1), 5000, sender_limit=0, now=0.0)
    assert fc.on_status_message(sm(1), 3000, sender_limit=0, now=0.1) == 5000 + WINDOW
    assert fc.receivers[1].position_plus_window == 5000 + WINDOW


def test_min_with_no_receivers_holds_the_limit() -> None:
    fc = MinMulticastFlowControl()
    assert fc.on_idle(now=0.0, sender_limit=777) == 777
    assert fc.has_required_receivers()  # group min size 0


def test_an_end_of_stream_sm_removes_its_receiver() -> None:
    fc = MinMulticastFlowControl()
    fc.on_status_message(sm(1), 1000, sender_limit=0, now=0.0)
    fc.on_status_message(sm(2), 5000, sender_limit=0, now=0.0)
    # The slow receiver says goodbye: the fast one alone sets the limit.
    limit = fc.on_status_message(sm(1, flags=SM_EOS_FLAG), 1000, sender_limit=2000, now=0.1)
    assert limit == 5000 + WINDOW
    assert set(fc.receivers) == {2}
    # A goodbye from a receiver that is not (or no longer) tracked changes nothing.
    assert fc.on_status_message(sm(9, flags=SM_EOS_FLAG), 0, sender_limit=limit, now=0.2) == limit
    assert set(fc.receivers) == {2}


def test_the_last_goodbye_holds_the_limit() -> None:
    fc = MinMulticastFlowControl()
    fc.on_status_message(sm(1), 1000, sender_limit=0, now=0.0)
    assert fc.on_status_message(sm(1, flags=SM_EOS_FLAG), 1000, 2000, now=0.1) == 2000
    assert fc.receivers == {}


def test_a_slow_but_live_receiver_is_kept_past_the_timeout() -> None:
    # fc=min,t:2s: a receiver that keeps sending SMs is live however slowly it consumes, and
    # must keep holding the publisher back long after the timeout has gone by.
    fc = MinMulticastFlowControl(receiver_timeout=2.0)
    now = 0.0
    limit = fc.on_status_message(sm(1), 0, sender_limit=0, now=now)
    limit = fc.on_status_message(sm(2), 50_000, sender_limit=limit, now=now)
    while now < 20.0:
        now += 1.5  # each SM within the timeout of the one before
        limit = fc.on_status_message(sm(1), int(now * 10), sender_limit=limit, now=now)
        limit = fc.on_status_message(sm(2), 50_000, sender_limit=limit, now=now)
        limit = fc.on_idle(now, limit)
    assert set(fc.receivers) == {1, 2}
    assert limit == int(now * 10) + WINDOW


def test_a_vanished_receiver_is_dropped_after_the_timeout() -> None:
    fc = MinMulticastFlowControl(receiver_timeout=2.0)
    limit = fc.on_status_message(sm(1), 0, sender_limit=0, now=0.0)
    limit = fc.on_status_message(sm(2), 50_000, sender_limit=limit, now=0.0)
    limit = fc.on_status_message(sm(2), 50_000, sender_limit=limit, now=1.5)
    # Receiver 1's last SM was at 0.0: still tracked exactly at the timeout ...
    assert fc.on_idle(now=2.0, sender_limit=limit) == WINDOW
    assert set(fc.receivers) == {1, 2}
    # ... and gone just after it; the live one alone sets the limit.
    assert fc.on_idle(now=2.001, sender_limit=limit) == 50_000 + WINDOW
    assert set(fc.receivers) == {2}


def test_expiry_keeps_a_receiver_heard_exactly_one_timeout_ago() -> None:
    fc = MinMulticastFlowControl(receiver_timeout=2.0)
    fc.on_status_message(sm(1), 100, sender_limit=0, now=0.0)
    fc.on_status_message(sm(2), 200, sender_limit=0, now=1.0)
    # At 3.0 receiver 1 is past the timeout and receiver 2 exactly at it: only 1 goes.
    assert fc.on_idle(now=3.0, sender_limit=0) == 200 + WINDOW
    assert set(fc.receivers) == {2}


def test_receivers_are_tracked_by_their_id() -> None:
    fc = MinMulticastFlowControl()
    fc.on_status_message(sm(0x1234), 100, sender_limit=0, now=0.0)
    receiver = fc.receivers[0x1234]
    assert (receiver.receiver_id, receiver.position_plus_window, receiver.last_sm) == (
        0x1234,
        100 + WINDOW,
        0.0,
    )
    fc.on_status_message(sm(0x1234), 50, sender_limit=0, now=0.5)
    assert (receiver.position_plus_window, receiver.last_sm) == (100 + WINDOW, 0.5)


def test_idle_expiry_keeps_a_live_receiver_between_two_vanished_ones() -> None:
    # Aeron's in-place removal once dropped the live receiver in [idle, live, idle] (PR #2144).
    fc = MinMulticastFlowControl(receiver_timeout=1.0)
    for receiver_id in (1, 2, 3):
        fc.on_status_message(sm(receiver_id), receiver_id * 100, sender_limit=0, now=0.0)
    fc.on_status_message(sm(2), 200, sender_limit=0, now=1.0)
    assert fc.on_idle(now=1.5, sender_limit=0) == 200 + WINDOW
    assert list(fc.receivers) == [2]


def test_the_default_receiver_timeout_is_five_seconds() -> None:
    assert FLOW_CONTROL_RECEIVER_TIMEOUT == 5.0
    fc = MinMulticastFlowControl()
    fc.on_status_message(sm(1), 0, sender_limit=0, now=0.0)
    fc.on_idle(now=5.0, sender_limit=0)
    assert set(fc.receivers) == {1}
    fc.on_idle(now=5.01, sender_limit=0)
    assert fc.receivers == {}


def test_minimum_group_size_holds_the_limit_until_the_group_is_there() -> None:
    fc = MinMulticastFlowControl(group_min_size=2)
    assert not fc.has_required_receivers()
    assert fc.on_status_message(sm(1), 5000, sender_limit=100, now=0.0) == 100
    assert not fc.has_required_receivers()
    assert fc.on_idle(now=0.1, sender_limit=100) == 100
    assert fc.on_status_message(sm(2), 7000, sender_limit=100, now=0.2) == 5000 + WINDOW
    assert fc.has_required_receivers()


def test_tagged_counts_only_sms_with_its_tag() -> None:
    fc = MinMulticastFlowControl(group_tag=7)
    # An untagged slow receiver and one of another group are ignored entirely.
    assert fc.on_status_message(sm(1), 100, sender_limit=50, now=0.0) == 50
    assert fc.on_status_message(sm(2, group_tag=8), 100, sender_limit=50, now=0.0) == 50
    assert fc.receivers == {}
    assert fc.on_status_message(sm(3, group_tag=7), 9000, sender_limit=50, now=0.0) == 10000
    # An untagged goodbye does not remove a tagged receiver either.
    assert fc.on_status_message(sm(3, flags=SM_EOS_FLAG), 0, sender_limit=10000, now=0.1) == 10000
    assert set(fc.receivers) == {3}


def test_min_without_a_tag_counts_tagged_sms_too() -> None:
    fc = MinMulticastFlowControl()
    fc.on_status_message(sm(1, group_tag=5), 100, sender_limit=0, now=0.0)
    assert set(fc.receivers) == {1}


# ------------------------------------------------------------------ make_flow_control


def test_unicast_gets_unicast_flow_control_and_refuses_a_strategy() -> None:
    assert type(make_flow_control(None, multi_destination=False)) is UnicastFlowControl
    with pytest.raises(ValueError, match="unsupported unicast flow control strategy: fc=min"):
        make_flow_control(FlowControlSpec("min"), multi_destination=False)


def test_mdc_defaults_to_max() -> None:
    assert type(make_flow_control(None, multi_destination=True)) is MaxMulticastFlowControl
    spec = FlowControlSpec("max")
    assert type(make_flow_control(spec, multi_destination=True)) is MaxMulticastFlowControl


def test_min_takes_its_group_size_and_timeout() -> None:
    fc = make_flow_control(
        FlowControlSpec("min", group_min_size=3, receiver_timeout=0.3), multi_destination=True
    )
    assert isinstance(fc, MinMulticastFlowControl)
    assert (fc.group_tag, fc.group_min_size, fc.receiver_timeout) == (None, 3, 0.3)
    default = make_flow_control(FlowControlSpec("min"), multi_destination=True)
    assert isinstance(default, MinMulticastFlowControl)
    assert default.receiver_timeout == FLOW_CONTROL_RECEIVER_TIMEOUT


def test_tagged_takes_its_tag_and_needs_one() -> None:
    fc = make_flow_control(
        FlowControlSpec("tagged", group_tag=1001, group_min_size=2, receiver_timeout=1.0),
        multi_destination=True,
    )
    assert isinstance(fc, MinMulticastFlowControl)
    assert (fc.group_tag, fc.group_min_size, fc.receiver_timeout) == (1001, 2, 1.0)
    with pytest.raises(ValueError) as raised:
        make_flow_control(FlowControlSpec("tagged"), multi_destination=True)
    assert str(raised.value) == "fc=tagged needs a group tag, e.g. fc=tagged,g:1001"


def test_an_unknown_strategy_is_refused_not_defaulted() -> None:
    # FlowControlSpec itself refuses unknown names; this is the second line of defence for a
    # spec built some other way (a stand-in with the same fields).
    class Spec:
        strategy = "fastest"
        group_tag = None
        group_min_size = 0
        receiver_timeout = None

    with pytest.raises(ValueError) as raised:
        make_flow_control(Spec(), multi_destination=True)  # type: ignore[arg-type]
    assert str(raised.value) == "unknown flow control strategy: fc=fastest"
