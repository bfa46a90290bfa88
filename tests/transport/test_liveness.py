"""Unit tests of liveness.py: the receivers a publication has heard from, and their timeouts."""

from __future__ import annotations

import math

from echo.transport.core.liveness import RECEIVER_EXPIRY_CHECK_INTERVAL, ReceiverLiveness

TIMEOUT = 5.0


def test_alive_while_some_receiver_sent_an_sm_within_the_timeout() -> None:
    liveness = ReceiverLiveness(TIMEOUT, now=0.0)
    assert not liveness.is_alive(0.0) and not liveness
    liveness.on_status_message(1, 0, now=1.0)
    assert liveness.is_alive(1.0 + TIMEOUT)
    assert not liveness.is_alive(1.0 + TIMEOUT + 0.001)
    liveness.on_status_message(2, 0, now=3.0)  # a second receiver keeps it alive longer
    assert liveness.is_alive(3.0 + TIMEOUT)


def test_a_silent_receiver_is_dropped_at_the_next_check_after_its_timeout() -> None:
    liveness = ReceiverLiveness(TIMEOUT, now=0.0)
    liveness.on_status_message(1, 0, now=0.0)
    liveness.on_status_message(2, 0, now=0.0)
    liveness.on_status_message(2, 0, now=4.0)
    assert liveness.expiry == TIMEOUT  # the first receiver's
    assert liveness.expire(TIMEOUT + 0.01)
    assert set(liveness.receivers) == {2}
    assert liveness.expiry == 4.0 + TIMEOUT
    # Checked at most every RECEIVER_EXPIRY_CHECK_INTERVAL: not again at once.
    assert not liveness.expire(TIMEOUT + 0.02)
    assert liveness.expire(TIMEOUT + 0.01 + RECEIVER_EXPIRY_CHECK_INTERVAL)
    assert liveness.expire(100.0) and not liveness and liveness.newest_sm == -math.inf


def test_a_goodbye_forgets_the_receiver_and_its_sm_time() -> None:
    liveness = ReceiverLiveness(TIMEOUT, now=0.0)
    liveness.on_status_message(1, 0, now=1.0)
    liveness.on_status_message(2, 0, now=2.0)
    liveness.forget(2)
    assert liveness.newest_sm == 1.0
    liveness.forget(7)  # unknown: nothing happens
    assert set(liveness.receivers) == {1}


def test_positions_only_move_forward_and_say_who_has_the_tail() -> None:
    liveness = ReceiverLiveness(TIMEOUT, now=0.0)
    liveness.on_status_message(1, 4096, now=1.0)
    liveness.on_status_message(1, 1024, now=1.1)  # a reordered, older SM
    liveness.on_status_message(2, 2048, now=1.0)
    assert liveness.receivers[1].position == 4096
    assert not liveness.all_at(4096) and liveness.all_at(2048)


def test_a_lingering_publication_waits_for_the_tail_or_two_sms_without_it() -> None:
    liveness = ReceiverLiveness(TIMEOUT, now=0.0)
    liveness.on_status_message(1, 0, now=0.0)
    liveness.on_status_message(1, 512, now=0.1)
    liveness.start_lingering()
    assert not liveness.all_caught_up(1024)
    liveness.on_status_message(1, 512, now=0.3)
    assert not liveness.all_caught_up(1024)
    liveness.on_status_message(1, 512, now=0.5)  # a second SM with a stale position
    assert liveness.all_caught_up(1024)


def test_a_lingering_publication_waits_for_a_receiver_that_is_still_consuming() -> None:
    # A slow subscriber (a loaded machine) reports progress on each timer SM without reaching
    # the tail yet: it is not stale, and end-of-stream would make an Aeron 1.15 image drop
    # before it could prove the tail arrived.
    liveness = ReceiverLiveness(TIMEOUT, now=0.0)
    liveness.on_status_message(1, 0, now=0.0)
    liveness.start_lingering()
    for i, position in enumerate((128, 256, 384, 512, 640), start=1):
        liveness.on_status_message(1, position, now=0.2 * i)
        assert not liveness.all_caught_up(1024)
    liveness.on_status_message(1, 640, now=1.2)
    assert not liveness.all_caught_up(1024)  # one SM without progress is not yet stale
    liveness.on_status_message(1, 640, now=1.4)
    assert liveness.all_caught_up(1024)
    liveness.on_status_message(1, 1024, now=1.6)
    assert liveness.all_caught_up(1024)


def test_forgetting_the_last_receiver_leaves_the_publication_not_alive() -> None:
    liveness = ReceiverLiveness(TIMEOUT, now=0.0)
    liveness.on_status_message(1, 0, now=1.0)
    assert liveness and liveness.is_alive(1.0)
    liveness.forget(1)
    assert not liveness and liveness.newest_sm == -math.inf
    assert not liveness.is_alive(1.0)


def test_a_receiver_exactly_one_timeout_silent_is_kept_when_an_older_one_is_dropped() -> None:
    # Aeron drops a receiver when lastSm + timeout < now: at equality it is still alive.
    liveness = ReceiverLiveness(TIMEOUT, now=0.0)
    liveness.on_status_message(1, 0, now=0.0)
    liveness.on_status_message(2, 0, now=1.0)
    assert liveness.expire(1.0 + TIMEOUT)
    assert set(liveness.receivers) == {2}
    assert liveness.newest_sm == 1.0 and liveness.expiry == 1.0 + TIMEOUT
