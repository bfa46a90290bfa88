"""The lobby protocol's replies (server -> client), one per request.

Pure module: no trio, no clock, no I/O.
"""

from __future__ import annotations

from typing import TypeAlias

import attrs

from echo.lobby.protocol.records import (
    ErrorCode,
    LobbyListing,
)
from echo.lobby.queue_wire import Queued


@attrs.frozen
class Refusal:
    request_id: int
    code: ErrorCode
    message: str


@attrs.frozen
class Done:
    request_id: int


@attrs.frozen
class LobbyJoined:
    """Reply to create, join, join-by-code, quick-join and recreate.

    The lobby's state itself arrives as a `LobbySnapshot` on the updates channel: sent here,
    it could overtake or be overtaken by updates, as channels are not ordered with each other.
    """

    request_id: int
    lobby_id: int
    # The member's seat: proof, signed by the lobby servers, that it belongs to this lobby; it
    # is what lets it recreate the lobby elsewhere (see RecreateLobby). Empty if not signed.
    seat: bytes = b""


@attrs.frozen
class SearchResults:
    request_id: int
    listings: tuple[LobbyListing, ...]
    next_cursor: int | None  # None: this was the last page


Reply: TypeAlias = Refusal | Done | LobbyJoined | SearchResults | Queued
