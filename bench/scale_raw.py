"""B4's raw counterpart: N raw trio UDP clients echoing once a second against one raw server.

    python -m bench.scale_raw [--clients 1000] [--seconds 20] [--pin 0,1]

The B4 target is a ratio: the echo-server's CPU per datagram at N clients against raw
trio UDP's per-datagram CPU in the same run. This is that raw program: one trio UDP socket
that echoes every datagram back (`await sock.recvfrom` / `await sock.sendto`, as bench.quick's
raw echo server), and N clients in a few processes, each with its own socket, echoing 64 bytes
once a second at a moment of its own (the steady part of bench.scale, without a handshake).

Datagrams are counted by the kernel: `udp_datagrams()` reads /proc/net/snmp, which counts the
whole network namespace. In a namespace of its own (`ip netns exec`: docs/benchmarking.md) every
datagram counted is the benchmark's, and since server and clients share it, OutDatagrams is
exactly the datagrams the server handled (each one either sent by it or sent to it). Outside
one, other programs' traffic is counted too: the figures then say `private_netns: false`.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import time
from typing import Any

import trio

from bench.harness import cpu_seconds_of, percentile

PAYLOAD = 64
PROCESSES = 4
CLIENT_TIMEOUT = 5.0


def udp_datagrams() -> int:
    """UDP datagrams this network namespace has sent so far (/proc/net/snmp OutDatagrams)."""
    with open("/proc/net/snmp") as snmp:
        rows = [line.split() for line in snmp if line.startswith("Udp:")]
    header, values = rows[0], rows[1]
    return int(values[header.index("OutDatagrams")])


def private_netns() -> bool:
    """Does this process run in a named network namespace (`ip netns add`), so /proc/net/snmp
    counts only what runs in it?"""
    try:
        own = os.stat("/proc/self/ns/net").st_ino
        return any(entry.stat().st_ino == own for entry in os.scandir("/run/netns"))
    except OSError:
        return False


# ------------------------------------------------------------------ server process


async def _serve(port_out: Any, stop: Any) -> None:
    sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
    await sock.bind(("127.0.0.1", 0))
    port_out.put(sock.getsockname()[1])
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            await trio.to_thread.run_sync(stop.wait, abandon_on_cancel=True)
            nursery.cancel_scope.cancel()

        nursery.start_soon(watch)
        while True:
            data, source = await sock.recvfrom(2048)
            await sock.sendto(data, source)


def server_process(port_out: Any, stop: Any) -> None:
    trio.run(_serve, port_out, stop)


# ------------------------------------------------------------------ client processes


async def _client(
    port: int,
    delay: float,
    rtts: list[tuple[float, float]],
    stop: Any,
    interval: float,
    source: str | None,
) -> None:
    sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
    if source is not None:
        await sock.bind((source, 0))
    await sock.connect(("127.0.0.1", port))
    payload = bytes(PAYLOAD)
    await trio.sleep(delay)
    while not stop.is_set():
        start = time.perf_counter()
        sent_at = trio.current_time()
        await sock.send(payload)
        with trio.move_on_after(CLIENT_TIMEOUT):
            await sock.recv(2048)
            rtts.append((time.time(), time.perf_counter() - start))
        # As EchoClient: the next echo an interval after the last one was sent (at once if
        # its reply took longer).
        await trio.sleep_until(sent_at + interval)
    sock.close()


def client_address(octet: int, k: int) -> str:
    """Client k's own address, 127.octet.x.y (every 127/8 address is this host's)."""
    return f"127.{octet}.{k // 250}.{k % 250 + 1}"


async def _clients(
    port: int, count: int, ramp: float, seed: int, stop: Any, interval: float, sources: str
) -> list[Any]:
    rng = random.Random(seed)
    rtts: list[tuple[float, float]] = []
    async with trio.open_nursery() as nursery:
        for k in range(count):
            # As bench.scale's clients: each from an address of its own, or all from one.
            source = client_address(10 + seed, k) if sources == "client" else None
            delay = rng.uniform(0.0, ramp)
            nursery.start_soon(_client, port, delay, rtts, stop, interval, source)
    return rtts


def client_process(
    port: int,
    count: int,
    ramp: float,
    seed: int,
    stop: Any,
    out: Any,
    interval: float = 1.0,
    sources: str = "client",
) -> None:
    out.put(trio.run(_clients, port, count, ramp, seed, stop, interval, sources))


# ------------------------------------------------------------------ the run


def run(
    clients: int,
    seconds: float,
    processes: int = PROCESSES,
    cpus: tuple[int, ...] = (),
    interval: float = 1.0,
    sources: str = "client",
) -> dict[str, Any]:
    """The steady state of N raw clients: server CPU per datagram, echo latency."""
    from bench.scale import raise_fd_limit, ramp_seconds

    raise_fd_limit()
    ctx = mp.get_context("spawn")
    stop, ports, out = ctx.Event(), ctx.Queue(), ctx.Queue()
    server = ctx.Process(target=server_process, args=(ports, stop), daemon=True)
    server.start()
    if cpus:
        os.sched_setaffinity(server.pid, {cpus[0]})  # type: ignore[arg-type]
    port = ports.get(timeout=30)
    ramp = ramp_seconds(clients)
    per = [clients // processes + (1 if i < clients % processes else 0) for i in range(processes)]
    workers = [
        ctx.Process(
            target=client_process,
            args=(port, n, ramp, i, stop, out, interval, sources),
            daemon=True,
        )
        for i, n in enumerate(per)
        if n
    ]
    for worker in workers:
        worker.start()
        if len(cpus) > 1:
            os.sched_setaffinity(worker.pid, set(cpus[1:]))  # type: ignore[arg-type]
    try:
        # Every client is in after the ramp (and the processes' start-up); then a margin.
        time.sleep(ramp + min(5.0, seconds / 4) + 2.0)
        assert server.pid is not None
        t0, cpu0, out0 = time.time(), cpu_seconds_of(server.pid), udp_datagrams()
        time.sleep(seconds)
        t1, cpu1, out1 = time.time(), cpu_seconds_of(server.pid), udp_datagrams()
    finally:
        stop.set()
    rtts = sorted(
        rtt * 1000 for _ in workers for when, rtt in out.get(timeout=60) if t0 <= when <= t1
    )
    for process in (*workers, server):
        process.join(10)
        if process.is_alive():
            process.kill()
    return {
        "interval_s": interval,
        "sources": sources,
        **_row(clients, t1 - t0, cpu1 - cpu0, out1 - out0, rtts),
    }


def per_datagram(cpu: float, datagrams: int, echoes: int, span: float) -> dict[str, Any]:
    """The server's CPU per datagram it handled and per echo its clients saw (µs)."""
    nan = float("nan")
    return {
        "datagrams_per_s": datagrams / span,
        "server_cpu_us_per_datagram": 1e6 * cpu / datagrams if datagrams else nan,
        "server_cpu_us_per_echo": 1e6 * cpu / echoes if echoes else nan,
        "private_netns": private_netns(),
    }


def _row(
    clients: int, span: float, cpu: float, datagrams: int, rtts: list[float]
) -> dict[str, Any]:
    nan = float("nan")
    return {
        "clients": clients,
        "steady_s": round(span, 3),
        "server_cpu_percent": 100.0 * cpu / span,
        **per_datagram(cpu, datagrams, len(rtts), span),
        "echoes_per_s": round(len(rtts) / span, 1),
        "echo_p50_ms": percentile(rtts, 50) if rtts else nan,
        "echo_p99_ms": percentile(rtts, 99) if rtts else nan,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scale_raw", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--clients", default="1000")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--processes", type=int, default=PROCESSES)
    parser.add_argument("--pin", default=None, help="as bench.scale's --pin")
    parser.add_argument(
        "--interval", type=float, default=1.0, help="seconds between one client's echoes"
    )
    parser.add_argument("--sources", choices=("client", "one"), default="client")
    args = parser.parse_args()
    from bench.run import pin_cpus

    cpus = pin_cpus(args.pin)
    rows = [
        run(int(n), args.seconds, args.processes, cpus, args.interval, args.sources)
        for n in args.clients.split(",")
    ]
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
