"""The compiled core against the interpreted one and raw trio UDP, in the same run.

    ./dev build && python -m bench.compiled [--reps 5] [--seconds 3] [--pin 0,1|none]

Every repetition measures, each in fresh processes and in a rotating order (so that drift on a
shared machine does not favour one): raw trio UDP, the transport interpreted
(ECHO_INTERPRETED=1) and the transport compiled, with bench/quick.py's B2 (64-byte one-way
messages/s) and B1 (echo round trips/s, p99), then micro-benchmarks of the compiled modules'
hot functions (frame encode/decode, log append/scan) in both builds. Prints the median and the
range over the repetitions, and the ratios taken within each repetition.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
import timeit
from collections.abc import Callable
from typing import Any

MODES = ("raw", "interpreted", "compiled")


# ------------------------------------------------------------------ workers (one process each)


def _check_build(mode: str) -> None:
    from echo.transport import compiled

    for name in compiled.COMPILED_MODULES:
        importlib.import_module(name)
    loaded = set(compiled.loaded_compiled().values())
    if loaded != {mode == "compiled"}:
        raise SystemExit(f"{mode} run imported compiled={loaded}: run ./dev build first")


def _micro() -> dict[str, float]:
    """CPU nanoseconds per call of the core's hot functions (best of 5)."""
    from echo.transport.core import frames, logbuffer

    sm = frames.StatusMessage(
        session_id=7,
        stream_id=1001,
        consumption_term_id=3,
        consumption_term_offset=4096,
        receiver_window=128 * 1024,
        receiver_id=0x1234,
    )
    sm_bytes = sm.encode()
    nak_bytes = frames.Nak(7, 1001, 3, 4096, 1408).encode()
    term = memoryview(bytearray(64 * 1024))
    payload = bytes(64)
    big = bytes(5000)
    tail = 0
    for _ in range(20):
        tail = logbuffer.append_message(
            term, tail, payload, 1376, session_id=7, stream_id=1001, term_id=3
        )
    datagram = bytes(term[:96])
    lengths = logbuffer.int_view(term, "i")
    fresh = memoryview(bytearray(64 * 1024))

    def append() -> None:
        logbuffer.append_message(fresh, 0, payload, 1376, session_id=7, stream_id=1001, term_id=3)

    def append_fragmented() -> None:
        logbuffer.append_message(fresh, 0, big, 1376, session_id=7, stream_id=1001, term_id=3)

    cases: dict[str, Callable[[], object]] = {
        "sm_encode": sm.encode,
        "sm_decode": lambda: frames.parse_datagram_untrusted(sm_bytes),
        "nak_decode": lambda: frames.parse_datagram_untrusted(nak_bytes),
        "data_decode_fast_path": lambda: frames.parse_data_untrusted(datagram),
        "data_decode_header": lambda: frames.parse_datagram_untrusted(datagram),
        "log_append_64B": append,
        "log_append_5000B_fragmented": append_fragmented,
        "log_scan_for_availability": lambda: logbuffer.scan_for_availability(
            lengths, 0, 1408, len(term)
        ),
        "log_rebuild_offset": lambda: logbuffer.rebuild_offset(lengths, 0, tail),
        "log_scan_for_gap": lambda: logbuffer.scan_for_gap(term, lengths, 0, tail + 1024),
    }
    result = {}
    for name, call in cases.items():
        # CPU time of this process, not wall time: on a shared machine the wall clock also
        # counts the time other processes had the core.
        timer = timeit.Timer(call, timer=time.process_time)
        number, _ = timer.autorange()
        best = min(timer.repeat(repeat=5, number=number)) / number
        result[name] = best * 1e9
    return result


class _Patient:
    """`time` for quick.py's echo runs: the same clock, a longer start-up allowance."""

    perf_counter = staticmethod(time.perf_counter)

    @staticmethod
    def sleep(seconds: float) -> None:
        time.sleep(max(seconds, 3.0))


def _worker(mode: str, seconds: float, pin: str | None) -> None:
    from bench import quick
    from bench.run import pin_cpus

    # The receiving side on one CPU and the sending side on another, as bench.run and
    # bench.quick place them (docs/benchmarking.md, "B2's raw baseline").
    quick.PIN = pin_cpus(pin)
    kind = "raw" if mode == "raw" else "transport"
    if mode != "raw":
        _check_build(mode)
    out: dict[str, Any] = {"one_way": quick._one_way(kind, seconds)}
    # quick.py gives its echo server 0.5 s to start; on a loaded machine a spawned process can
    # take longer to bind, and the raw client's first datagram meets ICMP port-unreachable.
    quick.time = _Patient  # type: ignore[assignment]
    try:
        out["echo"] = quick._echo(kind, seconds)
    finally:
        quick.time = time
    if mode != "raw":
        out["micro_ns"] = _micro()
    print(json.dumps(out))


