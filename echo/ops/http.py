"""The operations endpoint: `/metrics`, `/healthz` and `/readyz` over HTTP/1.1, on trio.

A tiny server inside the server's own trio event loop (no thread): h11 parses and frames
HTTP (a sans-io library: this module only moves bytes), prometheus_client renders the
metrics. Scrapers and probes are few and polite, but the port may be reachable by anyone, so
nothing a client sends can hurt the game server: a request is bounded in size (h11's limit)
and in time, connections are bounded in number, and a malformed request gets a 400 and its
connection closed.

    /metrics  the registry in Prometheus text format (OpenMetrics when the scraper asks)
    /healthz  200 while the process serves (this loop answers at all)
    /readyz   200 while the server admits; 503 while it starts or drains
    /drain    POST only, where the server offers it (`OpsHttpServer.actions`; echo-lobby):
              start draining, as SIGTERM does; 202 at once, the drain goes on after
"""

from __future__ import annotations

import enum
from collections.abc import Callable

import h11
import structlog
import trio
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

__all__ = ["MAX_CONNECTIONS", "REQUEST_TIMEOUT", "Health", "OpsHttpServer", "Readiness"]

log = structlog.get_logger("echo.ops")

#: Seconds a client has to send a whole request (and to read the answer) before it is dropped.
REQUEST_TIMEOUT = 10.0
#: Connections served at once; more are closed at once (a scraper and two probes need three).
MAX_CONNECTIONS = 32
_RECEIVE_SIZE = 16384


