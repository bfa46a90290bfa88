"""The matchmaker's metrics on `echo-lobby`'s ``--metrics`` port (docs/metrics.md): players
waiting by mode and region, matches formed, the wait of matched players, parties dropped and
queue requests refused by code. `LobbyCollector` yields them with the lobby's own."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from echo.lobby.queue_stats import queued_by_queue

if TYPE_CHECKING:
    from echo.lobby.queues import QueueDesk

#: QueueDesk counters exported one to one, as echo_lobby_<name>_total.
QUEUE_COUNTERS: dict[str, tuple[str, str]] = {
    "queue_entries": ("queue_entries", "Matchmaker entries accepted (a client's entry sent "
                      "again after a reconnection counts again)"),
    "queue_cancelled": ("queue_cancelled", "Queue tickets cancelled by a member"),
    "matches": ("matches_formed", "Matches formed and seated in a new lobby"),
    "players_matched": ("players_matched", "Players seated by the matchmaker"),
    "parties_dropped": ("queue_parties_dropped", "Parties dropped from the queue: their "
                        "members did not all arrive within the party wait"),
    "queue_expired": ("queue_players_dropped", "Members of the parties dropped from the queue"),
    "match_start_refused": ("match_starts_refused", "Matches that asked to start at once and "
                            "could not (no game server): left as open lobbies"),
}  # fmt: skip

#: The codes a queue request can be refused with (each series there from the start).
QUEUE_REFUSAL_CODES = (
    "already_in_lobby", "bad_request", "not_queued", "party_invalid", "rate_limited",
    "server_full",
)  # fmt: skip


def queue_metrics(desk: QueueDesk) -> Iterator[Metric]:
    queued = GaugeMetricFamily(
        "echo_lobby_queue_players",
        "Players waiting in this server's matchmaker queues, by mode and region (the 50 "
        'busiest pairs; the rest as mode and region "other")',
        labels=["mode", "region"],
    )
    for (mode, region), n in sorted(queued_by_queue(desk.matchmaker.queued()).items()):
        queued.add_metric([mode, region], n)
    yield queued
    for key, (name, doc) in QUEUE_COUNTERS.items():
        yield CounterMetricFamily(f"echo_lobby_{name}", doc, value=desk.counters[key])
    refused = CounterMetricFamily(
        "echo_lobby_queue_refusals", "Matchmaker requests refused, by error code", labels=["code"]
    )
    counts = {code.name.lower(): n for code, n in desk.refusals.items()}
    for code in sorted(set(QUEUE_REFUSAL_CODES) | set(counts)):
        refused.add_metric([code], counts.get(code, 0))
    yield refused
    waits = desk.waits
    yield HistogramMetricFamily(
        "echo_lobby_queue_wait_seconds",
        "How long each matched player waited in the queue (a party's members each count)",
        buckets=[(_le(bound), n) for bound, n in waits.buckets()],
        sum_value=waits.sum,
    )


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))
