"""The trio driver of a topics server: one UDP socket on its own port, one loop.

The loop waits for the socket or the next subscription lapse, hands every queued datagram
to the pure core (draining the socket up to a budget, so a burst of publishes is forwarded
in packed datagrams), then sends what the core queued. Sends go straight to the non-blocking
socket; only a full socket buffer waits (for writability), so a fan-out of 1,000 costs
1,000 ``sendto`` calls and little else.
"""

from __future__ import annotations

import errno
import math
import socket
from collections.abc import Callable
from typing import Any

import structlog
import trio

from echo.topics.events import TopicEvents
from echo.topics.server import Address, ServerConfig, TopicServerCore

__all__ = ["TopicServer"]

_READ_BUDGET = 256
#: Stop draining the socket once this many datagrams wait to go out: one publish to 1,000
#: subscribers is 1,000 sends, and 256 of them read at once would keep the loop (its timers,
#: its other sources) waiting for a quarter of a million sends.
_SEND_BUDGET = 2048
_SOCKET_BUFFER = 4 * 1024 * 1024
_RECEIVE_SIZE = 65536


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def open_udp(host: str, port: int) -> socket.socket:
    """A bound non-blocking UDP socket with large buffers (raises OSError as bind does)."""
    sock = socket.socket(_family(host), socket.SOCK_DGRAM)
    try:
        for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            try:
                sock.setsockopt(socket.SOL_SOCKET, option, _SOCKET_BUFFER)
            except OSError:  # pragma: no cover - a kernel with a lower cap keeps its cap
                pass
        sock.bind((host, port))
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class TopicServer:
    """A topics server: ``await nursery.start(server.run)`` returns the bound (host, port)."""

    def __init__(
        self,
        config: ServerConfig | None = None,
        *,
        address: str = "127.0.0.1",
        port: int = 0,
        events: TopicEvents | None = None,
        stats_interval: float = 60.0,
    ) -> None:
        self.core = TopicServerCore(config)
        self.host = address
        self.port = port
        self.events = events
        self.stats_interval = stats_interval
        self.send_errors = 0
        self.receive_errors = 0
        self.bound: Address | None = None
        self._log = structlog.get_logger("echo.topics")
        self._turned = trio.Event()

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Until ``predicate()`` (about this server's state) holds; checked after every turn
        of the loop, which is when the state changes."""
        while not predicate():
            await self._turned.wait()

    @property
    def counters(self) -> dict[str, Any]:
        out = self.core.counters.snapshot()
        out["send_errors"] = self.send_errors
        out["receive_errors"] = self.receive_errors
        out["subscriptions"] = self.core.subscription_count
        return out

    async def run(
        self, *, task_status: trio.TaskStatus[Address] = trio.TASK_STATUS_IGNORED
    ) -> None:
        sock = open_udp(self.host, self.port)
        try:
            self.bound = sock.getsockname()[:2]
            task_status.started(self.bound)
            await self._loop(sock)
        finally:
            sock.close()
            self._emit("topics_stopped", **self.counters)

    def _emit(self, event: str, *, log: bool = True, **fields: Any) -> None:
        if self.events is not None:
            self.events.emit(event, log=log, **fields)
        elif log:
            self._log.info(event, **fields)

    async def _loop(self, sock: socket.socket) -> None:
        core = self.core
        buffer = bytearray(_RECEIVE_SIZE)
        view = memoryview(buffer)
        recvfrom_into = sock.recvfrom_into
        next_stats = trio.current_time() + self.stats_interval
        while True:
            deadline = min(core.next_deadline(), next_stats)
            if math.isfinite(deadline):
                with trio.move_on_at(deadline):
                    await trio.lowlevel.wait_readable(sock)
            else:
                await trio.lowlevel.wait_readable(sock)
            now = trio.current_time()
            for _ in range(_READ_BUDGET):
                try:
                    size, source = recvfrom_into(buffer)
                except BlockingIOError:
                    break
                except OSError:
                    # An ICMP error reported on the socket (a subscriber gone): not ours to die of.
                    self.receive_errors += 1
                    continue
                core.on_datagram(view[:size].tobytes(), (source[0], source[1]), now)
                if core.queued >= _SEND_BUDGET:
                    break
            core.on_timer(now)
            await self._send(sock, core.datagrams_to_send())
            if core.events:
                for name, fields in core.events:
                    self._emit(name, **fields)
                core.events.clear()
            if now >= next_stats:
                next_stats = now + self.stats_interval
                self._emit("topics_counters", **self.counters)
            self._turned.set()
            self._turned = trio.Event()
            await trio.lowlevel.checkpoint()

    async def _send(self, sock: socket.socket, datagrams: list[tuple[bytes, Address]]) -> None:
        sendto = sock.sendto
        for datagram, address in datagrams:
            while True:
                try:
                    sendto(datagram, address)
                except BlockingIOError:
                    await trio.lowlevel.wait_writable(sock)
                    continue
                except OSError as error:
                    # A subscriber's network unreachable, EPERM from a firewall: that datagram
                    # is lost, as UDP may lose any; the others still go.
                    self.send_errors += 1
                    if error.errno not in (errno.ECONNREFUSED, errno.ENETUNREACH, errno.EPERM):
                        self._log.warning("send_failed", error=str(error), address=address)
                break
