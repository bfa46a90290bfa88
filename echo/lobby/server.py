"""The lobby server: one trio driver around `LobbyRegistry`.

A `SessionServer` application. Each member's session starts with the hello of
`echo.lobby.hello` (who it is; its seat if it sits in a lobby here), then carries the lobby's
three logical channels (`echo.lobby.protocol.Channel`): requests and replies, state updates,
chat. All registry calls happen in this one trio thread with ``now = trio.current_time()``.

Why the pieces are shaped as they are:

- **Chat never delays state.** A member's outgoing messages are queued on their own logical
  channel (`Channel.send_nowait`, which waits for nothing), and each channel goes out under its
  own credit: a chat channel waiting for a slow member's credit never holds up its updates.
  No task per member and channel: a delivery is one enqueue (`send_nowait(defer=True)`), and
  once a request is handled each member it touched gets what was queued for it in one session
  message, sent from the request's own task (`Channels.flush_nowait`); the session's channel
  writer takes over only under back pressure (at L1's 8,000 members a writer task per channel
  was 24,000 tasks, and three task switches per message delivered; waking the one writer per
  member and message was still more than the send). A member's
  incoming chat is read at its chat rate (the registry's `chat_limit`): while the reader
  waits, that channel's guarantees run out and the flooding member's `send` is held back by
  credit (echo.channels), on its own channel only.
- **A slow member does not slow the others.** Sending to a member never blocks the driver: a
  chat line that finds `chat_backlog` bytes waiting for that member is dropped for it
  (counted); an update that finds `updates_backlog` closes its session (it comes back with a
  snapshot: updates carry versions).
- **Reconnection.** A dropped session leaves the seat RECONNECTING for the grace period
  (`LobbyConfig.reconnect_grace`); a new session of the member with its seat takes it back,
  and so does one from the very client that was seated (its hello secret, `SeatBindings`),
  which may never have learned its seat: the LobbyJoined that carried it was lost. Every
  session that takes a seat is sent a LobbyJoined (request id 0) with its seat again.
- **Many servers.** The server only creates lobbies (and join codes) whose home is itself on
  the consistent-hashing ring of the lobby-server list, so members find a lobby's home from its
  id alone. Listings go out on a topic (soft state, refreshed) and other servers' listings come
  in, so a search sees every server; game servers' announcements come in on another topic.
- **Bad input** is a `Refusal` with a code (undecodable bytes: BAD_REQUEST), counted; it never
  raises here.
"""

from __future__ import annotations

import hmac
import math
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import attrs
import structlog
import trio
from prometheus_client import Histogram

from echo.channels import ChannelsClosed, ChannelSpec, open_channels
from echo.channels.api import Channels
from echo.lobby.games import (
    GameServerAnnouncement,
    GameServerDirectory,
    encode_announcement,
    parse_announcement_untrusted,
)
from echo.lobby.hello import (
    Hello,
    HelloError,
    SeatBindings,
    encode_welcome,
    parse_hello_untrusted,
)
from echo.lobby.home import home_of
from echo.lobby.identity import IdentityRefused, IdentityVerifier
from echo.lobby.identity import close_reason as identity_close_reason
from echo.lobby.limits import LobbyConfig, TokenBucket
from echo.lobby.listings import (
    ListingBoard,
    encode_listing_record,
    parse_listing_record_untrusted,
)
from echo.lobby.matchmaker import MatchRules
from echo.lobby.protocol import (
    MAX_MESSAGE_BYTES,
    Channel,
    ChatLine,
    CreateLobby,
    ErrorCode,
    GameStarting,
    JoinByCode,
    JoinLobby,
    LobbyJoined,
    LobbyProtocolError,
    MemberJoined,
    MemberLeft,
    QuickJoin,
    RecreateLobby,
    Refusal,
    Request,
    ResumeToken,
    SearchLobbies,
    StartGame,
    channel_of,
    encode,
    parse_request_untrusted,
)
from echo.lobby.queue_wire import CancelMatch, EnqueueMatch
from echo.lobby.queues import QueueDesk, Seated
from echo.lobby.results import GameResult, sign_result, verify_result
from echo.lobby.resume import (
    ResumeRefusal,
    ResumeTokenError,
    check_resume,
    issue_resume_token,
    token_ttl,
)
from echo.lobby.state import LobbyRegistry, Send, random_join_code, random_lobby_id
from echo.lobby.timers import lobby_server_timers
from echo.session import ServerConfig, Session, SessionError, SessionServer
from echo.session.server import EventSink
from echo.tickets import TicketIssuer, TicketKey, TicketSeats
from echo.topics.ring import HashRing

