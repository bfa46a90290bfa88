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
