"""The trio client (echo.client.client) against a real server on loopback: what it costs.

Many clients share a process (bots, load tests, B4): every wake-up of a client's task is paid
once per client, so these tests count them with a trio Instrument.
"""

from __future__ import annotations

import collections

import pytest
import trio
import trio.testing

from echo.client.application import ClientState, EchoReceived, FailureKind
from echo.client.client import ClientConfig, EchoClient
from echo.server.server import EchoServer
from echo.session.client import client_transport_config
from echo.transport import open_transport
from tests.server.test_server import free_base, server_config


class TaskSteps(trio.abc.Instrument):
    """Counts the steps (wake-ups) of every task by name."""

    def __init__(self) -> None:
        self.steps: collections.Counter[str] = collections.Counter()

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps[task.name] += 1

    def of_client(self) -> int:
        return sum(n for name, n in self.steps.items() if name.startswith("echo.client."))


async def test_waiting_for_a_server_that_does_not_answer_does_not_poll(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Nothing listens: the all-clients channel never connects and the client times out.
    base = free_base(2)
    steps = TaskSteps()
    trio.lowlevel.add_instrument(steps)
    client = EchoClient(ClientConfig(port=base, control_port=base + 1, timeout=5.0))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client.run)
    trio.lowlevel.remove_instrument(steps)
    failure = client.machine.failure
    assert failure is not None and failure.kind is FailureKind.TIMED_OUT
    assert "all-clients channel to connect" in failure.message
    # The client's own task wakes when the publication's endpoint is serviced (its SETUP every
    # 100 ms): about 50 times in 5 s. A task that looked every 50 ms would add 100 more.
    assert steps.of_client() < 100, steps.steps.most_common(5)


async def test_an_echoing_client_wakes_about_once_per_datagram() -> None:
    base = free_base(6)
    config = server_config(base)
    steps = TaskSteps()
    async with trio.open_nursery() as nursery:
        await nursery.start(EchoServer(config).run)
        client = EchoClient(
            ClientConfig(port=config.port, control_port=config.control_port, interval=0.1, count=30)
        )
        trio.lowlevel.add_instrument(steps)
        async with trio.open_nursery() as clients:
            clients.start_soon(client.run)  # its steps are counted under its name
        trio.lowlevel.remove_instrument(steps)
        nursery.cancel_scope.cancel()
    assert client.machine.state is ClientState.CLOSED
    assert client.machine.received == 30
    # Per echo the client's task wakes to send it, for the reply and for the server's probe
    # heartbeat after it (3.4 steps per echo here); a relay task per message and a watcher
    # woken by every event of the publication made it 6.
    assert steps.of_client() / 30 < 4.8, steps.steps.most_common(8)


async def test_the_duologue_opens_while_the_all_clients_publication_says_goodbye() -> None:
    # After its CONNECT a client leaves the all-clients channel at once (its subscription's
    # end-of-stream makes the server drop it as a destination: it stops receiving every other
    # client's reply) and opens its duologue without waiting for its all-clients publication
    # to drain and linger (up to 0.5 s, a round trip to a server that may be busy).
    base = free_base(6)
    config = server_config(base)
    at_join: dict[str, object] = {}

    def on_state(name: str, fields: dict[str, object]) -> None:
        if name == "joining_duologue":
            transport = client._transport
            assert transport is not None
            at_join["publications"] = [pub.uri for pub in transport._driver.publications()]
            at_join["subscriptions"] = len(transport._driver.subscriptions())

    client = EchoClient(
        ClientConfig(port=config.port, control_port=config.control_port, interval=0, count=3),
        on_state=on_state,
    )
    async with trio.open_nursery() as nursery:
        server: EchoServer = await nursery.start(EchoServer(config).run)
        await client.run()
        assert server.all_clients_pub is not None
        with trio.fail_after(2):
            while server.all_clients_pub.destinations:  # noqa: ASYNC110 (no event for it)
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert client.machine.state is ClientState.CLOSED and client.machine.received == 3
    assert at_join == {
        "publications": [f"aeron:udp?endpoint=127.0.0.1:{config.port}"],  # still saying goodbye
        "subscriptions": 0,  # gone already
    }


