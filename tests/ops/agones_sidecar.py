"""A stand-in for the Agones SDK sidecar: its REST API on trio and h11, recording each call.

The real sidecar (Agones' sdk-server) needs a Kubernetes cluster; this one implements the
endpoints of Agones' "REST Game Server Client API" page as documented (paths, methods, JSON
bodies, the GameServer's JSON with its state, newline-delimited JSON on /watch/gameserver,
the player-tracking answers ``{"bool": true}``) and the state changes they make:

    POST /ready                     state Ready
    POST /allocate                  state Allocated
    POST /reserve {"seconds": "N"}  state Reserved
    POST /shutdown                  state Shutdown
    POST /health                    recorded
    GET  /gameserver                the GameServer
    GET  /watch/gameserver          the GameServer now, then again on every change
    POST /alpha/player/connect      {"playerID": ...}: the id joins Players.IDs
    POST /alpha/player/disconnect   the id leaves

Anything else is a 404; a malformed JSON body a 400. `allocate_externally` stands in for a
GameServerAllocation made by a matchmaker.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import attrs
import h11
import trio


@attrs.define
class Recorded:
    method: str
    path: str
    body: Any
    at: float


class Sidecar:
    def __init__(self, *, health_period: int = 1, capacity: int = 100) -> None:
        self.calls: list[Recorded] = []
        self.state = "Scheduled"
        self.players: list[str] = []
        self.capacity = capacity
        self.health_period = health_period
        self.port = 0
        self._changed = trio.Event()
        self._watchers: set[trio.MemorySendChannel[bytes]] = set()

    # ------------------------------------------------------------------ for the tests

    def names(self) -> list[str]:
        """The calls so far, health pings included, as short names (`/alpha/player/connect`
        is "connect", /watch/gameserver "watch")."""
        short = {"/watch/gameserver": "watch", "/alpha/player/connect": "connect",
                 "/alpha/player/disconnect": "disconnect"}  # fmt: skip
        return [short.get(c.path, c.path.strip("/")) for c in self.calls]

    async def wait_for(self, predicate: Callable[[Sidecar], bool]) -> None:
        while not predicate(self):
            self._changed = trio.Event()
            await self._changed.wait()

    def allocate_externally(self) -> None:
        self._set_state("Allocated")

    def gameserver(self) -> dict[str, Any]:
        return {
            "object_meta": {"name": "echo-test", "namespace": "default", "uid": "1234",
                            "resource_version": "v1", "generation": "1",
                            "creation_timestamp": "1765000000"},
            "spec": {"health": {"disabled": False, "period_seconds": self.health_period,
                                "failure_threshold": 3, "initial_delay_seconds": 1}},
            "status": {"state": self.state, "address": "127.0.0.1",
                       "ports": [{"name": "default", "port": 9000}],
                       "players": {"count": str(len(self.players)),
                                   "capacity": str(self.capacity), "ids": self.players}},
        }  # fmt: skip

    # ------------------------------------------------------------------ serving

    async def serve(self, port: int = 0, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started(self.port)
        await trio.serve_listeners(self._connection, listeners)

    def _set_state(self, state: str) -> None:
        self.state = state
        line = json.dumps({"result": self.gameserver()}).encode() + b"\n"
        for watcher in list(self._watchers):
            try:
                watcher.send_nowait(line)
            except (trio.WouldBlock, trio.BrokenResourceError):
                self._watchers.discard(watcher)
        self._changed.set()

    async def _connection(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        try:
            async with stream:
                request, body = await _read_request(conn, stream)
                await self._answer(conn, stream, request, body)
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError, OSError):
            pass

    async def _answer(
        self, conn: h11.Connection, stream: trio.SocketStream, request: h11.Request, raw: bytes
    ) -> None:
        method = request.method.decode()
        path = request.target.decode()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            await _send(conn, stream, 400, {"error": "bad json"})
            return
        self.calls.append(Recorded(method, path, body, trio.current_time()))
        self._changed.set()
        if (method, path) == ("GET", "/watch/gameserver"):
            await self._watch(conn, stream)
            return
        answer = self._route(method, path, body)
        if answer is None:
            await _send(conn, stream, 404, {"error": f"no route {method} {path}"})
        else:
            await _send(conn, stream, *answer)

    def _route(self, method: str, path: str, body: Any) -> tuple[int, Any] | None:
        states = {"/ready": "Ready", "/allocate": "Allocated", "/shutdown": "Shutdown"}
        if method == "POST" and path in states:
            self._set_state(states[path])
            return 200, {}
        if (method, path) == ("POST", "/health"):
            return 200, {}
        if (method, path) == ("POST", "/reserve"):
            if not isinstance(body, dict) or not str(body.get("seconds", "")).isdigit():
                return 400, {"error": "seconds"}
            self._set_state("Reserved")
            return 200, {}
        if (method, path) == ("GET", "/gameserver"):
            return 200, self.gameserver()
        if method == "POST" and path in ("/alpha/player/connect", "/alpha/player/disconnect"):
            player = body.get("playerID") if isinstance(body, dict) else None
            if not isinstance(player, str) or not player:
                return 400, {"error": "playerID"}
            return self._player(path == "/alpha/player/connect", player)
        return None

    def _player(self, connect: bool, player: str) -> tuple[int, Any]:
        if connect:
            if player in self.players:
                return 200, {"bool": False}
            if len(self.players) >= self.capacity:
                return 500, {"error": "players are already at capacity"}
            self.players.append(player)
            return 200, {"bool": True}
        if player not in self.players:
            return 200, {"bool": False}
        self.players.remove(player)
        return 200, {"bool": True}

    async def _watch(self, conn: h11.Connection, stream: trio.SocketStream) -> None:
        send, receive = trio.open_memory_channel[bytes](64)
        self._watchers.add(send)
        try:
            head = h11.Response(status_code=200, headers=[("content-type", "application/json")])
            await stream.send_all(conn.send(head) or b"")
            first = json.dumps({"result": self.gameserver()}).encode() + b"\n"
            await stream.send_all(conn.send(h11.Data(data=first)) or b"")
            async for line in receive:
                await stream.send_all(conn.send(h11.Data(data=line)) or b"")
        finally:
            self._watchers.discard(send)


async def _read_request(
    conn: h11.Connection, stream: trio.SocketStream
) -> tuple[h11.Request, bytes]:
    request: h11.Request | None = None
    body = b""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await stream.receive_some(65536)
            conn.receive_data(data)
            if not data:
                raise trio.BrokenResourceError
        elif isinstance(event, h11.Request):
            request = event
        elif isinstance(event, h11.Data):
            body += bytes(event.data)
        elif isinstance(event, h11.EndOfMessage):
            assert request is not None
            return request, body
        else:
            raise trio.BrokenResourceError


async def _send(conn: h11.Connection, stream: trio.SocketStream, status: int, payload: Any) -> None:
    body = json.dumps(payload).encode()
    headers = [("content-type", "application/json"), ("content-length", str(len(body)))]
    data = conn.send(h11.Response(status_code=status, headers=headers)) or b""
    data += conn.send(h11.Data(data=body)) or b""
    data += conn.send(h11.EndOfMessage()) or b""
    await stream.send_all(data)
