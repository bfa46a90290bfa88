"""A member's way from a `GameStarting` into the game: the game server's session, with the
ticket, encrypted to the key the lobby carried.

    async for event in lobby.events():
        if isinstance(event, GameStarting):
            async with join_game(event) as game:
                await game.send(b"...")

The lobby hands each member the game server's address, the member's ticket and (when the game
server announced one, `echo-lobby-announce --server-key`) the game server's public key
(`echo.lobby.keys`). `join_game` pins that key, so the member never types one: a game server
that does not prove it (another key announced, or one answering in the clear) fails the
handshake with `echo.session.Untrusted` ("server key refused: ..."), and nothing but the HELLO
reaches it. Without an announced key the session is in the clear, as before keys.

Driver: a thin wrapper over `echo.session.connect`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from echo.lobby.keys import game_pin
from echo.lobby.protocol import GameStarting
from echo.session import Session
from echo.session import connect as session_connect


@asynccontextmanager
async def join_game(start: GameStarting, **options: Any) -> AsyncIterator[Session]:
    """The session to the game server `start` names, admitted with its ticket and pinned to
    its announced key. `options` go to `echo.session.connect` (timeout, transport,
    ...); the ports, the duologue-port mode, `credentials` and `server_key` come from `start`
    (a `duologue_ports` option overrides a start from a lobby that did not say the mode)."""
    for taken in ("credentials", "server_key"):
        if taken in options:
            raise TypeError(f"join_game sets {taken} from the GameStarting")
    options.setdefault("duologue_ports", start.duologue_ports)
    async with session_connect(
        start.host, start.port, start.control_port, credentials=start.ticket,
        server_key=game_pin(start.server_key), **options,
    ) as session:  # fmt: skip
        yield session
