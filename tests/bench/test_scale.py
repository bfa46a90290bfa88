"""B4 on a small scale: a handful of clients against a real echo-server, a few seconds."""

from __future__ import annotations

import os

import pytest

from bench import scale
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

