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

import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import attrs

from echo.telemetry.aggregate import aggregate
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
    """Parse `value` lines; adds `j` (struct), `ts_parsed`, `valid`, `known` columns.

    The per-event rules are looked up, not spelled out once per event: the generated code of
    a 23-branch CASE over the events grew past the JVM's 8,000-byte limit for compiling a
    method, so the job's hottest loop ran in the bytecode interpreter. Here each line costs
    one regex over the union of the string fields (which finds nothing on a well-formed line),
    a bit mask of the fields present, and two lookups by event name in literal maps.
    """
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
    event = j["event"]
    common_ok = (
        j.isNotNull()
        & j[CORRUPT].isNull()
        & j["server_id"].isNotNull()
        & event.isNotNull()
        & (F.coalesce(j["schema_version"], F.lit(-1)) == SCHEMA_VERSION)
        & F.coalesce(j["ts"].rlike(f"^{TS_RE.pattern}$"), F.lit(False))
        & F.col("ts_parsed").isNotNull()
    )
    # Bit i of `present` is set when field i of the read schema is not null.
    names = list(all_fields())
    present: Column = F.lit(0).cast("long")
    for i, name in enumerate(names):
        present = present + F.when(j[name].isNotNull(), F.lit(1 << i)).otherwise(F.lit(0))
    masks, patterns = _event_rules(names)
    required = F.coalesce(F.create_map(*_literals(masks))[event], F.lit(0).cast("long"))
    # A line whose string fields are all strings passes the union pattern, so the event's own
    # pattern (a subset of the union's keys, compiled anew only when it changes from one
    # suspect line to the next) runs only on the rare line the union flags.
    own_pattern = F.coalesce(
        F.create_map(*_literals(patterns))[event], F.lit(_string_type_regex({}))
    )
    strings_ok = ~F.col("value").rlike(_string_type_regex(all_fields())) | ~F.regexp(
        F.col("value"), own_pattern
    )
    fields_ok = strings_ok & ((present.bitwiseAND(required)) == required)
    known = event.isin(list(EVENT_FIELDS))
    return parsed.withColumn("valid", F.coalesce(common_ok & fields_ok, F.lit(False))).withColumn(
        "known", F.coalesce(known, F.lit(False))
    )


def _event_rules(names: Sequence[str]) -> tuple[dict[str, int], dict[str, str]]:
    """Per event: the bit mask of its required (non-nullable) fields in `names`' order, and
    the pattern that finds one of its string fields (or a common one) holding a non-string."""
    if len(names) > 63:
        raise ValueError(f"{len(names)} fields do not fit the 63 bits of a present-field mask")
    masks = {
        event: sum(1 << names.index(n) for n, t in fields.items() if not t.nullable)
        for event, fields in EVENT_FIELDS.items()
    }
    patterns = {event: _string_type_regex(fields) for event, fields in EVENT_FIELDS.items()}
    return masks, patterns


def _literals(mapping: Mapping[str, Any]) -> list[Column]:
    """create_map's arguments: key, value, key, value, ... as literals."""
    from pyspark.sql import functions as F

    out: list[Column] = []
    for key, value in mapping.items():
        out += [F.lit(key), F.lit(value).cast("long") if isinstance(value, int) else F.lit(value)]
    return out


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
    data = aggregate(ev, top_n)
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
