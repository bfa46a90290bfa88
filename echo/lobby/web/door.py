"""The lobby's WebSocket door: members on WebSocket in the same process and registry as the
UDP members (docs/json-protocol.md).

A thin trio driver around `LobbyServer`: each WebSocket is one member connection, let in by
the server's own hello checks (identity token, seat, secret, resume token) and then handled by
the same request path, so a lobby holds members of both kinds and every rule holds for both.
The JSON form of the messages is `echo.lobby.web.jsonwire`'s (pure); the framing is
trio-websocket's, on wsproto.

How a connection is bounded (each case counted in the server's counters, ``ws_*``):

- **Incoming.** trio-websocket reads one message ahead (its queue holds one), so a client
  that sends faster than the door handles waits in its own TCP window. A message over
  `WebDoorConfig.max_message_bytes` closes with 1009, a binary frame with 1003. Each message
  spends a token of the connection's `message_rate`; one without a token is answered with a
  ``rate_limited`` refusal; those have a budget too (`over_rate`), and past it the
  connection is closed with 1008. Chat waits for
  the member's chat rate (the registry's `chat_limit`, as over UDP) in a queue of at most
  `max_chat_waiting` lines: the requests that can be waiting unanswered. One task of the
  door's paces every member's waiting chat.
- **Outgoing.** What the server sends to the member is queued here as JSON text, per logical
  channel with the server's backlogs (`LobbyServerConfig.updates_backlog`, `chat_backlog`),
  and one writer task sends it in order: a member that does not read has its chat dropped and,
  past the updates backlog, its connection closed (4001), as a UDP member's session is.
- **Idle.** No hello within the server's hello timeout closes with 4003; a member that does not
  answer a ping within `ping_timeout` is dropped (its seat goes RECONNECTING); beyond
  `max_connections` a new connection is closed with 1013. One task of the door keeps every
  member's ping time, and a ping's own task lives only until its pong.

A member at rest is three trio tasks: trio-websocket's reader, its handler here (which reads
its messages) and its writer. What every member needs on a timer (pings, paced chat) is one
task's for all: a sleeping task is about 3 KB, and 8,000 members are 8,000 of each.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import heapq
import itertools
import ssl
from collections.abc import Mapping
from typing import Any, cast

import attrs
import structlog
import trio
from trio_websocket import ConnectionClosed, WebSocketConnection, WebSocketRequest, serve_websocket

from echo.lobby.due import DueQueue
from echo.lobby.hello import HelloError, encode_hello
from echo.lobby.limits import RateLimit, TokenBucket
from echo.lobby.protocol import (
    Channel,
    ErrorCode,
    LobbyProtocolError,
    Refusal,
    Request,
    SendChat,
    channel_of,
    encode,
    parse_server_message_untrusted,
)
from echo.lobby.server import LobbyServer, _Conn
from echo.lobby.web.jsonwire import (
    CloseCode,
    JsonProtocolError,
    dump_message,
    dump_welcome,
    dumps,
    load_hello,
    loads,
    parse_request_text_untrusted,
    request_id_of,
)
from echo.lobby.web.moving import moved_for

log = structlog.get_logger("echo.lobby.web")

_GONE = (ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError)

#: The server's close reasons, as close codes (any other reason at the hello: HELLO_REFUSED).
_CLOSE_CODES = {
    "too slow": CloseCode.TOO_SLOW,
    "replaced by a new session": CloseCode.REPLACED,
    "server shutting down": CloseCode.GOING_AWAY,
}


#: A connection's messages of every kind: well above what the registry's own limits let
#: through (a few a second of each kind), well below a flood.
MESSAGE_RATE = RateLimit(rate=20.0, burst=40.0)


@attrs.frozen
class WebDoorConfig:
    """The door's address and its per-connection limits (docs/json-protocol.md)."""

    port: int = 0
    address: str = "127.0.0.1"
    ssl_context: ssl.SSLContext | None = None
    max_message_bytes: int = 256 * 1024
    message_rate: RateLimit = MESSAGE_RATE
    over_rate: RateLimit = MESSAGE_RATE  # messages refused for the rate, before a close
    max_chat_waiting: int = 16
    max_connections: int = 10_000
    ping_interval: float = 15.0
    ping_timeout: float = 20.0
    close_timeout: float = 2.0  # for the closing handshake; then the TCP connection is cut
    # The ring's WebSocket doors by server name (--lobby-ws-urls): where a member is sent when
    # this server drains (echo.lobby.web.moving). Empty: members hear only the 1001.
    ring_urls: Mapping[str, str] = attrs.field(factory=dict)


