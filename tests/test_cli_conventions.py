"""The conventions every echo CLI keeps (docs/exit-codes.md), each CLI as a real process.

0 success, 1 a runtime failure (a port in use, named; a peer that never answered, named), 2 a
bad command line (click's usage banner and one "Error:" line naming the option: a value out of
range, a negative count, a file named on it that cannot be used), then each tool's own. Every
server binds every port it will use before it logs "listening".
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from importlib.metadata import entry_points
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from tests.ports import free_ports

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable

SERVER = [PY, "-m", "echo.server.cli"]
CLIENT = [PY, "-m", "echo.client.cli"]
ANALYZE = [PY, "-m", "echo.telemetry.cli"]
DEMO = [PY, "-m", "tools.demo.transport"]
TOPICS = [PY, "-m", "echo.topics.serve"]
TOPIC = [PY, "-m", "echo.topics.cli"]
LOBBY = [PY, "-m", "echo.lobby.cli", "server"]
LOBBY_CLIENT = [PY, "-m", "echo.lobby.cli", "client"]
ANNOUNCE = [PY, "-m", "echo.lobby.cli", "announce"]


def run(argv: list[str], timeout: float = 60, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=REPO, capture_output=True, text=True, timeout=timeout, input=stdin, check=False
    )


def assert_usage_error(result: subprocess.CompletedProcess[str], option: str) -> None:
    """Exit 2, click's banner, one Error line that names `option`, no traceback."""
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("Usage: "), result.stderr
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert option in error, error
    assert "Traceback" not in result.stderr


def assert_failure(result: subprocess.CompletedProcess[str], prog: str, *words: str) -> None:
    """Exit 1, one line `prog: ...` saying `words`, no banner, no traceback."""
    assert result.returncode == 1, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith(f"{prog}: ")]
    assert len(lines) == 1, result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    assert "Usage:" not in result.stderr and "Traceback" not in result.stderr


@contextmanager
def occupied(port: int) -> Iterator[None]:
    """Another program holds UDP 127.0.0.1:`port`."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as other:
        other.bind(("127.0.0.1", port))
        yield


@contextmanager
def started(argv: list[str]) -> Iterator[tuple[subprocess.Popen[str], dict[str, object]]]:
    """A server (logging JSON) until its "listening" line; the line's fields."""
    process = subprocess.Popen(
        [*argv, "--log-format", "json"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        for line in process.stderr:
            if '"listening"' in line:
                # Nobody reads the rest: a quiet server (warnings only) cannot fill the pipe.
                yield process, json.loads(line)
                break
        else:
            raise AssertionError(f"exited with {process.wait()} before listening")
    finally:
        process.terminate()
        process.wait(timeout=30)


# ---- echo-server ---------------------------------------------------------------------------


def server_ports(base: int) -> list[str]:
    return ["--port", str(base), "--control-port", str(base + 1), "--clients-base-port"]


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--port", "70000"], "--port"),
        (["--control-port", "0"], "--control-port"),
        (["--max-clients", "-5"], "--max-clients"),
        (["--log-level", "loud"], "--log-level"),
        (["--events", "/nonexistent/dir/events.jsonl"], "--events"),
        (["--ticket-key", "/nonexistent/ticket.key"], "--ticket-key"),
    ],
)
def test_echo_server_usage_errors(args: list[str], option: str) -> None:
    assert_usage_error(run([*SERVER, *args]), option)


@pytest.mark.parametrize("mode", ["shared", "per-client"])
@pytest.mark.parametrize("busy", ["port", "control", "first duologue", "last duologue"])
def test_echo_server_names_a_busy_port_and_never_listens(busy: str, mode: str) -> None:
    base = free_ports(range(12))
    last = base + (3 if mode == "shared" else 2 + 2 * 4 - 1)
    port = {"port": base, "control": base + 1, "first duologue": base + 2, "last duologue": last}
    args = [*server_ports(base), str(base + 2), "--max-clients", "4", "--duologue-ports", mode]
    with occupied(port[busy]):
        result = run([*SERVER, *args, "--log-format", "json"])
    assert_failure(result, "echo-server", f"cannot bind UDP 127.0.0.1:{port[busy]}", "in use")
    assert '"listening"' not in result.stderr


def test_a_second_echo_server_on_the_same_duologue_ports_fails_at_start() -> None:
    base = free_ports(range(8))
    with started([*SERVER, *server_ports(base), str(base + 2)]):
        second = run([*SERVER, *server_ports(base + 4), str(base + 2), "--log-format", "json"])
    assert_failure(second, "echo-server", f"127.0.0.1:{base + 2} (a duologue port)")
    assert '"listening"' not in second.stderr and "server full" not in second.stderr


