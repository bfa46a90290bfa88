"""Unit tests of retransmit.py: which NAKed ranges a publication resends, and when."""

from __future__ import annotations

import math

from echo.transport.core.retransmit import RetransmitHandler

LINGER = 0.01


def test_a_naked_range_is_resent_once_then_lingers() -> None:
    handler = RetransmitHandler(max_in_flight=4, linger=LINGER)
    assert not handler
    assert handler.on_nak(1024, 512, now=1.0)
    assert handler and handler.next_deadline(1.0) == 1.0  # due at once
    assert handler.due(1.0) == [(1024, 512)]
    assert handler.due(1.001) == []  # sent: not again
    assert handler.next_deadline(1.001) == 1.0 + LINGER  # wake when the linger ends
    assert handler.due(1.0 + LINGER) == [] and not handler  # and then it is gone


def test_naks_overlapping_a_lingering_resend_are_ignored() -> None:
    handler = RetransmitHandler(max_in_flight=4, linger=LINGER)
    handler.on_nak(1024, 512, now=1.0)
    handler.due(1.0)
    assert not handler.on_nak(1024, 512, now=1.005)  # the same gap: a duplicate NAK
    assert not handler.on_nak(1500, 100, now=1.005)  # overlaps the end
    assert not handler.on_nak(900, 200, now=1.005)  # overlaps the start
    assert handler.on_nak(1536, 64, now=1.005)  # right after it: a different gap
    assert handler.on_nak(512, 512, now=1.005)  # ends where it starts: a different gap too
    assert handler.due(1.005) == [(1536, 64), (512, 512)]


def test_a_nak_after_the_linger_is_resent_again() -> None:
    handler = RetransmitHandler(max_in_flight=4, linger=LINGER)
    handler.on_nak(1024, 512, now=1.0)
    handler.due(1.0)
    # The resend was lost too: the receiver NAKs again after its retry delay.
    assert handler.on_nak(1024, 512, now=1.0 + LINGER)
    assert handler.due(1.0 + LINGER) == [(1024, 512)]


def test_a_nak_overlapping_an_unsent_resend_is_ignored() -> None:
    handler = RetransmitHandler(max_in_flight=4, linger=LINGER)
    handler.on_nak(0, 256, now=1.0)
    assert not handler.on_nak(128, 256, now=1.0)
    assert handler.due(1.0) == [(0, 256)]


def test_at_most_max_in_flight_resends_and_room_returns_after_the_linger() -> None:
    handler = RetransmitHandler(max_in_flight=2, linger=LINGER)
    assert handler.on_nak(0, 32, now=1.0)
    assert handler.on_nak(64, 32, now=1.0)
    assert not handler.on_nak(128, 32, now=1.0)  # full
    assert handler.due(1.0) == [(0, 32), (64, 32)]
    assert not handler.on_nak(128, 32, now=1.0 + LINGER / 2)  # still lingering: still full
    assert handler.on_nak(128, 32, now=1.0 + LINGER)


def test_nothing_in_flight_has_no_deadline() -> None:
    handler = RetransmitHandler(max_in_flight=1, linger=LINGER)
    assert handler.next_deadline(5.0) == math.inf


def test_a_resend_cut_short_is_due_again_from_where_it_stopped() -> None:
    handler = RetransmitHandler(max_in_flight=4, linger=LINGER)
    handler.on_nak(0, 4096, now=1.0)
    handler.on_nak(8192, 1024, now=1.0)
    assert handler.due(1.0) == [(0, 4096), (8192, 1024)]
    # The socket was full after 1,408 bytes of the first: neither is on its way.
    handler.unsent(0, 1408)
    handler.unsent(8192, 8192)
    assert handler.next_deadline(1.0) == 1.0
    assert not handler.on_nak(2048, 512, now=1.0)  # still a duplicate of a resend to come
    assert handler.due(1.0) == [(1408, 4096 - 1408), (8192, 1024)]
    handler.unsent(1408, 4096)  # all of it went: nothing is left to send
    assert handler.next_deadline(1.0) == 1.0 + LINGER
