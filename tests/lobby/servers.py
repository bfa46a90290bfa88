"""Lobby servers, topic servers and game servers on loopback for the networked lobby tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

import echo.session as es
from echo.lobby.limits import LobbyConfig, RateLimit
from echo.lobby.server import LobbyServer, LobbyServerConfig
from echo.lobby.timers import lobby_server_timers
from echo.tickets import TicketKey
from echo.topics import ServerConfig as TopicServerConfig
from echo.topics import TopicServer
from tests.ports import free_base

FAST = RateLimit(rate=1000.0, burst=1000)
LOBBY = LobbyConfig(
    indexed_keys=frozenset({"mode", "skill"}),
    create_limit=FAST,
    update_limit=FAST,
    search_limit=FAST,
    join_limit=FAST,
    reconnect_grace=20.0,
)
SEAT_KEY = TicketKey(1, b"s" * 32)
GAME_KEY = TicketKey(7, b"g" * 32)


def session_config(max_clients: int = 24) -> es.ServerConfig:
    base = free_base(2 + 2 * max_clients)
    return es.ServerConfig(
        port=base,
        control_port=base + 1,
        clients_base_port=base + 2,
        max_clients=max_clients,
        max_per_ip=max_clients,
        duologue_expiry=5.0,
    )


def name_of(config: es.ServerConfig) -> str:
    return f"{config.address}:{config.port}"


@attrs.define
class Cluster:
    lobby: list[LobbyServer]
    topics: list[TopicServer]
    nursery: trio.Nursery
    scopes: list[trio.CancelScope] = attrs.Factory(list)

    def kill(self, server: LobbyServer) -> None:
        """Stop a lobby server dead: no goodbyes, its sockets just close."""
        self.scopes[self.lobby.index(server)].cancel()

    async def restart(self, server: LobbyServer) -> LobbyServer:
        """Kill `server` and start a fresh process-alike on the same ports: it remembers
        nothing (the same seat key, as servers of one deployment share it)."""
        i = self.lobby.index(server)
        self.scopes[i].cancel()
        with trio.fail_after(10):
            await server.sessions.stopped.wait()
        fresh = LobbyServer(
            server.session_config, server.config, transport_config=server.sessions.transport_config
        )
        scope = trio.CancelScope()
        await self.nursery.start(_run_in, scope, fresh)
        self.lobby[i], self.scopes[i] = fresh, scope
        return fresh

    def by_name(self, name: str) -> LobbyServer:
        return next(s for s in self.lobby if s.server_id == name)

    @property
    def names(self) -> list[str]:
        return [s.server_id for s in self.lobby]

    @property
    def topic_names(self) -> list[str]:
        return [f"{t.bound[0]}:{t.bound[1]}" for t in self.topics if t.bound]


@asynccontextmanager
async def cluster(
    n: int = 1,
    *,
    topics: int = 0,
    lobby: LobbyConfig = LOBBY,
    ticket_keys: tuple[TicketKey, ...] = (),
    events: list[Any] | None = None,
    liveness: float | None = None,
    key: es.ServerKey | None = None,
    encryption: str | None = None,
    **options: Any,
) -> AsyncIterator[Cluster]:
    """`n` lobby servers sharing a ring and a seat key (and `topics` topic servers); with
    `key`, the ring's one session key (and `encryption`, the mode)."""
    async with trio.open_nursery() as nursery:
        topic_servers = []
        for _ in range(topics):
            server = TopicServer(TopicServerConfig(lifetime=3.0), port=0)
            await nursery.start(server.run)
            topic_servers.append(server)
        topic_names = tuple(f"{t.bound[0]}:{t.bound[1]}" for t in topic_servers if t.bound)
        configs = [
            attrs.evolve(session_config(), key=key, encryption=encryption) for _ in range(n)
        ]
        names = tuple(name_of(c) for c in configs)
        servers = []
        scopes: list[trio.CancelScope] = []
        transport = (
            None if liveness is None else lobby_server_timers(image_liveness_timeout=liveness)
        )
        for config in configs:
            server = LobbyServer(
                config,
                LobbyServerConfig(
                    lobby=lobby,
                    lobby_servers=names,
                    topics=topic_names,
                    seat_keys=(SEAT_KEY,),
                    ticket_keys=ticket_keys,
                    listing_ttl=3.0,
                    listing_interval=0.05,
                    **options,
                ),
                events=_Recorder(events) if events is not None else None,
                transport_config=transport,
            )
            scope = trio.CancelScope()
            await nursery.start(_run_in, scope, server)
            scopes.append(scope)
            servers.append(server)
        try:
            yield Cluster(servers, topic_servers, nursery, scopes)
        finally:
            nursery.cancel_scope.cancel()


async def _run_in(scope: trio.CancelScope, server: LobbyServer, *, task_status: Any) -> None:
    server.sessions.stopped = trio.Event()  # type: ignore[attr-defined]
    try:
        with scope:
            await server.run(task_status=task_status)
    finally:
        server.sessions.stopped.set()  # type: ignore[attr-defined]


class _Recorder:
    def __init__(self, into: list[Any]) -> None:
        self.into = into

    def emit(self, event: str, **fields: Any) -> None:
        self.into.append((event, fields))


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll a condition of server state (the registry has no change event to await)."""
    with trio.fail_after(timeout):
        while not predicate():  # noqa: ASYNC110
            await trio.sleep(0.01)
