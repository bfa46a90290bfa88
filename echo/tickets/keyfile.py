"""Key files for tickets and seats: what `echo-lobby --ticket-key` / `--seat-key` and
`echo-server --ticket-key` read.

A key file holds one key a line: ``KEY_ID HEX_SECRET`` (key id 0..255 in ASCII decimal, at
least 16 bytes of secret as hex), or just ``HEX_SECRET`` (key id 1); blank lines and ``#``
comments are ignored. The first key signs; every key verifies, so a rotation adds the new key
first and keeps the old one below it until the old tickets have expired. A file that names one
key id twice is refused (which of the two secrets would verify is not something to guess), as
is a line of any other form: the error names the line. Make one with::

    echo "1 $(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n')" > game.key
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

from echo.tickets.core import MIN_KEY_BYTES, TicketKey

_KEY_ID = re.compile(r"[0-9]{1,3}")


class KeyFileError(ValueError):
    """A key file that cannot be read or holds no valid key (the message says which line)."""


def parse_key_text(text: str) -> list[TicketKey]:
    """The keys of a key file's text, signing key first. Raises KeyFileError."""
    keys: list[TicketKey] = []
    lines: dict[int, int] = {}  # key id -> the line that named it
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        if len(fields) == 1:
            key_text, hex_text = "1", fields[0]
        elif len(fields) == 2:
            key_text, hex_text = fields
        else:
            raise KeyFileError(f"line {number}: expected 'KEY_ID HEX_SECRET'")
        # ASCII digits only: str.isdigit() would pass "²" (which int() refuses) and "٣" (3).
        if _KEY_ID.fullmatch(key_text) is None or int(key_text) > 255:
            raise KeyFileError(f"line {number}: a key id is 0..255")
        key_id = int(key_text)
        try:
            secret = bytes.fromhex(hex_text)
        except ValueError:
            raise KeyFileError(f"line {number}: the secret is not hex") from None
        if len(secret) < MIN_KEY_BYTES:
            raise KeyFileError(f"line {number}: a secret has at least {MIN_KEY_BYTES} bytes")
        if key_id in lines:
            raise KeyFileError(
                f"line {number}: key id {key_id} appears twice (first on line {lines[key_id]})"
            )
        lines[key_id] = number
        keys.append(TicketKey(key_id, secret))
    if not keys:
        raise KeyFileError("no key in the file")
    return keys


def read_key_file(path: str | os.PathLike[str]) -> list[TicketKey]:
    """The keys of the file at `path`, signing key first. Raises KeyFileError."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise KeyFileError(f"cannot read {os.fspath(path)}: {error}") from None
    return parse_key_text(text)


def new_key_text(key_id: int = 1) -> str:
    """A fresh key file's contents (32 random bytes)."""
    return f"{key_id} {secrets.token_hex(32)}\n"
