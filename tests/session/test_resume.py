"""Resume on loopback: the same session across a RESUME, refused forgeries and replays.

The real path change (a NAT mapping that moves mid-session) is tests/netlab/test_resume_nat.py;
here the client asks for the move itself (`session.resume()`), which runs the same RESUME.
"""

from __future__ import annotations

from typing import Any

import trio

import echo.session as es
from echo.protocol import ECHO_STREAM_ID, AllClientsError, Hello, format_message
from echo.session.resume import (
    ERROR_RESUME_REFUSED,
    Resume,
    format_resume,
    parse_server_reply_untrusted,
    resume_proof,
)
from echo.transport import Transport, open_transport
from tests.server.test_server import free_base, server_config
from tests.session.test_sessions import connect, idle, started


class Counter:
    """Answers `n` with `n` and remembers every Session it was given and what it read."""

    def __init__(self) -> None:
        self.sessions: list[es.Session] = []
        self.received: list[bytes] = []

    async def __call__(self, session: es.Session) -> None:
        self.sessions.append(session)
        async for data in session:
            self.received.append(data)
            await session.send(b"got " + data)


async def _all_clients(transport: Transport, config: es.ServerConfig) -> tuple[Any, Any]:
    sub = await transport.add_subscription(
        f"aeron:udp?control=127.0.0.1:{config.control_port}|control-mode=dynamic", ECHO_STREAM_ID
    )
    pub = await transport.add_publication(
        f"aeron:udp?endpoint=127.0.0.1:{config.port}", ECHO_STREAM_ID
    )
    await pub.wait_connected(timeout=5)
    with trio.fail_after(5):
        while not sub.images:
            await sub.wait_activity()
    return pub, sub


async def _ask(pub: Any, sub: Any, data: bytes) -> Any:
    """Send `data` on the all-clients channel and return the server's reply to us, parsed."""
    await pub.send(data)
    prefix = f"{pub.session_id} ".encode()
    with trio.fail_after(5):
        async for message in sub:
            if message.data.startswith(prefix):
                return parse_server_reply_untrusted(message.data)
    raise AssertionError("no reply")


async def test_a_resumed_session_is_the_same_session_and_loses_nothing() -> None:
    config = server_config(free_base(12))
    app = Counter()
    async with trio.open_nursery() as nursery:
        server = await started(nursery, config, app)
        async with connect(config) as session:
            assert session.resumable
            for i in range(5):
                await session.send(b"%d" % i)
                assert await session.receive() == b"got %d" % i
            await session.resume()
            # Messages sent right after the resume, several in flight at once.
            for i in range(5, 15):
                await session.send(b"%d" % i)
            replies = [await session.receive() for _ in range(5, 15)]
            assert replies == [b"got %d" % i for i in range(5, 15)]
            assert session.counters.resumes == 1
            (served,) = app.sessions  # one application call: it saw no break
            assert served.session_id == session.session_id
            assert served.counters.resumes == 1
            assert server.resumes == 1 and server.resumes_refused == 0
            await session.resume()  # and again: the counter moves on, still accepted
            await session.send(b"last")
            assert await session.receive() == b"got last"
            assert served.counters.resumes == 2 and session.counters.resumes == 2
        assert app.received == [b"%d" % i for i in range(15)] + [b"last"]
        await idle(server)
        await server.stop()


async def test_forged_and_replayed_resumes_are_refused_and_counted() -> None:
    config = server_config(free_base(12))
    app = Counter()
    async with trio.open_nursery() as nursery, open_transport(es.server_transport_config()) as t:
        server = await started(nursery, config, app)
        async with connect(config) as session:
            pub, sub = await _all_clients(t, config)
            sid = session.session_id
            # A proof made with another secret; a session that does not exist; garbage.
            forged = format_resume(Resume(sid, 1, resume_proof(12345, sid, 1)))
            reply = await _ask(pub, sub, forged)
            assert reply == AllClientsError(pub.session_id, ERROR_RESUME_REFUSED)
            unknown = format_resume(Resume(sid ^ 1, 1, bytes(16)))
            assert await _ask(pub, sub, unknown) == reply
            assert isinstance(await _ask(pub, sub, b"RESUME x"), AllClientsError)
            assert server.resumes_refused == 2  # the garbage is a bad message, not a resume
            # The real client resumes (counter 1)...
            await session.resume()
            assert server.resumes == 1
            # ...and a copy of a proof already used, sent from elsewhere, is refused: the
            # stranger learns the proof for counter 1 (as an eavesdropper would) and replays it.
            secret = session._resumer.args[1]  # type: ignore[union-attr]
            replay = format_resume(Resume(sid, 1, resume_proof(secret, sid, 1)))
            assert await _ask(pub, sub, replay) == reply
            assert server.resumes_refused == 3 and server.resumes == 1
            # The session is untouched by all of it.
            await session.send(b"still mine")
            assert await session.receive() == b"got still mine"
            (served,) = app.sessions
            assert served.counters.resumes == 1
        await idle(server)
        await server.stop()


async def test_a_plain_hello_gets_the_echo_2_connect_and_no_resume() -> None:
    config = server_config(free_base(12))
    app = Counter()
    async with trio.open_nursery() as nursery, open_transport(es.server_transport_config()) as t:
        server = await started(nursery, config, app)
        pub, sub = await _all_clients(t, config)
        reply = await _ask(pub, sub, format_message(Hello(0x1234)))
        # Echo 2.0's four fields, nothing appended: the Java client's regex still matches.
        assert type(reply).__name__ == "Connect"
        async with connect(config, resume=False) as session:
            assert not session.resumable
            await session.send(b"x")
            assert await session.receive() == b"got x"
        await server.stop()


async def test_a_server_without_resume_gives_no_secret_and_the_client_copes() -> None:
    config = server_config(free_base(12), resume=False)
    app = Counter()
    async with trio.open_nursery() as nursery:
        server = await started(nursery, config, app)
        async with connect(config) as session:
            assert not session.resumable
            await session.send(b"x")
            assert await session.receive() == b"got x"
        await idle(server)
        await server.stop()
