"""The summary's aggregates over the events read back from Parquet (the job's second pass).

Each Spark action is a scan of the events (or a shuffle), and on a small machine the number of
actions, not the arithmetic, is what costs: the first version ran a job per figure (about 40
jobs for an echo-server log, over 70 with lobby events). Here:
- one grouped count (`_overview`: event x day x the few low-cardinality fields) gives every
  count by type, day, reason, state, refusal code and request, the servers, the time span and
  the chat bytes, folded in Python from a few hundred rows;
- each subset's statistics and histogram bins come from one aggregate of that subset
  (`_stats_and_bins`), not one job for the statistics and one per histogram;
- the per-source tables, the never-joined count and the per-lobby table keep their own jobs
  (they need a shuffle by a high-cardinality key).
The results are exactly the ones the per-figure jobs gave (tests/telemetry compare them with
the generator's ground truth).
"""

from __future__ import annotations

import datetime
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from echo.telemetry import bins

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, Row

SERIES: Final = ("hello_received", "hello_rejected", "duologue_created", "duologue_connected")
SOURCE_EVENTS: Final = ("hello_rejected", "duologue_created", "duologue_expired")
# The fields the overview groups by: each has a handful of values (reasons, states, codes).
OVERVIEW_KEYS: Final = ("event", "day", "server_id", "reason", "state", "code", "request")
# Summed per overview group: chat bytes, and the matchmaker's matches.
OVERVIEW_SUMS: Final = ("bytes", "members", "tickets", "started")
REASON_EVENTS: Final = ("hello_rejected", "duologue_closed", "image_refused")


def _iso(micros: int | None) -> str | None:
    if micros is None:
        return None
    seconds, us = divmod(micros, 1_000_000)
    day = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    return day.strftime("%Y-%m-%dT%H:%M:%S.") + f"{us:06d}Z"


def _bin_index(column: str, edges: Sequence[float]) -> Column:
    """bins.bin_index in Spark: below edges[0] goes to bin 0."""
    from pyspark.sql import functions as F

    index: Column = F.lit(0)
    for i, edge in enumerate(edges[1:], start=1):
        index = F.when(F.col(column) >= F.lit(edge), F.lit(i)).otherwise(index)
    return index


def _bin_columns(column: str, edges: Sequence[float]) -> list[Column]:
    """One count per bin of the non-null values of `column`, as aggregate columns."""
    from pyspark.sql import functions as F

    index = _bin_index(column, edges)
    return [
        F.count(F.when(F.col(column).isNotNull() & (index == i), 1)).alias(f"{column}__bin{i}")
        for i in range(len(edges))
    ]


def _bins_of(row: Row, column: str, edges: Sequence[float]) -> list[int]:
    return [int(row[f"{column}__bin{i}"]) for i in range(len(edges))]


def _top(df: DataFrame, metric: str, n: int) -> list[dict[str, Any]]:
    from pyspark.sql import functions as F

    rows = df.filter(F.col(metric) > 0).orderBy(F.desc(metric), F.asc("source")).limit(n)
    return [
        {
            "source": r["source"],
            "rejections": r["rejections"],
            "duologues": r["duologues"],
            "expiries": r["expiries"],
        }
        for r in rows.collect()
    ]


def _by_source(df: DataFrame, keys: Sequence[str]) -> DataFrame:
    from pyspark.sql import functions as F

    def count_of(event: str) -> Column:
        return F.sum(F.when(F.col("event") == event, 1).otherwise(0)).cast("long")

    return df.groupBy(*keys).agg(
        count_of("hello_rejected").alias("rejections"),
        count_of("duologue_created").alias("duologues"),
        count_of("duologue_expired").alias("expiries"),
    )


def _sorted_counts(counts: Mapping[Any, int]) -> dict[str, int]:
    """{value: rows} with string keys, numbers in numeric order (JSON keys are strings)."""
    keys = sorted(counts, key=lambda k: (isinstance(k, str), k))
    return {str(k): int(counts[k]) for k in keys}