# ---- echo-client ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--port", "70000"], "--port"),
        (["--count", "-5"], "--count"),
        (["--interval", "-1"], "--interval"),
        (["--timeout", "0"], "--timeout"),
        (["--server", "no-such-host.invalid"], "--server"),
        (["--bogus"], "--bogus"),
    ],
)
def test_echo_client_usage_errors(args: list[str], option: str) -> None:
    assert_usage_error(run([*CLIENT, *args]), option)


def test_echo_client_of_no_server_says_nobody_answered_and_exits_1() -> None:
    base = free_ports(range(2))
    result = run([*CLIENT, "--port", str(base), "--control-port", str(base + 1), "--timeout", "1"])
    assert_failure(
        result, "echo-client", f"no echo-server answered at 127.0.0.1:{base}/{base + 1} within 1 s"
    )


def test_echo_client_count_0_and_random_messages_of_one_length() -> None:
    base = free_ports(range(4))
    with started([*SERVER, *server_ports(base), str(base + 2)]):
        ports = ["--port", str(base), "--control-port", str(base + 1)]
        none = run([*CLIENT, *ports, "--count", "0"])
        some = run([*CLIENT, *ports, "--count", "20", "--interval", "0"])
    assert none.returncode == 0, none.stderr
    assert none.stdout.splitlines()[-1] == "done: 0/0 echoes"
    assert "None" not in none.stdout
    assert some.returncode == 0, some.stderr
    texts = re.findall(r"^echo \d+: '([^']*)' in", some.stdout, re.MULTILINE)
    assert len(texts) == 20
    assert all(re.fullmatch(r"[0-9a-f]{16}", text) for text in texts), texts
    assert re.search(r"^done: 20/20 echoes, rtt p50 [\d.]+ ms, p99 [\d.]+ ms$", some.stdout, re.M)


# ---- echo-analyze --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "option"),
    [
        ([], "EVENTS"),
        (["in.jsonl", "--top", "0"], "--top"),
        (["in.jsonl", "--log-level", "loud"], "--log-level"),
        (["--generate", "g.jsonl", "--events", "-5"], "--events"),
    ],
)
def test_echo_analyze_usage_errors(args: list[str], option: str) -> None:
    assert_usage_error(run([*ANALYZE, *args]), option)


def test_echo_analyze_on_a_missing_input_is_a_usage_error(tmp_path: Path) -> None:
    result = run([*ANALYZE, str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "out")])
    assert_usage_error(result, "no input files matched")


def test_echo_analyze_without_pyspark_names_the_extra(tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_text("{}\n")
    # An interpreter where `import pyspark` fails, as in an install without the extra.
    without = (
        "import sys; sys.modules['pyspark'] = None; from echo.telemetry.cli import main; main()"
    )
    result = run([PY, "-c", without, str(tmp_path / "in.jsonl"), "--out", str(tmp_path / "o")])
    assert_failure(result, "echo-analyze", "PySpark is not installed", "pip install 'echo[spark]'")


def test_echo_analyze_help_says_what_it_does_with_exit_statuses() -> None:
    text = run([*ANALYZE, "--help"]).stdout
    assert "1  no valid event in the input" in text
    assert "2  a bad command line" in text


# ---- the transport demo (./dev transport-demo) ---------------------------------------------


def test_no_console_script_names_a_demo() -> None:
    """The demos live in tools/ (not shipped in the package) and ./dev runs them: no installed
    command runs a module the package does not hold, and `echo-demo` is no longer a second
    name for what `./dev demo` is not."""
    scripts = {e.name: e.value for e in entry_points(group="console_scripts")}
    echo_scripts = {name: value for name, value in scripts.items() if value.startswith("echo.")}
    assert "echo-demo" not in scripts
    assert not [name for name in echo_scripts if "demo" in name]


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--port", "70000"], "--port"),
        (["--count", "-5"], "--count"),
        (["--loss", "0.9"], "--loss"),
    ],
)
def test_transport_demo_usage_errors(args: list[str], option: str) -> None:
    assert_usage_error(run([*DEMO, *args]), option)


def test_transport_demo_runs_to_the_end_with_exit_0() -> None:
    result = run([*DEMO, "--port", str(free_ports([0])), "--count", "20", "--loss", "0.1"])
    assert result.returncode == 0, result.stderr
    assert "all 21 arrived intact and in order" in result.stdout
    assert result.stdout.splitlines()[-1] == "Done."


def test_transport_demo_names_a_busy_port() -> None:
    port = free_ports([0])
    with occupied(port):
        result = run([*DEMO, "--port", str(port), "--count", "1"])
    assert_failure(result, "transport-demo", f"cannot bind UDP 127.0.0.1:{port}")


