"""How a session ends, as a game sees it: `async for` raises LostContact when the peer fell
silent and stops when either side closed in order; `close()` returns at once whatever the
peer's state (a dead peer included), the goodbye still delivered by the transport.

The dead peer is a host cut off on the in-memory network (a SIGKILL sends nothing more) under
virtual time, so the durations asserted are exact; one test kills a real server process and
closes over real loopback sockets.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import trio
import trio.testing

import echo.session as es
from echo.session.client import client_transport_config
from echo.transport import open_transport
from echo.transport.driver.sockets import SocketFactory
from echo.transport.testing import Link, MemoryNetwork
from tests.ports import free_base
from tests.session.test_lost_contact import SERVER, config, kill, memory_server

CLIENT = "10.0.0.2"
#: what the brief of `close` promises, whatever the peer's state
CLOSE_BOUND = 0.05


async def echo_app(session: es.Session) -> None:
    async for data in session:
        await session.send(data)


def client_host(net: MemoryNetwork) -> SocketFactory:
    """Sockets on `net` for a client at CLIENT (so that it can be cut off alone)."""

    def factory(bind: tuple[str, int], family: int, rcvbuf: int, sndbuf: int) -> socket.socket:
        host, port = bind
        return net(
            (CLIENT if host in ("", "0.0.0.0", "::") else host, port), family, rcvbuf, sndbuf
        )

    return factory


def cut_off(net: MemoryNetwork, host: str) -> None:
    dead = Link(loss=1.0)
    net.set_link(dead, source=host)
    net.set_link(dead, destination=host)


async def test_async_for_raises_lost_contact_when_the_server_falls_silent(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    net = MemoryNetwork()
    memory_server(monkeypatch, net)
    server_config = config()
    seen: list[bytes] = []
    with trio.fail_after(120):
        async with (
            trio.open_nursery() as nursery,
            open_transport(es.server_transport_config(), socket_factory=net) as transport,
        ):
            await nursery.start(es.SessionServer(server_config, echo_app).run)
            async with es.connect(SERVER, 9000, 9001, transport=transport, resume=False) as session:
                await session.send(b"one")
                with pytest.raises(es.LostContact) as caught:
                    async for data in session:
                        seen.append(data)
                        kill(net)
            nursery.cancel_scope.cancel()
    assert seen == [b"one"]
    assert caught.value.reason == session.close_reason == "lost contact with the server"


@pytest.mark.parametrize("reason", ["", "game over"], ids=["end-of-stream", "with-reason"])
async def test_async_for_stops_cleanly_when_the_server_closes(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch, reason: str
) -> None:
    net = MemoryNetwork()
    memory_server(monkeypatch, net)

    async def one_then_close(session: es.Session) -> None:
        await session.send(b"hello")
        await session.close(reason)

    seen: list[bytes] = []
    with trio.fail_after(120):
        async with (
            trio.open_nursery() as nursery,
            open_transport(es.server_transport_config(), socket_factory=net) as transport,
        ):
            await nursery.start(es.SessionServer(config(), one_then_close).run)
            async with es.connect(SERVER, 9000, 9001, transport=transport) as session:
                async for data in session:  # ends without an exception
                    seen.append(data)
            nursery.cancel_scope.cancel()
    assert seen == [b"hello"]
    assert session.close_reason == (reason or "closed by the server")


async def test_a_goodbye_read_with_the_last_message_names_the_end_after_the_stream_ended(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server's last message and its goodbye (ERROR <reason>) are read in one poll; the
    # client's application handles the message while the server's stream ends (its image
    # goes, "closed by the server"). The goodbye, taken after that, still says why: a lobby
    # client told "closed by the server" instead of "identity refused: expired" exited 1
    # instead of 5, about one run in three.
    net = MemoryNetwork()
    memory_server(monkeypatch, net)

    async def refuse(session: es.Session) -> None:
        await session.send(b"welcome")
        await session.close("identity refused: expired")

    with trio.fail_after(120):
        async with (
            trio.open_nursery() as nursery,
            open_transport(es.server_transport_config(), socket_factory=net) as transport,
        ):
            await nursery.start(es.SessionServer(config(), refuse).run)
            async with es.connect(SERVER, 9000, 9001, transport=transport) as session:
                assert await session.receive() == b"welcome"
                assert len(session._batch) == 1  # the goodbye, read with it, not yet taken
                await session.wait_closed()  # the stream ended meanwhile
                with pytest.raises(es.PeerClosed) as ended:
                    await session.receive()
            nursery.cancel_scope.cancel()
    assert ended.value.reason == session.close_reason == "identity refused: expired"


@pytest.mark.parametrize("client_dies", [False, True], ids=["client-closes", "client-dies"])
async def test_the_server_side_loop_tells_a_goodbye_from_silence(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch, client_dies: bool
) -> None:
    net = MemoryNetwork()
    memory_server(monkeypatch, net)
    ended: list[BaseException | None] = []
    done = trio.Event()

    async def app(session: es.Session) -> None:
        try:
            async for data in session:
                await session.send(data)
        except es.LostContact as error:
            ended.append(error)
        else:
            ended.append(None)
        done.set()

    with trio.fail_after(120):
        async with (
            trio.open_nursery() as nursery,
            open_transport(es.server_transport_config(), socket_factory=net) as server_side,
            open_transport(client_transport_config(), socket_factory=client_host(net)) as mine,
        ):
            await nursery.start(es.SessionServer(config(), app).run)
            async with es.connect(SERVER, 9000, 9001, transport=mine, resume=False) as session:
                await session.send(b"x")
                assert await session.receive() == b"x"
                if client_dies:
                    cut_off(net, CLIENT)
                    await done.wait()
            await done.wait()
            del server_side
            nursery.cancel_scope.cancel()
    if client_dies:
        assert isinstance(ended[0], es.LostContact)
        assert ended[0].reason == "client gone"
    else:
        assert ended == [None]


async def test_close_returns_at_once_when_the_server_is_dead(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server dies without a word; the client closes before it could know: `close` does
    not wait for the acknowledgement that will never come."""
    net = MemoryNetwork()
    memory_server(monkeypatch, net)
    with trio.fail_after(120):
        async with (
            trio.open_nursery() as nursery,
            open_transport(es.server_transport_config(), socket_factory=net) as transport,
        ):
            await nursery.start(es.SessionServer(config(), echo_app).run)
            async with es.connect(SERVER, 9000, 9001, transport=transport) as session:
                await session.send(b"x")
                assert await session.receive() == b"x"
                kill(net)
                await session.send(b"unacknowledged")
                started = trio.current_time()
                await session.close("bye")
                took = trio.current_time() - started
                assert session.close_reason == "bye"
                left_at = trio.current_time()
            # A shared transport is not waited for either: the linger is the transport's.
            assert trio.current_time() - left_at < CLOSE_BOUND
            nursery.cancel_scope.cancel()
    assert took < CLOSE_BOUND


