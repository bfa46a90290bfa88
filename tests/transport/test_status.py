"""Unit tests of status.py: when an image sends its status messages."""

from __future__ import annotations

import math

import pytest

from echo.transport.core.status import PROBE_REPEAT, WINDOW_UPDATE_MIN_GAP, StatusScheduler

WINDOW = 64 * 1024
MTU = 1408
INTERVAL = 0.2


def scheduler(now: float = 0.0) -> StatusScheduler:
    return StatusScheduler(join=0, window=WINDOW, mtu=MTU, interval=INTERVAL, now=now)


def test_the_first_sm_is_due_at_once_then_every_interval() -> None:
    status = scheduler(now=1.0)
    assert status.due(0, 0, 1.0)  # it is what connects the sender
    status.sent(0, 0, 1.0, retry_delay=0.01)
    assert not status.due(0, 0, 1.0 + INTERVAL / 2)
    assert status.due(0, 0, 1.0 + INTERVAL)


def test_a_quarter_window_of_consumption_is_reported_at_once() -> None:
    status = scheduler()
    status.sent(0, 0, 0.0, retry_delay=0.01)
    quarter = WINDOW // 4
    assert not status.threshold_reached(quarter - 32, hwm=quarter)
    assert status.threshold_reached(quarter, hwm=quarter)
    assert status.due(quarter, quarter, 0.001)
    status.sent(quarter, quarter, 0.001, retry_delay=0.01)
    assert status.last_sm_position == quarter
    assert not status.threshold_reached(quarter, hwm=quarter)


def test_a_sender_at_the_window_edge_gets_a_window_update_at_most_once_per_gap() -> None:
    status = scheduler()
    status.sent(0, 0, 0.0, retry_delay=0.01)
    edge_hwm = WINDOW - MTU  # the sender used up (nearly) the whole window
    assert status.threshold_reached(100, edge_hwm)  # any consumption is news to it
    assert status.due(100, edge_hwm, 0.0005) is False  # but not sooner than the gap
    assert status.window_update_at(100, edge_hwm) == pytest.approx(WINDOW_UPDATE_MIN_GAP)
    assert status.due(100, edge_hwm, WINDOW_UPDATE_MIN_GAP)
    # Far from the edge, a little consumption waits for the periodic SM.
    assert not status.window_update_due(100, 1000, 1.0)
    assert status.window_update_at(100, 1000) == math.inf


def test_a_heartbeat_at_the_edge_pulls_the_sm_in() -> None:
    status = scheduler()
    status.sent(0, 0, 0.0, retry_delay=0.01)
    status.on_heartbeat(WINDOW - MTU, now=0.05)  # the sender idles at the edge
    assert status.deadline == pytest.approx(0.05)


def test_an_idle_heartbeat_inside_the_window_does_not() -> None:
    status = scheduler()
    status.sent(0, 0, 0.0, retry_delay=0.01)
    status.on_heartbeat(1000, now=0.05)
    assert status.deadline == pytest.approx(INTERVAL)


def test_repeated_probes_from_one_position_pull_the_sm_in() -> None:
    status = scheduler()
    status.sent(0, 0, 0.0, retry_delay=0.01)
    status.on_heartbeat(1000, now=0.05)
    status.on_heartbeat(1000, now=0.05 + PROBE_REPEAT * 2)  # an idle sender's next beat
    assert status.deadline == pytest.approx(INTERVAL)
    status.on_heartbeat(1000, now=0.05 + PROBE_REPEAT * 2.5)  # a blocked sender's probe
    assert status.deadline == pytest.approx(0.05 + PROBE_REPEAT * 2.5)


def test_a_repeated_setup_means_our_sm_was_lost() -> None:
    status = scheduler()
    status.sent(0, 0, 0.0, retry_delay=0.01)
    status.on_setup(now=0.03)
    assert status.deadline == 0.03


