"""Encrypted sessions over real sockets (and the memory network, to look at and tamper with
the datagrams): the key exchange in HELLO / CONNECT, the modes, pins, and what a forged,
replayed or tampered message does to a session."""

from __future__ import annotations

from typing import Any

import pytest
import trio

import echo.session as es
from echo.protocol import ECHO_STREAM_ID, Hello, format_message
from echo.session.crypto import OVERHEAD, ServerKey
from echo.session.keywire import HelloKey, append_hello_key, split_connect_key
from echo.session.server import ERROR_BAD_KEY, ERROR_ENCRYPTION_OFF, ERROR_ENCRYPTION_REQUIRED
from echo.transport import Transport, open_transport
from echo.transport.testing import Datagram, MemoryNetwork
from tests.server.test_server import Events, free_base, server_config

KEY = ServerKey.generate()


async def echo_app(session: es.Session) -> None:
    async for data in session:
        await session.send(data)


def config(**overrides: Any) -> es.ServerConfig:
    overrides.setdefault("key", KEY)
    return server_config(free_base(12), **overrides)


def connect(config: es.ServerConfig, **options: Any) -> Any:
    options.setdefault("timeout", 5.0)
    return es.connect(config.address, config.port, config.control_port, **options)


async def started(nursery: trio.Nursery, config: es.ServerConfig, **options: Any) -> Any:
    return await nursery.start(es.SessionServer(config, echo_app, **options).run)


async def echo_a_few(session: es.Session, count: int = 5) -> None:
    for i in range(count):
        await session.send(b"ECHO message %d" % i)
        assert await session.receive() == b"ECHO message %d" % i


# ---------------------------------------------------------------- modes and pins


@pytest.mark.parametrize("pin", ["public", "fingerprint"])
async def test_an_encrypted_session_echoes(pin: str) -> None:
    server_key = KEY.public_text if pin == "public" else "SHA256:" + KEY.fingerprint
    cfg = config(encryption="required")
    async with trio.open_nursery() as nursery:
        server = await started(nursery, cfg)
        async with connect(cfg, server_key=server_key) as session:
            assert session.cipher is not None
            await echo_a_few(session)
            (duologue,) = server.duologues.values()
            assert duologue.session.cipher is not None
            # The counters moved on both ends: what went out was sealed.
            assert session.cipher.sealer.counter == 5
            assert duologue.session.cipher.opener.window.highest == 4
        assert server.encrypted_sessions == 1
        nursery.cancel_scope.cancel()


async def test_required_refuses_a_plain_client_with_a_reason() -> None:
    cfg = config(encryption="required")
    events = Events()
    async with trio.open_nursery() as nursery:
        server = await started(nursery, cfg, events=events)
        with pytest.raises(es.Rejected) as refused:
            async with connect(cfg):
                pass
        assert refused.value.reason == ERROR_ENCRYPTION_REQUIRED
        assert server.key_refusals == 1
        assert events.of("hello_rejected")[-1]["reason"] == ERROR_ENCRYPTION_REQUIRED
        assert not server.duologues
        nursery.cancel_scope.cancel()


async def test_optional_serves_plain_and_encrypted_clients_side_by_side() -> None:
    cfg = config(encryption="optional")
    async with trio.open_nursery() as nursery:
        server = await started(nursery, cfg)
        async with connect(cfg) as plain, connect(cfg, server_key=KEY.fingerprint) as sealed:
            assert plain.cipher is None and sealed.cipher is not None
            await echo_a_few(plain)
            await echo_a_few(sealed)
        assert server.encrypted_sessions == 1
        nursery.cancel_scope.cancel()


async def test_the_default_is_optional_with_a_key_and_off_without() -> None:
    assert es.ServerConfig(key=KEY).encryption_mode is es.Encryption.OPTIONAL
    assert es.ServerConfig().encryption_mode is es.Encryption.OFF
    with pytest.raises(ValueError, match="--encryption required needs --key FILE"):
        es.ServerConfig(encryption="required")
    with pytest.raises(ValueError, match="--encryption must be"):
        es.ServerConfig(key=KEY, encryption="maybe")


async def test_off_refuses_an_encrypting_client_and_it_never_falls_back() -> None:
    cfg = config(encryption="off")
    async with trio.open_nursery() as nursery:
        server = await started(nursery, cfg)
        with pytest.raises(es.Rejected) as refused:
            async with connect(cfg, server_key=KEY.fingerprint):
                pass
        assert refused.value.reason == ERROR_ENCRYPTION_OFF
        assert server.hellos == 1  # one HELLO, no retry in the clear
        nursery.cancel_scope.cancel()


