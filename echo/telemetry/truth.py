"""The exact answers of a generated event log (`echo.telemetry.generate`): what
`echo-analyze` must report for it, echo-server's part (`GroundTruth`) and the lobbies'
(`LobbyTruth`), counted as the lines are written, never from the simulation's intentions.
"""


from __future__ import annotations

import datetime
import math
from collections import Counter
from typing import Any, Final

import attrs

from echo.telemetry.bins import LOBBY_WAIT_EDGES_S, bin_index

_US: Final = 1_000_000
#: The per-minute series of `GroundTruth.per_minute`, by index.
_HELLO, _REJECTED, _CREATED, _CONNECTED = range(4)
_SERIES: Final = ("hello_received", "hello_rejected", "duologue_created", "duologue_connected")


def _top(counts: dict[str, tuple[int, int, int]], metric: int, n: int) -> list[dict[str, Any]]:
    rows = [(key, c) for key, c in counts.items() if c[metric] > 0]
    rows.sort(key=lambda kc: (-kc[1][metric], kc[0]))
    return [
        {"source": key, "rejections": c[0], "duologues": c[1], "expiries": c[2]}
        for key, c in rows[:n]
    ]



def _sorted_counts(counter: Counter[str] | Counter[int]) -> dict[str, int]:
    """A count dict with string keys (as JSON has them), numbers in numeric order."""
    keys = sorted(counter, key=lambda k: (isinstance(k, str), k))
    return {str(k): counter[k] for k in keys}  # type: ignore[index]


@attrs.define
class LobbyTruth:
    """Exact lobby counts of a generated log: the `lobbies` part of summary.json.

    The per-lobby numbers are computed from the lines written for that lobby, with the rules
    the Spark job documents (echo.telemetry.pipeline._lobbies), never from the simulation's
    intentions: a drift between the two definitions fails the exact-count tests.
    """

    servers: list[str] = attrs.field(factory=list)
    created: int = 0
    rehomed: int = 0
    joins: int = 0
    started: int = 0
    never_filled: int = 0
    left: Counter[str] = attrs.field(factory=Counter)
    deleted: Counter[str] = attrs.field(factory=Counter)
    capacity: Counter[int] = attrs.field(factory=Counter)
    peak: Counter[int] = attrs.field(factory=Counter)
    at_start: Counter[int] = attrs.field(factory=Counter)
    fill_s: list[float] = attrs.field(factory=list, repr=False)
    start_s: list[float] = attrs.field(factory=list, repr=False)
    chat_lines: int = 0
    chat_bytes: int = 0
    lobbies_with_chat: int = 0
    refused_by_code: Counter[str] = attrs.field(factory=Counter)
    refused_by_request: Counter[str] = attrs.field(factory=Counter)
    resumed: int = 0
    # lobby_matched: matches, and the members, tickets and at-once starts they carried
    matched: Counter[str] = attrs.field(factory=Counter)

    def add_lobby(self, lines: list[tuple[int, str, str, dict[str, Any]]]) -> None:
        """Count one lobby's lines (ts_us, server_id, event, fields), in time order."""
        created = [(ts, f) for ts, _, ev, f in lines if ev == "lobby_created"]
        assert created, "a simulated lobby always has its lobby_created"
        t0, first = created[0]
        cap = first["max_members"]
        self.created += 1
        self.rehomed += len({sid for _, sid, ev, _ in lines if ev != "lobby_refused"}) > 1
        self.capacity[cap] += 1
        sizes = [f["members"] for _, _, ev, f in lines if "members" in f]
        self.peak[max([1, *sizes])] += 1
        full = [ts for ts, _, ev, f in lines if ev == "lobby_joined" and f["members"] >= cap]
        starts = [(ts, f) for ts, _, ev, f in lines if ev == "lobby_started"]
        ends = ([full[0]] if full else []) + ([starts[0][0]] if starts else [])
        if ends:
            self.fill_s.append((min(ends) - t0) / _US)
        else:
            self.never_filled += 1
        if starts:
            self.started += 1
            self.start_s.append((starts[0][0] - t0) / _US)
            self.at_start[starts[0][1]["members"]] += 1
        chats = [f["bytes"] for _, _, ev, f in lines if ev == "lobby_chat"]
        self.chat_lines += len(chats)
        self.chat_bytes += sum(chats)
        self.lobbies_with_chat += bool(chats)
        for _, _, ev, f in lines:
            if ev == "lobby_joined":
                self.joins += 1
            elif ev == "lobby_left":
                self.left[f["reason"]] += 1
            elif ev == "lobby_deleted":
                self.deleted[f["reason"]] += 1
            elif ev == "lobby_refused":
                self.refused(f["request"], f["code"])
            elif ev == "lobby_resumed":
                self.resumed += 1
            elif ev == "lobby_matched":
                self.matched.update(
                    matches=1, members=f["members"], tickets=f["tickets"], started=f["started"]
                )

    def refused(self, request: str, code: str) -> None:
        self.refused_by_code[code] += 1
        self.refused_by_request[request] += 1

    def expected_summary(self) -> dict[str, Any]:
        """summary.json's `lobbies` for this log.

        Percentiles are nearest-rank (the smallest value with at least p of the values at or
        below it): what Spark's percentile_approx returns when its accuracy exceeds the count.
        """

        def waits(values: list[float]) -> dict[str, Any]:
            hist = [0] * len(LOBBY_WAIT_EDGES_S)
            for v in values:
                hist[bin_index(v, LOBBY_WAIT_EDGES_S)] += 1
            ranked = sorted(values)

            def rank(p: float) -> float | None:
                return ranked[max(0, math.ceil(p * len(ranked)) - 1)] if ranked else None

            return {
                "count": len(values),
                "edges": list(LOBBY_WAIT_EDGES_S),
                "histogram": hist,
                "p50": rank(0.5),
                "p90": rank(0.9),
                "p99": rank(0.99),
            }

        return {
            "servers": sorted(self.servers),
            "created": self.created,
            "rehomed": self.rehomed,
            "joins": self.joins,
            "started": self.started,
            "left": _sorted_counts(self.left),
            "deleted": _sorted_counts(self.deleted),
            "sizes": {
                "capacity": _sorted_counts(self.capacity),
                "peak": _sorted_counts(self.peak),
                "at_start": _sorted_counts(self.at_start),
            },
            "time_to_fill_s": {**waits(self.fill_s), "never": self.never_filled},
            "time_to_start_s": waits(self.start_s),
            "chat": {
                "lines": self.chat_lines,
                "bytes": self.chat_bytes,
                "lobbies_with_chat": self.lobbies_with_chat,
                "bytes_per_line": self.chat_bytes / self.chat_lines if self.chat_lines else None,
            },
            "refusals": {
                "total": sum(self.refused_by_code.values()),
                "by_code": _sorted_counts(self.refused_by_code),
                "by_request": _sorted_counts(self.refused_by_request),
            },
            "resumed": self.resumed,
            "matched": {k: self.matched[k] for k in ("matches", "members", "tickets", "started")},
        }


