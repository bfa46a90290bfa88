"""The lobby service: lobbies over echo's sessions, logical channels and topics.

`echo.lobby.connect(servers, member=...)` is the library a game embeds (`echo.lobby.client`);
`echo.lobby.server.LobbyServer` is what `echo-lobby` runs. The pure core (registry, tickets,
protocol, replica, home choice) imports no trio and reads no clock.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    # The client pulls in trio and the transport; the pure modules must not (tests/lobby
    # checks that importing them loads no trio), so the package imports it only on use.
    if name in {
        "connect",
        "LobbyClient",
        "LobbyError",
        "LobbyUnavailable",
        "NoReply",
        "filters_from",
    }:
        from echo.lobby import client

        return getattr(client, name)
    raise AttributeError(name)
