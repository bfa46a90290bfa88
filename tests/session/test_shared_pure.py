"""Unit tests written to kill surviving mutants (./dev mutate); see docs/mutation.md.

Covers echo.session.shared: SharedPorts (every duologue gets the same two ports, holders are
counted per pair, a pair is freed data port first, double frees and foreign ports are refused
with the documented error) and check_ports_free (a port really bound by another UDP socket on
127.0.0.1 or ::1 is refused, named, with its errno; free ports pass).
"""

from __future__ import annotations

import errno
import os
import re
import socket
from collections.abc import Iterator

import pytest

from echo.session.allocators import AllocationError
from echo.session.ports import check_ports_free
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


# ---- check_ports_free ------------------------------------------------------------------------


@pytest.fixture
def held_v4() -> Iterator[int]:
    """A UDP port on 127.0.0.1 that another socket holds for the test's duration."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as holder:
        holder.bind(("127.0.0.1", 0))
        yield holder.getsockname()[1]


@pytest.fixture
def held_v6() -> Iterator[int]:
    """A UDP port on ::1 that another socket holds for the test's duration."""
    with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as holder:
        try:
            holder.bind(("::1", 0))
        except OSError:
            pytest.skip("no IPv6 loopback")
        yield holder.getsockname()[1]


def free_port(family: socket.AddressFamily, address: str) -> int:
    """A UDP port nobody holds right now (bound once, then closed)."""
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.bind((address, 0))
        port: int = probe.getsockname()[1]
    return port


IN_USE = f"[Errno {errno.EADDRINUSE}] cannot bind UDP {{}} (a shared duologue port): " + (
    os.strerror(errno.EADDRINUSE)
)


def test_free_ipv4_ports_pass_and_stay_free() -> None:
    ports = (free_port(socket.AF_INET, "127.0.0.1"), free_port(socket.AF_INET, "127.0.0.1"))
    check_ports_free("127.0.0.1", ports)
    for port in ports:  # the probes were closed: the server can bind the ports now
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as again:
            again.bind(("127.0.0.1", port))


def test_free_ipv6_ports_pass(held_v6: int) -> None:
    check_ports_free("::1", (free_port(socket.AF_INET6, "::1"), free_port(socket.AF_INET6, "::1")))


def test_a_udp_port_held_on_ipv4_is_refused_and_named(held_v4: int) -> None:
    free = free_port(socket.AF_INET, "127.0.0.1")
    with pytest.raises(OSError) as caught:
        check_ports_free("127.0.0.1", (free, held_v4))
    error = caught.value
    assert type(error) is OSError and error.errno == errno.EADDRINUSE
    assert str(error) == IN_USE.format(f"127.0.0.1:{held_v4}")
    assert error.__cause__ is None and error.__suppress_context__


def test_a_udp_port_held_on_ipv6_is_refused_and_named_in_brackets(held_v6: int) -> None:
    with pytest.raises(OSError) as caught:
        check_ports_free("::1", (held_v6,))
    assert caught.value.errno == errno.EADDRINUSE
    assert str(caught.value) == IN_USE.format(f"[::1]:{held_v6}")
