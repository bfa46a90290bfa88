"""The trio client (echo.client.client) against a real server on loopback: what it costs.

Many clients share a process (bots, load tests, B4): every wake-up of a client's task is paid
once per client, so these tests count them with a trio Instrument.
"""

from __future__ import annotations

import collections

import pytest
import trio
import trio.testing

from echo.client.application import ClientState, FailureKind
from echo.client.client import ClientConfig, EchoClient
from echo.server.server import EchoServer
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
            ClientConfig(
                port=config.port, control_port=config.control_port, interval=0.1, count=30
            )
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
