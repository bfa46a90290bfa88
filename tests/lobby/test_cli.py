"""echo-lobby, echo-lobby-client, echo-lobby-announce and echo-server --ticket-key as processes:
options, errors, exit statuses, and a lobby end to end through the line-oriented client."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from echo.telemetry.schema import validate_event
from echo.tickets import new_key_text
from tests.netlab.lab import LineReader
from tests.ports import free_base, free_ports

REPO = Path(__file__).resolve().parents[2]
LOBBY = [sys.executable, "-m", "echo.lobby.cli", "server"]
CLIENT = [sys.executable, "-m", "echo.lobby.cli", "client"]
ANNOUNCE = [sys.executable, "-m", "echo.lobby.cli", "announce"]
ECHO_SERVER = [sys.executable, "-m", "echo.server.cli"]


def run(argv: list[str], timeout: float = 60, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False, input=stdin
    )


def start_lobby(log: Path, *args: str) -> tuple[subprocess.Popen[bytes], int]:
    """echo-lobby as a process, its output in `log` (a pipe nobody reads could fill up).

    The server binds its 34 ports at start; one that another program took between the probe
    and the start (other test runs share the machine) is tried again on other ports.
    """
    for _ in range(5):
        port = free_base(40)
        with log.open("wb") as out:
            process = subprocess.Popen(
                [*LOBBY, "--port", str(port), "--max-clients", "16", "--log-format", "json", *args],
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 30
        while '"listening"' not in log.read_text():
            if process.poll() == 1 and "Address already in use" in log.read_text():
                break
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)  # another process's file or port: nothing to await
        else:
            return process, port
    raise AssertionError(f"no free ports for echo-lobby: {log.read_text()}")


@pytest.fixture
def lobby(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    events = tmp_path / "events.jsonl"
    process, port = start_lobby(tmp_path / "lobby.log", "--events", str(events))
    yield port, events
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0


def options_of(help_text: str) -> list[str]:
    return re.findall(r"^  (?:-\w, )?(--[a-z-]+)", help_text, re.MULTILINE)


@pytest.mark.parametrize("argv", [LOBBY, CLIENT, ANNOUNCE], ids=["lobby", "client", "announce"])
def test_every_option_is_explained_and_exit_statuses_are_listed(argv: list[str]) -> None:
    result = run([*argv, "--help"])
    assert result.returncode == 0
    options = options_of(result.stdout)
    assert "--help" in options and len(options) >= 5
    assert "Exit status" in result.stdout


def test_lobby_options_the_issue_names() -> None:
    text = run([*LOBBY, "--help"]).stdout
    for option in (
        "--port",
        "--control-port",
        "--topics",
        "--events",
        "--ticket-key",
        "--log-format",
        "--lobby-servers",
        "--seat-key",
    ):
        assert option in text


@pytest.mark.parametrize(
    "args",
    [
        ["--port", "0"],
        ["--port", "7600", "--lobby-servers", "10.0.0.1:7600"],
        ["--lobby-servers", "nonsense"],
        ["--ticket-key", "/nonexistent/key"],
        ["--no-such-option"],
    ],
    ids=["port", "list-without-me", "bad-list", "key-file", "unknown"],
)
def test_wrong_server_command_lines_exit_2(args: list[str]) -> None:
    result = run([*LOBBY, *args])
    assert result.returncode == 2, result.stderr
    assert "Error" in result.stderr


def test_a_bad_key_file_is_a_bad_command_line(tmp_path: Path) -> None:
    key = tmp_path / "short.key"
    key.write_text("1 abcd\n")
    result = run([*LOBBY, "--ticket-key", str(key)])
    assert result.returncode == 2 and "at least 16 bytes" in result.stderr
    result = run([*ECHO_SERVER, "--ticket-key", str(key)])
    assert result.returncode == 2 and "at least 16 bytes" in result.stderr


def test_port_in_use_exits_1() -> None:
    port = free_base(4)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as holder:
        holder.bind(("127.0.0.1", port))
        result = run([*LOBBY, "--port", str(port)])
    assert result.returncode == 1
    assert f"echo-lobby: cannot serve on 127.0.0.1:{port}" in result.stderr


def test_client_without_a_member_or_with_a_bad_list_exits_2() -> None:
    assert run([*CLIENT]).returncode == 2
    result = run([*CLIENT, "--member", "a", "--servers", "host-without-port"])
    assert result.returncode == 2 and "--servers" in result.stderr


def test_client_of_a_dead_server_exits_1_and_says_so() -> None:
    port = free_base(4)
    result = run(
        [*CLIENT, "--servers", f"127.0.0.1:{port}", "--member", "a", "--timeout", "1"],
        stdin="create room\n",
    )
    assert result.returncode == 1
    assert "no lobby server answered" in result.stderr and f"127.0.0.1:{port}" in result.stderr


def test_a_lobby_through_the_line_client(lobby: tuple[int, Path]) -> None:
    port, events = lobby
    servers = f"127.0.0.1:{port}"
    owner = run(
        [*CLIENT, "--servers", servers, "--member", "alice", "--json"],
        stdin="create 'Friday duel' 4 mode=duel skill=7\nmeta map=dust\nstate\n",
    )
    assert owner.returncode == 0, owner.stderr
    records = [json.loads(line) for line in owner.stdout.splitlines()]
    kinds = [r["event"] for r in records]
    assert kinds[0] == "connected" and "joined" in kinds and "snapshot" in kinds
    state = next(r for r in records if r["event"] == "state")
    assert state["owner"] == "alice" and state["metadata"] == {
        "mode": "duel",
        "skill": 7,
        "map": "dust",
    }
    lobby_id = state["lobby_id"]
    # Alice's session ended without a leave: her seat is kept, but with nobody connected
    # the lobby is not listed (no ghost lobbies); bob joins it by its id.
    bob = run(
        [*CLIENT, "--servers", servers, "--member", "bob"],
        stdin=f"search mode=duel skill=5..9\njoin {lobby_id}\nchat hello there\nkick nobody\n"
        "lock\nready\n",
    )
    lines = bob.stdout.splitlines()
    assert "ok search" in lines
    assert not any(line.startswith(f"lobby {lobby_id} ") for line in lines), lines
    assert f"joined {lobby_id} {servers}" in lines
    # Alice is away (reconnecting): the lobby is bob's, the earliest connected member.
    assert "owner bob" in lines and "ok lock" in lines and "locked" in lines
    assert any(line.startswith("refused NO_SUCH_MEMBER") for line in lines), lines
    assert "ok ready" in lines and "ok chat" in lines
    assert bob.returncode == 3, "a refused command makes the exit status 3"
    # The events file holds schema-valid lobby events.
    written = [json.loads(line) for line in events.read_text().splitlines()]
    assert all(validate_event(record) is None for record in written)
    names = [r["event"] for r in written]
    for name in (
        "lobby_server_started",
        "lobby_created",
        "lobby_joined",
        "lobby_chat",
        "lobby_refused",
    ):
        assert name in names


def test_malformed_arguments_are_refused_with_what_was_expected(lobby: tuple[int, Path]) -> None:
    port, _ = lobby
    result = run(
        [*CLIENT, "--servers", f"127.0.0.1:{port}", "--member", "typo"],
        stdin="join twelve\nsleep soon\nsleep -1\njoin\ncreate room\nstate\n",
    )
    lines = result.stdout.splitlines()
    assert "refused BAD_COMMAND LOBBY_ID is a whole number, not 'twelve' command=join" in lines
    assert "refused BAD_COMMAND SECONDS is a number, not 'soon' command=sleep" in lines
    assert "refused BAD_COMMAND SECONDS is 0 or more, not '-1' command=sleep" in lines
    assert "refused BAD_COMMAND missing argument command=join" in lines
    # Nothing was lost: the commands after the bad ones still ran.
    assert any(line.startswith("joined ") for line in lines), lines
    assert any(line.startswith("state ") and line != "state none" for line in lines), lines
    assert result.returncode == 3


def test_a_wait_that_times_out_exits_4(lobby: tuple[int, Path]) -> None:
    port, _ = lobby
    result = run(
        [*CLIENT, "--servers", f"127.0.0.1:{port}", "--member", "waiter"],
        stdin="create room\nwait game 0.5\n",
    )
    assert result.returncode == 4 and "timeout game" in result.stdout


def test_echo_server_without_ticket_key_asks_no_ticket_and_with_it_refuses_none(
    tmp_path: Path,
) -> None:
    import trio

    import echo.session as es

    key = tmp_path / "game.key"
    key.write_text(new_key_text())
    base = free_base(20)
    process = subprocess.Popen(
        [
            *ECHO_SERVER,
            "--port",
            str(base),
            "--control-port",
            str(base + 1),
            "--clients-base-port",
            str(base + 2),
            "--ticket-key",
            str(key),
            "--log-format",
            "json",
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        reader = LineReader(process.stderr)
        while json.loads(reader.readline(timeout=30)).get("event") != "listening":
            pass

        async def attempt() -> str:
            try:
                async with es.connect("127.0.0.1", base, base + 1, timeout=5):
                    return "admitted"
            except es.Rejected as refused:
                return refused.reason

        assert trio.run(attempt) == "a game ticket is required"
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0


def demo_ports() -> int:
    """What the demo binds: lobby p..p+33, topics p+100, game p+200..p+233, and the
    walk-through's game server p+300..p+303."""
    return free_ports([*range(34), 100, *range(200, 234), *range(300, 304)])


