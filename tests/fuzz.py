"""Fuzz a running echo-server on all its ports while a real client echoes (seeds/000 §4.2).

    python -m tests.fuzz --datagrams 1000000      # the long run: 1M datagrams per port
    python -m tests.fuzz --datagrams 20000        # what the test suite runs

Starts `echo-server` and an `echo-client` (interval 20 ms) as processes, measures the client's
round-trip p99 without fuzz (baseline), then sends seeded random bytes and mutations of real
Aeron frames (wrong lengths, versions and types, offsets beyond the term, frame lengths of
2^31 - 1, negative values, NAKs for absurd ranges, SMs with huge windows, unknown sessions) to
the all-clients data and control ports and to the client's duologue data and control ports,
at a bounded rate. Prints one JSON summary: datagrams per port, server alive, RSS before and
after, exceptions seen in the server's log, and the client's p99 with and without fuzz.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from echo.transport.frames import (
    DataHeader,
    ErrorFrame,
    FrameType,
    Nak,
    Rttm,
    Setup,
    StatusMessage,
)

REPO = Path(__file__).resolve().parents[1]
_I32 = (-(2**31), -1, 0, 1, 2**31 - 1, 0x7FFFFFE0, 65536, 16 * 1024 * 1024)


def seed_frames(rng: random.Random) -> list[bytes]:
    """Well-formed frames of every type, for unknown and plausible sessions."""
    frames: list[bytes] = []
    for _ in range(50):
        session = rng.choice([rng.randrange(-(2**31), 2**31), 0, 1, -1])
        stream = rng.choice([0x2044F002, 1001, 0, rng.randrange(-(2**31), 2**31)])
        term = rng.randrange(-(2**31), 2**31)
        payload = rng.randbytes(rng.randrange(0, 200))
        header = DataHeader(
            frame_length=32 + len(payload),
            flags=0xC0,
            term_offset=rng.randrange(0, 4096) * 32,
            session_id=session,
            stream_id=stream,
            term_id=term,
        ).encode()
        frames.append(header + payload + bytes((-len(payload)) % 32))
        frames.append(DataHeader(0, 0xC0, 0, session, stream, term).encode())
        frames.append(
            Setup(
                term_offset=0,
                session_id=session,
                stream_id=stream,
                initial_term_id=term,
                active_term_id=term,
                term_length=rng.choice([65536, 1 << 24, 1 << 30]),
                mtu=rng.choice([1408, 8192, 65504]),
                ttl=0,
            ).encode()
        )
        frames.append(
            StatusMessage(
                session_id=session,
                stream_id=stream,
                consumption_term_id=term,
                consumption_term_offset=rng.randrange(0, 1 << 20),
                receiver_window=rng.choice([0, 1 << 30, 2**31 - 1]),
                receiver_id=rng.getrandbits(63),
                flags=rng.choice([0, 0x80, 0x40, 0x20]),
                group_tag=rng.choice([None, 7]),
            ).encode()
        )
        frames.append(
            Nak(
                session_id=session,
                stream_id=stream,
                term_id=term,
                term_offset=rng.choice([0, 32, 2**31 - 32, -32]),
                length=rng.choice([1, 1408, 2**31 - 1, -5]),
            ).encode()
        )
        frames.append(
            Rttm(session, stream, rng.getrandbits(62), 0, rng.getrandbits(62), 0x80).encode()
        )
        frames.append(ErrorFrame(session, stream, rng.getrandbits(62), 13, "fuzz").encode())
    return frames


def mutations(rng: random.Random, frames: list[bytes]) -> Iterator[bytes]:
    while True:
        choice = rng.randrange(10)
        if choice == 0:
            yield rng.randbytes(rng.randrange(0, 1500))
            continue
        frame = bytearray(rng.choice(frames))
        if choice == 1:  # flip bytes
            for _ in range(rng.randrange(1, 6)):
                frame[rng.randrange(len(frame))] ^= 1 << rng.randrange(8)
        elif choice == 2:  # truncate or extend
            frame = frame[: rng.randrange(len(frame) + 1)] + rng.randbytes(rng.randrange(0, 64))
        elif choice == 3:  # absurd frame length
            struct.pack_into("<i", frame, 0, rng.choice(_I32))
        elif choice == 4:  # version / type
            frame[4] = rng.randrange(256)
            struct.pack_into("<H", frame, 6, rng.choice([*range(12), 0xFFFF, rng.randrange(65536)]))
        elif choice == 5:  # extreme int32 in a random field
            if len(frame) >= 12:
                struct.pack_into(
                    "<i", frame, rng.randrange(2, len(frame) // 4) * 4 - 4, rng.choice(_I32)
                )
        elif choice == 6:  # several frames in one datagram
            frame += rng.choice(frames) + rng.choice(frames)
        elif choice == 7:
            frame = bytearray(rng.choice(frames))  # well-formed as is
        elif choice == 8 and len(frame) > 8:  # data type code on a control frame
            struct.pack_into("<H", frame, 6, FrameType.DATA)
        else:
            frame[5] = rng.randrange(256)  # flags
        yield bytes(frame)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _free_base() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1]) // 100 * 100 % 50000 + 10000


class ClientWatcher:
    """Runs echo-client and collects the duologue ports and every round trip it prints."""

    def __init__(self, base: int) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "echo.client.cli",
                "--port",
                str(base),
                "--control-port",
                str(base + 1),
                "--interval",
                "0.005",
                "--timeout",
                "10",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        self.ports: tuple[int, int] | None = None
        self.rtts: list[tuple[float, float]] = []  # (when, ms)
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            found = re.search(r"duologue on ports (\d+)/(\d+)", line)
            if found:
                self.ports = (int(found.group(1)), int(found.group(2)))
                self.ready.set()
            found = re.search(r" in ([0-9.]+) ms", line)
            if found:
                self.rtts.append((time.monotonic(), float(found.group(1))))

    def p99(self, start: float, end: float) -> float:
        values = sorted(ms for when, ms in self.rtts if start <= when <= end)
        if not values:
            return float("nan")
        return values[min(len(values) - 1, int(0.99 * len(values)))]


def run(datagrams: int, rate: float, seed: int, baseline_seconds: float) -> dict[str, Any]:
    base = _free_base()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "echo.server.cli",
            "--port",
            str(base),
            "--control-port",
            str(base + 1),
            "--clients-base-port",
            str(base + 2),
            "--log-format",
            "json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
    )
    log: list[str] = []

    def read_server() -> None:
        assert server.stdout is not None
        for line in server.stdout:
            log.append(line)

    threading.Thread(target=read_server, daemon=True).start()
    deadline = time.monotonic() + 30
    while not any('"listening"' in line for line in log):
        if server.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("echo-server did not start:\n" + "".join(log))
        time.sleep(0.05)
    client = ClientWatcher(base)
    try:
        if not client.ready.wait(30) or client.ports is None:
            raise RuntimeError("echo-client did not get a duologue")
        data_port, control_port = client.ports
        time.sleep(0.5)
        t0 = time.monotonic()
        time.sleep(baseline_seconds)
        t1 = time.monotonic()
        rss_before = rss_kib(server.pid)
        rng = random.Random(seed)
        frames = seed_frames(rng)
        source = mutations(rng, frames)
        targets = {
            "all_clients_data": base,
            "all_clients_control": base + 1,
            "duologue_data": data_port,
            "duologue_control": control_port,
        }
        sent = dict.fromkeys(targets, 0)
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        started = time.monotonic()
        total = datagrams * len(targets)
        for i in range(total):
            name = list(targets)[i % len(targets)]
            try:
                sock.sendto(next(source), ("127.0.0.1", targets[name]))
                sent[name] += 1
            except OSError:
                pass
            if i % 200 == 0:
                ahead = i / rate - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)
        t2 = time.monotonic()
        time.sleep(0.5)
        rss_after = rss_kib(server.pid)
        alive = server.poll() is None
        client_alive = client.process.poll() is None
    finally:
        client.process.send_signal(signal.SIGINT)
        try:
            client_code = client.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            client.process.kill()
            client_code = -1
        server.send_signal(signal.SIGTERM)
        server_code = server.wait(timeout=30)
    time.sleep(0.2)
    counters: dict[str, Any] = {}
    for line in log:
        if '"transport_counters"' in line:
            counters = json.loads(line)
    exceptions = [line for line in log if "Traceback" in line or '"level": "error"' in line]
    return {
        "datagrams_per_port": sent,
        "seconds": round(t2 - t1, 1),
        "server_alive_after_fuzz": alive,
        "server_exit": server_code,
        "client_alive_after_fuzz": client_alive,
        "client_exit": client_code,
        "rss_kib_before": rss_before,
        "rss_kib_after": rss_after,
        "exceptions_in_server_log": len(exceptions),
        "client_p99_ms_baseline": client.p99(t0, t1),
        "client_p99_ms_under_fuzz": client.p99(t1, t2),
        "invalid_frames": counters.get("invalid_frames", 0),
        "server_counters": {k: v for k, v in counters.items() if k.startswith("invalid")},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datagrams", type=int, default=1_000_000, help="per port")
    parser.add_argument("--rate", type=float, default=20_000.0, help="datagrams/s in all")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--baseline-seconds", type=float, default=3.0)
    args = parser.parse_args()
    print(json.dumps(run(args.datagrams, args.rate, args.seed, args.baseline_seconds), indent=2))


if __name__ == "__main__":
    main()
