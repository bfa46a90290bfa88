"""Signed game tickets: the lobby's `start` hands one to every member, and the
game server checks it at admission, before it opens a session.

Wire form (big-endian), version 2, at most `MAX_TICKET_BYTES` (600) in all, so that a ticket
fits in a session HELLO (1,024 bytes, base64url, with the resume and key tails):

======  ==========  =========================================================================
offset  field       meaning
======  ==========  =========================================================================
0       u8          format version, 2
1       u8          key id: which shared key signed it (rotation: a verifier holds old and new)
2       u64         lobby id
10      u64         expiry, UNIX time in milliseconds, at most 2^50 - 1 (exact as float seconds)
18      u64         match id: one per game the lobby starts (0: none)
26      str8        member id (u8 length + UTF-8)
.       str8        game server id the ticket is for
.       roster      u8 count + count x (str8 member id, values: its attributes)
.       values      the lobby's metadata
.       32 bytes    HMAC-SHA256 under the key `key id` names, over every byte before it
======  ==========  =========================================================================

``values`` is a u8 count + count x (str8 key, u8 tag + body: 0 = str16, 1 = i64), keys unique.

Version 1 (the same without match id, roster and metadata) still verifies: its claims have
match id 0, an empty roster and empty metadata, and `TicketClaims.version` 1. `issue` writes
version 2 unless asked for 1.

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
from collections.abc import Callable, Iterable, Mapping
from typing import Final

import attrs

from echo.codec import Buffer, CodecError

TICKET_VERSION: Final = 2
#: The versions `verify` accepts (1: no match id, roster or metadata).
TICKET_VERSIONS: Final = (1, 2)
MAC_BYTES: Final = 32
MIN_KEY_BYTES: Final = 16
_HEAD_BYTES: Final = 1 + 1 + 8 + 8  # version, key id, lobby id, expiry
#: A ticket travels in the session's HELLO (at most 1,024 bytes, the credentials in
#: base64url beside the resume and key tails): 600 bytes are 800 characters there.
MAX_TICKET_BYTES: Final = 600
MIN_TICKET_BYTES: Final = _HEAD_BYTES + 2 + MAC_BYTES  # version 1, one-byte ids
_I64_MIN: Final = -(2**63)
_I64_MAX: Final = 2**63 - 1
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


Value = str | int


@attrs.frozen
class RosterEntry:
    """One seat of the lobby when its game started: the member and its attributes (a team,
    a character, ...), as the lobby held them."""

    member_id: str
    attributes: Mapping[str, Value] = attrs.field(factory=dict)


@attrs.frozen
class TicketClaims:
    """What a valid ticket says, once its MAC checked out (`verify`).

    ``lobby_id``, ``member_id``: who is coming, from which lobby; ``server_id``: the game
    server it is for (`verify` checked it is this one); ``expires_at``: UNIX seconds;
    ``key_id``: the key that signed it; ``match_id``: the game this ticket is for (the lobby
    draws one per start; a game result names it); ``roster``: every seat of the lobby at the
    start, in join order, with its attributes (the player's own is among them);
    ``metadata``: the lobby's metadata at the start (mode, map, ...); ``version``: the
    ticket's format (1 carries no match id, roster or metadata)."""

    lobby_id: int
    member_id: str
    server_id: str
    expires_at: float  # UNIX seconds (millisecond resolution on the wire)
    key_id: int
    match_id: int = 0
    roster: tuple[RosterEntry, ...] = ()
    metadata: Mapping[str, Value] = attrs.field(factory=dict)
    version: int = TICKET_VERSION

    def attributes_of(self, member_id: str) -> Mapping[str, Value] | None:
        """The attributes `member_id` had at the start, or None if it is not in the roster."""
        for entry in self.roster:
            if entry.member_id == member_id:
                return entry.attributes
        return None

    @property
    def attributes(self) -> Mapping[str, Value]:
        """This ticket's member's own attributes (empty if the roster does not name it)."""
        return self.attributes_of(self.member_id) or {}


@attrs.frozen
class TicketRefusal:
    """Why `verify` refused a ticket: ``reason`` (a `TicketReason`: MALFORMED,
    UNKNOWN_VERSION, UNKNOWN_KEY, BAD_SIGNATURE, WRONG_SERVER, EXPIRED) and a human
    ``detail``; a game server tells the player ``reason.name.lower()``."""

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
    key: TicketKey,
    lobby_id: int,
    member_id: str,
    server_id: str,
    expires_at: float,
    *,
    match_id: int = 0,
    roster: Iterable[RosterEntry] = (),
    metadata: Mapping[str, Value] | None = None,
    version: int = TICKET_VERSION,
) -> bytes:
    """A ticket for `member_id` of `lobby_id` to enter game server `server_id` until
    `expires_at` (UNIX seconds), for game `match_id`, naming the lobby's `roster` and
    `metadata`. Raises TicketError for values that do not fit the format (including a ticket
    over MAX_TICKET_BYTES: a roster too large for one)."""
    if version not in TICKET_VERSIONS:
        raise TicketError(f"unknown ticket version {version}")
    if not 0 <= lobby_id < 2**64:
        raise TicketError("a lobby id is a u64")
    if not math.isfinite(expires_at):
        raise TicketError("the expiry is not a finite time")
    millis = round(expires_at * 1000)
    if not 0 <= millis <= MAX_EXPIRY_MILLIS:
        raise TicketError(f"the expiry is not 0..{MAX_EXPIRY_MILLIS} milliseconds")
    entries = tuple(roster)
    buf = Buffer(error=TicketError)
    buf.push_uint8(version)
    buf.push_uint8(key.key_id)
    buf.push_uint64(lobby_id)
    buf.push_uint64(millis)
    if version == 1:
        if match_id or entries or metadata:
            raise TicketError("a version 1 ticket carries no match id, roster or metadata")
    else:
        if not 0 <= match_id < 2**64:
            raise TicketError("a match id is a u64")
        buf.push_uint64(match_id)
    _push_id(buf, member_id)
    _push_id(buf, server_id)
    if version != 1:
        if len(entries) > 255:
            raise TicketError("a roster names at most 255 members")
        buf.push_uint8(len(entries))
        for entry in entries:
            _push_id(buf, entry.member_id)
            _push_values(buf, entry.attributes)
        _push_values(buf, metadata or {})
    body = buf.data
    if len(body) + MAC_BYTES > MAX_TICKET_BYTES:
        raise TicketError(
            f"a ticket of {len(body) + MAC_BYTES} bytes is over {MAX_TICKET_BYTES}: "
            "the roster's attributes and the metadata do not fit"
        )
    return body + _mac(key.secret, body)


