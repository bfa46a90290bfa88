"""The lobby page served by the WebSocket door's own listener (``echo-lobby --web``).

`PageListener` wraps the door's TCP (or TLS) listener: it reads each new connection's HTTP
request head (h11, bounded in size and time, in a task of its own so that a slow client holds
up no one), hands a WebSocket upgrade on to the door with the bytes it read put back in front
(`Replayed`), and answers any other request with the page's file (`pages.answer`) and closes.
The page and its door thus share one origin: the page connects to ``ws://`` its own host.

Trio driver: the answers are the pure `echo.lobby.webpage.pages`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from http import HTTPStatus

import h11
import trio

from echo.lobby.webpage.files import page_files
from echo.lobby.webpage.pages import answer

MAX_HEAD = 16 * 1024  # a request head larger than this is refused (431)
HEAD_TIMEOUT = 10.0  # seconds for a new connection to send its request head
READY_QUEUE = 64  # WebSocket connections sorted and waiting for the door to take them


class Replayed(trio.abc.Stream):
    """A stream whose first bytes received are `prefix` (read from it already)."""

    def __init__(self, stream: trio.abc.Stream, prefix: bytes) -> None:
        self.stream = stream
        self.prefix = prefix

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self.prefix:
            n = len(self.prefix) if max_bytes is None else max_bytes
            out, self.prefix = self.prefix[:n], self.prefix[n:]
            return out
        return bytes(await self.stream.receive_some(max_bytes))

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.stream.aclose()


def _is_upgrade(request: h11.Request) -> bool:
    for name, value in request.headers:
        if name == b"upgrade" and b"websocket" in value.lower():
            return True
    return False


class PageListener(trio.abc.Listener[trio.abc.Stream]):
    """The door's listener with the page in front of it (see the module's docstring).

    `nursery` runs the accept loop and each connection's sorting; `files` is name -> content
    (the package's page by default); `counted(outcome)` is told of each page request
    ("page", "not_found", "bad_request", "timeout").
    """

    def __init__(
        self,
        inner: trio.abc.Listener[trio.abc.Stream],
        nursery: trio.Nursery,
        files: Mapping[str, bytes] | None = None,
        *,
        head_timeout: float = HEAD_TIMEOUT,
        counted: Callable[[str], None] | None = None,
    ) -> None:
        self.inner = inner
        self.nursery = nursery
        self.files = page_files() if files is None else files
        self.head_timeout = head_timeout
        self.counted = counted or (lambda outcome: None)
        self._send, self._receive = trio.open_memory_channel[trio.abc.Stream](READY_QUEUE)
        self._started = False

    @property
    def socket(self) -> object:
        # what trio-websocket reads to learn the port it listens on
        return getattr(self.inner, "socket", None) or getattr(
            getattr(self.inner, "transport_listener", None), "socket", None
        )

    def __str__(self) -> str:
        return f"{self.inner} with the lobby page"

    async def accept(self) -> trio.abc.Stream:
        if not self._started:
            self._started = True
            self.nursery.start_soon(self._accept_loop)
        return await self._receive.receive()

    async def aclose(self) -> None:
        await self.inner.aclose()
        await self._send.aclose()

    async def _accept_loop(self) -> None:
        while True:
            try:
                stream = await self.inner.accept()
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                return
            except OSError:  # out of file descriptors, a TLS listener's broken socket
                await trio.sleep(0.1)  # do not spin; connections will close and free some
                continue
            self.nursery.start_soon(self._sort, stream)

    async def _sort(self, stream: trio.abc.Stream) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        read = bytearray()
        event: object = h11.NEED_DATA
        with trio.move_on_after(self.head_timeout) as timer:
            try:
                while event is h11.NEED_DATA:
                    data = bytes(await stream.receive_some(4096))
                    read += data
                    conn.receive_data(data)
                    event = conn.next_event()
            except h11.RemoteProtocolError as error:
                self.counted("bad_request")
                await self._refuse(stream, error.error_status_hint)
                return
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                await trio.aclose_forcefully(stream)
                return
        if timer.cancelled_caught or not isinstance(event, h11.Request):
            self.counted("timeout" if timer.cancelled_caught else "bad_request")
            await trio.aclose_forcefully(stream)
            return
        if _is_upgrade(event):
            try:
                self._send.send_nowait(Replayed(stream, bytes(read)))
            except (trio.WouldBlock, trio.ClosedResourceError):
                await self._refuse(stream, 503)
            return
        await self._serve(stream, conn, event)

    async def _serve(
        self, stream: trio.abc.Stream, conn: h11.Connection, request: h11.Request
    ) -> None:
        reply = answer(request.method.decode("ascii", "replace"),
                       request.target.decode("ascii", "replace"), self.files)
        self.counted("page" if reply.status == 200 else "not_found")
        headers = [*reply.headers, ("Connection", "close")]
        with trio.move_on_after(self.head_timeout):
            try:
                response = h11.Response(status_code=reply.status, headers=headers)
                await stream.send_all(conn.send(response))
                if reply.body:
                    await stream.send_all(conn.send(h11.Data(data=reply.body)))
                await stream.send_all(conn.send(h11.EndOfMessage()))
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError,
                    h11.LocalProtocolError):
                pass
        await _linger_and_close(stream)

    async def _refuse(self, stream: trio.abc.Stream, status: int) -> None:
        body = f"{status}\n".encode()
        head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
        with trio.move_on_after(min(self.head_timeout, 1.0)):
            try:
                await stream.send_all(head + body)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass
        await _linger_and_close(stream)


async def _linger_and_close(stream: trio.abc.Stream) -> None:
    """End our side, read (and drop) what the client still sends, briefly, then close: a close
    with unread bytes makes the kernel send a reset, which can destroy the answer before the
    client read it (the "lingering close" of web servers; echo.ops.http does the same)."""
    with trio.move_on_after(1.0):
        try:
            if isinstance(stream, trio.abc.HalfCloseableStream):
                await stream.send_eof()
            for _ in range(64):
                if not await stream.receive_some(16384):
                    break
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
    await trio.aclose_forcefully(stream)
