"""echo.ops.httpclient against real local servers: what it returns, and every way an exchange
can fail is one `Unreachable` (never another exception, never a hang past the timeout)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
import trio

from echo.ops import httpclient
from echo.ops.httpclient import Unreachable
from tests.ops.scrape import free_tcp_port

Handler = Callable[[trio.SocketStream], Awaitable[None]]


async def serving(nursery: trio.Nursery, handler: Handler) -> int:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    nursery.start_soon(trio.serve_listeners, handler, listeners)
    return int(listeners[0].socket.getsockname()[1])


async def read_request(stream: trio.SocketStream) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        data += await stream.receive_some(4096)
    return data


def answering(raw: bytes, *, then_close: bool = True) -> Handler:
    async def handler(stream: trio.SocketStream) -> None:
        async with stream:
            await read_request(stream)
            await stream.send_all(raw)
            if not then_close:
                await trio.sleep_forever()

    return handler


async def test_a_response_with_a_body_and_the_request_it_answers() -> None:
    seen: list[bytes] = []

    async def handler(stream: trio.SocketStream) -> None:
        async with stream:
            request = await read_request(stream)
            while not request.endswith(b"{}"):
                request += await stream.receive_some(4096)
            seen.append(request)
            await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")

    async with trio.open_nursery() as nursery:
        port = await serving(nursery, handler)
        assert await httpclient.request("127.0.0.1", port, "POST", "/ready", b"{}", 5) == (
            200,
            b"{}",
        )
        nursery.cancel_scope.cancel()
    (request,) = seen
    assert request.startswith(b"POST /ready HTTP/1.1\r\n")
    assert b"content-type: application/json\r\n" in request and request.endswith(b"\r\n\r\n{}")


async def test_an_error_status_is_an_answer_not_a_failure() -> None:
    async with trio.open_nursery() as nursery:
        raw = b"HTTP/1.1 500 Internal\r\ntransfer-encoding: chunked\r\n\r\n3\r\nno!\r\n0\r\n\r\n"
        port = await serving(nursery, answering(raw))
        assert await httpclient.request("127.0.0.1", port, "GET", "/x", None, 5) == (500, b"no!")
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    "raw",
    [
        b"garbage that is not http\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort",  # then closed
        b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % (httpclient.MAX_BODY + 1)
        + b"x" * (httpclient.MAX_BODY + 1),
        b"",
    ],
    ids=["not-http", "cut-short", "too-large", "closed"],
)
async def test_a_broken_answer_is_unreachable(raw: bytes) -> None:
    async with trio.open_nursery() as nursery:
        port = await serving(nursery, answering(raw))
        with pytest.raises(Unreachable):
            await httpclient.request("127.0.0.1", port, "GET", "/gameserver", None, 5)
        nursery.cancel_scope.cancel()


async def test_nobody_listening_and_a_silent_server_are_unreachable() -> None:
    with pytest.raises(Unreachable):
        await httpclient.request("127.0.0.1", free_tcp_port(), "POST", "/health", b"{}", 5)
    async with trio.open_nursery() as nursery:
        port = await serving(nursery, answering(b"", then_close=False))
        with pytest.raises(Unreachable, match=r"no answer within 0\.2 s"):
            await httpclient.request("127.0.0.1", port, "POST", "/health", b"{}", 0.2)
        nursery.cancel_scope.cancel()


async def test_stream_lines_reassembles_lines_across_chunks() -> None:
    body = b'{"a":1}\n{"b"' + b':2}\n\n{"c":3}'
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in (body[:5], body[5:13], body[13:]))
    raw = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"
    async with trio.open_nursery() as nursery:
        port = await serving(nursery, answering(raw))
        lines = [line async for line in httpclient.stream_lines("127.0.0.1", port, "/w", 5)]
        assert lines == [b'{"a":1}', b'{"b":2}', b'{"c":3}']
        failing = answering(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
        port = await serving(nursery, failing)
        with pytest.raises(Unreachable, match="HTTP 404"):
            async for _ in httpclient.stream_lines("127.0.0.1", port, "/w", 5):
                pass
        nursery.cancel_scope.cancel()