async def test_a_wrong_pin_is_refused_with_a_clear_message() -> None:
    other = ServerKey.generate()
    cfg = config(encryption="required")
    async with trio.open_nursery() as nursery:
        await started(nursery, cfg)
        with pytest.raises(es.Untrusted) as untrusted:
            async with connect(cfg, server_key=other.public_text):
                pass
        message = str(untrusted.value)
        assert "not the pinned one" in message
        assert KEY.short_fingerprint in message and other.short_fingerprint in message
        nursery.cancel_scope.cancel()


async def test_a_bad_pin_is_refused_before_any_packet() -> None:
    with pytest.raises(es.crypto.BadPin):
        async with es.connect("127.0.0.1", 1, 2, server_key="not a key"):
            pass


# ---------------------------------------------------------------- bad keys in HELLO


async def raw_hello(transport: Transport, cfg: es.ServerConfig, data: bytes) -> bytes:
    """Send `data` as our HELLO on the all-clients channel; the server's reply to us."""
    sub = await transport.add_subscription(
        f"aeron:udp?control=127.0.0.1:{cfg.control_port}|control-mode=dynamic", ECHO_STREAM_ID
    )
    pub = await transport.add_publication(
        f"aeron:udp?endpoint=127.0.0.1:{cfg.port}", ECHO_STREAM_ID
    )
    await pub.wait_connected(timeout=5)
    with trio.fail_after(5):
        while not sub.images:
            await sub.wait_activity()
    await pub.send(data)
    prefix = b"%d " % pub.session_id
    with trio.fail_after(5):
        while True:
            reply = (await sub.receive()).data
            if reply.startswith(prefix):
                break
    await sub.close()
    await pub.close(timeout=0)
    return bytes(reply)


@pytest.mark.parametrize(
    "public",
    [bytes(32), bytes([1]) + bytes(31), b"\xe0\xeb\x7a\x7c\x3b\x41\xb8\xae" + bytes(24)],
)
async def test_a_low_order_or_unusable_client_key_is_refused_before_allocation(
    public: bytes,
) -> None:
    cfg = config(encryption="required")
    async with trio.open_nursery() as nursery, open_transport() as transport:
        server = await started(nursery, cfg)
        hello = append_hello_key(format_message(Hello(0x1234)), HelloKey(public))
        reply = await raw_hello(transport, cfg, hello)
        if public[:2] == b"\xe0\xeb":
            # Not on the low-order list: an ordinary (if odd) key gets its session.
            assert b" CONNECT " in reply
        else:
            assert reply.endswith(b" ERROR " + ERROR_BAD_KEY.encode())
            assert server.key_refusals == 1
            assert server.ports.in_use == 0
        nursery.cancel_scope.cancel()


async def test_a_malformed_key_tail_is_a_bad_message() -> None:
    cfg = config(encryption="optional")
    async with trio.open_nursery() as nursery, open_transport() as transport:
        await started(nursery, cfg)
        reply = await raw_hello(transport, cfg, b"HELLO 12 +X 00FF")
        assert reply.endswith(b" ERROR bad message")
        nursery.cancel_scope.cancel()


async def test_the_connect_carries_the_server_key_tail_only_to_an_encrypting_hello() -> None:
    cfg = config(encryption="optional")
    async with trio.open_nursery() as nursery, open_transport() as transport:
        await started(nursery, cfg)
        plain = await raw_hello(transport, cfg, format_message(Hello(7)))
        assert b"+X" not in plain
        client = es.crypto.ClientHandshake(es.Pin(KEY.fingerprint))
        sealed = await raw_hello(
            transport, cfg, append_hello_key(format_message(Hello(7)), HelloKey(client.public))
        )
        split = split_connect_key(sealed)
        assert not isinstance(split, es.crypto.CryptoError) and split[1] is not None
        assert split[1].server_public == KEY.public
        nursery.cancel_scope.cancel()


# ---------------------------------------------------------------- messages refused


