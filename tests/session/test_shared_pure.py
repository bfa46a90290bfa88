"""Unit tests written to kill surviving mutants (./dev mutate); see README, Mutation testing.

Covers echo.session.shared: SharedPorts (every duologue gets the same two ports, holders are
counted per pair, a pair is freed data port first, double frees and foreign ports are refused
with the documented error). The ports a server holds from its start: tests/session/test_held.py.
"""

from __future__ import annotations

import re

import pytest

from echo.session.allocators import AllocationError
from echo.session.shared import SharedPorts


def exactly(message: str) -> str:
    return f"^{re.escape(message)}$"


# ---- SharedPorts -----------------------------------------------------------------------------


def test_a_fresh_pair_is_held_by_nobody() -> None:
    ports = SharedPorts(9300, 9301)
    assert ports.pair == (9300, 9301)
    assert (ports.holders, ports.in_use, ports.available) == (0, 0, 2)
    assert (ports.base, ports.count) == (9300, 2)
    assert 9300 not in ports and 9301 not in ports


def test_the_pair_may_end_at_port_65535() -> None:
    ports = SharedPorts(65534, 65535)
    assert ports.allocate_pair() == (65534, 65535)


def test_every_duologue_gets_the_same_pair_and_is_counted() -> None:
    ports = SharedPorts(9300, 9301)
    for n in range(1, 4):
        assert ports.allocate_pair() == (9300, 9301)
        assert (ports.holders, ports.in_use, ports.available) == (n, 2 * n, 2)
    assert 9300 in ports and 9301 in ports
    assert 9302 not in ports and 9299 not in ports and "9300" not in ports


def test_held_by_one_is_in_use() -> None:
    ports = SharedPorts(9300, 9301)
    ports.allocate_pair()
    assert ports.holders == 1
    assert 9300 in ports and 9301 in ports
    assert 9302 not in ports


def test_a_pair_is_released_by_its_control_port() -> None:
    ports = SharedPorts(9300, 9301)
    ports.allocate_pair()
    ports.allocate_pair()
    ports.free(9300)  # data port first: the pair is still held
    assert (ports.holders, ports.in_use) == (2, 4)
    ports.free(9301)
    assert (ports.holders, ports.in_use) == (1, 2)
    assert 9300 in ports
    ports.free(9300)
    assert ports.holders == 1
    ports.free(9301)
    assert (ports.holders, ports.in_use, ports.available) == (0, 0, 2)
    assert 9300 not in ports and 9301 not in ports


def test_the_pair_is_handed_out_again_after_it_was_freed() -> None:
    ports = SharedPorts(9300, 9301)
    ports.allocate_pair()
    ports.free(9300)
    ports.free(9301)
    assert ports.allocate_pair() == (9300, 9301)
    assert ports.holders == 1


@pytest.mark.parametrize("port", [9300, 9301])
def test_freeing_a_pair_nobody_holds_is_a_double_free(port: int) -> None:
    ports = SharedPorts(9300, 9301)
    with pytest.raises(AllocationError, match=exactly(f"port {port} is not held (double free?)")):
        ports.free(port)
    ports.allocate_pair()
    ports.free(9300)
    ports.free(9301)
    with pytest.raises(AllocationError, match=exactly(f"port {port} is not held (double free?)")):
        ports.free(port)
    assert ports.holders == 0


@pytest.mark.parametrize("port", [9299, 9302, 9010])
def test_a_foreign_port_is_refused_while_the_pair_is_held(port: int) -> None:
    ports = SharedPorts(9300, 9301)
    ports.allocate_pair()
    with pytest.raises(AllocationError, match=exactly(f"port {port} is not held (double free?)")):
        ports.free(port)
    assert ports.holders == 1


def test_single_ports_are_never_handed_out() -> None:
    ports = SharedPorts(9300, 9301)
    message = "shared duologue ports are handed out in pairs"
    with pytest.raises(AllocationError, match=exactly(message)):
        ports.allocate()
    assert ports.holders == 0
