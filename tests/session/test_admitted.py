"""What an `admit` hook returns reaches the application: `Admitted(claims)` becomes the
session's `admission`; None admits without claims; a string refuses (real loopback sockets)."""

from __future__ import annotations

import pytest
import trio

import echo.session as es
from tests.server.test_server import free_base, server_config


@pytest.mark.parametrize("asynchronous", [False, True], ids=["plain", "coroutine"])
async def test_the_hook_s_claims_are_the_session_s_admission(asynchronous: bool) -> None:
    def decide(credentials: bytes) -> es.Admitted | str | None:
        if credentials == b"anonymous":
            return None
        if credentials.startswith(b"player:"):
            return es.Admitted({"player": credentials[7:].decode()})
        return "who are you?"

    def admit(peer: tuple[str, int], credentials: bytes) -> es.Admitted | str | None:
        return decide(credentials)

    async def admit_later(peer: tuple[str, int], credentials: bytes) -> es.Admitted | str | None:
        await trio.lowlevel.checkpoint()
        return decide(credentials)

    async def app(session: es.Session) -> None:
        await session.send(repr(session.admission).encode())
        await session.receive()

    config = server_config(free_base(12))
    async with trio.open_nursery() as nursery:
        hook = admit_later if asynchronous else admit
        server = await nursery.start(es.SessionServer(config, app, admit=hook).run)

        async def seen_by_app(credentials: bytes) -> bytes:
            async with es.connect(
                config.address, config.port, config.control_port, credentials=credentials
            ) as session:
                return await session.receive()

        assert await seen_by_app(b"player:alice") == b"{'player': 'alice'}"
        assert await seen_by_app(b"player:bob") == b"{'player': 'bob'}"
        assert await seen_by_app(b"anonymous") == b"None"
        with pytest.raises(es.Rejected) as refused:
            await seen_by_app(b"nobody")
        assert refused.value.reason == "who are you?"
        await server.stop()
