"""Unit tests written to kill surviving mutants (./dev mutate); see docs/mutation.md.

Covers echo.session.allocators (the exact errors an operator reads, range boundaries, which
draws the session scan makes), echo.session.limits (ipv6_prefix validation and its messages,
prefix boundaries, the double-release error) and echo.session.admission (which ports Admission
uses with shared duologue ports, the resume count).
"""

from __future__ import annotations

import random
import re

import pytest

from echo.session.admission import Admission, ResumeVerdict, Slot
from echo.session.allocators import AllocationError, PortAllocator, SessionAllocator
from echo.session.config import ServerConfig
from echo.session.limits import AddressCounter, address_key
from echo.session.resume import resume_proof
from echo.session.shared import SharedPorts


def exactly(message: str) -> str:
    """A `pytest.raises(match=...)` pattern for exactly `message`."""
    return f"^{re.escape(message)}$"


# ---- PortAllocator ---------------------------------------------------------------------------


def test_port_count_below_one_names_the_count() -> None:
    with pytest.raises(ValueError, match=exactly("port count must be >= 1, got 0")):
        PortAllocator(9000, 0, random.Random(0))


@pytest.mark.parametrize(
    ("base", "count", "message"),
    [
        (65534, 3, "port range 65534..65536 is not within 1..65535"),
        (0, 2, "port range 0..1 is not within 1..65535"),
        (65535, 2, "port range 65535..65536 is not within 1..65535"),
    ],
)
def test_port_range_outside_1_65535_names_the_range(base: int, count: int, message: str) -> None:
    with pytest.raises(ValueError, match=exactly(message)):
        PortAllocator(base, count, random.Random(0))


def test_port_exhaustion_names_the_range() -> None:
    alloc = PortAllocator(9010, 2, random.Random(0))
    alloc.allocate()
    alloc.allocate()
    with pytest.raises(AllocationError, match=exactly("no free ports left in range 9010..9011")):
        alloc.allocate()


def test_port_pair_refusal_says_how_many_are_left() -> None:
    alloc = PortAllocator(100, 3, random.Random(2))
    alloc.allocate_pair()
    with pytest.raises(
        AllocationError, match=exactly("need 2 free ports, 1 left in range 100..102")
    ):
        alloc.allocate_pair()
    alloc.allocate()
    with pytest.raises(
        AllocationError, match=exactly("need 2 free ports, 0 left in range 100..102")
    ):
        alloc.allocate_pair()


def test_free_of_an_unallocated_port_at_either_end_of_the_range_is_a_double_free() -> None:
    alloc = PortAllocator(100, 3, random.Random(0))
    for port in (100, 101, 102):
        with pytest.raises(
            AllocationError, match=exactly(f"port {port} is not allocated (double free?)")
        ):
            alloc.free(port)


@pytest.mark.parametrize("port", [99, 103, 0, 65535])
def test_free_of_a_port_outside_the_range_names_the_range(port: int) -> None:
    alloc = PortAllocator(100, 3, random.Random(0))
    alloc.allocate_pair()
    with pytest.raises(AllocationError, match=exactly(f"port {port} is not in range 100..102")):
        alloc.free(port)
    assert alloc.in_use == 2


def test_a_freed_port_comes_back_once_and_is_then_a_double_free() -> None:
    alloc = PortAllocator(200, 1, random.Random(0))
    assert alloc.allocate() == 200
    alloc.free(200)
    assert (alloc.available, alloc.in_use, 200 in alloc) == (1, 0, False)
    with pytest.raises(AllocationError, match=exactly("port 200 is not allocated (double free?)")):
        alloc.free(200)
    assert alloc.allocate() == 200
    assert (alloc.available, alloc.in_use, 200 in alloc) == (0, 1, True)


def test_port_properties_report_the_range() -> None:
    alloc = PortAllocator(65534, 2, random.Random(0))
    assert (alloc.base, alloc.count, alloc.available, alloc.in_use) == (65534, 2, 2, 0)
    assert sorted(alloc.allocate_pair()) == [65534, 65535]


# ---- SessionAllocator ------------------------------------------------------------------------


