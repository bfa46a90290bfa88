"""What the matchmaker's metrics read (echo.ops.queue_metrics): players waiting by mode and
region, and how long the matched players waited.

Modes and regions are the clients' words (up to 32 bytes each), not a fixed list, so they
cannot each be a label value without bound: `queued_by_queue` gives the `TOP_QUEUES` busiest
(mode, region) pairs their own series and adds the rest up under ``("other", "other")``.
`WaitHistogram` is a histogram's buckets, sum and count, filled by the desk as it seats each
match (no client library in the pure core).

Pure module: no trio, no clock.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Sequence

#: The (mode, region) pairs with a series of their own; the rest are summed as "other".
TOP_QUEUES = 50
OTHER = "other"

#: Buckets of the queue wait, in seconds: a match forms at once when players are there; the
#: rules widen a ticket's window up to `MatchRules.open_after` (30 s by default) and then
#: match it with whoever waited as long.
WAIT_BUCKETS: tuple[float, ...] = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)


def queued_by_queue(
    players: Iterable[tuple[str, str, int]], top: int = TOP_QUEUES
) -> dict[tuple[str, str], int]:
    """Players waiting per (mode, region) from (mode, region, players) rows: the `top`
    busiest pairs by name, the others summed under (OTHER, OTHER)."""
    counts: Counter[tuple[str, str]] = Counter()
    for mode, region, n in players:
        counts[mode, region] += n
    if len(counts) <= top:
        return dict(counts)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    out = dict(ranked[:top])
    rest = sum(n for _, n in ranked[top:])
    out[OTHER, OTHER] = out.get((OTHER, OTHER), 0) + rest
    return out


class WaitHistogram:
    """A histogram of seconds: cumulative bucket counts (Prometheus's ``le``), sum, count."""

    def __init__(self, bounds: Sequence[float] = WAIT_BUCKETS) -> None:
        if list(bounds) != sorted(set(bounds)) or not bounds:
            raise ValueError("bucket bounds must be increasing")
        self.bounds = tuple(bounds)
        self._counts = [0] * (len(self.bounds) + 1)  # the last: above every bound
        self.sum = 0.0
        self.count = 0

    def observe(self, seconds: float, times: int = 1) -> None:
        self._counts[bisect.bisect_left(self.bounds, seconds)] += times
        self.sum += seconds * times
        self.count += times

    def buckets(self) -> list[tuple[float, int]]:
        """(upper bound, cumulative count) for each bound, then (inf, count)."""
        out = []
        total = 0
        for bound, n in zip(self.bounds, self._counts, strict=False):
            total += n
            out.append((bound, total))
        out.append((float("inf"), self.count))
        return out