log = structlog.get_logger("echo.lobby")

LISTINGS_TOPIC = "echo-lobby/listings"
GAMES_TOPIC = "echo-lobby/games"
RESULTS_TOPIC = "echo-lobby/results"
#: Buckets of the request-latency histograms, in seconds: a request is handled in tens of
#: microseconds to a few milliseconds (a join that updates a full lobby), unless the loop lags.
LATENCY_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


#: The largest message on the chat channel, either way: the server's whole chat buffer (a
#: larger SendChat could never be guaranteed there). Declared, it lets a member hand back
#: chat credit once a quarter of its 16 KiB is read instead of after every line: one datagram
#: to the server per chat line delivered was as many as the deliveries themselves.
CHAT_MAX_MESSAGE = 2048
#: A ChatLine's bytes besides its member id and text: type, lobby id, str8 and str16 lengths.
CHAT_LINE_OVERHEAD = 1 + 8 + 1 + 2


def lobby_channel_specs(*, server: bool) -> list[ChannelSpec]:
    """The lobby's logical channels. Capacities are each side's receive buffers: the server
    takes requests up to the largest message (a recreate carries a whole lobby) and hardly
    anything on the updates channel (members send nothing there); chat holds a few lines, so a
    flood runs out of credit at once. Chat has the lowest priority on the wire, and a bound on
    its messages (`CHAT_MAX_MESSAGE`)."""
    if server:
        caps = {Channel.REQUESTS: MAX_MESSAGE_BYTES, Channel.UPDATES: 1024, Channel.CHAT: 2048}
    else:
        caps = {
            Channel.REQUESTS: MAX_MESSAGE_BYTES,
            Channel.UPDATES: MAX_MESSAGE_BYTES,
            Channel.CHAT: 16 * 1024,
        }
    return [
        ChannelSpec(Channel.REQUESTS, capacity=caps[Channel.REQUESTS], priority=0),
        ChannelSpec(Channel.UPDATES, capacity=caps[Channel.UPDATES], priority=0),
        ChannelSpec(
            Channel.CHAT, capacity=caps[Channel.CHAT], priority=1, max_message=CHAT_MAX_MESSAGE
        ),
    ]


@attrs.frozen
class LobbyServerConfig:
    """Everything one lobby server needs besides its sockets' `ServerConfig`.

    server_id      this server's name on the ring and in listings; members reach it as
                   "host:port" (the all-clients port; the control port is port + 1 unless the
                   members' list says otherwise), so by default it is exactly that
    lobby_servers  every lobby server's id, this one included: the consistent-hashing ring
    topics         topic servers ("host:port") for listings and game-server announcements;
                   empty: no listings from others and no games
    seat_keys      the key every lobby server shares to sign seats (first signs); empty: a
                   random key of this process (seats then only work on this server)
    ticket_keys    the game servers' key for game tickets (first signs); empty: no starts.
                   Game results (`echo.lobby.results`) are checked with every one of them
    game_bench     how long a game server whose tickets the players report refused stays out
                   of rotation (seconds)
    identity       checks each member's identity token (a JWT from the game's backend:
                   `echo.lobby.identity`); None: development mode, a member is who it claims
    """

    lobby: LobbyConfig = attrs.Factory(LobbyConfig)
    server_id: str = ""
    lobby_servers: tuple[str, ...] = ()
    topics: tuple[str, ...] = ()
    seat_keys: tuple[TicketKey, ...] = ()
    seat_ttl: float = 24 * 3600.0
    ticket_keys: tuple[TicketKey, ...] = ()
    ticket_ttl: float = 30.0
    hello_timeout: float = 10.0
    listings_topic: str = LISTINGS_TOPIC
    games_topic: str = GAMES_TOPIC
    results_topic: str = RESULTS_TOPIC
    game_bench: float = 60.0
    listing_ttl: float = 10.0  # how long other servers keep our listings without a refresh
    listing_interval: float = 0.25  # changed listings are published this often
    game_ttl: float = 5.0
    updates_backlog: int = 1 << 20  # bytes of replies/updates waiting for one member: cut off
    chat_backlog: int = 16 * 1024  # bytes of chat waiting for one member: lines dropped for it
    topic_k: int = 3
    identity: IdentityVerifier | None = None
    # The matchmaker (echo.lobby.queues): its rules, and how often its queues are matched
    # while tickets wait (windows widen with time); an entry also wakes it at once.
    match_rules: MatchRules = attrs.Factory(MatchRules)
    match_interval: float = 0.25


