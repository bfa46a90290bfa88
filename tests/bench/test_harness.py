"""The harness's pure pieces: percentiles, ratios, targets, selection of baselines, the table."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from bench import baselines, scale
from bench.harness import (
    SOCKET_BUFFER,
    Control,
    Result,
    RoundTrips,
    Settings,
    Target,
    busy_warning,
    kernel_drops,
    markdown,
    percentile,
    ratio,
    set_buffers,
    target_met,
    write_reports,
)
from bench.run import select
from bench.suite import BENCHMARKS
from tests.ports import free_ports


def test_percentile_is_nearest_rank_without_interpolation() -> None:
    samples = [float(x) for x in range(1, 101)]  # 1..100
    assert percentile(samples, 50) == 50
    assert percentile(samples, 99) == 99
    assert percentile(samples, 99.9) == 100
    assert percentile(samples, 100) == 100
    assert percentile([7.0], 50) == 7
    # With 1,000 samples p99.9 is the 999th, not an interpolation towards the max.
    thousand = [float(x) for x in range(1000)]
    assert percentile(thousand, 99.9) == 998
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile(samples, 0)


def test_ratio_is_to_the_named_baseline_of_the_same_run() -> None:
    raw = Result("raw_echo_64", "round trips/s", 10_000.0, "RT/s", raw=True)
    mine = Result(
        "transport_echo_64",
        "round trips/s",
        6_000.0,
        "RT/s",
        baseline=("raw_echo_64", "round trips/s"),
    )
    orphan = Result("x", "round trips/s", 1.0, "RT/s", baseline=("missing", "round trips/s"))
    by_key = {(r.name, r.metric): r for r in (raw, mine, orphan)}
    assert ratio(mine, by_key) == pytest.approx(0.6)
    assert ratio(raw, by_key) is None
    assert ratio(orphan, by_key) is None
    table = markdown(
        [raw, mine, orphan],
        {"enet_echo": "pyenet is not installed"},
        {},
        {
            "date": "d",
            "cpu": "c",
            "cores": 2,
            "implementation": "CPython",
            "python": "3.11",
            "kernel": "k",
        },
        Settings(duration=1.0, quick=True),
    )
    assert "| transport_echo_64 | round trips/s | 6,000 RT/s | 0.60 x |" in table
    assert "| raw_echo_64 | round trips/s | 10,000 RT/s | baseline |" in table
    assert "| x | round trips/s | 1 RT/s | n/a |" in table
    assert "- enet_echo: pyenet is not installed" in table


def test_only_adds_the_baselines_a_benchmark_is_compared_to() -> None:
    assert select("transport_echo") == ["raw_echo", "transport_echo"]
    assert select("quic_oneway,raw_echo") == ["raw_echo", "raw_oneway", "quic_oneway"]
    assert select(None) == list(BENCHMARKS)
    with pytest.raises(SystemExit):
        select("no_such_benchmark")


def test_every_registered_benchmark_needs_only_registered_ones() -> None:
    for name, benchmark in BENCHMARKS.items():
        assert set(benchmark.needs) <= BENCHMARKS.keys(), name


def test_a_busy_machine_is_named_in_the_report() -> None:
    idle = {"loadavg_1m": 0.1, "cpu_pressure_avg10_pct": 0.0}
    assert busy_warning({"before": idle, "after": {"loadavg_1m": 2.0}}) is None
    warning = busy_warning({"before": {"loadavg_1m": 2.5, "cpu_pressure_avg10_pct": 30.0}})
    assert warning is not None and "load 2.50" in warning
    assert busy_warning({"after": {"cpu_pressure_avg10_pct": 20.0}}) is not None


MACHINE = {
    "date": "d",
    "cpu": "c",
    "cores": 2,
    "implementation": "CPython",
    "python": "3.11",
    "kernel": "k",
}


def _row(table: str, name: str, metric: str) -> list[str]:
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if cells[:2] == [name, metric]:
            return cells
    raise AssertionError(f"no row {name} / {metric} in\n{table}")


def test_targets_are_judged_on_the_value_or_on_the_ratio_to_the_same_runs_raw() -> None:
    raw_rate = Result("raw_echo_64", "round trips/s", 10_000.0, "RT/s", raw=True)
    raw_p99 = Result("raw_echo_64", "p99", 100.0, "µs", raw=True)
    fast = Result(
        "a",
        "round trips/s",
        6_000.0,
        "RT/s",
        baseline=("raw_echo_64", "round trips/s"),
        target=(">=", 0.6, "ratio"),
    )
    slow = Result(
        "b",
        "round trips/s",
        5_999.0,
        "RT/s",
        baseline=("raw_echo_64", "round trips/s"),
        target=Target(">=", 0.6, "ratio"),
    )
    p99 = Result(
        "a", "p99", 250.0, "µs", baseline=("raw_echo_64", "p99"), target=("<=", 2.0, "ratio")
    )
    cpu = Result("scale_1000", "server CPU", 59.9, "%", target=("<=", 60))
    hot = Result(
        "scale_1000", "server RSS", 700.0, "MiB", target=Target("<=", 572.2, note="600 MB")
    )
    orphan = Result(
        "c",
        "round trips/s",
        1.0,
        "RT/s",
        baseline=("missing", "round trips/s"),
        target=(">=", 0.6, "ratio"),
    )
    plain = Result("d", "msgs/s", 5.0, "msg/s", baseline=("raw_echo_64", "round trips/s"))
    results = [raw_rate, raw_p99, fast, slow, p99, cpu, hot, orphan, plain]
    by_key = {(r.name, r.metric): r for r in results}
    assert [target_met(r, by_key) for r in results] == [
        None,
        None,
        True,
        False,
        False,
        True,
        False,
        None,
        None,
    ]

    table = markdown(results, {}, {}, MACHINE, Settings(duration=1.0, quick=True))
    assert _row(table, "a", "round trips/s")[3:6] == ["0.60 x", ">= 0.60 x raw", "met"]
    assert _row(table, "b", "round trips/s")[3:6] == ["0.60 x", ">= 0.60 x raw", "**missed**"]
    assert _row(table, "a", "p99")[3:6] == ["2.50 x", "<= 2.00 x raw", "**missed**"]
    # No raw counterpart: a dash, not "baseline"; the target is in the figure's own unit.
    assert _row(table, "scale_1000", "server CPU")[2:6] == ["59.9 %", "—", "<= 60.0 %", "met"]
    assert _row(table, "scale_1000", "server RSS")[4:6] == ["<= 572.2 MiB (600 MB)", "**missed**"]
    # A ratio to a row that is not raw names the row (here one this run lacks).
    orphan_row = _row(table, "c", "round trips/s")[3:6]
    assert orphan_row == ["n/a", ">= 0.60 x missing", "n/a (no baseline)"]
    assert _row(table, "d", "msgs/s")[4:6] == ["", ""]
    assert "Targets: 2 met, 3 missed, 1 without a baseline." in table


def test_a_target_is_a_comparison_on_the_value_or_the_ratio() -> None:
    assert Result("x", "m", 1.0, "u", target=(">=", 2)).target == Target(">=", 2, "value")
    with pytest.raises(ValueError):
        Target("==", 1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Target(">=", 1.0, "percent")  # type: ignore[arg-type]


def test_the_json_report_says_whether_each_target_was_met(tmp_path: Path) -> None:
    raw = Result("raw_echo_64", "round trips/s", 10_000.0, "RT/s", raw=True)
    mine = Result(
        "duologue_echo_64",
        "round trips/s",
        5_000.0,
        "RT/s",
        baseline=("raw_echo_64", "round trips/s"),
        target=(">=", 0.6, "ratio"),
    )
    json_path, md_path, _ = write_reports([raw, mine], {}, {}, Settings(1.0, True), tmp_path)
    rows = {r["name"]: r for r in json.loads(json_path.read_text())["results"]}
    assert rows["duologue_echo_64"]["ratio_to_raw"] == pytest.approx(0.5)
    assert rows["duologue_echo_64"]["target_met"] is False
    assert rows["duologue_echo_64"]["target"]["threshold"] == 0.6
    assert rows["raw_echo_64"]["target_met"] is None and rows["raw_echo_64"]["raw"] is True
    assert "**missed**" in md_path.read_text()


def _scale_row(clients: int) -> dict[str, object]:
    return {
        "clients": clients,
        "connected": clients - 2,
        "failures": 2,
        "handshakes_per_s": 250.0,
        "server_cpu_percent": 61.0,
        "server_rss_mib": 100.0,
        "echo_p50_ms": 1.0,
        "echo_p99_ms": 19.0,
        "echo_after_storm_p99_ms": 40.0,
        "clients_cpu_percent": 50.0,
        "steady_failures": 1,
        "steady_connected": clients - 1,
        "server_cpu_us_per_datagram": 60.0,
        "server_cpu_us_per_echo": 600.0,
        "server_counters": {"datagrams_sent": 1},
    }


def test_scale_figures_have_targets_at_1000_clients_only() -> None:
    at_1000 = {r.metric: r for r in scale.results(_scale_row(1000))}
    by_key = {(r.name, r.metric): r for r in at_1000.values()}
    verdicts = {metric: target_met(r, by_key) for metric, r in at_1000.items()}
    assert verdicts == {
        "handshakes/s": True,
        "server CPU": False,
        "server RSS": True,
        # compared with bench.scale_raw's run, not with a fixed target
        "server CPU/datagram": None,
        "server CPU/echo": None,
        "echo p50": None,
        "echo p99": True,
        # The storm's clients echo in step: reported, but the target is the steady state's.
        "echo p99 after storm": None,
        "clients CPU": None,
        "connected": None,
        "steady connected": None,
        "failures": None,
    }
    # Failures of the storm and of the steady population together.
    assert at_1000["connected"].value == 998 and at_1000["failures"].value == 3
    assert all(r.baseline is None and not r.raw for r in at_1000.values())
    assert all(r.target is None for r in scale.results(_scale_row(500)))


def test_a_scale_row_run_another_way_says_so_in_its_name_and_has_no_targets() -> None:
    # B4's 5,000-client row: shared ports, an echo every 5 s, no storm; and a row of clients
    # all sending from one address, as the bench did before they had addresses of their own.
    row = _scale_row(1000) | {
        "duologue_ports": "shared",
        "interval_s": 5.0,
        "storm_clients": 0,
        "sources": "one",
    }
    found = scale.results(row)
    assert {r.name for r in found} == {"scale_shared_1000_every_5s_one_source_storm_0"}
    assert all(r.target is None for r in found)
    metrics = {r.metric for r in found}
    assert "steady connected" in metrics
    assert not metrics & {"handshakes/s", "echo p99 after storm", "connected"}


def test_per_datagram_figures_divide_the_server_cpu_by_what_it_handled() -> None:
    from bench.scale_raw import per_datagram, udp_datagrams

    row = per_datagram(cpu=0.5, datagrams=10_000, echoes=1_000, span=10.0)
    assert row["datagrams_per_s"] == 1_000.0
    assert row["server_cpu_us_per_datagram"] == 50.0
    assert row["server_cpu_us_per_echo"] == 500.0
    assert per_datagram(0.5, 0, 0, 10.0)["server_cpu_us_per_datagram"] != 50.0  # nan
    before = udp_datagrams()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.sendto(b"x", ("127.0.0.1", 9))
    assert udp_datagrams() >= before + 1


def test_round_trips_time_each_step_of_the_measured_phase_only() -> None:
    ctl = Control(channel=None)
    begun: list[int] = []
    rounds = RoundTrips(ctl, 0.05, on_begin=lambda: begun.append(len(rounds.samples)))
    sequences = list(rounds)
    # One sequence across warm-up and measurement, the measured part begun once, before its
    # first sample; one sample per measured round trip.
    assert sequences == list(range(len(sequences)))
    assert rounds.total == len(sequences) > rounds.count > 0
    assert begun == [0] and ctl.began is not None
    assert len(rounds.samples) == rounds.count
    summary = rounds.summary()
    assert summary["round_trips"] == rounds.count
    assert summary["round_trips_per_s"] == pytest.approx(rounds.count / rounds.elapsed)
    assert 0.05 <= rounds.elapsed < 1.0


def _reports_drops() -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", free_ports([0])))
        return kernel_drops(probe) is not None


@pytest.mark.skipif(
    not _reports_drops(), reason="the kernel does not report per-socket UDP drops"
)
def test_kernel_drops_counts_what_a_full_receive_queue_turned_away() -> None:
    port = free_ports([0])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sink, socket.socket(
        socket.AF_INET, socket.SOCK_DGRAM
    ) as source:
        sink.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a few datagrams' room
        sink.bind(("127.0.0.1", port))
        assert kernel_drops(sink) == 0
        for _ in range(200):
            source.sendto(bytes(64), ("127.0.0.1", port))
        sink.setblocking(False)
        read = 0
        while True:
            try:
                sink.recv(2048)
            except BlockingIOError:
                break
            read += 1
        drops = kernel_drops(sink)
    assert 0 < read < 200
    assert drops == 200 - read  # on loopback every datagram not read was dropped on arrival


def test_socket_buffers_are_forced_past_the_system_maximum_as_root() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        granted = set_buffers(sock)
    try:
        with open("/proc/sys/net/core/rmem_max") as limit:
            rmem_max = int(limit.read())
    except OSError:
        pytest.skip("no net.core.rmem_max to compare with")
    if os.geteuid() != 0 and rmem_max < SOCKET_BUFFER:
        pytest.skip("only root may force a buffer past net.core.rmem_max")
    # The kernel reports double the request (its bookkeeping share).
    assert granted["rcvbuf"] >= 2 * SOCKET_BUFFER and granted["sndbuf"] >= 2 * SOCKET_BUFFER


def test_oneway_accounting_says_which_side_the_rate_measures() -> None:
    got = {"count": 900, "wakeups": 3, "kernel_drops": 120}
    extra = baselines.oneway_accounting(1000, 2.0, got)
    assert extra["sent"] == 1000 and extra["received"] == 900 and extra["loss_pct"] == 10.0
    assert extra["sent_per_s"] == 500 and extra["per_wakeup"] == 300.0
    assert extra["bound"] == "sink"  # the kernel turned away 12 %: the sink was behind
    kept_up = baselines.oneway_accounting(
        1000, 2.0, {"count": 1000, "wakeups": 1000, "kernel_drops": 5}
    )
    assert kept_up["bound"] == "sender" and kept_up["per_wakeup"] == 1.0
    unknown = baselines.oneway_accounting(
        1000, 2.0, {"count": 1000, "wakeups": 0, "kernel_drops": None}
    )
    assert "bound" not in unknown and unknown["per_wakeup"] is None
