"""The lobby client's state file: the resume token a restarted ``echo-lobby-client`` takes its
seat back with (``--state-file``).

One JSON object: ``{"format": 1, "member": ID, "lobby": LOBBY_ID, "token": HEX}``. Written
atomically (a temporary file in the same directory, flushed to disk, then ``os.replace``:
a reader sees the old file or the new one, never half of one) with mode 0600, as the token is
a credential for the seat until it expires. Removed when the member leaves its lobby.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Final

import attrs

FORMAT: Final = 1
MAX_STATE_BYTES: Final = 4096


class StateFileError(Exception):
    """A state file that cannot be read as one (its text says what is wrong)."""


@attrs.frozen
class SavedSeat:
    member: str
    lobby_id: int
    token: bytes = attrs.field(repr=False)


def read_state(path: str | os.PathLike[str]) -> SavedSeat | None:
    """The seat saved in `path`; None if there is no such file. Raises StateFileError for a
    file that is there and is not a state file (unreadable, corrupt, truncated)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_STATE_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise StateFileError(f"cannot read it: {error.strerror}") from None
    if len(data) > MAX_STATE_BYTES:
        raise StateFileError(f"more than {MAX_STATE_BYTES} bytes: not a state file")
    try:
        record = json.loads(data)
        if not isinstance(record, dict) or record.get("format") != FORMAT:
            raise ValueError(f"not format {FORMAT}")
        member, lobby_id, token = record["member"], record["lobby"], record["token"]
        if not isinstance(member, str) or not member:
            raise ValueError("no member id")
        if not isinstance(lobby_id, int) or isinstance(lobby_id, bool) or lobby_id < 0:
            raise ValueError("no lobby id")
        if not isinstance(token, str):
            raise ValueError("no token")
        return SavedSeat(member, lobby_id, bytes.fromhex(token))
    except (ValueError, KeyError, TypeError) as error:
        raise StateFileError(f"corrupt ({error})") from None


def write_state(path: str | os.PathLike[str], seat: SavedSeat) -> None:
    """Save `seat` in `path` atomically, mode 0600."""
    target = Path(path)
    record = {"format": FORMAT, "member": seat.member, "lobby": seat.lobby_id}
    text = json.dumps({**record, "token": seat.token.hex()})
    # mkstemp makes the file 0600 and unique in the target's directory (same file system:
    # os.replace is then an atomic rename).
    fd, temp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def remove_state(path: str | os.PathLike[str]) -> None:
    """No seat to resume any more (the member left, or the token was refused)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
