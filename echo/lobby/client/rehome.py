"""The lobby client's way back after its session drops: the same server if it answers, the
only home again while it may still hold the seat, or the next server of the lobby's ring,
where the lobby is re-created from the member's replica.

Driver: trio, sessions and the clock.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, cast

import structlog
import trio

from echo.lobby import client_queue
from echo.lobby.client.events import (
    AuthRefused,
    Left,
    LobbyError,
    LobbyUnavailable,
    Reconnected,
    Rehomed,
)
from echo.lobby.client.helpers import (
    ONLY_HOME_RETRY,
)
from echo.lobby.client.requests import _Requests
from echo.lobby.client.state import (
    _Link,
)
from echo.lobby.home import failover_home
from echo.lobby.protocol import (
    ErrorCode,
    JoinLobby,
    LobbyJoined,
    Refusal,
)
from echo.lobby.replica import LobbyReplica
from echo.lobby.timers import RETRY_TIMEOUT

if TYPE_CHECKING:
    from echo.lobby.client.api import LobbyClient

log = structlog.get_logger("echo.lobby.client")


class _Rehome(_Requests):
    """Recovery after a dropped session: reconnect, or re-create the lobby elsewhere."""

    async def _resync(self, lobby_id: int) -> None:
        with contextlib.suppress(LobbyError, LobbyUnavailable):
            await self._request(JoinLobby(0, lobby_id))

    async def _recover(self, link: _Link) -> None:
        """`_recover_link`, and the requests waiting for it let go whichever way it ends."""
        try:
            await self._recover_link(link)
        finally:
            self._recovering = False
            self._notify()

    async def _recover_link(self, link: _Link) -> None:
        """The session dropped. Back to the same server if it answers (the seat is kept for
        the grace period); else, with a lobby, to the next server of its ring, re-creating it
        from the replica."""
        if "replaced by a new session" in link.close_reason:
            # Another session of this member took the seat (another device, or this program
            # restarted): coming back would only take it back and start a tug of war.
            if self.replica is not None:
                self._event(Left(self.replica.lobby_id, "replaced"))
                self.replica = None
                self.resume_token = None
            return
        if not self.auto_reconnect:
            return
        if self.waiting is not None:
            # (Every layer of this package is a part of a LobbyClient, which the queue takes.)
            self._nursery.start_soon(client_queue.send_again, cast("LobbyClient", self))
        async with self._lock:
            if self._link is not None:
                return
            self._recovering = True
            try:
                shut_down = "shutting down" in link.close_reason
                # After silence the server may be dead: retry briefly (the 5 s budget of a
                # re-created lobby). After a close it answered, so it is most likely alive.
                silent = "lost contact" in link.close_reason
                if not shut_down:
                    try:
                        await self._open(
                            link.server, RETRY_TIMEOUT if silent else self.connect_timeout
                        )
                    except AuthRefused:
                        raise
                    except LobbyUnavailable:
                        pass
                    else:
                        self._event(Reconnected(link.server))
                        if self.replica is not None:
                            await self._check_still_there(self.replica)
                        return
                replica = self.replica
                if (
                    replica is not None
                    and failover_home(self.ring, replica.lobby_id, self.dead | {link.server})
                    is None
                ):
                    # No other server to take the lobby: the home is silent, not necessarily
                    # dead (a loaded machine, a restart). Keep asking it, as long as it may
                    # still hold the seat (a restarted one gets the lobby back from us).
                    await self._back_to_the_only_home(link.server, replica)
                    return
                self.dead.add(link.server)
                if replica is None:
                    return
                await self._rehome(replica)
            except LobbyUnavailable as error:
                log.warning("lobby_unavailable", member=self.member, error=str(error))
            finally:
                self._recovering = False
                self._notify()

    async def _back_to_the_only_home(self, server: str, replica: LobbyReplica) -> None:
        deadline = trio.current_time() + ONLY_HOME_RETRY
        while trio.current_time() < deadline and self.replica is replica:
            try:
                await self._open(server, self.connect_timeout)
            except AuthRefused:
                raise
            except LobbyUnavailable:
                continue  # (each attempt waited for its handshake's timeout)
            self.dead.discard(server)
            self._event(Reconnected(server))
            await self._check_still_there(replica)
            return
        raise LobbyUnavailable(f"{server} did not answer again within {ONLY_HOME_RETRY} s")

    async def _check_still_there(self, replica: LobbyReplica) -> None:
        """Back on the same server: if it restarted meanwhile it has forgotten the lobby, and
        it is still the lobby's home, so the lobby is re-created there from our copy."""
        reply = await self._exchange(JoinLobby(self._next_id(), replica.lobby_id))
        if isinstance(reply, Refusal) and reply.code is ErrorCode.NO_SUCH_LOBBY:
            copy = replica.recreate_request(self._next_id(), trio.current_time())
            recreated = await self._exchange(copy)
            if isinstance(recreated, LobbyJoined):
                self._event(Rehomed(replica.lobby_id, self.server or ""))

    async def _rehome(self, replica: LobbyReplica) -> None:
        while True:
            target = failover_home(self.ring, replica.lobby_id, self.dead)
            if target is None:
                raise LobbyUnavailable("every lobby server of this lobby is gone")
            try:
                await self._open(target, self.connect_timeout)
            except AuthRefused:
                raise
            except LobbyUnavailable:
                # Silent, _open marked it dead; a server that refused (draining, full) will
                # not take the lobby either: walk on past it too, or this loop never ends.
                self.dead.add(target)
                continue
            copy = replica.recreate_request(self._next_id(), trio.current_time())
            reply = await self._exchange(copy)
            if isinstance(reply, LobbyJoined):
                self._event(Rehomed(replica.lobby_id, target))
                return
            if isinstance(reply, Refusal) and reply.code is ErrorCode.RECREATE_REFUSED:
                # It lives there already (another member's copy made it, or we are a member):
                # a join with our seat brings the state.
                joined = await self._exchange(JoinLobby(self._next_id(), replica.lobby_id))
                if isinstance(joined, LobbyJoined):
                    self._event(Rehomed(replica.lobby_id, target))
                    return
            raise LobbyUnavailable(f"the lobby could not be re-created on {target}: {reply}")
