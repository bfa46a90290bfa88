"""B4: N concurrent Echo 2.0 clients against one echo-server process.

    python -m bench.scale [--clients 100,500,1000] [--seconds 30] [--processes 4] [--pin 0,1]
    python -m bench.run --only scale [--quick]

The server is `python -m echo.server.cli` in its own process. The clients share a few
processes, as a library user would run them (many `EchoClient`s in one trio program); each
client echoes once a second. Per N:

1. handshake: all N clients start within the same second (each at a random moment of it);
   handshakes/s = clients connected / time from the start until the last one's first echo;
2. steady state: once every client has connected (or failed), the clients echo for
   `--seconds`; the server's CPU (% of one core, from /proc) and the clients' echo round trips
   are taken from `min(5, seconds / 4)` seconds into that phase to its end, the server's RSS
   at its end.

With `--pin A,B,...` the server runs on CPU A and the client processes on the others: the
server's figures are then its own, not shared with the clients it serves. Raises
RLIMIT_NOFILE (every client holds a few UDP sockets) for itself and its children.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import random
import resource
import time
import traceback
from collections.abc import Sequence
from typing import Any

import trio

from bench.duologue_bench import start_server
from bench.harness import (
    BenchError,
    Result,
    Settings,
    Target,
    cpu_seconds_of,
    format_figure,
    percentile,
)

DEFAULT_CLIENTS = (100, 500, 1000)
DEFAULT_SECONDS = 30.0
#: `bench.run --quick`: one small N, a few seconds, so the smoke run stays short.
QUICK_CLIENTS = (20,)
QUICK_SECONDS = 3.0
PROCESSES = 4
#: Every wait of a client (connect, CONNECT reply, echo) is bounded by this; at 1,000 clients
#: starting at once the handshakes may take tens of seconds.
CLIENT_TIMEOUT = 60.0
#: The issue's goals, at 1,000 clients.
TARGET_CLIENTS = 1000
TARGETS: dict[str, Target] = {
    "handshakes/s": Target(">=", 200),
    "server CPU": Target("<=", 60),
    "server RSS": Target("<=", 600e6 / 2**20, note="600 MB"),
    "echo p99": Target("<=", 20),
}


def raise_fd_limit() -> int:
    """Soft RLIMIT_NOFILE up to the hard limit (children inherit it); returns the new soft."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 65536
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        target = soft
    return target


# ------------------------------------------------------------------ client processes


def client_process(
    index: int, port: int, control_port: int, count: int, out: Any, go: Any, stop: Any
) -> None:
    try:
        raise_fd_limit()
        # Imported before "ready": the handshake clock starts after every process is loaded.
        import echo.client.client  # noqa: F401

        out.put(("ready", index, None))
        go.wait()
        summary = trio.run(_clients, index, port, control_port, count, out, stop)
        out.put(("done", index, summary))
    except BaseException:
        out.put(("error", index, traceback.format_exc()))


async def _clients(
    index: int, port: int, control_port: int, count: int, out: Any, stop: Any
) -> dict[str, Any]:
    from echo.client.client import ClientConfig, EchoClient
    from echo.client.machine import EchoReceived
    from echo.log import configure_logging

    configure_logging("console", "warning")
    jitter = random.Random(index)
    connected: list[float] = []
    rtts: list[tuple[float, float]] = []
    failures: list[str] = []
    settled = 0

    def settle() -> None:
        # Connected or failed: the parent starts the steady state when every client is one.
        nonlocal settled
        settled += 1
        if settled == count:
            out.put(("settled", index, time.time()))

    async def one() -> None:
        # Clients start within the same second, not the same microsecond: a thousand echoes
        # fired in lock-step every second measure the queue, not the server.
        await trio.sleep(jitter.uniform(0.0, 1.0))
        first = True

        def on_echo(echo: EchoReceived) -> None:
            nonlocal first
            now = time.time()
            if first:
                first = False
                connected.append(now)
                settle()
            rtts.append((now, echo.rtt))

        client = EchoClient(
            ClientConfig(
                port=port, control_port=control_port, interval=1.0, timeout=CLIENT_TIMEOUT
            ),
            on_echo=on_echo,
        )
        machine = await client.run()
        if machine.failure is not None:
            failures.append(machine.failure.message)
            if first:
                settle()

    async with trio.open_nursery() as nursery:
        for _ in range(count):
            nursery.start_soon(one)
        # The parent ends the run (the clients echo until then).
        await trio.to_thread.run_sync(stop.wait, abandon_on_cancel=True)
        nursery.cancel_scope.cancel()
    return {"connected": connected, "rtts": rtts, "failures": failures}