def tls_context(cert: str, key: str) -> ssl.SSLContext:
    """A server TLS context from PEM files (ValueError with the reason if they do not load)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as error:
        raise ValueError(f"cannot load the certificate and key: {error}") from None
    return context


class _Lane:
    """One logical channel of a WebSocket member, as the server's send path sees it."""

    __slots__ = ("channel_id", "outbox", "queued")

    def __init__(self, outbox: _Outbox, channel_id: Channel) -> None:
        self.outbox = outbox
        self.channel_id = channel_id
        self.queued = 0  # bytes of text queued on this lane and not yet sent

    def send_nowait(self, data: bytes, *, max_queued: int, defer: bool = False) -> bool:
        """The server's binary message, queued as JSON text; False when `max_queued` bytes or
        more already wait on this lane (the server then drops chat or closes: `_send_to`)."""
        if self.queued >= max_queued:
            return False
        text = self.outbox.door.text_of(data)
        size = len(text)
        self.queued += size
        self.outbox.queued().append((self, text, size))
        if not defer:
            self.outbox.flush_nowait()
        return True

    def done(self, *, defer: bool = False) -> None:
        """(A request read here needs no credit returned: the WebSocket has its own window.)"""


class _Outbox:
    """A WebSocket member's `channels` for the server: three lanes, one ordered queue, sent by
    the connection's writer task. The queue exists only while something waits in it (an
    empty deque is ~0.8 KB, and a member at rest has nothing queued)."""

    __slots__ = ("door", "emptied", "lanes", "queue", "wake")

    def __init__(self, door: WebDoor) -> None:
        self.door = door
        self.lanes = tuple(_Lane(self, ch) for ch in Channel)  # by channel id: 0, 1, 2
        self.queue: collections.deque[tuple[_Lane, str, int]] | None = None
        self.wake = trio.Event()
        self.emptied: trio.Event | None = None  # set once the writer has sent all it held

    def __getitem__(self, ch: Channel) -> _Lane:
        return self.lanes[ch]

    def queued(self) -> collections.deque[tuple[_Lane, str, int]]:
        if self.queue is None:
            self.queue = collections.deque()
        return self.queue

    def flush_nowait(self) -> None:
        if self.queue:
            self.wake.set()

    async def write(self, ws: WebSocketConnection) -> None:
        with contextlib.suppress(*_GONE):
            await self._write(ws)

    async def _write(self, ws: WebSocketConnection) -> None:
        while True:
            await self.wake.wait()
            self.wake = trio.Event()
            while self.queue:
                lane, text, size = self.queue[0]
                await ws.send_message(text)
                self.queue.popleft()
                lane.queued -= size
            self.queue = None
            if self.emptied is not None:
                self.emptied.set()
                self.emptied = None

    def push(self, text: str) -> None:
        """A message of the door's own (not the server's) behind everything queued."""
        self.queued().append((self.lanes[Channel.UPDATES], text, 0))
        self.flush_nowait()

    async def sent(self) -> None:
        """Until everything queued now has been handed to the WebSocket."""
        while self.queue:
            if self.emptied is None:
                self.emptied = trio.Event()
            await self.emptied.wait()


