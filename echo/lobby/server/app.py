"""`LobbyServer`: the lobby service on one `SessionServer`; its construction, the ids and
codes it makes (landing on itself on the ring), its start and stop.

Driver: trio, sessions and the clock.
"""

from __future__ import annotations

import secrets
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import attrs
import structlog
import trio
from prometheus_client import Histogram

from echo.lobby.due import DueQueue
from echo.lobby.games import (
    GameServerDirectory,
)
from echo.lobby.hello import (
    SeatBindings,
)
from echo.lobby.home import home_of
from echo.lobby.listings import (
    ListingBoard,
)
from echo.lobby.protocol import (
    JoinByCode,
    JoinLobby,
    QuickJoin,
    Request,
    SearchLobbies,
)
from echo.lobby.queues import QueueDesk
from echo.lobby.server.base import (
    _Conn,
)
from echo.lobby.server.config import (
    CHAT_LINE_OVERHEAD,
    CHAT_MAX_MESSAGE,
    LATENCY_BUCKETS,
    LobbyServerConfig,
    code_home,
)
from echo.lobby.server.replication import (
    _Replication,
)
from echo.lobby.state import LobbyRegistry, random_join_code, random_lobby_id
from echo.lobby.timers import lobby_server_timers
from echo.session import ServerConfig, SessionServer
from echo.session.server import EventSink
from echo.tickets import TicketIssuer, TicketKey, TicketSeats
from echo.topics.ring import HashRing

log = structlog.get_logger("echo.lobby")


class LobbyServer(_Replication):
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
        _check_chat_fits(config)
        server_id = config.server_id or f"{session_config.address}:{session_config.port}"
        lobby_servers = config.lobby_servers or (server_id,)
        if server_id not in lobby_servers:
            raise ValueError(f"the lobby-server list does not name this server ({server_id})")
        self.config = attrs.evolve(config, server_id=server_id, lobby_servers=lobby_servers)
        self.server_id = server_id
        self.session_config = session_config
        self.ring = HashRing(list(lobby_servers))
        self.events: EventSink | None = events
        self.seats = _seat_signer(config, clock)
        self.games = GameServerDirectory(ttl=config.game_ttl, bench_time=config.game_bench)
        self._result_keys = {k.key_id: k.secret for k in config.ticket_keys}
        self.board = ListingBoard(server_id, ttl=config.listing_ttl)
        self._new_lobby_id = new_lobby_id
        self._new_join_code = new_join_code
        self.registry = self._new_registry(clock)
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
        #: request type -> the histogram of its handling times (echo.ops.metrics exports them)
        self.latency: dict[type[Request], Histogram] = _latency_histograms()
        self.topic_client: Any = None
        self._wake_expiry = trio.Event()
        #: when each seated member's resume token is next renewed (`_renew_resume_tokens`):
        #: a grace period after its last, each member on its own schedule, not all at once (the
        #: tokens of 8,000 members made in one step held all other traffic for ~0.2 s)
        self.renewals: DueQueue[str] = DueQueue()
        self._wake_renewals = trio.Event()
        #: the message last encoded for members, with its bytes (`echo.lobby.web` reuses it)
        self.encoded: tuple[bytes, Any] | None = None
        #: channels with messages queued by `_send_to` that `_flush` has not sent yet
        self._touched: list[_Conn] = []
        self._holding = False  # deliveries are queued, and flushed together at its end
        self._listings_dirty = False
        self._nursery: trio.Nursery | None = None
        #: draining (echo.lobby.drain): requests are left to the ring's next server
        self.handing_off = False

    def _new_registry(self, clock: Callable[[], float]) -> LobbyRegistry:
        """The registry of this server's lobbies: its ids and codes land here, its seats are
        signed with the seat keys, and with ticket keys it starts games."""
        config = self.config
        tickets = (
            TicketIssuer(
                config.ticket_keys[0],
                ttl=config.ticket_ttl,
                clock=clock,
                retired={k.key_id: k.secret for k in config.ticket_keys[1:]},
            )
            if config.ticket_keys
            else None
        )
        return LobbyRegistry(
            config.lobby,
            new_lobby_id=self._home_lobby_id,
            new_join_code=self._home_join_code,
            seats=self.seats,
            games=self.games,
            tickets=tickets,
            server_id=self.server_id,
            board=self.board,
        )

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


def _check_chat_fits(config: LobbyServerConfig) -> None:
    """ValueError if the longest chat line the limits allow does not fit the chat channel."""
    chat_line = CHAT_LINE_OVERHEAD + config.lobby.max_member_id_bytes
    if chat_line + config.lobby.max_chat_bytes > CHAT_MAX_MESSAGE:
        raise ValueError(
            f"a chat line of max_chat_bytes ({config.lobby.max_chat_bytes}) does not fit "
            f"the chat channel's {CHAT_MAX_MESSAGE} bytes"
        )


def _seat_signer(config: LobbyServerConfig, clock: Callable[[], float]) -> TicketSeats:
    """The seats' signer: the first seat key signs, the others are retired (still checked);
    without keys, a random one of this process."""
    seat_keys = config.seat_keys or (TicketKey(1, secrets.token_bytes(32)),)
    return TicketSeats(
        seat_keys[0],
        ttl=config.seat_ttl,
        clock=clock,
        retired={k.key_id: k.secret for k in seat_keys[1:]},
    )


def _latency_histograms() -> dict[type[Request], Histogram]:
    """The request-latency histograms, by request type (the joins share one)."""
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
    return {JoinLobby: join, JoinByCode: join, QuickJoin: join, SearchLobbies: search}