class Overview:
    """The grouped counts of every event, folded into the summary's counts."""

    def __init__(self, rows: Iterable[Row]) -> None:
        self.rows = [r.asDict() for r in rows]
        self.by_type: Counter[str] = Counter()
        self.by_day: Counter[str] = Counter()
        firsts = [r["first"] for r in self.rows if r["first"] is not None]
        lasts = [r["last"] for r in self.rows if r["last"] is not None]
        self.first: int | None = min(firsts) if firsts else None
        self.last: int | None = max(lasts) if lasts else None
        for r in self.rows:
            self.by_type[r["event"]] += r["n"]
            self.by_day[r["day"].isoformat()] += r["n"]

    def count_by(self, field: str, event: str) -> Counter[Any]:
        counts: Counter[Any] = Counter()
        for r in self.rows:
            if r["event"] == event:
                counts[r[field]] += r["n"]
        return counts

    def total(self, field: str, event: str) -> int:
        return sum(int(r[field] or 0) for r in self.rows if r["event"] == event)

    def servers(self, keep: Any) -> list[str]:
        return sorted({r["server_id"] for r in self.rows if keep(r["event"])})


def overview(ev: DataFrame) -> Overview:
    """One job: counts by every low-cardinality field, the time span, the summed fields."""
    from pyspark.sql import functions as F

    return Overview(
        ev.groupBy(*OVERVIEW_KEYS)
        .agg(
            F.count(F.lit(1)).alias("n"),
            # Micros, not datetimes: PySpark hands timestamps to Python in the process's zone.
            F.min(F.unix_micros("ts")).alias("first"),
            F.max(F.unix_micros("ts")).alias("last"),
            *[F.sum(c).alias(c) for c in OVERVIEW_SUMS],
        )
        .collect()
    )


# Past this many server starts in a log, the never-joined count sorts the life events by time
# in a window instead of looking each event's run up in an expression built from the starts.
RUN_LOOKUP_MAX_STARTS: Final = 64


def _never_joined(ev: DataFrame) -> int:
    """Duologues created but never joined.

    duologue_id restarts with each server process, so a duologue is (server, the
    server_started before it, id). A log has few starts: they are collected, and each event's
    run is looked up in an expression built from them, so that the count is one aggregation
    (no sort of every event by time, which a window partitioned by server needs).
    """
    from pyspark.sql import functions as F

    starts = [
        (r["server_id"], int(r["t"]))
        for r in ev.filter(F.col("event") == "server_started")
        .select("server_id", F.unix_micros("ts").alias("t"))
        .distinct()
        .collect()
    ]
    if len(starts) > RUN_LOOKUP_MAX_STARTS:
        keyed = _runs_by_window(ev)
    else:
        life = ev.filter(F.col("event").isin("duologue_created", "duologue_connected"))
        keyed = life.withColumn("run", _run_of(starts))
    created = F.col("event") == "duologue_created"
    # An id-less connection joins nothing (as a join on the key would not match a null).
    joined = (F.col("event") == "duologue_connected") & F.col("duologue_id").isNotNull()
    row = (
        keyed.groupBy("server_id", "run", "duologue_id")
        .agg(
            F.sum(F.when(created, 1).otherwise(0)).alias("created"),
            F.max(F.when(joined, 1).otherwise(0)).alias("joined"),
        )
        .filter(F.col("joined") == 0)
        .agg(F.sum("created").alias("n"))
        .first()
    )
    return int(row["n"] or 0) if row is not None else 0


def _run_of(starts: Sequence[tuple[str, int]]) -> Column:
    """The micros of the last start of the event's server at or before it (0 before any)."""
    from pyspark.sql import functions as F

    by_server: dict[str, list[int]] = defaultdict(list)
    for server, t in starts:
        by_server[server].append(t)
    at = F.unix_micros("ts")
    run: Column = F.lit(0).cast("long")
    for server, times in by_server.items():
        last: Column = F.lit(0).cast("long")
        for start in sorted(times):
            last = F.when(at >= F.lit(start), F.lit(start)).otherwise(last)
        run = F.when(F.col("server_id") == server, last).otherwise(run)
    return run


