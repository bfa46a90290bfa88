"""Real processes for the web tests: echo-lobby with its WebSocket door, echo-server with a
ticket key, echo-topics and echo-lobby-announce, each started as a user would start it, and
Node (the JavaScript client's tests, the headless-Chromium scenario) with clients/js's pinned
packages (`./dev test` runs `npm ci` there first)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs

from tests.ports import free_base

REPO = Path(__file__).resolve().parents[2]
CLIENTS_JS = REPO / "clients" / "js"
CHROMIUM = Path("/usr/bin/chromium")
# Screenshots and logs of the browser tests: the run's artefacts (ignored by git)
ARTIFACTS = Path(os.environ.get("ECHO_ARTIFACTS", REPO / "artifacts")) / "web"
LOBBY = [sys.executable, "-m", "echo.lobby.cli", "server"]
LOBBY_SPAN = 40  # --port, --control-port, the duologues of --max-clients 16, the ws port last


def node() -> str:
    """The node binary, and clients/js's packages installed: a clear failure otherwise."""
    found = shutil.which("node")
    assert found, "node is not installed (./dev test installs Debian's nodejs)"
    assert (CLIENTS_JS / "node_modules" / "ws").is_dir(), (
        "clients/js/node_modules is missing: run `npm ci` in clients/js (./dev test does)"
    )
    return found


def _accepting(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@attrs.define
class Lobby:
    process: subprocess.Popen[bytes]
    port: int
    ws_port: int
    log: Path

    @property
    def udp(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.ws_port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.ws_port}/"


def _start_lobby(log: Path, args: tuple[str, ...]) -> Lobby:
    for _ in range(5):
        port = free_base(LOBBY_SPAN)
        ws_port = port + LOBBY_SPAN - 1
        with log.open("wb") as out:
            process = subprocess.Popen(
                [*LOBBY, "--port", str(port), "--max-clients", "16", "--ws-port", str(ws_port),
                 "--log-format", "json", *args],
                cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 30
        while not ('"listening"' in log.read_text() and _accepting(ws_port)):
            if process.poll() is not None and "in use" in log.read_text():
                break
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        else:
            return Lobby(process, port, ws_port, log)
    raise AssertionError(f"no free ports for echo-lobby: {log.read_text()}")


def stop(process: subprocess.Popen[bytes], what: str) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise AssertionError(f"{what} did not stop on SIGTERM") from None


@contextmanager
def lobby_server(log: Path, *args: str) -> Iterator[Lobby]:
    """echo-lobby --ws-port as a process; stopped with SIGTERM, which must end it cleanly."""
    lobby = _start_lobby(log, args)
    try:
        yield lobby
    finally:
        stop(lobby.process, "echo-lobby")
    assert lobby.process.returncode == 0, log.read_text()[-3000:]