async def test_a_forged_message_closes_the_session_with_a_reason_and_is_counted() -> None:
    cfg = config(encryption="required")
    events = Events()
    async with trio.open_nursery() as nursery:
        server = await started(nursery, cfg, events=events)
        async with connect(cfg, server_key=KEY.fingerprint) as session:
            await echo_a_few(session, 2)
            # Injected into the stream as an attacker who can write Aeron frames would.
            await session.publication.send(b"\0" * 8 + b"ECHO not sealed at all!!")
            with pytest.raises(es.SessionClosed) as closed:
                await session.receive()
            assert closed.value.reason == "forged message"
        fields = await events.wait_for("message_refused")
        assert fields["reason"] == "forged message"
        assert server.messages_refused == 1
        nursery.cancel_scope.cancel()


async def test_a_replayed_message_closes_the_session() -> None:
    cfg = config(encryption="required")
    async with trio.open_nursery() as nursery:
        server = await started(nursery, cfg)
        async with connect(cfg, server_key=KEY.fingerprint) as session:
            assert session.cipher is not None
            first = session.cipher.seal(b"ECHO once")
            await session.publication.send(first)
            assert await session.receive() == b"ECHO once"
            await session.publication.send(first)  # the same sealed bytes, again
            with pytest.raises(es.SessionClosed) as closed:
                await session.receive()
            assert closed.value.reason == "replayed message"
        assert server.messages_refused == 1
        nursery.cancel_scope.cancel()


async def test_a_message_older_than_the_window_closes_the_session() -> None:
    cfg = config(encryption="required")
    async with trio.open_nursery() as nursery:
        server = await started(nursery, cfg)
        async with connect(cfg, server_key=KEY.fingerprint) as session:
            assert session.cipher is not None
            old = session.cipher.seal(b"ECHO old")
            session.cipher.sealer.counter += es.crypto.REPLAY_WINDOW
            await echo_a_few(session, 1)
            await session.publication.send(old)
            with pytest.raises(es.SessionClosed) as closed:
                await session.receive()
            assert closed.value.reason == "message older than the replay window"
        assert server.messages_refused == 1
        nursery.cancel_scope.cancel()


async def test_a_plain_client_cannot_forge_into_an_optional_servers_sealed_session() -> None:
    """The server's sealed replies are unreadable to anyone but the client: a plain client on
    the same server sees only its own session."""
    cfg = config(encryption="optional")
    async with trio.open_nursery() as nursery:
        await started(nursery, cfg)
        async with connect(cfg, server_key=KEY.fingerprint) as sealed, connect(cfg) as plain:
            await echo_a_few(sealed, 1)
            await echo_a_few(plain, 1)
            assert plain.session_id != sealed.session_id
        nursery.cancel_scope.cancel()


# ---------------------------------------------------------------- on the wire (memory network)

SERVER = "10.0.0.1"


def memory_server(monkeypatch: pytest.MonkeyPatch, net: MemoryNetwork) -> None:
    """Servers of this test open their transport on `net` (and hold no kernel ports)."""
    from tests.session.test_lost_contact import memory_server as on_memory

    on_memory(monkeypatch, net)


def memory_config(**overrides: Any) -> es.ServerConfig:
    return es.ServerConfig(
        address=SERVER, port=9000, control_port=9001, clients_base_port=9010, **overrides
    )


