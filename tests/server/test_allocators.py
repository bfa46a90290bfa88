"""Port and session allocators: model-based property tests plus the edge cases (echo.server)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from echo.session.allocators import AllocationError, PortAllocator, SessionAllocator

# ---- PortAllocator ---------------------------------------------------------------------------


class PortModel(RuleBasedStateMachine):
    """Random allocate / allocate_pair / free sequences against a set model."""

    def __init__(self) -> None:
        super().__init__()
        self.alloc: PortAllocator | None = None
        self.model: set[int] = set()
        self.base = 0
        self.count = 0

    @precondition(lambda self: self.alloc is None)
    @rule(
        base=st.integers(1, 65535),
        count=st.integers(1, 12),
        seed=st.integers(0, 2**32),
    )
    def create(self, base: int, count: int, seed: int) -> None:
        base = min(base, 65536 - count)
        self.alloc = PortAllocator(base, count, random.Random(seed))
        self.base, self.count = base, count

    @precondition(lambda self: self.alloc is not None)
    @rule()
    def allocate(self) -> None:
        assert self.alloc is not None
        if len(self.model) == self.count:
            with pytest.raises(AllocationError):
                self.alloc.allocate()
            return
        port = self.alloc.allocate()
        assert self.base <= port < self.base + self.count
        assert port not in self.model
        self.model.add(port)

    @precondition(lambda self: self.alloc is not None)
    @rule()
    def allocate_pair(self) -> None:
        assert self.alloc is not None
        if self.count - len(self.model) < 2:
            before = self.alloc.available
            with pytest.raises(AllocationError):
                self.alloc.allocate_pair()
            assert self.alloc.available == before  # both or neither
            return
        data, control = self.alloc.allocate_pair()
        assert data != control
        for port in (data, control):
            assert self.base <= port < self.base + self.count
            assert port not in self.model
            self.model.add(port)

    @precondition(lambda self: self.alloc is not None and bool(self.model))
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        assert self.alloc is not None
        port = data.draw(st.sampled_from(sorted(self.model)))
        self.alloc.free(port)
        self.model.remove(port)
        with pytest.raises(AllocationError):
            self.alloc.free(port)  # double free refused, state unchanged

    @precondition(lambda self: self.alloc is not None)
    @rule(port=st.integers(-5, 70000))
    def free_foreign(self, port: int) -> None:
        assert self.alloc is not None
        if port in self.model:
            return
        with pytest.raises(AllocationError):
            self.alloc.free(port)

    @invariant()
    def counts(self) -> None:
        if self.alloc is not None:
            assert self.alloc.in_use == len(self.model)
            assert self.alloc.available == self.count - len(self.model)
            for port in self.model:
                assert port in self.alloc


TestPortModel = PortModel.TestCase
TestPortModel.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_port_exhaustion_is_exact_and_covers_the_range() -> None:
    alloc = PortAllocator(9010, 8, random.Random(1))
    got = [alloc.allocate() for _ in range(8)]
    assert sorted(got) == list(range(9010, 9018))
    with pytest.raises(AllocationError):
        alloc.allocate()
    alloc.free(9013)
    assert alloc.allocate() == 9013  # the only one free


def test_port_pair_needs_two() -> None:
    alloc = PortAllocator(100, 3, random.Random(2))
    pair = alloc.allocate_pair()
    assert set(pair) <= {100, 101, 102}
    with pytest.raises(AllocationError):
        alloc.allocate_pair()
    assert alloc.available == 1 and alloc.in_use == 2


def test_port_allocation_is_random() -> None:
    # Not just the lowest port first: over many fresh allocators every port shows up first.
    firsts = {PortAllocator(5000, 10, random.Random(seed)).allocate() for seed in range(200)}
    assert firsts == set(range(5000, 5010))


def test_port_default_rng_works() -> None:
    alloc = PortAllocator(40000, 4)
    assert 40000 <= alloc.allocate() < 40004


@pytest.mark.parametrize(("base", "count"), [(0, 2), (65535, 2), (65534, 3), (1, 0), (-1, 4)])
def test_port_range_validated(base: int, count: int) -> None:
    with pytest.raises(ValueError):
        PortAllocator(base, count, random.Random(0))


def test_port_range_edges_accepted() -> None:
    assert PortAllocator(1, 65535, random.Random(0)).available == 65535
    assert PortAllocator(65534, 2, random.Random(0)).available == 2


def test_allocation_error_is_value_error() -> None:
    assert issubclass(AllocationError, ValueError)


# ---- SessionAllocator ------------------------------------------------------------------------


class SessionModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.alloc: SessionAllocator | None = None
        self.model: set[int] = set()
        self.low = 0
        self.high = 0

    @precondition(lambda self: self.alloc is None)
    @rule(
        low=st.integers(-(2**31), 2**31 - 1),
        size=st.integers(1, 10),
        seed=st.integers(0, 2**32),
    )
    def create(self, low: int, size: int, seed: int) -> None:
        low = min(low, 2**31 - size)
        self.low, self.high = low, low + size - 1
        self.alloc = SessionAllocator(self.low, self.high, random.Random(seed))

    @precondition(lambda self: self.alloc is not None)
    @rule()
    def allocate(self) -> None:
        assert self.alloc is not None
        if len(self.model) == self.high - self.low + 1:
            with pytest.raises(AllocationError):
                self.alloc.allocate()
            return
        session = self.alloc.allocate()
        assert self.low <= session <= self.high
        assert session not in self.model
        self.model.add(session)

    @precondition(lambda self: self.alloc is not None and bool(self.model))
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        assert self.alloc is not None
        session = data.draw(st.sampled_from(sorted(self.model)))
        self.alloc.free(session)
        self.model.remove(session)
        assert session not in self.alloc
        with pytest.raises(AllocationError):
            self.alloc.free(session)

    @precondition(lambda self: self.alloc is not None)
    @rule(session=st.integers(-(2**31), 2**31 - 1))
    def free_unallocated(self, session: int) -> None:
        assert self.alloc is not None
        if session in self.model:
            return
        with pytest.raises(AllocationError):
            self.alloc.free(session)

    @invariant()
    def counts(self) -> None:
        if self.alloc is not None:
            assert len(self.alloc) == len(self.model)
            assert self.alloc.available == self.high - self.low + 1 - len(self.model)
            for session in self.model:
                assert session in self.alloc


TestSessionModel = SessionModel.TestCase
TestSessionModel.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_session_range_is_inclusive() -> None:
    # The guide's nextInt(max - min) + min never produced `max`; both ends count here.
    alloc = SessionAllocator(7, 9, random.Random(3))
    assert {alloc.allocate() for _ in range(3)} == {7, 8, 9}
    with pytest.raises(AllocationError):
        alloc.allocate()


def test_session_single_value_range() -> None:
    alloc = SessionAllocator(2**31 - 1, 2**31 - 1, random.Random(0))
    assert alloc.allocate() == 2**31 - 1
    with pytest.raises(AllocationError):
        alloc.allocate()


class _AlwaysSame(random.Random):
    """A worst-case rng: every draw is the start of the range, so probing always collides."""

    def randrange(self, start: int, stop: int | None = None, step: int = 1) -> int:
        return 0 if stop is None else start


def test_session_nearly_full_falls_back_to_scan() -> None:
    alloc = SessionAllocator(1, 1000, _AlwaysSame())
    # Every probe lands on 1; the scan from offset 0 must find the next free id each time.
    got = [alloc.allocate() for _ in range(1000)]
    assert sorted(got) == list(range(1, 1001))
    with pytest.raises(AllocationError):
        alloc.allocate()
    alloc.free(500)
    assert alloc.allocate() == 500


def test_session_scan_wraps_around() -> None:
    class StartNearEnd(random.Random):
        def randrange(self, start: int, stop: int | None = None, step: int = 1) -> int:
            return 9 if stop is None else start + 9  # offset 9 of a size-10 range, i.e. id 10

    alloc = SessionAllocator(1, 10, StartNearEnd())
    assert alloc.allocate() == 10
    assert alloc.allocate() == 1  # probes hit 10; the scan wraps from the end to the start


def test_session_huge_range_costs_nothing_up_front() -> None:
    alloc = SessionAllocator(1, 2**31 - 1, random.Random(4))
    got = {alloc.allocate() for _ in range(1000)}
    assert len(got) == 1000 and len(alloc) == 1000
    assert all(1 <= s <= 2**31 - 1 for s in got)
    assert alloc.available == 2**31 - 1 - 1000


@given(st.integers(0, 2**32))
def test_session_draws_spread_over_range(seed: int) -> None:
    alloc = SessionAllocator(1, 2**31 - 1, random.Random(seed))
    values = [alloc.allocate() for _ in range(50)]
    # 50 uniform draws all in one half of the range has probability 2**-49.
    assert min(values) < 2**30 < max(values)


@pytest.mark.parametrize(("low", "high"), [(5, 4), (-(2**31) - 1, 0), (0, 2**31)])
def test_session_range_validated(low: int, high: int) -> None:
    with pytest.raises(ValueError):
        SessionAllocator(low, high, random.Random(0))
