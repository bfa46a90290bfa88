"""Histogram edges and time buckets shared by the Spark job and the generator's ground truth.

Both sides must bin identically or the exact-count tests mean nothing, so the edges live here,
in a module with no Spark import. A bin i holds edges[i] <= x < edges[i + 1]; the last bin is
open ended; values below edges[0] fall into bin 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

# Duologue lifetimes in seconds: roughly logarithmic, on boundaries an operator reads at a glance.
LIFETIME_EDGES_S: Final = (0.0, 1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
# Echoes answered per duologue: decades, with zero apart (a joined client that never spoke).
MESSAGE_EDGES: Final = (0, 1, 10, 100, 1000, 10000)
# Lobby waits in seconds (created -> full or started, created -> started): players wait seconds
# to minutes in a lobby, so the edges are finer than the duologue lifetimes' at the short end.
LOBBY_WAIT_EDGES_S: Final = (0.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
# Client-reported echo round-trip medians in milliseconds.
RTT_EDGES_MS: Final = (0.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0)

# Connection time-series buckets, all whole minutes so that per-minute counts can be rolled up
# into any of them. The job picks the smallest one that keeps the chart under MAX_BUCKETS.
BUCKETS_S: Final = (60, 300, 900, 3600, 6 * 3600, 86400)
MAX_BUCKETS: Final = 400


def bin_index(value: float, edges: Sequence[float]) -> int:
    """Index of the bin `value` falls in (see module docstring)."""
    index = 0
    for i, edge in enumerate(edges):
        if value >= edge:
            index = i
    return index


def bin_labels(edges: Sequence[float], unit: str = "") -> list[str]:
    labels = []
    for i, lo in enumerate(edges):
        if i + 1 < len(edges):
            labels.append(f"{_num(lo)}\u2013{_num(edges[i + 1])}{unit}")
        else:
            labels.append(f"≥{_num(lo)}{unit}")
    return labels


def _num(x: float) -> str:
    return f"{x:g}"


def choose_bucket(span_s: float) -> int:
    """The time-series bucket for a log covering `span_s` seconds."""
    for bucket in BUCKETS_S:
        if span_s / bucket <= MAX_BUCKETS:
            return bucket
    return BUCKETS_S[-1]
