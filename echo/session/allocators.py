"""Port and session-id allocators for duologues (the io7m Aeron guide §4.5 and its EchoServer).

Both hand out random values so a client cannot predict the next duologue's ports or session id,
and both refuse double frees and foreign values instead of silently corrupting their state (the
guide's port allocator appended any freed in-range port, duplicates included).

Pure module: no trio, no clock; randomness comes from an injected `RandomSource`
(`random.Random(seed)` in tests, `secrets.SystemRandom()` at the edge).
"""

from __future__ import annotations

import secrets
from typing import Final, Protocol

# How many random probes SessionAllocator makes before its linear scan. With the range at most
# half full each probe succeeds with probability >= 1/2, so the scan is rare unless nearly full.
_SESSION_PROBES: Final = 32


class RandomSource(Protocol):
    """The part of `random.Random` the allocators use."""

    def randrange(self, start: int, stop: int | None = ..., step: int = ...) -> int: ...


class AllocationError(ValueError):
    """Exhausted, double free, or a value this allocator never handed out."""


class PortAllocator:
    """Random UDP ports from [base, base + count), each handed out at most once until freed.

    The server needs two ports per duologue, so count = 2 * max_clients (the guide §4.5).
    allocate / allocate_pair / free are O(1): free ports live in a list (a random index is
    swap-removed), allocated ones in a set.
    """

    def __init__(self, base: int, count: int, rng: RandomSource | None = None) -> None:
        if count < 1:
            raise ValueError(f"port count must be >= 1, got {count}")
        if base < 1 or base + count - 1 > 65535:
            raise ValueError(f"port range {base}..{base + count - 1} is not within 1..65535")
        self._base = base
        self._count = count
        self._rng: RandomSource = rng if rng is not None else secrets.SystemRandom()
        self._free: list[int] = list(range(base, base + count))
        self._allocated: set[int] = set()

    @property
    def base(self) -> int:
        return self._base

    @property
    def count(self) -> int:
        return self._count

    @property
    def available(self) -> int:
        """Ports that can still be allocated."""
        return len(self._free)

    @property
    def in_use(self) -> int:
        """Ports allocated and not yet freed."""
        return len(self._allocated)

    def __contains__(self, port: object) -> bool:
        """True if `port` is currently allocated."""
        return port in self._allocated

    def allocate(self) -> int:
        """A random free port. Raises AllocationError when none is left."""
        if not self._free:
            raise AllocationError(f"no free ports left in {self._describe()}")
        return self._take()

    def allocate_pair(self) -> tuple[int, int]:
        """Two distinct random ports (data, control), or AllocationError and nothing allocated."""
        # Checked up front so a failure never leaves one port of a pair allocated (the guide's
        # allocateNewDuologue leaked on partial failure in the guide's code).
        if len(self._free) < 2:
            raise AllocationError(
                f"need 2 free ports, {len(self._free)} left in {self._describe()}"
            )
        return self._take(), self._take()

    def free(self, port: int) -> None:
        """Return an allocated port. Raises AllocationError for a port not currently allocated."""
        if port not in self._allocated:
            if self._base <= port < self._base + self._count:
                raise AllocationError(f"port {port} is not allocated (double free?)")
            raise AllocationError(f"port {port} is not in {self._describe()}")
        self._allocated.remove(port)
        self._free.append(port)

    def _take(self) -> int:
        free = self._free
        i = self._rng.randrange(len(free))
        port = free[i]
        free[i] = free[-1]
        free.pop()
        self._allocated.add(port)
        return port

    def _describe(self) -> str:
        return f"range {self._base}..{self._base + self._count - 1}"


class SessionAllocator:
    """Random session ids from [low, high] inclusive, each handed out at most once until freed.

    The guide drew from [low, high - 1] (`nextInt(max - min) + min`); both ends count here.
    Memory is proportional to the number allocated (a set), not to the range, so the default
    range of 2**31 - 1 ids costs nothing up front. `allocate` makes a bounded number of random
    probes and then scans linearly from a random start; the scan steps over allocated ids only,
    so it is bounded by the number allocated and a nearly full range still succeeds.
    """

    def __init__(self, low: int, high: int, rng: RandomSource | None = None) -> None:
        if low > high:
            raise ValueError(f"empty session range {low}..{high}")
        if low < -(2**31) or high > 2**31 - 1:
            raise ValueError(f"session range {low}..{high} is not within int32")
        self._low = low
        self._high = high
        self._size = high - low + 1
        self._rng: RandomSource = rng if rng is not None else secrets.SystemRandom()
        self._used: set[int] = set()

    @property
    def low(self) -> int:
        return self._low

    @property
    def high(self) -> int:
        return self._high

    @property
    def available(self) -> int:
        return self._size - len(self._used)

    def __len__(self) -> int:
        """How many ids are allocated."""
        return len(self._used)

    def __contains__(self, session: object) -> bool:
        """True if `session` is currently allocated."""
        return session in self._used

    def allocate(self) -> int:
        """A random unused id. Raises AllocationError when the whole range is in use."""
        used = self._used
        if len(used) >= self._size:
            raise AllocationError(f"all {self._size} session ids in {self._describe()} are in use")
        for _ in range(_SESSION_PROBES):
            candidate = self._rng.randrange(self._low, self._high + 1)
            if candidate not in used:
                used.add(candidate)
                return candidate
        # Nearly full: walk from a random start (wrapping) to the next free id. At least one
        # id is free, so this terminates within len(used) + 1 steps.
        offset = self._rng.randrange(self._size)
        while True:
            candidate = self._low + offset
            if candidate not in used:
                used.add(candidate)
                return candidate
            offset = offset + 1 if offset + 1 < self._size else 0

    def free(self, session: int) -> None:
        """Return an allocated id. Raises AllocationError if it is not currently allocated."""
        if session not in self._used:
            raise AllocationError(f"session id {session} is not allocated (double free?)")
        self._used.remove(session)

    def _describe(self) -> str:
        return f"{self._low}..{self._high}"