async def test_a_server_application_s_close_of_a_dead_client_returns_at_once(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    net = MemoryNetwork()
    memory_server(monkeypatch, net)
    took: list[float] = []
    go = trio.Event()

    async def app(session: es.Session) -> None:
        await session.send(b"hi")
        await go.wait()
        await session.send(b"never read")
        started = trio.current_time()
        await session.close("game over")
        took.append(trio.current_time() - started)

    with trio.fail_after(120):
        async with (
            trio.open_nursery() as nursery,
            open_transport(client_transport_config(), socket_factory=client_host(net)) as mine,
        ):
            await nursery.start(es.SessionServer(config(), app).run)
            async with es.connect(SERVER, 9000, 9001, transport=mine, resume=False) as session:
                assert await session.receive() == b"hi"
                cut_off(net, CLIENT)
                go.set()
                while not took:  # noqa: ASYNC110 (the app's own measurement is the event)
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    assert took[0] < CLOSE_BOUND


async def test_the_goodbye_and_the_last_messages_still_reach_a_live_server(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`close` no longer waits, yet nothing sent before it is dropped: the transport delivers
    it (and `connect`, on a transport of its own, lets it do so before closing it)."""
    net = MemoryNetwork()
    memory_server(monkeypatch, net)
    # Every datagram lost once in a while: the linger's retransmissions are needed.
    net.set_link(Link(loss=0.5), source=CLIENT)
    received: list[bytes] = []
    reasons: list[str | None] = []
    done = trio.Event()

    async def app(session: es.Session) -> None:
        async for data in session:
            received.append(data)
        reasons.append(session.close_reason)
        done.set()

    monkeypatch.setattr(
        "echo.session.client.open_transport",
        lambda config: open_transport(config, socket_factory=client_host(net)),
    )
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            await nursery.start(es.SessionServer(config(), app).run)
            async with es.connect(SERVER, 9000, 9001, resume=False) as session:
                for i in range(20):
                    await session.send(b"%d" % i)
                    await trio.sleep(0.001)  # a datagram each, each at the link's mercy
                await session.close("bye")
            await done.wait()
            nursery.cancel_scope.cancel()
    assert received == [b"%d" % i for i in range(20)]
    assert reasons == ["bye"]


#: an echo server in a process of its own, on ports BASE .. BASE+5 of 127.0.0.1
ECHO_SERVER = """
import sys, trio, echo.session as es

async def app(session):
    async for data in session:
        await session.send(data)

async def main(base):
    config = es.ServerConfig(
        address="127.0.0.1", port=base, control_port=base + 1, clients_base_port=base + 2,
        max_clients=4,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(es.SessionServer(config, app).run)
        print("ready", flush=True)

trio.run(main, int(sys.argv[1]))
"""


def test_close_on_a_killed_server_process_over_loopback() -> None:
    """Real sockets, a real server process killed with SIGKILL: `close` still returns at once
    (it used to wait out the 1 s linger for an acknowledgement that never came)."""
    base = free_base(6)
    server = subprocess.Popen(
        [sys.executable, "-c", ECHO_SERVER, str(base)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        for line in server.stdout:
            if line.strip() == "ready":
                break
        took = trio.run(_close_after_kill, server, base, base + 1)
    finally:
        server.kill()
        server.wait()
    print(f"close() on a killed server: {took * 1000:.2f} ms")
    assert took < 0.5


async def _close_after_kill(server: subprocess.Popen[str], port: int, control_port: int) -> float:
    with trio.fail_after(20):
        async with es.connect("127.0.0.1", port, control_port) as session:
            await session.send(b"ping")
            assert await session.receive() == b"ping"
            os.kill(server.pid, signal.SIGKILL)
            await trio.to_thread.run_sync(server.wait)
            await session.send(b"unacknowledged")
            started = time.perf_counter()
            await session.close("leaving")
            return time.perf_counter() - started


async def test_lost_contact_from_the_application_s_own_tasks_is_no_application_error(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An application that reads in a task of its own nursery gets LostContact wrapped in an
    ExceptionGroup: the session's end all the same, not a failure of the application."""
    net = MemoryNetwork()
    memory_server(monkeypatch, net)
    ended = trio.Event()

    async def app(session: es.Session) -> None:
        async def reader() -> None:
            async for data in session:
                await session.send(data)

        try:
            async with trio.open_nursery() as tasks:
                tasks.start_soon(reader)
        finally:
            ended.set()

    with trio.fail_after(120):
        async with (
            trio.open_nursery() as nursery,
            open_transport(client_transport_config(), socket_factory=client_host(net)) as mine,
        ):
            server = await nursery.start(es.SessionServer(config(), app).run)
            async with es.connect(SERVER, 9000, 9001, transport=mine, resume=False) as session:
                await session.send(b"x")
                assert await session.receive() == b"x"
                cut_off(net, CLIENT)
                await ended.wait()
            nursery.cancel_scope.cancel()
    assert server.application_errors == 0
