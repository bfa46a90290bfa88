"""The topics benchmark runs end to end in a short form and its figures hang together."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_topics_bench_short_run(tmp_path: Path) -> None:
    out = tmp_path / "runs.json"
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.topics_bench",
            "--duration",
            "1",
            "--repeat",
            "1",
            "--subscribers",
            "50",
            "--json",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    (run,) = json.loads(out.read_text())["runs"]
    assert run["raw_rate"] > 0 and run["t1_rate"] > 0
    assert run["ratio"] == run["t1_rate"] / run["raw_rate"]
    assert run["raw"]["per_cpu"] > 0 and run["t1"]["per_cpu"] > 0
    assert run["ratio_per_cpu"] == run["t1"]["per_cpu"] / run["raw"]["per_cpu"]
    # Every datagram the server forwarded carried one message of the raw baseline's size.
    assert run["t1"]["size"] == run["raw"]["size"]
    assert run["t1"]["server_sent"] >= run["t1"]["publishes_handled"] * 50
    # Packed, the same server moves more messages than datagrams.
    assert run["packed"]["messages_rate"] > run["packed"]["received_rate"]
    assert 0 < run["t2_p50_ms"] <= run["t2_p99_ms"]
    assert run["t2"]["samples"] > 0
    assert "median" in completed.stdout
