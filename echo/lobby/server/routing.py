"""The lobby server's requests and deliveries: one request handled and answered, its
telemetry, and the messages queued per member and flushed together (chat dropped for a slow
member, updates closing its session).

Driver: trio, sessions and the clock.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import structlog
import trio

from echo.channels import ChannelsClosed
from echo.lobby.protocol import (
    Channel,
    ChatLine,
    CreateLobby,
    ErrorCode,
    GameStarting,
    LobbyJoined,
    LobbyProtocolError,
    MemberJoined,
    MemberLeft,
    RecreateLobby,
    Refusal,
    Request,
    ResumeToken,
    StartGame,
    channel_of,
    encode,
    parse_request_untrusted,
)
from echo.lobby.queue_wire import CancelMatch, EnqueueMatch
from echo.lobby.resume import (
    ResumeTokenError,
    issue_resume_token,
    token_ttl,
)
from echo.lobby.server.base import (
    _Base,
    _Conn,
    _quietly,
)
from echo.lobby.state import Send

log = structlog.get_logger("echo.lobby")


class _Routing(_Base):
    """Requests in; replies, updates and chat out."""

    def _on_request(self, conn: _Conn, data: bytes, channel: Any) -> None:
        """One request of `conn`'s member from its logical `channel`: the reply, the updates,
        and the channel's credit for the request (released here, once processed) go out
        together, in one session message to the member."""
        if self.handing_off:
            return  # no reply: the member asks the server it moves to (echo.lobby.drain)
        started = time.perf_counter()
        self._holding = True
        kind: type[Request] | None = None
        try:
            kind = self._handle_request(conn.member_id, data, Channel(channel.channel_id))
        finally:
            channel.done(defer=True)
            if not conn.queued and conn.channels is not None:
                conn.queued = True
                self._touched.append(conn)
            self._holding = False
            self._flush()
        timed = None if kind is None else self.latency.get(kind)
        if timed is not None:
            timed.observe(time.perf_counter() - started)
        self._wake_expiry.set()

    def _handle_request(
        self, member_id: str, data: bytes, arrived_on: Channel
    ) -> type[Request] | None:
        """Handle one request; its type if it was decoded (for the latency metrics)."""
        now = trio.current_time()
        try:
            request = parse_request_untrusted(data)
        except LobbyProtocolError as error:
            self.counters["bad_messages"] += 1
            rid = int.from_bytes(data[1:5], "big") if len(data) >= 5 else 0
            self._refused(member_id, "undecodable", ErrorCode.BAD_REQUEST)
            self._reply(member_id, Refusal(rid, ErrorCode.BAD_REQUEST, f"bad message: {error}"))
            return None
        if channel_of(request) is not arrived_on:
            # The channel is part of the contract: chat on the requests channel would skip the
            # chat pacing, and a request on the chat channel would wait behind chat.
            self.counters["wrong_channel"] += 1
            self._refused(member_id, type(request).__name__, ErrorCode.BAD_REQUEST)
            self._reply(
                member_id,
                Refusal(request.request_id, ErrorCode.BAD_REQUEST, "sent on the wrong channel"),
            )
            return None
        before = self.registry.lobby_of(member_id)
        conn = self.conns.get(member_id)
        secret = b"" if conn is None else conn.secret
        if isinstance(request, EnqueueMatch | CancelMatch):
            handled = self.queues.handle(member_id, request, now, secret=secret)
            self._wake_match.set()
        else:
            handled = self.registry.handle(member_id, request, now, secret=secret)
        reply = handled.reply
        if isinstance(reply, Refusal):
            self._refused(member_id, type(request).__name__, reply.code)
        else:
            self._note(member_id, request, reply, handled.sends, before)
        if isinstance(reply, LobbyJoined):
            # Seated on this session: its client may take the seat back by its secret alone,
            # should this reply never reach it.
            self.bindings.bind(member_id, reply.lobby_id, secret)
        self._reply(member_id, reply)
        self._deliver(handled.sends)
        return type(request)

    def _refused(self, member_id: str, request: str, code: ErrorCode) -> None:
        self.counters["refusals"] += 1
        self._emit("lobby_refused", member_id=member_id, request=request, code=code.name)

    def _note(
        self,
        member_id: str,
        request: Request,
        reply: Any,
        sends: Sequence[Send],
        before: int | None,
    ) -> None:
        """The telemetry events of one accepted request."""
        if isinstance(request, CreateLobby | RecreateLobby) and isinstance(reply, LobbyJoined):
            if before != reply.lobby_id:
                snapshot = self.registry.snapshot(reply.lobby_id)
                if snapshot is not None and isinstance(request, CreateLobby):
                    self._emit(
                        "lobby_created",
                        lobby_id=reply.lobby_id,
                        member_id=member_id,
                        max_members=snapshot.max_members,
                        visibility="private" if snapshot.private else "public",
                    )
                    self._emit(
                        "lobby_joined", lobby_id=reply.lobby_id, member_id=member_id, members=1
                    )
        if isinstance(request, StartGame):
            starts = [s.message for s in sends if isinstance(s.message, GameStarting)]
            self._emit(
                "lobby_started",
                lobby_id=request.lobby_id,
                members=self.registry.member_count(request.lobby_id) or 0,
                game_server=starts[0].server_id if starts else "",
            )

    def _reply(self, member_id: str, reply: Any) -> None:
        self._deliver((Send((member_id,), reply),))

    def _deliver(self, sends: Sequence[Send]) -> None:
        for out in sends:
            message = out.message
            ch = channel_of(message)
            if isinstance(message, MemberJoined):
                self._emit(
                    "lobby_joined",
                    lobby_id=message.lobby_id,
                    member_id=message.member.member_id,
                    members=self.registry.member_count(message.lobby_id) or 0,
                )
            elif isinstance(message, MemberLeft):
                self.bindings.forget(message.member_id, message.lobby_id)
                count = self.registry.member_count(message.lobby_id)
                self._emit(
                    "lobby_left",
                    lobby_id=message.lobby_id,
                    member_id=message.member_id,
                    members=count or 0,
                    reason=message.reason.name.lower(),
                )
                if count is None:
                    self._emit("lobby_deleted", lobby_id=message.lobby_id, reason="empty")
            elif isinstance(message, ChatLine):
                self._emit(
                    "lobby_chat",
                    lobby_id=message.lobby_id,
                    member_id=message.member_id,
                    bytes=len(message.text.encode()),
                )
            if ch is Channel.UPDATES or isinstance(message, LobbyJoined):
                self._listings_dirty = True
            if not out.to:
                continue
            data = encode(message)  # once, for every member it goes to
            self.encoded = (data, message)  # (a door that re-forms it needs no parse: `text_of`)
            for member in out.to:
                self._send_to(member, ch, data)
                if isinstance(message, LobbyJoined):
                    self._send_resume_token(member)  # seated: a token for this seat
        if not self._holding:
            self._flush()

    def _flush(self) -> None:
        """Hand each member what was just queued for it, from this task (see _send_to)."""
        touched, self._touched = self._touched, []
        for conn in touched:
            conn.queued = False
            if conn.channels is not None:
                conn.channels.flush_nowait()

    def _send_to(self, member_id: str, ch: Channel, data: bytes) -> None:
        """Queue `data` for the member; `_flush` sends it. (Queued without waking anyone, and
        then sent from this task: a writer task woken per member and message cost more than
        the sending.)"""
        conn = self.conns.get(member_id)
        if conn is None or conn.closing is not None:
            return
        channels = conn.channels
        if channels is None:
            conn.pending.append((ch, data))  # (a few messages, for a handshake's moment)
            return
        backlog = self.config.chat_backlog if ch is Channel.CHAT else self.config.updates_backlog
        try:
            if channels[ch].send_nowait(data, max_queued=backlog, defer=True):
                if not conn.queued:
                    conn.queued = True
                    self._touched.append(conn)
                return
        except ChannelsClosed:
            return
        if ch is Channel.CHAT:
            self.counters["chat_dropped"] += 1
            return
        # Updates cannot be skipped without a snapshot: the member reconnects for one.
        self.counters["members_too_slow"] += 1
        conn.closing = "too slow"
        log.warning("lobby_member_too_slow", member_id=member_id)
        if self._nursery is not None:
            self._nursery.start_soon(_quietly, conn.session.close, "too slow")

    def _send_resume_token(self, member_id: str) -> None:
        """Queue the member's resume token, for its session's secret and its seat here (none
        without a secret, a seat, or a grace period: the token would take nothing back)."""
        conn = self.conns.get(member_id)
        lobby_id = self.registry.lobby_of(member_id)
        grace = self.config.lobby.reconnect_grace
        if conn is None or not conn.secret or lobby_id is None or grace <= 0:
            self.renewals.discard(member_id)
            return
        expires = self.seats.clock() + token_ttl(grace)
        try:
            token = issue_resume_token(self.seats.key, lobby_id, member_id, conn.secret, expires)
        except ResumeTokenError:  # pragma: no cover - a secret the hello parser let through
            return
        message = ResumeToken(lobby_id, token)
        data = encode(message)
        self.encoded = (data, message)
        self._send_to(member_id, Channel.UPDATES, data)
        if not self.renewals:
            self._wake_renewals.set()
        self.renewals.add(member_id, trio.current_time() + grace)