class _Member:
    """A WebSocket as the server's session: the hello it read, and a close with a code."""

    __slots__ = (
        "admitted", "cancel", "chat", "chat_bucket", "conn", "door", "gone", "hello", "outbox",
        "ping", "ws",
    )  # fmt: skip

    def __init__(self, door: WebDoor, ws: WebSocketConnection, hello: bytes) -> None:
        self.door = door
        self.ws = ws
        self.hello = hello
        self.admitted = False
        self.cancel = trio.CancelScope()
        self.conn: _Conn | None = None  # once let in
        self.outbox: _Outbox | None = None
        self.gone = trio.Event()  # its connection's handling has ended
        # chat waiting for the chat rate (a deque is ~0.8 KB: only while one waits)
        self.chat: collections.deque[bytes] | None = None
        self.chat_bucket: TokenBucket | None = None  # once let in
        self.ping: trio.CancelScope | None = None  # while a ping waits for its pong

    async def receive(self) -> bytes:
        return self.hello

    async def send(self, data: bytes) -> None:  # the binary welcome: the door sends its own
        pass

    async def close(self, reason: str) -> None:
        code = _CLOSE_CODES.get(reason, CloseCode.HELLO_REFUSED)
        if reason.startswith("resume refused"):
            code = CloseCode.RESUME_REFUSED
        elif reason == "no hello":
            code = CloseCode.NO_HELLO
        await self.door.close(self.ws, code, reason)
        self.cancel.cancel()

    def ended(self) -> None:
        """Its connection's handling is over: what waited for it is let go."""
        self.gone.set()
        self.chat = None
        self.door._ping_due.discard(self)
        if self.ping is not None:
            self.ping.cancel()


