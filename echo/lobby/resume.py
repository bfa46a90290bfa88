"""Resume tokens: how a member's brand-new process takes its seat back after a crash.

A seated member's session gets a resume token (`ResumeToken` message) as soon as it is seated,
again whenever its seat changes, and refreshed while it stays seated. The token names the
lobby, the member and the hello secret of the client that holds the seat, with an expiry, and
is signed with the lobby servers' shared seat key (`echo.tickets.TicketSeats`), so the home
and any server the lobby is re-created on check it alike. A new process sends it in its hello
(`echo.lobby.hello.Hello.resume`) together with a fresh secret of its own; the server gives the
seat back when `check_resume` says so, and binds the seat to the new secret. From then on the
old secret holds nothing, so the same token cannot take the seat a second time (a replay, or a
second copy of a state file), and the old session, if still half-open, is replaced.

Wire form (big-endian):

======  ==========  =========================================================================
offset  field       meaning
======  ==========  =========================================================================
0       u8          format version, 0x52 ("R"): never a ticket's version
1       u8          key id of the seat key that signed it
2       u64         lobby id
10      u64         expiry, UNIX time in milliseconds
18      str8        member id (u8 length + UTF-8)
.       bytes8      the seat secret: the hello secret of the client the seat is bound to
.       32 bytes    HMAC-SHA256 under the seat key, over a domain string and every byte before
======  ==========  =========================================================================

The MAC input starts with a domain string of its own, so a token never verifies as a seat or a
game ticket under the same key, nor they as a token. Expiry is UNIX time (the token crosses
machines, as seats do). A token lives `token_ttl(reconnect_grace)`: two grace periods, renewed
every grace period while its member is seated, so whenever a process dies its token outlives
the seat's grace period and is worth nothing soon after.

`decode_resume_token_untrusted` raises only `ResumeTokenError`; `verify_resume_token` and
`check_resume` never raise. Secrets and MACs are compared with `hmac.compare_digest`.

Pure module: no trio, no clock.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import math
from collections.abc import Mapping
from typing import Final, Protocol

import attrs

from echo.codec import Buffer, CodecError
from echo.lobby.hello import SeatBindings
from echo.tickets.core import TicketKey

RESUME_VERSION: Final = 0x52
MAC_BYTES: Final = 32
_DOMAIN: Final = b"echo-lobby resume token 1\x00"
_HEAD_BYTES: Final = 1 + 1 + 8 + 8
MIN_TOKEN_BYTES: Final = _HEAD_BYTES + 2 + 1 + MAC_BYTES
MAX_TOKEN_BYTES: Final = _HEAD_BYTES + 1 + 255 + 1 + 64 + MAC_BYTES
MIN_SECRET_BYTES: Final = 16
MAX_SECRET_BYTES: Final = 64


def token_ttl(reconnect_grace: float) -> float:
    """How long a token lives: two grace periods (renewed every one, see the module text)."""
    return 2 * reconnect_grace


class ResumeTokenError(CodecError):
    """Bytes that are not a resume token (or values that do not fit one)."""


class ResumeReason(enum.IntEnum):
    """Why a resume was refused (the server's close reason names it: ``resume refused:
    EXPIRED: ...``)."""

    MALFORMED = 1  # not a resume token
    UNKNOWN_KEY = 2  # signed with a key id no lobby server here holds
    FORGED = 3  # the signature does not match
    EXPIRED = 4
    WRONG_MEMBER = 5  # the hello names another member than the token
    NOT_SEATED = 6  # the member holds no seat in that lobby here (gone, or not re-created yet)
    REPLAYED = 7  # the seat was already taken back (this token was used, or a newer client)


@attrs.frozen
class ResumeClaims:
    lobby_id: int
    member_id: str
    secret: bytes = attrs.field(repr=False)
    expires_at: float  # UNIX seconds
    key_id: int


@attrs.frozen
class ResumeRefusal:
    reason: ResumeReason
    detail: str

    def close_reason(self) -> str:
        """The session close reason the client reads the reason back from."""
        return f"resume refused: {self.reason.name}: {self.detail}"


def parse_refusal_reason(text: str) -> ResumeReason | None:
    """The reason in a close reason made by `ResumeRefusal.close_reason` (None: not one)."""
    marker = "resume refused: "
    at = text.find(marker)
    if at < 0:
        return None
    name = text[at + len(marker) :].split(":", 1)[0].strip()
    return ResumeReason.__members__.get(name)


def _mac(secret: bytes, body: bytes) -> bytes:
    return hmac.new(secret, _DOMAIN + body, hashlib.sha256).digest()


def issue_resume_token(
    key: TicketKey, lobby_id: int, member_id: str, secret: bytes, expires_at: float
) -> bytes:
    """A token for `member_id`'s seat in `lobby_id`, bound to the client with `secret`, valid
    until `expires_at` (UNIX seconds). Raises ResumeTokenError for values that do not fit."""
    if not 0 <= lobby_id < 2**64:
        raise ResumeTokenError("a lobby id is a u64")
    if not math.isfinite(expires_at) or not 0 <= round(expires_at * 1000) < 2**64:
        raise ResumeTokenError("the expiry does not fit a u64 of milliseconds")
    if not MIN_SECRET_BYTES <= len(secret) <= MAX_SECRET_BYTES:
        raise ResumeTokenError(f"a seat secret is {MIN_SECRET_BYTES}..{MAX_SECRET_BYTES} bytes")
    try:
        member = member_id.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ResumeTokenError(f"a member id is not UTF-8: {exc.reason}") from None
    if not 1 <= len(member) <= 255:
        raise ResumeTokenError("a member id is 1..255 bytes of UTF-8")
    buf = Buffer(error=ResumeTokenError)
    buf.push_uint8(RESUME_VERSION)
    buf.push_uint8(key.key_id)
    buf.push_uint64(lobby_id)
    buf.push_uint64(round(expires_at * 1000))
    buf.push_bytes8(member)
    buf.push_bytes8(secret)
    body = buf.data
    return body + _mac(key.secret, body)


def decode_resume_token_untrusted(data: bytes | bytearray | memoryview) -> ResumeClaims:
    """The claims a token makes; checks only its structure (clients read the lobby id from
    it). Raises only ResumeTokenError. Believe nothing before `verify_resume_token`."""
    raw = bytes(data)
    if not MIN_TOKEN_BYTES <= len(raw) <= MAX_TOKEN_BYTES:
        raise ResumeTokenError(f"a resume token has {MIN_TOKEN_BYTES}..{MAX_TOKEN_BYTES} bytes")
    buf = Buffer(raw[:-MAC_BYTES], error=ResumeTokenError)
    version = buf.pull_uint8()
    if version != RESUME_VERSION:
        raise ResumeTokenError(f"not a resume token (version byte 0x{version:02x})")
    key_id = buf.pull_uint8()
    lobby_id = buf.pull_uint64()
    millis = buf.pull_uint64()
    member = buf.pull_bytes8()
    secret = buf.pull_bytes8()
    if not buf.eof():
        raise ResumeTokenError("trailing bytes before the MAC")
    if not member:
        raise ResumeTokenError("an empty member id")
    if not MIN_SECRET_BYTES <= len(secret) <= MAX_SECRET_BYTES:
        raise ResumeTokenError(f"a seat secret is {MIN_SECRET_BYTES}..{MAX_SECRET_BYTES} bytes")
    try:
        member_id = member.decode("utf-8")
    except UnicodeDecodeError:
        raise ResumeTokenError("a member id is not UTF-8") from None
    return ResumeClaims(lobby_id, member_id, bytes(secret), millis / 1000, key_id)


def verify_resume_token(
    data: bytes | bytearray | memoryview, keys: Mapping[int, bytes], now: float
) -> ResumeClaims | ResumeRefusal:
    """The claims of a token signed with one of `keys` (key id -> secret) and not expired at
    UNIX time `now`. Never raises."""
    raw = bytes(data)
    if not MIN_TOKEN_BYTES <= len(raw) <= MAX_TOKEN_BYTES or raw[0] != RESUME_VERSION:
        return ResumeRefusal(ResumeReason.MALFORMED, "not a resume token")
    secret = keys.get(raw[1])
    if secret is None:
        return ResumeRefusal(ResumeReason.UNKNOWN_KEY, f"key id {raw[1]} is not held here")
    # The MAC first: nothing of a forged token is believed.
    if not hmac.compare_digest(_mac(secret, raw[:-MAC_BYTES]), raw[-MAC_BYTES:]):
        return ResumeRefusal(ResumeReason.FORGED, "the signature does not match")
    try:
        claims = decode_resume_token_untrusted(raw)
    except ResumeTokenError as exc:
        return ResumeRefusal(ResumeReason.MALFORMED, str(exc))  # signed garbage
    if now >= claims.expires_at:
        return ResumeRefusal(ResumeReason.EXPIRED, "the token has expired")
    return claims


class SeatHolder(Protocol):
    """What `check_resume` asks of the registry (`LobbyRegistry`)."""

    def lobby_of(self, member_id: str) -> int | None: ...

    def holds_secret(self, member_id: str, secret: bytes) -> bool: ...


def check_resume(
    registry: SeatHolder,
    member_id: str,
    token: bytes,
    keys: Mapping[int, bytes],
    now: float,
    *,
    bindings: SeatBindings | None = None,
) -> int | ResumeRefusal:
    """May the hello of `member_id` carrying `token` take its seat back, at UNIX time `now`?
    The lobby id if so. Never raises.

    The seat must still be here (within its grace period, on the home or on the server the
    lobby was re-created on) and still be bound to the token's secret: the registry's seat tag,
    or this server's `bindings`. A session of the member
    that still looks alive does not matter: the token's holder replaces it.
    """
    claims = verify_resume_token(token, keys, now)
    if isinstance(claims, ResumeRefusal):
        return claims
    if not hmac.compare_digest(claims.member_id.encode(), member_id.encode()):
        return ResumeRefusal(ResumeReason.WRONG_MEMBER, "the token is another member's")
    lobby_id = registry.lobby_of(member_id)
    if lobby_id != claims.lobby_id:
        return ResumeRefusal(
            ResumeReason.NOT_SEATED,
            f"no seat of this member in lobby {claims.lobby_id} here (its grace period is "
            "over, or the lobby lives on another server)",
        )
    if registry.holds_secret(member_id, claims.secret) or (
        bindings is not None and bindings.holds(member_id, lobby_id, claims.secret)
    ):
        return lobby_id
    return ResumeRefusal(
        ResumeReason.REPLAYED,
        "the seat was already taken back (this token was used, or a newer client holds it)",
    )
