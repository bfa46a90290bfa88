"""Handshakes of one transport to one server share one all-clients subscription.

Every reply on the all-clients channel goes to every subscription registered with the
server's control port. With one subscription per handshake, N handshakes in flight on one
transport made the server send each reply datagram N times to that host and the process read
N copies (measured before: 300 joins on one transport, half of them timed out). The hub
(`echo.session.client_hub`) gives them one subscription: one destination on the server.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

import echo.session as es
from echo.protocol import ECHO_STREAM_ID
from echo.session import client_hub
from echo.session.client import client_transport_config
from echo.session.client_handshake import HandshakeState
from echo.session.server import ALL_CLIENTS_TERM_LENGTH, SessionServer
from echo.transport import open_transport
from echo.transport.testing import MemoryNetwork
from tests.session.test_lost_contact import SERVER, echo_app, memory_server

CLIENTS = 24


def _config(max_clients: int = CLIENTS) -> es.ServerConfig:
    return es.ServerConfig(
        address=SERVER,
        port=9000,
        control_port=9001,
        clients_base_port=9010,
        max_clients=max_clients,
        max_per_ip=max_clients,
    )


async def test_handshakes_in_flight_on_one_transport_make_one_destination(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    net = MemoryNetwork()
    memory_server(monkeypatch, net)
    server = SessionServer(_config(), echo_app)
    seen: list[int] = []  # the all-clients destinations as each HELLO went out
    everyone_said_hello = trio.Event()

    def on_step(step: object) -> None:
        if getattr(step, "state", None) is HandshakeState.AWAITING_CONNECT:
            assert server.all_clients_pub is not None
            # Its log sized to its use: a CONNECT per HELLO for the server's life (the soak).
            assert server.all_clients_pub.term_length == ALL_CLIENTS_TERM_LENGTH
            seen.append(len(server.all_clients_pub.destinations))
            if len(seen) == CLIENTS:
                everyone_said_hello.set()

    with trio.fail_after(120):
        async with (
            trio.open_nursery() as nursery,
            open_transport(client_transport_config(), socket_factory=net) as transport,
        ):
            await nursery.start(server.run)
            opened: list[int] = []
            release, all_open = trio.Event(), trio.Event()
            async with trio.open_nursery() as clients:

                async def one(n: int) -> None:
                    async with es.connect(
                        SERVER, 9000, 9001, transport=transport, on_step=on_step
                    ) as session:
                        await session.send(b"%d" % n)
                        assert await session.receive() == b"%d" % n
                        opened.append(n)
                        if len(opened) == CLIENTS:
                            all_open.set()
                        await release.wait()

                # All of them before the first reply: the hub must hand each its own CONNECT.
                for n in range(CLIENTS):
                    clients.start_soon(one, n)
                await everyone_said_hello.wait()
                await all_open.wait()
                assert len(server.duologues) == CLIENTS
                release.set()
            assert sorted(opened) == list(range(CLIENTS))
            # One subscription for the lot: one destination on the server (there were as
            # many as handshakes in flight).
            assert set(seen) == {1}
            # The last handshake closed the hub, and its end-of-stream took us off.
            assert client_hub._hubs.get(transport, {}) == {}
            await trio.testing.wait_all_tasks_blocked()
            assert server.all_clients_pub is not None
            assert server.all_clients_pub.destinations == []
            nursery.cancel_scope.cancel()


async def test_a_refused_handshake_does_not_take_the_others_down(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server is full after 3: the others' refusals (ERROR replies on the shared
    subscription) reach each of them, and the 3 admitted work."""
    net = MemoryNetwork()
    memory_server(monkeypatch, net)
    server = SessionServer(_config(max_clients=3), echo_app)
    results: list[str] = []
    all_answered = trio.Event()
    with trio.fail_after(120):
        async with (
            trio.open_nursery() as nursery,
            open_transport(client_transport_config(), socket_factory=net) as transport,
        ):
            await nursery.start(server.run)
            release = trio.Event()

            async def one() -> None:
                try:
                    async with es.connect(SERVER, 9000, 9001, transport=transport) as session:
                        await session.send(b"ping")
                        assert await session.receive() == b"ping"
                        results.append("open")
                        if len(results) == 8:
                            all_answered.set()
                        await release.wait()
                except es.Rejected as error:
                    results.append(f"refused: {error}")
                    if len(results) == 8:
                        all_answered.set()

            async with trio.open_nursery() as clients:
                for _ in range(8):
                    clients.start_soon(one)
                await all_answered.wait()
                release.set()
            assert results.count("open") == 3
            assert len([r for r in results if r.startswith("refused")]) == 5
            nursery.cancel_scope.cancel()


async def test_a_handshake_after_the_hub_closed_opens_a_new_one(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    net = MemoryNetwork()
    memory_server(monkeypatch, net)
    server = SessionServer(_config(), echo_app)
    with trio.fail_after(120):
        async with (
            trio.open_nursery() as nursery,
            open_transport(client_transport_config(), socket_factory=net) as transport,
        ):
            await nursery.start(server.run)
            for n in range(3):
                async with es.connect(SERVER, 9000, 9001, transport=transport) as session:
                    assert client_hub._hubs.get(transport, {}) == {}
                    await session.send(b"%d" % n)
                    assert await session.receive() == b"%d" % n
            nursery.cancel_scope.cancel()


async def test_a_handshake_that_waited_on_a_hub_closed_meanwhile_opens_a_new_one(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A handshake found the hub while its first handshake was still opening it, and waited;
    # the first then ended at once (refused, cancelled), its hub's last view. The waiter was
    # attached to the closed hub and timed out on a subscription with no image (bench.churn:
    # 2-4 of ~400 sessions per 4 s, "waiting for the all-clients channel to connect").
    net = MemoryNetwork()
    memory_server(monkeypatch, net)
    server = SessionServer(_config(), echo_app)
    key = (SERVER, 9001, ECHO_STREAM_ID)
    with trio.fail_after(120):
        async with (
            trio.open_nursery() as nursery,
            open_transport(client_transport_config(), socket_factory=net) as transport,
        ):
            await nursery.start(server.run)
            hubs = client_hub._hubs.setdefault(transport, {})
            gate = trio.Event()  # holds the first hub's subscription opening
            add_subscription = transport.add_subscription

            async def held(*args: Any, **kwargs: Any) -> Any:
                await gate.wait()
                return await add_subscription(*args, **kwargs)

            monkeypatch.setattr(transport, "add_subscription", held)

            async def first() -> None:
                view = await client_hub.open_view(
                    transport, SERVER, 9001, ECHO_STREAM_ID, lambda image: None
                )
                await view.close()  # before the waiter runs: no checkpoint in between

            views: list[client_hub.AllClientsView] = []
            opened = trio.Event()

            async def second() -> None:
                views.append(
                    await client_hub.open_view(
                        transport, SERVER, 9001, ECHO_STREAM_ID, lambda image: None
                    )
                )
                opened.set()

            nursery.start_soon(first)
            while key not in hubs:  # the first has made the hub and waits at the gate
                await trio.lowlevel.checkpoint()
            opening = hubs[key]
            nursery.start_soon(second)
            while opening.ready.statistics().tasks_waiting < 1:  # the second waits on it
                await trio.lowlevel.checkpoint()
            gate.set()
            await opened.wait()
            view = views[0]
            assert view._hub is not opening
            assert hubs[key] is view._hub
            while not view.images:  # the server's all-clients channel reaches the new hub
                await view.wait_activity()
            await view.close()
            assert key not in hubs
            nursery.cancel_scope.cancel()
