"""A server's transport is sized for its --max-clients: the 1,025th client is not refused.

The transport caps the images of one subscription and the destinations of one MDC publication
(1,024 by default, against floods of SETUPs and registrations). A session server holds one
image per client on its all-clients subscription (while it says HELLO) and, with shared
duologue ports, one per joined client on its duologue subscription: with the default caps a
server started with --max-clients 5000 stopped at 1,024 clients (measured: 1,024 connected,
140,416 SETUPs refused as "too_many_images"). `server_transport_config(max_clients=N)` raises
the caps to 2 N, never lowers them.
"""

from __future__ import annotations

import contextlib

import attrs
import pytest
import trio
import trio.testing

import echo.session as es
from echo.session.server import SessionServer
from echo.session.timers import echo_timers
from echo.transport import open_transport
from echo.transport.testing import MemoryNetwork
from tests.session.test_lost_contact import SERVER, memory_server


async def echo_app(session: es.Session) -> None:
    async for data in session:
        await session.send(data)


def test_the_caps_grow_with_max_clients_and_never_shrink() -> None:
    default = es.server_transport_config()
    assert (default.max_images, default.max_destinations) == (1024, 1024)
    assert es.server_transport_config(max_clients=100).max_images == 1024
    big = es.server_transport_config(max_clients=5000)
    assert (big.max_images, big.max_destinations) == (10_000, 10_000)
    roomy = attrs.evolve(echo_timers(), max_images=50_000, max_destinations=3)
    both = es.server_transport_config(roomy, max_clients=5000)
    assert (both.max_images, both.max_destinations) == (50_000, 10_000)


def test_a_session_server_sizes_its_transport_from_its_config() -> None:
    config = es.ServerConfig(max_clients=3000, duologue_ports="shared")
    server = SessionServer(config, echo_app)
    assert server.transport_config.max_images == 6000
    assert server.transport_config.max_destinations == 6000


@pytest.mark.parametrize("shared", [False, True], ids=["per-client", "shared"])
async def test_more_clients_than_the_base_caps_all_connect(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch, shared: bool
) -> None:
    # Caps of 2 stand in for the default 1,024: three clients need three images on the shared
    # duologue subscription and three destinations on the all-clients channel.
    net = MemoryNetwork()
    memory_server(monkeypatch, net)
    config = es.ServerConfig(
        address=SERVER,
        port=9000,
        control_port=9001,
        clients_base_port=9010,
        max_clients=3,
        max_per_ip=3,
        duologue_ports="shared" if shared else "per-client",
    )
    tight = attrs.evolve(echo_timers(), max_images=2, max_destinations=2)
    server = SessionServer(config, echo_app, transport_config=tight)
    with trio.fail_after(120):
        async with (
            trio.open_nursery() as nursery,
            open_transport(es.server_transport_config(), socket_factory=net) as transport,
        ):
            await nursery.start(server.run)
            async with contextlib.AsyncExitStack() as stack:
                sessions = [
                    await stack.enter_async_context(
                        es.connect(
                            SERVER,
                            9000,
                            9001,
                            transport=transport,
                            resume=False,
                            duologue_ports=config.duologue_ports,
                        )
                    )
                    for _ in range(3)
                ]
                for n, session in enumerate(sessions):
                    await session.send(b"%d" % n)
                    assert await session.receive() == b"%d" % n
                assert len(server.duologues) == 3
            nursery.cancel_scope.cancel()
