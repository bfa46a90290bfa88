"""The records of the lobby registry (`echo.lobby.state`): a lobby and its seats, what an
operation sends and to whom, the refusal short-cut, the seat-tag rules and the value sizes.

Pure module: no trio, no clock.
"""

from __future__ import annotations

import hmac
import secrets
import unicodedata
from collections.abc import Iterable, Mapping
from typing import Final, NoReturn, Protocol

import attrs

from echo.lobby.gameloop import RunningGame
from echo.lobby.protocol import (
    ChatLine,
    CreateLobby,
    ErrorCode,
    GameLife,
    GameStarting,
    LobbySnapshot,
    MemberState,
    Presence,
    Reply,
    SeatTags,
    Update,
    Value,
)
from echo.lobby.queue_wire import Matched, QueueLeft
from echo.tickets.core import RosterEntry, TicketClaims

CODE_ALPHABET: Final = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"  # no 0/O, 1/I: codes are read aloud
MAX_COPY_VERSION: Final = 2**62
CODE_LENGTH: Final = 8  # 40 bits; guessing is further slowed by the join rate limit
# Seat tags kept per seat: copies may disagree (one is stale, or a hostile re-creator's), and
# keeping each copy's (one per seat and sender) lets the seat's own client in whichever is
# true; bounded so that copies cannot grow a snapshot's tags without end.
MAX_SEAT_TAGS: Final = 4
MAX_SEAT_TAG_BYTES: Final = 64


def random_lobby_id() -> int:
    """A random nonzero 63-bit id: unique across servers without coordination."""
    return secrets.randbits(63) | 1


def random_join_code() -> str:
    return "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))


class Tickets(Protocol):
    """Issues game tickets (`echo.tickets.TicketIssuer` is the real one)."""

    def issue(
        self,
        lobby_id: int,
        member_id: str,
        server_id: str,
        *,
        match_id: int = 0,
        roster: Iterable[RosterEntry] = (),
        metadata: Mapping[str, Value] | None = None,
    ) -> bytes: ...

    def claims(self, ticket: bytes) -> TicketClaims | None:
        """The claims of a ticket signed with these keys, whatever its age; None if not."""
        ...


class Seats(Protocol):
    """Signs and checks seats (`echo.tickets.TicketSeats` is the real one)."""

    def issue(self, lobby_id: int, member_id: str) -> bytes: ...

    def check(self, seat: bytes, lobby_id: int, member_id: str) -> bool: ...

    def tag(self, lobby_id: int, member_id: str, secret: bytes) -> bytes: ...

    def tag_matches(self, tag: bytes, lobby_id: int, member_id: str, secret: bytes) -> bool: ...


@attrs.frozen
class Send:
    """One message to some members; the channel follows from the message (`channel_of`)."""

    to: tuple[str, ...]
    # (a reply only from the matchmaker's desk: a LobbyJoined of request id 0)
    message: (
        Update | GameStarting | GameLife | SeatTags | ChatLine | Reply | Matched | QueueLeft
    )


@attrs.frozen
class Handled:
    reply: Reply
    sends: tuple[Send, ...]


