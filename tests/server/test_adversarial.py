"""Spoofed HELLOs, evictions, dead peers: the server's defences of seeds/000 §4.2-§4.3."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import trio

from echo.client.client import ClientConfig, EchoClient
from echo.client.machine import ClientState, FailureKind
from echo.protocol import ECHO_STREAM_ID, Hello, decrypt_session, format_message
from echo.server.server import EchoServer
from echo.transport import TransportConfig, open_transport
from tests.server.test_server import Events, free_base, hello, join, server_config
from tests.test_cli import ports, server_process


async def test_a_hello_from_an_address_that_never_registered_is_dropped() -> None:
    base = free_base(6)
    config = server_config(base)
    events = Events()
    async with trio.open_nursery() as nursery, open_transport() as forger:
        server: EchoServer = await nursery.start(EchoServer(config, events=events).run)
        # Only a publication to the all-clients port: no MDC registration, so no cookie, as
        # for a HELLO sent with a forged source address.
        pub = await forger.add_publication(
            f"aeron:udp?endpoint=127.0.0.1:{config.port}", ECHO_STREAM_ID
        )
        await pub.wait_connected(timeout=5)
        await pub.send(format_message(Hello(1)))
        rejected = await events.wait_for("hello_rejected")
        assert rejected["reason"] == "unvalidated address"
        assert not server.duologues and server.per_ip.total == 0
        await server.stop()


async def test_an_unjoined_duologue_is_evicted_so_the_victim_connects_before_expiry() -> None:
    # Without address validation a spoofer can take the victim's per-IP slot with a HELLO it
    # never follows up. The victim must still get in long before the 30 s expiry.
    base = free_base(8)
    config = server_config(base, max_per_ip=1, duologue_expiry=30.0)
    transport = TransportConfig(validate_addresses=False)
    events = Events()
    async with trio.open_nursery() as nursery, open_transport(transport) as spoofer:
        server: EchoServer = await nursery.start(
            EchoServer(config, events=events, transport_config=transport).run
        )
        await hello(spoofer, config, pad=7)  # a duologue nobody will join
        assert server.per_ip.count("127.0.0.1") == 1
        await trio.sleep(0.6)  # past the eviction grace period
        started = trio.current_time()
        victim = EchoClient(
            ClientConfig(
                port=config.port, control_port=config.control_port, count=2, interval=0, timeout=5
            ),
            transport_config=transport,
        )
        await victim.run()
        assert victim.machine.state is ClientState.CLOSED
        assert trio.current_time() - started < 2.0
        closed = events.of("duologue_closed")
        assert closed[0]["reason"] == "evicted"
        await server.stop()


async def test_a_killed_client_frees_its_duologue_within_liveness_plus_expiry() -> None:
    base = free_base(6)
    config = server_config(base, duologue_expiry=1.0)
    transport = TransportConfig(image_liveness_timeout=1.0)
    events = Events()
    async with trio.open_nursery() as nursery:
        server: EchoServer = await nursery.start(
            EchoServer(config, events=events, transport_config=transport).run
        )
        first_echo = trio.Event()
        client = EchoClient(
            ClientConfig(port=config.port, control_port=config.control_port, interval=0.05),
            on_echo=lambda echo: first_echo.set(),
        )
        async with trio.open_nursery() as clients:
            clients.start_soon(client.run)
            with trio.fail_after(5):
                await first_echo.wait()
            # Pull the cable: the client's sockets vanish without an end-of-stream.
            assert client._transport is not None
            client._transport._driver.close()
            killed = trio.current_time()
            closed = await events.wait_for("duologue_closed", timeout=5)
            clients.cancel_scope.cancel()
        assert closed["reason"] == "client gone"
        assert trio.current_time() - killed < 1.0 + 1.0 + 0.5
        assert server.ports.in_use == 0 and server.per_ip.total == 0
        await server.stop()


def test_a_killed_server_makes_the_client_exit_4_within_the_liveness_timeout() -> None:
    base = free_base(12)
    with server_process(*ports(base), "--clients-base-port", str(base + 2)) as server:
        client = subprocess.Popen(
            [sys.executable, "-m", "echo.client.cli", *ports(base), "--interval", "0.1", "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(1.5)
        server.send_signal(signal.SIGKILL)
        server.wait()
        killed = time.monotonic()
        out, _ = client.communicate(timeout=30)
        elapsed = time.monotonic() - killed
    assert client.returncode == 4
    summary = json.loads(out)
    assert summary["received"] > 0
    # Either the publication lost its receiver (5 s without SMs) or the image its sender (10 s).
    assert "server" in summary["error"]
    assert elapsed < 10.0 + 2.0


async def test_joined_duologues_are_never_evicted() -> None:
    base = free_base(6)
    config = server_config(base, max_clients=1, duologue_expiry=30.0)
    async with trio.open_nursery() as nursery, open_transport() as holder:
        server: EchoServer = await nursery.start(EchoServer(config).run)
        _, connect = await hello(holder, config, pad=3)
        pub, _ = await join(holder, connect, decrypt_session(connect.encrypted_session, 3))
        await pub.wait_connected(timeout=5)
        # A joined duologue is never evicted: this client is told the truth.
        client = EchoClient(
            ClientConfig(port=config.port, control_port=config.control_port, count=1, timeout=5)
        )
        await client.run()
        failure = client.machine.failure
        assert failure is not None and failure.kind is FailureKind.REJECTED
        await server.stop()
