"""Smoke test of the idle benchmark (bench/idle.py): a few sessions, two short windows, as a
user runs it; every session stays open and both sides count their idle datagrams."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_idle_smoke_measures_both_sides(tmp_path: Path) -> None:
    out = tmp_path / "idle.json"
    completed = subprocess.run(
        [sys.executable, "-m", "bench.idle", "--smoke", "--quiet", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "us/session-s" in completed.stdout
    result = json.loads(out.read_text())
    assert result["sessions_open_at_end"] == {"server": 20, "clients": 20}
    assert len(result["windows"]) == 2
    for side in ("server", "clients"):
        figures = result[side]
        # Lobby timers: the server heartbeats every 0.8 s, the members every 2 s, and both
        # send a status message every 1.5 s: every side sends and receives something idle.
        assert figures["sent_per_session_second"]["median"] > 0.3
        assert figures["received_per_session_second"]["median"] > 0.3
        assert figures["cpu_percent"]["min"] >= 0


def _window(server_us: float, dropped: int) -> dict[str, object]:
    side = {
        "cpu_percent": server_us / 10,
        "us_per_session_second": server_us,
        "us_per_datagram": server_us / 3.8,
        "sent_per_session_second": 1.9,
        "received_per_session_second": 1.9,
    }
    return {
        "seconds": 10.0,
        "server": side,
        "clients": {**side, "us_per_session_second": server_us + 1},
        "server_sessions": 1000 - dropped,
        "client_sessions": 1000 - dropped,
        "client_ends": {},
    }


def test_the_result_file_holds_each_window_as_a_repeat_with_the_targets(tmp_path: Path) -> None:
    from bench import results
    from bench.idle import TARGET_US_PER_SESSION_SECOND, result_record

    run = {
        "sessions": 1000,
        "timers": "lobby",
        "ports": "per-client",
        "client_procs": 1,
        "interpreted": True,
        "seconds": 10.0,
        "load_before": [1.0, 2.0, 3.0],
        "load_after": [1.5, 2.0, 3.0],
        "windows": [_window(60.0, 0), _window(40.0, 0), _window(50.0, 2)],
    }
    record = result_record(run, ["--repeat", "3", "--write"])
    assert record.id == "idle" and record.repeats == 3
    figures = {(m.subject, m.name): m for m in record.metrics}
    cpu = figures["idle_server", "CPU per session-second"]
    assert cpu.values == (60.0, 40.0, 50.0) and cpu.median == 50.0
    assert cpu.target is not None and cpu.target["threshold"] == TARGET_US_PER_SESSION_SECOND
    assert cpu.target_met() is False
    assert figures["idle_clients", "CPU per session-second"].median == 51.0
    dropped = figures["idle_sessions", "dropped"]
    assert dropped.values == (0.0, 0.0, 2.0) and dropped.target_met() is True  # median 0
    assert record.machine["load_before"]["loadavg_1m"] == 1.0
    assert record.machine["echo_build"] == "interpreted"
    # what the report reads back is what was written
    assert results.load(record.write(tmp_path)) == record
