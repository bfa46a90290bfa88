"""B4 on a small scale: a handful of clients against a real echo-server, a few seconds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import results, scale
from bench.run import pin_cpus

CLIENTS = 8
SECONDS = 2.0


@pytest.mark.parametrize("ports", scale.MODES)
def test_a_few_clients_storm_in_then_echo_once_a_second(ports: str) -> None:
    row = scale.run(
        CLIENTS,
        SECONDS,
        processes=2,
        cpus=pin_cpus(None),
        after_storm=2.0,
        ramp=1.0,
        duologue_ports=ports,
    )
    assert row["duologue_ports"] == ports
    # The storm: all of them at once.
    assert row["all_settled"] and row["failures"] == 0, row["failure_examples"]
    assert row["connected"] == CLIENTS
    # The clients start within one second, so they cannot all be in faster than that.
    assert 0 < row["handshakes_per_s"] <= CLIENTS / 0.5
    phases = row["handshake_phases_ms"]
    for phase in ("all_clients_channel", "connect_reply", "duologue_first_echo", "total"):
        assert 0 < phases[phase]["p50"] <= phases[phase]["max"], phases
    assert phases["total"]["max"] <= 1000 * row["handshake_s"]
    assert 0 < row["echo_after_storm_p50_ms"] <= row["echo_after_storm_p99_ms"]
    # The steady state: a second population, started over the ramp once the server had
    # closed the storm's duologues, echoing once a second.
    assert row["storm_duologues_closed_before_steady"] >= CLIENTS
    assert row["steady_all_settled"] and row["steady_failures"] == 0
    assert row["steady_connected"] == CLIENTS
    assert 0.4 * CLIENTS <= row["echoes_per_s"] <= 1.6 * CLIENTS
    assert 0 < row["echo_p50_ms"] <= row["echo_p99_ms"] <= row["echo_max_ms"]
    assert 0 <= row["server_cpu_percent"] < 100
    assert 0 < row["server_rss_mib"] <= row["server_peak_rss_mib"]
    # Each client process froze its clients out of its collector once they were in.
    assert row["clients_gc"]["max_ms"] >= 0 and row["clients_gc"]["frozen"] > 0
    # The server logged its counters when it stopped: it exchanged datagrams with them all,
    # both populations (an image for each client's all-clients publication and duologue).
    assert row["server_counters"]["images_created"] >= 4 * CLIENTS
    if len(os.sched_getaffinity(0)) >= 2:
        assert row["server_cpu"] not in row["client_cpus"]


def test_the_cli_writes_scale_json_against_its_raw_run_of_the_same_repeat(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.scale",
            "--clients",
            str(CLIENTS),
            "--seconds",
            str(SECONDS),
            "--after-storm",
            "1",
            "--ramp",
            "1",
            "--processes",
            "2",
            "--duologue-ports",
            "shared",
            "--results-dir",
            str(tmp_path),
        ],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    record = results.load(tmp_path / "scale.json")
    assert (record.id, record.label, record.repeats) == ("scale", "B4", 1)
    assert record.command.startswith("python -m bench.scale --clients 8 ")
    by_key = {(m.subject, m.name): m for m in record.metrics}
    assert by_key["scale_shared_8", "steady connected"].values == (CLIENTS,)
    compared = [m for m in by_key.values() if m.baseline is not None]
    assert ("scale_shared_8", "echo p99") in {(m.subject, m.name) for m in compared}
    for metric in compared:
        assert metric.baseline is not None and metric.baseline.subject == "raw_scale_8"
        assert metric.baseline.values[0] > 0 and metric.values[0] > 0
    # The raw server's CPU over so short a run can be under the clock's tick: a figure whose
    # baseline measured 0 has no ratio, and is left out with a word rather than written as NaN.
    for name in ("server CPU/datagram", "server CPU/echo"):
        if ("scale_shared_8", name) not in by_key:
            assert f"scale_shared_8 {name}: its baseline is 0" in done.stderr, done.stderr
    # The raw run's figures are only baselines, not rows of their own.
    assert not any(subject.startswith("raw_") for subject, _ in by_key)
    # What raw UDP has no counterpart of is compared to nothing.
    assert by_key["scale_shared_8", "server RSS"].baseline is None
