"""The result-file format (bench/results.py): what a benchmark writes, and what a file must be."""

from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from bench import results
from bench.harness import Result
from bench.results import ResultFileError

MACHINE = {"cpu": "Test CPU", "cores": 2, "python": "CPython 3.11.7", "os": "Linux 6.1"}


def sample(**overrides: Any) -> results.BenchResult:
    fields: dict[str, Any] = {
        "id": "duologue_echo",
        "label": "B1",
        "title": "B1: echo-server duologue round trips, 64 B",
        "command": "python -m bench.run --only duologue_echo --repeats 3",
        "date": "2026-12-07T01:00:00+00:00",
        "commit": "0" * 40,
        "repeats": 3,
        "machine": MACHINE,
        "metrics": (
            results.metric_from_repeats(
                "duologue_echo_64",
                "round trips/s",
                "RT/s",
                False,
                [9000.0, 8000.0, 10000.0],
                ("raw_echo_64", "raw trio UDP", [10000.0, 10000.0, 12500.0]),
                {"op": ">=", "threshold": 0.8, "of": "ratio", "note": ""},
            ),
            results.metric_from_repeats("scale_200", "server RSS", "MiB", True, [70.0, 72.0, 71.0]),
        ),
        "settings": {"duration_s": 5.0},
    }
    fields.update(overrides)
    return results.BenchResult(**fields)


def test_a_written_file_loads_back_with_every_value_and_the_derived_figures(
    tmp_path: Path,
) -> None:
    path = sample().write(tmp_path)
    assert path == tmp_path / "duologue_echo.json"
    document = json.loads(path.read_text())
    assert document["schema"] == results.SCHEMA
    rate = document["metrics"][0]
    # The median, the range and the ratio are those of the repeats ...
    assert (rate["median"], rate["min"], rate["max"]) == (9000.0, 8000.0, 10000.0)
    # ... and each repeat's ratio is to the baseline of that same repeat: 0.9, 0.8, 0.8.
    assert rate["ratios"] == pytest.approx([0.9, 0.8, 0.8])
    assert rate["ratio"] == pytest.approx(0.8)
    assert rate["baseline"]["median"] == 10000.0
    assert document["metrics"][1]["baseline"] is None and document["metrics"][1]["ratio"] is None
    loaded = results.load(path)
    assert loaded == sample()
    assert loaded.metrics[0].target_met() is True  # 0.8 >= 0.8
    assert loaded.metrics[1].target_met() is None


def test_a_target_on_the_value_is_judged_on_the_median() -> None:
    metric = results.metric_from_repeats(
        "scale_1000",
        "echo p99",
        "ms",
        True,
        [25.0, 15.0, 19.0],
        target={"op": "<=", "threshold": 20, "of": "value"},
    )
    assert metric.target_met() is True
    assert metric.median == 19.0


def _file(tmp_path: Path, document: Any, name: str = "duologue_echo.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(document) if not isinstance(document, str) else document)
    return path


def _valid() -> dict[str, Any]:
    return sample().to_json()


def _broken(change: Any) -> dict[str, Any]:
    document = copy.deepcopy(_valid())
    change(document)
    return document


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda d: d.pop("machine"), "file: missing field 'machine'"),
        (lambda d: d.update(schema="other/2"), "schema is 'other/2'"),
        (lambda d: d.update(repeats=0), "'repeats' is 0"),
        (lambda d: d.update(repeats=True), "field 'repeats' is True"),
        (lambda d: d.update(id="scale"), "'id' is 'scale' but the file is duologue_echo.json"),
        (lambda d: d.update(date="yesterday"), "'date' 'yesterday' is not an ISO 8601 date"),
        (lambda d: d.update(date="2026-12-07T02:00:00+01:00"), "is not in UTC"),
        (lambda d: d["machine"].pop("cpu"), "machine: missing field 'cpu'"),
        (lambda d: d.update(metrics=[]), "'metrics' is empty"),
        (lambda d: d["metrics"][0]["values"].pop(), "metrics[0]: 'values' has 2 values for 3"),
        (lambda d: d["metrics"][1]["values"].__setitem__(0, "fast"), "holds 'fast'"),
        (lambda d: d["metrics"][0].update(better="faster"), "'better' is 'faster'"),
        # A summary edited by hand so that it no longer follows from the repeats:
        (lambda d: d["metrics"][0].update(median=9500.0), "'median' is 9500.0 but its per-repe"),
        (lambda d: d["metrics"][0].update(ratio=0.95), "'ratio' is 0.95 but its per-repeat"),
        (lambda d: d["metrics"][0]["ratios"].__setitem__(1, 0.9), "'ratios' is 0.9"),
        (lambda d: d["metrics"][0]["baseline"].update(median=1.0), "baseline: 'median' is 1.0"),
        (lambda d: d["metrics"][1].update(ratio=1.0), "'ratio' is 1.0 but there is no baseline"),
        (lambda d: d["metrics"][0]["target"].update(op="=="), "target op is '=='"),
        (lambda d: d["metrics"].append(d["metrics"][0]), "appears twice"),
    ],
)
def test_an_invalid_file_is_refused_naming_the_file_and_the_field(
    tmp_path: Path, change: Any, problem: str
) -> None:
    path = _file(tmp_path, _broken(change))
    with pytest.raises(ResultFileError) as raised:
        results.load(path)
    assert str(raised.value).startswith(f"{path}: ")
    assert problem in str(raised.value)
    assert raised.value.path == path


