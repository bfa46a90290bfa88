"""Churn soak: sessions opened and closed without pause against the real `echo-server`, random
datagrams sprayed at all its ports, and the server's RSS slope over the run.

    python -m bench.churn [--seconds 120] [--concurrency 16] [--spray-rate 200]

An earlier run saw RSS grow 39 -> 44 MiB over a 10-minute churn (~0.5 MiB a minute); this measures
that figure. `--concurrency` workers each loop: connect (the session library's HELLO, CONNECT,
join), three ECHO round trips, close. A sprayer sends `--spray-rate` random datagrams a second
(random lengths, some with an Aeron header's first bytes) at the all-clients ports and the
duologue range. The server's VmRSS is sampled every `--sample` seconds; the slope (least
squares, MiB per minute) is taken over the samples after the first quarter (start-up, pools
and caches filling). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import struct
import time
from typing import Any

import trio

from bench.duologue_bench import start_server
from echo.protocol import Echo, format_message


def slope_mib_per_minute(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MiB) samples, in MiB per minute."""
    if len(samples) < 2:
        return 0.0
    xs = [t for t, _ in samples]
    ys = [m for _, m in samples]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mean_x) ** 2 for x in xs)
    if var == 0:
        return 0.0
    cov = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True))
    return cov / var * 60.0


async def _churn(
    port: int,
    control_port: int,
    base: int,
    span: int,
    seconds: float,
    concurrency: int,
    spray_rate: float,
    rss: Any,
    sample: float,
) -> dict[str, Any]:
    import echo.session as es
    from echo.transport import open_transport

    sessions = errors = sprayed = 0
    samples: list[tuple[float, float]] = []
    start = trio.current_time()
    stop_at = start + seconds

    async def worker(transport: Any) -> None:
        nonlocal sessions, errors
        while trio.current_time() < stop_at:
            try:
                async with es.connect(
                    "127.0.0.1", port, control_port, transport=transport, timeout=5.0
                ) as session:
                    for i in range(3):
                        await session.send(format_message(Echo(f"churn {i}")))
                        await session.receive()
                sessions += 1
            except es.SessionError:
                errors += 1

    async def sprayer() -> None:
        nonlocal sprayed
        rng = random.Random(14)
        targets = [port, control_port, *range(base, base + span)]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.setblocking(False)
            # In ticks of 10 ms, so that a busy machine's slow wake-ups do not lower the rate.
            tick = 0.01
            next_at = trio.current_time()
            owed = 0.0
            while trio.current_time() < stop_at:
                owed += spray_rate * tick
                while owed >= 1.0:
                    owed -= 1.0
                    size = rng.randrange(0, 200)
                    data = bytearray(os.urandom(size))
                    if size >= 8 and rng.random() < 0.5:
                        # A plausible frame header: length, version 0, flags, a frame type.
                        struct.pack_into("<iBBH", data, 0, size, 0, 0xC0, rng.choice((1, 2, 3, 5)))
                    try:
                        sock.sendto(bytes(data), ("127.0.0.1", rng.choice(targets)))
                        sprayed += 1
                    except (BlockingIOError, OSError):
                        pass
                next_at += tick
                await trio.sleep_until(next_at)

    async def sampler() -> None:
        while trio.current_time() < stop_at:
            samples.append((trio.current_time() - start, rss()))
            await trio.sleep(sample)
        samples.append((trio.current_time() - start, rss()))

    async with open_transport(es.server_transport_config()) as transport:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sampler)
            if spray_rate > 0:
                nursery.start_soon(sprayer)
            for _ in range(concurrency):
                nursery.start_soon(worker, transport)
    steady = samples[len(samples) // 4 :]
    return {
        "sessions": sessions,
        "errors": errors,
        "sprayed": sprayed,
        "rss_mib_first": round(samples[0][1], 2),
        "rss_mib_steady_start": round(steady[0][1], 2),
        "rss_mib_last": round(samples[-1][1], 2),
        "rss_slope_mib_per_min": round(slope_mib_per_minute(steady), 3),
        # The band the steady samples move in: live sessions' term buffers come and go (each
        # image and publication maps three terms), so single samples swing by a few MiB and a
        # slope over a short soak is only meaningful against this band.
        "rss_mib_steady_band": [
            round(min(m for _, m in steady), 2),
            round(max(m for _, m in steady), 2),
        ],
        "samples": [(round(t, 1), round(m, 2)) for t, m in samples],
    }


def churn(
    seconds: float = 120.0, concurrency: int = 16, spray_rate: float = 200.0, sample: float = 2.0
) -> dict[str, Any]:
    max_clients = 2 * concurrency
    server = start_server(max_clients, cpu=None)
    try:
        config_base = _duologue_base(server)
        row = trio.run(
            _churn,
            server.port,
            server.control_port,
            config_base,
            2 * max_clients,
            seconds,
            concurrency,
            spray_rate,
            server.rss_mib,
            sample,
        )
    finally:
        server.stop()
    row.update(seconds=seconds, concurrency=concurrency, spray_rate=spray_rate)
    row["sessions_per_s"] = round(row["sessions"] / seconds, 1)
    return row


def _duologue_base(server: Any) -> int:
    argv = server.argv
    return int(argv[argv.index("--clients-base-port") + 1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--spray-rate", type=float, default=200.0)
    parser.add_argument("--sample", type=float, default=2.0)
    args = parser.parse_args()
    started = time.time()
    row = churn(args.seconds, args.concurrency, args.spray_rate, args.sample)
    row["wall_s"] = round(time.time() - started, 1)
    print(json.dumps(row))


if __name__ == "__main__":
    main()
