"""The lobby registry of one lobby server: a pure state machine.

The driver (next step: sessions + logical channels) calls

- ``handle(member_id, request, now)`` for every decoded request: it returns a `Handled` with the
  one reply for the sender and the state updates and chat lines to send, each `Send` naming
  its recipients; `echo.lobby.protocol.channel_of` tells which logical channel carries it;
- ``disconnected(member_id, now)`` / ``reconnected(member_id, now)`` when a member's session
  drops or resumes, and ``expire(now)`` at ``next_deadline()``.

A remote's bad request is never an exception: it is a `Refusal` with an `ErrorCode`, counted in
``refusals``. ``member_id`` is the authenticated identity the driver got from the session.

Rules a reader needs (also in docs/lobby.md):

- A member is in at most one lobby of a server. A lobby with no member is deleted.
- Owner: always a member; whenever any member is connected, the owner is a connected member.
  When that stops being true (the owner leaves, is dropped, or its session drops) ownership
  moves to the connected member who joined earliest (lowest join sequence); if nobody is
  connected it stays (or goes, if the owner left, to the earliest-joined member). An owner
  whose session dropped gets the lobby back when its seat comes back (a NAT rebinding, a
  network change), unless the interim owner transferred it meanwhile: ownership follows the
  member's seat, not its address.
- Presence: a dropped member keeps its seat for ``reconnect_grace`` seconds as RECONNECTING; it
  gets no updates meanwhile and a full snapshot when it comes back.
- Every state change increments the lobby's version and is sent, carrying it, to the connected
  members, so a member's `LobbyReplica` detects a gap and asks for a snapshot.
- No ghosts: a lobby none of whose members is connected (all RECONNECTING: crashed, killed,
  cut off) is not listed: search and quick-join skip it, and the listings topic says it is
  gone, from the moment its last connected member drops; it is listed again as soon as a
  member is connected again (back within its grace period, or a new member who joined it by
  id or code). Its seats are kept for the grace period all the same.
- Search lists public, unlocked lobbies with a connected member in ascending lobby id; the
  cursor is the last id of a page, so paging is stable: a lobby that is listed throughout is
  seen exactly once.
- Recreate (the home died): see `echo.lobby.state.recreate` and docs/lobby-protocol.md.

The registry is built in layers, one concern per module: `records` (a lobby, its seats, what
an operation sends), `checks` (rate limits and limits), `search` (the lobby table, its index
and listings), `members` (members coming and going, the owner rule, seat tags), `ops` (the
requests on one lobby), `recreate` (a lobby rebuilt from copies) and `registry`
(`LobbyRegistry`: its entry points and dispatch). The names below are imported from here.

Pure package: no trio, no clock.
"""

from __future__ import annotations

from echo.lobby.state.records import CODE_ALPHABET as CODE_ALPHABET
from echo.lobby.state.records import CODE_LENGTH as CODE_LENGTH
from echo.lobby.state.records import MAX_COPY_VERSION as MAX_COPY_VERSION
from echo.lobby.state.records import MAX_SEAT_TAG_BYTES as MAX_SEAT_TAG_BYTES
from echo.lobby.state.records import MAX_SEAT_TAGS as MAX_SEAT_TAGS
from echo.lobby.state.records import Handled as Handled
from echo.lobby.state.records import Seats as Seats
from echo.lobby.state.records import Send as Send
from echo.lobby.state.records import Tickets as Tickets
from echo.lobby.state.records import _Lobby as _Lobby
from echo.lobby.state.records import _Member as _Member
from echo.lobby.state.records import _Refuse as _Refuse
from echo.lobby.state.records import _refuse as _refuse
from echo.lobby.state.records import random_join_code as random_join_code
from echo.lobby.state.records import random_lobby_id as random_lobby_id
from echo.lobby.state.registry import LobbyRegistry as LobbyRegistry

__all__ = [
    "CODE_ALPHABET",
    "CODE_LENGTH",
    "MAX_COPY_VERSION",
    "MAX_SEAT_TAGS",
    "MAX_SEAT_TAG_BYTES",
    "Handled",
    "LobbyRegistry",
    "Seats",
    "Send",
    "Tickets",
    "random_join_code",
    "random_lobby_id",
]