class _Refuse(Exception):
    """Internal short-cut of validation; always turned into a Refusal before `handle` returns."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _refuse(code: ErrorCode, message: str) -> NoReturn:
    raise _Refuse(code, message)


@attrs.define
class _Member:
    member_id: str
    join_seq: int
    ready: bool = False
    presence: Presence = Presence.CONNECTED
    attributes: dict[str, Value] = attrs.Factory(dict)
    grace_until: float | None = None
    # Has this member shown up on this server? False only for the seats a recreated lobby keeps
    # for members of the copy who have not come back yet.
    arrived: bool = True
    # The seat's tags (`Seats.tag` of the hello secret of the client seated by a request, or
    # those of the copies for a seat not yet claimed), by who brought each (the member itself,
    # or the sender of a copy: one each): that client takes the seat back with its secret
    # alone, here or on the next server (the tags travel in the members' copies).
    tags: dict[str, bytes] = attrs.Factory(dict)

    def state(self) -> MemberState:
        return MemberState(
            self.member_id, self.join_seq, self.ready, self.presence, dict(self.attributes)
        )


@attrs.define
class _Lobby:
    lobby_id: int
    name: str
    max_members: int
    private: bool
    join_code: str
    locked: bool
    owner: str
    metadata: dict[str, Value]
    bans: list[str]
    members: dict[str, _Member]  # in join order
    version: int
    next_join_seq: int
    # Set when the lobby was recreated here from a member's copy: until then, more copies are
    # merged; `base_version` is the highest copy merged, `intended_owner` that copy's owner.
    recreated_until: float | None = None
    base_version: int = 0
    intended_owner: str | None = None
    # The owner whose session dropped (not who left): ownership follows its seat, so it gets
    # the lobby back when it returns, unless the lobby was given away on purpose meanwhile.
    dropped_owner: str | None = None
    # Its game, from the start to its end (echo.lobby.gameloop).
    game: RunningGame | None = None
    # Re-created: the highest version of a copy that came unlocked and without a game (its
    # member saw the game end): an older copy's game is not believed (gameloop.adopt_copy).
    gameless_version: int = -1
    # The last games that ended here (match ids): a copy of one of them is not believed.
    ended_matches: list[int] = attrs.Factory(list)

    def connected(self) -> list[_Member]:
        return [m for m in self.members.values() if m.presence is Presence.CONNECTED]

    def audience(self) -> tuple[str, ...]:
        return tuple(m.member_id for m in self.connected())

    def snapshot(self) -> LobbySnapshot:
        return LobbySnapshot(
            lobby_id=self.lobby_id,
            version=self.version,
            name=self.name,
            max_members=self.max_members,
            private=self.private,
            join_code=self.join_code,
            locked=self.locked,
            owner=self.owner,
            metadata=dict(self.metadata),
            bans=tuple(self.bans),
            members=tuple(m.state() for m in self.members.values()),
        )


def _utf8_len(s: str) -> int:
    return len(s.encode("utf-8", "surrogatepass"))


def _value_bytes(v: Value) -> int:
    return _utf8_len(v) if isinstance(v, str) else 8


def _has_control(s: str) -> bool:
    return any(unicodedata.category(c) in ("Cc", "Cs") for c in s)


def _is_its_create(lobby: _Lobby, member_id: str, req: CreateLobby) -> bool:
    """Is `lobby` what `req` made, asked again by its owner (a retry, not a second lobby)?"""
    return (
        lobby.owner == member_id
        and lobby.name == req.name
        and lobby.max_members == req.max_members
        and lobby.private == req.private
        and len(lobby.metadata) == len(req.metadata)
        # (type too: 1 and True are equal in Python, not on the wire)
        and all(
            key in lobby.metadata
            and type(lobby.metadata[key]) is type(v)
            and lobby.metadata[key] == v
            for key, v in req.metadata.items()
        )
    )


def _with_tag(kept: dict[str, bytes], sender: str, tag: bytes | None) -> dict[str, bytes]:
    """`kept` and `sender`'s `tag`: one per sender, at most MAX_SEAT_TAGS (the first kept)."""
    if tag is None or sender in kept or len(kept) >= MAX_SEAT_TAGS:
        return kept
    if any(hmac.compare_digest(tag, other) for other in kept.values()):
        return kept
    return {**kept, sender: tag}


def _same_tags(a: Mapping[str, bytes], b: Mapping[str, bytes]) -> bool:
    """Do two seats' tags say the same, compared in constant time (tags are MACs)?"""
    return a.keys() == b.keys() and all(hmac.compare_digest(a[k], b[k]) for k in a)


def _merge_changes(
    current: Mapping[str, Value], changes: Mapping[str, Value | None]
) -> tuple[dict[str, Value], dict[str, Value | None]]:
    """(the map after `changes`, the changes that did change something)."""
    merged = dict(current)
    effective: dict[str, Value | None] = {}
    for key, v in changes.items():
        if v is None:
            if key in merged:
                del merged[key]
                effective[key] = None
        elif key not in merged or merged[key] != v or type(merged[key]) is not type(v):
            merged[key] = v
            effective[key] = v
    return merged, effective