class _Workers:
    """The client processes and the queue they report on."""

    def __init__(self, clients: int, processes: int, port: int, control_port: int) -> None:
        ctx = mp.get_context("spawn")
        self.out: Any = ctx.Queue()
        self.go = ctx.Event()
        self.stop = ctx.Event()
        per = [
            clients // processes + (1 if i < clients % processes else 0) for i in range(processes)
        ]
        self.processes = [
            ctx.Process(
                target=client_process,
                args=(i, port, control_port, n, self.out, self.go, self.stop),
                name=f"scale clients {i}",
                daemon=True,
            )
            for i, n in enumerate(per)
            if n
        ]

    def start(self, cpus: set[int] | None) -> None:
        for process in self.processes:
            process.start()
            if cpus:
                os.sched_setaffinity(process.pid, cpus)  # type: ignore[arg-type]

    def expect(self, kind: str, timeout: float, *, partial_ok: bool = False) -> dict[int, Any]:
        """One `kind` message from every process: {index: payload}.

        BenchError if a process failed or died, or on the timeout unless `partial_ok` (then
        what came in time is returned).
        """
        got: dict[int, Any] = {}
        deadline = time.monotonic() + timeout
        while len(got) < len(self.processes):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if partial_ok:
                    return got
                raise BenchError(f"scale: {len(got)} of {len(self.processes)} said {kind!r}")
            try:
                message, index, payload = self.out.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                dead = [p.name for p in self.processes if not p.is_alive()]
                if dead and self.out.empty():
                    raise BenchError(f"scale: {', '.join(dead)} exited before {kind!r}") from None
                continue
            if message == "error":
                raise BenchError(f"scale: client process {index} failed:\n{payload}")
            if message == kind:
                got[index] = payload
        return got

    def cpu_seconds(self) -> float:
        return sum(cpu_seconds_of(p.pid) for p in self.processes if p.pid is not None)

    def kill(self) -> None:
        for process in self.processes:
            if process.is_alive():
                process.kill()
            process.join(5)


def run(
    clients: int, seconds: float, processes: int = PROCESSES, cpus: Sequence[int] = ()
) -> dict[str, Any]:
    """One N: handshakes/s, then server CPU / RSS and echo latency at steady state."""
    raise_fd_limit()
    server_cpu = cpus[0] if cpus else None
    client_cpus = set(cpus[1:]) if len(cpus) > 1 else None
    with start_server(clients, cpu=server_cpu) as server:
        workers = _Workers(clients, processes, server.port, server.control_port)
        try:
            workers.start(client_cpus)
            workers.expect("ready", 60)
            start_at = time.time()
            workers.go.set()
            # Every client connected or failed (each wait of a client is bounded); if some
            # are still stuck the run goes on and says so (all_settled).
            settled = workers.expect("settled", CLIENT_TIMEOUT + 30, partial_ok=True)
            # Steady state: every client echoes once a second; skip the first moments after
            # the last handshake (its duologue's first status messages, the server's log).
            margin = min(5.0, seconds / 4)
            time.sleep(margin)
            t0, cpu0, clients_cpu0 = time.time(), server.cpu_seconds(), workers.cpu_seconds()
            time.sleep(seconds - margin)
            t1, cpu1, clients_cpu1 = time.time(), server.cpu_seconds(), workers.cpu_seconds()
            rss = server.rss_mib()
            peak_rss = server.peak_rss_mib()
        finally:
            workers.stop.set()
        try:
            reports = workers.expect("done", 60)
        finally:
            workers.kill()
        server.stop()
        counters = server.records("transport_counters")
    connected = sorted(t for r in reports.values() for t in r["connected"])
    failures = [f for r in reports.values() for f in r["failures"]]
    rtts = sorted(
        rtt * 1000 for r in reports.values() for when, rtt in r["rtts"] if t0 <= when <= t1
    )
    # Clients start spread over the first second; the rate counts from the start.
    span = connected[-1] - start_at if connected else 0.0
    nan = float("nan")
    return {
        "clients": clients,
        "seconds": seconds,
        "processes": len(workers.processes),
        "connected": len(connected),
        "failures": len(failures),
        "failure_examples": failures[:3],
        "all_settled": len(settled) == len(workers.processes),
        "handshake_s": round(span, 3),
        "handshakes_per_s": len(connected) / span if span > 0 else 0.0,
        "steady_s": round(t1 - t0, 3),
        "server_cpu_percent": 100.0 * (cpu1 - cpu0) / (t1 - t0),
        "server_rss_mib": rss,
        "server_peak_rss_mib": peak_rss,
        "clients_cpu_percent": round(100.0 * (clients_cpu1 - clients_cpu0) / (t1 - t0), 1),
        "echo_p50_ms": percentile(rtts, 50) if rtts else nan,
        "echo_p99_ms": percentile(rtts, 99) if rtts else nan,
        "echo_max_ms": rtts[-1] if rtts else nan,
        "echoes_per_s": round(len(rtts) / (t1 - t0), 1),
        "server_cpu": server.cpu,
        "client_cpus": sorted(client_cpus) if client_cpus else None,
        "server_counters": {
            k: v for k, v in (counters[-1] if counters else {}).items() if isinstance(v, int)
        },
    }