def _push_values(buf: Buffer, values: Mapping[str, Value]) -> None:
    if len(values) > 255:
        raise TicketError("at most 255 keys")
    buf.push_uint8(len(values))
    for k, v in values.items():
        buf.push_str8(k)
        if isinstance(v, str):
            buf.push_uint8(0)
            buf.push_str16(v)
        elif isinstance(v, int) and not isinstance(v, bool) and _I64_MIN <= v <= _I64_MAX:
            buf.push_uint8(1)
            buf.push_int64(v)
        else:
            raise TicketError(f"a value is a string or a 64-bit integer, not {v!r}")


def _pull_values(buf: Buffer) -> dict[str, Value]:
    out: dict[str, Value] = {}
    for _ in range(buf.pull_uint8()):
        k = buf.pull_str8()
        tag = buf.pull_uint8()
        v: Value
        if tag == 0:
            v = buf.pull_str16()
        elif tag == 1:
            v = buf.pull_int64()
        else:
            raise TicketError(f"unknown value tag {tag}")
        if k in out:
            raise TicketError(f"duplicate key {k!r}")
        out[k] = v
    return out


def _pull_id(buf: Buffer) -> str:
    text = buf.pull_bytes8()
    if not text:
        raise TicketError("an id is empty")
    try:
        return text.decode("utf-8")
    except UnicodeDecodeError:
        raise TicketError("an id is not UTF-8") from None


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
    if version not in TICKET_VERSIONS:
        raise TicketError(f"unknown ticket version {version}")
    key_id = buf.pull_uint8()
    lobby_id = buf.pull_uint64()
    millis = buf.pull_uint64()
    if millis > MAX_EXPIRY_MILLIS:
        raise TicketError(f"an expiry of {millis} ms is beyond {MAX_EXPIRY_MILLIS}")
    match_id = 0 if version == 1 else buf.pull_uint64()
    member_id = _pull_id(buf)
    server_id = _pull_id(buf)
    roster: list[RosterEntry] = []
    metadata: dict[str, Value] = {}
    if version != 1:
        for _ in range(buf.pull_uint8()):
            roster.append(RosterEntry(_pull_id(buf), _pull_values(buf)))
        metadata = _pull_values(buf)
    if not buf.eof():
        raise TicketError("trailing bytes before the MAC")
    claims = TicketClaims(
        lobby_id,
        member_id,
        server_id,
        millis / 1000,
        key_id,
        match_id,
        tuple(roster),
        metadata,
        version,
    )
    return claims, body


