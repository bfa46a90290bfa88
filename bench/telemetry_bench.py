"""Benchmark: generate a synthetic event log, then analyse it with `echo-analyze` in local mode.

    python bench/telemetry_bench.py                 # 10 million events
    python bench/telemetry_bench.py --events 1000000 --keep /tmp/bench

Prints the generation time, the analysis wall time and the peak resident memory of the analysis
(the Python driver plus the JVM it starts, sampled from /proc every 100 ms, summed over the
process tree), and checks the job's counts against the generator's ground truth.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

from echo.telemetry.generate import generate


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def _rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _tree_rss(root: int) -> tuple[int, int]:
    """(RSS of root, RSS of all its descendants) in KiB."""
    rest, stack = 0, _children(root)
    while stack:
        pid = stack.pop()
        rest += _rss_kib(pid)
        stack.extend(_children(pid))
    return _rss_kib(root), rest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--keep", help="directory to keep the log and the output in")
    args = parser.parse_args()

    work = args.keep or tempfile.mkdtemp(prefix="echo-telemetry-bench-")
    os.makedirs(work, exist_ok=True)
    log_path = os.path.join(work, "events.jsonl")
    out_dir = os.path.join(work, "out")

    began = time.monotonic()
    truth = generate(
        log_path, events=args.events, seed=args.seed, servers=args.servers, days=args.days
    )
    gen_s = time.monotonic() - began
    size_mb = os.path.getsize(log_path) / 1e6
    print(f"generate: {truth.lines_total:,} lines, {size_mb:,.0f} MB in {gen_s:.1f} s", flush=True)

    command = [
        sys.executable,
        "-m",
        "echo.telemetry.cli",
        log_path,
        "--out",
        out_dir,
        "--master",
        args.master,
        "--driver-memory",
        args.driver_memory,
    ]
    peak = {"total": 0, "python": 0, "jvm": 0}
    began = time.monotonic()
    proc = subprocess.Popen(command)
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            python, jvm = _tree_rss(proc.pid)
            if python + jvm > peak["total"]:
                peak.update(total=python + jvm, python=python, jvm=jvm)
            done.wait(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    code = proc.wait()
    wall = time.monotonic() - began
    done.set()
    sampler.join()
    if code != 0:
        sys.exit(f"echo-analyze failed with exit status {code}")

    with open(os.path.join(out_dir, "summary.json")) as f:
        summary = json.load(f)
    expected = truth.expected_summary()
    wrong = [k for k, v in expected.items() if summary.get(k) != v]
    mib = 1024
    print(
        f"analyse:  {summary['events_total']:,} events in {wall:.1f} s wall "
        f"({summary['events_total'] / wall:,.0f} events/s)\n"
        f"peak RSS: {peak['total'] / mib:,.0f} MiB "
        f"(python {peak['python'] / mib:,.0f} MiB + JVM {peak['jvm'] / mib:,.0f} MiB)\n"
        f"ground truth: {'all counts match' if not wrong else 'MISMATCH in ' + ', '.join(wrong)}"
    )
    print(f"output in {work}")
    if wrong:
        sys.exit(1)


if __name__ == "__main__":
    main()
