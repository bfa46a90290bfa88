"""The Echo 2.0 server in process, against real transports on loopback."""

from __future__ import annotations

import collections
import gc
import weakref
from typing import Any

import pytest
import structlog
import structlog.testing
import trio

from echo.client.application import ClientState, FailureKind
from echo.client.client import ClientConfig, EchoClient
from echo.protocol import (
    ECHO_STREAM_ID,
    Connect,
    Hello,
    decrypt_session,
    format_message,
    parse_all_clients_reply_untrusted,
)
from echo.server.server import EchoServer
from echo.session.config import ServerConfig
from echo.transport import Subscription, Transport, open_transport
from tests.ports import free_base


class Events:
    def __init__(self) -> None:
        self.items: list[tuple[str, dict[str, Any]]] = []
        self._changed = trio.Event()

    def emit(self, event: str, **fields: Any) -> None:
        self.items.append((event, fields))
        self._changed.set()
        self._changed = trio.Event()

    async def wait_for(self, name: str, timeout: float = 5.0) -> dict[str, Any]:
        with trio.fail_after(timeout):
            while name not in self.names():
                await self._changed.wait()
        return self.of(name)[0]

    def names(self) -> list[str]:
        return [name for name, _ in self.items]

    def of(self, name: str) -> list[dict[str, Any]]:
        return [fields for event, fields in self.items if event == name]


def server_config(base: int, **overrides: Any) -> ServerConfig:
    values: dict[str, Any] = {
        "port": base,
        "control_port": base + 1,
        "clients_base_port": base + 2,
        "max_clients": 4,
        "max_per_ip": 3,
        "duologue_expiry": 1.0,
    }
    values.update(overrides)
    return ServerConfig(**values)


async def hello(transport: Transport, config: ServerConfig, pad: int) -> tuple[int, Connect]:
    """Do the all-clients half by hand: returns (our session, the server's CONNECT)."""
    sub = await transport.add_subscription(
        f"aeron:udp?control=127.0.0.1:{config.control_port}|control-mode=dynamic", ECHO_STREAM_ID
    )
    pub = await transport.add_publication(
        f"aeron:udp?endpoint=127.0.0.1:{config.port}", ECHO_STREAM_ID
    )
    await pub.wait_connected(timeout=5)
    with trio.fail_after(5):
        while not sub.images:
            await sub.wait_activity()
    await pub.send(format_message(Hello(pad)))
    with trio.fail_after(5):
        while True:
            reply = parse_all_clients_reply_untrusted((await sub.receive()).data)
            if isinstance(reply, Connect) and reply.client_session == pub.session_id:
                break
    await sub.close()
    await pub.close(timeout=0)
    return pub.session_id, reply


async def join(transport: Transport, connect: Connect, session_id: int):  # type: ignore[no-untyped-def]
    sub = await transport.add_subscription(
        f"aeron:udp?control=127.0.0.1:{connect.control_port}|control-mode=dynamic"
        f"|session-id={session_id}",
        ECHO_STREAM_ID,
    )
    pub = await transport.add_publication(
        f"aeron:udp?endpoint=127.0.0.1:{connect.data_port}|session-id={session_id}",
        ECHO_STREAM_ID,
    )
    return pub, sub


async def test_clients_echo_and_the_per_ip_limit_applies() -> None:
    base = free_base(12)
    config = server_config(base, max_per_ip=2)
    events = Events()
    async with trio.open_nursery() as nursery:
        server: EchoServer = await nursery.start(EchoServer(config, events=events).run)
        results: list[EchoClient] = []

        async def client(count: int | None, interval: float) -> None:
            c = EchoClient(
                ClientConfig(
                    port=config.port,
                    control_port=config.control_port,
                    count=count,
                    interval=interval,
                    timeout=5,
                )
            )
            results.append(c)
            await c.run()

        async with trio.open_nursery() as clients:
            clients.start_soon(client, 20, 0.05)
            clients.start_soon(client, 20, 0.05)
            with trio.fail_after(5):
                while len(events.of("duologue_created")) < 2:  # both hold a duologue now
                    await events._changed.wait()
            clients.start_soon(client, 1, 0.0)
        ok = [c for c in results if c.machine.state is ClientState.CLOSED]
        rejected = [c for c in results if c.machine.state is ClientState.FAILED]
        assert len(ok) == 2 and all(c.machine.received == 20 for c in ok)
        assert len(rejected) == 1
        failure = rejected[0].machine.failure
        assert failure is not None and failure.kind is FailureKind.REJECTED
        assert failure.message == "too many connections for IP address"
        await server.stop()
    assert events.of("hello_rejected")[0]["reason"] == "too many connections for IP address"
    assert server.ports.in_use == 0 and server.per_ip.total == 0 and len(server.sessions) == 0