def test_a_window_opening_sm_is_repeated_until_data_from_beyond_the_old_edge() -> None:
    status = scheduler()
    status.sent(0, 0, 0.0, retry_delay=0.01)
    hwm = WINDOW - MTU  # the sender stopped at the edge of the window we gave it
    status.sent(WINDOW // 2, hwm, 1.0, retry_delay=0.003)
    assert status.deadline == pytest.approx(1.003)  # a repair time, not the interval
    status.sent(WINDOW // 2, hwm, 1.003, retry_delay=0.003)
    assert status.deadline == pytest.approx(1.003 + 0.006)  # backing off
    status.on_new_data(WINDOW + 100)  # data beyond the old edge: the sender has the SM
    status.sent(WINDOW // 2, WINDOW + 100, 1.01, retry_delay=0.003)
    assert status.deadline == pytest.approx(1.01 + INTERVAL)


def test_one_heartbeat_where_everything_is_consumed_waits_and_its_repeat_is_answered() -> None:
    # The probe that follows a burst of data is one heartbeat at the sender's tail: answering
    # it was a third datagram for every message, so it waits for the periodic SM. A closing
    # publication waiting for proof of delivery probes again from the same position, and the
    # repeat is answered now.
    status = scheduler()
    status.sent(0, 0, 0.0, retry_delay=0.01)
    status.on_heartbeat(1000, now=0.05)
    assert status.deadline == pytest.approx(INTERVAL)
    status.on_heartbeat(1000, now=0.052)
    assert status.deadline == pytest.approx(0.052)


def test_a_heartbeat_at_the_edge_before_our_last_sm_means_that_sm_was_lost() -> None:
    status = scheduler()
    status.sent(0, 0, 0.0, retry_delay=0.01)
    status.sent(WINDOW // 2, WINDOW // 2, 0.1, retry_delay=0.01)  # opens the window to 1.5 W
    # The sender went on to the edge we gave it before, and stopped there: it never heard of
    # the SM that moved the edge on. Answer now, not at the periodic SM (0.3).
    status.on_heartbeat(WINDOW - MTU, now=0.15)
    assert status.deadline == pytest.approx(0.15)


def test_a_repeated_sm_that_grants_nothing_new_keeps_the_edge_before_it() -> None:
    status = scheduler()
    status.sent(0, 0, 0.0, retry_delay=0.01)
    status.sent(WINDOW // 2, WINDOW // 2, 0.1, retry_delay=0.01)  # opens the window to 1.5 W
    status.sent(WINDOW // 2, WINDOW // 2, 0.3, retry_delay=0.01)  # the periodic repeat
    # Both may have been lost: a sender still at the old edge is still answered at once.
    status.on_heartbeat(WINDOW - MTU, now=0.35)
    assert status.deadline == pytest.approx(0.35)


def test_a_heartbeat_where_everything_is_consumed_and_reported_waits() -> None:
    status = scheduler()
    status.sent(1024, 1024, 0.0, retry_delay=0.01)
    # The sender idles where our last SM already said all is consumed: nothing to tell it (an
    # SM per idle heartbeat would be noise).
    status.on_heartbeat(1024, now=0.05)
    assert status.deadline == pytest.approx(INTERVAL)


def test_a_heartbeat_at_the_edge_right_after_an_sm_waits_the_window_update_gap() -> None:
    status = scheduler()
    status.sent(0, 0, 0.0, retry_delay=0.01)
    status.on_heartbeat(WINDOW - MTU, now=WINDOW_UPDATE_MIN_GAP / 4)
    assert status.deadline == pytest.approx(WINDOW_UPDATE_MIN_GAP)


def test_heartbeats_a_full_probe_repeat_apart_are_an_idle_senders() -> None:
    status = scheduler()
    status.sent(0, 0, 0.0, retry_delay=0.01)
    status.on_heartbeat(1024, now=PROBE_REPEAT)
    status.on_heartbeat(1024, now=2 * PROBE_REPEAT)  # not closer together than PROBE_REPEAT
    assert status.deadline == pytest.approx(INTERVAL)


def test_data_up_to_the_old_edge_does_not_confirm_a_window_opening_sm() -> None:
    status = scheduler()
    status.sent(0, 0, 0.0, retry_delay=0.01)
    status.sent(WINDOW // 2, WINDOW - MTU, 1.0, retry_delay=0.003)
    # The old grant let the sender send up to WINDOW without our SM: only data beyond says
    # the SM arrived. So the SM is still repeated, backing off.
    status.on_new_data(WINDOW)
    status.sent(WINDOW // 2, WINDOW, 1.003, retry_delay=0.003)
    assert status.deadline == pytest.approx(1.003 + 0.006)


def test_a_sender_at_the_edge_gets_no_window_update_when_nothing_more_was_consumed() -> None:
    status = scheduler()
    status.sent(1024, 1024, 0.0, retry_delay=0.01)
    at_edge = 1024 + WINDOW - MTU  # the sender used up the window our SM gave it
    # Nothing consumed since that SM: an update would only repeat it (and a pending one would
    # wake the image at once, again and again, for nothing).
    assert not status.threshold_reached(1024, at_edge)
    assert not status.window_update_due(1024, at_edge, 0.1)
    assert status.window_update_at(1024, at_edge) == math.inf
    assert not status.due(1024, at_edge, 0.1)


def test_before_any_sm_no_earlier_window_update_holds_one_back() -> None:
    status = scheduler(now=5.0)
    at_edge = WINDOW - MTU
    assert status.window_update_due(100, at_edge, 5.0)
    assert status.window_update_at(100, at_edge) <= 5.0
    status.on_heartbeat(at_edge, now=5.0)
    assert status.deadline == 5.0


def test_a_heartbeat_beyond_the_old_edge_confirms_a_window_opening_sm() -> None:
    status = scheduler()
    status.sent(0, 0, 0.0, retry_delay=0.01)
    status.sent(WINDOW // 2, WINDOW - MTU, 1.0, retry_delay=0.003)  # frees a sender at the edge
    assert status.deadline == pytest.approx(1.003)  # repeated after a repair time
    # The sender heartbeats from beyond the old edge: it sent past it, so it had our SM (the
    # data in between was lost and will be NAKed). The repeats stop: back to the interval.
    status.on_heartbeat(WINDOW + 100, now=1.002)
    status.sent(WINDOW // 2, WINDOW - MTU, 1.003, retry_delay=0.003)
    assert status.deadline == pytest.approx(1.003 + INTERVAL)
    status.sent(WINDOW // 2, WINDOW - MTU, 1.203, retry_delay=0.003)
    assert status.deadline == pytest.approx(1.203 + INTERVAL)


def test_a_heartbeat_at_or_below_the_old_edge_does_not_confirm_it() -> None:
    status = scheduler()
    status.sent(0, 0, 0.0, retry_delay=0.01)
    status.sent(WINDOW // 2, WINDOW - MTU, 1.0, retry_delay=0.003)
    # The old grant let the sender reach WINDOW without our SM: a heartbeat there (or short of
    # it) says nothing about the SM, which is still repeated, backing off.
    status.on_heartbeat(WINDOW, now=1.001)
    status.sent(WINDOW // 2, WINDOW, 1.003, retry_delay=0.003)
    assert status.deadline == pytest.approx(1.003 + 0.006)
    status.on_heartbeat(WINDOW - MTU, now=1.005)
    status.sent(WINDOW // 2, WINDOW, 1.009, retry_delay=0.003)
    assert status.deadline == pytest.approx(1.009 + 0.012)
    # One byte beyond it does.
    status.on_heartbeat(WINDOW + 32, now=1.01)
    status.sent(WINDOW // 2, WINDOW + 32, 1.021, retry_delay=0.003)
    assert status.deadline == pytest.approx(1.021 + INTERVAL)


def test_a_heartbeat_beyond_the_granted_window_does_not_confirm_it() -> None:
    status = scheduler()
    status.sent(0, 0, 0.0, retry_delay=0.01)
    status.sent(WINDOW // 2, WINDOW - MTU, 1.0, retry_delay=0.003)
    # Our last SM granted up to WINDOW // 2 + WINDOW: no sender of ours can be beyond it, so a
    # heartbeat from there (forged) leaves the SM being repeated.
    status.on_heartbeat(WINDOW // 2 + WINDOW + 32, now=1.001)
    status.sent(WINDOW // 2, WINDOW, 1.003, retry_delay=0.003)
    assert status.deadline == pytest.approx(1.003 + 0.006)
    # At the granted edge itself it does.
    status.on_heartbeat(WINDOW // 2 + WINDOW, now=1.004)
    status.sent(WINDOW // 2, WINDOW, 1.009, retry_delay=0.003)
    assert status.deadline == pytest.approx(1.009 + INTERVAL)