# ------------------------------------------------------------------ in bench.run


def results(row: dict[str, Any]) -> list[Result]:
    """One N's figures. No raw baseline exists for them; at 1,000 clients they have targets."""
    n = row["clients"]
    targets = TARGETS if n == TARGET_CLIENTS else {}
    name = f"scale_{n}"
    figures = [
        ("handshakes/s", row["handshakes_per_s"], "hs/s", dict(row)),
        ("server CPU", row["server_cpu_percent"], "%", {}),
        ("server RSS", row["server_rss_mib"], "MiB", {}),
        ("echo p50", row["echo_p50_ms"], "ms", {}),
        ("echo p99", row["echo_p99_ms"], "ms", {}),
        ("connected", row["connected"], "clients", {}),
        ("failures", row["failures"], "clients", {}),
    ]
    return [
        Result(
            name,
            metric,
            float(value),
            unit,
            fields,
            lower_is_better=metric not in ("handshakes/s", "connected"),
            target=targets.get(metric),
        )
        for metric, value, unit, fields in figures
    ]


def scale(settings: Settings) -> list[Result]:
    """B4 for bench.run: N = 100, 500, 1000 for 30 s each; --quick: 20 clients, 3 s."""
    plan = QUICK_CLIENTS if settings.quick else DEFAULT_CLIENTS
    seconds = QUICK_SECONDS if settings.quick else DEFAULT_SECONDS
    found: list[Result] = []
    for n in plan:
        row = run(n, seconds, PROCESSES, settings.pin)
        if not row["connected"]:
            raise BenchError(f"scale: none of {n} clients connected: {row['failure_examples']}")
        found += results(row)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scale", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--clients", default=",".join(map(str, DEFAULT_CLIENTS)))
    parser.add_argument("--seconds", type=float, default=DEFAULT_SECONDS)
    parser.add_argument("--processes", type=int, default=PROCESSES)
    parser.add_argument(
        "--pin",
        default=None,
        help="CPUs: the server on the first, the client processes on the others "
        "(default: the first two allowed ones; 'none' leaves placement to the scheduler)",
    )
    args = parser.parse_args()
    from bench.run import pin_cpus

    cpus = pin_cpus(args.pin)
    rows = [run(int(n), args.seconds, args.processes, cpus) for n in args.clients.split(",")]
    print(json.dumps(rows, indent=2))
    for row in rows:
        for result in results(row):
            print(f"{result.name:11} {result.metric:13} {format_figure(result.value, result.unit)}")


if __name__ == "__main__":
    main()
