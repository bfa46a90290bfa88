"""`DueQueue`: keys that each fall due at a time of their own, kept in the order they fall due.

For what comes back on a fixed period from each key's own last time: a seated member's resume
token, renewed a grace period after its last (`echo.lobby.server`), and a WebSocket member's
ping, every `ping_interval` (`echo.lobby.web.door`). A key added at `now + period` on a clock
that does not go back is never earlier than any entry already queued, so a deque keeps the
order and each operation is O(1) (amortised); one task serves every key by sleeping until
`next_due`. Replacing a key's time, or dropping the key, leaves its old entry behind to be
skipped when reached (lazy deletion).

Pure module: no trio, no clock (`now` is passed in).
"""

from __future__ import annotations

import collections
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class DueQueue(Generic[K]):
    """Keys by when each falls due; `add` times must not go back (see the module text)."""

    __slots__ = ("_due", "_queue")

    def __init__(self) -> None:
        self._queue: collections.deque[tuple[float, K]] = collections.deque()
        self._due: dict[K, float] = {}  # each key's one live entry

    def __len__(self) -> int:
        return len(self._due)

    def __contains__(self, key: object) -> bool:
        return key in self._due

    def add(self, key: K, due: float) -> None:
        """`key` falls due at `due` (a later `add` replaces its time)."""
        self._due[key] = due
        self._queue.append((due, key))

    def next_due(self) -> float | None:
        """When the earliest key falls due (None: no key waits)."""
        queue, live = self._queue, self._due
        while queue and live.get(queue[0][1]) != queue[0][0]:
            queue.popleft()
        return queue[0][0] if queue else None

    def pop_due(self, now: float) -> list[K]:
        """The keys due at `now`, in order; they leave the queue until `add`ed again."""
        due: list[K] = []
        queue, live = self._queue, self._due
        while queue and queue[0][0] <= now:
            at, key = queue.popleft()
            if live.get(key) == at:
                del live[key]
                due.append(key)
        return due

    def discard(self, key: K) -> None:
        """`key` no longer falls due (its entry is skipped when reached)."""
        self._due.pop(key, None)