async def test_server_full() -> None:
    base = free_base(6)
    config = server_config(base, max_clients=1, max_per_ip=5)
    async with trio.open_nursery() as nursery, open_transport() as a, open_transport() as b:
        server: EchoServer = await nursery.start(EchoServer(config).run)
        await hello(a, config, pad=1)
        sub = await b.add_subscription(
            f"aeron:udp?control=127.0.0.1:{config.control_port}|control-mode=dynamic",
            ECHO_STREAM_ID,
        )
        pub = await b.add_publication(f"aeron:udp?endpoint=127.0.0.1:{config.port}", ECHO_STREAM_ID)
        await pub.wait_connected(timeout=5)
        with trio.fail_after(5):
            while not sub.images:
                await sub.wait_activity()
        await pub.send(format_message(Hello(2)))
        expected = f"{pub.session_id} ERROR server full".encode()
        with trio.fail_after(5):
            while (await sub.receive()).data != expected:
                pass
        await server.stop()


async def test_a_duologue_nobody_joins_expires_and_its_resources_are_reused() -> None:
    base = free_base(6)
    config = server_config(base, max_clients=1, max_per_ip=1, duologue_expiry=0.5)
    events = Events()
    async with trio.open_nursery() as nursery, open_transport() as transport:
        server: EchoServer = await nursery.start(EchoServer(config, events=events).run)
        _, first = await hello(transport, config, pad=0x1234)
        assert server.ports.in_use == 2 and server.per_ip.count("127.0.0.1") == 1
        await events.wait_for("duologue_expired")
        assert server.ports.in_use == 0 and server.per_ip.total == 0 and len(server.sessions) == 0
        # The next client (same IP, limit 1, one port pair in all) gets the same ports back.
        _, second = await hello(transport, config, pad=0x5678)
        assert {second.data_port, second.control_port} == {first.data_port, first.control_port}
        await server.stop()
    closed = events.of("duologue_closed")
    assert closed[0]["reason"] == "expired"


async def test_bad_message_in_a_duologue_gets_an_error_and_closes_it() -> None:
    base = free_base(6)
    config = server_config(base)
    events = Events()
    async with trio.open_nursery() as nursery, open_transport() as transport:
        server: EchoServer = await nursery.start(EchoServer(config, events=events).run)
        pad = 0xCAFEBABE
        _, connect = await hello(transport, config, pad)
        session = decrypt_session(connect.encrypted_session, pad)
        pub, sub = await join(transport, connect, session)
        await pub.wait_connected(timeout=5)
        await pub.send(b"ECHO hi")
        with trio.fail_after(5):
            assert (await sub.receive()).data == b"ECHO hi"
        await pub.send(b"HELLO again")
        with trio.fail_after(5):
            assert (await sub.receive()).data == b"ERROR bad message"
        await events.wait_for("duologue_closed")
        assert not server.duologues
        assert [f["reason"] for f in events.of("duologue_closed")] == ["bad message"]
        await server.stop()


async def test_a_wrong_session_id_gets_nothing_and_the_duologue_expires() -> None:
    base = free_base(6)
    config = server_config(base, duologue_expiry=0.8)
    events = Events()
    async with trio.open_nursery() as nursery, open_transport() as transport:
        server: EchoServer = await nursery.start(EchoServer(config, events=events).run)
        pad = 0x0BADF00D
        _, connect = await hello(transport, config, pad)
        wrong = decrypt_session(connect.encrypted_session, pad) ^ 0x5A5A
        pub, sub = await join(transport, connect, wrong)
        with trio.move_on_after(0.6):
            await pub.wait_connected()
        assert not pub.is_connected
        assert pub.offer(b"ECHO anyone?") < 0
        await events.wait_for("duologue_expired")
        assert not sub.images
        assert "duologue_connected" not in events.names()
        await server.stop()


