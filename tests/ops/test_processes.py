"""echo-server, echo-lobby and echo-topics with --metrics, as processes: real traffic from the
real clients, then /metrics scraped over a socket and parsed by prometheus_client's parser."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.netlab.lab import LineReader
from tests.ops.scrape import (
    free_tcp_port,
    get,
    raw_exchange,
    scrape,
    scrape_until,
    value,
)
from tests.ports import free_base

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
ECHO_SERVER = [PY, "-m", "echo.server.cli"]
ECHO_CLIENT = [PY, "-m", "echo.client.cli"]
LOBBY = [PY, "-m", "echo.lobby.cli", "server"]
LOBBY_CLIENT = [PY, "-m", "echo.lobby.cli", "client"]
TOPICS = [PY, "-m", "echo.topics.serve"]
TOPIC = [PY, "-m", "echo.topics.cli"]


@contextmanager
def running(argv: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The server as a process, its output in `log`, once it logged "listening"; at the end,
    SIGTERM and exit status 0."""
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*argv, "--log-format", "json"], cwd=REPO, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 30
        while '"listening"' not in log.read_text():
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)  # another process's file or port: nothing to await
        yield process
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def check_endpoints(port: int) -> None:
    """/healthz and /readyz say 200; other paths 404; garbage gets a 400 and hurts nothing."""
    assert get(port, "/healthz") == (200, "ok\n")
    assert get(port, "/readyz") == (200, "ready\n")
    status, body = get(port, "/nonexistent")
    assert status == 404 and "/metrics" in body
    assert get(port, "/metrics", method="POST")[0] == 405
    answer = raw_exchange(port, b"\x16\x03\x01 NOT HTTP AT ALL\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400 "), answer
    cut_off = raw_exchange(port, b"GET /healthz HTTP/1.1\r\n")  # no end of the headers
    assert cut_off.startswith(b"HTTP/1.1 400 "), cut_off
    # Two requests on one connection (keep-alive), then an HTTP/1.0 one that ends it.
    both = raw_exchange(
        port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /readyz HTTP/1.0\r\n\r\n"
    )
    assert both.count(b"HTTP/1.1 200 OK") == 2 and both.endswith(b"ready\n"), both
    assert get(port, "/healthz") == (200, "ok\n")


