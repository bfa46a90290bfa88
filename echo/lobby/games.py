"""Game servers as the lobby sees them: announcements and the choice at start.

Game servers announce themselves and their free capacity on a topic (soft state, as in echo.topics):
each announcement lives `ttl` seconds unless repeated, so a game server that dies simply stops
being chosen. The owner's `StartGame` picks the live server with the most free slots that fits
the lobby (ties: the lowest server id), and counts those slots as taken until that server's next
announcement, so two lobbies starting at once do not both fill the same last slots.

Announcement wire form (the topic record): u8 version, str8 server id, str8 address ("host:port"
where it admits sessions), u16 free slots; version 2 adds the game server's X25519 public key
(32 bytes), which the lobby hands its members with their tickets (`GameStarting.server_key`) so
that their sessions to it are encrypted without anyone typing a key (echo.lobby.keys). A server
without a key announces version 1, byte for byte what lobby servers from before keys read.

Pure module: no trio, no clock.
"""

from __future__ import annotations

from typing import Final

import attrs

from echo.codec import Buffer
from echo.lobby.protocol import LobbyProtocolError

ANNOUNCEMENT_VERSION: Final = 1
#: the version that carries a public key
ANNOUNCEMENT_VERSION_KEYED: Final = 2
PUBLIC_KEY_BYTES: Final = 32


@attrs.frozen
class GameServerAnnouncement:
    server_id: str
    address: str
    free_slots: int
    #: the game server's X25519 public key (32 bytes), or b"": it takes sessions in the clear
    public_key: bytes = b""


def encode_announcement(a: GameServerAnnouncement) -> bytes:
    """Raises LobbyProtocolError for fields that do not fit."""
    key = a.public_key
    if not isinstance(key, bytes) or len(key) not in (0, PUBLIC_KEY_BYTES):
        raise LobbyProtocolError(f"a public key is {PUBLIC_KEY_BYTES} bytes (or none)")
    buf = Buffer(error=LobbyProtocolError)
    buf.push_uint8(ANNOUNCEMENT_VERSION_KEYED if key else ANNOUNCEMENT_VERSION)
    for text in (a.server_id, a.address):
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            raise LobbyProtocolError("not encodable as UTF-8") from None
        if not 1 <= len(data) <= 255:
            raise LobbyProtocolError("server ids and addresses are 1..255 bytes")
        buf.push_bytes8(data)
    slots = a.free_slots
    if isinstance(slots, bool) or not isinstance(slots, int) or not 0 <= slots <= 0xFFFF:
        raise LobbyProtocolError("free slots is a u16")
    buf.push_uint16(a.free_slots)
    buf.push_bytes(key)
    return buf.data


def parse_announcement_untrusted(data: bytes | bytearray | memoryview) -> GameServerAnnouncement:
    """Decode a topic record. Raises only LobbyProtocolError."""
    raw = bytes(data)
    if len(raw) < 1 + 2 + 2 + 2 or len(raw) > 1 + 2 * 256 + 2 + PUBLIC_KEY_BYTES:
        raise LobbyProtocolError(f"an announcement of {len(raw)} bytes")
    buf = Buffer(raw, error=LobbyProtocolError)
    version = buf.pull_uint8()
    if version not in (ANNOUNCEMENT_VERSION, ANNOUNCEMENT_VERSION_KEYED):
        raise LobbyProtocolError(f"unknown announcement version {version}")
    texts: list[str] = []
    for _ in range(2):
        chunk = buf.pull_bytes8()
        if not chunk:
            raise LobbyProtocolError("an empty field")
        try:
            texts.append(chunk.decode("utf-8"))
        except UnicodeDecodeError:
            raise LobbyProtocolError("a field is not UTF-8") from None
    free_slots = buf.pull_uint16()
    key = buf.pull_bytes(PUBLIC_KEY_BYTES) if version == ANNOUNCEMENT_VERSION_KEYED else b""
    if not buf.eof():
        raise LobbyProtocolError("trailing bytes after the announcement")
    return GameServerAnnouncement(texts[0], texts[1], free_slots, key)


@attrs.define
class _Entry:
    announcement: GameServerAnnouncement
    expires_at: float
    reserved: int = 0


class GameServerDirectory:
    """The live game servers, from their announcements."""

    def __init__(self, *, ttl: float = 5.0) -> None:
        if ttl <= 0:
            raise ValueError("an announcement lives a positive time")
        self.ttl = ttl
        self._servers: dict[str, _Entry] = {}

    def announce(self, a: GameServerAnnouncement, now: float) -> None:
        """A (repeated) announcement: it replaces the last one, and any reservation, since the
        server counts its own sessions, including those of tickets it admitted."""
        self._servers[a.server_id] = _Entry(a, now + self.ttl)

    def withdraw(self, server_id: str) -> None:
        self._servers.pop(server_id, None)

    def live(self, now: float) -> list[GameServerAnnouncement]:
        self._expire(now)
        return [e.announcement for e in sorted(self._servers.values(), key=_by_id)]

    def free_slots(self, server_id: str, now: float) -> int | None:
        self._expire(now)
        e = self._servers.get(server_id)
        return None if e is None else e.announcement.free_slots - e.reserved

    def pick(self, needed: int, now: float) -> GameServerAnnouncement | None:
        """The live server with the most free slots >= `needed`, which are then reserved."""
        self._expire(now)
        best: _Entry | None = None
        for e in sorted(self._servers.values(), key=_by_id):
            free = e.announcement.free_slots - e.reserved
            if free >= needed and (
                best is None or free > best.announcement.free_slots - best.reserved
            ):
                best = e
        if best is None:
            return None
        best.reserved += needed
        return best.announcement

    def _expire(self, now: float) -> None:
        for server_id in [s for s, e in self._servers.items() if e.expires_at <= now]:
            del self._servers[server_id]


def _by_id(e: _Entry) -> str:
    return e.announcement.server_id
