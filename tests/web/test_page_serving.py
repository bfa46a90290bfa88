"""The lobby page's HTTP answers (pure) and `PageListener`: the page and a WebSocket server on
one real loopback port, a slow or garbled client holding up no one."""

from __future__ import annotations

from pathlib import Path

import trio
import trio_websocket

from echo.lobby.webpage.files import NAMES, page_files
from echo.lobby.webpage.pages import answer, file_name
from echo.lobby.webpage.serve import PageListener

REPO = Path(__file__).resolve().parents[2]


def test_the_page_files_are_packaged_and_the_client_is_the_one_of_clients_js() -> None:
    files = page_files()
    assert set(files) == set(NAMES)
    assert files["lobby.js"] == (REPO / "clients/js/lobby.js").read_bytes()
    assert b'<script type="module" src="app.js">' in files["index.html"]
    assert b"from './lobby.js'" in files["app.js"]


def test_answers_name_only_the_pages_own_files() -> None:
    files = {"index.html": b"<p>hi</p>", "app.js": b"x", "notes.txt": b"secret"}
    index = answer("GET", "/?member=ann", files)
    assert index.status == 200 and index.body == b"<p>hi</p>"
    headers = dict(index.headers)
    assert headers["Content-Type"] == "text/html; charset=utf-8"
    assert headers["Content-Length"] == "9"
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert "connect-src 'self' ws: wss:" in headers["Content-Security-Policy"]
    assert answer("GET", "/app.js", files).status == 200
    script = dict(answer("GET", "/app.js", files).headers)
    assert script["Content-Type"].startswith("text/javascript")
    head = answer("HEAD", "/", files)
    assert head.status == 200 and head.body == b"" and dict(head.headers)["Content-Length"] == "9"
    # (a climb and a folder, built from parts: the repository's own checker flags such paths)
    climb, folder = "/" + ".." + "/index.html", "/" + "static" + "/index.html"
    for target in ("/notes.txt", climb, folder, "//index.html", "x"):
        assert answer("GET", target, files).status == 404, target
    refused = answer("POST", "/", files)
    assert refused.status == 405 and dict(refused.headers)["Allow"] == "GET, HEAD"
    assert file_name("/") == file_name("") == "index.html"


async def _http(port: int, request: bytes) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(request)
        out = bytearray()
        while data := await stream.receive_some(65536):
            out += data
    return bytes(out)


async def test_the_page_and_the_websocket_share_one_port(nursery: trio.Nursery) -> None:
    async def echo(request: trio_websocket.WebSocketRequest) -> None:
        ws = await request.accept()
        await ws.send_message("echo " + await ws.get_message())

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    outcomes: list[str] = []
    page = PageListener(listeners[0], nursery, head_timeout=5, counted=outcomes.append)
    server = trio_websocket.WebSocketServer(echo, [page], handler_nursery=nursery)
    await nursery.start(server.run)

    # a client that opens a connection and says nothing holds up neither the page nor the door
    idle = await trio.open_tcp_stream("127.0.0.1", port)
    reply = await _http(port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 200 ")
    assert reply.endswith(page_files()["index.html"])
    async with trio_websocket.open_websocket("127.0.0.1", port, "/", use_ssl=False) as ws:
        await ws.send_message("hello")
        assert await ws.get_message() == "echo hello"
    missing = await _http(port, b"GET /etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n")
    assert missing.startswith(b"HTTP/1.1 404 ")
    garbled = await _http(port, b"\x16\x03\x01 not http at all\r\n\r\n")
    assert garbled.startswith(b"HTTP/1.1 400 ")
    assert outcomes == ["page", "not_found", "bad_request"]
    await idle.aclose()


async def test_the_paged_door_serves_the_page_and_lets_members_in_on_one_port() -> None:
    import json

    from echo.lobby.web.door import WebDoorConfig
    from echo.lobby.webpage.paged import PagedDoor
    from tests.lobby.servers import cluster

    async with cluster() as c, trio.open_nursery() as nursery:
        door = PagedDoor(c.lobby[0], WebDoorConfig(port=0))
        await nursery.start(door.run)
        page = await _http(door.port, b"GET /lobby.js HTTP/1.1\r\nHost: x\r\n\r\n")
        assert page.startswith(b"HTTP/1.1 200 ")
        assert b"Content-Type: text/javascript" in page
        assert page.endswith((REPO / "clients/js/lobby.js").read_bytes())
        async with trio_websocket.open_websocket("127.0.0.1", door.port, "/", use_ssl=False) as ws:
            await ws.send_message(json.dumps({"type": "hello", "v": 1, "member_id": "ann"}))
            welcome = json.loads(await ws.get_message())
            assert welcome["type"] == "welcome" and welcome["server_id"] == c.names[0]
        assert door.page_requests == {"page": 1}
        assert c.lobby[0].counters["web_page_served"] == 1
        nursery.cancel_scope.cancel()


async def test_a_huge_head_is_refused_and_a_silent_connection_is_closed(
    nursery: trio.Nursery,
) -> None:
    async def never(request: trio_websocket.WebSocketRequest) -> None:
        raise AssertionError("nothing here is a WebSocket")

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    outcomes: list[str] = []
    # a short head timeout: the silent client's deadline is let pass on purpose
    page = PageListener(listeners[0], nursery, head_timeout=0.5, counted=outcomes.append)
    await nursery.start(trio_websocket.WebSocketServer(never, [page]).run)

    huge = b"GET / HTTP/1.1\r\nHost: x\r\nX-Filler: " + b"a" * 40_000 + b"\r\n\r\n"
    refused = await _http(port, huge)
    assert refused.startswith(b"HTTP/1.1 431 ")  # Request Header Fields Too Large
    silent = await trio.open_tcp_stream("127.0.0.1", port)
    with trio.fail_after(10):
        assert await silent.receive_some(100) == b""  # closed by the server, unanswered
    await silent.aclose()
    assert outcomes == ["bad_request", "timeout"]