def test_a_message_the_protocol_cannot_carry_is_refused_in_the_config() -> None:
    # A library user hears of it when building the config, not after the handshake.
    for text in ("two\nlines", "a\u2028b", "x" * 2000):
        with pytest.raises(ValueError):
            ClientConfig(message=text)
    assert ClientConfig(message="fine").message == "fine"


async def test_clients_sending_from_their_own_addresses_are_counted_per_address() -> None:
    # `source` binds the client's sockets to one of the host's addresses (every 127/8 address
    # is this host's): the server's per-IP limit then counts each source on its own, as it
    # counts clients behind different NATs. One connection per address here (max_per_ip=1):
    # clients from 127.0.0.2 and 127.0.0.3 both echo, a second one from 127.0.0.2 is refused.
    base = free_base(6)
    config = server_config(base, max_per_ip=1)
    echoing = {"127.0.0.2": trio.Event(), "127.0.0.3": trio.Event()}

    def make(source: str, count: int) -> EchoClient:
        def on_echo(echo: EchoReceived) -> None:
            echoing[source].set()

        return EchoClient(
            ClientConfig(
                port=config.port,
                control_port=config.control_port,
                interval=0.05,
                count=count,
                source=source,
            ),
            on_echo=on_echo,
        )

    first, second, third = make("127.0.0.2", 40), make("127.0.0.3", 40), make("127.0.0.2", 1)
    async with trio.open_nursery() as nursery:
        await nursery.start(EchoServer(config).run)
        async with trio.open_nursery() as clients:
            clients.start_soon(first.run)
            clients.start_soon(second.run)
            # the third starts once the first two echo, while they hold their slots
            with trio.fail_after(20):  # old code: the second is refused (one address)
                for event in echoing.values():
                    await event.wait()
            await third.run()
        nursery.cancel_scope.cancel()
    assert first.machine.received == 40 and second.machine.received == 40
    failure = third.machine.failure
    assert failure is not None and failure.kind is FailureKind.REJECTED, failure
    assert "too many connections" in failure.message
    assert third.machine.received == 0


def test_a_source_that_is_not_an_address_is_refused_in_the_config() -> None:
    with pytest.raises(ValueError, match="source must be an IP address"):
        ClientConfig(source="my-laptop")


async def test_clients_sharing_one_transport_each_hold_a_session_of_their_own() -> None:
    # A load generator's or a game's bots: three clients on one transport the caller opened.
    # Each runs its own handshake and duologue (three HELLOs to the server, three different
    # duologue session ids), and the transport outlives them: a client does not close what it
    # was lent.
    base = free_base(6)
    config = server_config(base)  # up to 3 per address, 4 in all
    async with trio.open_nursery() as nursery:
        server: EchoServer = await nursery.start(EchoServer(config).run)
        async with open_transport(client_transport_config()) as transport:
            clients = [
                EchoClient(
                    ClientConfig(
                        port=config.port, control_port=config.control_port, interval=0.05, count=20
                    ),
                    transport=transport,
                )
                for _ in range(3)
            ]
            with trio.fail_after(30):
                async with trio.open_nursery() as running:
                    for client in clients:
                        running.start_soon(client.run)
            assert server.hellos == 3
            assert all(client.transport is transport for client in clients)
            # still usable after them: one more client on it
            late = EchoClient(
                ClientConfig(port=config.port, control_port=config.control_port, count=1),
                transport=transport,
            )
            await late.run()
        nursery.cancel_scope.cancel()
    for client in [*clients, late]:
        assert client.machine.state is ClientState.CLOSED, client.machine.failure
    assert [client.machine.received for client in clients] == [20] * 3
    assert late.machine.received == 1
    assert len({client.machine.duologue_session for client in clients}) == 3


def test_a_shared_transport_does_not_take_a_source_or_a_config_of_its_own() -> None:
    transport = object()  # refused before it is looked at
    with pytest.raises(ValueError, match="bound_to"):
        EchoClient(ClientConfig(source="127.0.0.2"), transport=transport)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="own transport"):
        EchoClient(
            ClientConfig(),
            transport=transport,  # type: ignore[arg-type]
            transport_config=client_transport_config(),
        )