class _Conn:
    """One member's live session and its channels (None until they are open: what is sent
    to it meanwhile waits in `pending`)."""

    __slots__ = ("channels", "closing", "member_id", "pending", "queued", "secret", "session")

    def __init__(self, member_id: str, session: Session, secret: bytes = b"") -> None:
        self.member_id = member_id
        self.session = session
        self.secret = secret  # its hello's: a seat taken on this session is bound to it
        self.channels: Channels | None = None
        self.pending: list[tuple[Channel, bytes]] = []
        self.closing: str | None = None
        self.queued = False  # in LobbyServer._touched: messages queued, not yet flushed


class LobbyServer:
    """The lobby service on one `SessionServer`. ``await nursery.start(server.run)``."""

    def __init__(
        self,
        session_config: ServerConfig,
        config: LobbyServerConfig | None = None,
        *,
        events: EventSink | None = None,
        transport_config: Any = None,
        clock: Callable[[], float] = time.time,
        new_lobby_id: Callable[[], int] = random_lobby_id,
        new_join_code: Callable[[], str] = random_join_code,
    ) -> None:
        config = config or LobbyServerConfig()
        chat_line = CHAT_LINE_OVERHEAD + config.lobby.max_member_id_bytes
        if chat_line + config.lobby.max_chat_bytes > CHAT_MAX_MESSAGE:
            raise ValueError(
                f"a chat line of max_chat_bytes ({config.lobby.max_chat_bytes}) does not fit "
                f"the chat channel's {CHAT_MAX_MESSAGE} bytes"
            )
        server_id = config.server_id or f"{session_config.address}:{session_config.port}"
        lobby_servers = config.lobby_servers or (server_id,)
        if server_id not in lobby_servers:
            raise ValueError(f"the lobby-server list does not name this server ({server_id})")
        self.config = attrs.evolve(config, server_id=server_id, lobby_servers=lobby_servers)
        self.server_id = server_id
        self.session_config = session_config
        self.ring = HashRing(list(lobby_servers))
        self.events: EventSink | None = events
        seat_keys = config.seat_keys or (TicketKey(1, secrets.token_bytes(32)),)
        self.seats = TicketSeats(
            seat_keys[0],
            ttl=config.seat_ttl,
            clock=clock,
            retired={k.key_id: k.secret for k in seat_keys[1:]},
        )
        self.games = GameServerDirectory(ttl=config.game_ttl, bench_time=config.game_bench)
        self._result_keys = {k.key_id: k.secret for k in config.ticket_keys}
        tickets = (
            TicketIssuer(config.ticket_keys[0], ttl=config.ticket_ttl, clock=clock)
            if config.ticket_keys
            else None
        )
        self.board = ListingBoard(server_id, ttl=config.listing_ttl)
        self._new_lobby_id = new_lobby_id
        self._new_join_code = new_join_code
        self.registry = LobbyRegistry(
            config.lobby,
            new_lobby_id=self._home_lobby_id,
            new_join_code=self._home_join_code,
            seats=self.seats,
            games=self.games,
            tickets=tickets,
            server_id=server_id,
            board=self.board,
        )
        self.queues = QueueDesk(self.registry, rules=config.match_rules, seats=self.seats)
        self._wake_match = trio.Event()
        self.sessions = SessionServer(
            session_config,
            self._app,
            events=events,
            # A lobby's idle cadence, unless the caller brings its own (echo.lobby.timers).
            transport_config=transport_config or lobby_server_timers(),
        )
        self.conns: dict[str, _Conn] = {}
        self.bindings = SeatBindings()
        self.counters: Counter[str] = Counter()
        #: identity tokens refused, by reason (`echo.lobby.identity.REASONS`)
        self.auth_refusals: Counter[str] = Counter()
        self._clock = clock
        join = Histogram(
            "echo_lobby_join_duration_seconds",
            "Time the server took to handle a join (by id, by code, quick): decide, and queue "
            "the reply and the updates to every member",
            buckets=LATENCY_BUCKETS,
            registry=None,
        )
        search = Histogram(
            "echo_lobby_search_duration_seconds",
            "Time the server took to handle a search, listings of other servers included",
            buckets=LATENCY_BUCKETS,
            registry=None,
        )
        #: request type -> the histogram of its handling times (echo.ops.metrics exports them)
        self.latency: dict[type[Request], Histogram] = {
            JoinLobby: join,
            JoinByCode: join,
            QuickJoin: join,
            SearchLobbies: search,
        }
        self.topic_client: Any = None
        self._wake_expiry = trio.Event()
        #: channels with messages queued by `_send_to` that `_flush` has not sent yet
        self._touched: list[_Conn] = []
        self._holding = False  # deliveries are queued, and flushed together at its end
        self._listings_dirty = False
        self._nursery: trio.Nursery | None = None
        #: draining (echo.lobby.drain): requests are left to the ring's next server
        self.handing_off = False

    # ------------------------------------------------------------------ ids that land here

    def _home_lobby_id(self) -> int:
        """A fresh id whose home on the ring is this server (about N tries for N servers)."""
        if len(self.config.lobby_servers) == 1:
            return self._new_lobby_id()
        for _ in range(64 * len(self.config.lobby_servers)):
            lobby_id = self._new_lobby_id()
            if 0 < lobby_id < 2**64 and home_of(self.ring, lobby_id).home == self.server_id:
                return lobby_id
        return self._new_lobby_id()  # pragma: no cover - astronomically unlikely

    def _home_join_code(self) -> str:
        """A code whose home is this server, so a member finds the lobby from the code."""
        if len(self.config.lobby_servers) == 1:
            return self._new_join_code()
        for _ in range(64 * len(self.config.lobby_servers)):
            code = self._new_join_code()
            if code_home(self.ring, code) == self.server_id:
                return code
        return self._new_join_code()  # pragma: no cover

    # ------------------------------------------------------------------ life cycle

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self.sessions.run)
            nursery.start_soon(self._expiry_loop)
            nursery.start_soon(self._renew_resume_tokens)
            nursery.start_soon(self._match_loop)
            if self.config.topics:
                await nursery.start(self._topics_loop)
            self._emit(
                "lobby_server_started",
                address=self.session_config.address,
                port=self.session_config.port,
                control_port=self.session_config.control_port,
            )
            log.info(
                "lobby_server_listening",
                server_id=self.server_id,
                port=self.session_config.port,
                lobby_servers=len(self.config.lobby_servers),
                topics=len(self.config.topics),
                identities="development mode" if self.config.identity is None else "verified",
            )
            if self.config.identity is None:
                log.warning(
                    "lobby_development_mode",
                    detail="no --auth-key: member ids are not verified, a member is whoever "
                    "it claims to be; do not expose this server to the internet",
                )
            task_status.started(self)

    async def stop(self, reason: str = "signal") -> None:
        """Withdraw our listings, say goodbye to every member, stop."""
        if self.topic_client is not None:
            for listing in self.registry.listings():
                self._publish_gone(listing.lobby_id)
        self._emit("lobby_server_stopped", reason=reason, lobbies_open=len(self.registry))
        await self.sessions.stop(reason)

    def _emit(self, event: str, **fields: Any) -> None:
        if self.events is not None:
            self.events.emit(event, **fields)

    # ------------------------------------------------------------------ one member's session

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

    def _send_resume_token(self, member_id: str) -> None:
        """Queue the member's resume token, for its session's secret and its seat here (none
        without a secret, a seat, or a grace period: the token would take nothing back)."""
        conn = self.conns.get(member_id)
        lobby_id = self.registry.lobby_of(member_id)
        grace = self.config.lobby.reconnect_grace
        if conn is None or not conn.secret or lobby_id is None or grace <= 0:
            return
        expires = self.seats.clock() + token_ttl(grace)
        try:
            token = issue_resume_token(self.seats.key, lobby_id, member_id, conn.secret, expires)
        except ResumeTokenError:  # pragma: no cover - a secret the hello parser let through
            return
        self._send_to(member_id, Channel.UPDATES, encode(ResumeToken(lobby_id, token)))

    async def _renew_resume_tokens(self) -> None:
        """Every grace period, a new token to each seated member: a token lives two, so the
        one a process holds when it dies outlives its seat's grace period (`token_ttl`)."""
        grace = self.config.lobby.reconnect_grace
        if grace <= 0:
            return
        while True:
            await trio.sleep(grace)
            for member_id in list(self.conns):
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

    # ------------------------------------------------------------------ requests

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

    # ------------------------------------------------------------------ timers

    async def _expiry_loop(self) -> None:
        while True:
            deadline = self.registry.next_deadline()
            self._wake_expiry = trio.Event()
            with trio.move_on_at(deadline if deadline is not None else math.inf):
                await self._wake_expiry.wait()
            now = trio.current_time()
            if deadline is not None and now >= deadline:
                self._deliver(self.registry.expire(now))

    async def _match_loop(self) -> None:
        """Match the queues when an entry arrives, and every `match_interval` while any
        wait (their windows widen with time); seat each match (`QueueDesk.tick`)."""
        while True:
            wait = self.config.match_interval if len(self.queues) else math.inf
            with trio.move_on_after(wait):
                await self._wake_match.wait()
            self._wake_match = trio.Event()
            seated, sends = self.queues.tick(trio.current_time())
            for done in seated:
                self._note_match(done)
            self._deliver(sends)

    def _note_match(self, done: Seated) -> None:
        """Bind each seat to its session; the events of a lobby created and joined (as for
        any lobby: the event log's lobbies stay whole), then `lobby_matched`."""
        members = done.match.members
        self._emit("lobby_created", lobby_id=done.lobby_id, member_id=members[0],
                   max_members=len(members), visibility="private")
        for count, member_id in enumerate(members, 1):
            conn = self.conns.get(member_id)
            secret = b"" if conn is None else conn.secret
            self.bindings.bind(member_id, done.lobby_id, secret)
            self._emit("lobby_joined", lobby_id=done.lobby_id, member_id=member_id, members=count)
        self._emit("lobby_matched", lobby_id=done.lobby_id, members=len(members),
                   tickets=len(done.match.tickets), started=int(done.started))
        if done.started:
            self._emit("lobby_started", lobby_id=done.lobby_id, members=len(members),
                       game_server=done.game_server)

    # ------------------------------------------------------------------ topics

    async def _topics_loop(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        from echo.topics import ClientConfig, open_topic_client

        config = self.config
        k = max(1, min(config.topic_k, len(config.topics)))
        client_config = ClientConfig(k=k, max_datagram=8192)
        async with open_topic_client(list(config.topics), client_config) as client:
            self.topic_client = client
            client.subscribe(config.listings_topic, config.games_topic, config.results_topic)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._publish_listings)
                task_status.started()
                async for message in client.messages():
                    self._on_topic(message.topic.decode("utf-8", "replace"), message.data)

    def _on_topic(self, topic: str, data: bytes) -> None:
        now = trio.current_time()
        try:
            if topic == self.config.listings_topic:
                self.board.apply(parse_listing_record_untrusted(data), now)
            elif topic == self.config.games_topic:
                self.games.announce(parse_announcement_untrusted(data), now)
            elif topic == self.config.results_topic:
                self._on_result(data)
        except LobbyProtocolError:
            self.counters["bad_topic_records"] += 1

    def _on_result(self, data: bytes) -> None:
        """A game server's result: believed only under one of our ticket keys."""
        verdict = verify_result(data, self._result_keys)
        if isinstance(verdict, str):
            self.counters["game_results_refused"] += 1
            self._emit("game_result_refused", reason=verdict)
            log.info("game_result_refused", reason=verdict)
            return
        outcome, sends = self.registry.game_result(
            verdict.lobby_id, verdict.match_id, verdict.server_id, verdict.result
        )
        if outcome == "ended":
            self._emit(
                "game_ended",
                lobby_id=verdict.lobby_id,
                match_id=verdict.match_id,
                game_server=verdict.server_id,
            )
            self._deliver(sends)

    def _publish(self, record: Any) -> None:
        try:
            self.topic_client.publish(self.config.listings_topic, encode_listing_record(record))
            self.counters["listings_published"] += 1
        except (LobbyProtocolError, ValueError):
            self.counters["listings_unpublishable"] += 1

    def _publish_gone(self, lobby_id: int) -> None:
        from echo.lobby.listings import ListingGone

        self._publish(ListingGone(lobby_id, self.server_id))

    async def _publish_listings(self) -> None:
        """Changes as they happen (every `listing_interval`), everything every ttl/3: soft
        state that a restarted or new server learns within one refresh."""
        config = self.config
        refresh_every = config.listing_ttl / 3
        next_refresh = trio.current_time()
        while True:
            now = trio.current_time()
            if self._listings_dirty or now >= next_refresh:
                self._listings_dirty = False
                changed, gone = self.registry.listing_changes()
                if now >= next_refresh:
                    changed = self.registry.listings()
                    next_refresh = now + refresh_every
                for record in [*changed, *gone]:
                    self._publish(record)
            self.board.expire(now)
            await trio.sleep(config.listing_interval)


