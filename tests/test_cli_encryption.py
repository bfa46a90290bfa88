"""Encrypted sessions with the real programs: echo-keygen, echo-server --key/--encryption,
echo-client --server-key, as processes on loopback."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from echo.session.crypto import Pin, ServerKey, load_key_file
from tests.ports import free_base
from tests.test_cli import ports, run_client


def keygen(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "echo.server.keygen", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def key_file(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "server.key"
    made = keygen(path)
    assert made.returncode == 0, made.stderr
    return path, made.stdout.strip()


@contextmanager
def server(*args: str) -> Iterator[tuple[subprocess.Popen[str], dict[str, str]]]:
    """An echo-server; yields it and its start-up lines by event name."""
    process = subprocess.Popen(
        [sys.executable, "-m", "echo.server.cli", "--log-format", "json", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen: dict[str, str] = {}
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + 30
        for line in process.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            seen[event.get("event", "")] = event
            if event.get("event") in ("server_key", "encryption_off"):
                break
            assert time.monotonic() < deadline, "server did not start"
        else:
            raise AssertionError(f"server exited with {process.wait()}: {seen}")
        yield process, seen
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def server_ports(base: int) -> list[str]:
    return [*ports(base), "--clients-base-port", str(base + 2)]


def test_keygen_writes_a_private_key_and_prints_its_public_key(
    key_file: tuple[Path, str], tmp_path: Path
) -> None:
    path, public = key_file
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert load_key_file(path).public_text == public
    again = keygen(path)
    assert again.returncode == 1 and "not overwriting" in again.stderr
    assert load_key_file(path).public_text == public


def test_an_encrypted_echo_with_the_printed_key(key_file: tuple[Path, str]) -> None:
    path, public = key_file
    base = free_base(12)
    with server(*server_ports(base), "--key", str(path), "--encryption", "required") as (_, seen):
        started = seen["server_key"]
        assert started["public_key"] == public and started["encryption"] == "required"
        fingerprint = started["fingerprint"]
        assert Pin.parse(fingerprint).matches(load_key_file(path).public)
        for pin in (public, fingerprint, str(path.with_suffix(".pub"))):
            if pin.endswith(".pub"):
                Path(pin).write_text(public + "\n")
            result = run_client(
                *ports(base), "--count", "3", "--interval", "0", "--server-key", pin, "--json"
            )
            assert result.returncode == 0, result.stderr
            summary = json.loads(result.stdout)
            assert summary["received"] == 3 and summary["error"] is None


def test_a_wrong_server_key_is_refused_with_a_clear_message(key_file: tuple[Path, str]) -> None:
    path, _ = key_file
    other = ServerKey.generate()
    base = free_base(12)
    with server(*server_ports(base), "--key", str(path)):
        result = run_client(*ports(base), "--count", "1", "--server-key", other.public_text)
    assert result.returncode == 6, (result.stdout, result.stderr)
    assert "not the pinned one" in result.stderr
    assert other.short_fingerprint in result.stderr


def test_required_refuses_a_plain_client_with_a_reason(key_file: tuple[Path, str]) -> None:
    path, _ = key_file
    base = free_base(12)
    with server(*server_ports(base), "--key", str(path), "--encryption", "required"):
        result = run_client(*ports(base), "--count", "1")
    assert result.returncode == 5  # rejected by the server
    assert "encryption required" in result.stderr


def test_optional_is_the_default_with_a_key_and_serves_both(key_file: tuple[Path, str]) -> None:
    path, public = key_file
    base = free_base(12)
    with server(*server_ports(base), "--key", str(path)) as (_, seen):
        assert seen["server_key"]["encryption"] == "optional"
        plain = run_client(*ports(base), "--count", "2", "--interval", "0")
        sealed = run_client(*ports(base), "--count", "2", "--interval", "0", "--server-key", public)
    assert plain.returncode == 0, plain.stderr
    assert sealed.returncode == 0, sealed.stderr
    assert "done: 2/2 echoes" in plain.stdout and "done: 2/2 echoes" in sealed.stdout


def test_without_a_key_the_server_says_it_is_in_the_clear_and_refuses_a_pinning_client() -> None:
    base = free_base(12)
    with server(*server_ports(base)) as (_, seen):
        assert "encryption_off" in seen
        result = run_client(
            *ports(base), "--count", "1", "--server-key", ServerKey.generate().public_text
        )
    assert result.returncode == 5  # rejected by the server
    assert "encryption not offered" in result.stderr


def test_bad_keys_and_modes_are_usage_errors(tmp_path: Path) -> None:
    def start(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "echo.server.cli", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )

    needs_key = start("--encryption", "required")
    assert needs_key.returncode == 2 and "needs --key FILE" in needs_key.stderr
    loose = tmp_path / "loose.key"
    keygen(loose)
    os.chmod(loose, 0o644)
    refused = start("--key", str(loose))
    assert refused.returncode == 2 and "chmod 600" in refused.stderr
    missing = start("--key", str(tmp_path / "absent.key"))
    assert missing.returncode == 2 and "cannot read key file" in missing.stderr
    bad_pin = run_client("--server-key", "not-a-key", "--count", "1")
    assert bad_pin.returncode == 2 and "--server-key" in bad_pin.stderr