def test_echo_server_counts_a_session_from_start_to_end(tmp_path: Path) -> None:
    base = free_base(12)
    metrics = free_tcp_port()
    ports = ["--port", str(base), "--control-port", str(base + 1)]
    argv = [*ECHO_SERVER, *ports, "--clients-base-port", str(base + 2)]
    with running([*argv, "--metrics", f"127.0.0.1:{metrics}"], tmp_path / "server.log"):
        before = scrape(metrics)
        assert value(before, "echo_ready") == 1
        assert value(before, "echo_session_sessions_open") == 0
        assert value(before, "echo_session_admissions_total", result="accepted") == 0
        assert value(before, "process_resident_memory_bytes") > 0
        check_endpoints(metrics)
        # A client that keeps its session open a while: 4 echoes a quarter second apart.
        client = subprocess.Popen(
            [*ECHO_CLIENT, *ports, "--count", "4", "--interval", "0.25", "--json"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        during = scrape_until(metrics, lambda s: s[("echo_session_sessions_open", frozenset())])
        assert value(during, "echo_session_sessions_open") == 1
        assert value(during, "echo_session_duologues_open") == 1
        out, err = client.communicate(timeout=60)
        assert client.returncode == 0, err
        assert json.loads(out)["received"] == 4
        after = scrape_until(metrics, lambda s: not s[("echo_session_duologues_open", frozenset())])
        assert value(after, "echo_session_sessions_open") == 0
        assert value(after, "echo_session_hellos_total") == 1
        assert value(after, "echo_session_admissions_total", result="accepted") == 1
        assert value(after, "echo_session_admissions_total", result="server_full") == 0
        assert value(after, "echo_session_sessions_opened_total") == 1
        closed = sum(v for (n, _), v in after.items() if n == "echo_session_sessions_closed_total")
        assert closed == 1
        received = value(after, "echo_transport_datagrams_received_total")
        sent = value(after, "echo_transport_datagrams_sent_total")
        # At least the HELLO, the SETUPs and the four echoes each way.
        assert received > 6 and sent > 6
        assert value(after, "echo_transport_bytes_received_total") > received * 16
        assert value(after, "echo_transport_images_created_total") >= 2


def test_echo_server_counts_tickets_and_refusals(tmp_path: Path) -> None:
    from echo.tickets.keyfile import new_key_text

    keys = tmp_path / "tickets.keys"
    keys.write_text(new_key_text(1))
    base = free_base(12)
    metrics = free_tcp_port()
    ports = ["--port", str(base), "--control-port", str(base + 1)]
    argv = [*ECHO_SERVER, *ports, "--clients-base-port", str(base + 2), "--ticket-key", str(keys)]
    with running([*argv, "--metrics", f"127.0.0.1:{metrics}"], tmp_path / "server.log"):
        before = scrape(metrics)
        assert value(before, "echo_server_tickets_total", result="missing") == 0
        result = subprocess.run(
            [*ECHO_CLIENT, *ports, "--count", "1"], cwd=REPO, capture_output=True, timeout=60
        )
        assert result.returncode == 5, result.stderr  # rejected by the server: no ticket
        after = scrape(metrics)
        assert value(after, "echo_server_tickets_total", result="missing") == 1
        assert value(after, "echo_server_tickets_total", result="admitted") == 0
        assert value(after, "echo_session_admissions_total", result="refused") == 1
        assert value(after, "echo_session_admissions_total", result="accepted") == 0


def test_lobby_server_counts_lobbies_members_and_latencies(tmp_path: Path) -> None:
    port = free_base(40)
    metrics = free_tcp_port()
    argv = [*LOBBY, "--port", str(port), "--max-clients", "16", "--metrics", f"127.0.0.1:{metrics}"]
    servers = ["--servers", f"127.0.0.1:{port}"]
    with running(argv, tmp_path / "lobby.log"):
        check_endpoints(metrics)
        empty = scrape(metrics)
        assert value(empty, "echo_lobby_lobbies", state="listed") == 0
        assert value(empty, "echo_lobby_join_duration_seconds_count") == 0
        alice = subprocess.Popen(
            [*LOBBY_CLIENT, *servers, "--member", "alice"],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert alice.stdin is not None
        reader = LineReader(alice.stdout)
        alice.stdin.write(b"create room 4\n")
        alice.stdin.flush()
        while not (line := reader.readline(timeout=30)).startswith("joined "):
            pass
        lobby_id = line.split()[1]
        one = scrape(metrics)
        assert value(one, "echo_lobby_lobbies", state="listed") == 1
        assert value(one, "echo_lobby_members", presence="connected") == 1
        assert value(one, "echo_lobby_member_sessions") == 1
        assert value(one, "echo_session_sessions_open") == 1
        assert value(one, "echo_lobby_lobbies_created_total") == 1
        bob = subprocess.run(
            [*LOBBY_CLIENT, *servers, "--member", "bob"],
            cwd=REPO,
            input=f"search\njoin {lobby_id}\nchat hello\nkick nobody\n".encode(),
            capture_output=True,
            timeout=60,
        )
        assert f"joined {lobby_id}".encode() in bob.stdout, bob.stdout
        # Only the owner kicks, and only a member: the server refuses the kick.
        refused = [line for line in bob.stdout.decode().splitlines() if line.startswith("refused")]
        assert len(refused) == 1 and bob.returncode == 3, bob.stdout
        code = refused[0].split()[1].lower()
        alice.stdin.close()
        assert alice.wait(timeout=30) == 0
        # Both sessions ended without a leave: both seats wait for their members.
        after = scrape_until(metrics, lambda s: not s[("echo_lobby_member_sessions", frozenset())])
        assert value(after, "echo_lobby_members", presence="connected") == 0
        assert value(after, "echo_lobby_members", presence="reconnecting") == 2
        assert value(after, "echo_lobby_lobbies", state="listed") == 1
        assert value(after, "echo_lobby_joins_total") == 1
        assert value(after, "echo_lobby_searches_total") == 1
        assert value(after, "echo_lobby_chat_lines_total") == 1
        assert value(after, "echo_lobby_chat_deliveries_total") == 2
        assert value(after, "echo_lobby_refusals_total", code=code) == 1
        refusals = [v for (n, _), v in after.items() if n == "echo_lobby_refusals_total"]
        assert sum(refusals) == 1
        assert value(after, "echo_lobby_members_dropped_total") == 2
        # One join timed, one search.
        assert value(after, "echo_lobby_join_duration_seconds_count") == 1
        assert value(after, "echo_lobby_search_duration_seconds_count") == 1
        assert 0 < value(after, "echo_lobby_join_duration_seconds_sum") < 2
        assert value(after, "echo_lobby_join_duration_seconds_bucket", le="+Inf") == 1
        assert value(after, "echo_session_admissions_total", result="accepted") == 2
        assert value(after, "echo_session_sessions_open") == 0
        assert value(after, "echo_transport_datagrams_received_total") > 0


def test_topics_server_counts_subscriptions_and_fan_out(tmp_path: Path) -> None:
    metrics = free_tcp_port()
    log = tmp_path / "topics.log"
    with running([*TOPICS, "--port", "0", "--metrics", f"127.0.0.1:{metrics}"], log):
        check_endpoints(metrics)
        port = next(
            json.loads(line)["port"]
            for line in log.read_text().splitlines()
            if '"listening"' in line
        )
        servers = ["--servers", f"127.0.0.1:{port}"]
        subscribers = [
            subprocess.Popen(
                [*TOPIC, "subscribe", *servers, "--count", "1", "--timeout", "60", "news"],
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for _ in range(2)
        ]
        for subscriber in subscribers:
            assert "subscribed to news" in LineReader(subscriber.stderr).readline(timeout=30)
        two = scrape(metrics)
        assert value(two, "echo_topics_subscriptions") == 2
        assert value(two, "echo_topics_topics") == 1
        assert value(two, "echo_topics_subscriptions_added_total") == 2
        assert value(two, "echo_topics_deliveries_total") == 0
        published = subprocess.run(
            [*TOPIC, "publish", *servers, "--copies", "1", "news", "hello"],
            cwd=REPO,
            capture_output=True,
            timeout=60,
        )
        assert published.returncode == 0, published.stderr
        for subscriber in subscribers:
            out, err = subscriber.communicate(timeout=60)
            assert subscriber.returncode == 0 and b"hello" in out, err
        after = scrape(metrics)
        assert value(after, "echo_topics_publishes_total") == 1
        assert value(after, "echo_topics_deliveries_total") == 2  # the fan-out
        assert value(after, "echo_topics_datagrams_received_total") >= 5
        assert value(after, "echo_topics_datagrams_sent_total") >= 4
        assert value(after, "echo_topics_drops_total", reason="rate_limited") == 0


@pytest.mark.parametrize(
    "argv",
    [ECHO_SERVER, LOBBY, [*TOPICS, "--port", "0"]],
    ids=["echo-server", "echo-lobby", "echo-topics"],
)
@pytest.mark.parametrize(
    "address",
    ["localhost:9100", "127.0.0.1", "127.0.0.1:http", "127.0.0.1:70000", "::1:9100", "[1.2.3.4]:9"],
)
def test_a_bad_metrics_address_is_a_usage_error(argv: list[str], address: str) -> None:
    result = subprocess.run(
        [*argv, "--metrics", address], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2, result.stderr
    assert "--metrics" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "argv",
    [ECHO_SERVER, LOBBY, [*TOPICS, "--port", "0"]],
    ids=["echo-server", "echo-lobby", "echo-topics"],
)
def test_a_metrics_port_in_use_exits_1_naming_it(argv: list[str]) -> None:
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        base = free_base(40)
        ports = ["--port", str(base)] if argv is not TOPICS else []
        result = subprocess.run(
            [*argv, *ports, "--metrics", f"127.0.0.1:{port}"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0] and "--metrics" in lines[0], lines
