"""deploy/natlab builds the io7m Aeron guide's NAT topology (§4.1, §4.7) and tears it all down."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.netlab.lab import Host, list_namespaces, require_netns_support
from tests.netlab.udp_probe import ProbeServer, client_result, start_client

pytestmark = pytest.mark.netns

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "natlab"
SERVER_PORT = 9000
CLIENT_PORT = 40000


def _base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if n == 0:
            return out


@pytest.fixture
def natlab_prefix() -> Iterator[str]:
    """A per-run prefix so the test never touches a user's own ``natlab-*`` lab."""
    require_netns_support()
    prefix = "nt" + _base36(os.getpid())[-4:]
    yield prefix
    # Whatever the test did, leave nothing behind.
    _natlab(prefix, "down")


def _natlab(prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *args],
        env={**os.environ, "NATLAB_PREFIX": prefix},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _owned(prefix: str) -> list[str]:
    return [ns for ns in list_namespaces() if ns.startswith(f"{prefix}-")]


def test_help_describes_commands() -> None:
    out = subprocess.run([str(SCRIPT), "--help"], capture_output=True, text=True, check=True)
    for word in ("up", "--clients", "--loss", "exec", "status", "down"):
        assert word in out.stdout


def test_up_nat_and_down(natlab_prefix: str) -> None:
    prefix = natlab_prefix
    assert _owned(prefix) == []
    up = _natlab(prefix, "up", "--clients", "2")
    assert up.returncode == 0, up.stderr
    assert "exec server -- echo-server --address 198.18.0.1" in up.stdout
    assert "exec client1 -- echo-client --server 198.18.0.1" in up.stdout
    expected = {f"{prefix}-{n}" for n in ("server", "router", "client1", "client2")}
    assert set(_owned(prefix)) == expected
    # A second `up` refuses rather than half-building over the first.
    assert _natlab(prefix, "up").returncode != 0

    addr = _natlab(prefix, "exec", "client2", "--", "ip", "-4", "-o", "addr", "show", "dev", "eth0")
    assert addr.returncode == 0, addr.stderr
    assert "10.77.1.11/24" in addr.stdout
    assert "up" in _natlab(prefix, "status").stdout

    processes: list[subprocess.Popen[bytes]] = []
    server = Host(
        name=f"{prefix}-server",
        role="server",
        ip="198.18.0.1",
        public_ip="198.18.0.1",
        interface="eth0",
        processes=processes,
    )
    client = Host(
        name=f"{prefix}-client1",
        role="client",
        ip="10.77.1.10",
        public_ip="198.18.0.2",
        interface="eth0",
        processes=processes,
    )
    try:
        probe = ProbeServer(
            server,
            {
                "ip": server.ip,
                "port": SERVER_PORT,
                "expect": 1,
                "actions": [
                    {"to": [client.ip, CLIENT_PORT], "data": "to-private-ip"},
                    {"to": "src", "data": "reply"},
                ],
            },
        )
        spec = {
            "ip": client.ip,
            "port": CLIENT_PORT,
            "server": [server.ip, SERVER_PORT],
            "send": "hello",
            "until": "reply",
        }
        out = client_result(start_client(client, spec))
        result = probe.result()
    finally:
        for proc in processes:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    src_ip, src_port = result["seen"][0]["src"]
    assert src_ip == "198.18.0.2"  # the router's public address, not 10.77.1.10
    assert src_port != CLIENT_PORT  # masquerade random
    assert result["results"][0] is not None  # the server has no route to the private side
    assert out["received"] == ["reply"]

    down = _natlab(prefix, "down")
    assert down.returncode == 0, down.stderr
    assert _owned(prefix) == []
    again = _natlab(prefix, "down")
    assert again.returncode == 0, again.stderr
    assert "nothing to remove" in again.stdout
    assert "down" in _natlab(prefix, "status").stdout
