"""The result files of bench.scale (B4, against its raw run) and bench.lobby_bench (L1, against
Colyseus): the same repeat's baseline, or none at all."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from bench import lobby_bench, results, scale
from bench.harness import Result


def _raw_row(clients: int, per_datagram: float) -> dict[str, Any]:
    return {
        "clients": clients,
        "server_cpu_percent": 10.0,
        "server_cpu_us_per_datagram": per_datagram,
        "server_cpu_us_per_echo": 2 * per_datagram,
        "echo_p50_ms": 0.2,
        "echo_p99_ms": 0.5,
    }


def test_scale_figures_are_compared_to_the_raw_run_at_the_same_n() -> None:
    raw = scale.raw_results(_raw_row(200, 20.0))
    assert {r.name for r in raw} == {"raw_scale_200"} and all(r.raw for r in raw)
    cpu = Result("scale_shared_200", "server CPU/datagram", 30.0, "µs", lower_is_better=True)
    tied = scale.with_raw_baseline(cpu, 200, raw)
    assert tied.baseline == ("raw_scale_200", "server CPU/datagram")
    # Another N, or a figure raw UDP has no counterpart of, keeps no baseline.
    assert scale.with_raw_baseline(cpu, 2000, raw).baseline is None
    rss = Result("scale_200", "server RSS", 70.0, "MiB", lower_is_better=True)
    assert scale.with_raw_baseline(rss, 200, raw).baseline is None
    record, _ = results.from_repeats(
        bench_id="scale",
        label="B4",
        title="t",
        command="c",
        own=[("scale_shared_200", "server CPU/datagram")],
        repeats=[{(r.name, r.metric): r for r in [tied, *raw]}],
        machine={"cpu": "x", "cores": 2, "python": "p", "os": "o"},
        settings={},
    )
    assert record is not None and record.metrics[0].ratio == pytest.approx(1.5)


def _lobby_record(target: str, joins_per_s: float) -> dict[str, Any]:
    return {
        "target": target,
        "join": {
            "joins_per_s": joins_per_s,
            "members_seated": 800,
            "expected": 800,
            "latency_ms_p50": 10.0,
            "latency_ms_p99": 40.0,
        },
        "idle": {"server_cpu_pct": 5.0},
        "chat": {
            "deliveries": 700,
            "expected_deliveries": 1400,
            "delivery_ms_p50": 2.0,
            "delivery_ms_p99": 9.0,
            "server_cpu_pct": 12.0,
        },
        "search": {"latency_ms_p50": None, "latency_ms_p99": None},
        "server": {"rss_mib_peak": 90.0},
    }


def _args(tmp_path: Path) -> argparse.Namespace:
    return argparse.Namespace(
        lobbies=100,
        members=8,
        bot_procs=4,
        chat_rate=200.0,
        chat_seconds=10.0,
        searches=100,
        role=None,
        out=str(tmp_path / "runs" / "lobby_bench.json"),
        results_dir=None,
        profile=None,
    )


def test_the_lobby_file_compares_echo_with_colyseus_of_the_same_repeat(tmp_path: Path) -> None:
    repeats = [
        [_lobby_record("echo", 100.0), _lobby_record("colyseus", 400.0)],
        [{"target": "echo", "error": "timed out"}, _lobby_record("colyseus", 500.0)],
        [_lobby_record("echo", 150.0), _lobby_record("colyseus", 300.0)],
    ]
    path = lobby_bench.write_result_file(repeats, _args(tmp_path), "cmd", tmp_path, {})
    assert path == tmp_path / "lobby.json"
    record = results.load(path)
    # The repeat in which echo failed is left out, Colyseus's figure of it too.
    assert (record.id, record.label, record.repeats) == ("lobby", "L1", 2)
    by_name = {m.name: m for m in record.metrics}
    joins = by_name["joins/s"]
    assert joins.values == (100.0, 150.0)
    assert joins.baseline is not None and joins.baseline.values == (400.0, 300.0)
    assert joins.baseline.label == "Colyseus 0.16 on Node 20"
    assert joins.ratios == (0.25, 0.5)
    assert by_name["chat delivered"].values == (50.0, 50.0)
    assert by_name["members seated"].unit == "%" and by_name["join p99"].better == "lower"
    # A figure no repeat could give (no search answered) is left out, not written as 0.
    assert "search p99" not in by_name
    assert all(m.subject == "echo_lobby" for m in record.metrics)
    # The goals ride on the figures they name, as ratios to Colyseus's.
    assert joins.target is not None and (joins.target["op"], joins.target["threshold"]) == (
        ">=", 1.0,
    )  # fmt: skip
    assert joins.target_met() is False  # the median ratio, 0.375
    assert by_name["server CPU idle"].target["op"] == "<="  # type: ignore[index]
    assert by_name["chat delivery p99"].target is not None
    assert by_name["join p50"].target is None
    assert lobby_bench.TARGETS["search p99"] == ("<=", 2.0, "ratio")


def test_without_colyseus_the_lobby_file_has_no_baseline_rather_than_another_runs(
    tmp_path: Path,
) -> None:
    repeats = [
        [_lobby_record("echo", 100.0), {"target": "colyseus", "error": "node not found"}],
        [_lobby_record("echo", 120.0), _lobby_record("colyseus", 300.0)],
    ]
    path = lobby_bench.write_result_file(repeats, _args(tmp_path), "cmd", tmp_path, {})
    assert path is not None
    assert all(m.baseline is None for m in results.load(path).metrics)
    failed = [[{"target": "echo", "error": "x"}]]
    assert lobby_bench.write_result_file(failed, _args(tmp_path), "c", tmp_path / "n", {}) is None


def test_the_l1_ws_file_compares_echo_ws_with_colyseus_and_carries_the_targets(
    tmp_path: Path,
) -> None:
    from bench import lobby_ws

    repeats = [
        [_lobby_record("echo-ws", 500.0), _lobby_record("colyseus", 400.0)],
        [_lobby_record("echo-ws", 300.0), _lobby_record("colyseus", 400.0)],
        [{"target": "echo-ws", "error": "timed out"}, _lobby_record("colyseus", 1.0)],
    ]
    path = lobby_ws.write_result_file(repeats, _args(tmp_path), "cmd", tmp_path, {})
    assert path == tmp_path / "lobby_ws.json"
    record = results.load(path)
    assert (record.id, record.label, record.repeats) == ("lobby_ws", "L1-WS", 2)
    by_name = {m.name: m for m in record.metrics}
    joins = by_name["joins/s"]
    assert joins.values == (500.0, 300.0) and joins.ratios == (1.25, 0.75)
    assert joins.target is not None and (joins.target["op"], joins.target["threshold"]) == (
        ">=", 1.0,
    )  # fmt: skip
    assert joins.target_met() is True  # the median ratio, 1.0
    assert "search p99" not in by_name  # (none measured in the records here)
    assert lobby_ws.TARGETS["search p99"] == ("<=", 2.0, "ratio")
    assert by_name["server RSS peak"].target is not None
    assert by_name["chat delivery p99"].target["op"] == "<="  # type: ignore[index]
    assert all(m.subject == "echo_lobby_ws" for m in record.metrics)
    # without Colyseus in a repeat: no baseline, and no targets (they are ratios to it)
    alone = [[_lobby_record("echo-ws", 500.0), {"target": "colyseus", "error": "no node"}]]
    record = results.load(lobby_ws.write_result_file(alone, _args(tmp_path), "c", tmp_path, {}))
    assert all(m.baseline is None and m.target is None for m in record.metrics)
