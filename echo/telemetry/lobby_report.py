"""The `lobbies` part of summary.json, from `echo-lobby --events` lines (see `lobbies`)."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from echo.telemetry.aggregate import _bin_columns, _bins_of, _sorted_counts
from echo.telemetry.bins import LOBBY_WAIT_EDGES_S

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, Row

    from echo.telemetry.aggregate import Overview


def lobbies(ev: DataFrame, ov: Overview) -> dict[str, Any]:
    """The lobby report.

    A lobby is its `lobby_id` across servers: ids are random 63-bit numbers, and a lobby its
    members re-created on the next server after its home died is the same lobby; `rehomed`
    counts the lobbies whose events come from more than one server. Per lobby, from its first
    `lobby_created`:
    - capacity: that event's `max_members`; peak: the most `members` any event of it carried
      (at least 1, the creator);
    - time to fill: until the first `lobby_joined` with `members` >= capacity, or until its
      first `lobby_started` if that came earlier (a lobby that starts before it is full has
      stopped waiting for players); a lobby that did neither is counted as `never`;
    - time to start and members at start: its first `lobby_started`.
    Lobbies whose `lobby_created` is not in the log (it began before the log did) count in
    joins, chat and refusals but not in the per-lobby numbers. `resumed` counts the seats
    taken back with a resume token (`lobby_resumed`); `matched` the lobbies the matchmaker
    seated (`lobby_matched`: matches, members and tickets seated, matches started at once).
    The counts by reason, code and request come from the overview (`ov`).
    """
    from pyspark.sql import functions as F

    by_type = ov.by_type
    lob = ev.filter(F.col("event").startswith("lobby_")).select(
        "event", "ts", "lobby_id", "server_id", "members", "max_members"
    )
    per, with_chat = _per_lobby(lob)
    per = per.cache()
    waits = per.agg(
        F.count(F.lit(1)).alias("created"),
        F.count("fill_s").alias("filled"),
        F.count("start_s").alias("started"),
        F.sum(F.when(F.col("servers") > 1, 1).otherwise(0)).alias("rehomed"),
        F.percentile_approx("fill_s", [0.5, 0.9, 0.99], 10000).alias("fill_p"),
        F.percentile_approx("start_s", [0.5, 0.9, 0.99], 10000).alias("start_p"),
        *_bin_columns("fill_s", LOBBY_WAIT_EDGES_S),
        *_bin_columns("start_s", LOBBY_WAIT_EDGES_S),
    ).first()
    assert waits is not None
    sizes = _sizes(per)
    per.unpersist()
    lobbies_with_chat = with_chat.count() if by_type.get("lobby_chat") else 0
    return _report(ov, waits, sizes, lobbies_with_chat)


def _per_lobby(lob: DataFrame) -> tuple[DataFrame, DataFrame]:
    """One row per lobby created in the log (capacity, peak, servers, chat, and the seconds
    to fill and to start), and the lobbies with a chat line (created in the log or not)."""
    from pyspark.sql import functions as F

    event = F.col("event")

    def first_ts(name: str) -> Column:
        return F.when(event == name, F.col("ts"))

    per = (
        lob.filter(F.col("lobby_id").isNotNull())
        .groupBy("lobby_id")
        .agg(
            F.min(first_ts("lobby_created")).alias("created"),
            # min_by ignores rows whose ordering is null, so these read the first such event.
            F.min_by("max_members", first_ts("lobby_created")).alias("capacity"),
            F.max("members").alias("peak"),
            F.min(first_ts("lobby_started")).alias("started"),
            F.min_by("members", first_ts("lobby_started")).alias("at_start"),
            F.countDistinct("server_id").alias("servers"),
            F.max(F.when(event == "lobby_chat", 1)).alias("chat"),
        )
    )
    # Chat counts every lobby with a chat line, created in the log or not.
    with_chat = per.filter(F.col("chat").isNotNull())
    per = per.filter(F.col("created").isNotNull())
    joined = lob.filter(event == "lobby_joined").select("lobby_id", "ts", "members")
    full = (
        joined.join(per.select("lobby_id", "capacity"), "lobby_id")
        .filter(F.col("members") >= F.col("capacity"))
        .groupBy("lobby_id")
        .agg(F.min("ts").alias("full"))
    )

    def seconds_since_created(column: Column) -> Column:
        return (F.unix_micros(column) - F.unix_micros(F.col("created"))) / F.lit(1e6)

    per = (
        per.join(full, "lobby_id", "left")
        .withColumn("peak", F.greatest(F.lit(1), F.coalesce(F.col("peak"), F.lit(1))))
        .withColumn("fill_s", seconds_since_created(F.least("full", "started")))
        .withColumn("start_s", seconds_since_created(F.col("started")))
    )
    return per, with_chat


def _sizes(per: DataFrame) -> dict[str, Counter[int]]:
    """Lobbies by capacity, by peak and by members at start."""
    capacity: Counter[int] = Counter()
    peak: Counter[int] = Counter()
    at_start: Counter[int] = Counter()
    for r in per.groupBy("capacity", "peak", "at_start").count().collect():
        capacity[r["capacity"]] += r["count"]
        peak[r["peak"]] += r["count"]
        if r["at_start"] is not None:
            at_start[r["at_start"]] += r["count"]
    return {"capacity": capacity, "peak": peak, "at_start": at_start}


def _report(
    ov: Overview, waits: Row, sizes: dict[str, Counter[int]], lobbies_with_chat: int
) -> dict[str, Any]:
    """The summary's `lobbies` object from the aggregates."""
    by_type = ov.by_type

    def wait_stats(column: str, count: int, p: list[float] | None) -> dict[str, Any]:
        p = p or [None, None, None]  # type: ignore[list-item]
        return {
            "count": count,
            "edges": list(LOBBY_WAIT_EDGES_S),
            "histogram": _bins_of(waits, column, LOBBY_WAIT_EDGES_S),
            "p50": p[0],
            "p90": p[1],
            "p99": p[2],
        }

    created = int(waits["created"])
    filled = int(waits["filled"])
    lines = by_type.get("lobby_chat", 0)
    chat_bytes = ov.total("bytes", "lobby_chat")
    by_code = _sorted_counts(ov.count_by("code", "lobby_refused"))
    return {
        "servers": ov.servers(lambda name: name.startswith("lobby_")),
        "created": created,
        "rehomed": int(waits["rehomed"] or 0),
        "joins": by_type.get("lobby_joined", 0),
        "started": int(waits["started"]),
        "left": _sorted_counts(ov.count_by("reason", "lobby_left")),
        "deleted": _sorted_counts(ov.count_by("reason", "lobby_deleted")),
        "sizes": {name: _sorted_counts(counts) for name, counts in sizes.items()},
        "time_to_fill_s": {
            **wait_stats("fill_s", filled, waits["fill_p"]),
            "never": created - filled,
        },
        "time_to_start_s": wait_stats("start_s", int(waits["started"]), waits["start_p"]),
        "chat": {
            "lines": lines,
            "bytes": chat_bytes,
            "lobbies_with_chat": lobbies_with_chat,
            "bytes_per_line": chat_bytes / lines if lines else None,
        },
        "refusals": {
            "total": sum(by_code.values()),
            "by_code": by_code,
            "by_request": _sorted_counts(ov.count_by("request", "lobby_refused")),
        },
        "resumed": by_type.get("lobby_resumed", 0),
        "matched": {
            "matches": by_type.get("lobby_matched", 0),
            "members": ov.total("members", "lobby_matched"),
            "tickets": ov.total("tickets", "lobby_matched"),
            "started": ov.total("started", "lobby_matched"),
        },
    }
