"""The result files of the benchmarks: one JSON file per benchmark in bench/results/.

    bench/results/<id>.json      written by the benchmark code (bench.run, bench.scale,
                                 bench.lobby_bench); read by bench.report, which turns them
                                 into docs/benchmarks.md

One file holds one benchmark's latest run: every figure it measured, each with the value of
every repeat and, where it has one, the baseline measured in the same repeats (raw trio UDP,
or a peer such as Colyseus), so that the spread and the ratio come from the same runs. The
summary fields (`median`, `ratio`) are derived from the per-repeat values and are checked
against them on load: a file edited by hand so that they disagree is refused.

The format is `SCHEMA` (a version string in every file); `load` validates a file and says
which file and which field is wrong. Only the standard library: the report runs anywhere.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import platform
import statistics
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

SCHEMA = "echo-bench-result/1"
RESULTS_DIR = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parents[1]
BETTER = ("higher", "lower")
#: relative tolerance of the derived fields' check (they are written rounded to nothing, but
#: JSON round trips of floats are exact; this only forgives the last bit)
_TOLERANCE = 1e-9


class ResultFileError(ValueError):
    """A result file that is not valid: names the file and what is wrong with it."""

    def __init__(self, path: Path | str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = Path(path)
        self.problem = problem


@dataclass(frozen=True)
class Baseline:
    """What a figure is compared to, measured in the same repeats as the figure."""

    #: the figure's name in its own benchmark (e.g. "raw_echo_64"), or the peer's
    subject: str
    #: what it is, for a reader: "raw trio UDP", "Colyseus 0.16 (Node 20)", "0 % loss"
    label: str
    #: one value per repeat, in the order of the figure's own `values`
    values: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.values)


@dataclass(frozen=True)
class Metric:
    """One figure of a benchmark over its repeats."""

    subject: str  # what was measured, e.g. "duologue_echo_64"
    name: str  # the metric, e.g. "round trips/s", "p99"
    unit: str
    better: str  # "higher" or "lower"
    values: tuple[float, ...]  # one per repeat
    baseline: Baseline | None = None
    #: the goal set for this figure: {"op": ">=" | "<=", "threshold": x, "of": "value" | "ratio"}
    target: Mapping[str, Any] | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def ratios(self) -> tuple[float, ...] | None:
        """value / baseline of each repeat (the same repeat's baseline); None without one."""
        if self.baseline is None:
            return None
        return tuple(
            v / b if b else math.nan for v, b in zip(self.values, self.baseline.values, strict=True)
        )

    @property
    def ratio(self) -> float | None:
        """The median of the per-repeat ratios."""
        ratios = self.ratios
        return None if ratios is None else statistics.median(ratios)

    def target_met(self) -> bool | None:
        """Whether the median (or the median ratio) meets the target; None without either."""
        if self.target is None:
            return None
        subject = self.median if self.target["of"] == "value" else self.ratio
        if subject is None or math.isnan(subject):
            return None
        threshold = float(self.target["threshold"])
        return subject >= threshold if self.target["op"] == ">=" else subject <= threshold


@dataclass(frozen=True)
class BenchResult:
    """One benchmark's latest run: the contents of bench/results/<id>.json."""

    id: str  # the benchmark's name, as `bench.run --only` takes it (file name: <id>.json)
    label: str  # its name in the docs: "B1", "L1", or "" for none
    title: str
    command: str  # how to run it again
    date: str  # UTC, ISO 8601, when the run ended
    commit: str  # git commit of the code that ran (+ "-dirty" if it had local changes)
    repeats: int
    machine: Mapping[str, Any]
    metrics: tuple[Metric, ...]
    #: anything else the run wants to keep with its figures (settings, scenario)
    settings: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {"schema": SCHEMA}
        for key, value in asdict(self).items():
            document[key] = value
        document["metrics"] = [_metric_json(m) for m in self.metrics]
        return document

    def write(self, directory: Path = RESULTS_DIR) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{self.id}.json"
        text = json.dumps(self.to_json(), indent=2, ensure_ascii=False, allow_nan=False)
        # Validate what is about to be written, as the report will read it.
        from_json(json.loads(text), path)
        path.write_text(text + "\n", encoding="utf-8")
        return path


def _metric_json(metric: Metric) -> dict[str, Any]:
    document: dict[str, Any] = {
        "subject": metric.subject,
        "name": metric.name,
        "unit": metric.unit,
        "better": metric.better,
        "values": list(metric.values),
        "median": metric.median,
        "min": min(metric.values),
        "max": max(metric.values),
        "baseline": None,
        "ratios": None,
        "ratio": None,
        "target": dict(metric.target) if metric.target is not None else None,
    }
    if metric.baseline is not None:
        document["baseline"] = {
            "subject": metric.baseline.subject,
            "label": metric.baseline.label,
            "values": list(metric.baseline.values),
            "median": metric.baseline.median,
        }
        document["ratios"] = list(metric.ratios or ())
        document["ratio"] = metric.ratio
    return document


# ------------------------------------------------------------------ validation


def _require(
    document: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str
) -> Any:
    if key not in document:
        raise ValueError(f"{where}: missing field {key!r}")
    value = document[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    # bool is an int in Python; a count or a figure that is true/false is still wrong
    if isinstance(value, bool) and bool not in kinds:
        raise ValueError(f"{where}: field {key!r} is {value!r}, not {_kind_names(kinds)}")
    if not isinstance(value, kinds):
        raise ValueError(
            f"{where}: field {key!r} is {type(value).__name__} {value!r:.60}, "
            f"not {_kind_names(kinds)}"
        )
    return value


def _kind_names(kinds: tuple[type, ...]) -> str:
    names = {
        str: "a string",
        int: "an integer",
        float: "a number",
        list: "a list",
        dict: "an object",
        type(None): "null",
        bool: "true/false",
    }
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _numbers(document: Mapping[str, Any], key: str, where: str, count: int) -> tuple[float, ...]:
    values = _require(document, key, list, where)
    if len(values) != count:
        raise ValueError(f"{where}: {key!r} has {len(values)} values for {count} repeats")
    for value in values:
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise ValueError(f"{where}: {key!r} holds {value!r}, not a finite number")
    return tuple(float(v) for v in values)


def _same(stated: Any, derived: float | None, key: str, where: str) -> None:
    if derived is None:
        if stated is not None:
            raise ValueError(f"{where}: {key!r} is {stated!r} but there is no baseline")
        return
    if isinstance(stated, bool) or not isinstance(stated, int | float):
        raise ValueError(f"{where}: {key!r} is {stated!r}, not a number")
    if not math.isclose(stated, derived, rel_tol=_TOLERANCE, abs_tol=1e-12):
        raise ValueError(
            f"{where}: {key!r} is {stated!r} but its per-repeat values give {derived!r}"
        )


def _target(document: Any, where: str) -> dict[str, Any] | None:
    if document is None:
        return None
    if not isinstance(document, dict):
        raise ValueError(f"{where}: 'target' is {document!r}, not an object or null")
    if document.get("op") not in (">=", "<="):
        raise ValueError(f"{where}: target op is {document.get('op')!r}, not '>=' or '<='")
    if document.get("of") not in ("value", "ratio"):
        raise ValueError(f"{where}: target is of {document.get('of')!r}, not 'value' or 'ratio'")
    threshold = _require(document, "threshold", (int, float), f"{where} target")
    return {
        "op": document["op"],
        "threshold": float(threshold),
        "of": document["of"],
        "note": str(document.get("note", "")),
    }


def _metric(document: Any, where: str, repeats: int) -> Metric:
    if not isinstance(document, dict):
        raise ValueError(f"{where}: not an object")
    better = _require(document, "better", str, where)
    if better not in BETTER:
        raise ValueError(f"{where}: 'better' is {better!r}, not 'higher' or 'lower'")
    values = _numbers(document, "values", where, repeats)
    baseline = None
    raw_baseline = _require(document, "baseline", (dict, type(None)), where)
    if raw_baseline is not None:
        inner = f"{where} baseline"
        baseline = Baseline(
            subject=_require(raw_baseline, "subject", str, inner),
            label=_require(raw_baseline, "label", str, inner),
            values=_numbers(raw_baseline, "values", inner, repeats),
        )
        _same(raw_baseline.get("median"), baseline.median, "median", inner)
    metric = Metric(
        subject=_require(document, "subject", str, where),
        name=_require(document, "name", str, where),
        unit=_require(document, "unit", str, where),
        better=better,
        values=values,
        baseline=baseline,
        target=_target(document.get("target"), where),
    )
    _same(document.get("median"), metric.median, "median", where)
    _same(document.get("min"), min(values), "min", where)
    _same(document.get("max"), max(values), "max", where)
    _same(document.get("ratio"), metric.ratio, "ratio", where)
    stated_ratios = document.get("ratios")
    if metric.ratios is None:
        if stated_ratios is not None:
            raise ValueError(f"{where}: 'ratios' given but there is no baseline")
    else:
        if not isinstance(stated_ratios, list) or len(stated_ratios) != repeats:
            raise ValueError(f"{where}: 'ratios' must list one ratio per repeat")
        for stated, derived in zip(stated_ratios, metric.ratios, strict=True):
            _same(stated, derived, "ratios", where)
    return metric


def from_json(document: Any, path: Path | str) -> BenchResult:
    """A BenchResult from a parsed file; ResultFileError naming `path` if it is not valid."""
    try:
        if not isinstance(document, dict):
            raise ValueError("not a JSON object")
        schema = document.get("schema")
        if schema != SCHEMA:
            raise ValueError(f"schema is {schema!r}, expected {SCHEMA!r}")
        repeats = _require(document, "repeats", int, "file")
        if repeats < 1:
            raise ValueError(f"file: 'repeats' is {repeats}, must be at least 1")
        identifier = _require(document, "id", str, "file")
        if not identifier or "/" in identifier or identifier.startswith("."):
            raise ValueError(f"file: 'id' {identifier!r} is not a file name")
        if Path(path).suffix == ".json" and Path(path).stem != identifier:
            raise ValueError(f"file: 'id' is {identifier!r} but the file is {Path(path).name}")
        date = _require(document, "date", str, "file")
        try:
            parsed = dt.datetime.fromisoformat(date)
        except ValueError:
            raise ValueError(f"file: 'date' {date!r} is not an ISO 8601 date") from None
        if parsed.utcoffset() != dt.timedelta(0):
            raise ValueError(f"file: 'date' {date!r} is not in UTC")
        machine = _require(document, "machine", dict, "file")
        for key in ("cpu", "cores", "python", "os"):
            _require(machine, key, (str, int), "machine")
        raw_metrics = _require(document, "metrics", list, "file")
        if not raw_metrics:
            raise ValueError("file: 'metrics' is empty")
        metrics = tuple(_metric(m, f"metrics[{i}]", repeats) for i, m in enumerate(raw_metrics))
        keys = [(m.subject, m.name) for m in metrics]
        if len(set(keys)) != len(keys):
            raise ValueError("file: a (subject, name) pair appears twice in 'metrics'")
        return BenchResult(
            id=identifier,
            label=_require(document, "label", str, "file"),
            title=_require(document, "title", str, "file"),
            command=_require(document, "command", str, "file"),
            date=date,
            commit=_require(document, "commit", str, "file"),
            repeats=repeats,
            machine=machine,
            metrics=metrics,
            settings=_require(document, "settings", dict, "file"),
        )
    except ValueError as error:
        raise ResultFileError(path, str(error)) from None


def load(path: Path) -> BenchResult:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ResultFileError(path, f"cannot be read: {error.strerror}") from None
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError
        raise ResultFileError(path, f"not valid JSON: {error}") from None
    return from_json(document, path)


def load_all(directory: Path = RESULTS_DIR) -> list[BenchResult]:
    """Every bench/results/*.json, sorted by id; the first invalid one raises."""
    return sorted((load(p) for p in sorted(directory.glob("*.json"))), key=lambda r: r.id)


# ------------------------------------------------------------------ what every run records


def system_load() -> dict[str, float]:
    """The 1, 5 and 15 minute load averages, and the CPU pressure where the kernel has it."""
    load: dict[str, float] = {}
    one, five, fifteen = os.getloadavg()
    load.update(loadavg_1m=round(one, 2), loadavg_5m=round(five, 2), loadavg_15m=round(fifteen, 2))
    try:
        with open("/proc/pressure/cpu") as pressure:
            for line in pressure:
                if line.startswith("some"):
                    fields = dict(part.split("=") for part in line.split()[1:])
                    load["cpu_pressure_avg60_pct"] = float(fields["avg60"])
    except (OSError, KeyError, ValueError):
        pass
    return load


def echo_build() -> str:
    """ "compiled" when the transport's core runs from mypyc extensions, else "interpreted"."""
    # What the benchmark's processes import: the extensions if they are beside the sources.
    try:
        from echo.transport import compiled
    except ImportError:
        return "unknown"
    modules = compiled.COMPILED_MODULES
    return "compiled" if all(compiled.extension_paths(m) for m in modules) else "interpreted"


def cpu_model() -> str:
    """The processor's model name, from /proc/cpuinfo ("unknown" where there is none)."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def machine_info(
    load_before: Mapping[str, float], load_after: Mapping[str, float]
) -> dict[str, Any]:
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count() or 0,
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "os": f"{platform.system()} {platform.release()}",
        "echo_build": echo_build(),
        "load_before": dict(load_before),
        "load_after": dict(load_after),
    }


def git_commit(root: Path = REPO) -> str:
    """HEAD, with "-dirty" if tracked files other than the results themselves have changed."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            [
                "git",
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                ".",
                ":(exclude)bench/results",
                ":(exclude)docs/benchmarks.md",
            ],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if status else "")


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def metric_from_repeats(
    subject: str,
    name: str,
    unit: str,
    lower_is_better: bool,
    values: Sequence[float],
    baseline: tuple[str, str, Sequence[float]] | None = None,
    target: Mapping[str, Any] | None = None,
) -> Metric:
    """A Metric from per-repeat values; `baseline` is (subject, label, its per-repeat values)."""
    base = None
    if baseline is not None:
        base = Baseline(baseline[0], baseline[1], tuple(float(v) for v in baseline[2]))
    return Metric(
        subject=subject,
        name=name,
        unit=unit,
        better="lower" if lower_is_better else "higher",
        values=tuple(float(v) for v in values),
        baseline=base,
        target=target,
    )