# ------------------------------------------------------------------ the comparison


def _run(mode: str, seconds: float, pin: str | None) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("ECHO_INTERPRETED", None)
    if mode == "interpreted":
        env["ECHO_INTERPRETED"] = "1"  # inherited by quick.py's spawned processes too
    command = [sys.executable, "-m", "bench.compiled", "--worker", mode, "--seconds", str(seconds)]
    if pin is not None:
        command += ["--pin", pin]
    for attempt in range(3):
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode == 0:
            result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
            return result
        # quick.py's processes have fixed start-up allowances that a loaded machine can miss.
        print(f"{mode} run failed (attempt {attempt + 1}):\n{done.stderr[-1500:]}", file=sys.stderr)
    raise SystemExit(f"{mode}: three failed runs")


def _spread(values: list[float], fmt: str = "{:,.0f}") -> str:
    return (
        f"{fmt.format(statistics.median(values))} "
        f"({fmt.format(min(values))}-{fmt.format(max(values))})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--worker", choices=MODES)
    parser.add_argument("--json", help="also write every repetition's figures here")
    parser.add_argument(
        "--pin", default=None, help="CPUs for the receiving and the sending side (as bench.run)"
    )
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker, args.seconds, args.pin)
        return
    reps: list[dict[str, dict[str, Any]]] = []
    for rep in range(args.reps):
        order = MODES[rep % 3 :] + MODES[: rep % 3]
        figures = {}
        for mode in order:
            print(f"rep {rep + 1}/{args.reps}: {mode}", file=sys.stderr, flush=True)
            figures[mode] = _run(mode, args.seconds, args.pin)
        reps.append(figures)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(reps, out, indent=1)

    def col(mode: str, *path: str) -> list[float]:
        values = []
        for figures in reps:
            value: Any = figures[mode]
            for key in path:
                value = value[key]
            values.append(float(value))
        return values

    def ratio(a: list[float], b: list[float]) -> list[float]:
        return [x / y for x, y in zip(a, b, strict=True)]

    b2 = {m: col(m, "one_way", "messages_per_s") for m in MODES}
    b1 = {m: col(m, "echo", "round_trips_per_s") for m in MODES}
    p99 = {m: col(m, "echo", "p99_us") for m in MODES}
    print(f"\n{args.reps} repetitions of {args.seconds:g} s; median (min-max)\n")
    print("| measure | raw trio UDP | interpreted | compiled | compiled / interpreted |")
    print("|---|---|---|---|---|")
    for label, table in (("B2 64 B one-way, msg/s", b2), ("B1 echo round trips/s", b1)):
        print(
            f"| {label} | {_spread(table['raw'])} | {_spread(table['interpreted'])} | "
            f"{_spread(table['compiled'])} | "
            f"{_spread(ratio(table['compiled'], table['interpreted']), '{:.2f}')} x |"
        )
    print(
        f"| B1 echo p99 µs | {_spread(p99['raw'])} | {_spread(p99['interpreted'])} | "
        f"{_spread(p99['compiled'])} | "
        f"{_spread(ratio(p99['compiled'], p99['interpreted']), '{:.2f}')} x |"
    )
    for label, table in (("B2 / raw", b2), ("B1 / raw", b1)):
        print(
            f"| {label} | 1 | {_spread(ratio(table['interpreted'], table['raw']), '{:.2f}')} x"
            f" | {_spread(ratio(table['compiled'], table['raw']), '{:.2f}')} x | |"
        )
    print("\n| micro-benchmark, ns per call | interpreted | compiled | speedup |")
    print("|---|---|---|---|")
    for name in reps[0]["compiled"]["micro_ns"]:
        interp = col("interpreted", "micro_ns", name)
        comp = col("compiled", "micro_ns", name)
        print(
            f"| {name} | {_spread(interp)} | {_spread(comp)} | "
            f"{_spread(ratio(interp, comp), '{:.2f}')} x |"
        )


if __name__ == "__main__":
    main()
