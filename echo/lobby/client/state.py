"""The lobby client's fields, its one session to a server (`_Link`), its state as a game
reads it, its events and the waits on its state.

Driver: trio, sessions and the clock.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import trio

from echo.channels.api import Channels
from echo.lobby import client_queue
from echo.lobby.client.events import (
    Event,
)
from echo.lobby.client.helpers import (
    _token_bytes,
)
from echo.lobby.protocol import (
    Reply,
)
from echo.lobby.replica import LobbyReplica
from echo.session.crypto import Pin
from echo.topics.ring import HashRing


class _Link:
    """One session to one lobby server, with its channels."""

    def __init__(self, server: str) -> None:
        self.server = server
        self.resume = b""  # a resume token for the hello (a new process taking its seat back)
        self.channels: Channels | None = None
        self.closed = trio.Event()
        self.close_reason = ""
        self.dropped = False  # ended without our asking
        self.wanted_close = False
        self.cancel_scope = trio.CancelScope()
        self.session: Any = None


class _Base:
    """The client's fields (`LobbyClient.__init__` sets them), its state as a game reads it,
    its events, and the waits on its state. Each module of this package adds one concern on
    top of the one below: `links`, `requests`, `rehome`, then `api` (`LobbyClient`)."""

    servers: list[str]
    _pins: dict[str, Pin | None]
    ring: HashRing
    member: str
    secret: bytes
    _identity_token: bytes
    timeout: float
    connect_timeout: float
    auto_reconnect: bool
    _nursery: trio.Nursery
    _transport: Any
    _link: _Link | None
    _request_ids: Iterator[int]
    _pending: dict[int, trio.MemoryReceiveChannel[Reply]]
    _pending_send: dict[int, trio.MemorySendChannel[Reply]]
    _events_in: trio.MemorySendChannel[Event]
    _events_out: trio.MemoryReceiveChannel[Event]
    events_dropped: int
    replica: LobbyReplica | None
    _seats: dict[int, bytes]
    resume_token: bytes | None
    _changed: trio.Event
    dead: set[str]
    _lock: trio.Lock
    _recovering: bool
    waiting: client_queue.Waiting | None

    # ------------------------------------------------------------------ state

    @property
    def identity_token(self) -> bytes:
        """Sent in every hello (a lobby with --auth-key checks it on every new session, the
        reconnections included): replace it with a fresh one before it expires."""
        return self._identity_token

    @identity_token.setter
    def identity_token(self, token: str | bytes | None) -> None:
        self._identity_token = _token_bytes(token)

    @property
    def server(self) -> str | None:
        """The lobby server this member is talking to."""
        return None if self._link is None else self._link.server

    @property
    def lobby_id(self) -> int | None:
        return None if self.replica is None else self.replica.lobby_id

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._iterate()

    def events(self) -> AsyncIterator[Event]:
        """Everything the server sends (updates, chat, game starts) and what the client does
        on its own (`Rehomed`, `Reconnected`, `Left`), in arrival order."""
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Event]:
        async for event in self._events_out:
            yield event

    async def next_event(self, kind: type | tuple[type, ...] = object) -> Any:
        """The next event of `kind` (others before it are skipped)."""
        while True:
            event = await self._events_out.receive()
            if isinstance(event, kind):
                return event

    async def wait_until(self, predicate: Any, timeout: float | None = None) -> None:
        """Until predicate(self) holds (checked after every message)."""
        with trio.fail_after(timeout if timeout is not None else self.timeout):
            while not predicate(self):
                changed = self._changed
                await changed.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _recover(self, link: _Link) -> None:
        """After `link` dropped: back to a server (`echo.lobby.client.rehome` has it)."""
        raise NotImplementedError

    async def _resync(self, lobby_id: int) -> None:
        """Ask for the lobby's whole state again (`echo.lobby.client.rehome` has it)."""
        raise NotImplementedError

    def _event(self, event: Event) -> None:
        try:
            self._events_in.send_nowait(event)
        except trio.WouldBlock:
            self.events_dropped += 1
        except trio.ClosedResourceError:
            pass  # the client is closing