async def announce_game_server(
    topic_client: Any,
    announcement: Callable[[], GameServerAnnouncement],
    *,
    topic: str = GAMES_TOPIC,
    interval: float = 1.0,
) -> None:
    """A game server's side of the games topic: announce itself and its free slots every
    `interval` seconds (soft state: lobby servers forget it `game_ttl` after the last one).

    `topic_client`: an open `echo.topics` client (`open_topic_client(["host:port"])`);
    `announcement`: a function returning the `GameServerAnnouncement` to publish, asked each
    time, so the free slots can follow the server's load; `topic`: the lobby servers' games
    topic (`LobbyServerConfig.games_topic`). Runs until cancelled. For example::

        def announcement() -> GameServerAnnouncement:
            return GameServerAnnouncement(
                server_id="10.0.0.5:9100",       # what this server's tickets must name
                address="10.0.0.5:9100",         # its data port, where players connect
                free_slots=64 - len(server.duologues),
                control_port=9101,
                duologue_ports="shared",         # its ServerConfig.duologue_ports
                tags={"region": "eu", "mode": "ctf", "version": "3"},
            )

        nursery.start_soon(announce_game_server, topics, announcement)
    """
    while True:
        topic_client.publish(topic, encode_announcement(announcement()))
        await trio.sleep(interval)


