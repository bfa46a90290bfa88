"""The lobby client's requests: one exchange on the current session, the request with its
choice of server and its retry after a drain, and the walks a join takes along servers.

Driver: trio, sessions and the clock.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import attrs
import trio

from echo.channels import ChannelsClosed
from echo.lobby.client.events import (
    AuthRefused,
    LobbyError,
    LobbyUnavailable,
    NoReply,
)
from echo.lobby.client.helpers import (
    _NOT_THERE,
    _none_let_in,
)
from echo.lobby.client.links import _Links
from echo.lobby.client.state import (
    _Link,
)
from echo.lobby.protocol import (
    ErrorCode,
    LobbyJoined,
    Refusal,
    Reply,
    Request,
    channel_of,
    encode,
)


class _Requests(_Links):
    """Requests and replies, with the server each goes to."""

    def _next_id(self) -> int:
        return next(self._request_ids) % 2**32 or next(self._request_ids)

    async def _exchange(self, request: Request) -> Reply:
        """Send on the current link and wait for the reply (no retry)."""
        link = self._link
        if link is None or link.channels is None:
            raise LobbyUnavailable("not connected to a lobby server")
        send, receive = trio.open_memory_channel[Reply](1)
        rid = request.request_id
        self._pending_send[rid] = send
        try:
            with trio.fail_after(self.timeout):
                await link.channels[channel_of(request)].send(encode(request))
                try:
                    return await receive.receive()
                except trio.EndOfChannel:
                    raise NoReply(f"{link.server}: the session dropped") from None
        except ChannelsClosed as error:
            raise NoReply(f"{link.server}: {error.reason}") from None
        except trio.TooSlowError:
            raise NoReply(f"{link.server}: no reply in {self.timeout} s") from None
        finally:
            self._pending_send.pop(rid, None)

    async def _request(self, request: Request, server: str | None = None) -> Reply:
        """On `server` (or the current one, or the member's own server), refusals raised."""
        request = attrs.evolve(request, request_id=self._next_id())
        await self._wait_recovered()
        if server is not None and self.server != server:
            async with self._lock:
                # (A recovery may have reopened it while we waited for the lock.)
                if self.server != server:
                    await self._open(server, self.connect_timeout)
        elif self._link is None:
            await self._connect_any()
        link = self._link
        try:
            reply = await self._exchange(request)
        except NoReply:
            if server is not None or not await self._handed_off(link):
                raise
            # The server drained (echo.lobby.drain): a request without a reply before its
            # goodbye was not carried out; ask the server the lobby moved to.
            reply = await self._exchange(attrs.evolve(request, request_id=self._next_id()))
        if isinstance(reply, Refusal):
            raise LobbyError(reply.code, reply.message)
        return reply

    async def _handed_off(self, link: _Link | None) -> bool:
        """`link` ended with its server's goodbye (a drain), and this member is on another
        server now; False for any other end (the request may have been carried out)."""
        if link is None:
            return False
        with trio.move_on_after(self.timeout):
            await link.closed.wait()
        if "shutting down" not in link.close_reason:
            return False
        with contextlib.suppress(trio.TooSlowError):
            await self.wait_until(
                lambda c: c._link is not None and c._link is not link and not c._recovering,
                timeout=self.timeout * 2,
            )
            return True
        return False

    async def _wait_recovered(self) -> None:
        if self._recovering:
            await self.wait_until(lambda c: not c._recovering, timeout=self.timeout * 2)

    async def _connect_any(self) -> None:
        """The member's own server by CH of its id, or the next that answers."""
        async with self._lock:
            if self._link is not None:
                return
            order = self.ring.servers_for(f"member:{self.member}", len(self.servers))
            errors = []
            for server in sorted(order, key=lambda s: s in self.dead):
                try:
                    await self._open(server, self.connect_timeout)
                    return
                except AuthRefused:
                    raise  # (every server of the ring checks the same keys)
                except LobbyUnavailable as error:
                    errors.append(str(error))
            raise LobbyUnavailable(_none_let_in(order, self.dead, errors))

    async def _joined(self, reply: Reply) -> int:
        assert isinstance(reply, LobbyJoined)
        lobby_id = reply.lobby_id
        await self.wait_until(lambda c: c.replica is not None and c.replica.lobby_id == lobby_id)
        return lobby_id

    def _not_in_a_lobby(self, allowed: int | None = None) -> None:
        # Checked here too: moving to another server for another lobby would leave this
        # lobby's seat reconnecting on its own server.
        if self.replica is not None and self.replica.lobby_id != allowed:
            raise LobbyError(ErrorCode.ALREADY_IN_LOBBY, "already in a lobby: leave it first")

    def _seated_server(self) -> str | None:
        """In a lobby: the server that holds it, the only one a create or quick-join may go
        to (it answers one that was already carried out, whose reply was lost, with that
        very lobby, and any other with ALREADY_IN_LOBBY). Not in one: None, any server."""
        if self.replica is None:
            return None
        if self.server is None:
            raise LobbyError(ErrorCode.ALREADY_IN_LOBBY, "already in a lobby: leave it first")
        return self.server

    def _require_lobby(self) -> int:
        if self.replica is None:
            raise LobbyError(ErrorCode.NOT_MEMBER, "not in a lobby")
        return self.replica.lobby_id

    async def _join_walk(
        self, servers: Iterable[str | None], request: Request, not_there: ErrorCode
    ) -> int:
        """Ask `servers` in turn until one seats the member; a `not_there` refusal, or a server
        that cannot be reached, moves on to the next. A request that went out unanswered
        (`NoReply`) ends the walk: it may have seated the member there, and the next server
        would seat it twice. None answering at all is `LobbyUnavailable`, not a refusal."""
        refusal: LobbyError | None = None
        unreachable: LobbyUnavailable | None = None
        for server in servers:
            try:
                return await self._joined(await self._request(request, server=server))
            except LobbyError as error:
                if error.code is not not_there:
                    raise
                refusal = refusal or error
            except NoReply:
                raise
            except LobbyUnavailable as error:
                unreachable = error
        raise refusal or unreachable or LobbyError(not_there, _NOT_THERE[not_there])