def verify(
    ticket: bytes | bytearray | memoryview,
    key: TicketKey | Mapping[int, bytes],
    server_id: str,
    now: float,
) -> TicketClaims | TicketRefusal:
    """Check a ticket presented to game server `server_id` at UNIX time `now`.

    `key` is the shared key, or a mapping key id -> secret during a rotation. Never raises:
    returns the `TicketClaims` (who, which lobby and match, the roster and metadata) or a
    `TicketRefusal` (its `reason` a `TicketReason`, and a `detail`). In an admission hook::

        keys = {k.key_id: k.secret for k in read_key_file("game.key")}

        def admit(peer, credentials):
            verdict = verify(credentials, keys, "10.0.0.5:9100", time.time())
            if isinstance(verdict, TicketRefusal):
                return f"ticket refused: {verdict.reason.name.lower()}"
            return echo.session.Admitted(verdict)   # the app reads session.admission
    """
    claims = open_ticket(ticket, key)
    if isinstance(claims, TicketRefusal):
        return claims
    if not hmac.compare_digest(claims.server_id.encode(), server_id.encode()):
        return TicketRefusal(TicketReason.WRONG_SERVER, "the ticket is for another game server")
    if now >= claims.expires_at:
        return TicketRefusal(TicketReason.EXPIRED, "the ticket has expired")
    return claims


def open_ticket(
    ticket: bytes | bytearray | memoryview, key: TicketKey | Mapping[int, bytes]
) -> TicketClaims | TicketRefusal:
    """The claims of a ticket signed under `key` (or one of the mapping key id -> secret),
    whatever game server it names and however old it is; else a `TicketRefusal`
    (UNKNOWN_VERSION, MALFORMED, UNKNOWN_KEY, BAD_SIGNATURE). What a lobby server that holds
    the ticket keys uses to believe a member's copy of its running game (`verify` is the game
    server's check, which adds the server and the expiry). Never raises."""
    raw = bytes(ticket)
    if len(raw) >= 2 and raw[0] not in TICKET_VERSIONS:
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
    return claims


# The "server id" of a seat: seats are signed with the lobby servers' own key, never a game
# server's, and this id keeps a seat from ever passing as a game ticket even under one key.
SEAT_SERVER_ID: Final = "\x00lobby-seat"


class _Signer:
    """What `TicketSeats` and `TicketIssuer` share: the key they sign with, the keys they
    accept (the retired ones of a rotation too), how long what they sign lives, their clock."""

    _WHAT = "what is signed"

    def __init__(
        self,
        key: TicketKey,
        *,
        ttl: float,
        clock: Callable[[], float],
        retired: Mapping[int, bytes] | None = None,
    ) -> None:
        if ttl <= 0:
            raise ValueError(f"{self._WHAT} lives a positive time")
        self.key = key
        self.ttl = ttl
        self.clock = clock
        #: every key what it signs may carry (the retired ones of a rotation too)
        self.keys: dict[int, bytes] = {**(retired or {}), key.key_id: key.secret}


class TicketSeats(_Signer):
    """Seats for `LobbyRegistry(seats=...)`: a ticket for (lobby, member) to the pseudo-server
    `SEAT_SERVER_ID`, signed with the key every lobby server shares.

    A seat proves that the lobby's home once admitted the member; it lets that member, and only
    it, recreate the lobby on another server within `ttl` seconds of its last join. `clock`
    returns UNIX seconds (the driver passes ``time.time``): seats cross machines.
    """

    _WHAT = "a seat"

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


class TicketIssuer(_Signer):
    """Game tickets for `LobbyRegistry(tickets=...)`, signed with the key the game servers hold;
    each lives `ttl` seconds from the start. `clock` returns UNIX seconds (``time.time``)."""

    _WHAT = "a ticket"

    def claims(self, ticket: bytes) -> TicketClaims | None:
        """The claims of a ticket signed with one of `keys`, whatever its age (`open_ticket`);
        None if it was not. A lobby server believes a member's copy of its game with it."""
        claims = open_ticket(ticket, self.keys)
        return claims if isinstance(claims, TicketClaims) else None

    def issue(
        self,
        lobby_id: int,
        member_id: str,
        server_id: str,
        *,
        match_id: int = 0,
        roster: Iterable[RosterEntry] = (),
        metadata: Mapping[str, Value] | None = None,
    ) -> bytes:
        """A ticket for the game `match_id` on `server_id`, living `ttl` seconds."""
        return issue(
            self.key,
            lobby_id,
            member_id,
            server_id,
            self.clock() + self.ttl,
            match_id=match_id,
            roster=roster,
            metadata=metadata,
        )