def test_empty_session_range_names_it() -> None:
    with pytest.raises(ValueError, match=exactly("empty session range 5..4")):
        SessionAllocator(5, 4, random.Random(0))


@pytest.mark.parametrize(("low", "high"), [(-(2**31) - 1, 0), (0, 2**31), (-(2**31) - 1, 2**31)])
def test_session_range_outside_int32_names_it(low: int, high: int) -> None:
    with pytest.raises(
        ValueError, match=exactly(f"session range {low}..{high} is not within int32")
    ):
        SessionAllocator(low, high, random.Random(0))


def test_session_range_may_start_at_int32_min() -> None:
    alloc = SessionAllocator(-(2**31), -(2**31), random.Random(0))
    assert (alloc.low, alloc.high, alloc.available) == (-(2**31), -(2**31), 1)
    assert alloc.allocate() == -(2**31)
    assert len(alloc) == 1 and alloc.available == 0


def test_session_exhaustion_names_the_range_and_its_size() -> None:
    alloc = SessionAllocator(7, 9, random.Random(3))
    for _ in range(3):
        alloc.allocate()
    with pytest.raises(AllocationError, match=exactly("all 3 session ids in 7..9 are in use")):
        alloc.allocate()


def test_session_double_free_names_the_id() -> None:
    alloc = SessionAllocator(1, 10, random.Random(0))
    with pytest.raises(
        AllocationError, match=exactly("session id 5 is not allocated (double free?)")
    ):
        alloc.free(5)
    got = alloc.allocate()
    alloc.free(got)
    with pytest.raises(
        AllocationError, match=exactly(f"session id {got} is not allocated (double free?)")
    ):
        alloc.free(got)


class _Recording(random.Random):
    """Probes always hit the range's first id; the scan's start is drawn by the real rng."""

    def __init__(self) -> None:
        super().__init__(7)
        self.calls: list[tuple[int, int | None]] = []

    def randrange(self, start: int, stop: int | None = None, step: int = 1) -> int:
        self.calls.append((start, stop))
        if stop is not None:
            return start
        return super().randrange(start)


def test_session_scan_draws_its_start_from_the_range_size() -> None:
    alloc = SessionAllocator(11, 20, _Recording())
    rng = alloc._rng
    assert isinstance(rng, _Recording)
    assert alloc.allocate() == 11
    assert rng.calls == [(11, 21)]
    rng.calls.clear()
    second = alloc.allocate()  # every probe hits 11: 32 probes, then a scan from a random start
    assert 12 <= second <= 20
    assert rng.calls == [(11, 21)] * 32 + [(10, None)]


# ---- limits ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("prefix", "name"), [(True, "bool"), (False, "bool"), (64.0, "float")])
def test_ipv6_prefix_must_be_a_real_int(prefix: object, name: str) -> None:
    for ip in ("2001:db8::1", "192.0.2.7"):
        with pytest.raises(ValueError, match=exactly(f"ipv6_prefix must be an int, not {name}")):
            address_key(ip, ipv6_prefix=prefix)  # type: ignore[arg-type]


@pytest.mark.parametrize("prefix", [-1, 129, 200])
def test_ipv6_prefix_out_of_range_names_it(prefix: int) -> None:
    with pytest.raises(ValueError, match=exactly(f"ipv6_prefix {prefix} is out of range 0..128")):
        address_key("192.0.2.7", ipv6_prefix=prefix)


@pytest.mark.parametrize("ip", [12345, None, b"192.0.2.7"])
def test_a_non_address_is_named_in_the_error(ip: object) -> None:
    with pytest.raises(ValueError, match=exactly(f"not an IP address: {ip!r}")):
        address_key(ip)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("prefix", "key"),
    [
        (0, "::/0"),
        (1, "8000::/1"),
        (2, "c000::/2"),
        (56, "fedc:ba98:7654:3200::/56"),
        (64, "fedc:ba98:7654:3210::/64"),
        (127, "fedc:ba98:7654:3210:ffff:ffff:ffff:fffe/127"),
        (128, "fedc:ba98:7654:3210:ffff:ffff:ffff:ffff/128"),
    ],
)
def test_ipv6_prefix_boundaries(prefix: int, key: str) -> None:
    assert address_key("fedc:ba98:7654:3210:ffff:ffff:ffff:ffff", ipv6_prefix=prefix) == key


