"""echo-lobby --ws-port as a process: a ws:// and a wss:// door (a self-signed certificate
made here), members of both kinds in one lobby, a clean stop, and the door's command-line
errors."""

from __future__ import annotations

import datetime
import ipaddress
import signal
import socket
import ssl
from pathlib import Path

import pytest
import trio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

import echo.lobby
from echo.lobby.protocol import ChatLine
from tests.lobby.test_cli import LOBBY, run, start_lobby
from tests.lobby.wsclient import ws_member
from tests.ports import free_ports


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "echo-lobby test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def free_tcp_port() -> int:
    """A port below the ephemeral range that is free for TCP too (tests/ports.py probes UDP)."""
    for _ in range(50):
        port = free_ports([0])
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free TCP port")


@pytest.mark.parametrize("tls", [False, True], ids=["ws", "wss"])
async def test_a_lobby_server_process_with_a_websocket_door(tmp_path: Path, tls: bool) -> None:
    ws_port = free_tcp_port()
    args = ["--ws-port", str(ws_port)]
    client_context = None
    if tls:
        cert, key = self_signed(tmp_path)
        args += ["--ws-tls-cert", str(cert), "--ws-tls-key", str(key)]
        client_context = ssl.create_default_context(cafile=str(cert))
    log = tmp_path / "lobby.log"
    process, port = start_lobby(log, *args)
    try:
        assert '"lobby_ws_listening"' in log.read_text()
        url = f"{'wss' if tls else 'ws'}://127.0.0.1:{ws_port}/"
        async with (
            ws_member(url, "browser", ssl_context=client_context) as browser,
            echo.lobby.connect([f"127.0.0.1:{port}"], member="native") as native,
        ):
            created = await browser.ok(
                "create_lobby", name="both", max_members=4, private=False, metadata={}
            )
            await native.join(int(created["lobby_id"]))
            await browser.wait_type("member_joined")
            await native.chat("from udp")
            await browser.wait_type("chat_line", text="from udp", member_id="native")
            await browser.send(
                {"type": "send_chat", "request_id": 9, "lobby_id": created["lobby_id"],
                 "text": "from the web"}
            )  # fmt: skip
            line = await native.next_event(ChatLine)
            if line.member_id == "native":  # (its own line, sent back to every member)
                line = await native.next_event(ChatLine)
            assert (line.member_id, line.text) == ("browser", "from the web")
            process.send_signal(signal.SIGTERM)
            closed = (await browser.wait_closed()).reason
            assert closed is not None
            assert (closed.code, closed.reason) == (1001, "server shutting down")
        assert await trio.to_thread.run_sync(process.wait, 30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--ws-tls-cert", "c.pem", "--ws-port", "9000"], "--ws-tls-key"),
        (["--ws-tls-key", "k.pem", "--ws-port", "9000"], "--ws-tls-cert"),
        (["--ws-address", "127.0.0.1"], "--ws-address"),
        (["--ws-port", "0"], "--ws-port"),
        (["--ws-port", "9000", "--ws-max-connections", "0"], "--ws-max-connections"),
        (["--ws-port", "9000", "--ws-tls-cert", "/nonexistent", "--ws-tls-key", "/nonexistent"],
         "--ws-tls-cert"),
        (["--lobby-ws-urls", "ws://127.0.0.1:9000"], "--lobby-ws-urls"),
        (["--ws-port", "9000", "--lobby-ws-urls", "ws://127.0.0.1:9000,ws://127.0.0.1:9001"],
         "--lobby-ws-urls"),  # two URLs for a ring of one
        (["--ws-port", "9000", "--lobby-ws-urls", "http://127.0.0.1:9000"], "--lobby-ws-urls"),
    ],
    ids=["cert-alone", "key-alone", "address-alone", "port-0", "max-0", "missing-cert",
         "urls-alone", "urls-count", "urls-scheme"],
)  # fmt: skip
def test_wrong_door_options_exit_2(args: list[str], names: str) -> None:
    result = run([*LOBBY, *args])
    assert result.returncode == 2, result.stderr
    assert names in result.stderr and "Error" in result.stderr


def test_a_door_port_in_use_exits_1() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run([*LOBBY, "--port", str(free_ports(range(40))), "--ws-port", str(port)])
    assert result.returncode == 1, result.stderr
    assert "echo-lobby: cannot serve" in result.stderr and "in use" in result.stderr


def test_the_help_names_the_door_options() -> None:
    text = run([*LOBBY, "--help"]).stdout
    for option in ("--ws-port", "--ws-address", "--ws-tls-cert", "--ws-tls-key",
                   "--ws-max-connections", "--lobby-ws-urls"):
        assert option in text
