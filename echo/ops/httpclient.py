"""A small HTTP/1.1 client on trio and h11, for the Agones SDK sidecar on localhost.

One connection per request (``connection: close``): the sidecar is on the same host, the
calls are a few a second at most, and a fresh connection cannot be a stale one after the
sidecar restarts. Every way the exchange can fail (refused, reset, timed out, not HTTP, too
large) is one `Unreachable`: the caller retries, it never crashes.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

import h11
import trio

__all__ = ["MAX_BODY", "Unreachable", "request", "stream_lines"]

#: The most of a response body read (a GameServer is a few KiB; a watch line as much).
MAX_BODY = 1 << 20
_RECEIVE = 16384


class Unreachable(Exception):
    """The request got no complete HTTP answer."""


def _request(host: str, port: int, method: str, path: str, body: bytes | None) -> h11.Request:
    headers = [("host", f"{host}:{port}"), ("connection", "close"), ("accept", "application/json")]
    if body is not None:
        headers += [("content-type", "application/json"), ("content-length", str(len(body)))]
    return h11.Request(method=method, target=path, headers=headers)


async def _open(host: str, port: int, method: str, path: str, body: bytes | None
                ) -> tuple[trio.SocketStream, h11.Connection]:  # fmt: skip
    stream = await trio.open_tcp_stream(host, port)
    try:
        conn = h11.Connection(h11.CLIENT)
        data = conn.send(_request(host, port, method, path, body)) or b""
        if body:
            data += conn.send(h11.Data(data=body)) or b""
        data += conn.send(h11.EndOfMessage()) or b""
        await stream.send_all(data)
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise
    return stream, conn


async def _next(conn: h11.Connection, stream: trio.SocketStream) -> h11.Event | type[h11.PAUSED]:
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event  # type: ignore[return-value]
        conn.receive_data(await stream.receive_some(_RECEIVE))


async def _response(conn: h11.Connection, stream: trio.SocketStream) -> h11.Response:
    while True:
        event = await _next(conn, stream)
        if isinstance(event, h11.Response):
            return event
        if not isinstance(event, h11.InformationalResponse):
            raise Unreachable(f"no response: {event!r}")


async def request(
    host: str, port: int, method: str, path: str, body: bytes | None, timeout: float
) -> tuple[int, bytes]:
    """(status, body) of one request, within `timeout` seconds; `Unreachable` otherwise."""
    try:
        with trio.fail_after(timeout):
            stream, conn = await _open(host, port, method, path, body)
            async with stream:
                response = await _response(conn, stream)
                chunks: list[bytes] = []
                size = 0
                while True:
                    event = await _next(conn, stream)
                    if isinstance(event, h11.Data):
                        size += len(event.data)
                        if size > MAX_BODY:
                            raise Unreachable(f"response larger than {MAX_BODY} bytes")
                        chunks.append(bytes(event.data))
                    elif isinstance(event, h11.EndOfMessage):
                        return response.status_code, b"".join(chunks)
                    else:
                        raise Unreachable(f"response cut short: {event!r}")
    except trio.TooSlowError:
        raise Unreachable(f"no answer within {timeout} s") from None
    except (OSError, trio.BrokenResourceError, h11.ProtocolError) as error:
        raise Unreachable(str(error) or type(error).__name__) from None


async def stream_lines(
    host: str, port: int, path: str, connect_timeout: float
) -> AsyncGenerator[bytes, None]:
    """The lines of a streamed GET response (newline-delimited JSON), as they come, until the
    server ends it; `Unreachable` on any failure (a status other than 200 included)."""
    try:
        with trio.fail_after(connect_timeout):
            stream, conn = await _open(host, port, "GET", path, None)
        async with stream:
            with trio.fail_after(connect_timeout):
                response = await _response(conn, stream)
            if response.status_code != 200:
                raise Unreachable(f"{path}: HTTP {response.status_code}")
            pending = b""
            while True:
                event = await _next(conn, stream)
                if isinstance(event, h11.Data):
                    pending += bytes(event.data)
                    *lines, pending = pending.split(b"\n")
                    if len(pending) > MAX_BODY:
                        raise Unreachable(f"a line longer than {MAX_BODY} bytes")
                    for line in lines:
                        if line.strip():
                            yield line
                elif isinstance(event, h11.EndOfMessage):
                    if pending.strip():
                        yield pending
                    return
                else:
                    raise Unreachable(f"stream cut short: {event!r}")
    except trio.TooSlowError:
        raise Unreachable(f"no answer within {connect_timeout} s") from None
    except (OSError, trio.BrokenResourceError, h11.ProtocolError) as error:
        raise Unreachable(str(error) or type(error).__name__) from None