class WebDoor:
    """``await nursery.start(door.run)`` beside ``server.run``: the WebSocket members of
    `server`. `port` is the bound port once started."""

    def __init__(self, server: LobbyServer, config: WebDoorConfig | None = None) -> None:
        self.server = server
        self.config = config or WebDoorConfig()
        self.counters = server.counters  # exported with the server's (echo.ops.metrics)
        self.open = 0
        self.port = self.config.port
        self._last: tuple[bytes, str] | None = None
        self._members: set[_Member] = set()
        self._nursery: trio.Nursery | None = None  # the door's own tasks (`run`)
        # when each member is next pinged (`_heartbeats`)
        self._ping_due: DueQueue[_Member] = DueQueue()
        self._ping_wake = _Flag()
        # members with chat waiting for their chat rate, by when a line is next due (`_pace_chat`)
        self._chat_due: list[tuple[float, int, _Member]] = []
        self._chat_wake = _Flag()
        self._chat_order = itertools.count()

    def text_of(self, data: bytes) -> str:
        """The JSON text of a binary server message. The server encodes a message once for
        all its recipients and hands each the same bytes: one conversion serves them all.
        The message itself is the server's `encoded` when those are its bytes (parsing the
        bytes back was about 6 % of the server CPU of a WebSocket join)."""
        last = self._last
        if last is not None and last[0] is data:
            return last[1]
        encoded = self.server.encoded
        if encoded is not None and encoded[0] is data:
            message = encoded[1]
        else:
            message = parse_server_message_untrusted(data)
        text = dumps(dump_message(message))
        self._last = (data, text)
        return text

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        config = self.config
        serve = functools.partial(
            serve_websocket,
            self._handle,
            config.address,
            config.port,
            config.ssl_context,
            max_message_size=config.max_message_bytes,
            connect_timeout=self.server.config.hello_timeout,
            disconnect_timeout=config.close_timeout,
        )
        async with trio.open_nursery() as nursery:
            self.start_timers(nursery)
            ws_server = await nursery.start(serve)
            self.port = ws_server.port
            log.info(
                "lobby_ws_listening",
                address=config.address,
                port=self.port,
                tls=config.ssl_context is not None,
                max_connections=config.max_connections,
            )
            task_status.started(self)

    def start_timers(self, nursery: trio.Nursery) -> None:
        """The door's own tasks in `nursery`: every member's pings and paced chat. `run`
        starts them; a door that listens its own way (`PagedDoor`) must too."""
        self._nursery = nursery
        nursery.start_soon(self._heartbeats)
        nursery.start_soon(self._pace_chat)

    async def stop(self, reason: str = "server shutting down") -> None:
        """Close every member's connection (1001 with `reason`)."""
        async with trio.open_nursery() as nursery:
            for member in list(self._members):
                nursery.start_soon(member.close, reason)

    async def hand_off(self, reason: str = "server shutting down") -> int:
        """The drain (`echo.lobby.drain`, once the server carries out no more requests): each
        member is told where to go (``moved``, behind everything already queued for it, when
        its next server has a door), and nothing after it; the client closes the connection
        itself on ``moved`` (so the closing handshake reads whatever it was still sending: a
        server that closed with requests unread would reset the connection, and the ``moved``
        with it). One that does not within `close_timeout`, or was not told, is closed with
        1001. How many were told."""
        told = 0
        async with trio.open_nursery() as nursery:
            for member in list(self._members):
                moved = self._moved(member)
                if moved is not None:
                    told += 1
                nursery.start_soon(self._send_off, member, moved, reason)
        return told

    def _moved(self, member: _Member) -> str | None:
        conn, server = member.conn, self.server
        if conn is None or member.outbox is None or not self.config.ring_urls:
            return None
        message = moved_for(
            server.ring,
            server.server_id,
            self.config.ring_urls,
            server.registry.lobby_of(conn.member_id),
            conn.member_id,
        )
        return None if message is None else dumps(message)

    async def _send_off(self, member: _Member, moved: str | None, reason: str) -> None:
        if moved is not None and member.outbox is not None and member.conn is not None:
            member.outbox.push(moved)
            member.conn.closing = reason  # nothing more is sent to it (`LobbyServer._send_to`)
            with trio.move_on_after(self.config.close_timeout):
                await member.outbox.sent()
                await member.gone.wait()  # it closes on `moved`
        await member.close(reason)

    async def close(self, ws: WebSocketConnection, code: int, reason: str) -> None:
        """Close with `code` and `reason` (at most 123 bytes: the close frame's room), cutting
        the connection if the peer does not take the close frame in time."""
        reason = reason.encode()[:123].decode(errors="ignore")
        with trio.move_on_after(self.config.close_timeout):
            await ws.aclose(code, reason)
        await ws._close_stream()  # (idempotent; the closing handshake may have timed out)

    # ------------------------------------------------------------------ one connection

    async def _handle(self, request: WebSocketRequest) -> None:
        ws = await request.accept()
        if self.open >= self.config.max_connections:
            self.counters["ws_connections_refused"] += 1
            await self.close(ws, 1013, "the server holds its maximum of connections")
            return
        self.open += 1
        self.counters["ws_connections"] += 1
        try:
            await self._member(ws)
        finally:
            self.open -= 1

    async def _hello(self, ws: WebSocketConnection) -> bytes | None:
        """The first message, as the binary hello the server checks; None once closed."""
        text: str | bytes | None = None
        with trio.move_on_after(self.server.config.hello_timeout):
            try:
                text = await ws.get_message()
            except ConnectionClosed:
                return None
        if text is None:
            self.counters["hellos_timed_out"] += 1
            await self.close(ws, CloseCode.NO_HELLO, "no hello")
            return None
        try:
            if isinstance(text, bytes):
                raise JsonProtocolError("the protocol is JSON text, not binary frames")
            return encode_hello(load_hello(loads(text)))
        except (JsonProtocolError, HelloError) as error:
            self.counters["hellos_refused"] += 1
            await self.close(ws, CloseCode.HELLO_REFUSED, f"bad hello: {error}")
            return None

    async def _member(self, ws: WebSocketConnection) -> None:
        data = await self._hello(ws)
        if data is None:
            return
        member = _Member(self, ws, data)
        self._members.add(member)
        try:
            await self._admit(member)
        finally:
            self._members.discard(member)
            member.ended()

    async def _admit(self, member: _Member) -> None:
        server, ws = self.server, member.ws
        hello = await server._authenticate(cast(Any, member))
        if hello is None:
            return
        conn = _Conn(hello.member_id, cast(Any, member), hello.secret)
        old = server.conns.get(hello.member_id)
        server.conns[hello.member_id] = conn
        outbox = _Outbox(self)
        member.conn, member.outbox = conn, outbox
        member.chat_bucket = TokenBucket(server.config.lobby.chat_limit, trio.current_time())
        try:
            with member.cancel:
                await ws.send_message(dumps(dump_welcome(server.server_id)))
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(outbox.write, ws)
                    await server.member_arrived(conn, outbox, old)
                    self._ping_later(member)
                    await self._read(member, conn)
                    nursery.cancel_scope.cancel()
        except _GONE:
            pass
        finally:
            server.member_gone(conn)
        if conn.closing is None:
            await self.close(ws, CloseCode.NORMAL, "")

    async def _read(self, member: _Member, conn: _Conn) -> None:
        config, ws = self.config, member.ws
        bucket = TokenBucket(config.message_rate, trio.current_time())
        # Refusals have a budget of their own: a client a little over the rate is refused now
        # and then; one at twice the rate or more (a request per millisecond) is closed.
        strikes = TokenBucket(config.over_rate, trio.current_time())
        while True:
            try:
                text = await ws.get_message()
            except ConnectionClosed as closed:
                if closed.reason is not None and closed.reason.code == CloseCode.MESSAGE_TOO_BIG:
                    self.counters["ws_too_big"] += 1
                return
            if isinstance(text, bytes):
                self.counters["ws_binary_frames"] += 1
                await self._close_member(
                    ws, conn, CloseCode.UNSUPPORTED_DATA, "binary frame: the protocol is JSON text"
                )
                return
            now = trio.current_time()
            if not bucket.take(now):
                self.counters["ws_rate_limited"] += 1
                if not strikes.take(now):
                    self.counters["ws_rate_closed"] += 1
                    await self._close_member(
                        ws, conn, CloseCode.POLICY_VIOLATION, "over the message rate"
                    )
                    return
                self._refuse(
                    conn, _rid(text), ErrorCode.RATE_LIMITED, "over the connection's message rate"
                )
                continue
            self._on_text(member, conn, text)

    def _on_text(self, member: _Member, conn: _Conn, text: str) -> None:
        try:
            request = parse_request_text_untrusted(text)
            data = encode(request)
        except JsonProtocolError as error:
            self.counters["ws_bad_messages"] += 1
            self.server._refused(conn.member_id, "undecodable", ErrorCode.BAD_REQUEST)
            self._refuse(
                conn, error.request_id, ErrorCode.BAD_REQUEST, f"bad message: {error}", count=True
            )
            return
        except LobbyProtocolError as error:  # valid JSON, but too large for the binary fields
            self._refuse(
                conn, _rid(text), ErrorCode.BAD_REQUEST, f"bad message: {error}", count=True
            )
            return
        if isinstance(request, SendChat):
            self._on_chat(member, conn, request.request_id, data)
            return
        self.server._on_request(conn, data, self._lane(conn, request))

    def _on_chat(self, member: _Member, conn: _Conn, request_id: int, data: bytes) -> None:
        """Chat is handled at the member's chat rate, as the UDP server reads it: at once
        while the rate allows, else after the lines already waiting."""
        bucket, chat = cast(TokenBucket, member.chat_bucket), member.chat
        now = trio.current_time()
        if not chat and bucket.take(now):
            self.server._on_request(conn, data, cast(_Outbox, conn.channels)[Channel.CHAT])
            return
        if chat is None:
            chat = member.chat = collections.deque()
        elif len(chat) >= self.config.max_chat_waiting:
            self.counters["ws_chat_queue_full"] += 1
            self._refuse(
                conn,
                request_id,
                ErrorCode.RATE_LIMITED,
                "too many chat lines waiting for the chat rate",
            )
            return
        chat.append(data)
        if len(chat) == 1:
            self._chat_later(member, bucket, now)

    def _lane(self, conn: _Conn, request: Request) -> _Lane:
        return cast(_Outbox, conn.channels)[channel_of(request)]

    def _refuse(
        self, conn: _Conn, rid: int, code: ErrorCode, message: str, *, count: bool = False
    ) -> None:
        if count:
            self.counters["bad_messages"] += 1
        self.server._reply(conn.member_id, Refusal(rid, code, message))

    def _chat_later(self, member: _Member, bucket: TokenBucket, now: float) -> None:
        due = now + max(0.001, bucket.wait(now))
        heapq.heappush(self._chat_due, (due, next(self._chat_order), member))
        if self._chat_due[0][2] is member:
            self._chat_wake.set()  # sooner than what the pacer sleeps for

    async def _pace_chat(self) -> None:
        """The door's one chat pacer: each member's waiting lines, as its rate allows."""
        due = self._chat_due
        while True:
            if not due:
                await self._chat_wake.wait()
                continue
            with trio.move_on_at(due[0][0]):
                await self._chat_wake.wait()
                continue
            member = heapq.heappop(due)[2]
            conn, bucket, now = member.conn, member.chat_bucket, trio.current_time()
            if conn is None or bucket is None or member.gone.is_set():
                continue
            lane = cast(_Outbox, conn.channels)[Channel.CHAT]
            chat = member.chat
            while chat and bucket.take(now):
                self.server._on_request(conn, chat.popleft(), lane)
            if chat:
                self._chat_later(member, bucket, now)
            else:
                member.chat = None

    def _ping_later(self, member: _Member) -> None:
        if not self._ping_due:
            self._ping_wake.set()
        self._ping_due.add(member, trio.current_time() + self.config.ping_interval)

    async def _heartbeats(self) -> None:
        """The door's one ping clock: each member pinged every `ping_interval` from its
        arrival (members that arrived together are pinged together, the rest spread out)."""
        due = self._ping_due
        while True:
            at = due.next_due()
            if at is None:
                await self._ping_wake.wait()
                continue
            await trio.sleep_until(at)
            now = trio.current_time()
            for member in due.pop_due(now):
                if member.ping is None:
                    cast(trio.Nursery, self._nursery).start_soon(self._ping, member)
                due.add(member, now + self.config.ping_interval)

    async def _ping(self, member: _Member) -> None:
        """No pong within `ping_timeout`: the member is gone."""
        with trio.CancelScope() as member.ping:
            with trio.move_on_after(self.config.ping_timeout) as waited:
                try:
                    await member.ws.ping()
                except _GONE:
                    return
                finally:
                    member.ping = None
            if waited.cancelled_caught:
                self.counters["ws_ping_timeouts"] += 1
                member.cancel.cancel()

    async def _close_member(
        self, ws: WebSocketConnection, conn: _Conn, code: int, reason: str
    ) -> None:
        conn.closing = reason
        await self.close(ws, code, reason)


class _Flag:
    """An event that can be waited for again once it fired."""

    def __init__(self) -> None:
        self._event = trio.Event()

    def set(self) -> None:
        self._event.set()

    async def wait(self) -> None:
        await self._event.wait()
        self._event = trio.Event()


def _rid(text: str) -> int:
    """The request id of a message refused unread (over the rate), if it is easily had."""
    if len(text) > 4096:
        return 0
    try:
        return request_id_of(loads(text))
    except JsonProtocolError:
        return 0
