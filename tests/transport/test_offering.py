"""The offer path (offering.py) and the Message a subscription delivers (message.py), without a
driver: the gate's three outcomes (send now, wake the timer loop, nothing) and its clocks."""

from __future__ import annotations

import math
from typing import Any

import pytest

from echo.transport.compiled import loaded_compiled
from echo.transport.core.message import Message, format_address
from echo.transport.core.offering import BURST_GAP, Burst, OfferGate, Ticker
from echo.transport.core.publication import NetworkPublication


class FakePublication(NetworkPublication):
    """What the gate asks of a NetworkPublication: `offer(data, now)`. (A subclass, as the
    compiled gate takes only that type; nothing of the real one is set up or read.)"""

    def __init__(self, result: int = 64) -> None:  # (no super().__init__: not needed)
        self.result = result
        self.offers: list[tuple[bytes, float]] = []

    def offer(self, data: bytes | bytearray | memoryview, now: float) -> int:
        assert isinstance(data, bytes)
        self.offers.append((data, now))
        return self.result


class Driver:
    def __init__(self) -> None:
        self.pending: set[Any] = set()
        self.ticker = Ticker()
        self.time = 10.0
        self.flushed: list[tuple[Any, Any, float]] = []
        self.woken: list[Any] = []

    def flush(self, socket: Any, publication: Any, now: float) -> None:
        self.flushed.append((socket, publication, now))

    def wake(self, socket: Any) -> None:
        self.woken.append(socket)


def gate(result: int = 64) -> tuple[OfferGate, Driver, FakePublication, Burst, object]:
    driver, publication, burst, socket = Driver(), FakePublication(result), Burst(), object()
    g = OfferGate(
        publication,
        socket,
        burst,
        driver.pending,
        driver.ticker,
        lambda: driver.time,
        driver.flush,
        driver.wake,
    )
    return g, driver, publication, burst, socket


def test_an_offer_to_a_quiet_socket_is_flushed_at_once_with_the_clocks_time() -> None:
    g, driver, publication, _, socket = gate()
    assert g.offer(b"hello") == 64
    assert publication.offers == [(b"hello", 10.0)]
    assert driver.flushed == [(socket, publication, 10.0)]
    assert driver.woken == []


def test_flush_false_wakes_the_timer_loop_instead() -> None:
    g, driver, _, _, socket = gate()
    assert g.offer(b"x", False) == 64
    assert driver.woken == [socket] and driver.flushed == []
    assert g.offer(b"y", flush=False) == 64
    assert driver.woken == [socket, socket]


def test_a_socket_already_pending_needs_no_wake_for_a_flush_false_offer() -> None:
    g, driver, _, _, socket = gate()
    driver.pending.add(socket)
    g.offer(b"x", False)
    assert driver.woken == [] and driver.flushed == []


def test_the_middle_of_a_burst_is_left_to_the_timer_loop() -> None:
    g, driver, _, burst, socket = gate()
    driver.pending.add(socket)
    burst.flush_tick, burst.last_flush = driver.ticker.tick, driver.time - BURST_GAP / 2
    g.offer(b"x")
    assert driver.flushed == [] and driver.woken == []
    # A burst is offers with nothing between them: a driver tick since, or a gap, ends it.
    driver.ticker.tick += 1
    g.offer(b"y")
    assert len(driver.flushed) == 1
    burst.flush_tick = driver.ticker.tick
    burst.last_flush = driver.time - 2 * BURST_GAP
    g.offer(b"z")
    assert len(driver.flushed) == 2


def test_a_pending_socket_outside_a_burst_is_still_flushed() -> None:
    g, driver, _, _, socket = gate()
    driver.pending.add(socket)
    g.offer(b"x")
    assert len(driver.flushed) == 1


@pytest.mark.parametrize("code", [-1, -2, -3, -4, -5])
def test_a_refused_offer_tells_the_driver_nothing(code: int) -> None:
    g, driver, _, _, _ = gate(result=code)
    assert g.offer(b"x") == code
    assert g.offer(b"x", False) == code
    assert driver.flushed == [] and driver.woken == []


def test_burst_bounds() -> None:
    burst = Burst()
    assert burst.flush_tick == -1 and burst.last_flush == -math.inf
    assert not burst.in_burst(0, 0.0)
    burst.flush_tick, burst.last_flush = 3, 1.0
    assert burst.in_burst(3, 1.0 + BURST_GAP / 2)
    assert not burst.in_burst(3, 1.0 + 2 * BURST_GAP)
    assert not burst.in_burst(4, 1.0)
    burst.last_flush = 0.0  # (exactly BURST_GAP after it is no longer a burst)
    assert not burst.in_burst(3, BURST_GAP) and burst.in_burst(3, BURST_GAP / 2)


def test_the_gate_reads_only_the_clock_it_is_given() -> None:
    # The core has no clock of its own: every offer is stamped with the passed-in clock's time.
    g, driver, publication, _, socket = gate()
    driver.time = 42.5
    g.offer(b"a")
    driver.time = 7.25  # (even one that goes back: the gate does not second-guess it)
    g.offer(b"b", False)
    assert publication.offers == [(b"a", 42.5), (b"b", 7.25)]
    assert driver.flushed == [(socket, publication, 42.5)]


# ----------------------------------------------------------------------------- Message


def test_messages_compare_and_hash_by_value() -> None:
    a = Message(b"data", 7, 1001, "10.0.0.1:40000", "10.0.0.1", 40000)
    b = Message(b"data", 7, 1001, "10.0.0.1:40000", "10.0.0.1", 40000)
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != Message(b"datb", 7, 1001, "10.0.0.1:40000", "10.0.0.1", 40000)
    assert a != Message(b"data", 8, 1001, "10.0.0.1:40000", "10.0.0.1", 40000)
    assert a != Message(b"data", 7, 1001, "10.0.0.1:40000", "10.0.0.1", 40001)
    assert a != (b"data", 7, 1001, "10.0.0.1:40000", "10.0.0.1", 40000)
    # (by value: messages that differ hash apart, as their fields do)
    assert len({hash(Message(bytes([i]), 7, 1001, "s", "i", 1)) for i in range(50)}) == 50
    assert (a.data, a.session_id, a.stream_id) == (b"data", 7, 1001)
    assert (a.source, a.source_ip, a.source_port) == ("10.0.0.1:40000", "10.0.0.1", 40000)
    assert repr(a) == (
        "Message(data=b'data', session_id=7, stream_id=1001, source='10.0.0.1:40000')"
    )


@pytest.mark.skipif(
    not loaded_compiled().get("echo.transport.core.message"), reason="read-only only when compiled"
)
def test_a_compiled_message_is_read_only() -> None:
    a = Message(b"data", 7, 1001, "10.0.0.1:40000", "10.0.0.1", 40000)
    with pytest.raises(AttributeError):
        a.data = b"other"  # type: ignore[misc]


def test_addresses_are_formatted_with_ipv6_in_brackets() -> None:
    assert format_address(("10.0.0.1", 40000)) == "10.0.0.1:40000"
    assert format_address(("::1", 40000)) == "[::1]:40000"
    assert format_address(("fe80::1", 9)) == "[fe80::1]:9"
