"""Run the benchmark suite and print the table.

    python -m bench.run [--quick] [--only NAME,...] [--duration S] [--pin 0,1|none]
                        [--repeats N] [--results-dir DIR] [--list]

Runs the selected benchmarks N times (`--repeats`, default 1), all of them once per repeat, so
that each repeat measures a benchmark and its baselines side by side. Writes, for every
benchmark that ran (the raw baselines are in their dependents' files):

- DIR/<name>.json: its figures over the repeats, each with the same-run baseline, the ratio
  and the machine (bench/results.py; `./dev bench-report` makes docs/benchmarks.md of them);
- DIR/runs/<timestamp>.json per repeat (every figure with its extra fields) and DIR/latest.md
  (the last repeat's table, printed at the end), which are not kept in git.

DIR defaults to bench/results; a `--quick` run writes no DIR/<name>.json there (smoke figures
are not results) unless DIR is given. Exit status 1 if any benchmark failed; skips (a peer
package not installed) are notes, not failures.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

from bench import harness
from bench import results as result_files
from bench.harness import (
    RESULTS_DIR,
    BenchError,
    Result,
    Settings,
    Skip,
    busy_warning,
    system_load,
    write_reports,
)
from bench.suite import BENCHMARKS

DEFAULT_DURATION = 5.0
#: --quick: a smoke run (the test suite uses it): long enough for every code path, including
#: warm-up and the back-pressure of the one-way runs, short enough for CI.
QUICK_DURATION = 0.5


def select(only: str | None) -> list[str]:
    """The names to run, in registry order, with the baselines they compare to added."""
    if not only:
        return list(BENCHMARKS)
    wanted = {name.strip() for name in only.split(",") if name.strip()}
    unknown = wanted - BENCHMARKS.keys()
    if unknown:
        raise SystemExit(
            f"unknown benchmark(s): {', '.join(sorted(unknown))}; known: {', '.join(BENCHMARKS)}"
        )
    for name in list(wanted):
        wanted.update(BENCHMARKS[name].needs)
    return [name for name in BENCHMARKS if name in wanted]


def pin_cpus(option: str | None) -> tuple[int, ...]:
    """The CPUs to pin to: as given, none for 'none', else two of the allowed ones."""
    if option is not None:
        if option.strip().lower() == "none":
            return ()
        return tuple(int(cpu) for cpu in option.split(",") if cpu.strip())
    allowed = sorted(os.sched_getaffinity(0))
    return tuple(allowed[:2]) if len(allowed) >= 2 else ()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.run", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: a few seconds in all")
    parser.add_argument("--only", help="comma-separated names (see --list)")
    parser.add_argument("--duration", type=float, help="seconds per measurement (default 5)")
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=None,
        help="where the result files go (default bench/results)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="run the selection this many times; the result files keep every repeat's figure "
        "and the median, spread and ratio to the same repeat's baseline (default 1)",
    )
    parser.add_argument(
        "--pin",
        default=None,
        help="CPUs for the two sides of each benchmark, e.g. 0,1 (the default when two are "
        "available: first side on one core, second on the other); 'none' leaves placement "
        "to the scheduler",
    )
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    args = parser.parse_args(argv)
    if args.list:
        for name, benchmark in BENCHMARKS.items():
            print(f"{name:18} {benchmark.about}")
        return 0
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    duration = args.duration or (QUICK_DURATION if args.quick else DEFAULT_DURATION)
    load_before = system_load()
    load_avg_before = result_files.system_load()
    warning = busy_warning({"before": load_before})
    if warning:
        print(warning.replace("**", ""), file=sys.stderr, flush=True)
    cpus = pin_cpus(args.pin)
    settings = Settings(duration=duration, quick=args.quick, pin=cpus)
    directory = args.results_dir or RESULTS_DIR
    names = select(args.only)
    repeats: list[dict[str, list[Result]]] = []
    failed: dict[str, str] = {}
    table = ""
    for repeat in range(args.repeats):
        if args.repeats > 1:
            print(f"== repeat {repeat + 1} of {args.repeats}", file=sys.stderr, flush=True)
        produced, skipped, failed_now = run_once(names, settings, cpus)
        repeats.append(produced)
        failed.update({f"{name} (repeat {repeat + 1})": why for name, why in failed_now.items()})
        json_path, md_path, table = write_reports(
            [r for results in produced.values() for r in results],
            skipped,
            failed_now,
            settings,
            directory,
            load_before if repeat == 0 else system_load(),
        )
        print(f"wrote {json_path}", file=sys.stderr)
    print(table)
    print(f"wrote {md_path}")
    if args.quick and args.results_dir is None:
        print("a --quick run: no result files written (give --results-dir to have them)")
    else:
        argv_used = sys.argv[1:] if argv is None else argv
        command = shlex.join(["python", "-m", "bench.run", *argv_used])
        for path in write_result_files(
            names, repeats, settings, args.repeats, command, directory, load_avg_before
        ):
            print(f"wrote {path}")
    return 1 if failed else 0


def run_once(
    names: list[str], settings: Settings, cpus: tuple[int, ...]
) -> tuple[dict[str, list[Result]], dict[str, str], dict[str, str]]:
    """Every benchmark in `names` once: their figures by benchmark, the skipped, the failed."""
    produced: dict[str, list[Result]] = {}
    skipped: dict[str, str] = {}
    failed: dict[str, str] = {}
    for name in names:
        print(f"== {name} ({BENCHMARKS[name].about})", file=sys.stderr, flush=True)
        started = time.monotonic()
        # Every benchmark starts its first side on the first CPU listed.
        harness.pin(cpus)
        try:
            produced[name] = BENCHMARKS[name](settings)
        except Skip as note:
            skipped[name] = str(note)
            print(f"   skipped: {note}", file=sys.stderr, flush=True)
            continue
        except BenchError as error:
            # One broken benchmark should not cost the others' figures: record it and go on.
            failed[name] = str(error)
            print(f"   FAILED: {error}", file=sys.stderr, flush=True)
            continue
        for result in produced[name]:
            print(
                f"   {result.name} {result.metric}: {result.value:,.1f} {result.unit}",
                file=sys.stderr,
                flush=True,
            )
        print(f"   ({time.monotonic() - started:.1f} s)", file=sys.stderr, flush=True)
    return produced, skipped, failed


def write_result_files(
    names: list[str],
    repeats: list[dict[str, list[Result]]],
    settings: Settings,
    asked: int,
    command: str,
    directory: Path,
    load_before: dict[str, float],
) -> list[Path]:
    """bench/results/<name>.json for every benchmark with a figure that is not itself raw.

    A benchmark's file holds the repeats in which it and the benchmarks it needs all ran.
    """
    machine = result_files.machine_info(load_before, result_files.system_load())
    written = []
    for name in names:
        benchmark = BENCHMARKS[name]
        complete = [
            repeat
            for repeat in repeats
            if name in repeat and all(need in repeat for need in benchmark.needs)
        ]
        if not complete:
            continue
        own = [(r.name, r.metric) for r in complete[0][name]]
        if all(r.raw for r in complete[0][name]):
            continue  # a baseline: its figures are in the files of those compared to it
        by_key = [
            {(r.name, r.metric): r for results in repeat.values() for r in results}
            for repeat in complete
        ]
        record, left_out = result_files.from_repeats(
            bench_id=name,
            label=benchmark.label,
            title=benchmark.about,
            command=command,
            own=own,
            repeats=by_key,
            machine=machine,
            settings={
                "duration_s": settings.duration,
                "quick": settings.quick,
                "pinned_cpus": list(settings.pin),
                "repeats_asked": asked,
            },
        )
        for note in left_out:
            print(f"{name}: left out of its result file: {note}", file=sys.stderr)
        if record is not None:
            written.append(record.write(directory))
    return written


if __name__ == "__main__":
    sys.exit(main())