def test_the_lobby_demo_runs_to_the_end_by_itself() -> None:
    port = demo_ports()
    result = run([sys.executable, "-m", "tools.demo.lobby", "--port", str(port)], timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]
    out = result.stdout
    for name in ("alice", "bob", "carol", "dave"):
        assert f"game server answered: ECHO {name} is in the game" in out
    assert "everyone is ready: starting the game" in out
    assert "a forged ticket was refused: ticket refused: bad_signature" in out
    # The walk-through: frank killed mid-game, resumed from his state file, the result back.
    assert "--- kill -9 frank in the middle of the game ---" in out
    assert "resumed" in out and "RESULT winner=frank" in out
    assert out.count("back_in_lobby locked=False ready=[]") == 2
    assert "exit statuses: alice=0, bob=0, carol=0, dave=0, walkthrough=0" in out
    # Encrypted throughout, with the game server's key learnt from the lobby only.
    assert out.count("encrypted to the key the lobby carried") == 4


def test_the_game_commands_of_the_line_client(lobby: tuple[int, Path]) -> None:
    """start with tags, ticket and report reach the lobby and come back refused with the
    lobby's reasons (this echo-lobby starts no games: it has no --ticket-key)."""
    port, _ = lobby
    result = run(
        [*CLIENT, "--servers", f"127.0.0.1:{port}", "--member", "gamer"],
        stdin="create room 1\nstart region=eu mode=ctf\nticket\nreport g-1 refused\nreport\n",
    )
    lines = result.stdout.splitlines()
    assert any(line.startswith("refused NO_GAME_SERVER ") for line in lines), lines
    assert "refused NO_GAME this lobby's game is not running command=ticket" in lines
    assert "refused NO_GAME this lobby's game is not running command=report" in lines
    assert "refused BAD_COMMAND report SERVER_ID REASON... command=report" in lines
    assert result.returncode == 3
