"""Taking a lobby server out of service: the hand-off of its lobbies to the rest of the ring.

On SIGTERM, or ``POST /drain`` on its ``--metrics`` port, `echo-lobby` drains (`hand_off`):

1. it stops admitting: HELLOs are refused ("server shutting down") and ``/readyz`` says 503,
   so no member is seated here any more, and its listings are withdrawn;
2. it stops taking requests: one that arrives from now on is not carried out and gets no
   reply, and what was already carried out (its reply, the chat lines and updates it made)
   is flushed to the members first;
3. it tells every member to move now: the session library's goodbye (ERROR_SHUTTING_DOWN),
   sent behind everything already offered to that member and acknowledged by it. A member's
   client that hears it does not try this server again and does not wait for a liveness
   timeout: it re-creates its lobby at once on the next server of the ring from its replica
   (the re-creation path that a dead home takes, on purpose here), where the other members
   meet it, and asks again there the request that got no reply (nothing is lost: a request
   without a reply before the goodbye was not carried out);
   Its WebSocket members (`echo.lobby.web.door.WebDoor.hand_off`) are told the same in
   JSON: a ``moved`` message naming the server and WebSocket URL their lobby goes to, behind
   everything already queued for them, then the close 1001 (`echo.lobby.web.moving`);
4. it exits 0.

The members of the lobbies it homed are on the next server of the ring within a second or
two of the signal, with every seat (the replicas carry them), and every chat line a member
sent reaches every other member (docs/operations.md, "Draining a lobby server"). They do not
all arrive at once: a line said on the new home before the others of its lobby got there (the
request left without a reply, asked again) waits for each in its kept seat
(`echo.lobby.heldchat`) and reaches it with the lobby's state.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import structlog
import trio

if TYPE_CHECKING:
    from echo.lobby.server import LobbyServer

log = structlog.get_logger("echo.lobby")


async def hand_off(server: LobbyServer, reason: str, door: Any = None) -> dict[str, int | float]:
    """Drain `server` (see the module's text) and stop it; what it handed off. `door`: its
    WebSocket door (`echo.lobby.web.door.WebDoor`), if it has one."""
    started = time.monotonic()
    lobbies = len(server.registry)
    members = len(server.conns)
    server.sessions.draining = True  # HELLOs refused from now on
    server.handing_off = True  # requests from now on are left to the next server
    log.info("lobby_draining", reason=reason, lobbies=lobbies, members=members)
    server._flush()  # whatever was carried out goes before the goodbye
    told: list[int] = []

    async def websocket_members() -> None:  # where to go, then 1001 (a client may take 2 s)
        told.append(await door.hand_off())

    # The goodbye to every member (their cue to move now), then the stop; the WebSocket
    # members' at the same time, so a slow one delays no UDP member.
    async with trio.open_nursery() as nursery:
        if door is not None:
            nursery.start_soon(websocket_members)
        await server.stop(reason=reason)
    report: dict[str, int | float] = {
        "lobbies": lobbies,
        "members": members,
        "ws_members_moved": sum(told),
        "seconds": round(time.monotonic() - started, 3),
    }
    log.info("lobby_drained", **report)
    return report
