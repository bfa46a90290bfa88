from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from echo.telemetry.cli import main
from echo.telemetry.generate import generate
from tests.telemetry.conftest import SPARK_TEST_JAVA_OPTIONS

START = datetime.datetime(2026, 11, 20, tzinfo=datetime.UTC)


def test_help_documents_both_modes() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    for word in ("EVENTS...", "--out", "--master", "--top", "--generate", "--seed", "--log-format"):
        assert word in result.output


def test_generate_mode_matches_library(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main,
        [
            "--generate",
            str(tmp_path / "g.jsonl"),
            "--events",
            "2000",
            "--seed",
            "9",
            "--start",
            "2026-11-20",
            "--days",
            "2",
        ],
    )
    assert result.exit_code == 0, result.output
    truth = generate(tmp_path / "lib.jsonl", events=2000, seed=9, start=START, days=2)
    assert (tmp_path / "g.jsonl").read_bytes() == (tmp_path / "lib.jsonl").read_bytes()
    assert f"wrote {truth.lines_total:,} lines" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give at least one EVENTS"),
        (["x.jsonl"], "--out DIR is required"),
        (["{tmp}/none-*.jsonl", "--out", "{tmp}/o"], "no input files matched"),
        (["{tmp}/in.jsonl", "--out", "{tmp}/in.jsonl"], "exists and is not a directory"),
        (["{tmp}/in.jsonl", "--out", "/proc/echo-analyze/o"], "cannot create --out"),
        (["--generate", "{tmp}/g", "{tmp}/in.jsonl"], "takes no EVENTS"),
        (["--generate", "{tmp}/g", "--start", "tomorrow"], "--start must be YYYY-MM-DD"),
    ],
)
def test_usage_errors(tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "in.jsonl").write_text("{}\n")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert message in result.output


def test_no_match_as_a_process(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "echo.telemetry.cli",
            str(tmp_path / "nope*.jsonl"),
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "no input files matched" in proc.stderr


@pytest.mark.spark
def test_cli_in_process_prints_table(spark: Any, tmp_path: Path) -> None:
    truth = generate(tmp_path / "e.jsonl", events=3000, seed=4, start=START, days=1)
    result = CliRunner().invoke(
        main, [str(tmp_path / "e.jsonl"), "--out", str(tmp_path / "o"), "--top", "3"]
    )
    assert result.exit_code == 0, result.output
    assert re.search(rf"duologues never joined +{truth.duologues_expired:,}\n", result.output)
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["events_total"] == truth.events_total
    assert len(summary["top_sources"]["by_duologues"]) == 3
    for line in ("report:", "summary:", "parquet:", "top sources by rejections"):
        assert line in result.output


@pytest.mark.spark
def test_cli_all_bad_exits_1(spark: Any, tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").write_text("garbage\n")
    result = CliRunner().invoke(main, [str(tmp_path / "bad.jsonl"), "--out", str(tmp_path / "o")])
    assert result.exit_code == 1
    assert "no valid events in 1 lines read" in result.output


@pytest.mark.spark
def test_cli_as_a_process(tmp_path: Path) -> None:
    """The real entry point in its own JVM, as an operator runs it."""
    truth = generate(tmp_path / "e.jsonl", events=2000, seed=8, start=START, days=1)
    # The JIT tier of the test JVMs (conftest.py): spark-submit's own option, as an operator
    # would give it; what the job computes does not depend on it.
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "PYSPARK_SUBMIT_ARGS": f"--driver-java-options {SPARK_TEST_JAVA_OPTIONS} pyspark-shell",
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "echo.telemetry.cli",
            str(tmp_path / "e.jsonl"),
            "--out",
            str(tmp_path / "o"),
            "--master",
            "local[1]",
            "--driver-memory",
            "1g",
            "--log-format",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    expected = truth.expected_summary()
    assert {k: summary[k] for k in expected} == expected
    assert f"report:  {tmp_path / 'o' / 'report.html'}" in proc.stdout
    finished = [json.loads(x) for x in proc.stderr.splitlines() if '"analysis_finished"' in x]
    assert finished and finished[0]["events"] == truth.events_total
