"""`connect`: a member's lobby client in an ``async with`` block, over its own transport (or
a shared one), closed without leaving the lobby.

Driver: trio, sessions and the clock.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import trio

from echo.lobby.client.api import (
    LobbyClient,
)
from echo.lobby.client.helpers import (
    CONNECT_TIMEOUT,
    member_of,
)
from echo.lobby.keys import RingKeys, ring_pins
from echo.lobby.timers import CLIENT_LIVENESS, lobby_client_timers
from echo.transport import TransportConfig


@contextlib.asynccontextmanager
async def connect(
    servers: Sequence[str],
    *,
    member: str | None = None,
    identity_token: str | bytes | None = None,
    timeout: float = 10.0,
    reconnect: bool = True,
    transport: Any = None,
    transport_config: TransportConfig | None = None,
    connect_now: bool = True,
    connect_timeout: float = CONNECT_TIMEOUT,
    liveness: float = CLIENT_LIVENESS,
    resume_token: bytes | None = None,
    server_key: RingKeys = None,
) -> AsyncIterator[LobbyClient]:
    """A member's lobby client over `servers` (``host:port`` of every lobby server, the same
    list on every member: it is the ring). Leaving the block closes the session without
    leaving the lobby: the seat is kept for the server's grace period.

    `connect_timeout` bounds each handshake with a server before the next one is tried;
    `liveness` is how long a silent server is trusted before the member moves on (its own
    transport's image liveness: `transport_config` or a shared `transport` set theirs).

    `resume_token`: a previous process's `LobbyClient.resume_token` (it crashed or was
    killed): the block starts back in that seat (`LobbyClient.resume`; `ResumeRefused` if the
    server will not give it back).

    `identity_token`: the member's token from the game's backend, for a lobby that verifies
    identities (``echo-lobby --auth-key``; one without ignores it). Its ``sub`` is the member
    id: `member` may then be left out, and if given must be the same. A token the lobby
    refuses raises `AuthRefused` (a `LobbyUnavailable`) with the reason.

    `server_key`: encrypt the sessions to the lobby servers, pinning this key (the ring's one
    key, as ``echo-lobby --key`` prints it) or these keys (``{"host:port": key}`` for every
    server of the list); see `echo.lobby.keys`. A server that does not prove its key is not
    used (never a fallback to the clear). BadPin or ValueError at once for a bad value."""
    member = member_of(member, identity_token)
    ring_pins(servers, server_key)  # a bad key is the caller's error, before any session
    try:
        async with _client(
            servers, member, timeout, reconnect, transport, transport_config, connect_now,
            connect_timeout, liveness, identity_token, resume_token, server_key,
        ) as client:  # fmt: skip
            yield client
    except BaseExceptionGroup as group:
        # Our nurseries wrap whatever crosses them; the caller should see LobbyUnavailable
        # (or its own exception) itself.
        sole = _sole(group)
        if sole is None:
            raise
        raise sole from None


def _sole(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    found: BaseException = group
    while isinstance(found, BaseExceptionGroup):
        if len(found.exceptions) != 1:
            return None
        found = found.exceptions[0]
    return None if isinstance(found, trio.Cancelled) else found


@contextlib.asynccontextmanager
async def _client(
    servers: Sequence[str],
    member: str,
    timeout: float,
    reconnect: bool,
    transport: Any,
    transport_config: TransportConfig | None,
    connect_now: bool,
    connect_timeout: float,
    liveness: float,
    identity_token: str | bytes | None,
    resume_token: bytes | None = None,
    server_key: RingKeys = None,
) -> AsyncIterator[LobbyClient]:
    from echo.session.client import client_transport_config
    from echo.transport import open_transport

    async with contextlib.AsyncExitStack() as stack:
        if transport is None:
            config = transport_config or lobby_client_timers(liveness=liveness)
            transport = await stack.enter_async_context(
                open_transport(client_transport_config(config))
            )
        nursery = await stack.enter_async_context(trio.open_nursery())
        client = LobbyClient(
            servers,
            member,
            nursery,
            transport,
            timeout=timeout,
            reconnect=reconnect,
            connect_timeout=connect_timeout,
            identity_token=identity_token,
            server_key=server_key,
        )
        try:
            if resume_token is not None:
                await client.resume(resume_token)
            elif connect_now:
                await client.connect()
            yield client
        finally:
            client.auto_reconnect = False
            client._events_in.close()  # an `async for` over the events ends
            with trio.CancelScope(shield=True):
                with trio.move_on_after(2):
                    await client._close_link()
            nursery.cancel_scope.cancel()
