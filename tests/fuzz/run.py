"""Run the parser harnesses under atheris (libFuzzer, coverage-guided), each in its own process.

    python -m tests.fuzz                         # every harness, 100,000 executions each
    python -m tests.fuzz lobby_protocol --runs 1000000
    python -m tests.fuzz --seconds 600           # every harness for 10 minutes
    ./dev fuzz ...                               # the same, after setting up the `fuzz` extra

Each harness starts from its committed seed corpus (``tests/fuzz/corpus/<name>/``, read only)
and a working corpus that keeps what the fuzzer learns between runs (``.fuzz/<name>/``, not
committed); a crash is written to ``.fuzz/crashes/<name>-crash-<sha1>`` and its traceback
printed. Prints a table per harness (executions, seconds, crashes) and exits 1 if any crashed.

atheris instruments the modules imported after it starts, so the harnesses (and echo) are
imported only in the child process, under `atheris.instrument_imports`. A compiled transport
core (mypyc, ``./dev build``) runs but is not instrumented: fuzz the interpreted tree.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import attrs

from tests.fuzz.registry import COVERS

REPO = Path(__file__).resolve().parents[2]
CORPUS = Path(__file__).resolve().parent / "corpus"
WORK = REPO / ".fuzz"
#: An input that takes longer than this is a finding too (every parser claims O(input)).
TIMEOUT_SECONDS = 10
_EXECUTED = re.compile(r"stat::number_of_executed_units: (\d+)")


@attrs.frozen
class Result:
    name: str
    executions: int
    seconds: float
    crashed: bool
    crash_file: str | None
    output: str


def names() -> list[str]:
    """The registered harnesses (from the registry, without importing echo here)."""
    return list(COVERS)


def run_one(
    name: str,
    *,
    runs: int | None,
    seconds: float | None,
    work: Path | None,
    extra: list[str] = [],  # noqa: B006 - never mutated
) -> Result:
    """Fuzz harness `name` in a child process until `runs` executions or `seconds` pass.

    `work` is the working corpus directory (None: a temporary one, thrown away).
    """
    crashes = (work.parent if work is not None else WORK) / "crashes"
    crashes.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"fuzz-{name}-") as scratch:
        corpus = work if work is not None else Path(scratch)
        corpus.mkdir(parents=True, exist_ok=True)
        flags = [
            f"-artifact_prefix={crashes}/{name}-",
            f"-timeout={TIMEOUT_SECONDS}",
            "-print_final_stats=1",
            *extra,
        ]
        if runs is not None:
            flags.append(f"-runs={runs}")
        if seconds is not None:
            flags.append(f"-max_total_time={max(1, round(seconds))}")
        command = [sys.executable, "-m", "tests.fuzz.run", "--child", name, *flags]
        # libFuzzer writes new inputs to the first directory only: the seeds stay as committed.
        command += [str(corpus), str(CORPUS / name)]
        started = time.monotonic()
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
        elapsed = time.monotonic() - started
    output = done.stdout + done.stderr
    found = _EXECUTED.search(output)
    crash = re.search(r"Test unit written to (\S+)", output)
    return Result(
        name=name,
        executions=int(found.group(1)) if found else 0,
        seconds=round(elapsed, 1),
        crashed=done.returncode != 0,
        crash_file=crash.group(1) if crash else None,
        output=output,
    )


def _echo_modules() -> list[str]:
    """Every module of the echo package, by name."""
    package = REPO / "echo"
    out = []
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        out.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return out


def _child(name: str, argv: list[str]) -> None:
    import atheris  # the `fuzz` extra (and `test`)

    # atheris includes whole top-level packages: the rest of echo is excluded by name.
    others = [m for m in _echo_modules() if m not in COVERS[name]]
    with atheris.instrument_imports(include=["echo"], exclude=others):
        from tests.fuzz.harnesses import HARNESSES
    harness = HARNESSES[name]
    atheris.Setup([f"fuzz-{name}", *argv], harness)
    atheris.Fuzz()


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--child"]:
        _child(args[1], args[2:])
        return 0  # pragma: no cover - atheris.Fuzz() exits the process
    known = names()
    parser = argparse.ArgumentParser(
        prog="./dev fuzz", description="Run echo's parser fuzzers (atheris)."
    )
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"of: {', '.join(known)}")
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--runs", type=int, help="executions per harness (default 100000)")
    budget.add_argument("--seconds", type=float, help="wall-clock seconds per harness")
    parser.add_argument(
        "--jobs", type=int, default=1, help="harnesses run side by side (default 1)"
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON too")
    options = parser.parse_args(args)
    unknown = [n for n in options.names if n not in known]
    if unknown:
        parser.error(f"unknown harness {', '.join(unknown)}; known: {', '.join(known)}")
    if (options.runs is not None and options.runs < 1) or (
        options.seconds is not None and options.seconds <= 0
    ):
        parser.error("--runs and --seconds must be positive")
    runs = options.runs if options.runs is not None or options.seconds else 100_000
    if options.jobs < 1:
        parser.error("--jobs must be positive")
    print(f"{'harness':<18} {'executions':>12} {'seconds':>9} {'exec/s':>8}  crashes", flush=True)
    with ThreadPoolExecutor(options.jobs) as pool:
        running = [
            pool.submit(run_one, name, runs=runs, seconds=options.seconds, work=WORK / name)
            for name in options.names or known
        ]
        results = [_report(future.result()) for future in running]
    if options.json:
        print(
            json.dumps([attrs.asdict(r, filter=lambda a, _: a.name != "output") for r in results])
        )
    return 1 if any(r.crashed for r in results) else 0


def _report(result: Result) -> Result:
    """Print one harness's row (and its crash), in the order the harnesses were named."""
    rate = result.executions / result.seconds if result.seconds else 0.0
    print(
        f"{result.name:<18} {result.executions:>12,} {result.seconds:>9.1f} {rate:>8,.0f}  "
        f"{1 if result.crashed else 0}",
        flush=True,
    )
    if result.crashed:
        start = result.output.find("=== Uncaught")
        print(
            result.output[start:][:4000] if start >= 0 else result.output[-4000:], file=sys.stderr
        )
        print(f"  the input: {result.crash_file}", file=sys.stderr)
    return result


if __name__ == "__main__":
    sys.exit(main())
