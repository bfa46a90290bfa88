"""B1 and B2 with encryption required, next to the same rows in the clear and raw trio UDP, in
one run; and the server's CPU per admission (the handshake) with and without.

    python -m bench.encrypted_bench [--repeats 5] [--seconds 3]

Every repeat measures, in this order (which mode goes first alternates between repeats, so
neither always meets the same moment of a noisy machine):

1. raw trio UDP: `raw_echo_64` round trips and `raw_oneway_64` datagrams (bench.baselines);
2. for each mode, `off` and `required`, one `echo-server --key K --encryption MODE` process:
   - B1, `session_echo_64_<mode>`: one session (`echo.session.connect`, pinning the key when
     encrypted) echoing 64-byte ``ECHO`` messages one at a time: round trips/s, and the
     server's CPU per round trip from /proc around exactly the echoing;
   - the handshake, `handshake_<mode>`: `HANDSHAKES` sessions opened and closed one after
     the other; the server's CPU per admission (HELLO to CONNECT, the duologue opened and,
     with encryption, the key agreement; and closed again);
3. for each mode, B2, `session_oneway_64_<mode>`: a session server in its own process that
   counts what arrives, and one session sending 64-byte messages as fast as the session's
   flow control lets it for `--seconds`; messages/s as the server received them, and the
   server process's CPU per message.

The encrypted rows' baselines are the same rows in the clear of the same repeats; the targets
are the issue's: round trips/s >= 0.85 x, server CPU per message <= 1.3 x. The load average
is recorded before and after (bench/results/encrypted.json, then ./dev bench-report).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

import trio

import echo.session as es
from bench import baselines
from bench import results as result_files
from bench.crypto_bench import cpu_seconds, echo_run, start_server
from bench.harness import Child, Control, Settings
from echo.session import crypto
from tests.ports import free_base

SIZE = 64
HANDSHAKES = 40
MODES = ("off", "required")
BENCH_ID = "encrypted"
LABEL = "B1/B2 enc"
TITLE = (
    "B1 and B2 with encryption required vs in the clear vs raw trio UDP, 64 B; the handshake's "
    "server CPU per admission"
)


# ------------------------------------------------------------------ the handshake


async def handshakes(base: int, pid: int, server_key: str | None, count: int) -> float:
    """Server CPU µs per admission over `count` sessions opened and closed in turn."""
    async def one() -> None:
        async with es.connect(
            "127.0.0.1", base, base + 1, timeout=10.0, server_key=server_key, resume=False,
            duologue_ports="shared",
        ) as session:  # fmt: skip
            await session.send(b"ECHO hi")
            await session.receive()

    await one()  # warm-up: the server's first admission pays for imports and caches
    cpu0 = cpu_seconds(pid)
    for _ in range(count):
        await one()
    return (cpu_seconds(pid) - cpu0) / count * 1e6


# ------------------------------------------------------------------ B2: a session sink


def session_sink(ctl: Control, pem: bytes, mode: str, limit: float) -> dict[str, Any]:
    """A session server (its own process) that counts the messages of one session."""
    return trio.run(_session_sink, ctl, pem, mode, limit)


async def _session_sink(ctl: Control, pem: bytes, mode: str, limit: float) -> dict[str, Any]:
    base = free_base(6)
    config = es.ServerConfig(
        port=base, control_port=base + 1, clients_base_port=base + 2, max_clients=2,
        max_per_ip=2, duologue_ports="shared", key=es.ServerKey.from_bytes(pem),
        encryption=mode,
    )  # fmt: skip
    out: dict[str, Any] = {}
    finished = trio.Event()

    async def count(session: es.Session) -> None:
        first = await session.receive()
        assert first != b"DONE"
        cpu0, t0, n = time.process_time(), time.perf_counter(), 0
        while await session.receive() != b"DONE":
            n += 1
        out.update(count=n, cpu=time.process_time() - cpu0, elapsed=time.perf_counter() - t0)
        await session.send(b"%d" % n)
        finished.set()
        await session.receive()  # until the client goes

    server = es.SessionServer(config, count)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        ctl.ready(base)
        with trio.fail_after(limit):
            await finished.wait()
        nursery.cancel_scope.cancel()
    return out


async def blast(base: int, server_key: str | None, seconds: float) -> int:
    message = b"x" * SIZE
    async with es.connect(
        "127.0.0.1", base, base + 1, timeout=10.0, server_key=server_key, resume=False,
        duologue_ports="shared",
    ) as session:  # fmt: skip
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            await session.send(message)
        await session.send(b"DONE")
        return int(await session.receive())


def oneway(pem: bytes, pin: str, mode: str, seconds: float) -> tuple[float, float]:
    """(messages/s the server received, its CPU µs per message)."""
    with Child(f"session sink ({mode})", session_sink, pem, mode, seconds + 60) as sink:
        base = sink.wait_ready()
        key = pin if mode == "required" else None
        sent = trio.run(blast, base, key, seconds)
        got = sink.result(60)
    if got["count"] != sent or not got["count"]:
        raise RuntimeError(f"one-way {mode}: the server counted {got['count']}, sent {sent}")
    return got["count"] / got["elapsed"], got["cpu"] / got["count"] * 1e6


# ------------------------------------------------------------------ one repeat


def one_repeat(rep: int, key_path: str, key: crypto.ServerKey, seconds: float) -> dict[str, float]:
    figures: dict[str, float] = {}
    settings = Settings(duration=seconds, quick=False)
    for result in baselines.raw_echo(settings, SIZE) + baselines.raw_oneway(settings, (SIZE,)):
        figures[f"{result.name} {result.metric}"] = result.value
    modes = MODES if rep % 2 == 0 else MODES[::-1]
    pem = key.to_pem()
    for mode in modes:
        pin = key.fingerprint if mode == "required" else None
        server, base = start_server(key_path, mode)
        try:
            rate, cpu = trio.run(echo_run, base, server.pid, pin, seconds, SIZE)
            figures[f"session_echo_64_{mode} round trips/s"] = rate
            figures[f"session_echo_64_{mode} server CPU/round trip"] = cpu
            figures[f"handshake_{mode} server CPU/admission"] = trio.run(
                handshakes, base, server.pid, pin, HANDSHAKES
            )
        finally:
            server.terminate()
            server.wait()
    for mode in modes:
        rate, cpu = oneway(pem, key.fingerprint, mode, seconds)
        figures[f"session_oneway_64_{mode} messages/s"] = rate
        figures[f"session_oneway_64_{mode} server CPU/message"] = cpu
    return figures


# ------------------------------------------------------------------ the result file

RAW = "raw trio UDP"
PLAIN = "the same row in the clear"
#: (subject, metric, unit, lower is better, baseline subject and label, target)
ROWS: tuple[tuple[str, str, str, bool, tuple[str, str] | None, Mapping[str, Any] | None], ...] = (
    ("raw_echo_64", "round trips/s", "RT/s", False, None, None),
    ("session_echo_64_off", "round trips/s", "RT/s", False, ("raw_echo_64", RAW), None),
    (
        "session_echo_64_required", "round trips/s", "RT/s", False,
        ("session_echo_64_off", PLAIN),
        {"op": ">=", "threshold": 0.85, "of": "ratio", "note": "x the same row in the clear"},
    ),
    ("session_echo_64_off", "server CPU/round trip", "µs", True, None, None),
    (
        "session_echo_64_required", "server CPU/round trip", "µs", True,
        ("session_echo_64_off", PLAIN),
        {"op": "<=", "threshold": 1.3, "of": "ratio", "note": "x the same row in the clear"},
    ),
    ("raw_oneway_64", "datagrams/s", "dgram/s", False, None, None),
    ("session_oneway_64_off", "messages/s", "msg/s", False, ("raw_oneway_64", RAW), None),
    (
        "session_oneway_64_required", "messages/s", "msg/s", False,
        ("session_oneway_64_off", PLAIN), None,
    ),
    ("session_oneway_64_off", "server CPU/message", "µs", True, None, None),
    (
        "session_oneway_64_required", "server CPU/message", "µs", True,
        ("session_oneway_64_off", PLAIN),
        {"op": "<=", "threshold": 1.3, "of": "ratio", "note": "x the same row in the clear"},
    ),
    ("handshake_off", "server CPU/admission", "µs", True, None, None),
    (
        "handshake_required", "server CPU/admission", "µs", True,
        ("handshake_off", PLAIN), None,
    ),
)  # fmt: skip


def result_file(
    repeats: Sequence[Mapping[str, float]],
    settings: Mapping[str, Any],
    load_before: Mapping[str, float],
    load_after: Mapping[str, float],
) -> result_files.BenchResult:
    metrics = []
    for subject, metric, unit, lower, base, target in ROWS:
        values = [r[f"{subject} {metric}"] for r in repeats]
        baseline = None
        if base is not None:
            baseline = (base[0], base[1], [r[f"{base[0]} {metric_of(base[0], metric)}"]
                                           for r in repeats])
        metrics.append(
            result_files.metric_from_repeats(
                subject, metric, unit, lower, values, baseline, target
            )
        )
    return result_files.BenchResult(
        id=BENCH_ID,
        label=LABEL,
        title=TITLE,
        command=f"python -m bench.encrypted_bench --repeats {len(repeats)} "
        f"--seconds {settings['seconds']:g}",
        date=result_files.utc_now(),
        commit=result_files.git_commit(),
        repeats=len(repeats),
        machine=result_files.machine_info(load_before, load_after),
        metrics=tuple(metrics),
        settings=settings,
    )


def metric_of(subject: str, metric: str) -> str:
    """The baseline's own metric name: raw rows count datagrams, sessions messages."""
    if subject == "raw_oneway_64":
        return "datagrams/s"
    return metric


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    load_before = result_files.system_load()
    loads: list[dict[str, float]] = []
    repeats: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as scratch:
        key_path = os.path.join(scratch, "server.key")
        key = crypto.generate_key_file(key_path)
        for rep in range(args.repeats):
            repeats.append(one_repeat(rep, key_path, key, args.seconds))
            loads.append(result_files.system_load())
            print(f"repeat {rep + 1}/{args.repeats} done, load {loads[-1]}", file=sys.stderr)
    settings = {
        "seconds": args.seconds,
        "size": SIZE,
        "handshakes_per_repeat": HANDSHAKES,
        "loadavg_1m_after_each_repeat": [load["loadavg_1m"] for load in loads],
    }
    result = result_file(repeats, settings, load_before, result_files.system_load())
    for m in result.metrics:
        line = f"{m.subject:28s} {m.name:22s} median {m.median:10.1f} {m.unit:6s} "
        line += f"(min {min(m.values):.1f}, max {max(m.values):.1f})"
        if m.ratio is not None:
            line += f"  x{m.ratio:.3f} of {m.baseline.subject if m.baseline else ''}"
        if m.target is not None:
            line += f"  target {m.target['op']} {m.target['threshold']}: "
            line += "met" if m.target_met() else "missed"
        print(line)
    print("load averages (1 min) after each repeat:", settings["loadavg_1m_after_each_repeat"])
    if not args.no_write:
        print("wrote", result.write())
    return 0


if __name__ == "__main__":
    sys.exit(main())
