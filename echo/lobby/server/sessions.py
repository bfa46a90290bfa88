"""The lobby server's member sessions: the hello (identity, seat, resume token), the member's
arrival and departure, its seat bound to its client, and the readers of its requests and
chat.

Driver: trio, sessions and the clock.
"""

from __future__ import annotations

from typing import Any

import structlog
import trio

from echo.channels import open_channels
from echo.lobby.hello import (
    Hello,
    HelloError,
    encode_welcome,
    parse_hello_untrusted,
)
from echo.lobby.identity import IdentityRefused
from echo.lobby.identity import close_reason as identity_close_reason
from echo.lobby.limits import TokenBucket
from echo.lobby.protocol import (
    Channel,
    LobbyJoined,
)
from echo.lobby.resume import (
    ResumeRefusal,
    check_resume,
)
from echo.lobby.server.base import (
    _GONE,
    _Conn,
    _quietly,
    _same_client,
)
from echo.lobby.server.config import (
    lobby_channel_specs,
)
from echo.lobby.server.routing import (
    _Routing,
)
from echo.lobby.state import Send
from echo.session import Session

log = structlog.get_logger("echo.lobby")


class _Sessions(_Routing):
    """One member's session, from its hello to its end."""

    async def _app(self, session: Session) -> None:
        hello = await self._authenticate(session)
        if hello is None:
            return
        member_id = hello.member_id
        conn = _Conn(member_id, session, hello.secret)
        old = self.conns.get(member_id)
        self.conns[member_id] = conn
        try:
            await session.send(encode_welcome(self.server_id))
            async with open_channels(session, lobby_channel_specs(server=True)) as channels:
                await self.member_arrived(conn, channels, old)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_quietly, self._read_chat, conn)
                    await _quietly(self._read_requests, conn)
                    nursery.cancel_scope.cancel()
        except _GONE:
            pass
        finally:
            self.member_gone(conn)

    async def member_arrived(self, conn: _Conn, channels: Any, old: _Conn | None) -> None:
        """`conn`'s member was let in (it is in `conns`, `old` the connection it replaced) and
        its `channels` are open: what waited is sent, and its seat and state. Every kind of
        member connection comes through here: the UDP sessions, the WebSocket door's."""
        member_id = conn.member_id
        conn.channels = channels
        pending, conn.pending = conn.pending, []
        for ch, data in pending:
            self._send_to(member_id, ch, data)
        self._flush()
        if old is not None:
            # The member came back on a new session while the old one still looked
            # alive (its network changed): the new one wins and gets the state.
            old.closing = "replaced by a new session"
            self.counters["sessions_replaced"] += 1
            await old.session.close("replaced by a new session")
            lobby_id = self.registry.lobby_of(member_id)
            snapshot = None if lobby_id is None else self.registry.snapshot(lobby_id)
            tags = None if lobby_id is None else self.registry.seat_tags(lobby_id)
            if snapshot is not None:
                self._deliver((Send((member_id,), snapshot),))
            if tags is not None and tags.tags:
                self._deliver((Send((member_id,), tags),))
        else:
            self._deliver(self.registry.reconnected(member_id, trio.current_time()))
            self._wake_expiry.set()
        self._seat_taken(conn)

    def member_gone(self, conn: _Conn) -> None:
        """`conn` ended: unless a newer connection of the member replaced it, the seat goes
        RECONNECTING for the grace period. No await: this runs to the end even when the task
        is being cancelled."""
        if self.conns.get(conn.member_id) is conn:
            del self.conns[conn.member_id]
            self.queues.withdraw(conn.member_id, trio.current_time())
            self._deliver(self.registry.disconnected(conn.member_id, trio.current_time()))
            self._wake_expiry.set()

    def _seat_taken(self, conn: _Conn) -> None:
        """A session of a seated member was let in: the seat is now its client's, and the
        member is told its seat again, which it may never have had (a lost LobbyJoined)."""
        member_id = conn.member_id
        lobby_id = self.registry.lobby_of(member_id)
        if lobby_id is None:
            return
        self.bindings.bind(member_id, lobby_id, conn.secret)
        self._deliver(self.registry.bind_secret(member_id, conn.secret))
        # Request id 0 (no client uses it): not the answer to a request, the seat again.
        self._reply(member_id, LobbyJoined(0, lobby_id, self.seats.issue(lobby_id, member_id)))

    async def _authenticate(self, session: Session) -> Hello | None:
        """The hello: the member id, and its seat (or the secret of the client that was
        seated) if it sits in a lobby here."""
        with trio.move_on_after(self.config.hello_timeout):
            data = await session.receive()
            try:
                hello = parse_hello_untrusted(data)
            except HelloError as error:
                self.counters["hellos_refused"] += 1
                await session.close(f"bad hello: {error}")
                return None
            member_id = hello.member_id
            limit = self.config.lobby.max_member_id_bytes
            if len(member_id.encode()) > limit or not member_id.isprintable():
                self.counters["hellos_refused"] += 1
                await session.close(f"a member id is 1..{limit} printable bytes")
                return None
            if self.config.identity is not None:
                try:
                    self.config.identity.verify(hello.token, member_id, self._clock())
                except IdentityRefused as refused:
                    self.counters["hellos_refused"] += 1
                    self.auth_refusals[refused.reason] += 1
                    log.info("lobby_identity_refused", member_id=member_id, reason=str(refused))
                    await session.close(identity_close_reason(refused))
                    return None
            if hello.resume:
                return await self._resume(session, hello)
            lobby_id = self.registry.lobby_of(member_id)
            if lobby_id is not None and not self.seats.check(hello.seat, lobby_id, member_id):
                # Seated here (connected or reconnecting): only its own seat takes it back, or
                # the client that was seated, which may never have received its seat: bound
                # to it here, or, in a lobby re-created here, tagged with it in the copies.
                if not self.bindings.holds(
                    member_id, lobby_id, hello.secret
                ) and not self.registry.holds_secret(member_id, hello.secret):
                    self.counters["hellos_refused"] += 1
                    await session.close("member seated in a lobby here: its seat is needed")
                    return None
                self.counters["seats_reclaimed"] += 1
            live = self.conns.get(member_id)
            if lobby_id is None and live is not None and not _same_client(live, hello):
                # (The same client coming back on a new session replaces its old one, which
                # this side has not seen die yet.)
                self.counters["hellos_refused"] += 1
                await session.close("member id in use")
                return None
            return hello
        self.counters["hellos_timed_out"] += 1
        await session.close("no hello")
        return None

    async def _resume(self, session: Session, hello: Hello) -> Hello | None:
        """A brand-new process of the member shows its resume token: its seat back, or the
        session closed with the refusal's code (`echo.lobby.resume`). A session of the member
        still open here (half-open: the crashed process's) is replaced by this one in `_app`."""
        decision = check_resume(
            self.registry,
            hello.member_id,
            hello.resume,
            self.seats.keys,
            self.seats.clock(),
            bindings=self.bindings,
        )
        if isinstance(decision, ResumeRefusal):
            self.counters["resumes_refused"] += 1
            log.info(
                "lobby_resume_refused",
                member_id=hello.member_id,
                reason=decision.reason.name,
                detail=decision.detail,
            )
            await session.close(decision.close_reason())
            return None
        self.counters["seats_resumed"] += 1
        self._emit("lobby_resumed", lobby_id=decision, member_id=hello.member_id)
        return hello

    async def _renew_resume_tokens(self) -> None:
        """A seated member's token is renewed a grace period after its last one: a token
        lives two, so the one a process holds when it dies outlives its seat's grace period
        (`token_ttl`). Each member on its own schedule (`renewals`)."""
        if self.config.lobby.reconnect_grace <= 0:
            return
        while True:
            due = self.renewals.next_due()
            if due is None:
                await self._wake_renewals.wait()
                self._wake_renewals = trio.Event()
                continue
            await trio.sleep_until(due)
            for member_id in self.renewals.pop_due(trio.current_time()):
                self._send_resume_token(member_id)
            self._flush()

    async def _read_requests(self, conn: _Conn) -> None:
        assert conn.channels is not None
        channel = conn.channels[Channel.REQUESTS]
        async for delivery in channel:
            self._on_request(conn, delivery.data, channel)

    async def _read_chat(self, conn: _Conn) -> None:
        """Chat is read at the member's chat rate: a flood waits in its own channel's buffer,
        and once that is full, at the sender, for credit."""
        assert conn.channels is not None
        limit = self.config.lobby.chat_limit
        bucket = TokenBucket(limit, trio.current_time())
        channel = conn.channels[Channel.CHAT]
        async for delivery in channel:
            while not bucket.take(trio.current_time()):  # noqa: ASYNC110 (a rate, not an event)
                await trio.sleep(max(0.001, (1.0 - bucket.tokens) / limit.rate))
            self._on_request(conn, delivery.data, channel)
