"""MDC destination tables (as in Aeron's MDC): what is added, refreshed, refused and expired.

test_mdc.py has the two regressions Aeron itself had; these pin the rest of the table's rules.
"""

from __future__ import annotations

from echo.transport.core.destinations import (
    DEFAULT_MAX_DESTINATIONS,
    DESTINATION_TIMEOUT,
    DynamicDestinations,
    ManualDestinations,
)

A = ("10.0.0.1", 4001)
B = ("10.0.0.2", 4002)
C = ("10.0.0.3", 4003)


def test_defaults() -> None:
    table = DynamicDestinations()
    assert table.timeout == DESTINATION_TIMEOUT == 5.0
    assert table.max_destinations == DEFAULT_MAX_DESTINATIONS == 1024
    assert len(table) == 0
    assert table.addresses == []
    assert not table.has_address(A)
    assert not table.contains(1, A)
    assert table.next_expiry() is None
    assert table.expire(now=1e9) == 0


def test_added_then_refreshed() -> None:
    table = DynamicDestinations()
    assert table.on_status_message(1, A, now=0.0) == "added"
    assert table.on_status_message(1, A, now=1.0) == "refreshed"
    assert len(table) == 1
    assert table.contains(1, A)
    assert not table.contains(2, A)
    assert not table.contains(1, B)
    assert table.has_address(A)
    assert not table.has_address(B)
    assert table.addresses == [A]


def test_addresses_are_deduplicated_in_first_seen_order() -> None:
    # Two receivers behind one address get one copy of each datagram, not two.
    table = DynamicDestinations()
    table.on_status_message(1, B, now=0.0)
    table.on_status_message(2, A, now=0.0)
    table.on_status_message(3, B, now=0.0)
    assert len(table) == 3
    assert table.addresses == [B, A]
    assert table.remove_receiver(1, B)
    # Receiver 3 still wants B; the order follows the surviving registrations.
    assert table.addresses == [A, B]
    assert table.remove_receiver(3, B)
    assert table.addresses == [A]
    assert not table.has_address(B)


def test_remove_receiver_of_an_unknown_pair() -> None:
    table = DynamicDestinations()
    table.on_status_message(1, A, now=0.0)
    assert not table.remove_receiver(2, A)
    assert not table.remove_receiver(1, B)
    assert table.addresses == [A]
    assert table.remove_receiver(1, A)
    assert len(table) == 0
    assert table.addresses == []


def test_a_full_table_refuses_newcomers_but_refreshes_members() -> None:
    table = DynamicDestinations(max_destinations=2)
    assert table.on_status_message(1, A, now=0.0) == "added"
    assert table.on_status_message(2, B, now=0.0) == "added"
    assert table.on_status_message(3, C, now=0.0) == "refused"
    assert table.on_status_message(1, A, now=1.0) == "refreshed"
    assert table.addresses == [A, B]
    assert not table.has_address(C)
    table.remove_receiver(2, B)
    assert table.on_status_message(3, C, now=1.0) == "added"


def test_expiry_is_strictly_after_the_timeout() -> None:
    table = DynamicDestinations(timeout=5.0)
    table.on_status_message(1, A, now=0.0)
    table.on_status_message(2, B, now=1.0)
    assert table.next_expiry() == 5.0
    assert table.expire(now=5.0) == 0  # exactly at the timeout: still live
    assert table.expire(now=5.5) == 1
    assert table.addresses == [B]
    assert not table.has_address(A)
    assert table.next_expiry() == 6.0
    table.on_status_message(2, B, now=5.9)  # a refresh moves its deadline
    assert table.next_expiry() == 10.9
    assert table.expire(now=6.5) == 0
    assert table.expire(now=11.0) == 1
    assert table.next_expiry() is None


def test_manual_destinations() -> None:
    table = ManualDestinations()
    assert len(table) == 0
    assert table.add(A)
    assert table.add(B)
    assert not table.add(A)
    assert len(table) == 2
    assert table.addresses == [A, B]
    assert table.remove(A)
    assert not table.remove(A)
    assert table.addresses == [B]
    assert len(table) == 1
