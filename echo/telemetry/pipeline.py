"""The PySpark job behind `echo-analyze`: event logs in, Parquet + summary.json + report.html out.

Shape of the job (two passes over the data, both native Spark, no Python UDFs, so executors of
a cluster need nothing but Spark):
1. read the text (files, directories, globs, any Hadoop URI), parse each line with an explicit
   schema derived from echo.telemetry.schema, classify it (valid / unknown event / bad) with
   the same rules as `validate_event`, count the classes with an Observation during the write,
   and write the valid events as Parquet partitioned by `day`;
2. read the Parquet back (columnar, so each aggregate touches only its columns) and compute
   the aggregates of the summary.
A bad line is counted and sampled, never fatal: a server that crashed mid-line, or a log from a
newer server, must still yield a report.

Lobby events (`echo-lobby --events`) are summarised under `lobbies` (see `_lobbies` for the
rules); a log without them gets the same summary as before plus an all-zero `lobbies`.
"""

from __future__ import annotations

import datetime
import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import attrs

from echo.telemetry import bins
from echo.telemetry.bins import LOBBY_WAIT_EDGES_S
from echo.telemetry.schema import (
    COMMON_FIELDS,
    EVENT_FIELDS,
    SCHEMA_VERSION,
    TS_RE,
    TS_SPARK_PATTERN,
    FieldType,
    all_fields,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

CORRUPT: Final = "_corrupt"
SERIES: Final = ("hello_received", "hello_rejected", "duologue_created", "duologue_connected")
SOURCE_EVENTS: Final = ("hello_rejected", "duologue_created", "duologue_expired")
SAMPLE_BAD_LINES: Final = 5


class NoInputError(ValueError):
    """No input path matched, or none could be read."""


@attrs.frozen
class Summary:
    """What the job found: `data` is exactly the content of summary.json."""

    data: dict[str, Any]
    out_dir: str
    summary_path: str
    report_path: str
    parquet_path: str

    def __getitem__(self, key: str) -> Any:
        return self.data[key]


def _spark_type(ftype: FieldType) -> Any:
    from pyspark.sql import types as T

    return {
        FieldType.INT: T.LongType(),
        FieldType.FLOAT: T.DoubleType(),
        FieldType.FLOAT_OR_NULL: T.DoubleType(),
        FieldType.STR: T.StringType(),
        FieldType.STR_OR_NULL: T.StringType(),
    }[ftype]


def read_schema() -> StructType:
    """The explicit JSON schema: every field of schema v1 plus the corrupt-record column."""
    from pyspark.sql import types as T

    fields = [T.StructField(n, _spark_type(t), True) for n, t in all_fields().items()]
    return T.StructType([*fields, T.StructField(CORRUPT, T.StringType(), True)])


def _string_type_regex(fields: Mapping[str, FieldType]) -> str:
    """A regex that finds a string field whose JSON value is not a string (nor null).

    Spark's JSON reader turns any value into text for a StringType column (5 -> "5"), so a
    wrongly typed string field must be caught on the raw line. Inside a JSON string every quote
    is escaped, so `"name"` followed by `:` can only be a key.
    """
    names = [n for n, t in {**COMMON_FIELDS, **fields}.items() if t.is_str]
    keys = "|".join(re.escape(n) for n in names)
    return rf'"(?:{keys})"\s*:\s*[^"n\s]'


def classify(raw: DataFrame) -> DataFrame:
    """Parse `value` lines; adds `j` (struct), `ts_parsed`, `valid`, `known` columns."""
    from pyspark.sql import functions as F

    parsed = raw.select(
        "value",
        F.from_json(
            "value",
            read_schema(),
            {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT},
        ).alias("j"),
    ).withColumn("ts_parsed", F.try_to_timestamp(F.col("j.ts"), F.lit(TS_SPARK_PATTERN)))
    j = F.col("j")
    common_ok = (
        j.isNotNull()
        & j[CORRUPT].isNull()
        & j["server_id"].isNotNull()
        & j["event"].isNotNull()
        & (F.coalesce(j["schema_version"], F.lit(-1)) == SCHEMA_VERSION)
        & F.coalesce(j["ts"].rlike(f"^{TS_RE.pattern}$"), F.lit(False))
        & F.col("ts_parsed").isNotNull()
    )
    fields_ok: Column = F.when(~F.col("value").rlike(_string_type_regex({})), True).otherwise(False)
    known = F.lit(False)
    for event, fields in EVENT_FIELDS.items():
        required = [j[n].isNotNull() for n, t in fields.items() if not t.nullable]
        ok = ~F.col("value").rlike(_string_type_regex(fields))
        for cond in required:
            ok = ok & cond
        fields_ok = F.when(j["event"] == event, ok).otherwise(fields_ok)
        known = known | (j["event"] == event)
    return parsed.withColumn("valid", F.coalesce(common_ok & fields_ok, F.lit(False))).withColumn(
        "known", F.coalesce(known, F.lit(False))
    )


def build_spark(
    master: str | None = "local[*]",
    *,
    app_name: str = "echo-analyze",
    progress: bool = True,
    driver_memory: str | None = None,
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """A SparkSession for the job. `master=None` keeps whatever spark-submit configured."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if master is None and "PYSPARK_GATEWAY_PORT" not in os.environ:
        master = "local[*]"  # plain `python`, not spark-submit: nothing else would set one
    if master is not None:
        builder = builder.master(master)
    builder = builder.config("spark.sql.session.timeZone", "UTC")
    # Long jobs show Spark's own stage progress bars on the console.
    builder = builder.config("spark.ui.showConsoleProgress", "true" if progress else "false")
    if driver_memory and (master or "").startswith("local"):
        # In local mode the driver JVM is the whole cluster; 1g (Spark's default) is tight.
        builder = builder.config("spark.driver.memory", driver_memory)
    if (master or "").startswith("local"):
        # The summary's groupings are small; Spark's default of 200 shuffle partitions is
        # cluster-sized and turns each of a dozen aggregates into 200 tiny tasks on one host.
        builder = builder.config("spark.sql.shuffle.partitions", "16")
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def _has_scheme(path: str) -> bool:
    return re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", path) is not None and not path.startswith(
        "file:"
    )


def _write_text(spark: SparkSession, path: str, text: str) -> None:
    """Write a small text file next to the Parquet, on local disk or any Hadoop file system."""
    if not _has_scheme(path):
        local = path[len("file://") :] if path.startswith("file://") else path
        with open(local, "w", encoding="utf-8") as f:
            f.write(text)
        return
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    hpath = jvm.org.apache.hadoop.fs.Path(path)
    fs = hpath.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    stream = fs.create(hpath, True)
    try:
        stream.write(bytearray(text.encode("utf-8")))
    finally:
        stream.close()


def run_analysis(
    inputs: Sequence[str],
    out_dir: str,
    *,
    master: str | None = "local[*]",
    spark: SparkSession | None = None,
    top_n: int = 20,
    progress: bool = False,
    driver_memory: str | None = None,
) -> Summary:
    """Analyse event logs; write DIR/events (Parquet by day), DIR/summary.json, DIR/report.html.

    `inputs` are files, directories or globs, local or any Hadoop-compatible URI. When `spark`
    is given, or one is already active in this process, it is used and left running; otherwise
    one is built for `master` and stopped at the end.
    """
    if not inputs:
        raise NoInputError("no input paths given")
    if spark is None:
        from pyspark.sql import SparkSession

        # Inside spark-submit, a notebook or a test session, use (and leave running) that one.
        spark = SparkSession.getActiveSession()
    own = spark is None
    if spark is None:
        spark = build_spark(master, progress=progress, driver_memory=driver_memory)
    try:
        return _run(spark, list(inputs), out_dir, top_n)
    finally:
        if own:
            spark.stop()


def _run(spark: SparkSession, inputs: list[str], out_dir: str, top_n: int) -> Summary:
    from pyspark.errors import AnalysisException
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    # Bucketing by day and hour must mean UTC whatever the cluster's default zone is.
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    if not _has_scheme(out_dir):
        out_dir = os.path.abspath(out_dir[7:] if out_dir.startswith("file://") else out_dir)
        os.makedirs(out_dir, exist_ok=True)
    parquet_path = f"{out_dir.rstrip('/')}/events"
    try:
        raw = spark.read.text(inputs)
    except AnalysisException as exc:
        raise NoInputError(f"cannot read {', '.join(inputs)}: {str(exc).splitlines()[0]}") from exc

    # Blank lines are not events (an editor's trailing newline); everything else is judged.
    lines = classify(raw.filter(F.trim("value") != ""))
    bad = ~F.col("valid")
    observation = Observation("lines")
    observed = lines.observe(
        observation,
        F.count(F.lit(1)).alias("lines_total"),
        F.sum(F.when(bad, 1).otherwise(0)).alias("bad_lines"),
        F.sum(F.when(F.col("valid") & ~F.col("known"), 1).otherwise(0)).alias("unknown_events"),
    )
    columns = [F.col("ts_parsed").alias("ts")] + [
        F.col(f"j.{name}").alias(name) for name in all_fields() if name != "ts"
    ]
    events = observed.filter("valid").select(*columns).withColumn("day", F.to_date("ts"))
    events.write.mode("overwrite").partitionBy("day").parquet(parquet_path)
    metrics = observation.get
    lines_total = int(metrics.get("lines_total") or 0)
    bad_lines = int(metrics.get("bad_lines") or 0)
    samples: list[str] = []
    if bad_lines:
        # A second look at the text only when something was bad; limit() stops early.
        samples = [
            r.value[:300]
            for r in lines.filter(bad).select("value").limit(SAMPLE_BAD_LINES).collect()
        ]

    ev_schema = events.schema
    if lines_total - bad_lines > 0:
        ev = spark.read.schema(ev_schema).parquet(parquet_path)
    else:
        ev = spark.createDataFrame([], ev_schema)
    data = _aggregate(ev, top_n)
    data = {
        "schema_version": SCHEMA_VERSION,
        "inputs": inputs,
        "lines_total": lines_total,
        "bad_lines": bad_lines,
        "bad_line_samples": samples,
        "unknown_events": int(metrics.get("unknown_events") or 0),
        "events_total": lines_total - bad_lines,
        **data,
        "parquet": parquet_path,
    }
    from echo.telemetry.report import render_html

    summary_path = f"{out_dir.rstrip('/')}/summary.json"
    report_path = f"{out_dir.rstrip('/')}/report.html"
    _write_text(spark, summary_path, json.dumps(data, indent=2, sort_keys=False) + "\n")
    _write_text(spark, report_path, render_html(data))
    return Summary(
        data=data,
        out_dir=out_dir,
        summary_path=summary_path,
        report_path=report_path,
        parquet_path=parquet_path,
    )


def _iso(micros: int | None) -> str | None:
    if micros is None:
        return None
    seconds, us = divmod(micros, 1_000_000)
    day = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    return day.strftime("%Y-%m-%dT%H:%M:%S.") + f"{us:06d}Z"


def _histogram(df: DataFrame, column: str, edges: Sequence[float]) -> list[int]:
    """Counts per bin (bins.bin_index semantics: below edges[0] goes to bin 0)."""
    from pyspark.sql import functions as F

    index: Column = F.lit(0)
    for i, edge in enumerate(edges[1:], start=1):
        index = F.when(F.col(column) >= F.lit(edge), F.lit(i)).otherwise(index)
    counts = [0] * len(edges)
    for row in df.filter(F.col(column).isNotNull()).groupBy(index.alias("bin")).count().collect():
        counts[row["bin"]] = row["count"]
    return counts


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


def _by_source(df: DataFrame, key: str) -> DataFrame:
    from pyspark.sql import functions as F

    def count_of(event: str) -> Column:
        return F.sum(F.when(F.col("event") == event, 1).otherwise(0)).cast("long")

    return df.groupBy(F.col(key).alias("source")).agg(
        count_of("hello_rejected").alias("rejections"),
        count_of("duologue_created").alias("duologues"),
        count_of("duologue_expired").alias("expiries"),
    )


def _aggregate(ev: DataFrame, top_n: int) -> dict[str, Any]:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    by_type = {r["event"]: r["count"] for r in ev.groupBy("event").count().collect()}
    by_day = {r["day"].isoformat(): r["count"] for r in ev.groupBy("day").count().collect()}
    span = ev.agg(
        # Micros, not datetimes: PySpark hands timestamps to Python in the *process* time zone.
        F.min(F.unix_micros("ts")).alias("first"),
        F.max(F.unix_micros("ts")).alias("last"),
        F.sort_array(
            F.collect_set(F.when(F.col("event") != "client_summary", F.col("server_id")))
        ).alias("servers"),
    ).first()
    assert span is not None
    first, last = span["first"], span["last"]

    reasons: dict[str, dict[str, int]] = {
        "hello_rejected": {},
        "duologue_closed": {},
        "image_refused": {},
    }
    for r in (
        ev.filter(F.col("event").isin(list(reasons))).groupBy("event", "reason").count().collect()
    ):
        reasons[r["event"]][str(r["reason"])] = r["count"]

    # Sources: per address, and per IPv6 network (prefix differs from the address exactly for
    # IPv6, pseudonymised or not, because an IPv4 prefix key is the address itself).
    src = ev.filter(F.col("event").isin(list(SOURCE_EVENTS)))
    per_ip = _by_source(src, "source_ip").cache()
    per_prefix = _by_source(
        src.filter(F.col("source_prefix") != F.col("source_ip")), "source_prefix"
    )
    per_prefix = per_prefix.cache()
    top_sources = {
        "by_rejections": _top(per_ip, "rejections", top_n),
        "by_duologues": _top(per_ip, "duologues", top_n),
        "prefixes_by_rejections": _top(per_prefix, "rejections", top_n),
        "prefixes_by_duologues": _top(per_prefix, "duologues", top_n),
    }
    distinct_sources = per_ip.count()
    per_ip.unpersist()
    per_prefix.unpersist()

    # Expiries = created but never joined. duologue_id restarts with each server process, so a
    # duologue is (server, the server_started before it, id); the window finds that start.
    life_events = ev.filter(
        F.col("event").isin("server_started", "duologue_created", "duologue_connected")
    )
    run = (
        Window.partitionBy("server_id")
        .orderBy("ts", (F.col("event") != "server_started"))
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    keyed = life_events.withColumn(
        "run",
        F.coalesce(
            F.max(F.when(F.col("event") == "server_started", F.col("ts"))).over(run),
            F.timestamp_seconds(F.lit(0)),
        ),
    )
    key = ["server_id", "run", "duologue_id"]
    created = keyed.filter(F.col("event") == "duologue_created").select(*key)
    joined = keyed.filter(F.col("event") == "duologue_connected").select(*key).distinct()
    never_joined = created.join(joined, on=key, how="left_anti").count()

    # Lifetimes and traffic of duologues a client actually used (expired ones had neither).
    used = ev.filter((F.col("event") == "duologue_closed") & (F.col("reason") != "expired"))
    used_stats = used.agg(
        F.count(F.lit(1)).alias("n"),
        F.sum("messages").alias("messages"),
        F.percentile_approx("lifetime_s", [0.5, 0.9, 0.99], 10000).alias("life_p"),
        F.percentile_approx("messages", [0.5, 0.9, 0.99], 10000).alias("msg_p"),
    ).first()
    assert used_stats is not None
    n_used = int(used_stats["n"])
    life_p = used_stats["life_p"] or [None, None, None]
    msg_p = used_stats["msg_p"] or [None, None, None]
    messages_total = int(used_stats["messages"] or 0)

    # Connections over time, in a bucket that keeps the chart readable for this span.
    span_s = (last - first) / 1e6 if first is not None and last is not None else 0.0
    bucket = bins.choose_bucket(span_s)
    start = F.floor(F.unix_micros("ts") / F.lit(bucket * 1_000_000)) * bucket
    series_rows = (
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
        for r in series_rows
    ]

    # Round trips as clients measured them (only clients run with --events report them).
    clients = ev.filter(F.col("event") == "client_summary")
    rtt_cols = ("rtt_ms_p50", "rtt_ms_p90", "rtt_ms_p99", "rtt_ms_max")
    rtt_row = clients.agg(
        F.count(F.lit(1)).alias("n"),
        F.count("rtt_ms_p50").alias("with_rtt"),
        F.sum("sent").alias("sent"),
        F.sum("received").alias("received"),
        *[F.percentile_approx(c, [0.5, 0.9], 10000).alias(c) for c in rtt_cols],
    ).first()
    assert rtt_row is not None
    states = {r["state"]: r["count"] for r in clients.groupBy("state").count().collect()}

    lobbies = _lobbies(ev, by_type)

    def pct(values: list[float] | None) -> dict[str, float | None]:
        values = values or [None, None]  # type: ignore[list-item]
        return {"median": values[0], "p90": values[1]}

    return {
        "events_by_type": dict(sorted(by_type.items())),
        "events_by_day": dict(sorted(by_day.items())),
        "servers": list(span["servers"]),
        "first_ts": _iso(first),
        "last_ts": _iso(last),
        "hello_received": by_type.get("hello_received", 0),
        "hello_rejected": dict(sorted(reasons["hello_rejected"].items())),
        "hello_rejected_total": by_type.get("hello_rejected", 0),
        "duologues_created": by_type.get("duologue_created", 0),
        "duologues_connected": by_type.get("duologue_connected", 0),
        "duologues_expired": never_joined,
        "duologue_expired_events": by_type.get("duologue_expired", 0),
        "duologues_closed": dict(sorted(reasons["duologue_closed"].items())),
        "image_refused": dict(sorted(reasons["image_refused"].items())),
        "client_summaries": int(rtt_row["n"]),
        "distinct_sources": distinct_sources,
        "top_sources": top_sources,
        "lifetime_s": {
            "count": n_used,
            "edges": list(bins.LIFETIME_EDGES_S),
            "histogram": _histogram(used, "lifetime_s", bins.LIFETIME_EDGES_S),
            "p50": life_p[0],
            "p90": life_p[1],
            "p99": life_p[2],
        },
        "messages": {
            "count": n_used,
            "total": messages_total,
            "mean": messages_total / n_used if n_used else None,
            "edges": list(bins.MESSAGE_EDGES),
            "histogram": _histogram(used, "messages", bins.MESSAGE_EDGES),
            "p50": msg_p[0],
            "p90": msg_p[1],
            "p99": msg_p[2],
        },
        "connections_over_time": {"bucket_s": bucket, "series": series},
        "client_rtt": {
            "clients": int(rtt_row["n"]),
            "clients_with_rtt": int(rtt_row["with_rtt"]),
            "sent": int(rtt_row["sent"] or 0),
            "received": int(rtt_row["received"] or 0),
            "states": dict(sorted(states.items())),
            # Across clients: the median client's p50, p90, ... and the 90th-percentile client's.
            **{c: pct(rtt_row[c]) for c in rtt_cols},
            "p50_edges_ms": list(bins.RTT_EDGES_MS),
            "p50_histogram": _histogram(clients, "rtt_ms_p50", bins.RTT_EDGES_MS),
        },
        "lobbies": lobbies,
    }


def _counts_by(df: DataFrame, column: str) -> dict[str, int]:
    """{value: rows} with string keys, numbers in numeric order (JSON keys are strings)."""
    rows = [(r[column], r["count"]) for r in df.groupBy(column).count().collect()]
    rows.sort(key=lambda kv: (isinstance(kv[0], str), kv[0]))
    return {str(k): int(v) for k, v in rows}


def _lobbies(ev: DataFrame, by_type: Mapping[str, int]) -> dict[str, Any]:
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
    joins, chat and refusals but not in the per-lobby numbers.
    """
    from pyspark.sql import functions as F

    lob = ev.filter(F.col("event").startswith("lobby_"))
    servers = lob.agg(F.sort_array(F.collect_set("server_id")).alias("s")).first()
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
        )
        .filter(F.col("created").isNotNull())
    )
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
        .cache()
    )
    waits = per.agg(
        F.count(F.lit(1)).alias("created"),
        F.count("fill_s").alias("filled"),
        F.count("start_s").alias("started"),
        F.sum(F.when(F.col("servers") > 1, 1).otherwise(0)).alias("rehomed"),
        F.percentile_approx("fill_s", [0.5, 0.9, 0.99], 10000).alias("fill_p"),
        F.percentile_approx("start_s", [0.5, 0.9, 0.99], 10000).alias("start_p"),
    ).first()
    assert waits is not None

    def wait_stats(column: str, count: int, p: list[float] | None) -> dict[str, Any]:
        p = p or [None, None, None]  # type: ignore[list-item]
        return {
            "count": count,
            "edges": list(LOBBY_WAIT_EDGES_S),
            "histogram": _histogram(per, column, LOBBY_WAIT_EDGES_S),
            "p50": p[0],
            "p90": p[1],
            "p99": p[2],
        }

    created = int(waits["created"])
    filled = int(waits["filled"])
    sizes = {
        "capacity": _counts_by(per, "capacity"),
        "peak": _counts_by(per, "peak"),
        "at_start": _counts_by(per.filter(F.col("at_start").isNotNull()), "at_start"),
    }
    fill = {**wait_stats("fill_s", filled, waits["fill_p"]), "never": created - filled}
    start = wait_stats("start_s", int(waits["started"]), waits["start_p"])
    per.unpersist()

    chat = (
        lob.filter(event == "lobby_chat")
        .agg(
            F.count(F.lit(1)).alias("lines"),
            F.sum("bytes").alias("bytes"),
            F.countDistinct("lobby_id").alias("lobbies"),
        )
        .first()
    )
    assert chat is not None
    lines, chat_bytes = int(chat["lines"]), int(chat["bytes"] or 0)
    refused = lob.filter(event == "lobby_refused")
    by_code = _counts_by(refused, "code")
    return {
        "servers": list(servers["s"]) if servers is not None else [],
        "created": created,
        "rehomed": int(waits["rehomed"] or 0),
        "joins": by_type.get("lobby_joined", 0),
        "started": int(waits["started"]),
        "left": _counts_by(lob.filter(event == "lobby_left"), "reason"),
        "deleted": _counts_by(lob.filter(event == "lobby_deleted"), "reason"),
        "sizes": sizes,
        "time_to_fill_s": fill,
        "time_to_start_s": start,
        "chat": {
            "lines": lines,
            "bytes": chat_bytes,
            "lobbies_with_chat": int(chat["lobbies"]),
            "bytes_per_line": chat_bytes / lines if lines else None,
        },
        "refusals": {
            "total": sum(by_code.values()),
            "by_code": by_code,
            "by_request": _counts_by(refused, "request"),
        },
    }
