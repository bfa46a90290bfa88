"""`echo-analyze`: turn echo-server event logs into Parquet, summary.json and report.html.

Also `echo-analyze --generate PATH --events N --seed S`, which writes a synthetic log instead.
Runnable as `python -m echo.telemetry.cli` and as a spark-submit application file.
"""

from __future__ import annotations

import datetime
import glob
import importlib.util
import os
import sys
import time
from typing import Any

import click
import structlog

from echo._cli import fail, log_options
from echo.log import configure_logging

log = structlog.get_logger("echo.analyze")


def _has_scheme(path: str) -> bool:
    from echo.telemetry.pipeline import _has_scheme as has_scheme

    return has_scheme(path) or path.startswith("file:")


def _expand(inputs: tuple[str, ...]) -> list[str]:
    """Local globs expanded here (clear errors); URIs are left to Hadoop."""
    out: list[str] = []
    for pattern in inputs:
        if _has_scheme(pattern):
            out.append(pattern)
            continue
        matches = sorted(glob.glob(os.path.expanduser(pattern)))
        if not matches:
            raise click.UsageError(f"no input files matched: {pattern}")
        for path in matches:
            if not os.access(path, os.R_OK):
                raise click.UsageError(f"cannot read input: {path}")
        out.extend(matches)
    return out


def _check_out_dir(out: str) -> None:
    if _has_scheme(out):
        return
    if os.path.exists(out) and not os.path.isdir(out):
        raise click.UsageError(f"--out {out} exists and is not a directory")
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as error:
        raise click.UsageError(f"cannot create --out {out}: {error.strerror}") from None
    if not os.path.isdir(out) or not os.access(out, os.W_OK | os.X_OK):
        raise click.UsageError(f"--out {out} is not a writable directory")


def print_table(data: dict[str, Any], top: int = 5) -> None:
    """The short console table: the headline numbers and the worst sources."""
    rows = [
        ("lines read", data["lines_total"]),
        ("bad lines", data["bad_lines"]),
        ("events", data["events_total"]),
        ("HELLOs", data["hello_received"]),
        ("duologues created", data["duologues_created"]),
        ("duologues joined", data["duologues_connected"]),
        ("duologues never joined", data["duologues_expired"]),
        *((f"rejected: {k}", v) for k, v in data["hello_rejected"].items()),
        ("client summaries", data["client_summaries"]),
    ]
    width = max(len(k) for k, _ in rows)
    click.echo(f"{'':-<{width + 14}}")
    for key, value in rows:
        click.echo(f"{key:<{width}}  {value:>12,}")
    life = data["lifetime_s"]
    if life["p50"] is not None:
        click.echo(
            f"{'lifetime p50/p90/p99 s':<{width}}  "
            f"{life['p50']:.1f}/{life['p90']:.1f}/{life['p99']:.1f}"
        )
    lob = data.get("lobbies")
    if lob and lob["created"] + lob["joins"] + lob["refusals"]["total"]:
        _print_lobbies(lob, width)
    worst = data["top_sources"]["by_rejections"][:top]
    if worst:
        click.echo(f"{'':-<{width + 14}}")
        click.echo(f"{'top sources by rejections':<{width}}  {'rejected':>12}  {'duologues':>9}")
        for row in worst:
            click.echo(
                f"{row['source'][:width]:<{width}}  "
                f"{row['rejections']:>12,}  {row['duologues']:>9,}"
            )
    click.echo(f"{'':-<{width + 14}}")


