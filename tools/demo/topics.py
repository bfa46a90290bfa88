"""`./dev topics-demo`: three echo-topics servers, two subscribers and a publisher on loopback.

Every program is the real CLI started as a process, as a user would; their output is shown
with a prefix per process. Midway one server is stopped: the messages still arrive, because
each topic lives on K = 3 servers and the subscribers deduplicate the copies. One
subscriber's server list differs from the others' (it names a server that is down).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import click

from tools.demo.server import COLOURS, _start

SERVER = "echo.topics.serve"  # echo-topics
CLIENT = "echo.topics.cli"  # echo-topic


def _python(module: str, *args: str) -> list[str]:
    return [module, *args]


def _wait_for(lines: list[str], text: str, process: subprocess.Popen[str], what: str) -> None:
    deadline = time.monotonic() + 20
    while not any(text in line for line in lines):
        if process.poll() is not None or time.monotonic() > deadline:
            print(f"{what} did not start; its output is above.")
            sys.exit(1)
        time.sleep(0.05)


@click.command()
@click.option("--port", default=7400, show_default=True, help="First server port (3 in a row).")
@click.option(
    "--messages",
    default=4,
    show_default=True,
    type=click.IntRange(1, 100),
    help="Messages published before, and again after, one server is stopped.",
)
def main(port: int, messages: int) -> None:
    """Run three topics servers, two subscribers and a publisher, and show what they print."""
    ports = [port, port + 1, port + 2]
    servers = ",".join(f"127.0.0.1:{p}" for p in ports)
    processes: list[subprocess.Popen[str]] = []
    codes: dict[str, int] = {}
    try:
        print(f"Starting 3 echo-topics servers on 127.0.0.1:{ports[0]}-{ports[-1]} (N = 6 s)...")
        for i, p in enumerate(ports):
            lines: list[str] = []
            server = _start(
                _python(SERVER, "--port", str(p), "--lifetime", "6", "--log-level", "info"),
                f"server{i + 1}",
                COLOURS[0],
                lines,
            )
            processes.append(server)
            _wait_for(lines, "listening", server, f"server{i + 1}")
        # The second subscriber's list also names a server that is not running (a stale list):
        # with K = 3 of its 4 it still shares at least two live servers with the publisher.
        stale = f"127.0.0.1:{port + 3}"
        print(f"Two subscribers to lobby/eu with K = 3; the second's list adds {stale} (down).")
        subscribers = []
        for i, listed in enumerate([servers, f"{servers},{stale}"]):
            lines = []
            sub = _start(
                _python(
                    CLIENT,
                    "subscribe",
                    "--servers",
                    listed,
                    "--count",
                    str(2 * messages),
                    "--timeout",
                    "30",
                    "lobby/eu",
                ),
                f"sub{i + 1}",
                COLOURS[1 + i],
                lines,
            )
            subscribers.append((f"sub{i + 1}", sub))
            _wait_for(lines, "subscribed to", sub, f"sub{i + 1}")

        def publish(text: str) -> None:
            pub = _start(
                _python(CLIENT, "publish", "--servers", servers, "lobby/eu", text),
                "pub",
                COLOURS[3],
                [],
            )
            codes.setdefault("pub", 0)
            codes["pub"] |= pub.wait(timeout=30)

        for n in range(messages):
            publish(f"room {n + 1} open, 3/8 players")
        print("Stopping server1 (SIGTERM): the others still carry lobby/eu.")
        processes[0].send_signal(signal.SIGTERM)
        processes[0].wait(timeout=30)
        for n in range(messages, 2 * messages):
            publish(f"room {n + 1} open, 5/8 players")
        for label, sub in subscribers:
            codes[label] = sub.wait(timeout=60)
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=30)
        time.sleep(0.1)
    print()
    print("exit statuses: " + ", ".join(f"{k}={v}" for k, v in codes.items()))
    print("(subscribers: 0 = every message received once; 3 = some missing)")
    sys.exit(0 if all(code == 0 for code in codes.values()) else 1)


if __name__ == "__main__":  # pragma: no cover
    main()
