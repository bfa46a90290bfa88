"""Smoke test of the benchmark harness: a quick run of the raw baselines, end to end.

Runs `python -m bench.run` as users do (a subprocess; the benchmarks spawn their own children),
into a temporary results directory so the repository's bench/results is left alone.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quick_raw_baselines_produce_positive_figures(tmp_path: Path) -> None:
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.run",
            "--quick",
            "--only",
            "raw_echo,raw_oneway",
            "--results-dir",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr

    (json_path,) = tmp_path.glob("*.json")
    document = json.loads(json_path.read_text())
    assert not document["failed"]
    figures = {(r["name"], r["metric"]): r["value"] for r in document["results"]}
    expected = {("raw_echo_64", m) for m in ("round trips/s", "p50", "p99", "p99.9")}
    for size in (64, 1408, 8192):
        expected |= {(f"raw_oneway_{size}", "datagrams/s"), (f"raw_oneway_{size}", "MB/s")}
    assert expected <= figures.keys()
    assert all(value > 0 for value in figures.values()), figures
    # Latency percentiles are ordered, and each one-way MB/s agrees with its datagram rate.
    assert figures["raw_echo_64", "p50"] <= figures["raw_echo_64", "p99"]
    assert figures["raw_echo_64", "p99"] <= figures["raw_echo_64", "p99.9"]
    for size in (64, 1408, 8192):
        rate = figures[f"raw_oneway_{size}", "datagrams/s"]
        assert abs(figures[f"raw_oneway_{size}", "MB/s"] - rate * size / 1e6) < 1e-6 * rate * size
    assert document["machine"]["cores"] >= 1

    table = (tmp_path / "latest.md").read_text()
    assert "| raw_echo_64 | round trips/s |" in table
    assert "baseline" in table
