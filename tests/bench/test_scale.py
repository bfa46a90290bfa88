"""B4 on a small scale: a handful of clients against a real echo-server, a few seconds."""

from __future__ import annotations

import os

from bench import scale
from bench.run import pin_cpus

CLIENTS = 8
SECONDS = 2.0


def test_a_few_clients_connect_and_echo_once_a_second() -> None:
    row = scale.run(CLIENTS, SECONDS, processes=2, cpus=pin_cpus(None))
    assert row["all_settled"] and row["failures"] == 0, row["failure_examples"]
    assert row["connected"] == CLIENTS
    # The clients start within one second, so they cannot all be in faster than that.
    assert 0 < row["handshakes_per_s"] <= CLIENTS / 0.5
    # Each client echoes about once a second during the steady state.
    assert 0.4 * CLIENTS <= row["echoes_per_s"] <= 1.6 * CLIENTS
    assert 0 < row["echo_p50_ms"] <= row["echo_p99_ms"] <= row["echo_max_ms"]
    assert 0 <= row["server_cpu_percent"] < 100
    assert 0 < row["server_rss_mib"] <= row["server_peak_rss_mib"]
    # The server logged its counters when it stopped: it exchanged datagrams with them all.
    assert row["server_counters"]["images_created"] >= CLIENTS
    if len(os.sched_getaffinity(0)) >= 2:
        assert row["server_cpu"] not in row["client_cpus"]
