"""A WebSocket member for the tests of the lobby's door: JSON over trio-websocket, every
message it sends and receives validated against the committed JSON Schema."""

from __future__ import annotations

import json
import secrets
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import jsonschema
import trio
from trio_websocket import CloseReason, ConnectionClosed, WebSocketConnection, open_websocket_url

from echo.lobby.web import jsonwire

SCHEMA = json.loads(Path(jsonwire.__file__).with_name("schema.json").read_text())
_SIDES = {
    side: jsonschema.Draft202012Validator({"$ref": f"#/$defs/{side}", "$defs": SCHEMA["$defs"]})
    for side in ("client_message", "server_message")
}


def check(obj: Any, side: str) -> None:
    """`obj` is a valid message of that side (a jsonschema.ValidationError otherwise)."""
    _SIDES[side].validate(obj)


class WsMember:
    """One member on the door. `seen` is every message received, in order."""

    def __init__(self, ws: WebSocketConnection, member_id: str, secret: bytes) -> None:
        self.ws = ws
        self.member_id = member_id
        self.secret = secret
        self.seen: list[dict[str, Any]] = []
        self.closed: ConnectionClosed | None = None
        self._changed = trio.Event()
        self._rid = 0

    async def send(self, obj: dict[str, Any], *, validate: bool = True) -> None:
        if validate:
            check(obj, "client_message")
        await self.ws.send_message(json.dumps(obj))

    async def read(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            while True:
                text = await self.ws.get_message()
                assert isinstance(text, str), "the door sends text frames only"
                obj = json.loads(text)
                check(obj, "server_message")
                self.seen.append(obj)
                self._changed.set()
                self._changed = trio.Event()
        except ConnectionClosed as closed:
            self.closed = closed
            self._changed.set()

    async def wait_for(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 10.0, start: int = 0
    ) -> dict[str, Any]:
        """The first message from `seen[start]` on that satisfies `predicate`."""
        with trio.fail_after(timeout):
            while True:
                for obj in self.seen[start:]:
                    if predicate(obj):
                        return obj
                if self.closed is not None:
                    raise AssertionError(f"closed while waiting: {self.closed.reason}")
                await self._changed.wait()

    async def wait_type(self, kind: str, start: int = 0, **fields: Any) -> dict[str, Any]:
        return await self.wait_for(
            lambda o: o["type"] == kind and all(o.get(k) == v for k, v in fields.items()),
            start=start,
        )

    async def wait_closed(self, timeout: float = 10.0) -> ConnectionClosed:
        with trio.fail_after(timeout):
            while self.closed is None:
                await self._changed.wait()
        return self.closed

    async def request(self, kind: str, **fields: Any) -> dict[str, Any]:
        """Send a request; its reply (whatever it is: refusal included)."""
        self._rid += 1
        rid = self._rid
        start = len(self.seen)
        await self.send({"type": kind, "request_id": rid, **fields})
        return await self.wait_for(lambda o: o.get("request_id") == rid, start=start)

    async def ok(self, kind: str, **fields: Any) -> dict[str, Any]:
        reply = await self.request(kind, **fields)
        assert reply["type"] != "refusal", reply
        return reply


@asynccontextmanager
async def ws_member(
    url: str,
    member_id: str,
    *,
    secret: bytes | None = None,
    ssl_context: ssl.SSLContext | None = None,
    **hello: Any,
) -> AsyncIterator[WsMember]:
    """A member connected and welcomed (the welcome checked), its reader running."""
    secret = secrets.token_bytes(16) if secret is None else secret
    async with open_websocket_url(url, ssl_context=ssl_context) as ws:
        obj = {"type": "hello", "v": 1, "member_id": member_id, **hello}
        if secret:
            obj["secret"] = jsonwire.dump_hello(jsonwire.Hello(member_id, secret=secret))["secret"]
        check(obj, "client_message")
        await ws.send_message(json.dumps(obj))
        member = WsMember(ws, member_id, secret)
        async with trio.open_nursery() as nursery:
            await nursery.start(member.read)
            welcome = await member.wait_type("welcome")
            assert welcome["v"] == 1
            yield member
            nursery.cancel_scope.cancel()


async def refused(
    url: str, hello: dict[str, Any], *, ssl_context: ssl.SSLContext | None = None
) -> CloseReason:
    """Send this hello (type and version added); the door's close (code, reason)."""
    async with open_websocket_url(url, ssl_context=ssl_context) as ws:
        obj = {"type": "hello", "v": 1, **hello}
        await ws.send_message(json.dumps(obj))
        with trio.fail_after(10):
            try:
                text = await ws.get_message()
            except ConnectionClosed as closed:
                assert closed.reason is not None
                return closed.reason
    raise AssertionError(f"let in: {text}")


class RawMember:
    """A WebSocket client on wsproto that reads only when told to: a slow reader, or one that
    never answers a ping (trio-websocket's client answers pings in its reader task)."""

    def __init__(self, stream: trio.SocketStream, ws: Any) -> None:
        self.stream = stream
        self.ws = ws

    async def send(self, obj: dict[str, Any]) -> None:
        from wsproto.events import TextMessage

        await self.stream.send_all(self.ws.send(TextMessage(json.dumps(obj))))

    async def aclose(self) -> None:
        await self.stream.aclose()


async def raw_member(port: int, hello: dict[str, Any], *, rcvbuf: int | None = None) -> RawMember:
    """Connected, the hello sent; nothing read after the handshake's response."""
    import socket

    from wsproto import ConnectionType, WSConnection
    from wsproto.events import AcceptConnection, Request

    sock = trio.socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    await sock.connect(("127.0.0.1", port))
    stream = trio.SocketStream(sock)
    ws = WSConnection(ConnectionType.CLIENT)
    await stream.send_all(ws.send(Request(host="127.0.0.1", target="/")))
    accepted = False
    with trio.fail_after(10):
        while not accepted:
            ws.receive_data(await stream.receive_some(4096))
            accepted = any(isinstance(e, AcceptConnection) for e in ws.events())
    member = RawMember(stream, ws)
    await member.send({"type": "hello", "v": 1, **hello})
    return member
