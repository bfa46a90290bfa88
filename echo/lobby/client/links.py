"""The lobby client's session to one lobby server: opening it (the hello and the channels),
reading its three channels, and what each server message does to the client's state.

Driver: trio, sessions and the clock.
"""

from __future__ import annotations

import contextlib
from typing import Any

import structlog
import trio

from echo.channels import ChannelsClosed, open_channels
from echo.lobby.agreement import lobby_channel_specs
from echo.lobby.client.events import (
    AuthRefused,
    Left,
    LobbyUnavailable,
    ResumeRefused,
)
from echo.lobby.client.helpers import (
    split_server,
)
from echo.lobby.client.state import (
    _Base,
    _Link,
)
from echo.lobby.hello import Hello, encode_hello, parse_welcome_untrusted
from echo.lobby.identity import parse_close_reason
from echo.lobby.protocol import (
    Channel,
    ChatLine,
    Done,
    GameLife,
    GameStarting,
    LobbyJoined,
    LobbyProtocolError,
    LobbySnapshot,
    Refusal,
    ResumeToken,
    SearchResults,
    SeatTags,
    parse_server_message_untrusted,
)
from echo.lobby.queue_wire import Matched, Queued, QueueLeft
from echo.lobby.replica import ApplyResult, LobbyReplica
from echo.lobby.resume import (
    parse_refusal_reason,
)
from echo.session import HandshakeTimeout, LostContact, SessionClosed, SessionError
from echo.session import connect as session_connect
from echo.session.machine import HandshakeState

log = structlog.get_logger("echo.lobby.client")


