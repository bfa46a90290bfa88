"""``echo-lobby --web``: the WebSocket door with the lobby page on the same listener.

`PagedDoor` is the door (`echo.lobby.web.door.WebDoor`: the same members, limits and
protocol) whose listeners are wrapped in `PageListener`, so that a plain HTTP request to the
door's address gets the page and a WebSocket upgrade goes on to the door as before.

Trio driver.
"""

from __future__ import annotations

from typing import Any, cast

import structlog
import trio
from trio_websocket import WebSocketServer

from echo.lobby.web.door import WebDoor
from echo.lobby.webpage.serve import PageListener

log = structlog.get_logger("echo.lobby.web")

#: The page's answers by outcome, as the server's counters (echo_lobby_<name>_total)
COUNTERS = {
    "page": "web_page_served",
    "not_found": "web_page_not_found",
    "bad_request": "web_page_bad_requests",
    "timeout": "web_page_timeouts",
}


class PagedDoor(WebDoor):
    """The door, serving the lobby page too. `page_requests` counts the page's answers by
    outcome ("page", "not_found", "bad_request", "timeout")."""

    page_requests: dict[str, int]

    def _count(self, outcome: str) -> None:
        self.page_requests[outcome] = self.page_requests.get(outcome, 0) + 1
        self.counters[COUNTERS[outcome]] += 1

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        config = self.config
        self.page_requests = {}
        listeners: list[Any]
        if config.ssl_context is None:
            listeners = await trio.open_tcp_listeners(config.port, host=config.address)
        else:
            listeners = await trio.open_ssl_over_tcp_listeners(
                config.port, config.ssl_context, host=config.address, https_compatible=True
            )
        async with trio.open_nursery() as nursery:
            self.start_timers(nursery)
            paged: list[trio.abc.Listener[trio.abc.Stream]] = [
                PageListener(listener, nursery, counted=self._count) for listener in listeners
            ]
            server = WebSocketServer(
                self._handle,
                cast(Any, paged),  # trio-websocket only accepts from them
                max_message_size=config.max_message_bytes,
                connect_timeout=self.server.config.hello_timeout,
                disconnect_timeout=config.close_timeout,
            )
            await nursery.start(server.run)
            first: Any = listeners[0]
            sock = getattr(first, "transport_listener", first).socket
            self.port = sock.getsockname()[1]
            scheme = "https" if config.ssl_context is not None else "http"
            log.info(
                "lobby_ws_listening",
                address=config.address,
                port=self.port,
                tls=config.ssl_context is not None,
                max_connections=config.max_connections,
                page=f"{scheme}://{config.address}:{self.port}/",
            )
            task_status.started(self)