async def report_game_result(
    topic_client: Any,
    key: TicketKey,
    result: GameResult,
    *,
    topic: str = RESULTS_TOPIC,
    repeats: int = 5,
    interval: float = 0.2,
) -> None:
    """A game server's side of the results topic: publish `result`, signed with `key` (the
    first key of its ticket key file), `repeats` times `interval` apart: topic records are
    datagrams, and the lobby applies a result once and ignores its repeats. Raises
    `echo.lobby.results.ResultError` for a result that does not fit."""
    record = sign_result(key, result)
    for i in range(repeats):
        if i:
            await trio.sleep(interval)
        topic_client.publish(topic, record)


_GONE = (ChannelsClosed, SessionError, trio.ClosedResourceError, trio.BrokenResourceError)


async def _quietly(fn: Callable[..., Awaitable[None]], *args: Any) -> None:
    """Run a task of one member's session; the session going away ends it, nothing more."""
    try:
        await fn(*args)
    except _GONE:
        pass


def _same_client(conn: _Conn, hello: Hello) -> bool:
    """Is `hello` from the client of `conn` (both carry the same secret)?"""
    return bool(hello.secret) and hmac.compare_digest(conn.secret, hello.secret)


def code_home(ring: HashRing, code: str) -> str:
    """The lobby server a join code was made on (codes are chosen to land on their server)."""
    return ring.servers_for(f"code:{code}", 1)[0]


def code_walk(ring: HashRing, code: str, n: int) -> list[str]:
    return ring.servers_for(f"code:{code}", n)
