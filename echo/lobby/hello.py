"""The lobby session's first exchange, before its logical channels open: who the member is.

The client's first session message is ``LOBBY1`` + str8 member id + bytes16 seat (empty, or
the seat of the lobby it sits in on that server: `echo.tickets.TicketSeats`), then,
optionally, u8 length + the client's *secret* (16..64 random bytes, made once per client), and
after the secret, optionally, u16 length + the member's *identity token* (a JWT from the game's
backend, 1..4096 bytes: `echo.lobby.identity`; a lobby with ``--auth-key`` needs it, one without
ignores it). The server answers ``LOBBY1 OK `` + its server id, then both sides open the
lobby's channels; or it closes the session with the reason (the client's `Rejected`-like
error). A member id is the member's claim (checked against its token's subject in a lobby
that verifies identities): a member already seated on that server (connected or
reconnecting) is taken back only with its seat, or by the client that was seated
(`SeatBindings`: the same secret), so nobody can take over another member's seat or see its
lobby.

Why the secret: a seat travels in the LobbyJoined reply, and a reply can be lost (the session
dropped under load right after the server seated the member, or the client gave up waiting).
Such a member is seated but never learned its seat; without the secret every hello of its
retry was refused until the grace period ended, and the lobby held a ghost.

The secret and the token are trailing fields so that a hello without them (a client from
before them) parses as it always did; a server from before one refuses a hello that carries it
(trailing bytes). A token travels only after a secret (every client that sends tokens sends a
secret).

A brand-new process of a member that crashed adds, after its (new) secret and its identity
token (which is empty, u16 0, where it has none), u16 length + its resume token
(`echo.lobby.resume`): the seat comes back to it, ready state and attributes, and is bound to
its new secret. Only a resuming client sends the field, so every other hello is the same bytes
as before it existed.

Pure module: no trio, no clock. ``parse_hello_untrusted`` raises only `HelloError`.
"""

from __future__ import annotations

import hmac
from typing import Final

import attrs

from echo.codec import Buffer, CodecError

MAGIC: Final = b"LOBBY1"
WELCOME: Final = b"LOBBY1 OK "
MAX_SEAT_BYTES: Final = 4096
MIN_SECRET_BYTES: Final = 16  # 128 bits: not guessed within a grace period
MAX_SECRET_BYTES: Final = 64
MAX_RESUME_BYTES: Final = 512
MAX_TOKEN_BYTES: Final = 4096
MAX_HELLO_BYTES: Final = (
    len(MAGIC)
    + 1
    + 255
    + 2
    + MAX_SEAT_BYTES
    + 1
    + MAX_SECRET_BYTES
    + 2
    + MAX_TOKEN_BYTES
    + 2
    + MAX_RESUME_BYTES
)


class HelloError(CodecError):
    """Bytes that are not a lobby hello."""


@attrs.frozen
class Hello:
    member_id: str
    seat: bytes = b""
    secret: bytes = b""  # empty: not sent (a client from before secrets)
    token: bytes = b""  # empty: not sent (development mode, or a client from before tokens)
    resume: bytes = b""  # a resume token (empty: not resuming); needs a secret


def encode_hello(hello: Hello) -> bytes:
    try:
        member = hello.member_id.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise HelloError(f"a member id is not encodable as UTF-8: {exc.reason}") from None
    if not 1 <= len(member) <= 255:
        raise HelloError("a member id is 1..255 bytes of UTF-8")
    if len(hello.seat) > MAX_SEAT_BYTES:
        raise HelloError(f"a seat of more than {MAX_SEAT_BYTES} bytes")
    out = Buffer(error=HelloError)
    out.push_bytes(MAGIC)
    out.push_bytes8(member)
    out.push_bytes16(hello.seat)
    if hello.secret:
        if not MIN_SECRET_BYTES <= len(hello.secret) <= MAX_SECRET_BYTES:
            raise HelloError(f"a secret is {MIN_SECRET_BYTES}..{MAX_SECRET_BYTES} bytes")
        out.push_bytes8(hello.secret)
    if hello.resume and not hello.secret:
        raise HelloError("a resuming hello carries a secret")
    if hello.token or hello.resume:
        if not hello.secret:
            raise HelloError("a token travels after a secret: give the hello a secret")
        if len(hello.token) > MAX_TOKEN_BYTES:
            raise HelloError(f"a token of more than {MAX_TOKEN_BYTES} bytes")
        out.push_bytes16(hello.token)  # empty: no identity token, a resume token follows
    if hello.resume:
        if len(hello.resume) > MAX_RESUME_BYTES:
            raise HelloError(f"a resume token of more than {MAX_RESUME_BYTES} bytes")
        out.push_bytes16(hello.resume)
    return out.data


