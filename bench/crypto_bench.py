"""What encrypted sessions cost: sealing per message, the handshake's key agreement, and echo
round trips through a real `echo-server` with --encryption off and required, in one run.

    python -m bench.crypto_bench [--reps 5] [--seconds 3] [--size 64]

1. Micro: seal + open of one `--size`-byte message (echo.session.crypto) against copying it;
   the server's key agreement per admission (X25519 + HKDF + the confirmation tag).
2. Echo: one `echo-server` per mode (its own process, free ports), one session from this
   process (`echo.session.connect`, with `server_key=` when encrypted) echoing `--size`-byte
   ``ECHO`` messages one at a time for `--seconds`; round trips/s, and the server's CPU per
   round trip from /proc around exactly the measured part. Modes alternate (and which goes
   first too), `--reps` times each, so both see the same machine; the median and the spread
   of the repetitions. On a loaded machine the round trip is mostly the kernel's loopback
   wake-ups, so compare medians of many repetitions, not single runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from typing import Any

import trio

import echo.session as es
from echo.session import crypto
from tests.server.test_server import free_base


def micro(size: int, number: int = 20000) -> dict[str, float]:
    keys = crypto.SessionKeys(b"\1" * 32, b"\1" * 32, b"\2" * 32)
    sealer, opener = crypto.Sealer(keys.send), crypto.Opener(keys.receive)
    message = b"E" * size
    seal = min(timeit.repeat(lambda: sealer.seal(message), number=number, repeat=5)) / number
    sealed = [sealer.seal(message) for _ in range(number)]
    it = iter(sealed)
    opened = min(timeit.repeat(lambda: opener.open(next(it)), number=number, repeat=1)) / number
    copy = min(timeit.repeat(lambda: bytes(bytearray(message)), number=number, repeat=5)) / number
    server = crypto.ServerKey.generate()
    client = crypto.ClientHandshake(crypto.Pin(server.fingerprint))
    transcript = crypto.Transcript(client.public, server.public, b"\0" * 16, 1, 1, 1, 1, 2)
    agree = (
        min(
            timeit.repeat(
                lambda: crypto.server_session_keys(server, transcript), number=500, repeat=5
            )
        )
        / 500
    )
    return {
        "seal_us": seal * 1e6,
        "open_us": opened * 1e6,
        "copy_us": copy * 1e6,
        "server_key_agreement_us": agree * 1e6,
    }


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_server(key_path: str, mode: str) -> tuple[subprocess.Popen[str], int]:
    """An echo-server on free ports, once it listens: (the process, its --port)."""
    for _ in range(5):
        base = free_base(12)
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "echo.server.cli",
                "--log-format",
                "json",
                "--port",
                str(base),
                "--control-port",
                str(base + 1),
                "--clients-base-port",
                str(base + 2),
                "--key",
                key_path,
                "--encryption",
                mode,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert process.stdout is not None
        for line in process.stdout:
            if '"event": "listening"' in line:
                return process, base
        process.wait()  # exited: most likely a port taken meanwhile; other ports
    raise RuntimeError("echo-server did not start")


async def echo_run(
    base: int, pid: int, server_key: str | None, seconds: float, size: int
) -> tuple[float, float]:
    """(round trips/s, server CPU µs per round trip)."""
    message = b"ECHO " + b"x" * (size - 5)
    with trio.fail_after(60 + seconds):
        async with es.connect(
            "127.0.0.1", base, base + 1, timeout=10.0, server_key=server_key, resume=False,
            duologue_ports="shared",
        ) as session:  # fmt: skip
            for _ in range(200):  # warm-up
                await session.send(message)
                await session.receive()
            cpu0, t0, n = cpu_seconds(pid), time.perf_counter(), 0
            deadline = t0 + seconds
            while time.perf_counter() < deadline:
                await session.send(message)
                if await session.receive() != message:
                    raise AssertionError("wrong echo")
                n += 1
            elapsed, cpu = time.perf_counter() - t0, cpu_seconds(pid) - cpu0
            return n / elapsed, cpu / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--json", help="also write every repetition here")
    args = parser.parse_args()
    report: dict[str, Any] = {"micro": micro(args.size)}
    for name, value in report["micro"].items():
        print(f"{name:28s} {value:8.2f}")
    with tempfile.TemporaryDirectory() as scratch:
        key_path = os.path.join(scratch, "server.key")
        key = crypto.generate_key_file(key_path)
        runs: dict[str, list[tuple[float, float]]] = {"off": [], "required": []}
        for rep in range(args.reps):
            # Alternate which mode goes first, so that neither always meets the same moment.
            for mode in ("off", "required") if rep % 2 == 0 else ("required", "off"):
                server, base = start_server(key_path, mode)
                try:
                    pin = key.fingerprint if mode == "required" else None
                    runs[mode].append(
                        trio.run(echo_run, base, server.pid, pin, args.seconds, args.size)
                    )
                finally:
                    server.terminate()
                    server.wait()
    report["echo"] = runs
    for mode, rows in runs.items():
        rates, cpus = [r for r, _ in rows], [c for _, c in rows]
        print(
            f"echo {mode:9s} round trips/s median {statistics.median(rates):8.0f} "
            f"(min {min(rates):.0f}, max {max(rates):.0f}); server CPU/round trip median "
            f"{statistics.median(cpus):6.1f} us (min {min(cpus):.1f}, max {max(cpus):.1f})"
        )
    off, on = runs["off"], runs["required"]
    rate_ratio = statistics.median(r for r, _ in on) / statistics.median(r for r, _ in off)
    cpu_ratio = statistics.median(c for _, c in on) / statistics.median(c for _, c in off)
    print(
        f"required / off: round trips/s x{rate_ratio:.3f}, server CPU/round trip x{cpu_ratio:.3f}"
    )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=1)


if __name__ == "__main__":
    main()
