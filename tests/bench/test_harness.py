"""The harness's pure pieces: percentiles, ratios, selection of baselines, the table."""

from __future__ import annotations

import pytest

from bench.harness import Result, Settings, busy_warning, markdown, percentile, ratio
from bench.run import select
from bench.suite import BENCHMARKS


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