def parse_hello_untrusted(data: bytes) -> Hello:
    """Raises only HelloError."""
    if not len(MAGIC) + 3 <= len(data) <= MAX_HELLO_BYTES or not data.startswith(MAGIC):
        raise HelloError("not a lobby hello")
    buf = Buffer(data, error=HelloError)
    buf.seek(len(MAGIC))
    n = buf.pull_uint8()
    if n == 0 or buf.remaining < n + 2:
        raise HelloError("a truncated member id")
    member = buf.pull_bytes(n)
    size = buf.pull_uint16()
    if buf.remaining < size:
        raise HelloError("a truncated seat")
    seat = buf.pull_bytes(size)
    secret = token = resume = b""
    if not buf.eof():
        length = buf.pull_uint8()
        if buf.remaining < length:
            raise HelloError("a truncated secret")
        secret = buf.pull_bytes(length)
        if not MIN_SECRET_BYTES <= length <= MAX_SECRET_BYTES:
            raise HelloError(f"a secret is {MIN_SECRET_BYTES}..{MAX_SECRET_BYTES} bytes")
    if not buf.eof():
        if buf.remaining < 2:
            raise HelloError("a truncated token or trailing bytes")
        length = buf.pull_uint16()
        if buf.remaining < length:
            raise HelloError("a truncated token")
        if length > MAX_TOKEN_BYTES:
            raise HelloError(f"a token is 1..{MAX_TOKEN_BYTES} bytes (0: none, before a resume)")
        token = buf.pull_bytes(length)
        if not buf.eof():
            if buf.remaining < 2:
                raise HelloError("a truncated resume token or trailing bytes")
            size = buf.pull_uint16()
            if buf.remaining != size or not 1 <= size <= MAX_RESUME_BYTES:
                raise HelloError("a truncated resume token or trailing bytes")
            resume = buf.pull_bytes(size)
        elif not token:
            raise HelloError("an empty token with no resume token after it")
    try:
        member_id = member.decode("utf-8")
    except UnicodeDecodeError:
        raise HelloError("a member id is not UTF-8") from None
    return Hello(member_id, bytes(seat), bytes(secret), bytes(token), bytes(resume))


class SeatBindings:
    """Which client each seat of this server belongs to: the hello secret of the session that
    was seated (or that last took the seat back), per member and lobby.

    A hello with the same secret takes the seat back without the seat itself: the client that
    was seated, whose LobbyJoined was lost. Another client naming the same member has another
    secret and still needs the seat. A binding counts only for the lobby it was made in, and
    only on this server (a re-created lobby elsewhere is joined with the seat).
    """

    def __init__(self) -> None:
        self._held: dict[str, tuple[int, bytes]] = {}

    def __len__(self) -> int:
        return len(self._held)

    def bind(self, member_id: str, lobby_id: int, secret: bytes) -> None:
        """`member_id`'s seat in `lobby_id` belongs to the client with `secret` (none: to
        whoever shows the seat)."""
        if secret:
            self._held[member_id] = (lobby_id, secret)
        else:
            self._held.pop(member_id, None)

    def holds(self, member_id: str, lobby_id: int, secret: bytes) -> bool:
        held = self._held.get(member_id)
        return (
            bool(secret)
            and held is not None
            and held[0] == lobby_id
            and hmac.compare_digest(held[1], secret)
        )

    def forget(self, member_id: str, lobby_id: int) -> None:
        """The member left `lobby_id` (left, kicked, banned, dropped, displaced)."""
        held = self._held.get(member_id)
        if held is not None and held[0] == lobby_id:
            del self._held[member_id]


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