@attrs.frozen
class GroundTruth:
    """Exact counts of a generated log: what `echo-analyze` must report for it."""

    path: str
    lines_total: int
    bad_lines: int
    events_total: int
    unknown_events: int
    events_by_type: dict[str, int]
    events_by_day: dict[str, int]
    servers: list[str]
    first_ts: str
    last_ts: str
    hello_received: int
    hello_rejected: dict[str, int]
    duologues_created: int
    duologues_connected: int
    duologues_expired: int
    duologues_closed: dict[str, int]
    image_refused: dict[str, int]
    client_summaries: int
    lifetime_histogram: list[int]
    message_histogram: list[int]
    messages_total: int
    # source -> (rejections, duologues created, expiries); prefixes only for IPv6 networks
    by_source: dict[str, tuple[int, int, int]] = attrs.field(repr=False)
    by_prefix: dict[str, tuple[int, int, int]] = attrs.field(repr=False)
    per_minute: dict[int, tuple[int, int, int, int]] = attrs.field(repr=False)
    lobbies: LobbyTruth = attrs.field(factory=lambda: LobbyTruth(), repr=False)

    def top_sources(self, n: int = 20) -> dict[str, list[dict[str, Any]]]:
        return {
            "by_rejections": _top(self.by_source, 0, n),
            "by_duologues": _top(self.by_source, 1, n),
            "prefixes_by_rejections": _top(self.by_prefix, 0, n),
            "prefixes_by_duologues": _top(self.by_prefix, 1, n),
        }

    def connections_over_time(self, bucket_s: int) -> list[dict[str, Any]]:
        per_bucket: dict[int, list[int]] = {}
        for minute, counts in self.per_minute.items():
            start = minute * 60 // bucket_s * bucket_s
            acc = per_bucket.setdefault(start, [0, 0, 0, 0])
            for i, c in enumerate(counts):
                acc[i] += c
        return [
            {
                "t": datetime.datetime.fromtimestamp(start, datetime.UTC).strftime(
                    "%Y-%m-%dT%H:%M:%SZ"
                ),
                **dict(zip(_SERIES, per_bucket[start], strict=True)),
            }
            for start in sorted(per_bucket)
        ]

    def expected_summary(self, top_n: int = 20) -> dict[str, Any]:
        """The keys of summary.json this log determines exactly, with their values."""
        return {
            "lines_total": self.lines_total,
            "bad_lines": self.bad_lines,
            "events_total": self.events_total,
            "unknown_events": self.unknown_events,
            "events_by_type": self.events_by_type,
            "events_by_day": self.events_by_day,
            "servers": self.servers,
            "first_ts": self.first_ts,
            "last_ts": self.last_ts,
            "hello_received": self.hello_received,
            "hello_rejected": self.hello_rejected,
            "hello_rejected_total": sum(self.hello_rejected.values()),
            "duologues_created": self.duologues_created,
            "duologues_connected": self.duologues_connected,
            "duologues_expired": self.duologues_expired,
            "duologues_closed": self.duologues_closed,
            "image_refused": self.image_refused,
            "client_summaries": self.client_summaries,
            "top_sources": self.top_sources(top_n),
            "lobbies": self.lobbies.expected_summary(),
        }
