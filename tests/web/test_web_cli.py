"""`echo-lobby --web` as a process: the page over https on the wss:// door's port, and --web
without a door refused as a bad command line."""

from __future__ import annotations

import json
import signal
import ssl
from pathlib import Path

import trio
import trio_websocket

from echo.lobby.webpage.files import page_files
from tests.lobby.test_cli import LOBBY, run, start_lobby
from tests.lobby.test_web_cli import free_tcp_port, self_signed


def test_web_without_a_door_is_a_bad_command_line() -> None:
    done = run([*LOBBY, "--web"])
    assert done.returncode == 2
    assert "--web" in done.stderr and "needs --ws-port" in done.stderr


def test_the_page_over_https_and_the_door_over_wss_on_one_port(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    ws_port = free_tcp_port()
    process, _ = start_lobby(
        tmp_path / "lobby.log", "--ws-port", str(ws_port), "--ws-tls-cert", str(cert),
        "--ws-tls-key", str(key), "--web",
    )
    try:
        context = ssl.create_default_context(cafile=str(cert))

        async def visit() -> tuple[bytes, dict[str, object]]:
            stream = await trio.open_ssl_over_tcp_stream(
                "127.0.0.1", ws_port, ssl_context=context, https_compatible=True
            )
            async with stream:
                await stream.send_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                page = bytearray()
                while data := await stream.receive_some(65536):
                    page += data
            async with trio_websocket.open_websocket(
                "127.0.0.1", ws_port, "/", use_ssl=context
            ) as ws:
                await ws.send_message(json.dumps({"type": "hello", "v": 1, "member_id": "ann"}))
                welcome = json.loads(await ws.get_message())
            return bytes(page), welcome

        page, welcome = trio.run(visit)
        assert page.startswith(b"HTTP/1.1 200 ")
        assert page.endswith(page_files()["index.html"])
        assert welcome["type"] == "welcome"
        log = (tmp_path / "lobby.log").read_text()
        assert f'"page": "https://127.0.0.1:{ws_port}/"' in log
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
