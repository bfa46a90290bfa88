"""The process side of the network benchmarks (L1's bench.lobby_bench, M1's --net mode):
an `echo-lobby` started as a child, bot processes spoken to by lines on stdin/stdout, and
a child's CPU and memory read from /proc.

Linux only (/proc); only the standard library.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parents[1]
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (utime + stime of /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


def memory_kib(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0])
    return out


def open_fds(pid: int) -> int | None:
    """How many files a process holds open (None once it is gone)."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def udp_bound(port: int) -> bool:
    want = f":{port:04X}"
    for table in ("/proc/net/udp", "/proc/net/udp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        if any(line.split()[1].endswith(want) for line in lines):
            return True
    return False


def lobby_server_argv(port: int, members: int, *extra: str) -> list[str]:
    """echo-lobby's command line on 127.0.0.1:`port` for `members` sessions from this
    machine (every bot shares the one address), warnings only."""
    return [
        sys.executable,
        "-m",
        "echo.lobby.cli",
        "server",
        "--address",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-clients",
        str(members),
        "--max-per-ip",
        str(members),
        "--log-level",
        "warning",
        *extra,
    ]


def start_udp_server(argv: list[str], port: int, log: IO[bytes]) -> subprocess.Popen[bytes]:
    """Start a server that says nothing when ready (echo-lobby at warning level): its HELLO
    port being bound is the sign."""
    proc = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while not udp_bound(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{argv[2:4]} did not start (exit {proc.poll()})")
        time.sleep(0.05)
    return proc


class Lines:
    """A child's stdout lines, read by a thread; waits are on a condition variable."""

    def __init__(self, proc: subprocess.Popen[bytes], label: str) -> None:
        self.proc, self.label = proc, label
        self.lines: list[str] = []
        self.eof = False
        self.cond = threading.Condition()
        assert proc.stdout is not None
        threading.Thread(target=self._read, args=(proc.stdout,), daemon=True).start()

    def _read(self, stream: IO[bytes]) -> None:
        for raw in stream:
            with self.cond:
                self.lines.append(raw.decode(errors="replace").rstrip("\n"))
                self.cond.notify_all()
        with self.cond:
            self.eof = True
            self.cond.notify_all()

    def wait_json(self, phase: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for i, line in enumerate(self.lines):
                    if line.startswith("{") and json.loads(line).get("phase") == phase:
                        found: dict[str, Any] = json.loads(self.lines.pop(i))
                        return found
                left = deadline - time.monotonic()
                if self.eof or left <= 0:
                    why = "exited" if self.eof else f"no {phase} result in {timeout:.0f} s"
                    raise RuntimeError(f"{self.label}: {why}; last: {self.lines[-5:]}")
                self.cond.wait(left)

    def wait_text(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not any(text in line for line in self.lines):
                left = deadline - time.monotonic()
                if self.eof or left <= 0:
                    raise RuntimeError(f"{self.label}: never said {text!r}: {self.lines[-5:]}")
                self.cond.wait(left)


def say(proc: subprocess.Popen[bytes], line: str) -> None:
    """A line to a bot's stdin (its commands)."""
    assert proc.stdin is not None
    proc.stdin.write((line + "\n").encode())
    proc.stdin.flush()


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)