def _print_lobbies(lob: dict[str, Any], width: int) -> None:
    """The lobby lines of the console table (only for logs with lobby events)."""
    chat = lob["chat"]
    rows = [
        ("lobbies created", lob["created"]),
        ("lobbies re-homed", lob["rehomed"]),
        ("lobby joins", lob["joins"]),
        ("lobbies started", lob["started"]),
        ("lobbies never filled", lob["time_to_fill_s"]["never"]),
        ("lobby chat lines", chat["lines"]),
        ("lobby chat bytes", chat["bytes"]),
        ("lobby refusals", lob["refusals"]["total"]),
        ("lobby seats resumed", lob.get("resumed", 0)),
        ("matchmaker matches", lob.get("matched", {}).get("matches", 0)),
        *((f"refused: {k}", v) for k, v in lob["refusals"]["by_code"].items()),
    ]
    click.echo(f"{'':-<{width + 14}}")
    for key, value in rows:
        click.echo(f"{key:<{width}}  {value:>12,}")
    for name, label in (("time_to_fill_s", "time to fill"), ("time_to_start_s", "time to start")):
        w = lob[name]
        if w["p50"] is not None:
            click.echo(
                f"{label + ' p50/p90/p99 s':<{width}}  {w['p50']:.1f}/{w['p90']:.1f}/{w['p99']:.1f}"
            )
    for name, label in (("at_start", "members at start"), ("peak", "most members")):
        sizes = lob["sizes"][name]
        if sizes:
            click.echo(f"{label:<{width}}  " + " ".join(f"{k}:{v}" for k, v in sizes.items()))


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("inputs", metavar="EVENTS...", nargs=-1)
@click.option(
    "--out",
    "-o",
    "out",
    metavar="DIR",
    help="Output directory (local or a Hadoop URI): events/ (Parquet by day), summary.json, "
    "report.html.",
)
@click.option(
    "--master",
    default=None,
    metavar="URL",
    help="Spark master, e.g. spark://host:7077. Default: local[*], or whatever spark-submit set.",
)
@click.option(
    "--top",
    "top_n",
    default=20,
    show_default=True,
    type=click.IntRange(1, 10000),
    help="Rows in the top-sources tables.",
)
@click.option(
    "--driver-memory",
    default="2g",
    show_default=True,
    help="Driver JVM heap in local mode (the driver is the whole cluster there).",
)
@log_options(default_level="info")
@click.option(
    "--generate",
    "generate_path",
    metavar="PATH",
    default=None,
    help="Instead of analysing, write a synthetic event log to PATH "
    "(see --events, --seed, --servers, --days, --start).",
)
@click.option(
    "--events",
    "n_events",
    default=100_000,
    show_default=True,
    type=click.IntRange(1),
    help="With --generate: about this many echo-server lines (--lobbies adds its own).",
)
@click.option(
    "--seed",
    default=1,
    show_default=True,
    help="With --generate: random seed; same seed, same file.",
)
@click.option(
    "--servers",
    default=1,
    show_default=True,
    type=click.IntRange(1),
    help="With --generate: number of servers in the log.",
)
@click.option(
    "--days",
    default=2,
    show_default=True,
    type=click.IntRange(1),
    help="With --generate: days the log spans.",
)
@click.option(
    "--start",
    default="2026-11-20",
    show_default=True,
    help="With --generate: first day (UTC, YYYY-MM-DD).",
)
@click.option(
    "--ip-salt",
    default=None,
    help="With --generate: pseudonymise addresses with this salt, as echo-server --ip-salt does.",
)
@click.option(
    "--lobbies",
    default=0,
    show_default=True,
    type=click.IntRange(0),
    help="With --generate: also simulate this many lobbies (echo-lobby --events lines).",
)
@click.option(
    "--lobby-servers",
    default=1,
    show_default=True,
    type=click.IntRange(1),
    help="With --generate: lobby servers the lobbies live on (more than one: some fail over).",
)
def main(
    inputs: tuple[str, ...],
    out: str | None,
    master: str | None,
    top_n: int,
    driver_memory: str,
    log_format: str,
    log_level: str,
    generate_path: str | None,
    n_events: int,
    seed: int,
    servers: int,
    days: int,
    start: str,
    ip_salt: str | None,
    lobbies: int,
    lobby_servers: int,
) -> None:
    """Analyse echo-server and echo-lobby event logs (EVENTS: files, directories or globs,
    local or any Hadoop-compatible URI such as hdfs:// or s3a://) with PySpark.

    Bad lines are counted and sampled in the report, never fatal.

    \b
    Exit status:
      0  the report was written (any valid event read), or --generate wrote its log
      1  no valid event in the input, PySpark not installed (pip install 'echo[spark]'),
         or --generate could not write its file
      2  a bad command line: no EVENTS matched a pattern, an input not readable, --out not
         a writable directory, --generate with EVENTS or --out, a bad --start

    \b
    Examples:
      echo-analyze /var/log/echo/events-*.jsonl --out report/
      echo-analyze 'hdfs:///echo/2026-11-*/*.jsonl' --out hdfs:///echo/report --master spark://head:7077
      echo-analyze --generate /tmp/events.jsonl --events 1000000 --seed 7
      echo-analyze --generate /tmp/lobby.jsonl --events 1000 --lobbies 5000 --lobby-servers 3
    """
    configure_logging(log_format, log_level)  # type: ignore[arg-type]
    if generate_path is not None:
        if inputs or out:
            raise click.UsageError("--generate writes a log; it takes no EVENTS or --out")
        _generate(
            generate_path, n_events, seed, servers, days, start, ip_salt, lobbies, lobby_servers
        )
        return
    _analyse(inputs, out, master, top_n, driver_memory)


