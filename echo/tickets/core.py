"""Signed game tickets: the lobby's `start` hands one to every member, and the
game server checks it at admission, before it opens a session.

Wire form (big-endian), at most 4 + 8 + 8 + 2 x 256 + 32 bytes:

======  ==========  =========================================================================
offset  field       meaning
======  ==========  =========================================================================
0       u8          format version, 1
1       u8          key id: which shared key signed it (rotation: a verifier holds old and new)
2       u64         lobby id
10      u64         expiry, UNIX time in milliseconds, at most 2^50 - 1 (exact as float seconds)
18      str8        member id (u8 length + UTF-8)
.       str8        game server id the ticket is for
.       32 bytes    HMAC-SHA256 under the key `key id` names, over every byte before it
======  ==========  =========================================================================

Expiry is wall-clock time because issuer and verifier are different machines: the ``now``
passed to `issue` and `verify` is UNIX seconds (the driver's ``time.time()``), unlike the
monotonic ``now`` of the lobby's state machines. The MAC is compared in constant time
(`hmac.compare_digest`) before any claim is believed. A ticket may be presented more than once
until it expires; the game server deduplicates by (lobby, member) if it cares.

`verify` takes bytes from the network and never raises: it returns the claims or a
`TicketRefusal` with a `TicketReason`. `decode_ticket_untrusted` raises only `TicketError`.

Pure module: no trio, no clock.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import math
from collections.abc import Callable, Mapping
from typing import Final

import attrs

from echo.codec import Buffer, CodecError

TICKET_VERSION: Final = 1
MAC_BYTES: Final = 32
MIN_KEY_BYTES: Final = 16
_HEAD_BYTES: Final = 1 + 1 + 8 + 8  # version, key id, lobby id, expiry
MAX_TICKET_BYTES: Final = _HEAD_BYTES + 2 * 256 + MAC_BYTES
MIN_TICKET_BYTES: Final = _HEAD_BYTES + 2 + MAC_BYTES
#: The latest expiry a ticket carries, in milliseconds (about the year 37,600): every value up
#: to it survives the float seconds of `TicketClaims.expires_at` and back exactly, so the claims
#: a verifier believes are the ones that were signed (a u64 of milliseconds would round).
MAX_EXPIRY_MILLIS: Final = 2**50 - 1


class TicketError(CodecError):
    """A ticket that cannot be made or read."""


class TicketReason(enum.IntEnum):
    MALFORMED = 1
    UNKNOWN_VERSION = 2
    UNKNOWN_KEY = 3  # signed with a key id this verifier does not hold
    BAD_SIGNATURE = 4
    WRONG_SERVER = 5
    EXPIRED = 6


@attrs.frozen
class TicketKey:
    key_id: int  # u8
    secret: bytes = attrs.field(repr=False)

    def __attrs_post_init__(self) -> None:
        if not 0 <= self.key_id <= 255:
            raise ValueError("a key id is a u8")
        if len(self.secret) < MIN_KEY_BYTES:
            raise ValueError(f"a ticket key has at least {MIN_KEY_BYTES} bytes")


@attrs.frozen
class TicketClaims:
    lobby_id: int
    member_id: str
    server_id: str
    expires_at: float  # UNIX seconds (millisecond resolution on the wire)
    key_id: int


@attrs.frozen
class TicketRefusal:
    reason: TicketReason
    detail: str


def _mac(secret: bytes, body: bytes) -> bytes:
    return hmac.new(secret, body, hashlib.sha256).digest()


def _push_id(buf: Buffer, s: str) -> None:
    try:
        data = s.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise TicketError(f"an id is not encodable as UTF-8: {exc.reason}") from None
    if not 1 <= len(data) <= 255:
        raise TicketError("member and server ids are 1..255 bytes of UTF-8")
    buf.push_bytes8(data)


def issue(
    key: TicketKey, lobby_id: int, member_id: str, server_id: str, expires_at: float
) -> bytes:
    """A ticket for `member_id` of `lobby_id` to enter game server `server_id` until
    `expires_at` (UNIX seconds). Raises TicketError for values that do not fit the format."""
    if not 0 <= lobby_id < 2**64:
        raise TicketError("a lobby id is a u64")
    if not math.isfinite(expires_at):
        raise TicketError("the expiry is not a finite time")
    millis = round(expires_at * 1000)
    if not 0 <= millis <= MAX_EXPIRY_MILLIS:
        raise TicketError(f"the expiry is not 0..{MAX_EXPIRY_MILLIS} milliseconds")
    buf = Buffer(error=TicketError)
    buf.push_uint8(TICKET_VERSION)
    buf.push_uint8(key.key_id)
    buf.push_uint64(lobby_id)
    buf.push_uint64(millis)
    _push_id(buf, member_id)
    _push_id(buf, server_id)
    body = buf.data
    return body + _mac(key.secret, body)


def decode_ticket_untrusted(data: bytes | bytearray | memoryview) -> tuple[TicketClaims, bytes]:
    """The claims a ticket makes and the bytes its MAC covers; checks only the structure.

    Raises only TicketError. Do not believe the claims before checking the MAC (`verify`).
    """
    raw = bytes(data)
    if not MIN_TICKET_BYTES <= len(raw) <= MAX_TICKET_BYTES:
        raise TicketError(f"a ticket has {MIN_TICKET_BYTES}..{MAX_TICKET_BYTES} bytes")
    body = raw[:-MAC_BYTES]
    buf = Buffer(body, error=TicketError)
    version = buf.pull_uint8()
    key_id = buf.pull_uint8()
    lobby_id = buf.pull_uint64()
    millis = buf.pull_uint64()
    if millis > MAX_EXPIRY_MILLIS:
        raise TicketError(f"an expiry of {millis} ms is beyond {MAX_EXPIRY_MILLIS}")
    ids: list[str] = []
    for _ in range(2):
        text = buf.pull_bytes8()
        if not text:
            raise TicketError("an id is empty")
        try:
            ids.append(text.decode("utf-8"))
        except UnicodeDecodeError:
            raise TicketError("an id is not UTF-8") from None
    if not buf.eof():
        raise TicketError("trailing bytes before the MAC")
    if version != TICKET_VERSION:
        raise TicketError(f"unknown ticket version {version}")
    return TicketClaims(lobby_id, ids[0], ids[1], millis / 1000, key_id), body


def verify(
    ticket: bytes | bytearray | memoryview,
    key: TicketKey | Mapping[int, bytes],
    server_id: str,
    now: float,
) -> TicketClaims | TicketRefusal:
    """Check a ticket presented to game server `server_id` at UNIX time `now`.

    `key` is the shared key, or a mapping key id -> secret during a rotation. Never raises.
    """
    raw = bytes(ticket)
    if len(raw) >= 2 and raw[0] != TICKET_VERSION:
        return TicketRefusal(TicketReason.UNKNOWN_VERSION, f"ticket version {raw[0]}")
    if not MIN_TICKET_BYTES <= len(raw) <= MAX_TICKET_BYTES:
        return TicketRefusal(TicketReason.MALFORMED, f"a ticket of {len(raw)} bytes")
    keys = {key.key_id: key.secret} if isinstance(key, TicketKey) else key
    secret = keys.get(raw[1])
    if secret is None:
        return TicketRefusal(TicketReason.UNKNOWN_KEY, f"key id {raw[1]} is not held here")
    # The MAC first: nothing of a forged ticket is parsed, let alone believed.
    if not hmac.compare_digest(_mac(secret, raw[:-MAC_BYTES]), raw[-MAC_BYTES:]):
        return TicketRefusal(TicketReason.BAD_SIGNATURE, "the signature does not match")
    try:
        claims, _ = decode_ticket_untrusted(raw)
    except TicketError as exc:
        # Only a holder of the key can get here: it signed garbage.
        return TicketRefusal(TicketReason.MALFORMED, str(exc))
    if not hmac.compare_digest(claims.server_id.encode(), server_id.encode()):
        return TicketRefusal(TicketReason.WRONG_SERVER, "the ticket is for another game server")
    if now >= claims.expires_at:
        return TicketRefusal(TicketReason.EXPIRED, "the ticket has expired")
    return claims


# The "server id" of a seat: seats are signed with the lobby servers' own key, never a game
# server's, and this id keeps a seat from ever passing as a game ticket even under one key.
SEAT_SERVER_ID: Final = "\x00lobby-seat"


class TicketSeats:
    """Seats for `LobbyRegistry(seats=...)`: a ticket for (lobby, member) to the pseudo-server
    `SEAT_SERVER_ID`, signed with the key every lobby server shares.

    A seat proves that the lobby's home once admitted the member; it lets that member, and only
    it, recreate the lobby on another server within `ttl` seconds of its last join. `clock`
    returns UNIX seconds (the driver passes ``time.time``): seats cross machines.
    """

    def __init__(
        self,
        key: TicketKey,
        *,
        ttl: float,
        clock: Callable[[], float],
        retired: Mapping[int, bytes] | None = None,
    ) -> None:
        if ttl <= 0:
            raise ValueError("a seat lives a positive time")
        self.key = key
        self.ttl = ttl
        self.clock = clock
        self.keys: dict[int, bytes] = {**(retired or {}), key.key_id: key.secret}

    def issue(self, lobby_id: int, member_id: str) -> bytes:
        return issue(self.key, lobby_id, member_id, SEAT_SERVER_ID, self.clock() + self.ttl)

    def check(self, seat: bytes, lobby_id: int, member_id: str) -> bool:
        claims = verify(seat, self.keys, SEAT_SERVER_ID, self.clock())
        return (
            isinstance(claims, TicketClaims)
            and claims.lobby_id == lobby_id
            and claims.member_id == member_id
        )

    def tag(self, lobby_id: int, member_id: str, secret: bytes) -> bytes:
        """The seat tag of `secret` (a client's hello secret) for (lobby, member): what the
        members' copies carry so that the next server gives the seat back to that client.

        Keyed (HMAC-SHA256 under the lobby servers' seat key), not a plain hash: a member who
        re-creates the lobby can put any bytes in its copy, and with a plain SHA-256 it would
        write sha256(a secret of its own) as another member's tag and then claim that seat with
        it. Without the key it cannot make a tag that any secret it knows matches. Bound to the
        lobby and the member, so a tag is worth nothing for another seat. The secret itself
        never leaves the client's hello; a tag reveals nothing of it (128 random bits behind a
        MAC). Truncated to 16 bytes (128 bits, as the secret): guessing is the only attack,
        bounded by the hello rate; snapshots carry one per member. The key id comes first so
        tags made before a key rotation still verify with the retired key."""
        mac = _seat_tag_mac(self.key.secret, lobby_id, member_id, secret)
        return bytes((self.key.key_id,)) + mac

    def tag_matches(self, tag: bytes, lobby_id: int, member_id: str, secret: bytes) -> bool:
        """Is `tag` the tag of `secret` for (lobby, member)? Never raises (tags come from
        members' copies: untrusted)."""
        if not secret or len(tag) != 1 + SEAT_TAG_MAC_BYTES:
            return False
        key = self.keys.get(tag[0])
        if key is None:
            return False
        return hmac.compare_digest(tag[1:], _seat_tag_mac(key, lobby_id, member_id, secret))


SEAT_TAG_MAC_BYTES: Final = 16
SEAT_TAG_BYTES: Final = 1 + SEAT_TAG_MAC_BYTES
_SEAT_TAG_DOMAIN: Final = b"echo-lobby seat tag 1\x00"


def _seat_tag_mac(key: bytes, lobby_id: int, member_id: str, secret: bytes) -> bytes:
    member = member_id.encode("utf-8", "surrogatepass")
    # Every part length-prefixed: no two (lobby, member, secret) give the same input.
    body = (
        _SEAT_TAG_DOMAIN
        + lobby_id.to_bytes(8, "big")
        + len(member).to_bytes(2, "big")
        + member
        + len(secret).to_bytes(2, "big")
        + secret
    )
    return hmac.new(key, body, hashlib.sha256).digest()[:SEAT_TAG_MAC_BYTES]


class TicketIssuer:
    """Game tickets for `LobbyRegistry(tickets=...)`, signed with the key the game servers hold;
    each lives `ttl` seconds from the start. `clock` returns UNIX seconds (``time.time``)."""

    def __init__(self, key: TicketKey, *, ttl: float, clock: Callable[[], float]) -> None:
        if ttl <= 0:
            raise ValueError("a ticket lives a positive time")
        self.key = key
        self.ttl = ttl
        self.clock = clock

    def issue(self, lobby_id: int, member_id: str, server_id: str) -> bytes:
        return issue(self.key, lobby_id, member_id, server_id, self.clock() + self.ttl)
