"""Channels over real echo.session sessions on loopback (skipped until echo.session exists)."""

from __future__ import annotations

import pytest
import trio

from echo.channels import ChannelsClosed, ChannelSpec, open_channels
from tests.server.test_server import free_base, server_config

es = pytest.importorskip("echo.session")

CONTROL, BULK = 0, 1
SPECS = [
    ChannelSpec(CONTROL, capacity=4096, priority=0),
    ChannelSpec(BULK, capacity=64 * 1000, priority=1),
]
BULK_MESSAGES = 200
CONSUME_SECONDS = 0.01  # 64 messages buffered = 0.64 s of backlog behind each new one


async def test_bulk_saturated_by_a_slow_consumer_while_control_keeps_answering() -> None:
    config = server_config(free_base(12))
    received: list[int] = []
    backed_up, all_in = trio.Event(), trio.Event()

    async def app(session: es.Session) -> None:
        try:
            async with open_channels(session, SPECS) as channels:

                async def control_echo() -> None:
                    async for message in channels[CONTROL]:
                        await channels[CONTROL].send(message.data)

                async def slow_bulk_consumer() -> None:
                    async for message in channels[BULK]:
                        received.append(int.from_bytes(message.data[:4], "big"))
                        if len(received) == 70:
                            backed_up.set()  # the sender has long filled the bulk buffer
                        if len(received) == BULK_MESSAGES:
                            all_in.set()
                        await trio.sleep(CONSUME_SECONDS)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(control_echo)
                    nursery.start_soon(slow_bulk_consumer)
        except ChannelsClosed:
            pass  # the client left

    rtts: list[float] = []
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(es.serve, config, app)
            async with es.connect(
                config.address, config.port, config.control_port, timeout=5
            ) as session:
                async with open_channels(session, SPECS) as channels:
                    bulk_done = trio.Event()

                    async def bulk_sender() -> None:
                        for i in range(BULK_MESSAGES):
                            await channels[BULK].send(i.to_bytes(4, "big") * 250)
                        bulk_done.set()

                    async with trio.open_nursery() as inner:
                        inner.start_soon(bulk_sender)
                        await backed_up.wait()
                        for i in range(20):
                            start = trio.current_time()
                            await channels[CONTROL].send(b"ping %d" % i)
                            assert (await channels[CONTROL].receive()).data == b"ping %d" % i
                            rtts.append(trio.current_time() - start)
                        assert not bulk_done.is_set()  # the pings ran while bulk was backed up
                    await all_in.wait()
            nursery.cancel_scope.cancel()
    assert received == list(range(BULK_MESSAGES))
    # A control message never waits behind the bulk backlog (0.64 s of processing).
    assert max(rtts) < 0.3, rtts


async def test_a_control_channel_on_its_own_stream_of_a_real_session() -> None:
    """own_stream over echo.session: the second stream uses the session's channel URIs (its
    ports) with stream id and session id + 1. Per-client duologue ports only: with shared
    ports the server's second stream never connects (docs/channels.md: not done)."""
    ports = "per-client"
    specs = [
        ChannelSpec(CONTROL, capacity=4096, own_stream=True),
        ChannelSpec(BULK, capacity=64 * 1000, priority=1),
    ]
    config = server_config(free_base(12), duologue_ports=ports)
    received: list[int] = []

    async def app(session: es.Session) -> None:
        try:
            async with open_channels(session, specs) as channels:

                async def control_echo() -> None:
                    async for message in channels[CONTROL]:
                        await channels[CONTROL].send(message.data)

                async def bulk_consumer() -> None:
                    async for message in channels[BULK]:
                        received.append(int.from_bytes(message.data[:4], "big"))

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(control_echo)
                    nursery.start_soon(bulk_consumer)
        except* ChannelsClosed:
            pass  # the client left (both tasks learn it at once)

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(es.serve, config, app)
            async with es.connect(
                config.address,
                config.port,
                config.control_port,
                timeout=5,
                duologue_ports=config.duologue_ports,
            ) as session:
                async with open_channels(session, specs) as channels:
                    for i in range(50):
                        await channels[BULK].send(i.to_bytes(4, "big") * 250)
                    for i in range(20):
                        await channels[CONTROL].send(b"ping %d" % i)
                        assert (await channels[CONTROL].receive()).data == b"ping %d" % i
                    await channels.wait_for(lambda: channels[BULK].guarantees == 64 * 1000)
            nursery.cancel_scope.cancel()
    assert received == list(range(50))


async def test_own_stream_on_shared_ports_is_refused_with_a_reason() -> None:
    """Shared duologue ports carry one stream per session (an Aeron response channel): a channel
    asking for a stream of its own is a usage error at once, not a session that times out."""
    from echo.channels import ChannelUsageError

    config = server_config(free_base(12), duologue_ports="shared")
    specs = [ChannelSpec(CONTROL, capacity=4096, own_stream=True)]

    async def app(session: es.Session) -> None:
        await session.wait_closed()

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(es.serve, config, app)
            async with es.connect(
                config.address, config.port, config.control_port, timeout=5, duologue_ports="shared"
            ) as session:
                with pytest.raises(ChannelUsageError, match="per-client duologue ports"):
                    async with open_channels(session, specs):
                        pass  # pragma: no cover - refused before this
                await session.send(b"still usable")  # the session itself is untouched
            nursery.cancel_scope.cancel()
