"""Run the benchmark suite and print the table.

    python -m bench.run [--quick] [--only NAME,...] [--duration S] [--pin 0,1|none]
                        [--results-dir DIR] [--list]

Writes DIR/<timestamp>.json (every figure, its extra fields, machine info) and DIR/latest.md
(the table printed at the end). DIR defaults to bench/results. Exit status 1 if any benchmark
failed; skips (a peer package not installed) are notes, not failures.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from bench import harness
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
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
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
    duration = args.duration or (QUICK_DURATION if args.quick else DEFAULT_DURATION)
    load_before = system_load()
    warning = busy_warning({"before": load_before})
    if warning:
        print(warning.replace("**", ""), file=sys.stderr, flush=True)
    cpus = pin_cpus(args.pin)
    settings = Settings(duration=duration, quick=args.quick, pin=cpus)
    results: list[Result] = []
    skipped: dict[str, str] = {}
    failed: dict[str, str] = {}
    for name in select(args.only):
        print(f"== {name} ({BENCHMARKS[name].about})", file=sys.stderr, flush=True)
        started = time.monotonic()
        # Every benchmark starts its first side on the first CPU listed.
        harness.pin(cpus)
        try:
            produced = BENCHMARKS[name](settings)
        except Skip as note:
            skipped[name] = str(note)
            print(f"   skipped: {note}", file=sys.stderr, flush=True)
            continue
        except BenchError as error:
            # One broken benchmark should not cost the others' figures: record it and go on.
            failed[name] = str(error)
            print(f"   FAILED: {error}", file=sys.stderr, flush=True)
            continue
        results.extend(produced)
        for result in produced:
            print(
                f"   {result.name} {result.metric}: {result.value:,.1f} {result.unit}",
                file=sys.stderr,
                flush=True,
            )
        print(f"   ({time.monotonic() - started:.1f} s)", file=sys.stderr, flush=True)
    json_path, md_path, table = write_reports(
        results, skipped, failed, settings, args.results_dir, load_before
    )
    print(table)
    print(f"wrote {json_path} and {md_path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
