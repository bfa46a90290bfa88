"""echo-server on a public host, echo-clients behind real NATs (issue: Echo 2.0 behind NAT)."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from tests.netlab.fixtures import nat_lab_factory  # noqa: F401  (fixture)
from tests.netlab.lab import SERVER_PUBLIC_IP, Host, NatLabFactory

pytestmark = pytest.mark.netns
REPO = Path(__file__).resolve().parents[2]
SERVER = ["--server", SERVER_PUBLIC_IP, "--timeout", "10"]
#: both duologue modes pass every NAT test: shared (response channels, the CLIs' default) and
#: per-client (the guide's MDC duologues)
MODES = pytest.mark.parametrize("ports", ["shared", "per-client"])


def start_server(host: Host, *args: str) -> subprocess.Popen[bytes]:
    server = host.python(
        "-m",
        "echo.server.cli",
        "--address",
        SERVER_PUBLIC_IP,
        "--log-format",
        "json",
        *args,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert server.stdout is not None
    for line in server.stdout:
        if b'"event": "listening"' in line:
            return server
    raise AssertionError(f"server did not start (exit {server.wait()})")


def client(host: Host, *args: str) -> subprocess.Popen[bytes]:
    return host.python(
        "-m",
        "echo.client.cli",
        *SERVER,
        *args,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def wait_for_first_echo(process: subprocess.Popen[bytes]) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith(b"echo 1:"):
            return
    raise AssertionError(f"client ended early: {process.wait()} {process.stderr.read()!r}")  # type: ignore[union-attr]


@MODES
def test_clients_behind_nat_echo_and_the_limits_hold(
    nat_lab_factory: NatLabFactory,  # noqa: F811
    ports: str,
) -> None:
    lab = nat_lab_factory(sites=2, clients_per_site=4)
    home, other = lab.sites
    mode = ("--duologue-ports", ports)
    server = start_server(lab.server, "--max-per-ip", "3", "--max-clients", "4", *mode)
    holders: list[subprocess.Popen[bytes]] = []
    try:
        # Three clients behind one NAT all echo.
        for host in home.clients[:3]:
            process = client(host, "--interval", "0.2", *mode)
            holders.append(process)
        for process in holders:
            wait_for_first_echo(process)
        # A fourth from the same public address is refused by the per-IP limit.
        fourth = client(home.clients[3], "--count", "1", *mode)
        _, err = fourth.communicate(timeout=60)
        assert fourth.returncode == 5, err  # rejected by the server
        assert b"too many connections for IP address" in err
        # Behind another NAT there is room for one more (max-clients 4)...
        allowed = client(other.clients[0], "--interval", "0.2", *mode)
        holders.append(allowed)
        wait_for_first_echo(allowed)
        # ...and then the server is full.
        fifth = client(other.clients[1], "--count", "1", *mode)
        _, err = fifth.communicate(timeout=60)
        assert fifth.returncode == 5, err
        assert b"server full" in err
        # Every holder is still echoing and finishes cleanly on Ctrl-C.
        for process in holders:
            process.send_signal(signal.SIGINT)
            assert process.wait(timeout=30) == 0
    finally:
        for process in holders:
            if process.poll() is None:
                process.kill()
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0


@MODES
def test_echo_through_nat_with_loss_and_json_summary(
    nat_lab_factory: NatLabFactory,  # noqa: F811
    ports: str,
) -> None:
    lab = nat_lab_factory(sites=1, clients_per_site=1)
    host = lab.sites[0].clients[0]
    host.set_loss(10)
    mode = ("--duologue-ports", ports)
    server = start_server(lab.server, *mode)
    try:
        process = client(host, "--count", "20", "--interval", "0", "--json", *mode)
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
        summary = json.loads(out)
        assert summary["received"] == 20 and summary["state"] == "closed"
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0
