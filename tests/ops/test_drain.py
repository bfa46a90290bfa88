"""echo-server --drain-timeout: on SIGTERM /readyz says 503 at once, nobody new is admitted,
the sessions open go on to their end, then the server exits 0; a bound or a second signal
ends the wait, and whoever is left is told the server is shutting down."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

from tests.netlab.lab import LineReader
from tests.ops.scrape import free_tcp_port, get, scrape, scrape_until, value
from tests.ops.test_processes import ECHO_CLIENT, ECHO_SERVER, REPO, running
from tests.ports import free_base


def echo_client(ports: list[str], *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*ECHO_CLIENT, *ports, *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def wait_for_echo(client: subprocess.Popen[bytes], n: int) -> None:
    reader = LineReader(client.stdout)
    while not reader.readline(timeout=30).startswith(f"echo {n}:"):
        pass


def wait_draining(metrics: int) -> None:
    """The signal is handled by the server's loop: /readyz says so once it is."""
    for _ in range(600):
        status, body = get(metrics, "/readyz")
        if status == 503:
            assert body == "draining\n"
            return
        assert status == 200
        time.sleep(0.05)  # another process's file or port: nothing to await
    raise AssertionError("/readyz never said draining")


def test_sigterm_drains_the_open_sessions_then_exits(tmp_path: Path) -> None:
    base = free_base(12)
    metrics = free_tcp_port()
    ports = ["--port", str(base), "--control-port", str(base + 1)]
    argv = [*ECHO_SERVER, *ports, "--clients-base-port", str(base + 2)]
    argv += ["--metrics", f"127.0.0.1:{metrics}", "--drain-timeout", "60"]
    log = tmp_path / "server.log"
    with running(argv, log) as server:
        staying = echo_client(ports, "--count", "12", "--interval", "0.25", "--json")
        shown = echo_client(ports, "--count", "1000", "--interval", "0.05")
        wait_for_echo(shown, 2)
        # Both admitted before the signal (the other one may still be saying HELLO).
        scrape_until(metrics, lambda s: s[("echo_session_sessions_open", frozenset())] == 2)
        server.send_signal(signal.SIGTERM)
        wait_draining(metrics)
        late = subprocess.run(
            [*ECHO_CLIENT, *ports, "--count", "1"], cwd=REPO, capture_output=True, timeout=60
        )
        assert late.returncode == 5 and b"server shutting down" in late.stderr, late.stderr
        drained = scrape(metrics)
        assert value(drained, "echo_ready") == 0
        assert value(drained, "echo_session_admissions_total", result="draining") == 1
        assert value(drained, "echo_session_admissions_total", result="accepted") == 2
        assert value(drained, "echo_session_sessions_open") == 2
        assert server.poll() is None  # still serving its sessions
        shown.send_signal(signal.SIGINT)  # this client ends its session by itself
        assert shown.wait(timeout=30) == 0
        out, err = staying.communicate(timeout=60)
        assert staying.returncode == 0, err
        summary = json.loads(out)
        assert summary["received"] == 12 and summary["error"] is None
        # `running` sends SIGTERM again; the server has already gone by itself.
        assert server.wait(timeout=30) == 0
    events = [json.loads(line)["event"] for line in log.read_text().splitlines()]
    assert "server_draining" in events and "drained" in events
    assert events.index("drained") > events.index("server_draining")


def test_the_drain_bound_or_a_second_signal_ends_the_wait(tmp_path: Path) -> None:
    for second_signal, bound in ((False, "1"), (True, "600")):
        base = free_base(12)
        ports = ["--port", str(base), "--control-port", str(base + 1)]
        argv = [*ECHO_SERVER, *ports, "--clients-base-port", str(base + 2), "--drain-timeout"]
        log = tmp_path / f"server-{second_signal}.log"
        with running([*argv, bound], log) as server:
            client = echo_client(ports, "--interval", "0.05")
            wait_for_echo(client, 3)
            server.send_signal(signal.SIGTERM)
            if second_signal:
                while "server_draining" not in log.read_text():
                    time.sleep(0.05)  # another process's file or port: nothing to await
                server.send_signal(signal.SIGTERM)
            assert server.wait(timeout=30) == 0
            _, err = client.communicate(timeout=30)
            assert client.returncode == 4 and b"server shutting down" in err
        events = [json.loads(line)["event"] for line in log.read_text().splitlines()]
        assert ("drain_cut_short" in events) == second_signal
        assert ("drain_timed_out" in events) != second_signal
