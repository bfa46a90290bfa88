"""Key files for tickets and seats: what `echo-lobby --ticket-key` / `--seat-key` and
`echo-server --ticket-key` read.

A key file holds one key a line: ``KEY_ID HEX_SECRET`` (key id 0..255, at least 16 bytes of
secret as hex), or just ``HEX_SECRET`` (key id 1); blank lines and ``#`` comments are ignored.
The first key signs; every key verifies, so a rotation adds the new key first and keeps the old
one below it until the old tickets have expired. Make one with::

    echo "1 $(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n')" > game.key
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from echo.tickets.core import MIN_KEY_BYTES, TicketKey


class KeyFileError(ValueError):
    """A key file that cannot be read or holds no valid key (the message says which line)."""


def parse_key_text(text: str) -> list[TicketKey]:
    """The keys of a key file's text, signing key first. Raises KeyFileError."""
    keys: list[TicketKey] = []
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
        if not key_text.isdigit() or not 0 <= int(key_text) <= 255:
            raise KeyFileError(f"line {number}: a key id is 0..255")
        try:
            secret = bytes.fromhex(hex_text)
        except ValueError:
            raise KeyFileError(f"line {number}: the secret is not hex") from None
        if len(secret) < MIN_KEY_BYTES:
            raise KeyFileError(f"line {number}: a secret has at least {MIN_KEY_BYTES} bytes")
        if any(k.key_id == int(key_text) for k in keys):
            raise KeyFileError(f"line {number}: key id {key_text} appears twice")
        keys.append(TicketKey(int(key_text), secret))
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
