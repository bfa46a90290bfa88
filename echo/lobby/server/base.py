"""The lobby server's fields, one member's connection (`_Conn`), the helpers of a member's
session tasks, and the server's event log.

Driver: trio, sessions and the clock.
"""

from __future__ import annotations

import hmac
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import trio
from prometheus_client import Histogram

from echo.channels import ChannelsClosed
from echo.channels.api import Channels
from echo.lobby.due import DueQueue
from echo.lobby.games import (
    GameServerDirectory,
)
from echo.lobby.hello import (
    Hello,
    SeatBindings,
)
from echo.lobby.listings import (
    ListingBoard,
)
from echo.lobby.protocol import (
    Channel,
    Request,
)
from echo.lobby.queues import QueueDesk
from echo.lobby.server.config import (
    LobbyServerConfig,
)
from echo.lobby.state import LobbyRegistry
from echo.session import ServerConfig, Session, SessionError, SessionServer
from echo.session.server import EventSink
from echo.tickets import TicketSeats
from echo.topics.ring import HashRing


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


class _Base:
    """The server's fields (`LobbyServer.__init__` sets them) and its event log. Each module
    of this package adds one concern on top of the one below: `routing`, `sessions`,
    `replication`, then `app` (`LobbyServer`)."""

    config: LobbyServerConfig
    server_id: str
    session_config: ServerConfig
    ring: HashRing
    events: EventSink | None
    seats: TicketSeats
    games: GameServerDirectory
    _result_keys: dict[int, bytes]
    board: ListingBoard
    _new_lobby_id: Callable[[], int]
    _new_join_code: Callable[[], str]
    registry: LobbyRegistry
    queues: QueueDesk
    _wake_match: trio.Event
    sessions: SessionServer
    conns: dict[str, _Conn]
    bindings: SeatBindings
    counters: Counter[str]
    auth_refusals: Counter[str]
    _clock: Callable[[], float]
    latency: dict[type[Request], Histogram]
    topic_client: Any
    _wake_expiry: trio.Event
    renewals: DueQueue[str]
    #: the message last encoded for members, with its bytes (the bytes are sent, not kept)
    encoded: tuple[bytes, Any] | None
    _wake_renewals: trio.Event
    _touched: list[_Conn]
    _holding: bool
    _listings_dirty: bool
    _nursery: trio.Nursery | None
    handing_off: bool

    def _emit(self, event: str, **fields: Any) -> None:
        if self.events is not None:
            self.events.emit(event, **fields)
