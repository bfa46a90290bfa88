"""Spoofed HELLOs, evictions, dead peers: the server's defences of the io7m
Aeron guide §4.2-§4.3."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import pytest
import trio

from echo.client.application import ClientState, FailureKind
from echo.client.client import ClientConfig, EchoClient
from echo.protocol import ECHO_STREAM_ID, Hello, decrypt_session, format_message
from echo.server.server import EchoServer
from echo.transport import TransportConfig, open_transport
from tests.netlab.fixtures import fresh_netns  # noqa: F401 (a fixture)
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


@pytest.mark.netns
async def test_a_killed_client_frees_its_duologue_within_liveness_plus_expiry(
    fresh_netns: Callable[[], int],  # noqa: F811
) -> None:
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
        # Another client echoes throughout: the server keeps serving it while the killed
        # client's ports answer every heartbeat and SM with an ICMP port unreachable.
        other_echoes: list[float] = []
        other_started = trio.Event()
        other = EchoClient(
            ClientConfig(port=config.port, control_port=config.control_port, interval=0.02),
            on_echo=lambda echo: (other_echoes.append(trio.current_time()), other_started.set()),
        )
        other_done = trio.Event()

        async def run_other() -> None:
            await other.run()
            other_done.set()

        async with trio.open_nursery() as clients:
            clients.start_soon(client.run)
            clients.start_soon(run_other)
            with trio.fail_after(5):
                await first_echo.wait()
                await other_started.wait()
            # Pull the cable: the client's sockets vanish without an end-of-stream.
            assert client._transport is not None
            client._transport._driver.close()
            killed = trio.current_time()
            unreachables_before = fresh_netns()
            closed = await events.wait_for("duologue_closed", timeout=5)
            gone = trio.current_time()
            unreachables = fresh_netns() - unreachables_before
            assert other.machine.state is ClientState.ECHOING
            other.stop()
            with trio.fail_after(5):
                await other_done.wait()
            clients.cancel_scope.cancel()  # the killed client's run, which nothing will end
        assert closed["reason"] == "client gone"
        assert gone - killed < 1.0 + 1.0 + 0.5
        # The kernel really did answer: heartbeats every 0.1 s and SMs every 0.2 s to two
        # closed ports for over a second make a dozen or more.
        assert unreachables >= 5, unreachables
        # ...and the other client got its echoes all along (one every ~20 ms).
        served = [when for when in other_echoes if killed <= when <= gone]
        assert len(served) >= (gone - killed) / 0.02 / 4, (len(served), gone - killed)
        assert other.machine.state is ClientState.CLOSED
        with trio.fail_after(5):
            while len(events.of("duologue_closed")) < 2:  # the other client's orderly close
                await events._changed.wait()
        assert server.ports.in_use == 0 and server.per_ip.total == 0
        await server.stop()


def wait_for_first_echo(client: subprocess.Popen[str]) -> None:
    """Until the client (console output) prints its first echo: it holds a duologue and has
    been served. Its own connect timeout ends it (and this wait) if it never gets there."""
    assert client.stdout is not None
    for line in client.stdout:
        if line.startswith("echo 1:"):
            return
    raise AssertionError(f"client ended before echoing: {client.wait()} {client.stderr.read()!r}")  # type: ignore[union-attr]


def test_a_killed_server_makes_the_client_exit_4_within_the_liveness_timeout() -> None:
    base = free_base(12)
    with server_process(*ports(base), "--clients-base-port", str(base + 2)) as server:
        client = subprocess.Popen(
            [sys.executable, "-m", "echo.client.cli", *ports(base), "--interval", "0.1"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_for_first_echo(client)  # connected and echoing: the server dies mid-stream
        server.send_signal(signal.SIGKILL)
        server.wait()
        killed = time.monotonic()
        _, err = client.communicate(timeout=30)
        elapsed = time.monotonic() - killed
    assert client.returncode == 4, err
    # Either the publication lost its receiver (5 s without SMs) or the image its sender (10 s).
    assert "server" in err.splitlines()[-1]
    assert elapsed < 10.0 + 2.0


def test_a_server_killed_and_restarted_on_the_same_ports_makes_the_old_client_exit_4() -> None:
    # The restarted server knows nothing of the old duologue: the old client must say it lost
    # contact within the liveness timeout, not hang or carry on with the new server on stale
    # state. The ports must be reusable at once: a new client, started while the old one is
    # still sending to its old duologue ports, is served throughout, and none of the old
    # client's traffic leaks into its duologue. With one client at most, the duologue port
    # pool is exactly two ports, so the new server hands the old client's ports to the new one.
    base = free_base(12)
    server_args = (*ports(base), "--clients-base-port", str(base + 2), "--max-clients", "1")

    def client(*args: str, console: bool = False) -> subprocess.Popen[str]:
        output = () if console else ("--json",)
        return subprocess.Popen(
            [sys.executable, "-m", "echo.client.cli", *ports(base), *args, *output],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    with server_process(*server_args) as first:
        old = client("--interval", "0.1", console=True)
        wait_for_first_echo(old)  # connected and echoing: the server dies mid-stream
        first.send_signal(signal.SIGKILL)
        first.wait()
        killed = time.monotonic()
        with server_process(*server_args) as second:
            # 100 echoes 0.1 s apart outlast the old client's 5-10 s of stale sending.
            new = client("--count", "100", "--interval", "0.1", "--timeout", "5")
            _, err = old.communicate(timeout=30)
            elapsed = time.monotonic() - killed
            new_out, new_err = new.communicate(timeout=60)
            assert second.poll() is None
    assert old.returncode == 4, err
    assert "lost contact with the server" in err.splitlines()[-1]
    # The publication loses its receiver after 5 s without SMs, the image its sender after 10.
    assert elapsed < 10.0 + 2.0
    assert new.returncode == 0, new_err
    fresh = json.loads(new_out)
    assert fresh["received"] == 100 and fresh["error"] is None


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
