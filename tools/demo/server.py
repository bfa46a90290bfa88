"""`./dev demo`: the main job on one machine — echo-server and three echo-clients on loopback.

Starts the real CLIs as processes, as a user would, and prints their output with a prefix per
process; a fourth client is refused by the per-IP limit to show what a rejection looks like.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

import click

COLOURS = ["\033[36m", "\033[33m", "\033[35m", "\033[32m", "\033[31m"]
RESET = "\033[0m"


def _pump(process: subprocess.Popen[str], label: str, colour: str, lines: list[str]) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        lines.append(line)
        tint = colour if sys.stdout.isatty() else ""
        end = RESET if tint else ""
        sys.stdout.write(f"{tint}{label:>8} |{end} {line}")
        sys.stdout.flush()


def _start(argv: Sequence[str], label: str, colour: str, lines: list[str]) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    process = subprocess.Popen(
        [sys.executable, "-m", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    threading.Thread(target=_pump, args=(process, label, colour, lines), daemon=True).start()
    return process


@click.command()
@click.option("--port", default=9000, show_default=True, help="Server port (control = port + 1).")
@click.option("--clients", default=3, show_default=True, type=click.IntRange(1, 10))
@click.option("--count", default=5, show_default=True, help="Echoes per client.")
def main(port: int, clients: int, count: int) -> None:
    """Run echo-server and a few echo-clients on 127.0.0.1 and show what they print."""
    control = port + 1
    server_lines: list[str] = []
    print(f"Starting echo-server on 127.0.0.1:{port} (control {control}), at most 3 per IP...")
    server = _start(
        [
            "echo.server.cli",
            "--port",
            str(port),
            "--control-port",
            str(control),
            "--clients-base-port",
            str(port + 10),
            "--max-per-ip",
            str(clients),
        ],
        "server",
        COLOURS[0],
        server_lines,
    )
    deadline = time.monotonic() + 20
    while not any("listening" in line for line in server_lines):
        if server.poll() is not None or time.monotonic() > deadline:
            print("echo-server did not start; its output is above.")
            sys.exit(1)
        time.sleep(0.05)
    common = ["--port", str(port), "--control-port", str(control), "--interval", "0.2"]
    codes: dict[str, int] = {}
    try:
        print(f"Starting {clients} echo-clients, {count} echoes each...")
        running = []
        for i in range(clients):
            label = f"client{i + 1}"
            running.append(
                (
                    label,
                    _start(
                        ["echo.client.cli", *common, "--count", str(count)],
                        label,
                        COLOURS[(i + 1) % len(COLOURS)],
                        [],
                    ),
                )
            )
        for label, process in running:
            codes[label] = process.wait(timeout=60)
        print(
            "One more client while the others hold the server, with --max-per-ip "
            f"{clients}: it is refused."
        )
        hold = [
            _start(
                ["echo.client.cli", *common, "--interval", "1"],
                f"holder{i + 1}",
                COLOURS[(i + 1) % len(COLOURS)],
                [],
            )
            for i in range(clients)
        ]
        time.sleep(1.5)
        extra = _start(["echo.client.cli", *common, "--count", "1"], "client+", COLOURS[4], [])
        codes["client+"] = extra.wait(timeout=60)
        for process in hold:
            process.send_signal(signal.SIGINT)
            process.wait(timeout=30)
    finally:
        server.send_signal(signal.SIGTERM)
        server_code = server.wait(timeout=30)
        time.sleep(0.1)
    print()
    print(
        f"server exit status {server_code}; client exit statuses: "
        + ", ".join(f"{k}={v}" for k, v in codes.items())
    )
    print(
        "(0 = done, 1 = no server answered, 3 = timed out, 4 = connection error, "
        "5 = rejected by the server)"
    )
    expected_ok = all(codes[f"client{i + 1}"] == 0 for i in range(clients))
    sys.exit(0 if expected_ok and codes.get("client+") == 5 and server_code == 0 else 1)


if __name__ == "__main__":  # pragma: no cover
    main()