# ---- echo-topics and echo-topic ------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--port", "70000"], "--port"),
        (["--table-size", "-5"], "--table-size"),
        (["--events", "/nonexistent/dir/events.jsonl"], "--events"),
        (["--log-format", "xml"], "--log-format"),
    ],
)
def test_echo_topics_usage_errors(args: list[str], option: str) -> None:
    assert_usage_error(run([*TOPICS, *args]), option)


def test_echo_topics_names_a_busy_port_and_never_listens() -> None:
    port = free_ports([0])
    with occupied(port):
        result = run([*TOPICS, "--port", str(port), "--log-format", "json"])
    assert_failure(result, "echo-topics", f"127.0.0.1:{port}", "in use")
    assert '"listening"' not in result.stderr


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["subscribe", "--count", "-5", "t"], "--count"),
        (["subscribe", "--k", "0", "t"], "--k"),
        (["subscribe", "--servers-file", "/nonexistent/servers", "t"], "--servers-file"),
        (["publish", "--servers", "no-such-host.invalid:7400", "t", "m"], "--servers"),
        (["publish", "--log-level", "loud", "t", "m"], "--log-level"),
    ],
)
def test_echo_topic_usage_errors(args: list[str], option: str) -> None:
    assert_usage_error(run([*TOPIC, *args]), option)


def test_echo_topic_of_no_server_exits_1_naming_it() -> None:
    port = free_ports([0])
    servers = f"127.0.0.1:{port}"
    result = run([*TOPIC, "subscribe", "--servers", servers, "--confirm-timeout", "1", "t"])
    assert_failure(result, "echo-topic", "no server confirmed 't' within 1 s", servers)


# ---- echo-lobby, echo-lobby-client, echo-lobby-announce ------------------------------------


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--port", "70000"], "--port"),
        (["--max-clients", "0"], "--max-clients"),
        (["--events", "/nonexistent/dir/events.jsonl"], "--events"),
        (["--ticket-key", "/nonexistent/ticket.key"], "--ticket-key"),
        (["--seat-key", "/nonexistent/seat.key"], "--seat-key"),
    ],
)
def test_echo_lobby_usage_errors(args: list[str], option: str) -> None:
    assert_usage_error(run([*LOBBY, *args]), option)


def test_echo_lobby_at_the_top_port_names_the_option_given() -> None:
    for port in ("65535", "65534"):
        result = run([*LOBBY, "--port", port])
        assert_usage_error(result, "--port")
        assert "--control-port" not in result.stderr.splitlines()[-1]
    # Given, the control port is the one named.
    result = run([*LOBBY, "--port", "1000", "--control-port", "65535"])
    assert_usage_error(result, "Invalid value for --control-port")


@pytest.mark.parametrize("busy", ["port", "control", "first duologue", "last duologue"])
def test_echo_lobby_names_a_busy_port_and_never_listens(busy: str) -> None:
    base = free_ports(range(12))
    port = {"port": base, "control": base + 1, "first duologue": base + 2}
    port["last duologue"] = base + 2 + 2 * 4 - 1
    with occupied(port[busy]):
        result = run([*LOBBY, "--port", str(base), "--max-clients", "4", "--log-format", "json"])
    assert_failure(result, "echo-lobby", f"127.0.0.1:{port[busy]}", "in use")
    assert '"listening"' not in result.stderr


def test_a_second_echo_lobby_on_overlapping_duologue_ports_fails_at_start() -> None:
    base = free_ports(range(24))
    with ExitStack() as stack:
        stack.enter_context(started([*LOBBY, "--port", str(base), "--max-clients", "4"]))
        # Its own two ports are free; its duologue range starts inside the first one's.
        second = run(
            [
                *LOBBY,
                *("--port", str(base + 20), "--control-port", str(base + 21)),
                *("--clients-base-port", str(base + 6), "--max-clients", "4"),
                *("--log-format", "json"),
            ]
        )
    assert_failure(second, "echo-lobby", f"127.0.0.1:{base + 6} (a duologue port)")
    assert '"listening"' not in second.stderr


@pytest.mark.parametrize(
    ("args", "option"),
    [
        ([], "--member"),
        (["--member", "a", "--servers", "no-port"], "--servers"),
        (["--member", "a", "--servers", "no-such-host.invalid:7600"], "--servers"),
        (["--member", "a", "--timeout", "-1"], "--timeout"),
    ],
)
def test_echo_lobby_client_usage_errors(args: list[str], option: str) -> None:
    assert_usage_error(run([*LOBBY_CLIENT, *args]), option)


