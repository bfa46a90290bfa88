"""The Spark job on a log written by a real echo-server run with real clients (some rejected)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from echo.telemetry.pipeline import run_analysis
from tests.ports import free_base
from tests.test_cli import ports, server_process

pytestmark = pytest.mark.spark

_HOLDER_ECHOES = 150


def _wait_for_events(
    path: Path, event: str, count: int, processes: list[subprocess.Popen[str]]
) -> None:
    """Wait (bounded) until the server's events file holds `count` events named `event`."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        complete = text[: text.rfind("\n") + 1].splitlines()  # the writer may be mid-line
        if sum(json.loads(line).get("event") == event for line in complete) >= count:
            return
        assert all(p.poll() is None for p in processes), "a holder exited before joining"
        time.sleep(0.05)  # the polling interval of a bounded wait: a file has no change event
    raise AssertionError(f"fewer than {count} {event} events within 60 s")


def test_report_of_a_real_server_run_has_exact_counts(spark: Any, tmp_path: Path) -> None:
    base = free_base(12)
    events = tmp_path / "events.jsonl"
    with server_process(
        *ports(base),
        "--clients-base-port",
        str(base + 2),
        "--max-per-ip",
        "2",
        "--events",
        str(events),
    ) as server:
        # Two clients hold the two slots of 127.0.0.1 ...
        holders = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "echo.client.cli",
                    *ports(base),
                    "--interval",
                    "0.1",
                    "--count",
                    str(_HOLDER_ECHOES),
                    "--json",
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        # ... while three more are refused. The holders must have joined first (their
        # duologue_connected events), and must outlive the refusals: on a loaded machine each
        # refused client takes over a second to start, so the holders echo for ~15 s.
        _wait_for_events(events, "duologue_connected", 2, holders)
        for _ in range(3):
            refused = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "echo.client.cli",
                    *ports(base),
                    "--count",
                    "1",
                    "--timeout",
                    "20",
                ],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert refused.returncode == 5  # rejected by the server
        for holder in holders:
            out, _ = holder.communicate(timeout=60)
            assert holder.returncode == 0 and json.loads(out)["received"] == _HOLDER_ECHOES
        # One more, with the slots free again, that echoes five times.
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "echo.client.cli",
                *ports(base),
                "--count",
                "5",
                "--interval",
                "0",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0

    summary = run_analysis([str(events)], str(tmp_path / "out"), spark=spark).data
    assert summary["bad_lines"] == 0
    assert summary["duologues_created"] == 3
    assert summary["duologues_connected"] == 3
    assert summary["duologues_expired"] == 0
    assert summary["hello_received"] == 6
    assert summary["hello_rejected"] == {"too many connections for IP address": 3}
    lines = events.read_text().splitlines()
    assert summary["events_total"] == len(lines)
    by_type = summary["events_by_type"]
    assert by_type["duologue_closed"] == 3 and by_type["server_started"] == 1
    top = summary["top_sources"]
    assert json.dumps(top).count("127.0.0.1") >= 1
    assert (tmp_path / "out" / "report.html").stat().st_size > 1000
