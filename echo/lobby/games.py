"""Game servers as the lobby sees them: announcements and the choice at start.

Game servers announce themselves and their free capacity on a topic (soft state, as in echo.topics):
each announcement lives `ttl` seconds unless repeated, so a game server that dies simply stops
being chosen. The owner's `StartGame` picks, among the live servers whose tags match its filters
(region, mode, version, ...), the one with the most free slots that fits the lobby (ties: the
lowest server id), and counts those slots as taken until that server's next announcement, so
two lobbies starting at once do not both fill the same last slots. A server whose tickets the
players report refused (a wrong key, a wrong server id) is out of rotation for `bench_time`
seconds, whatever it announces meanwhile.

Announcement wire form (the topic record), version 2: u8 version, str8 server id, str8 address
("host:port" where it admits sessions), u16 free slots, u16 control port, str8 duologue-port
mode ("per-client" or "shared"), u8 count + count x (str8 tag, str8 value), and, when the game
server has a key, its X25519 public key (32 bytes, to the end of the record): the lobby hands it
to the members with their tickets (`GameStarting.server_key`), so that their sessions to it are
encrypted without anyone typing a key (echo.lobby.keys). Version 1 (up to the free slots) still
parses: control port 0 (not announced), "per-client", no tags, no key.

Pure module: no trio, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

import attrs

from echo.codec import Buffer
from echo.lobby.protocol import LobbyProtocolError

ANNOUNCEMENT_VERSION: Final = 2
PUBLIC_KEY_BYTES: Final = 32
DUOLOGUE_MODES: Final = ("per-client", "shared")
MAX_TAGS: Final = 16


@attrs.frozen
class GameServerAnnouncement:
    """What a game server tells the lobby servers (`echo.lobby.server.announce_game_server`).

    ``server_id``: the id its tickets name (echo-server's is "host:port" of its data port);
    ``address``: "host:port" where players connect (its data port); ``free_slots``: how many
    more players it takes; ``control_port``: its control port (players need both);
    ``duologue_ports``: its `ServerConfig.duologue_ports` mode ("per-client" or "shared"),
    which the player's `connect` must use; ``tags``: what a `start` filters on (region, mode,
    version, ...); ``public_key``: its X25519 public key (32 bytes), or b"": it takes sessions
    in the clear."""

    server_id: str
    address: str
    free_slots: int
    control_port: int = 0
    duologue_ports: str = "per-client"
    tags: Mapping[str, str] = attrs.field(factory=dict)
    public_key: bytes = b""


def encode_announcement(a: GameServerAnnouncement) -> bytes:
    """Raises LobbyProtocolError for fields that do not fit."""
    buf = Buffer(error=LobbyProtocolError)
    buf.push_uint8(ANNOUNCEMENT_VERSION)
    for text in (a.server_id, a.address):
        _push_text(buf, text, "server ids and addresses are 1..255 bytes")
    for n in (a.free_slots, a.control_port):
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= 0xFFFF:
            raise LobbyProtocolError("free slots and the control port are u16")
        buf.push_uint16(n)
    if a.duologue_ports not in DUOLOGUE_MODES:
        raise LobbyProtocolError(f"the duologue-port mode is one of {DUOLOGUE_MODES}")
    buf.push_str8(a.duologue_ports)
    if len(a.tags) > MAX_TAGS:
        raise LobbyProtocolError(f"at most {MAX_TAGS} tags")
    buf.push_uint8(len(a.tags))
    for key, value in a.tags.items():
        _push_text(buf, key, "a tag is 1..255 bytes")
        if not isinstance(value, str):
            raise LobbyProtocolError("a tag's value is a string")
        buf.push_str8(value)
    if a.public_key:
        if not isinstance(a.public_key, bytes) or len(a.public_key) != PUBLIC_KEY_BYTES:
            raise LobbyProtocolError(f"a public key is {PUBLIC_KEY_BYTES} bytes")
        buf.push_bytes(a.public_key)
    return buf.data


def _push_text(buf: Buffer, text: str, why: str) -> None:
    if not isinstance(text, str):
        raise LobbyProtocolError(why)
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:
        raise LobbyProtocolError("not encodable as UTF-8") from None
    if not 1 <= len(data) <= 255:
        raise LobbyProtocolError(why)
    buf.push_bytes8(data)


def parse_announcement_untrusted(data: bytes | bytearray | memoryview) -> GameServerAnnouncement:
    """Decode a topic record. Raises only LobbyProtocolError."""
    raw = bytes(data)
    if len(raw) < 1 + 2 + 2 + 2 or len(raw) > 8192:
        raise LobbyProtocolError(f"an announcement of {len(raw)} bytes")
    buf = Buffer(raw, error=LobbyProtocolError)
    version = buf.pull_uint8()
    if version not in (1, 2):
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
    if version == 1:
        buf.check_end()
        return GameServerAnnouncement(texts[0], texts[1], free_slots)
    control_port = buf.pull_uint16()
    mode = buf.pull_str8()
    if mode not in DUOLOGUE_MODES:
        raise LobbyProtocolError(f"unknown duologue-port mode {mode!r}")
    tags: dict[str, str] = {}
    count = buf.pull_uint8()
    if count > MAX_TAGS:
        raise LobbyProtocolError(f"{count} tags (at most {MAX_TAGS})")
    for _ in range(count):
        key = buf.pull_str8()
        if not key or key in tags:
            raise LobbyProtocolError("a tag is empty or named twice")
        tags[key] = buf.pull_str8()
    public_key = b"" if buf.eof() else buf.pull_bytes(PUBLIC_KEY_BYTES)
    buf.check_end()
    return GameServerAnnouncement(
        texts[0], texts[1], free_slots, control_port, mode, tags, public_key
    )


def tags_match(tags: Mapping[str, str], wanted: Iterable[tuple[str, str]]) -> bool:
    """Does a server with `tags` carry every (tag, value) of `wanted`?"""
    return all(tags.get(key) == value for key, value in wanted)


@attrs.define
class _Entry:
    announcement: GameServerAnnouncement
    expires_at: float
    reserved: int = 0


class GameServerDirectory:
    """The live game servers, from their announcements."""

    def __init__(self, *, ttl: float = 5.0, bench_time: float = 60.0) -> None:
        if ttl <= 0 or bench_time <= 0:
            raise ValueError("an announcement and a bench live a positive time")
        self.ttl = ttl
        self.bench_time = bench_time
        self._servers: dict[str, _Entry] = {}
        self._benched: dict[str, float] = {}  # server id -> out of rotation until then

    def announce(self, a: GameServerAnnouncement, now: float) -> None:
        """A (repeated) announcement: it replaces the last one, and any reservation, since the
        server counts its own sessions, including those of tickets it admitted."""
        self._servers[a.server_id] = _Entry(a, now + self.ttl)

    def withdraw(self, server_id: str) -> None:
        self._servers.pop(server_id, None)

    def bench(self, server_id: str, now: float) -> None:
        """Take `server_id` out of rotation for `bench_time` (its tickets are refused)."""
        self._benched[server_id] = now + self.bench_time

    def benched(self, now: float) -> list[str]:
        self._expire(now)
        return sorted(self._benched)

    def live(self, now: float) -> list[GameServerAnnouncement]:
        self._expire(now)
        return [e.announcement for e in sorted(self._servers.values(), key=_by_id)]

    def get(self, server_id: str, now: float) -> GameServerAnnouncement | None:
        """`server_id`'s live announcement (benched or not), or None."""
        self._expire(now)
        e = self._servers.get(server_id)
        return None if e is None else e.announcement

    def free_slots(self, server_id: str, now: float) -> int | None:
        self._expire(now)
        e = self._servers.get(server_id)
        return None if e is None else e.announcement.free_slots - e.reserved

    def choose(
        self, needed: int, now: float, wanted: Iterable[tuple[str, str]] = ()
    ) -> GameServerAnnouncement | None:
        """The live server in rotation whose tags match `wanted` with the most free slots
        >= `needed` (ties: the lowest id); nothing is reserved (`reserve` does)."""
        self._expire(now)
        wanted = tuple(wanted)
        best: _Entry | None = None
        for e in sorted(self._servers.values(), key=_by_id):
            if e.announcement.server_id in self._benched:
                continue
            if not tags_match(e.announcement.tags, wanted):
                continue
            free = e.announcement.free_slots - e.reserved
            if free >= needed and (
                best is None or free > best.announcement.free_slots - best.reserved
            ):
                best = e
        return None if best is None else best.announcement

    def reserve(self, server_id: str, needed: int) -> None:
        e = self._servers.get(server_id)
        if e is not None:
            e.reserved += needed

    def pick(
        self, needed: int, now: float, wanted: Iterable[tuple[str, str]] = ()
    ) -> GameServerAnnouncement | None:
        """`choose`, and its slots reserved."""
        best = self.choose(needed, now, wanted)
        if best is not None:
            self.reserve(best.server_id, needed)
        return best

    def _expire(self, now: float) -> None:
        for server_id in [s for s, e in self._servers.items() if e.expires_at <= now]:
            del self._servers[server_id]
        for server_id in [s for s, until in self._benched.items() if until <= now]:
            del self._benched[server_id]


def _by_id(e: _Entry) -> str:
    return e.announcement.server_id