def test_echo_lobby_client_of_no_server_exits_1_naming_it() -> None:
    port = free_ports(range(2))
    argv = [*LOBBY_CLIENT, "--servers", f"127.0.0.1:{port}", "--member", "a"]
    result = run([*argv, "--connect-timeout", "1"], stdin="create room\n")
    assert_failure(
        result, "echo-lobby-client", f"no lobby server answered at 127.0.0.1:{port} within 1 s"
    )


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--address", "127.0.0.1:9000"], "--topics"),
        (["--topics", "127.0.0.1:7400", "--address", "a:1", "--slots", "-1"], "--slots"),
        (["--topics", "no-such-host.invalid:7400", "--address", "a:1"], "--topics"),
        (["--topics", "127.0.0.1:7400", "--address", "a:1", "--interval", "0"], "--interval"),
    ],
)
def test_echo_lobby_announce_usage_errors(args: list[str], option: str) -> None:
    assert_usage_error(run([*ANNOUNCE, *args]), option)


# ---- every CLI -----------------------------------------------------------------------------


def _commands() -> dict[str, click.Command]:
    from echo.client.cli import main as client
    from echo.lobby.cli import announce_main, client_main, server_main
    from echo.server.cli import main as server
    from echo.telemetry.cli import main as analyze
    from echo.topics.cli import client_main as topic
    from echo.topics.cli import server_main as topics
    from tools.demo.transport import main as demo

    return {
        "echo-server": server,
        "echo-client": client,
        "echo-analyze": analyze,
        "./dev transport-demo": demo,
        "echo-topics": topics,
        "echo-topic subscribe": topic.commands["subscribe"],  # type: ignore[attr-defined]
        "echo-topic publish": topic.commands["publish"],  # type: ignore[attr-defined]
        "echo-lobby": server_main,
        "echo-lobby-client": client_main,
        "echo-lobby-announce": announce_main,
    }


BAD_VALUE = {
    click.types.IntParamType: "1.5x",
    click.types.FloatParamType: "fast",
    click.Choice: "nonsense",
}


def test_every_typed_option_of_every_cli_refuses_a_bad_value_clearly() -> None:
    checked = 0
    for name, command in _commands().items():
        for param in command.params:
            if not isinstance(param, click.Option) or param.is_flag:
                continue
            bad = next((v for t, v in BAD_VALUE.items() if isinstance(param.type, t)), None)
            if bad is None:
                continue
            flag = max(param.opts, key=len)
            result = CliRunner().invoke(command, [flag, bad])
            assert result.exit_code == 2, (name, flag, result.output)
            assert f"Invalid value for '{flag}'" in result.output, (name, flag, result.output)
            checked += 1
    assert checked >= 50


def test_every_cli_has_help_with_its_exit_statuses_and_the_shared_log_options() -> None:
    for name, command in _commands().items():
        result = CliRunner().invoke(command, ["--help"], terminal_width=100)
        assert result.exit_code == 0, name
        assert "Exit status" in result.output, name
        for option in ("--log-format [console|json]", "--log-level [debug|info|warning|error]"):
            assert option in result.output, (name, option)


def test_the_exit_code_table_names_every_console_script() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    table = (REPO / "docs" / "exit-codes.md").read_text()
    for script in scripts:
        assert re.search(rf"^\| `{script}`", table, re.MULTILINE), script


# ---- ./dev ---------------------------------------------------------------------------------


def test_dev_help_lists_every_command_and_an_unknown_one_exits_2() -> None:
    commands = set(re.findall(r"^    ([a-z-]+)\)$", (REPO / "dev").read_text(), re.MULTILINE))
    assert {"demo", "transport-demo", "test"} <= commands
    for argv in (["./dev"], ["./dev", "help"], ["./dev", "--help"]):
        result = run(argv)
        assert result.returncode == 0 and result.stderr == "", argv
        listed = set(re.findall(r"^  \./dev ([a-z-]+)", result.stdout, re.MULTILINE))
        assert commands <= listed, commands - listed
    wrong = run(["./dev", "nonsense"])
    assert wrong.returncode == 2 and wrong.stdout == ""
    assert wrong.stderr.startswith("./dev: unknown command 'nonsense'\n")
    assert "./dev transport-demo" in wrong.stderr


def test_servers_say_listening_only_once_every_port_is_bound() -> None:
    # The "listening" line of each server names what it bound; a moment later, every one of
    # those ports is refused to anybody else.
    base = free_ports(range(12))
    with started([*SERVER, *server_ports(base), str(base + 2)]) as (_, fields):
        assert fields["duologue_ports"] == f"{base + 2}-{base + 3}"
        for port in range(base, base + 4):
            with pytest.raises(OSError), occupied(port):
                pass