async def test_shutdown_tells_connected_clients() -> None:
    base = free_base(6)
    config = server_config(base)
    async with trio.open_nursery() as nursery:
        server: EchoServer = await nursery.start(EchoServer(config).run)
        third_echo = trio.Event()
        client = EchoClient(
            ClientConfig(
                port=config.port, control_port=config.control_port, interval=0.05, timeout=5
            ),
            on_echo=lambda echo: third_echo.set() if echo.index >= 3 else None,
        )
        async with trio.open_nursery() as clients:
            clients.start_soon(client.run)
            with trio.fail_after(5):
                await third_echo.wait()
            with structlog.testing.capture_logs() as logs:
                await server.stop()
        failure = client.machine.failure
        assert failure is not None and failure.kind is FailureKind.PROTOCOL
        assert "server shutting down" in failure.message
        # The client acknowledged everything, goodbye included: nothing to report.
        assert not [entry for entry in logs if entry["event"] == "goodbye_undelivered"]


async def test_shutdown_reports_a_goodbye_a_vanished_client_did_not_get() -> None:
    # Nothing offered before the stop is dropped in silence: a client that is gone (its
    # cable pulled) cannot acknowledge the goodbye, and the server's log says so.
    base = free_base(6)
    config = server_config(base)
    async with trio.open_nursery() as nursery:
        server: EchoServer = await nursery.start(EchoServer(config).run)
        echoed = trio.Event()
        client = EchoClient(
            ClientConfig(port=config.port, control_port=config.control_port, interval=0.05),
            on_echo=lambda echo: echoed.set(),
        )
        async with trio.open_nursery() as clients:
            clients.start_soon(client.run)
            with trio.fail_after(5):
                await echoed.wait()
            assert client._transport is not None
            client._transport._driver.close()  # gone, without an end-of-stream
            with structlog.testing.capture_logs() as logs:
                await server.stop()
            clients.cancel_scope.cancel()
    undelivered = [entry for entry in logs if entry["event"] == "goodbye_undelivered"]
    assert len(undelivered) == 1, logs
    assert undelivered[0]["problem"] == "not acknowledged by the client"


async def test_a_duologue_polls_its_subscription_once_per_echo(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # With 1,000 duologues every poll that finds nothing is paid 1,000 times over: after a
    # poll that returned less than a batch, and work that did not yield, the duologue waits
    # for its socket at once (it used to poll again first, finding nothing, once per echo).
    polls: collections.Counter[int] = collections.Counter()
    real_poll = Subscription.poll

    def counting_poll(self: Subscription, handler: Any, fragment_limit: int = 10) -> int:
        polls[id(self)] += 1
        return real_poll(self, handler, fragment_limit)

    monkeypatch.setattr(Subscription, "poll", counting_poll)
    base = free_base(6)
    config = server_config(base)
    async with trio.open_nursery() as nursery:
        server: EchoServer = await nursery.start(EchoServer(config).run)
        client = EchoClient(
            ClientConfig(port=config.port, control_port=config.control_port, count=50, interval=0)
        )
        nursery.start_soon(client.run)
        with trio.fail_after(5):
            while not server.duologues:  # noqa: ASYNC110 (no event for it)
                await trio.sleep(0.001)
        (duologue,) = server.duologues.values()
        subscription = duologue.subscription
        with trio.fail_after(10):
            while client.machine.received < 50:  # noqa: ASYNC110
                await trio.sleep(0.01)
        await server.stop()
    assert duologue.messages == 50
    # One poll per echo, plus a few for the wake-ups without a message (the client's probe
    # heartbeat, its status messages); two per echo before (102 here).
    assert 50 <= polls[id(subscription)] <= 1.3 * 50, polls


async def test_a_closed_duologue_is_freed_at_once_not_by_the_cyclic_collector() -> None:
    # Left to the cyclic collector, every closed duologue waited (with its sockets and term
    # buffers) for a full pass, which takes 100-200 ms when 1,000 duologues are open and
    # stalls every one of them: what clients leaving en masse cost the ones that stay.
    base = free_base(6)
    config = server_config(base)
    gc.collect()
    gc.disable()
    try:
        async with trio.open_nursery() as nursery:
            server: EchoServer = await nursery.start(EchoServer(config).run)
            client = EchoClient(
                ClientConfig(
                    port=config.port, control_port=config.control_port, count=3, interval=0
                )
            )
            nursery.start_soon(client.run)
            with trio.fail_after(5):
                while not server.duologues:  # noqa: ASYNC110 (no event for it)
                    await trio.sleep(0.001)
            (duologue,) = server.duologues.values()
            freed = weakref.ref(duologue)
            del duologue
            with trio.fail_after(5):
                while server.duologues or client.machine.state is not ClientState.CLOSED:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            # The duologue's task returns and drops the last reference (no cyclic collector:
            # gc is off); no event says when, so look, bounded.
            with trio.fail_after(5):
                while freed() is not None:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    finally:
        gc.enable()