def _runs_by_window(ev: DataFrame) -> DataFrame:
    """The created and connected events with their run, found by a window over the starts."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    life_events = ev.filter(
        F.col("event").isin("server_started", "duologue_created", "duologue_connected")
    )
    run = (
        Window.partitionBy("server_id")
        .orderBy("ts", (F.col("event") != "server_started"))
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    return life_events.withColumn(
        "run",
        F.coalesce(
            F.max(F.when(F.col("event") == "server_started", F.unix_micros("ts"))).over(run),
            F.lit(0).cast("long"),
        ),
    ).filter(F.col("event") != "server_started")


def _sources(ev: DataFrame, top_n: int) -> tuple[dict[str, Any], int]:
    """The top-sources tables: per address, and per IPv6 network (prefix differs from the
    address exactly for IPv6, pseudonymised or not, because an IPv4 prefix key is the address
    itself). One shuffle of the events, by (address, prefix); both tables fold from it."""
    from pyspark.sql import functions as F

    src = ev.filter(F.col("event").isin(list(SOURCE_EVENTS)))
    pairs = _by_source(src, ["source_ip", "source_prefix"]).cache()
    counts = [F.sum(c).cast("long").alias(c) for c in ("rejections", "duologues", "expiries")]
    per_ip = pairs.groupBy(F.col("source_ip").alias("source")).agg(*counts).cache()
    per_prefix = (
        pairs.filter(F.col("source_prefix") != F.col("source_ip"))
        .groupBy(F.col("source_prefix").alias("source"))
        .agg(*counts)
        .cache()
    )
    top_sources = {
        "by_rejections": _top(per_ip, "rejections", top_n),
        "by_duologues": _top(per_ip, "duologues", top_n),
        "prefixes_by_rejections": _top(per_prefix, "rejections", top_n),
        "prefixes_by_duologues": _top(per_prefix, "duologues", top_n),
    }
    distinct_sources = per_ip.count()
    for df in (per_ip, per_prefix, pairs):
        df.unpersist()
    return top_sources, distinct_sources


def _series(ev: DataFrame, first: int | None, last: int | None) -> dict[str, Any]:
    """Connections over time, in a bucket that keeps the chart readable for this span."""
    from pyspark.sql import functions as F

    span_s = (last - first) / 1e6 if first is not None and last is not None else 0.0
    bucket = bins.choose_bucket(span_s)
    start = F.floor(F.unix_micros("ts") / F.lit(bucket * 1_000_000)) * bucket
    rows = (
        ev.filter(F.col("event").isin(list(SERIES)))
        .groupBy(start.cast("long").alias("t"))
        .agg(*[F.sum(F.when(F.col("event") == s, 1).otherwise(0)).alias(s) for s in SERIES])
        .orderBy("t")
        .collect()
    )
    series = [
        {
            "t": datetime.datetime.fromtimestamp(r["t"], datetime.UTC).strftime(
                "%Y-%m-%dT%H:%M:%SZ"
            ),
            **{s: int(r[s]) for s in SERIES},
        }
        for r in rows
    ]
    return {"bucket_s": bucket, "series": series}


def _used(ev: DataFrame) -> dict[str, Any]:
    """Lifetimes and traffic of duologues a client actually used (expired ones had neither):
    the statistics and both histograms in one aggregate."""
    from pyspark.sql import functions as F

    used = ev.filter((F.col("event") == "duologue_closed") & (F.col("reason") != "expired"))
    row = used.agg(
        F.count(F.lit(1)).alias("n"),
        F.sum("messages").alias("messages"),
        F.percentile_approx("lifetime_s", [0.5, 0.9, 0.99], 10000).alias("life_p"),
        F.percentile_approx("messages", [0.5, 0.9, 0.99], 10000).alias("msg_p"),
        *_bin_columns("lifetime_s", bins.LIFETIME_EDGES_S),
        *_bin_columns("messages", bins.MESSAGE_EDGES),
    ).first()
    assert row is not None
    n_used = int(row["n"])
    life_p = row["life_p"] or [None, None, None]
    msg_p = row["msg_p"] or [None, None, None]
    messages_total = int(row["messages"] or 0)
    return {
        "lifetime_s": {
            "count": n_used,
            "edges": list(bins.LIFETIME_EDGES_S),
            "histogram": _bins_of(row, "lifetime_s", bins.LIFETIME_EDGES_S),
            "p50": life_p[0],
            "p90": life_p[1],
            "p99": life_p[2],
        },
        "messages": {
            "count": n_used,
            "total": messages_total,
            "mean": messages_total / n_used if n_used else None,
            "edges": list(bins.MESSAGE_EDGES),
            "histogram": _bins_of(row, "messages", bins.MESSAGE_EDGES),
            "p50": msg_p[0],
            "p90": msg_p[1],
            "p99": msg_p[2],
        },
    }


def _client_rtt(ev: DataFrame, states: Mapping[str, int]) -> dict[str, Any]:
    """Round trips as clients measured them (only clients run with --events report them)."""
    from pyspark.sql import functions as F

    clients = ev.filter(F.col("event") == "client_summary")
    rtt_cols = ("rtt_ms_p50", "rtt_ms_p90", "rtt_ms_p99", "rtt_ms_max")
    row = clients.agg(
        F.count(F.lit(1)).alias("n"),
        F.count("rtt_ms_p50").alias("with_rtt"),
        F.sum("sent").alias("sent"),
        F.sum("received").alias("received"),
        *[F.percentile_approx(c, [0.5, 0.9], 10000).alias(c) for c in rtt_cols],
        *_bin_columns("rtt_ms_p50", bins.RTT_EDGES_MS),
    ).first()
    assert row is not None

    def pct(values: list[float] | None) -> dict[str, float | None]:
        values = values or [None, None]  # type: ignore[list-item]
        return {"median": values[0], "p90": values[1]}

    return {
        "clients": int(row["n"]),
        "clients_with_rtt": int(row["with_rtt"]),
        "sent": int(row["sent"] or 0),
        "received": int(row["received"] or 0),
        "states": dict(sorted(states.items())),
        # Across clients: the median client's p50, p90, ... and the 90th-percentile client's.
        **{c: pct(row[c]) for c in rtt_cols},
        "p50_edges_ms": list(bins.RTT_EDGES_MS),
        "p50_histogram": _bins_of(row, "rtt_ms_p50", bins.RTT_EDGES_MS),
    }


def aggregate(ev: DataFrame, top_n: int) -> dict[str, Any]:
    """Every figure of summary.json but the line counts, from the valid events `ev`."""
    from echo.telemetry.lobby_report import lobbies

    ov = overview(ev)
    by_type = ov.by_type
    reasons: dict[str, dict[str, int]] = defaultdict(dict)
    for event in REASON_EVENTS:
        for reason, n in ov.count_by("reason", event).items():
            reasons[event][str(reason)] = n
    top_sources, distinct_sources = _sources(ev, top_n)
    used = _used(ev)
    states = {str(k): n for k, n in ov.count_by("state", "client_summary").items()}
    client_rtt = _client_rtt(ev, states)
    return {
        "events_by_type": dict(sorted(by_type.items())),
        "events_by_day": dict(sorted(ov.by_day.items())),
        "servers": ov.servers(lambda event: event != "client_summary"),
        "first_ts": _iso(ov.first),
        "last_ts": _iso(ov.last),
        "hello_received": by_type.get("hello_received", 0),
        "hello_rejected": dict(sorted(reasons["hello_rejected"].items())),
        "hello_rejected_total": by_type.get("hello_rejected", 0),
        "duologues_created": by_type.get("duologue_created", 0),
        "duologues_connected": by_type.get("duologue_connected", 0),
        "duologues_expired": _never_joined(ev),
        "duologue_expired_events": by_type.get("duologue_expired", 0),
        "duologues_closed": dict(sorted(reasons["duologue_closed"].items())),
        "image_refused": dict(sorted(reasons["image_refused"].items())),
        "client_summaries": client_rtt["clients"],
        "distinct_sources": distinct_sources,
        "top_sources": top_sources,
        **used,
        "connections_over_time": _series(ev, ov.first, ov.last),
        "client_rtt": client_rtt,
        "lobbies": lobbies(ev, ov),
    }