class _Links(_Base):
    """Opening, running and reading the one session to a lobby server."""

    async def _open(self, server: str, timeout: float, resume: bytes = b"") -> _Link:
        """A new link to `server` (the old one closed first); with a resume token, one that
        takes this member's seat back (`ResumeRefused` if the server will not)."""
        await self._close_link()
        link = _Link(server)
        link.resume = resume
        try:
            await self._nursery.start(self._run_link, link, timeout)
        except (SessionError, OSError, trio.TooSlowError, ChannelsClosed) as error:
            refused = parse_refusal_reason(str(error)) if resume else None
            if refused is not None:
                raise ResumeRefused(refused, server, str(error)) from None
            # Silence is what a dead server looks like; a server that answers with a refusal
            # (its reason in the error) is alive, and stays on the members' walk of the ring.
            if isinstance(error, HandshakeTimeout | LostContact | OSError | trio.TooSlowError):
                self.dead.add(server)
            if isinstance(error, HandshakeTimeout) and error.phase is HandshakeState.CONNECTING:
                raise LobbyUnavailable(f"{server} within {error.timeout:g} s") from None
            auth = isinstance(error, SessionClosed) and parse_close_reason(error.reason)
            if auth:
                raise AuthRefused(server, *auth) from None
            raise LobbyUnavailable(f"{server}: {error}") from None
        self.dead.discard(server)
        self._link = link
        return link

    async def _close_link(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            link.wanted_close = True
            link.cancel_scope.cancel()
            await link.closed.wait()

    async def _run_link(self, link: _Link, timeout: float, *, task_status: Any) -> None:
        host, port, control = split_server(link.server)
        started = False
        try:
            with link.cancel_scope:
                # resume=False: the lobby has its own way back (the member's seat, on this
                # server or the next of the ring); a session resume would keep a link to a dead
                # home alive for its whole window and hide the failover.
                async with session_connect(
                    host, port, control, timeout=timeout, transport=self._transport, resume=False,
                    server_key=self._pins.get(link.server),
                ) as session:  # fmt: skip
                    link.session = session
                    seat = b""
                    if self.replica is not None:
                        seat = self.replica.seat
                    hello = Hello(self.member, seat, self.secret, self.identity_token, link.resume)
                    await session.send(encode_hello(hello))
                    with trio.fail_after(timeout):
                        welcome = await session.receive()
                    if parse_welcome_untrusted(welcome) is None:
                        raise LobbyUnavailable(f"{link.server} is not a lobby server")
                    async with open_channels(
                        session, lobby_channel_specs(server=False)
                    ) as channels:
                        link.channels = channels
                        started = True
                        task_status.started()
                        async with trio.open_nursery() as nursery:
                            nursery.start_soon(self._read_quietly, link, Channel.REQUESTS)
                            nursery.start_soon(self._read_quietly, link, Channel.CHAT)
                            await self._read_quietly(link, Channel.UPDATES)
                            nursery.cancel_scope.cancel()
        except (SessionError, ChannelsClosed, trio.ClosedResourceError) as error:
            if not started:
                raise
            link.close_reason = str(error)
        finally:
            link.closed.set()
            if started and not link.wanted_close:
                link.dropped = True
                self._fail_pending(link)
                if self._link is link:
                    self._link = None
                    # Recovering from now on, not from when `_recover` first runs: a request
                    # made meanwhile (a chat loop) would connect to any server instead of
                    # waiting, and `_recover`, finding a link, would never re-home the lobby.
                    self._recovering = True
                    self._nursery.start_soon(self._recover, link)
            self._notify()

    def _fail_pending(self, link: _Link) -> None:
        for send in list(self._pending_send.values()):
            send.close()

    async def _read_quietly(self, link: _Link, ch: Channel) -> None:
        try:
            await self._read(link, ch)
        except (SessionError, ChannelsClosed, trio.ClosedResourceError) as error:
            link.close_reason = link.close_reason or str(error)

    async def _read(self, link: _Link, ch: Channel) -> None:
        assert link.channels is not None
        async for delivery in link.channels[ch]:
            try:
                message = parse_server_message_untrusted(delivery.data)
            except LobbyProtocolError as error:
                log.warning("lobby_bad_server_message", server=link.server, error=str(error))
                continue
            self._on_message(message)
            self._notify()
        if ch is Channel.UPDATES:
            link.close_reason = link.close_reason or "the server ended the session"

    def _on_message(self, message: Any) -> None:
        if isinstance(message, Refusal | Done | LobbyJoined | SearchResults | Queued):
            if isinstance(message, LobbyJoined):
                self._seats[message.lobby_id] = message.seat
                if self.replica is not None and self.replica.lobby_id == message.lobby_id:
                    self.replica.seat = message.seat
            send = self._pending_send.get(message.request_id)
            if send is not None:
                with contextlib.suppress(trio.WouldBlock, trio.ClosedResourceError):
                    send.send_nowait(message)
            return
        if isinstance(message, LobbySnapshot):
            if self.replica is None or self.replica.lobby_id != message.lobby_id:
                self.replica = LobbyReplica(
                    self.member, message, self._seats.get(message.lobby_id, b"")
                )
            else:
                self.replica.apply(message)
            self._event(message)
            return
        if isinstance(message, Matched | QueueLeft):
            # Matched: the match's LobbyJoined and snapshot follow (the snapshot makes it
            # our lobby); QueueLeft: out of the queue without a match.
            self.waiting = None
            self._event(message)
            return
        if isinstance(message, GameStarting | GameLife) and self.replica is not None:
            # The running game goes in our copy (its ticket and life), for a re-creation.
            self.replica.note_game(message, trio.current_time())
        if isinstance(message, ChatLine | GameStarting):
            self._event(message)
            return
        if isinstance(message, GameLife):
            return  # (not an event: the game's bound is the lobby's to keep)
        if isinstance(message, ResumeToken):
            if self.replica is None or self.replica.lobby_id == message.lobby_id:
                self.resume_token = message.token
                self._event(message)
            return
        if isinstance(message, SeatTags):
            # The seats' tags, for our copy (not an event: nothing a game acts on).
            if self.replica is not None:
                self.replica.apply(message)
            return
        replica = self.replica
        if replica is None:
            return
        result = replica.apply(message)
        if result is ApplyResult.GAP:
            # Missed an update: ask for the whole state again.
            self._nursery.start_soon(self._resync, replica.lobby_id)
        elif result is ApplyResult.LEFT:
            self.replica = None
            self.resume_token = None
            reason = getattr(message, "reason", None)
            self._event(message)
            self._event(Left(replica.lobby_id, reason.name.lower() if reason else "left"))
            return
        if result is ApplyResult.APPLIED:
            self._event(message)