# ------------------------------------------------------------------ from a runner's figures


class Figure(Protocol):
    """What the runners measure (bench.harness.Result has these)."""

    @property
    def name(self) -> str: ...
    @property
    def metric(self) -> str: ...
    @property
    def value(self) -> float: ...
    @property
    def unit(self) -> str: ...
    @property
    def baseline(self) -> tuple[str, str] | None: ...
    @property
    def lower_is_better(self) -> bool: ...
    @property
    def target(self) -> Any: ...


def baseline_label(subject: str) -> str:
    """How the report names a baseline: raw trio UDP, or the row of the same run it is."""
    return "raw trio UDP" if subject.startswith("raw_") else "another figure of the same run"


def from_repeats(
    *,
    bench_id: str,
    label: str,
    title: str,
    command: str,
    own: Sequence[tuple[str, str]],
    repeats: Sequence[Mapping[tuple[str, str], Figure]],
    machine: Mapping[str, Any],
    settings: Mapping[str, Any],
    commit: str | None = None,
    date: str | None = None,
    labels: Mapping[str, str] | None = None,
) -> tuple[BenchResult | None, list[str]]:
    """One benchmark's file from the figures of each repeat (each repeat: every figure of that
    repeat by (name, metric), the baselines' too); `own` lists the benchmark's own figures.

    A figure is kept if it and its baseline were measured in every repeat; the second value
    lists the ones left out and why. None if no figure is left. `labels` names baselines
    (by subject) for the report; by default `baseline_label`.
    """
    labels = labels or {}
    left_out: list[str] = []
    metrics: list[Metric] = []
    for key in own:
        if not all(key in repeat for repeat in repeats):
            left_out.append(f"{key[0]} {key[1]}: not measured in every repeat")
            continue
        figures = [repeat[key] for repeat in repeats]
        first = figures[0]
        base = None
        if first.baseline is not None:
            base_key = tuple(first.baseline)
            if not all(base_key in repeat for repeat in repeats):
                left_out.append(f"{key[0]} {key[1]}: its baseline {base_key} is missing")
                continue
            base = (
                base_key[0],
                labels.get(base_key[0]) or baseline_label(base_key[0]),
                [repeat[base_key].value for repeat in repeats],  # type: ignore[index]
            )
        target = None
        if first.target is not None:
            target = {
                "op": first.target.op,
                "threshold": float(first.target.threshold),
                "of": first.target.of,
                "note": first.target.note,
            }
        values = [figure.value for figure in figures]
        if not all(math.isfinite(v) for v in values) or (
            base is not None and not all(math.isfinite(v) for v in base[2])
        ):
            left_out.append(f"{key[0]} {key[1]}: not a finite number in some repeat")
            continue
        if base is not None and not all(base[2]):
            # a ratio to nothing is no figure (a short or starved run measured a zero baseline)
            left_out.append(f"{key[0]} {key[1]}: its baseline is 0 in some repeat")
            continue
        metrics.append(
            metric_from_repeats(
                key[0], key[1], first.unit, first.lower_is_better, values, base, target
            )
        )
    if not metrics:
        return None, left_out
    result = BenchResult(
        id=bench_id,
        label=label,
        title=title,
        command=command,
        date=date or utc_now(),
        commit=commit or git_commit(),
        repeats=len(repeats),
        machine=machine,
        metrics=tuple(metrics),
        settings=settings,
    )
    return result, left_out