def _generate(
    generate_path: str,
    n_events: int,
    seed: int,
    servers: int,
    days: int,
    start: str,
    ip_salt: str | None,
    lobbies: int,
    lobby_servers: int,
) -> None:
    """--generate: write a synthetic log (echo.telemetry.generate)."""
    from echo.telemetry.generate import generate

    try:
        first_day = datetime.datetime.strptime(start, "%Y-%m-%d").replace(tzinfo=datetime.UTC)
    except ValueError:
        raise click.UsageError(f"--start must be YYYY-MM-DD, got {start!r}") from None
    began = time.monotonic()
    try:
        truth = generate(
            generate_path,
            events=n_events,
            seed=seed,
            servers=servers,
            start=first_day,
            days=days,
            ip_salt=ip_salt.encode() if ip_salt else None,
            lobbies=lobbies,
            lobby_servers=lobby_servers,
        )
    except OSError as error:
        raise click.ClickException(f"cannot write {generate_path}: {error.strerror}") from None
    log.info(
        "log_generated",
        path=generate_path,
        lines=truth.lines_total,
        bad_lines=truth.bad_lines,
        seconds=round(time.monotonic() - began, 2),
    )
    click.echo(
        f"wrote {truth.lines_total:,} lines ({truth.bad_lines:,} bad) to {generate_path}"
    )


def _analyse(
    inputs: tuple[str, ...], out: str | None, master: str | None, top_n: int, driver_memory: str
) -> None:
    """Run the PySpark job on EVENTS into --out; print the summary table."""
    if not inputs:
        raise click.UsageError("give at least one EVENTS file, directory or glob")
    if not out:
        raise click.UsageError("--out DIR is required")
    paths = _expand(inputs)
    _check_out_dir(out)
    if importlib.util.find_spec("pyspark") is None:
        fail("echo-analyze", "PySpark is not installed: pip install 'echo[spark]'")

    from echo.telemetry.pipeline import NoInputError, run_analysis

    began = time.monotonic()
    log.info("analysis_started", inputs=len(paths), out=out, master=master or "default")
    try:
        summary = run_analysis(
            paths, out, master=master, top_n=top_n, progress=True, driver_memory=driver_memory
        )
    except NoInputError as error:
        raise click.ClickException(str(error)) from None
    data = summary.data
    log.info(
        "analysis_finished",
        events=data["events_total"],
        bad_lines=data["bad_lines"],
        seconds=round(time.monotonic() - began, 1),
    )
    print_table(data)
    click.echo(f"parquet: {summary.parquet_path}")
    click.echo(f"summary: {summary.summary_path}")
    click.echo(f"report:  {summary.report_path}")
    if data["events_total"] == 0:
        click.echo(f"echo-analyze: no valid events in {data['lines_total']:,} lines read", err=True)
        sys.exit(1)


if __name__ == "__main__":  # spark-submit echo/telemetry/cli.py ... runs the same command
    main()