async def test_the_wire_carries_no_plaintext_and_frame_headers_stay_aeron(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    net = MemoryNetwork()
    memory_server(monkeypatch, net)
    seen: list[Datagram] = []
    net.intercept = lambda datagram: seen.append(datagram) and False
    secret = b"ECHO the launch code is 0000"
    cfg = memory_config(key=KEY, encryption="required")
    with trio.fail_after(30):
        async with (
            trio.open_nursery() as nursery,
            open_transport(es.server_transport_config(), socket_factory=net) as transport,
        ):
            await nursery.start(es.SessionServer(cfg, echo_app).run)
            async with es.connect(
                SERVER, 9000, 9001, transport=transport, server_key=KEY.fingerprint
            ) as session:
                for _ in range(3):
                    await session.send(secret)
                    assert await session.receive() == secret
            nursery.cancel_scope.cancel()
    duologue_data = [d.payload for d in seen if d.destination[1] >= 9010 or d.source[1] >= 9010]
    assert duologue_data, "no duologue traffic seen"
    assert not any(b"launch code" in payload for payload in (d.payload for d in seen))
    # Aeron DATA frames (type 0x01, version 0) still carry the sealed message: header intact,
    # payload = the plaintext length + OVERHEAD.
    sealed_frames = [
        p
        for p in duologue_data
        if len(p) >= 32
        and p[4] == 0  # version
        and int.from_bytes(p[6:8], "little") == 0x01  # HDR_TYPE_DATA
        and int.from_bytes(p[0:4], "little") == 32 + len(secret) + OVERHEAD
    ]
    assert len(sealed_frames) >= 6  # three each way (more if retransmitted)


async def test_the_same_run_in_the_clear_does_show_the_plaintext(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The capture test can fail: without encryption the text is on the wire."""
    net = MemoryNetwork()
    memory_server(monkeypatch, net)
    seen: list[bytes] = []
    net.intercept = lambda datagram: seen.append(datagram.payload) and False
    cfg = memory_config()
    with trio.fail_after(30):
        async with (
            trio.open_nursery() as nursery,
            open_transport(es.server_transport_config(), socket_factory=net) as transport,
        ):
            await nursery.start(es.SessionServer(cfg, echo_app).run)
            async with es.connect(SERVER, 9000, 9001, transport=transport) as session:
                await session.send(b"ECHO the launch code is 0000")
                await session.receive()
            nursery.cancel_scope.cancel()
    assert any(b"launch code" in payload for payload in seen)


async def test_a_bit_flipped_in_flight_closes_the_session(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    net = MemoryNetwork()
    memory_server(monkeypatch, net)
    flipped: list[bytes] = []

    def tamper(datagram: Datagram) -> bool:
        payload = datagram.payload
        # The first DATA frame towards the server's duologue port that carries "our" message.
        if (
            not flipped
            and datagram.destination[1] >= 9010
            and int.from_bytes(payload[0:4], "little") == 32 + 40  # a DATA frame of 40 bytes
            and int.from_bytes(payload[6:8], "little") == 0x01
        ):
            changed = bytearray(payload)
            changed[32 + 39] ^= 0x01  # the last byte of the tag
            flipped.append(bytes(changed))
            target = net.socket_at(datagram.destination)
            assert target is not None
            target.deliver(bytes(changed), datagram.source)
            return True
        return False

    net.intercept = tamper
    cfg = memory_config(key=KEY, encryption="required")
    with trio.fail_after(30):
        async with (
            trio.open_nursery() as nursery,
            open_transport(es.server_transport_config(), socket_factory=net) as transport,
        ):
            server = await nursery.start(es.SessionServer(cfg, echo_app).run)
            async with es.connect(
                SERVER, 9000, 9001, transport=transport, server_key=KEY.fingerprint
            ) as session:
                await session.send(b"x" * (40 - OVERHEAD))  # 40 bytes sealed
                with pytest.raises(es.SessionClosed) as closed:
                    await session.receive()
                assert closed.value.reason == "forged message"
            assert flipped
            assert server.messages_refused == 1
            nursery.cancel_scope.cancel()


# ---------------------------------------------------------------- resume keeps keys and counters


async def test_a_resumed_encrypted_session_keeps_its_keys_and_counters_go_on() -> None:
    """A resume moves the session to new streams with the same keys: the counters continue
    (no nonce is used twice under a key), and messages in flight across it arrive once."""
    cfg = config(encryption="required", duologue_ports="per-client")
    served: list[es.Session] = []

    async def app(session: es.Session) -> None:
        served.append(session)
        async for data in session:
            await session.send(b"got " + data)

    async with trio.open_nursery() as nursery:
        await nursery.start(es.SessionServer(cfg, app).run)
        async with connect(cfg, server_key=KEY.fingerprint, duologue_ports="per-client") as session:
            assert session.resumable and session.cipher is not None
            for i in range(5):
                await session.send(b"%d" % i)
                assert await session.receive() == b"got %d" % i
            await session.resume()
            for i in range(5, 15):
                await session.send(b"%d" % i)
            assert [await session.receive() for _ in range(5, 15)] == [
                b"got %d" % i for i in range(5, 15)
            ]
            (server_side,) = served
            assert server_side.counters.resumes == 1
            assert server_side.cipher is not None
            # 15 messages each way, counters 0..14, none refused, none reused.
            assert session.cipher.sealer.counter == 15
            assert server_side.cipher.sealer.counter == 15
            assert server_side.cipher.opener.window.highest == 14
            assert session.cipher.opener.window.highest == 14
            assert server_side.counters.refused == 0 and session.counters.refused == 0
        nursery.cancel_scope.cancel()
