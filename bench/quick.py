"""Quick transport figures next to raw trio UDP, measured in the same run, two processes each.

    python -m bench.quick [--seconds 3] [--pin 0,1|none]

Prints 64-byte messages per second one-way and echo round trips per second (with p50/p99),
for raw trio UDP (one datagram per message) and for the echo transport, and their ratios.
The receiving side (sink, echo server) runs pinned to one CPU and the sending side (source,
echo client) to another, as in `bench.run`; the raw one-way is `bench.baselines`' own sink and
sender, with what the sender sent and the kernel dropped (docs/benchmarking.md, "B2's raw
baseline").
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import statistics
import struct
import time
from typing import Any

import trio
import trio.lowlevel

from bench import baselines, harness
from bench.harness import Settings

PAYLOAD = 64
#: the raw one-way's accounting carried into the result (baselines.oneway_accounting)
ACCOUNTING = (
    "sent",
    "received",
    "loss_pct",
    "sent_per_s",
    "kernel_drops",
    "per_wakeup",
    "bound",
    "cpus",
    "sender_cpu_pct",
    "receiver_cpu_pct",
)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ------------------------------------------------------------------ raw trio UDP


async def _raw_echo_server(port: int, seconds: float) -> None:
    sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
    await sock.bind(("127.0.0.1", port))
    with trio.move_on_after(seconds + 5):
        while True:
            data, source = await sock.recvfrom(2048)
            await sock.sendto(data, source)


async def _raw_echo_client(port: int, seconds: float) -> dict[str, Any]:
    sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
    await sock.connect(("127.0.0.1", port))
    samples: list[float] = []
    payload = bytes(PAYLOAD)
    await trio.sleep(0.2)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        await sock.send(payload)
        await sock.recv(2048)
        samples.append(time.perf_counter() - start)
    return _rt_summary(samples, seconds)


# ------------------------------------------------------------------ echo transport


async def _transport_sink(port: int, seconds: float, out: Any) -> None:
    from echo.transport import open_transport

    async with open_transport() as transport:
        sub = await transport.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}", 1001)
        count = 0
        first = last = 0.0
        expected = 0
        ok = True

        def handle(message: Any) -> None:
            nonlocal count, first, last, expected, ok
            (index,) = struct.unpack_from("<Q", message.data)
            ok = ok and index == expected
            expected += 1
            if count == 0:
                first = time.perf_counter()
            last = time.perf_counter()
            count += 1

        with trio.move_on_after(seconds + 10):
            while True:
                if not sub.poll(handle, fragment_limit=1000):
                    if count and time.perf_counter() - last > 1.0:
                        break
                    await sub.wait_activity()
        out.put({"count": count, "elapsed": last - first, "in_order": ok})


async def _transport_source(port: int, seconds: float) -> None:
    from echo.transport import open_transport

    async with open_transport() as transport:
        pub = await transport.add_publication(f"aeron:udp?endpoint=127.0.0.1:{port}", 1001)
        await pub.wait_connected(timeout=10)
        index = 0
        pad = bytes(PAYLOAD - 8)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            for _ in range(256):
                if pub.offer(struct.pack("<Q", index) + pad) > 0:
                    index += 1
                else:
                    break
            await trio.lowlevel.checkpoint()
        await pub.close(timeout=5)


async def _transport_echo_server(port: int, seconds: float) -> None:
    from echo.transport import open_transport

    async with open_transport() as transport:
        sub = await transport.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}", 1001)
        pub = await transport.add_publication(f"aeron:udp?endpoint=127.0.0.1:{port + 1}", 1002)
        with trio.move_on_after(seconds + 10):
            async for message in sub:
                await pub.send(message.data, timeout=5)


async def _transport_echo_client(port: int, seconds: float) -> dict[str, Any]:
    from echo.transport import open_transport

    async with open_transport() as transport:
        sub = await transport.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port + 1}", 1002)
        pub = await transport.add_publication(f"aeron:udp?endpoint=127.0.0.1:{port}", 1001)
        await pub.wait_connected(timeout=10)
        with trio.fail_after(10):
            while not sub.images:
                await sub.wait_activity()
        payload = bytes(PAYLOAD)
        samples: list[float] = []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            start = time.perf_counter()
            await pub.send(payload, timeout=5)
            await sub.receive()
            samples.append(time.perf_counter() - start)
        return _rt_summary(samples, seconds)


def _rt_summary(samples: list[float], seconds: float) -> dict[str, Any]:
    ordered = sorted(samples)
    return {
        "round_trips_per_s": len(samples) / seconds,
        "p50_us": statistics.median(ordered) * 1e6,
        "p99_us": ordered[int(0.99 * (len(ordered) - 1))] * 1e6,
    }


# ------------------------------------------------------------------ process plumbing


#: the CPUs of the receiving and the sending side ((): the scheduler places them); main sets it
PIN: tuple[int, ...] = ()


def _pin(side: int) -> None:
    """Pin this process to the CPU of `side` (0 receiving, 1 sending), if pinning."""
    if PIN:
        os.sched_setaffinity(0, {PIN[side % len(PIN)]})


def _run_sink(pin: tuple[int, ...], port: int, seconds: float, out: Any) -> None:
    global PIN
    PIN = pin
    _pin(0)
    trio.run(_transport_sink, port, seconds, out)


def _run_source(pin: tuple[int, ...], port: int, seconds: float) -> None:
    global PIN
    PIN = pin
    _pin(1)
    trio.run(_transport_source, port, seconds)


def _run_echo_server(pin: tuple[int, ...], kind: str, port: int, seconds: float) -> None:
    global PIN
    PIN = pin
    _pin(0)
    trio.run(_raw_echo_server if kind == "raw" else _transport_echo_server, port, seconds)


def _raw_one_way(seconds: float) -> dict[str, Any]:
    """bench.baselines' 64-byte one-way (the sink and sender `bench.run` measures), pinned the
    same way: datagrams/s as received, with its accounting."""
    harness.pin(PIN)
    try:
        rate = baselines.raw_oneway(Settings(duration=seconds, quick=False), (PAYLOAD,))[0]
    finally:
        harness.pin(())
    extra = rate.extra
    return {
        "count": extra["received"],
        "messages_per_s": rate.value,
        **{key: extra[key] for key in ACCOUNTING if key in extra},
    }


def _one_way(kind: str, seconds: float) -> dict[str, Any]:
    if kind == "raw":
        return _raw_one_way(seconds)
    ctx = mp.get_context("spawn")
    port = _free_port()
    out = ctx.Queue()
    sink = ctx.Process(target=_run_sink, args=(PIN, port, seconds, out))
    sink.start()
    time.sleep(0.5)
    source = ctx.Process(target=_run_source, args=(PIN, port, seconds))
    source.start()
    source.join(seconds + 30)
    result: dict[str, Any] = out.get(timeout=30)
    sink.join(10)
    result["messages_per_s"] = result["count"] / result["elapsed"] if result["elapsed"] else 0.0
    result["cpus"] = list(PIN)
    return result


def _echo(kind: str, seconds: float) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    port = _free_port()
    server = ctx.Process(target=_run_echo_server, args=(PIN, kind, port, seconds))
    server.start()
    time.sleep(0.5)
    client = _raw_echo_client if kind == "raw" else _transport_echo_client
    allowed = os.sched_getaffinity(0)
    _pin(1)  # this process is the client
    try:
        result = trio.run(client, port, seconds)
    finally:
        os.sched_setaffinity(0, allowed)
    server.terminate()
    server.join(10)
    result["cpus"] = list(PIN)
    return result


def main() -> None:
    global PIN
    from bench.run import pin_cpus

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument(
        "--pin",
        default=None,
        help="CPUs for the receiving and the sending side, e.g. 0,1 (the default when two are "
        "available); 'none' leaves placement to the scheduler",
    )
    args = parser.parse_args()
    PIN = pin_cpus(args.pin)
    results = {
        "raw_one_way": _one_way("raw", args.seconds),
        "transport_one_way": _one_way("transport", args.seconds),
        "raw_echo": _echo("raw", args.seconds),
        "transport_echo": _echo("transport", args.seconds),
    }
    raw1, tr1 = results["raw_one_way"], results["transport_one_way"]
    rawe, tre = results["raw_echo"], results["transport_echo"]
    print(json.dumps(results, indent=2))
    print()
    print("| measure | raw trio UDP | echo transport | ratio |")
    print("|---|---|---|---|")
    print(
        f"| 64 B one-way, messages/s | {raw1['messages_per_s']:,.0f} | "
        f"{tr1['messages_per_s']:,.0f} | {tr1['messages_per_s'] / raw1['messages_per_s']:.2f} x |"
    )
    print(
        f"| echo round trips/s | {rawe['round_trips_per_s']:,.0f} | "
        f"{tre['round_trips_per_s']:,.0f} | "
        f"{tre['round_trips_per_s'] / rawe['round_trips_per_s']:.2f} x |"
    )
    print(f"| echo p50 / p99 µs | {rawe['p50_us']:.0f} / {rawe['p99_us']:.0f} | "
          f"{tre['p50_us']:.0f} / {tre['p99_us']:.0f} | |")
    print()
    print(
        f"raw one-way: sent {raw1['sent']:,}, received {raw1['received']:,}, dropped by the "
        f"kernel {raw1.get('kernel_drops')}, {raw1.get('per_wakeup')} datagrams per sink "
        f"wake-up; the rate is the {raw1.get('bound', '?')}'s; CPUs {raw1['cpus'] or 'unpinned'}"
    )


if __name__ == "__main__":
    main()
