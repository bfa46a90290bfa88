from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import Any

import pytest

from echo.telemetry.generate import GroundTruth, generate
from echo.telemetry.schema import validate_event

pytestmark = pytest.mark.spark
START = datetime.datetime(2026, 11, 20, tzinfo=datetime.UTC)


@pytest.fixture(scope="module")
def analysed(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[GroundTruth, Any]:
    from echo.telemetry.pipeline import run_analysis

    work = tmp_path_factory.mktemp("job")
    # Two files (two servers' logs as an operator would collect them), read through a glob.
    truth = generate(
        work / "events-a.jsonl", events=20_000, seed=42, servers=2, start=START, days=3
    )
    summary = run_analysis([str(work / "events-*.jsonl")], str(work / "out"), spark=spark, top_n=10)
    return truth, summary


def test_summary_equals_ground_truth(analysed: tuple[GroundTruth, Any]) -> None:
    truth, summary = analysed
    expected = truth.expected_summary(top_n=10)
    assert {k: summary[k] for k in expected} == expected
    # the headline numbers of the report, spelled out
    assert summary["events_total"] == truth.events_total > 19_000
    assert summary["bad_lines"] == truth.bad_lines > 0
    assert summary["duologues_created"] == truth.duologues_created
    assert summary["duologues_expired"] == truth.duologues_expired > 0
    assert summary["duologue_expired_events"] == truth.duologues_expired
    assert len(summary["top_sources"]["by_rejections"]) == 10


def test_distributions_equal_ground_truth(analysed: tuple[GroundTruth, Any]) -> None:
    truth, summary = analysed
    life = summary["lifetime_s"]
    assert life["histogram"] == truth.lifetime_histogram
    assert life["count"] == sum(truth.lifetime_histogram) == truth.duologues_connected
    assert life["p50"] < life["p90"] < life["p99"]
    assert summary["messages"]["histogram"] == truth.message_histogram
    assert summary["messages"]["total"] == truth.messages_total
    cot = summary["connections_over_time"]
    assert cot["bucket_s"] == 900  # three days of data in under 400 buckets
    assert cot["series"] == truth.connections_over_time(900)
    rtt = summary["client_rtt"]
    assert rtt["clients"] == truth.client_summaries
    assert sum(rtt["p50_histogram"]) == rtt["clients_with_rtt"] > 0
    assert 5 < rtt["rtt_ms_p50"]["median"] < rtt["rtt_ms_p99"]["median"]


def test_outputs_written(analysed: tuple[GroundTruth, Any], spark: Any) -> None:
    truth, summary = analysed
    on_disk = json.loads(Path(summary.summary_path).read_text())
    assert on_disk == summary.data
    days = sorted(p.name for p in Path(summary.parquet_path).iterdir() if p.name.startswith("day="))
    assert days == [f"day={d}" for d in truth.events_by_day]
    assert spark.read.parquet(summary.parquet_path).count() == truth.events_total
    html = Path(summary.report_path).read_text()
    assert html.count("<svg") == 8
    assert "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "<script" not in html
    assert summary["top_sources"]["by_rejections"][0]["source"] in html


def test_python_and_spark_agree_on_every_line(spark: Any) -> None:
    """validate_event and the Spark classifier are two spellings of one schema."""
    from echo.telemetry.pipeline import classify

    good = (
        '{"ts":"2026-11-22T19:56:29.123456Z","server_id":"s","event":"hello_received",'
        '"schema_version":1,"client_session":-3,"source_ip":"192.0.2.1","source_prefix":"192.0.2.1"}'
    )
    obj = json.loads(good)

    def variant(**changes: Any) -> str:
        o = {**obj, **changes}
        return json.dumps({k: v for k, v in o.items() if v is not ...})

    lines = [
        good,
        variant(extra={"source_ip": "nested is fine"}, more=[1]),
        variant(client_session="5"),
        variant(client_session=5.0),
        variant(client_session=True),
        variant(client_session=2**63),
        variant(client_session=None),
        variant(source_ip=12345),
        variant(source_ip=None),
        variant(source_prefix=...),
        variant(server_id=7),
        variant(server_id=...),
        variant(event=5),
        variant(event="future_event"),
        variant(schema_version=2),
        variant(schema_version="1"),
        variant(ts="2026-11-22 19:56:29.123456Z"),
        variant(ts="2026-02-30T19:56:29.123456Z"),
        variant(ts="2026-11-22T19:56:29Z"),
        json.dumps(obj, separators=(", ", ": ")),  # another writer's spacing
        good[:-1],
        "[1,2]",
        "7",
        '"text"',
        "null",
        "GET / HTTP/1.1",
        json.dumps(
            {
                **obj,
                "event": "duologue_closed",
                "duologue_id": 1,
                "reason": "expired",
                "lifetime_s": 10,
                "messages": 0,
            }
        ),
        json.dumps(
            {
                **obj,
                "event": "client_summary",
                "server": "x",
                "sent": 1,
                "received": 1,
                "state": "closed",
            }
        ),
        json.dumps(
            {
                **obj,
                "event": "client_summary",
                "server": "x",
                "sent": 1,
                "received": 1,
                "state": "closed",
                "error": 5,
            }
        ),
        json.dumps(
            {
                **obj,
                "event": "client_summary",
                "server": "x",
                "sent": 1,
                "received": 1,
                "state": "closed",
                "rtt_ms_p50": "1.5",
            }
        ),
    ]
    df = spark.createDataFrame([(line,) for line in lines], "value string")
    got = [
        (r["valid"], r["valid"] and r["known"])
        for r in classify(df).select("valid", "known").collect()
    ]

    def python(line: str) -> tuple[bool, bool]:
        try:
            error = validate_event(json.loads(line))
        except ValueError:
            return (False, False)
        if error is None:
            return (True, True)
        return (True, False) if error.startswith("unknown event") else (False, False)

    assert got == [python(line) for line in lines]
    assert sum(valid for valid, _ in got) == 6


def _write(path: Path, events: list[dict[str, Any]]) -> None:
    with path.open("w") as f:
        for e in events:
            f.write(json.dumps({"server_id": "s", "schema_version": 1, **e}) + "\n")


@pytest.mark.parametrize("lookup_max_starts", [64, 0], ids=["starts-looked-up", "window"])
def test_restarts_subsets_and_extra_fields(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lookup_max_starts: int
) -> None:
    """A real log: one server restarted (duologue ids start again), few event types. The
    never-joined count finds each duologue's run both ways: from the collected starts, and
    (for a log with more starts than that lookup takes) by a window."""
    from echo.telemetry import aggregate
    from echo.telemetry.pipeline import run_analysis

    monkeypatch.setattr(aggregate, "RUN_LOOKUP_MAX_STARTS", lookup_max_starts)

    def ts(s: int) -> str:
        return f"2026-11-22T10:00:{s:02d}.000000Z"

    started = {
        "event": "server_started",
        "address": "::",
        "port": 1,
        "control_port": 2,
        "clients_base_port": 3,
        "max_clients": 4,
        "max_per_ip": 5,
    }
    created = {
        "event": "duologue_created",
        "client_session": 1,
        "source_ip": "2001:db8::1",
        "source_prefix": "2001:db8::/64",
        "data_port": 9,
        "control_port": 10,
    }
    _write(
        tmp_path / "real.jsonl",
        [
            {**started, "ts": ts(1), "build": "abc"},
            {**created, "ts": ts(2), "duologue_id": 1},
            {
                "event": "duologue_connected",
                "ts": ts(3),
                "duologue_id": 1,
                "source_ip": "2001:db8::1",
                "source_port": 5,
                "nat": {"type": "full cone"},
            },
            {**started, "ts": ts(10)},
            {**created, "ts": ts(11), "duologue_id": 1, "source_ip": "2001:db8::2"},
        ],
    )
    (tmp_path / "real.jsonl").open("a").write("\n   \n")  # blank lines are not events
    s = run_analysis([str(tmp_path / "real.jsonl")], str(tmp_path / "out"), spark=spark)
    assert s["lines_total"] == 5 and s["bad_lines"] == 0 and s["events_total"] == 5
    assert s["duologues_created"] == 2 and s["duologues_connected"] == 1
    # Keyed by id alone, the restart's duologue 1 would look joined.
    assert s["duologues_expired"] == 1
    assert s["top_sources"]["prefixes_by_duologues"] == [
        {"source": "2001:db8::/64", "rejections": 0, "duologues": 2, "expiries": 0}
    ]
    assert s["top_sources"]["by_rejections"] == []
    assert s["lifetime_s"]["count"] == 0 and s["lifetime_s"]["p50"] is None
    assert s["connections_over_time"]["bucket_s"] == 60


def test_all_bad_input_still_reports(spark: Any, tmp_path: Path) -> None:
    from echo.telemetry.pipeline import run_analysis

    (tmp_path / "bad.jsonl").write_text("nope\n{\n[]\n")
    s = run_analysis([str(tmp_path / "bad.jsonl")], str(tmp_path / "out"), spark=spark)
    assert (s["lines_total"], s["bad_lines"], s["events_total"]) == (3, 3, 0)
    assert s["bad_line_samples"] == ["nope", "{", "[]"] or sorted(s["bad_line_samples"]) == [
        "[]",
        "nope",
        "{",
    ]
    assert os.path.exists(s.report_path)


def test_missing_input_is_a_clear_error(spark: Any, tmp_path: Path) -> None:
    from echo.telemetry.pipeline import NoInputError, run_analysis

    with pytest.raises(NoInputError, match="cannot read"):
        run_analysis([str(tmp_path / "nothing-*.jsonl")], str(tmp_path / "out"), spark=spark)
