"""B4: N concurrent Echo 2.0 clients against one echo-server process.

    python -m bench.scale --clients 100,500,1000 --seconds 30 [--processes 4]

Each client echoes once per second. Clients share a few processes (as a library user would run
them: many `EchoClient`s in one trio program). Reports, per N: handshakes per second when all
connect at once, server CPU (% of one core) and RSS at steady state, and the p50/p99 echo
latency the clients saw. Raises RLIMIT_NOFILE for itself and its children.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import resource
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

import trio

TICKS = os.sysconf("SC_CLK_TCK")


def raise_fd_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 65536
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        target = soft
    return target


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mib(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def client_process(
    port: int, count: int, seconds: float, start_at: float, out: Any, index: int
) -> None:
    raise_fd_limit()
    trio.run(_clients, port, count, seconds, start_at, out, index)


async def _clients(
    port: int, count: int, seconds: float, start_at: float, out: Any, index: int
) -> None:
    from echo.client.client import ClientConfig, EchoClient
    from echo.log import configure_logging

    configure_logging("console", "warning")
    jitter = random.Random(index)
    connected: list[float] = []
    rtts: list[tuple[float, float]] = []
    failures: list[str] = []

    async def one(i: int) -> None:
        # Clients start within the same second, not the same microsecond: a thousand echoes
        # fired in lock-step every second measure the queue, not the server.
        await trio.sleep(jitter.uniform(0.0, 1.0))
        first = True

        def on_echo(echo: Any) -> None:
            nonlocal first
            now = time.time()
            if first:
                connected.append(now)
                first = False
            rtts.append((now, echo.rtt))

        client = EchoClient(
            ClientConfig(port=port, control_port=port + 1, interval=1.0, timeout=60,
                         count=int(seconds)),
            on_echo=on_echo,
        )
        machine = await client.run()
        if machine.failure is not None:
            failures.append(machine.failure.message)

    await trio.sleep(max(0.0, start_at - time.time()))
    async with trio.open_nursery() as nursery:
        for i in range(count):
            nursery.start_soon(one, i)
    out.put({"index": index, "connected": connected, "rtts": rtts, "failures": failures})


def run(clients: int, seconds: float, processes: int) -> dict[str, Any]:
    raise_fd_limit()
    log_file = tempfile.TemporaryFile("w+")
    # Below the ephemeral range (32768+), where the clients' own sockets would collide.
    port = 20000 + (os.getpid() % 40) * 100
    server = subprocess.Popen(
        [sys.executable, "-m", "echo.server.cli", "--port", str(port), "--control-port",
         str(port + 1), "--clients-base-port", str(port + 10), "--max-clients", str(clients),
         "--max-per-ip", str(clients), "--log-level", "info", "--log-format", "json"],
        stdout=subprocess.DEVNULL, stderr=log_file, text=True,
    )
    time.sleep(2.0)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    start_at = time.time() + 3.0
    per = [clients // processes + (1 if i < clients % processes else 0) for i in range(processes)]
    workers = [
        ctx.Process(target=client_process, args=(port, n, seconds, start_at, out, i))
        for i, n in enumerate(per) if n
    ]
    for worker in workers:
        worker.start()
    # Steady state: from 5 s after the start to 5 s before the end.
    time.sleep(max(0.0, start_at - time.time()) + 5.0)
    cpu0, t0 = cpu_seconds(server.pid), time.time()
    steady = max(1.0, seconds - 10.0)
    time.sleep(steady)
    cpu1, t1 = cpu_seconds(server.pid), time.time()
    rss = rss_mib(server.pid)
    results = [out.get(timeout=seconds + 120) for _ in workers]
    for worker in workers:
        worker.join(30)
    server.send_signal(signal.SIGTERM)
    server.wait(timeout=30)
    log_file.seek(0)
    counters = {}
    for line in log_file:
        if '"transport_counters"' in line:
            counters = json.loads(line)
    connected = sorted(t for r in results for t in r["connected"])
    rtts = sorted(rtt for r in results for when, rtt in r["rtts"] if t0 <= when <= t1)
    failures = [f for r in results for f in r["failures"]]
    # Clients start spread over the first second; the handshake rate counts from the first.
    handshake_span = (connected[-1] - start_at) if connected else float("nan")

    def pct(q: float) -> float:
        return rtts[min(len(rtts) - 1, int(q * len(rtts)))] * 1000 if rtts else float("nan")

    return {
        "clients": clients,
        "connected": len(connected),
        "failures": len(failures),
        "failure_examples": failures[:3],
        "handshakes_per_s": len(connected) / handshake_span if connected else 0.0,
        "server_cpu_percent": 100.0 * (cpu1 - cpu0) / (t1 - t0),
        "server_rss_mib": rss,
        "echo_p50_ms": pct(0.50),
        "echo_p99_ms": pct(0.99),
        "echoes_measured": len(rtts),
        "server_datagrams_sent": counters.get("datagrams_sent"),
        "server_datagrams_received": counters.get("datagrams_received"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="100,500,1000")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--processes", type=int, default=4)
    args = parser.parse_args()
    rows = [run(int(n), args.seconds, args.processes) for n in args.clients.split(",")]
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
