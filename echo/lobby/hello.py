"""The lobby session's first exchange, before its logical channels open: who the member is.

The client's first session message is ``LOBBY1`` + str8 member id + bytes16 seat (empty, or
the seat of the lobby it sits in on that server: `echo.lobby.tickets.TicketSeats`). The server
answers ``LOBBY1 OK `` + its server id, then both sides open the lobby's channels; or it closes
the session with the reason (the client's `Rejected`-like error). A member id is the member's
claim: a member already seated on that server (connected or reconnecting) is taken back only
with its seat, so nobody can take over another member's seat or see its lobby.

Pure module: no trio, no clock. ``parse_hello_untrusted`` raises only `HelloError`.
"""

from __future__ import annotations

from typing import Final

import attrs

MAGIC: Final = b"LOBBY1"
WELCOME: Final = b"LOBBY1 OK "
MAX_HELLO_BYTES: Final = len(MAGIC) + 1 + 255 + 2 + 4096


class HelloError(Exception):
    """Bytes that are not a lobby hello."""


@attrs.frozen
class Hello:
    member_id: str
    seat: bytes = b""


def encode_hello(hello: Hello) -> bytes:
    member = hello.member_id.encode("utf-8")
    if not 1 <= len(member) <= 255:
        raise HelloError("a member id is 1..255 bytes of UTF-8")
    if len(hello.seat) > 4096:
        raise HelloError("a seat of more than 4096 bytes")
    return MAGIC + bytes((len(member),)) + member + len(hello.seat).to_bytes(2, "big") + hello.seat


def parse_hello_untrusted(data: bytes) -> Hello:
    """Raises only HelloError."""
    if not len(MAGIC) + 3 <= len(data) <= MAX_HELLO_BYTES or not data.startswith(MAGIC):
        raise HelloError("not a lobby hello")
    pos = len(MAGIC)
    n = data[pos]
    member = data[pos + 1 : pos + 1 + n]
    pos += 1 + n
    if n == 0 or len(member) != n or len(data) < pos + 2:
        raise HelloError("a truncated member id")
    size = int.from_bytes(data[pos : pos + 2], "big")
    seat = data[pos + 2 :]
    if len(seat) != size:
        raise HelloError("a truncated seat or trailing bytes")
    try:
        member_id = member.decode("utf-8")
    except UnicodeDecodeError:
        raise HelloError("a member id is not UTF-8") from None
    return Hello(member_id, bytes(seat))


def encode_welcome(server_id: str) -> bytes:
    return WELCOME + server_id.encode("utf-8")


def parse_welcome_untrusted(data: bytes) -> str | None:
    """The server id in a welcome, or None if `data` is not one."""
    if not data.startswith(WELCOME) or len(data) > len(WELCOME) + 255:
        return None
    try:
        return data[len(WELCOME) :].decode("utf-8")
    except UnicodeDecodeError:
        return None
