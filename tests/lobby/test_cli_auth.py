"""echo-lobby --auth-key end to end, as processes: the example backend makes the keys and issues
the tokens, echo-lobby checks them, echo-lobby-client presents them (--token) and exits 5 with
the reason when refused; bad key files are bad command lines; development mode says so."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lobby.test_cli import CLIENT, LOBBY, REPO, run, start_lobby

BACKEND = [sys.executable, str(REPO / "examples" / "auth_backend.py")]
ISSUER = "https://game.example"


def backend(*args: str) -> str:
    result = run([*BACKEND, *args])
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    backend("keygen", "--kid", "k1", "--signing", str(tmp_path / "k1.jwk"),
            "--jwks", str(tmp_path / "lobby.jwks"))  # fmt: skip
    return tmp_path


@pytest.fixture
def lobby(keys: Path) -> Iterator[tuple[int, Path]]:
    process, port = start_lobby(
        keys / "lobby.log", "--auth-key", str(keys / "lobby.jwks"), "--auth-issuer", ISSUER
    )
    yield port, keys
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0


def issue(keys: Path, member: str, *extra: str, key: str = "k1.jwk") -> Path:
    path = keys / f"{member}-{len(list(keys.iterdir()))}.token"
    args = ["issue", "--signing", str(keys / key), "--member", member, "--issuer", ISSUER]
    path.write_text(backend(*args, *extra))
    return path


def client(port: int, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return run(
        [*CLIENT, "--servers", f"127.0.0.1:{port}", "--timeout", "5", "--json", *args],
        stdin=stdin,
    )


def test_a_member_with_the_backends_token_uses_the_lobby(lobby: tuple[int, Path]) -> None:
    port, keys = lobby
    tok = issue(keys, "alice")
    result = client(port, "--token", f"@{tok}", stdin="create room 4\nstate\nleave\n")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert lines[0]["event"] == "connected" and lines[0]["member"] == "alice"
    assert any(line["event"] == "joined" for line in lines)
    # The token itself on the command line works as well, with the matching --member.
    result = client(port, "--member", "alice", "--token", tok.read_text().strip(), stdin="")
    assert result.returncode == 0, result.stderr
    assert "echo_lobby_development_mode" not in (keys / "lobby.log").read_text()
    assert "lobby_development_mode" not in (keys / "lobby.log").read_text()


def test_refused_tokens_exit_5_with_the_reason(lobby: tuple[int, Path]) -> None:
    port, keys = lobby
    backend("keygen", "--kid", "k1", "--signing", str(keys / "stranger.jwk"),
            "--jwks", str(keys / "stranger.jwks"))  # fmt: skip
    backend("keygen", "--kid", "k9", "--signing", str(keys / "k9.jwk"),
            "--jwks", str(keys / "k9.jwks"))  # fmt: skip
    cases = {
        "expired": issue(keys, "alice", "--ttl", "-60"),
        "not_yet_valid": issue(keys, "alice", "--not-before", "3600"),
        "wrong_audience": issue(keys, "alice", "--audience", "another-game"),
        "bad_signature": issue(keys, "alice", key="stranger.jwk"),
        "unknown_kid": issue(keys, "alice", key="k9.jwk"),
    }
    for reason, tok in cases.items():
        result = client(port, "--token", f"@{tok}", stdin="create room\n")
        assert result.returncode == 5, (reason, result.stderr)
        assert f"identity refused: {reason}" in result.stderr, result.stderr
    result = client(port, "--member", "alice", stdin="create room\n")
    assert result.returncode == 5 and "identity refused: missing" in result.stderr


def test_bad_auth_command_lines_exit_2(keys: Path) -> None:
    jwks = keys / "lobby.jwks"
    result = run([*LOBBY, "--auth-key", str(jwks)])
    assert result.returncode == 2 and "--auth-issuer" in result.stderr
    result = run([*LOBBY, "--auth-issuer", ISSUER])
    assert result.returncode == 2 and "needs --auth-key" in result.stderr
    doubled = keys / "doubled.jwks"
    one = json.loads(jwks.read_text())["keys"][0]
    doubled.write_text(json.dumps({"keys": [one, one]}))
    result = run([*LOBBY, "--auth-key", str(doubled), "--auth-issuer", ISSUER])
    assert result.returncode == 2 and "'k1' is named twice" in result.stderr
    result = run([*LOBBY, "--auth-key", str(keys / "missing.jwks"), "--auth-issuer", ISSUER])
    assert result.returncode == 2 and "cannot read" in result.stderr
    backend("keygen", "--kid", "h1", "--alg", "hs256", "--signing", str(keys / "h1.jwk"),
            "--jwks", str(keys / "secret.jwks"))  # fmt: skip
    (keys / "secret.jwks").chmod(0o644)
    result = run([*LOBBY, "--auth-key", str(keys / "secret.jwks"), "--auth-issuer", ISSUER])
    assert result.returncode == 2 and "chmod 600" in result.stderr


def test_bad_client_token_options_exit_2(tmp_path: Path, keys: Path) -> None:
    result = run([*CLIENT, "--token", f"@{tmp_path / 'none.token'}"])
    assert result.returncode == 2 and "cannot read" in result.stderr
    result = run([*CLIENT])
    assert result.returncode == 2 and "--member" in result.stderr
    tok = issue(keys, "alice")
    result = run([*CLIENT, "--member", "bob", "--token", f"@{tok}"])
    assert result.returncode == 2 and "is for 'alice', not 'bob'" in result.stderr
    result = run([*CLIENT, "--token", "not-a-token"])
    assert result.returncode == 2 and "not an identity token" in result.stderr


def test_development_mode_is_announced_at_start_and_in_help(tmp_path: Path) -> None:
    server_help = run([*LOBBY, "--help"]).stdout
    assert "DEVELOPMENT MODE" in server_help
    for option in ("--auth-key", "--auth-issuer", "--auth-audience"):
        assert option in server_help
    help_text = run([*CLIENT, "--help"]).stdout
    assert "--token" in help_text and "5 the lobby refused the --token" in " ".join(
        help_text.split()
    )
    process, port = start_lobby(tmp_path / "dev.log")
    try:
        result = client(port, "--member", "anyone", stdin="create room\n")
        assert result.returncode == 0, result.stderr
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    records = [json.loads(line) for line in (tmp_path / "dev.log").read_text().splitlines()
               if line.startswith("{")]  # fmt: skip
    warning = next(r for r in records if r["event"] == "lobby_development_mode")
    assert warning["level"] == "warning"
