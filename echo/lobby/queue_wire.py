"""The matchmaker's messages (`echo.lobby.protocol`'s table carries them; see
docs/matchmaker.md): a member queues (`EnqueueMatch`, answered `Queued`) or cancels
(`CancelMatch`, answered `Done`); the queue's server tells it when it is matched (`Matched`,
then the lobby's `LobbyJoined` and snapshot as for a join) or dropped (`QueueLeft`).

Pure module: records only.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class EnqueueMatch:
    """Queue this member for a match of `size` players. A party's members each send theirs,
    naming the party's lobby (`party`, 0 alone), its member count, and, if that lobby lives
    on another server, their seat in it (the proof that they belong to it)."""

    request_id: int
    mode: str
    region: str
    skill: int
    size: int
    party: int = 0
    party_size: int = 1
    party_seat: bytes = b""
    strict_region: bool = False
    start: bool = False
    waited_ms: int = 0  # how long this member already waited (its entry sent again)


@attrs.frozen
class CancelMatch:
    """Leave the queue (a party's ticket leaves with all its members)."""

    request_id: int


@attrs.frozen
class Queued:
    """Reply to EnqueueMatch: the ticket the member waits in."""

    request_id: int
    ticket: int


@attrs.frozen
class Matched:
    """To a member: its ticket was matched into `lobby_id` (on this server), where it is now
    seated; its `LobbyJoined` (request id 0) and the lobby's snapshot follow."""

    ticket: int
    lobby_id: int
    waited_ms: int


@attrs.frozen
class QueueLeft:
    """To a member: its ticket left the queue without a match (cancelled by a party member,
    a party that did not gather in time)."""

    ticket: int
    reason: str