def test_ipv6_prefix_127_pairs_neighbours_and_128_does_not() -> None:
    assert address_key("2001:db8::4", ipv6_prefix=127) == "2001:db8::4/127"
    assert address_key("2001:db8::5", ipv6_prefix=127) == "2001:db8::4/127"
    assert address_key("2001:db8::6", ipv6_prefix=127) == "2001:db8::6/127"
    assert address_key("2001:db8::5", ipv6_prefix=128) == "2001:db8::5/128"


def test_mapped_ipv4_ignores_every_prefix() -> None:
    for prefix in (0, 1, 64, 127, 128):
        assert address_key("::ffff:198.51.100.200", ipv6_prefix=prefix) == "198.51.100.200"


def test_double_release_names_the_address() -> None:
    counter = AddressCounter()
    message = "address '2001:db8::/64' has no duologues to release (double release?)"
    with pytest.raises(ValueError, match=exactly(message)):
        counter.decrement("2001:db8::/64")
    counter.increment("2001:db8::/64")
    assert counter.decrement("2001:db8::/64") == 0
    with pytest.raises(ValueError, match=exactly(message)):
        counter.decrement("2001:db8::/64")
    assert (counter.total, len(counter)) == (0, 0)


# ---- Admission -------------------------------------------------------------------------------


def shared_admission(base: int = 9100) -> Admission:
    config = ServerConfig(
        clients_base_port=base, max_clients=3, max_per_ip=3, duologue_ports="shared"
    )
    return Admission(config, random.Random(1))


def test_shared_admission_hands_every_duologue_the_base_port_and_the_next() -> None:
    a = shared_admission(9100)
    assert isinstance(a.ports, SharedPorts)
    assert a.ports.pair == (9100, 9101)
    slots = []
    for _ in range(3):
        slot = a.reserve("192.0.2.1", "192.0.2.1", 1, 0.0)
        assert slot is not None
        assert (slot.data_port, slot.control_port) == (9100, 9101)
        a.commit(slot)
        slots.append(slot)
    assert a.ports.in_use == 6
    for slot in slots:
        assert a.release(slot)
    assert a.ports.in_use == 0 and 9100 not in a.ports


def test_per_client_admission_uses_the_configured_range() -> None:
    a = Admission(ServerConfig(clients_base_port=9200, max_clients=2), random.Random(1))
    assert not isinstance(a.ports, SharedPorts)
    assert (a.ports.base, a.ports.count) == (9200, 4)
    ports = set()
    for _ in range(2):
        slot = a.reserve("192.0.2.1", "192.0.2.1", 1, 0.0)
        assert slot is not None
        ports |= {slot.data_port, slot.control_port}
    assert ports == {9200, 9201, 9202, 9203}
    assert a.reserve("192.0.2.1", "192.0.2.1", 1, 0.0) is None


SECRET = 0x0123456789ABCDEF0123456789ABCDEF


def resumable(a: Admission, ip: str) -> Slot:
    key = a.key_of(ip)
    slot = a.reserve(ip, key, 1, 0.0)
    assert slot is not None
    a.commit(slot)
    slot.resume_secret = SECRET
    a.join(slot, ip, has_stream=False)
    return slot


def test_each_accepted_resume_is_counted() -> None:
    a = Admission(ServerConfig(max_clients=4, max_per_ip=4), random.Random(1))
    slot = resumable(a, "192.0.2.1")
    sid = slot.session_id
    moves = [("203.0.113.9", 1), ("198.51.100.4", 2), ("198.51.100.4", 3)]
    for n, (ip, counter) in enumerate(moves, start=1):
        proof = resume_proof(SECRET, sid, counter, 0)
        assert a.resume(sid, counter, 0, proof, ip, ip) == (ResumeVerdict.ACCEPT, slot)
        assert (slot.resumes, slot.resume_counter, slot.owner_ip) == (n, counter, ip)
    assert (a.per_ip.count("198.51.100.4"), a.per_ip.count("192.0.2.1"), a.per_ip.total) == (
        1,
        0,
        1,
    )
