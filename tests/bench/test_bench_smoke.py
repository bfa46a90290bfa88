"""Smoke test of the benchmark suite: a quick run end to end, as users run it.

Runs `python -m bench.run --quick` (a subprocess; the benchmarks spawn their own children, and
duologue_echo starts the real echo-server and echo-client CLIs) into a temporary results
directory so the repository's bench/results is left alone. One run serves every test here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import baselines, results

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def quick_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("bench")
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.run",
            "--quick",
            "--only",
            "raw_echo,raw_oneway,duologue_echo",
            "--results-dir",
            str(directory),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return directory


@pytest.fixture(scope="module")
def quick_run(quick_dir: Path) -> tuple[dict[str, Any], str]:
    directory = quick_dir
    (json_path,) = (directory / "runs").glob("*.json")
    return json.loads(json_path.read_text()), (directory / "latest.md").read_text()


def _figures(document: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["name"], r["metric"]): r for r in document["results"]}


def test_quick_raw_baselines_produce_positive_figures(
    quick_run: tuple[dict[str, Any], str],
) -> None:
    document, table = quick_run
    assert not document["failed"]
    figures = {key: r["value"] for key, r in _figures(document).items()}
    expected = {("raw_echo_64", m) for m in ("round trips/s", "p50", "p99", "p99.9")}
    for size in (64, 1408, 8192):
        expected |= {(f"raw_oneway_{size}", "datagrams/s"), (f"raw_oneway_{size}", "MB/s")}
    assert expected <= figures.keys()
    assert all(value > 0 for value in figures.values()), figures
    # Latency percentiles are ordered, and each one-way MB/s agrees with its datagram rate.
    assert figures["raw_echo_64", "p50"] <= figures["raw_echo_64", "p99"]
    assert figures["raw_echo_64", "p99"] <= figures["raw_echo_64", "p99.9"]
    for size in (64, 1408, 8192):
        rate = figures[f"raw_oneway_{size}", "datagrams/s"]
        assert abs(figures[f"raw_oneway_{size}", "MB/s"] - rate * size / 1e6) < 1e-6 * rate * size
    assert document["machine"]["cores"] >= 1

    assert "| raw_echo_64 | round trips/s |" in table
    assert "| baseline |" in table


def test_the_raw_one_way_accounts_for_every_datagram_sent(
    quick_run: tuple[dict[str, Any], str],
) -> None:
    document, _ = quick_run
    for size in (64, 1408, 8192):
        extra = _figures(document)[f"raw_oneway_{size}", "datagrams/s"]["extra"]
        assert extra["sent"] >= extra["received"] > 0
        assert extra["per_wakeup"] >= 1
        assert extra["cpus"] == document["settings"]["pin"]
        if extra["kernel_drops"] is None:
            continue  # not Linux: the kernel does not say
        # On loopback what the sink did not read the kernel dropped on arrival (and maybe a
        # few of the end markers sent after the data).
        unread = extra["sent"] - extra["received"]
        assert 0 <= extra["kernel_drops"] - unread <= baselines.MARKERS
        behind = extra["kernel_drops"] > 0.01 * extra["sent"]
        assert extra["bound"] == ("sink" if behind else "sender")


def test_duologue_echo_is_measured_against_the_same_runs_raw_echo(
    quick_run: tuple[dict[str, Any], str],
) -> None:
    document, _ = quick_run
    figures = _figures(document)
    lean = {m: figures["duologue_echo_64", m] for m in ("round trips/s", "p50", "p99", "p99.9")}
    cli = {m: figures["echo_client_cli_64", m] for m in ("round trips/s", "p50", "p99")}
    for metric, result in [*lean.items(), *cli.items()]:
        raw = figures["raw_echo_64", metric]
        assert result["baseline"] == ["raw_echo_64", metric]
        # The ratio is to this run's raw figure, not to a remembered one.
        assert result["ratio_to_raw"] == pytest.approx(result["value"] / raw["value"])
    assert 0 < lean["p50"]["value"] <= lean["p99"]["value"] <= lean["p99.9"]["value"]
    assert 0 < cli["p50"]["value"] <= cli["p99"]["value"]
    extra = lean["round trips/s"]["extra"]
    # Every round trip went through the server's duologue (it counted them when it closed it),
    # and a quick run still makes hundreds of them.
    assert extra["server_duologue_messages"] >= extra["round_trips"] >= 100
    assert 0 < extra["server_cpu_pct"] <= 100
    assert cli["round trips/s"]["extra"]["count"] >= 100
    # The two B1 targets, judged on this run's ratios.
    rate, p99 = lean["round trips/s"], lean["p99"]
    assert rate["target"] == {"op": ">=", "threshold": 0.8, "of": "ratio", "note": ""}
    assert rate["target_met"] is (rate["ratio_to_raw"] >= 0.8)
    assert p99["target"]["op"] == "<=" and p99["target"]["threshold"] == 1.5
    assert p99["target_met"] is (p99["ratio_to_raw"] <= 1.5)
    assert cli["round trips/s"]["target"] is None


def test_the_table_shows_targets_and_whether_they_were_met(
    quick_run: tuple[dict[str, Any], str],
) -> None:
    document, table = quick_run
    rows = {
        tuple(cell.strip() for cell in line.strip("|").split("|")[:2]): [
            cell.strip() for cell in line.strip("|").split("|")
        ]
        for line in table.splitlines()
        if line.startswith("| ") and not line.startswith("| benchmark")
    }
    header = next(line for line in table.splitlines() if line.startswith("| benchmark"))
    assert [c.strip() for c in header.strip("|").split("|")][3:6] == ["vs raw", "target", "met"]
    rate = rows["duologue_echo_64", "round trips/s"]
    met = _figures(document)["duologue_echo_64", "round trips/s"]["target_met"]
    assert rate[4] == ">= 0.80 x raw"
    assert rate[5] == ("met" if met else "**missed**")
    assert rows["duologue_echo_64", "p99"][4] == "<= 1.50 x raw"
    assert rows["raw_echo_64", "p99"][3:6] == ["baseline", "", ""]
    assert "Targets: " in table


def test_the_run_writes_a_result_file_per_benchmark_with_the_same_runs_baseline(
    quick_dir: Path, quick_run: tuple[dict[str, Any], str]
) -> None:
    document, _ = quick_run
    figures = {key: r["value"] for key, r in _figures(document).items()}
    # The raw baselines have no file of their own: their figures are in duologue_echo's.
    assert sorted(p.name for p in quick_dir.glob("*.json")) == ["duologue_echo.json"]
    record = results.load(quick_dir / "duologue_echo.json")
    assert (record.id, record.label, record.repeats) == ("duologue_echo", "B1", 1)
    assert record.command.startswith("python -m bench.run --quick --only ")
    assert record.settings["quick"] is True and record.settings["repeats_asked"] == 1
    assert record.machine["cores"] >= 1 and "loadavg_1m" in record.machine["load_before"]
    assert record.machine["echo_build"] in ("compiled", "interpreted")
    assert len(record.commit.removesuffix("-dirty")) == 40
    by_key = {(m.subject, m.name): m for m in record.metrics}
    assert set(by_key) == {k for k in figures if k[0] in ("duologue_echo_64", "echo_client_cli_64")}
    for (subject, name), metric in by_key.items():
        # The file holds the run's own figures, each against the raw figure of the same run.
        assert metric.values == (figures[subject, name],)
        assert metric.baseline is not None and metric.baseline.subject == "raw_echo_64"
        assert metric.baseline.values == (figures["raw_echo_64", name],)
        assert metric.ratio == pytest.approx(figures[subject, name] / figures["raw_echo_64", name])
        assert metric.better == ("higher" if name == "round trips/s" else "lower")
    assert by_key["duologue_echo_64", "round trips/s"].target == {
        "op": ">=",
        "threshold": 0.8,
        "of": "ratio",
        "note": "",
    }


def test_a_quick_run_into_the_default_directory_writes_no_result_file() -> None:
    before = {p: p.stat().st_mtime_ns for p in results.RESULTS_DIR.glob("*.json")}
    completed = subprocess.run(
        [sys.executable, "-m", "bench.run", "--quick", "--only", "raw_echo,transport_echo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "a --quick run: no result files written" in completed.stdout
    # Smoke figures never replace the committed results.
    assert {p: p.stat().st_mtime_ns for p in results.RESULTS_DIR.glob("*.json")} == before
