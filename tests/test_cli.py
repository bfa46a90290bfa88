"""echo-server and echo-client as processes, the way the README and docs/cli.md run them."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from tests.ports import free_base


def run_client(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "echo.client.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@contextmanager
def server_process(*args: str) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [sys.executable, "-m", "echo.server.cli", "--log-format", "json", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + 30
        for line in process.stdout:
            if '"event": "listening"' in line:
                break
            assert time.monotonic() < deadline, "server did not start"
        else:
            raise AssertionError(f"server exited with {process.wait()}")
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def ports(base: int) -> list[str]:
    return ["--port", str(base), "--control-port", str(base + 1)]


def test_client_echoes_and_server_stops_cleanly_on_sigterm(tmp_path) -> None:  # type: ignore[no-untyped-def]
    base = free_base(12)
    events = tmp_path / "events.jsonl"
    with server_process(
        *ports(base), "--clients-base-port", str(base + 2), "--events", str(events)
    ) as server:
        result = run_client(*ports(base), "--count", "5", "--interval", "0", "--json")
        assert result.returncode == 0, result.stderr
        summary = json.loads(result.stdout)
        assert summary["sent"] == 5 and summary["received"] == 5
        assert summary["state"] == "closed" and summary["error"] is None
        assert set(summary["rtt_ms"]) == {"p50", "p90", "p99", "max"}
        assert 0 < summary["rtt_ms"]["p50"] <= summary["rtt_ms"]["max"]

        human = run_client(*ports(base), "--count", "2", "--interval", "0", "--message", "hi")
        assert human.returncode == 0
        assert "echo 1: 'hi' in" in human.stdout and "done: 2/2 echoes" in human.stdout

        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    names = [line["event"] for line in lines]
    assert names[0] == "server_started" and names[-1] == "server_stopped"
    assert names.count("duologue_created") == 2 and names.count("duologue_connected") == 2
    assert all({"ts", "server_id", "event", "schema_version"} <= set(line) for line in lines)


def test_client_is_told_when_the_server_shuts_down() -> None:
    base = free_base(12)
    with server_process(*ports(base), "--clients-base-port", str(base + 2)) as server:
        client = subprocess.Popen(
            [sys.executable, "-m", "echo.client.cli", *ports(base), "--interval", "0.05"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert client.stdout is not None
        for line in client.stdout:
            if line.startswith("echo 3:"):
                break
        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=30) == 0
        _, err = client.communicate(timeout=30)
        assert client.returncode == 4
        assert "server shutting down" in err


def test_a_server_that_never_answers_is_named_with_exit_1() -> None:
    base = free_base(2)
    result = run_client(*ports(base), "--timeout", "1", "--count", "1")
    assert result.returncode == 1
    assert (
        f"echo-client: no echo-server answered at 127.0.0.1:{base}/{base + 1} within 1 s"
        in result.stderr
    )


def test_bad_options_are_usage_errors() -> None:
    result = run_client("--port", "not-a-port")
    assert result.returncode == 2
    assert "--port" in result.stderr
    server = subprocess.run(
        [sys.executable, "-m", "echo.server.cli", "--port", "9000", "--control-port", "9000"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert server.returncode == 2
    assert "--control-port" in server.stderr


def test_a_port_in_use_is_one_line_and_exit_1_not_a_traceback() -> None:
    base = free_base(2)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as squatter:
        squatter.bind(("127.0.0.1", base + 1))  # somebody already has the control port
        result = subprocess.run(
            [sys.executable, "-m", "echo.server.cli", *ports(base), "--clients-base-port", "40000"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 1
    assert f"echo-server: cannot bind UDP 127.0.0.1:{base + 1}: Address already in use" in (
        result.stderr
    )
    assert "Traceback" not in result.stderr


def test_an_address_not_on_this_host_is_one_line_and_exit_1() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "echo.server.cli", "--address", "192.0.2.1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "cannot bind UDP 192.0.2.1:" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_server_name_that_does_not_resolve_is_a_usage_error() -> None:
    for name in ("no-such-host.invalid", "203.0.113.300"):
        result = run_client("--server", name, "--count", "1", "--timeout", "1")
        assert result.returncode == 2, result.stderr
        assert f"--server: cannot resolve {name!r}" in result.stderr
        assert "Traceback" not in result.stderr


def test_a_message_the_protocol_cannot_carry_is_refused_before_connecting() -> None:
    # Each used to pass the CLI's checks and end in a traceback: the line separator when the
    # first ECHO was formatted, after the handshake; a lone surrogate (an undecodable byte in
    # the shell's argument) at once.
    for text, problem in (
        ("a\u2028b", "line terminator"),
        ("caf\udce9", "not encodable as UTF-8"),
        ("x" * 2000, "the limit is 1024"),
    ):
        result = run_client("--message", text, "--count", "1", "--timeout", "1")
        assert result.returncode == 2, result.stderr
        assert problem in result.stderr
        assert "connecting" not in result.stdout
        assert "Traceback" not in result.stderr


def test_a_source_address_the_client_cannot_send_from_is_a_usage_error() -> None:
    for source, problem in (
        ("my-laptop", "'my-laptop' is not an IP address"),
        ("192.0.2.7", "cannot send from 192.0.2.7"),  # TEST-NET-1: on no host
    ):
        result = run_client("--source", source, "--count", "1", "--timeout", "1")
        assert result.returncode == 2, result.stderr
        assert f"--source: {problem}" in result.stderr
        assert "Traceback" not in result.stderr


def test_a_client_echoes_from_the_source_address_it_was_given(tmp_path) -> None:  # type: ignore[no-untyped-def]
    base = free_base(12)
    events = tmp_path / "events.jsonl"
    with server_process(
        *ports(base), "--clients-base-port", str(base + 2), "--events", str(events)
    ):
        result = run_client(
            *ports(base), "--source", "127.0.0.9", "--count", "2", "--interval", "0", "--json"
        )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["received"] == 2
    assert "127.0.0.9" in events.read_text()


def test_rejected_client_exits_5_with_the_server_message() -> None:
    base = free_base(12)
    with server_process(*ports(base), "--clients-base-port", str(base + 2), "--max-clients", "1"):
        holder = subprocess.Popen(
            [sys.executable, "-m", "echo.client.cli", *ports(base), "--interval", "0.2"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            assert holder.stdout is not None
            for line in holder.stdout:
                if line.startswith("echo 1:"):
                    break
            result = run_client(*ports(base), "--count", "1")
            assert result.returncode == 5
            assert "server full" in result.stderr
        finally:
            holder.send_signal(signal.SIGINT)
            assert holder.wait(timeout=30) == 0


def test_server_freezes_its_start_up_objects_out_of_the_collectors_sight() -> None:
    # A full pass of the cyclic collector stops the server while it visits every tracked
    # object; the ~30,000 of start-up (modules, classes, the server's own channels) live as
    # long as the process, so they are frozen out of every pass.
    base = free_base(4)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "echo.server.cli",
            "--log-format",
            "json",
            *ports(base),
            "--clients-base-port",
            str(base + 2),
            "--max-clients",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert process.stdout is not None
        listening = None
        for line in process.stdout:
            if '"event": "listening"' in line:
                listening = json.loads(line)
                break
        assert listening is not None, "server did not start"
        assert listening["gc_frozen"] > 10_000
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0


def test_a_client_of_the_other_duologue_mode_is_told_what_to_check() -> None:
    # A shared-ports server (the default) and a per-client client: the CONNECT comes, the
    # duologue never connects; the user is told which option the two must agree on.
    base = free_base(12)
    with server_process(*ports(base), "--clients-base-port", str(base + 2)) as server:
        result = run_client(
            *ports(base), "--duologue-ports", "per-client", "--timeout", "2", "--count", "1"
        )
        assert result.returncode == 3, result.stderr
        assert "waiting for the duologue to connect" in result.stderr
        assert "--duologue-ports per-client like this client" in result.stderr
        assert server.poll() is None  # the mismatched client never hurt the server