class Readiness(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"


class Health:
    """Where the server is in its life: /readyz says 200 only while `READY`."""

    def __init__(self) -> None:
        self.state = Readiness.STARTING

    def ready(self) -> None:
        if self.state is Readiness.STARTING:
            self.state = Readiness.READY

    def draining(self) -> None:
        self.state = Readiness.DRAINING

    @property
    def is_ready(self) -> bool:
        return self.state is Readiness.READY


_Response = tuple[int, str, bytes, list[tuple[str, str]]]


class OpsHttpServer:
    """Serves one registry and one `Health` on a listener: ``await nursery.start(s.serve)``."""

    def __init__(self, registry: CollectorRegistry, health: Health) -> None:
        self.registry = registry
        self.health = health
        self.connections = 0
        self.requests = 0
        self.bad_requests = 0
        self.routes: dict[str, Callable[[dict[str, str]], _Response]] = {
            "/metrics": self._metrics,
            "/healthz": self._healthz,
            "/readyz": self._readyz,
        }
        #: POST routes the server adds (echo-lobby's /drain), each answering with no arguments
        self.actions: dict[str, Callable[[], _Response]] = {}

    async def serve(
        self,
        listener: trio.SocketListener,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        async with listener, trio.open_nursery() as nursery:
            task_status.started()
            while True:
                try:
                    stream = await listener.accept()
                except OSError as error:  # EMFILE and the like: wait, do not die
                    log.warning("metrics_accept_failed", error=str(error))
                    await trio.sleep(0.1)
                    continue
                if self.connections >= MAX_CONNECTIONS:
                    nursery.start_soon(_discard, stream)
                    continue
                self.connections += 1
                nursery.start_soon(self._connection, stream)

    async def _connection(self, stream: trio.SocketStream) -> None:
        try:
            async with stream:
                await self._converse(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, h11.ProtocolError):
            pass  # the client went away mid-answer, or broke HTTP after it: nothing to tell it
        finally:
            self.connections -= 1

    async def _converse(self, stream: trio.SocketStream) -> None:
        """Requests of one connection, one after another (keep-alive), until it closes."""
        conn = h11.Connection(h11.SERVER)
        while True:
            # Each request (and the wait for it on a kept-alive connection) and its answer
            # get REQUEST_TIMEOUT: a slow or silent client is dropped, a scraper that keeps
            # its connection and asks every few seconds is not.
            with trio.move_on_after(REQUEST_TIMEOUT):
                if await self._one_request(conn, stream):
                    continue
            return

    async def _one_request(self, conn: h11.Connection, stream: trio.SocketStream) -> bool:
        """Read one request and answer it; True if the connection goes on to another."""
        try:
            event = await _next_event(conn, stream)
        except h11.RemoteProtocolError as error:
            self.bad_requests += 1
            if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                # (What was wrong is not echoed back: the reply reflects nothing it got.)
                status = error.error_status_hint
                await _send(conn, stream, _plain(status, "bad request\n"), False)
                await _linger(stream)
            return False
        if not isinstance(event, h11.Request):
            return False  # ConnectionClosed: the client is done
        self.requests += 1
        await _send(conn, stream, self._answer(event), event.method == b"HEAD")
        if conn.our_state is not h11.DONE or not await _end_of_request(conn, stream):
            return False  # not keep-alive, or a body we did not read: close
        try:
            conn.start_next_cycle()
        except h11.LocalProtocolError:  # pragma: no cover - both sides are DONE here
            return False
        return True

    def _answer(self, request: h11.Request) -> _Response:
        target = request.target.decode("ascii", "replace")
        path = target.split("?", 1)[0]
        headers = {k.decode("ascii", "replace"): v.decode("latin-1") for k, v in request.headers}
        action = self.actions.get(path)
        if action is not None:
            if request.method != b"POST":
                status, reason, body, extra = _plain(405, "only POST\n")
                return status, reason, body, [*extra, ("allow", "POST")]
            return action()
        route = self.routes.get(path)
        if route is None:
            return _plain(404, f"not found: {path}; try /metrics, /healthz or /readyz\n")
        if request.method not in (b"GET", b"HEAD"):
            status, reason, body, extra = _plain(405, "only GET and HEAD\n")
            return status, reason, body, [*extra, ("allow", "GET, HEAD")]
        try:
            return route(headers)
        except Exception:
            # A collector that fails (a bug) costs its scrape, never the game server.
            log.exception("metrics_failed", path=path)
            return _plain(500, "internal error\n")

    def _metrics(self, headers: dict[str, str]) -> _Response:
        encoder, content_type = choose_encoder(headers.get("accept", ""))
        return 200, "OK", encoder(self.registry), [("content-type", content_type)]

    def _healthz(self, headers: dict[str, str]) -> _Response:
        return _plain(200, "ok\n")

    def _readyz(self, headers: dict[str, str]) -> _Response:
        state = self.health.state
        return _plain(200 if self.health.is_ready else 503, f"{state.value}\n")


_REASONS = {
    200: "OK",
    202: "Accepted",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    500: "Internal Server Error",
}


def _plain(status: int, text: str) -> _Response:
    reason = _REASONS.get(status, "Service Unavailable" if status == 503 else "Error")
    return status, reason, text.encode(), [("content-type", "text/plain; charset=utf-8")]


async def _next_event(conn: h11.Connection, stream: trio.SocketStream) -> h11.Event:
    """The next request, or the end of the connection."""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await stream.receive_some(_RECEIVE_SIZE))
            continue
        if isinstance(event, h11.Request):
            return event
        return h11.ConnectionClosed()  # closed, or PAUSED by a state we do not continue


async def _end_of_request(conn: h11.Connection, stream: trio.SocketStream) -> bool:
    """Read to the end of the request just answered; False if it carries a body (none of
    ours takes one: the connection is closed rather than read through)."""
    while conn.their_state is h11.SEND_BODY:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await stream.receive_some(_RECEIVE_SIZE))
        elif not isinstance(event, h11.EndOfMessage):
            return False
    return conn.their_state is h11.DONE


async def _send(
    conn: h11.Connection, stream: trio.SocketStream, response: _Response, head_only: bool
) -> None:
    status, reason, body, headers = response
    headers = [*headers, ("content-length", str(len(body)))]
    if status >= 400:
        headers.append(("connection", "close"))
    try:
        data = conn.send(h11.Response(status_code=status, headers=headers, reason=reason))
        assert data is not None
        if not head_only:
            data += conn.send(h11.Data(data=body)) or b""
        data += conn.send(h11.EndOfMessage()) or b""
    except h11.LocalProtocolError:
        return
    await stream.send_all(data)


async def _linger(stream: trio.SocketStream) -> None:
    """End our side and read (and drop) what the client still sends, briefly, before the
    close: a close with unread bytes makes the kernel send a reset, which can destroy the
    answer before the client read it (the "lingering close" of web servers)."""
    with trio.move_on_after(1.0):
        await stream.send_eof()
        for _ in range(64):
            if not await stream.receive_some(_RECEIVE_SIZE):
                return


async def _discard(stream: trio.SocketStream) -> None:
    with trio.move_on_after(1.0):
        try:
            await stream.aclose()
        except (trio.BrokenResourceError, OSError):  # pragma: no cover
            pass
