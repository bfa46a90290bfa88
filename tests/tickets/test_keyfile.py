"""The ticket key-file parser: each rule of the format, and what a malformed file is told."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from echo.tickets import (
    MIN_KEY_BYTES,
    KeyFileError,
    TicketKey,
    new_key_text,
    parse_key_text,
    read_key_file,
)

REPO = Path(__file__).resolve().parents[2]
A = "ab" * 32
B = "cd" * 16  # the shortest secret: 16 bytes


def test_one_key_a_line_the_first_signs() -> None:
    keys = parse_key_text(f"2 {B}\n7 {A}\n")
    assert keys == [TicketKey(2, bytes.fromhex(B)), TicketKey(7, bytes.fromhex(A))]


def test_a_bare_secret_is_key_id_1() -> None:
    assert parse_key_text(f"{A}\n") == [TicketKey(1, bytes.fromhex(A))]


def test_blank_lines_and_comments_are_ignored() -> None:
    text = f"# rotation of 2026-12\n\n   \n0 {A}   # the new key\n255 {B}\n# the end\n"
    assert [k.key_id for k in parse_key_text(text)] == [0, 255]


def test_upper_case_hex_and_tabs_are_fine() -> None:
    assert parse_key_text(f"3\t{A.upper()}\r\n")[0] == TicketKey(3, bytes.fromhex(A))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (f"1 {A}\n1 {B}\n", "line 2: key id 1 appears twice (first on line 1)"),
        # the bare form is key id 1 too
        (f"{A}\n# old\n1 {B}\n", "line 3: key id 1 appears twice (first on line 1)"),
        (f"5 {A}\n6 {B}\n005 {B}\n", "line 3: key id 5 appears twice (first on line 1)"),
    ],
)
def test_a_key_id_named_twice_is_refused(text: str, message: str) -> None:
    with pytest.raises(KeyFileError) as refused:
        parse_key_text(text)
    assert str(refused.value) == message


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (f"256 {A}", "a key id is 0..255"),
        (f"-1 {A}", "a key id is 0..255"),
        (f"0001 {A}", "a key id is 0..255"),
        (f"x {A}", "a key id is 0..255"),
        # digits to str.isdigit() but not ASCII: "²" crashed int(), "٣" was key id 3
        (f"\u00b2 {A}", "a key id is 0..255"),
        (f"\u0663 {A}", "a key id is 0..255"),
        (f"{'9' * 5000} {A}", "a key id is 0..255"),
        (f"1 {A}z", "the secret is not hex"),
        (f"1 {A}a", "the secret is not hex"),
        (f"1 0x{A}", "the secret is not hex"),
        (f"1 {'ab' * (MIN_KEY_BYTES - 1)}", f"a secret has at least {MIN_KEY_BYTES} bytes"),
        (f"1 {A} {B}", "expected 'KEY_ID HEX_SECRET'"),
    ],
)
def test_a_malformed_line_is_refused_by_its_number(line: str, message: str) -> None:
    with pytest.raises(KeyFileError) as refused:
        parse_key_text(f"# keys\n4 {B}\n{line}\n")
    assert str(refused.value) == f"line 3: {message}"


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n", "   # and blanks\n\n"])
def test_a_file_without_a_key_is_refused(text: str) -> None:
    with pytest.raises(KeyFileError, match="no key in the file"):
        parse_key_text(text)


def test_read_key_file(tmp_path: Path) -> None:
    path = tmp_path / "game.key"
    path.write_text(new_key_text(9) + new_key_text(8))
    keys = read_key_file(path)
    assert [k.key_id for k in keys] == [9, 8] and all(len(k.secret) == 32 for k in keys)
    assert keys[0].secret != keys[1].secret


def test_an_unreadable_file_is_a_key_file_error(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match="cannot read"):
        read_key_file(tmp_path / "missing.key")
    binary = tmp_path / "binary.key"
    binary.write_bytes(b"1 \xff\xfe\n")
    with pytest.raises(KeyFileError, match="cannot read"):
        read_key_file(binary)


def test_echo_server_refuses_a_key_file_that_names_a_key_twice(tmp_path: Path) -> None:
    key = tmp_path / "twice.key"
    key.write_text(f"1 {A}\n1 {B}\n")
    result = subprocess.run(
        [sys.executable, "-m", "echo.server.cli", "--ticket-key", str(key)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "line 2: key id 1 appears twice (first on line 1)" in result.stderr
    assert "Traceback" not in result.stderr
