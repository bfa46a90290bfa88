"""echo-lobby --key/--encryption, echo-lobby-client --server-key and echo-lobby-announce
--server-key as processes: an encrypted lobby end to end, and every bad key a bad command line."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from echo.session.crypto import ServerKey, generate_key_file
from tests.lobby.test_cli import ANNOUNCE, CLIENT, LOBBY, run, start_lobby


@pytest.fixture
def encrypted_lobby(tmp_path: Path) -> Iterator[tuple[int, ServerKey, Path]]:
    key_file = tmp_path / "lobby.key"
    key = generate_key_file(key_file)
    log = tmp_path / "lobby.log"
    process, port = start_lobby(log, "--key", str(key_file), "--encryption", "required")
    yield port, key, log
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0


def test_an_encrypted_lobby_prints_its_key_and_serves_members_that_pin_it(
    encrypted_lobby: tuple[int, ServerKey, Path], tmp_path: Path
) -> None:
    port, key, log = encrypted_lobby
    records = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    printed = next(r for r in records if r.get("event") == "server_key")
    assert printed["public_key"] == key.public_text
    assert printed["fingerprint"] == "SHA256:" + key.fingerprint
    assert printed["encryption"] == "required"
    servers = f"127.0.0.1:{port}"
    # The key as printed, and the key in a file (what a launcher hands out), both pin it.
    pin_file = tmp_path / "lobby.pub"
    pin_file.write_text(key.public_text + "\n")
    pins = (key.public_text, str(pin_file), "SHA256:" + key.fingerprint)
    for name, pin in zip(("alice", "bob", "carol"), pins, strict=True):
        member = run(
            [*CLIENT, "--servers", servers, "--member", name, "--server-key", pin],
            stdin="create sealed 2\n",
        )
        assert member.returncode == 0, member.stderr
        assert any(line.startswith("joined ") for line in member.stdout.splitlines())


def test_a_plain_member_or_a_wrong_pin_is_refused_with_the_reason(
    encrypted_lobby: tuple[int, ServerKey, Path],
) -> None:
    port, _, _ = encrypted_lobby
    servers = f"127.0.0.1:{port}"
    plain = run([*CLIENT, "--servers", servers, "--member", "a"], stdin="create x 2\n")
    assert plain.returncode == 1 and "encryption required" in plain.stderr
    other = ServerKey.generate().public_text
    fooled = run(
        [*CLIENT, "--servers", servers, "--member", "a", "--server-key", other],
        stdin="create x 2\n",
    )
    assert fooled.returncode == 1 and "server key refused" in fooled.stderr


def test_bad_keys_are_bad_command_lines(tmp_path: Path) -> None:
    result = run([*LOBBY, "--encryption", "required"])
    assert result.returncode == 2 and "needs --key FILE" in result.stderr
    open_key = tmp_path / "open.key"
    generate_key_file(open_key)
    os.chmod(open_key, 0o644)
    result = run([*LOBBY, "--key", str(open_key)])
    assert result.returncode == 2 and "chmod 600" in result.stderr
    result = run([*CLIENT, "--member", "a", "--server-key", "0123456789abcdef"])
    assert result.returncode == 2 and "short fingerprint" in result.stderr
    result = run([*ANNOUNCE, "--topics", "127.0.0.1:9", "--address", "127.0.0.1:9000",
                  "--server-key", "not-a-key"])  # fmt: skip
    assert result.returncode == 2 and "52 base32 characters" in result.stderr


def test_help_names_the_key_options() -> None:
    assert "--key" in run([*LOBBY, "--help"]).stdout
    assert "--encryption" in run([*LOBBY, "--help"]).stdout
    assert "--server-key" in run([*CLIENT, "--help"]).stdout
    assert "--server-key" in run([*ANNOUNCE, "--help"]).stdout
