"""What the lobby client raises (`LobbyError`, `LobbyUnavailable` and its kinds,
`ResumeRefused`) and the events it reports on its own (`Rehomed`, `Reconnected`, `Left`,
`Resumed`) beside the server's messages.

Pure module: records only.
"""

from __future__ import annotations

import attrs

from echo.lobby.protocol import (
    ChatLine,
    ErrorCode,
    GameStarting,
    ResumeToken,
    Update,
)
from echo.lobby.queue_wire import Matched, QueueLeft
from echo.lobby.resume import (
    ResumeReason,
)


class LobbyError(Exception):
    """The lobby server refused a request."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


class LobbyUnavailable(Exception):
    """No lobby server could be reached (or the one that holds the lobby is gone)."""


class ResumeRefused(Exception):
    """A lobby server answered and refused to give the seat back for this resume token:
    `reason` (`echo.lobby.resume.ResumeReason`) says why, `server` which server it was."""

    def __init__(self, reason: ResumeReason, server: str, message: str) -> None:
        super().__init__(f"{reason.name}: {server}: {message}")
        self.reason = reason
        self.server = server
        self.message = message


class AuthRefused(LobbyUnavailable):
    """The lobby (``echo-lobby --auth-key``) refused the member's identity token: `reason` is
    one of `echo.lobby.identity.REASONS` ("expired", "wrong_audience", ...), `detail` the
    server's words. Every lobby server of a ring checks the same keys, so no other server is
    tried: get a fresh token from the game's backend (`LobbyClient.identity_token`)."""

    def __init__(self, server: str, reason: str, detail: str) -> None:
        super().__init__(f"{server}: identity refused: {reason}: {detail}")
        self.reason = reason
        self.detail = detail


class NoReply(LobbyUnavailable):
    """The request went out but its reply did not come back (the session dropped, or no reply
    within the timeout): the server may have carried it out. Asked again, a create or join
    is answered with the lobby it made or joined (and its seat)."""


@attrs.frozen
class Rehomed:
    """The lobby's home died; this member re-created (or joined) it on `server`.

    On a restarted home that is the lobby's only server, only the members that find the
    lobby gone and send their copy see this; one whose retry comes after the lobby is back
    finds its seat there, which looks like a home that kept it: it sees `Reconnected`.
    """

    lobby_id: int
    server: str


@attrs.frozen
class Reconnected:
    """The session dropped and came back to `server` (the seat was kept)."""

    server: str


@attrs.frozen
class Left:
    """This member is no longer in the lobby (`reason`: left, kicked, banned, dropped, ...)."""

    lobby_id: int
    reason: str


@attrs.frozen
class Resumed:
    """This new client took its seat in `lobby_id` back on `server` with a resume token (its
    ready state and attributes as they were: the snapshot follows)."""

    lobby_id: int
    server: str


Event = (
    Update | ChatLine | GameStarting | ResumeToken | Rehomed | Reconnected | Resumed | Left
    | Matched | QueueLeft
)
