"""A client session whose server dies: LostContact within the documented bound, resumable or not.

The server is "killed" by cutting every datagram to and from its host on an in-memory network
(echo.transport.testing): a SIGKILL sends nothing more, and over a NAT no ICMP comes back
either. Virtual time (MockClock, autojump) makes the 5-16 s of timeouts take no real time, and
lets the test measure them exactly.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import trio
import trio.testing

import echo.session as es
import echo.session.server as server_module
from echo.session.client import PATH_CHECK_INTERVAL, lost_contact_bound, resume_window
from echo.session.timers import echo_timers
from echo.transport import open_transport
from echo.transport.testing import Link, MemoryNetwork

SERVER = "10.0.0.1"


async def echo_app(session: es.Session) -> None:
    async for data in session:
        await session.send(data)


class NotHeld:
    """echo.session.held.HeldPorts for a server on a memory network: nothing to hold."""

    def __init__(self, net: MemoryNetwork, address: str, ports: object) -> None:
        self.socket_factory = net

    def hold(self) -> None:
        pass

    def returned(self, ports: object) -> None:
        pass

    def sweep(self) -> None:
        pass

    def close(self) -> None:
        pass


def memory_server(monkeypatch: pytest.MonkeyPatch, net: MemoryNetwork) -> None:
    """Servers of this test open their transport on `net`."""
    monkeypatch.setattr(
        server_module, "open_transport", functools.partial(open_transport, socket_factory=net)
    )
    # Duologue ports are held on the kernel's sockets while a server runs: not here.
    monkeypatch.setattr(server_module, "HeldPorts", functools.partial(NotHeld, net))


def config(shared: bool = False) -> es.ServerConfig:
    return es.ServerConfig(
        address=SERVER,
        port=9000,
        control_port=9001,
        clients_base_port=9010,
        duologue_ports="shared" if shared else "per-client",
    )


def kill(net: MemoryNetwork) -> None:
    dead = Link(loss=1.0)
    net.set_link(dead, source=SERVER)
    net.set_link(dead, destination=SERVER)


async def _lost_after_kill(
    monkeypatch: pytest.MonkeyPatch, *, resume: bool, shared: bool = False, **options: Any
) -> tuple[float, es.Session, BaseException]:
    """Open a session, echo, kill the server, wait in `receive`: (seconds from the server's
    last datagram to the exception, the session, the exception)."""
    net = MemoryNetwork()
    memory_server(monkeypatch, net)
    server_config = config(shared)
    last_heard = [0.0]

    def note(datagram: Any) -> bool:
        link = net.link_for(datagram.source, datagram.destination)
        if datagram.source[0] == SERVER and link.loss < 1:
            last_heard[0] = trio.current_time()
        return False

    net.intercept = note
    with trio.fail_after(120):
        async with (
            trio.open_nursery() as nursery,
            open_transport(es.server_transport_config(), socket_factory=net) as transport,
        ):
            await nursery.start(es.SessionServer(server_config, echo_app).run)
            async with es.connect(
                SERVER,
                server_config.port,
                server_config.control_port,
                transport=transport,
                resume=resume,
                duologue_ports=server_config.duologue_ports,
                **options,
            ) as session:
                assert session.resumable is resume
                for i in range(3):
                    await session.send(b"%d" % i)
                    assert await session.receive() == b"%d" % i
                kill(net)
                with pytest.raises(es.SessionClosed) as caught:
                    await session.receive()
                raised_at = trio.current_time()
            nursery.cancel_scope.cancel()
    return raised_at - last_heard[0], session, caught.value


async def test_a_session_that_cannot_resume_is_lost_contact_soon_after_its_server_dies(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    took, session, error = await _lost_after_kill(monkeypatch, resume=False)
    config = echo_timers()
    assert isinstance(error, es.LostContact), error
    assert error.reason == "lost contact with the server"
    # Not before the publication's connection timeout (nothing made it up), and within the
    # documented bound: well before the image's 10 s liveness timeout.
    assert config.publication_connection_timeout - 1.0 <= took
    assert took <= lost_contact_bound(config, resumable=False) + 0.1
    assert lost_contact_bound(config, resumable=False) < config.image_liveness_timeout
    assert session.is_closed


@pytest.mark.parametrize("shared", [False, True], ids=["per-client", "shared"])
async def test_a_resumable_session_gives_up_within_the_resume_window(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch, shared: bool
) -> None:
    # It used to resume "until the image times out", but a resume stops watching the old image:
    # against a dead server the session stayed open for ever (the lobby worked around it).
    took, session, error = await _lost_after_kill(monkeypatch, resume=True, shared=shared)
    config = echo_timers()
    assert isinstance(error, es.LostContact), error
    assert session.counters.resumes == 0
    # It did try: it waited out the resume window after noticing the break.
    noticed_at_least = config.publication_connection_timeout - 1.0
    assert noticed_at_least + resume_window(config) <= took
    assert took <= lost_contact_bound(config, resumable=True) + PATH_CHECK_INTERVAL
    assert lost_contact_bound(config, resumable=True) <= 13.0 + 1e-9


async def test_a_send_waiting_out_a_broken_path_raises_lost_contact_too(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    net = MemoryNetwork()
    memory_server(monkeypatch, net)
    server_config = config()
    with trio.fail_after(120):
        async with (
            trio.open_nursery() as nursery,
            open_transport(es.server_transport_config(), socket_factory=net) as transport,
        ):
            await nursery.start(es.SessionServer(server_config, echo_app).run)
            async with es.connect(
                SERVER, server_config.port, server_config.control_port, transport=transport
            ) as session:
                await session.send(b"x")
                assert await session.receive() == b"x"
                kill(net)
                cut = trio.current_time()
                # Keep sending: the sends succeed into the window, then wait for the resume,
                # then fail: none of them hangs.
                with pytest.raises(es.LostContact):
                    while True:
                        await session.send(b"y")
                        await trio.sleep(0.5)
                assert trio.current_time() - cut <= lost_contact_bound(echo_timers()) + 1.0
            nursery.cancel_scope.cancel()


async def test_a_receiver_that_says_goodbye_is_told_apart_from_silence(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The session's watcher resumes or gives up only on silence; a server whose subscription
    # closed in order (end-of-stream) is left to its own stream's end (Publication.receiver_left).
    net = MemoryNetwork()
    uri = "aeron:udp?endpoint=127.0.0.1:7000"
    with trio.fail_after(60):
        async with (
            open_transport(socket_factory=net) as receiving,
            open_transport(socket_factory=net) as sending,
        ):
            subscription = await receiving.add_subscription(uri, 7)
            publication = await sending.add_publication(uri, 7)
            await publication.wait_connected()
            assert not publication.receiver_left
            await publication.send(b"x")
            assert (await subscription.receive()).data == b"x"
            await subscription.close()
            closed = trio.current_time()
            await publication.wait_disconnected()
            assert trio.current_time() - closed < 1.0  # at once, by its end-of-stream
            assert publication.receiver_left
            # Another stream whose receiver falls silent.
            await receiving.add_subscription(uri, 8)
            publication = await sending.add_publication(uri, 8)
            await publication.wait_connected()
            assert not publication.receiver_left
            net.set_link(Link(loss=1.0))
            cut = trio.current_time()
            await publication.wait_disconnected()
            assert not publication.receiver_left
            assert trio.current_time() - cut >= 4.0  # the connection timeout (5 s), not at once