@pytest.mark.parametrize(
    ("text", "problem"), [("{not json", "not valid JSON"), ("[1, 2]", "not a JSON object")]
)
def test_a_file_that_is_not_a_result_object_is_refused(
    tmp_path: Path, text: str, problem: str
) -> None:
    path = _file(tmp_path, text)
    with pytest.raises(ResultFileError, match=re.escape(f"{path}: {problem}")):
        results.load(path)


def test_writing_validates_first_and_leaves_no_file_when_invalid(tmp_path: Path) -> None:
    bad = sample(repeats=2)  # three values per metric
    with pytest.raises(ResultFileError, match="3 values for 2 repeats"):
        bad.write(tmp_path)
    assert not list(tmp_path.iterdir())


def test_load_all_reads_every_file_sorted_by_id(tmp_path: Path) -> None:
    sample(id="topics").write(tmp_path)
    sample(id="channels").write(tmp_path)
    assert [r.id for r in results.load_all(tmp_path)] == ["channels", "topics"]


def _repeat(value: float, raw: float | None) -> dict[tuple[str, str], Result]:
    found = {
        ("duologue_echo_64", "p99"): Result(
            "duologue_echo_64",
            "p99",
            value,
            "µs",
            baseline=("raw_echo_64", "p99"),
            lower_is_better=True,
            target=("<=", 1.5, "ratio"),
        ),
        ("echo_client_cli_64", "count"): Result("echo_client_cli_64", "count", 5.0, "n"),
    }
    if raw is not None:
        found["raw_echo_64", "p99"] = Result("raw_echo_64", "p99", raw, "µs", raw=True)
    return found


OWN = [("duologue_echo_64", "p99"), ("echo_client_cli_64", "count")]


def test_from_repeats_pairs_each_repeat_with_its_own_baseline() -> None:
    record, left_out = results.from_repeats(
        bench_id="duologue_echo",
        label="B1",
        title="t",
        command="c",
        own=OWN,
        repeats=[_repeat(200.0, 100.0), _repeat(150.0, 50.0), _repeat(120.0, 100.0)],
        machine=MACHINE,
        settings={},
        commit="abc",
        date="2026-12-07T01:00:00+00:00",
    )
    assert left_out == [] and record is not None
    p99, count = record.metrics
    assert p99.values == (200.0, 150.0, 120.0)
    assert p99.baseline is not None and p99.baseline.values == (100.0, 50.0, 100.0)
    assert p99.baseline.label == "raw trio UDP"
    assert p99.ratios == (2.0, 3.0, 1.2) and p99.ratio == 2.0
    assert p99.better == "lower"
    assert p99.target == {"op": "<=", "threshold": 1.5, "of": "ratio", "note": ""}
    assert count.baseline is None and count.better == "higher"
    assert record.repeats == 3


def test_from_repeats_leaves_out_a_figure_whose_baseline_is_missing_in_a_repeat() -> None:
    record, left_out = results.from_repeats(
        bench_id="duologue_echo",
        label="B1",
        title="t",
        command="c",
        own=OWN,
        repeats=[_repeat(200.0, 100.0), _repeat(150.0, None)],
        machine=MACHINE,
        settings={},
    )
    assert record is not None
    assert [(m.subject, m.name) for m in record.metrics] == [("echo_client_cli_64", "count")]
    assert left_out == ["duologue_echo_64 p99: its baseline ('raw_echo_64', 'p99') is missing"]
    nothing, _ = results.from_repeats(
        bench_id="x",
        label="",
        title="t",
        command="c",
        own=[("gone", "p99")],
        repeats=[_repeat(1.0, 1.0)],
        machine=MACHINE,
        settings={},
    )
    assert nothing is None


def test_a_run_records_the_commit_the_machine_and_its_load() -> None:
    commit = results.git_commit()
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", commit)
    machine = results.machine_info(results.system_load(), {"loadavg_1m": 1.5})
    assert machine["cores"] >= 1 and machine["os"].startswith("Linux")
    assert machine["python"].startswith("CPython 3.")
    assert machine["echo_build"] in ("compiled", "interpreted")
    assert set(machine["load_before"]) >= {"loadavg_1m", "loadavg_5m", "loadavg_15m"}
    assert machine["load_after"] == {"loadavg_1m": 1.5}


def test_a_figure_whose_baseline_is_zero_or_nan_in_a_repeat_is_left_out_not_written() -> None:
    """A short or starved run can measure a baseline of 0 (or no echo at all: NaN): a ratio to
    it is no figure, and the file must still be written with the figures that are."""

    def repeat(base: float, value: float) -> dict[tuple[str, str], Result]:
        own = Result("echo", "cpu", value, "us", baseline=("raw", "cpu"), lower_is_better=True)
        plain = Result("echo", "rss", 50.0, "MiB")
        raw = Result("raw", "cpu", base, "us", raw=True)
        return {("echo", "cpu"): own, ("echo", "rss"): plain, ("raw", "cpu"): raw}

    for repeats in ([repeat(10.0, 20.0), repeat(0.0, 20.0)], [repeat(10.0, math.nan)]):
        record, left_out = results.from_repeats(
            bench_id="x",
            label="X",
            title="x",
            command="python -m x",
            own=[("echo", "cpu"), ("echo", "rss")],
            repeats=repeats,
            machine={"cores": 2},
            settings={},
            commit="0" * 40,
            date="2026-12-07T00:00:00Z",
        )
        assert record is not None
        assert [m.subject for m in record.metrics] == ["echo"]
        assert [m.name for m in record.metrics] == ["rss"]
        assert len(left_out) == 1 and left_out[0].startswith("echo cpu: ")
        json.dumps(record.to_json(), allow_nan=False)  # what is written is valid JSON
