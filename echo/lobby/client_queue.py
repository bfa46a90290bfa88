"""`LobbyClient.queue` and `LobbyClient.cancel_queue`: the member's side of the matchmaker.

The entry goes to its queue's home, the lobby server its (mode, region) hashes to on the
ring (`echo.lobby.matchmaker.queue_home`), which becomes the member's server. The client keeps
the entry while it waits: when its session to that server ends, it sends it again (with the
time already waited, so it keeps its priority) to the same server once it reconnects, or to
the queue's next home if that server is silent, as lobby members re-create their lobby there.
A `Matched` event says the member now sits in the match's lobby (the lobby's snapshot follows,
and `lobby_id` is the match's); a `QueueLeft` event that it left the queue without one.

Driver module (trio): the thin part of the client around the pure `echo.lobby.matchmaker`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import structlog
import trio

from echo.lobby.matchmaker import queue_home
from echo.lobby.protocol import ErrorCode
from echo.lobby.queue_wire import CancelMatch, EnqueueMatch, Queued, QueueLeft

if TYPE_CHECKING:
    from echo.lobby.client import LobbyClient

log = structlog.get_logger("echo.lobby.client")


@attrs.define
class Waiting:
    """What the client queued, where, and since when (trio's clock)."""

    entry: EnqueueMatch
    server: str
    since: float
    ticket: int


async def queue(
    client: LobbyClient,
    mode: str,
    region: str,
    *,
    skill: int = 0,
    size: int = 2,
    party: bool = False,
    strict_region: bool = False,
    start: bool = False,
) -> int:
    """Queue this member (with `party`, its lobby: every member of it calls this); the
    ticket id. Raises `LobbyError` if refused (BAD_REQUEST, PARTY_INVALID, RATE_LIMITED,
    ALREADY_IN_LOBBY for a member in a lobby queueing alone) or `LobbyUnavailable`."""
    from echo.lobby.client import LobbyError

    party_id, party_size, party_seat = 0, 1, b""
    if party:
        replica = client.replica
        if replica is None:
            raise LobbyError(ErrorCode.PARTY_INVALID, "a party queues from its lobby")
        party_id, party_size, party_seat = replica.lobby_id, len(replica.members), replica.seat
    else:
        client._not_in_a_lobby()
    entry = EnqueueMatch(
        0, mode, region, skill, size, party_id, party_size, party_seat, strict_region, start
    )
    # Waiting from before the request: its Matched may overtake its Queued reply.
    waiting = client.waiting = Waiting(entry, "", trio.current_time(), 0)
    try:
        return await _walk(client, waiting, entry)
    except BaseException:
        if client.waiting is waiting:
            client.waiting = None
        raise


async def _walk(client: LobbyClient, waiting: Waiting, entry: EnqueueMatch) -> int:
    """Send `entry` to its queue's home, walking on past servers found silent (marked dead),
    as a join walks past a dead lobby home; the ticket id. Servers marked dead earlier are
    asked last, not never (`echo.lobby.home.past_dead`)."""
    from echo.lobby.client import LobbyUnavailable, NoReply

    mode, region, ring = entry.mode, entry.region, client.ring
    tried: set[str] = set()
    while True:
        home = queue_home(ring, mode, region, client.dead | tried) or queue_home(
            ring, mode, region, tried
        )
        if home is None:
            break
        tried.add(home)
        waiting.server = home
        try:
            reply = await client._request(entry, server=home)
        except NoReply:
            raise  # it went out: it may be queued there (sending it again keeps its place)
        except LobbyUnavailable:
            if home in client.dead:
                continue  # silent: the queue's next home
            raise
        assert isinstance(reply, Queued)
        waiting.ticket = reply.ticket
        return reply.ticket
    raise LobbyUnavailable(f"every lobby server of the {entry.mode}/{entry.region} queue is gone")


async def cancel(client: LobbyClient) -> None:
    """Leave the queue (a party's ticket leaves with all its members; they get `QueueLeft`).
    Raises `LobbyError` NOT_QUEUED if not queued."""
    from echo.lobby.client import LobbyError

    waiting = client.waiting
    if waiting is None:
        raise LobbyError(ErrorCode.NOT_QUEUED, "not in a queue")
    await client._request(CancelMatch(0), server=waiting.server)
    client.waiting = None


async def send_again(client: LobbyClient) -> None:
    """The session to the queue's server ended while queued: once the client has recovered
    (back on the same server, or not), send the entry again to the queue's home of the
    moment, with the time already waited. Told as `QueueLeft` if it cannot be."""
    from echo.lobby.client import LobbyError, LobbyUnavailable

    waiting = client.waiting
    if waiting is None:
        return
    await client._wait_recovered()
    if client.waiting is not waiting:
        return  # matched, cancelled or queued anew meanwhile
    waited_ms = min(2**32 - 1, round((trio.current_time() - waiting.since) * 1000))
    entry = attrs.evolve(waiting.entry, waited_ms=waited_ms)
    try:
        await _walk(client, waiting, entry)
    except LobbyError as error:
        reason = f"not queued again on {waiting.server}: {error}"
    except LobbyUnavailable as error:
        reason = f"no lobby server of the queue answered: {error}"
    else:
        log.info("lobby_queue_sent_again", member=client.member, server=waiting.server)
        return
    if client.waiting is waiting:
        client.waiting = None
        client._event(QueueLeft(waiting.ticket, reason))
