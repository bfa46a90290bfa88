"""The lobby protocol's requests (client -> server): each carries the u32 ``request_id`` its
one reply repeats.

Pure module: no trio, no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeAlias

import attrs

from echo.lobby.protocol.records import (
    Changes,
    Filter,
    LobbySnapshot,
    SeatTag,
    Value,
)
from echo.lobby.queue_wire import CancelMatch, EnqueueMatch


@attrs.frozen
class CreateLobby:
    request_id: int
    name: str
    max_members: int
    private: bool
    metadata: Mapping[str, Value]


@attrs.frozen
class JoinLobby:
    request_id: int
    lobby_id: int


@attrs.frozen
class JoinByCode:
    request_id: int
    code: str


@attrs.frozen
class QuickJoin:
    request_id: int
    filters: tuple[Filter, ...]


@attrs.frozen
class LeaveLobby:
    request_id: int
    lobby_id: int


@attrs.frozen
class SearchLobbies:
    request_id: int
    filters: tuple[Filter, ...]
    cursor: int | None  # the `next_cursor` of the previous page, None for the first page
    limit: int


@attrs.frozen
class SetMetadata:
    request_id: int
    lobby_id: int
    changes: Changes


@attrs.frozen
class SetLocked:
    request_id: int
    lobby_id: int
    locked: bool


@attrs.frozen
class KickMember:
    request_id: int
    lobby_id: int
    member_id: str


@attrs.frozen
class BanMember:
    request_id: int
    lobby_id: int
    member_id: str


@attrs.frozen
class TransferOwner:
    request_id: int
    lobby_id: int
    member_id: str


@attrs.frozen
class SetAttributes:
    request_id: int
    lobby_id: int
    member_id: str  # must be the sender: named so that a forged request can be refused
    changes: Changes


@attrs.frozen
class SetReady:
    request_id: int
    lobby_id: int
    member_id: str  # must be the sender
    ready: bool


@attrs.frozen
class SendChat:
    request_id: int
    lobby_id: int
    text: str


@attrs.frozen
class GameCopy:
    """A member's copy of its lobby's running game: the last ticket the home gave it (signed
    with the game servers' key, which every lobby server holds: it proves the game server,
    the match, the roster and the metadata) and what was left of the game's life
    (`GameLife`, counted down) when the copy was sent, in milliseconds."""

    ticket: bytes = b""
    life_ms: int = 0


@attrs.frozen
class RecreateLobby:
    """A member's copy of a lobby whose home died, sent to the next server on the ring."""

    request_id: int
    snapshot: LobbySnapshot
    seat: bytes = b""  # the seat from this member's LobbyJoined
    # The seat tags of this member's copy (a trailing field: a copy without them is the same
    # bytes as before tags existed). A member may hold several (copies disagreed).
    seat_tags: tuple[SeatTag, ...] = ()
    # Its copy of the lobby's running game, if it holds a ticket of it (trailing: a copy
    # without a game is the same bytes as before games were copied).
    game: GameCopy = attrs.field(factory=GameCopy)


@attrs.frozen
class StartGame:
    """The owner starts the game: every connected member gets a `GameStarting`.

    `filters` choose among the announced game servers by their tags (`StringEquals` only:
    region, mode, version, ...); among those that match, the one with the most free slots.
    A trailing field: a start without filters is the same bytes as before they existed."""

    request_id: int
    lobby_id: int
    filters: tuple[Filter, ...] = ()


@attrs.frozen
class RequestTicket:
    """A member of a lobby whose game is running asks for a fresh ticket (its process
    crashed and came back, or its ticket expired): a new `GameStarting` for the same game,
    while the game runs."""

    request_id: int
    lobby_id: int


@attrs.frozen
class ReportGameServer:
    """A member tells the lobby that the game server of its running game refused its ticket
    (`reason`: the refusal it got). Once half the game's players (at least one) report it,
    the server is out of rotation for a while and the game ends (`GameEnded`)."""

    request_id: int
    lobby_id: int
    server_id: str
    reason: str


Request: TypeAlias = (
    CreateLobby
    | JoinLobby
    | JoinByCode
    | QuickJoin
    | LeaveLobby
    | SearchLobbies
    | SetMetadata
    | SetLocked
    | KickMember
    | BanMember
    | TransferOwner
    | SetAttributes
    | SetReady
    | SendChat
    | RecreateLobby
    | StartGame
    | RequestTicket
    | ReportGameServer
    | EnqueueMatch
    | CancelMatch
)
