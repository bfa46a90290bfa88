"""echo-topics and echo-topic as processes: options, errors, exit statuses, end to end."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.netlab.lab import LineReader

REPO = Path(__file__).resolve().parents[2]
SERVER = [sys.executable, "-m", "echo.topics.serve"]
CLIENT = [sys.executable, "-m", "echo.topics.cli"]


def run(argv: list[str], timeout: float = 30, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False, **kwargs
    )  # type: ignore[call-overload, no-any-return]


def start_server(*args: str) -> tuple[subprocess.Popen[bytes], int]:
    process = subprocess.Popen(
        [*SERVER, "--port", "0", "--log-format", "json", *args],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    reader = LineReader(process.stderr)
    while True:
        record = json.loads(reader.readline(timeout=30))
        if record["event"] == "listening":
            return process, int(record["port"])


@pytest.fixture
def server() -> Iterator[int]:
    process, port = start_server("--lifetime", "5")
    yield port
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def options_of(help_text: str) -> list[str]:
    return re.findall(r"^  (?:-\w, )?(--[a-z-]+)", help_text, re.MULTILINE)


@pytest.mark.parametrize(
    "argv", [SERVER, [*CLIENT, "subscribe"], [*CLIENT, "publish"]], ids=["server", "sub", "pub"]
)
def test_every_option_is_explained(argv: list[str]) -> None:
    result = run([*argv, "--help"])
    assert result.returncode == 0
    options = options_of(result.stdout)
    assert len(options) >= 6
    for option in options:
        if option == "--help" or option == "--json":
            continue
        # The text after each option is more than its type.
        found = re.search(rf"^  (?:-\w, )?{option}\b(.*?)(?=^  -|\n\n)", result.stdout, re.M | re.S)
        assert found is not None, option
        block = found.group(1)
        assert len(re.sub(r"\[[^]]*\]|[A-Z_]+ RANGE|FLOAT|INTEGER|TEXT|FILE", "", block)) > 20, (
            option
        )
    assert "Exit status" in result.stdout


def test_server_options_the_issue_names() -> None:
    options = options_of(run([*SERVER, "--help"]).stdout)
    for name in ("--address", "--port", "--lifetime", "--table-size", "--work-difficulty"):
        assert name in options
    assert "--events" in options and "--log-format" in options
    for sub in ("subscribe", "publish"):
        client = options_of(run([*CLIENT, sub, "--help"]).stdout)
        for name in ("--servers", "--servers-file", "--k", "--k-prime", "--json"):
            assert name in client


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["subscribe", "--k", "0", "t"], "--k"),
        (["subscribe", "--servers", "nohost", "t"], "not host:port"),
        (["subscribe", "--servers", "a:1,a:1", "t"], "twice"),
        (["subscribe", "--servers", "a:1", "--servers-file", "f", "t"], "not both"),
        (["subscribe", "--servers-file", "/nonexistent/servers", "t"], "servers-file"),
        (["subscribe", "--k", "2", "--k-prime", "3", "t"], "--k-prime"),
        (["subscribe"], "TOPICS"),
        (["subscribe", "x" * 300], "255"),
        (["publish", "t"], "MESSAGE"),
        (["publish", "--copies", "0", "t", "m"], "--copies"),
        (["frobnicate"], "No such command"),
    ],
)
def test_wrong_client_command_lines_exit_2_with_one_clear_line(
    args: list[str], message: str
) -> None:
    result = run([*CLIENT, *args])
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "args",
    [["--port", "70000"], ["--lifetime", "0"], ["--work-difficulty", "99"], ["--bogus"]],
)
def test_wrong_server_command_lines_exit_2(args: list[str]) -> None:
    result = run([*SERVER, *args])
    assert result.returncode == 2 and "Traceback" not in result.stderr


def test_port_in_use_exits_1(server: int) -> None:
    result = run([*SERVER, "--port", str(server)])
    assert result.returncode == 1
    assert "Address already in use" in result.stderr and "Traceback" not in result.stderr


def test_address_not_on_this_host_exits_1() -> None:
    result = run([*SERVER, "--address", "192.0.2.1", "--port", "0"])
    assert result.returncode == 1 and "Traceback" not in result.stderr


def test_events_file_in_a_missing_directory_is_a_bad_command_line(tmp_path: Path) -> None:
    result = run([*SERVER, "--port", "0", "--events", str(tmp_path / "no" / "dir.jsonl")])
    assert result.returncode == 2 and "Invalid value for '--events'" in result.stderr
    assert "Usage:" in result.stderr


def test_dead_server_subscribe_exits_1_and_names_it() -> None:
    port = free_port()
    result = run(
        [*CLIENT, "subscribe", "--servers", f"127.0.0.1:{port}", "--confirm-timeout", "1", "t"]
    )
    assert result.returncode == 1
    assert f"127.0.0.1:{port}" in result.stderr and "no server confirmed" in result.stderr


def test_unresolvable_server_is_a_bad_command_line() -> None:
    result = run([*CLIENT, "publish", "--servers", "no-such-host.invalid:7400", "t", "m"])
    assert result.returncode == 2 and "--servers: cannot resolve" in result.stderr
    assert "no-such-host.invalid" in result.stderr and "Traceback" not in result.stderr


def test_message_too_long_exits_2(server: int) -> None:
    result = run(
        [*CLIENT, "publish", "--servers", f"127.0.0.1:{server}", "--max-datagram", "100", "t", "-"],
        input="x" * 200,
    )
    assert result.returncode == 2 and "shorten" in result.stderr


def test_subscribe_and_publish_end_to_end(server: int, tmp_path: Path) -> None:
    servers_file = tmp_path / "servers"
    servers_file.write_text(f"# the only one\n127.0.0.1:{server}\n")
    subscriber = subprocess.Popen(
        [
            *CLIENT,
            "subscribe",
            "--servers-file",
            str(servers_file),
            "--json",
            "--count",
            "2",
            "--timeout",
            "60",
            "news",
            "sport",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert "subscribed to news, sport" in LineReader(subscriber.stderr).readline(timeout=30)
    common = ["--servers", f"127.0.0.1:{server}", "--copies", "3"]
    assert run([*CLIENT, "publish", *common, "news", "héllo wörld"]).returncode == 0
    published = run([*CLIENT, "publish", *common, "--json", "sport", "-"], input="goal\n")
    assert published.returncode == 0
    sent = json.loads(published.stdout)
    out, err = subscriber.communicate(timeout=60)
    assert subscriber.returncode == 0, err
    records = [json.loads(line) for line in out.decode().splitlines()]
    assert [(r["topic"], r["message"]) for r in records] == [
        ("news", "héllo wörld"),
        ("sport", "goal\n"),
    ]
    assert records[1]["id"] == sent["id"]  # three copies, printed once


def test_subscribe_timeout_exits_3(server: int) -> None:
    result = run(
        [
            *CLIENT,
            "subscribe",
            "--servers",
            f"127.0.0.1:{server}",
            "--count",
            "1",
            "--timeout",
            "0.5",
            "quiet",
        ]
    )
    assert result.returncode == 3 and "0 of 1" in result.stderr


def test_plain_output_and_sigint_exit_0(server: int) -> None:
    subscriber = subprocess.Popen(
        [*CLIENT, "subscribe", "--servers", f"127.0.0.1:{server}", "chat"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert "subscribed" in LineReader(subscriber.stderr).readline(timeout=30)
    assert (
        run([*CLIENT, "publish", "--servers", f"127.0.0.1:{server}", "chat", "hi all"]).returncode
        == 0
    )
    assert LineReader(subscriber.stdout).readline(timeout=30) == "chat hi all"
    subscriber.send_signal(signal.SIGINT)
    assert subscriber.wait(timeout=30) == 0
