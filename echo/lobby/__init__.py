"""The lobby service: lobbies over echo's sessions, logical channels and topics.

`echo.lobby.connect(servers, member=...)` is the library a game embeds (`echo.lobby.client`);
`echo.lobby.server.LobbyServer` is what `echo-lobby` runs. The pure core (registry,
protocol, replica, home choice) imports no trio and reads no clock. The game tickets the lobby
issues live in `echo.tickets` (game servers check them without the lobby); the names a lobby
user needs are re-exported here.
"""

from __future__ import annotations

from typing import Any

from echo.tickets import KeyFileError as KeyFileError
from echo.tickets import TicketClaims as TicketClaims
from echo.tickets import TicketIssuer as TicketIssuer
from echo.tickets import TicketKey as TicketKey
from echo.tickets import TicketReason as TicketReason
from echo.tickets import TicketRefusal as TicketRefusal
from echo.tickets import TicketSeats as TicketSeats
from echo.tickets import issue as issue
from echo.tickets import new_key_text as new_key_text
from echo.tickets import read_key_file as read_key_file
from echo.tickets import verify as verify


def __getattr__(name: str) -> Any:
    # The client pulls in trio and the transport; the pure modules must not (tests/lobby
    # checks that importing them loads no trio), so the package imports it only on use.
    if name in {
        "connect",
        "LobbyClient",
        "AuthRefused",
        "LobbyError",
        "LobbyUnavailable",
        "NoReply",
        "ResumeRefused",
        "Resumed",
        "filters_from",
    }:
        from echo.lobby import client

        return getattr(client, name)
    if name == "join_game":
        from echo.lobby import play

        return play.join_game
    raise AttributeError(name)
