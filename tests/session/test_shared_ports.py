"""--duologue-ports shared on loopback: every duologue on the server's two duologue ports.

Each client is told the same two ports; the server holds four sockets whatever the number of
clients; a joined client hears only its own session; an unjoined or forged registration makes
the server send nothing; a client that does not speak response channels is refused, not
half-served.
"""

from __future__ import annotations

import socket
from typing import Any

import pytest
import trio
import trio.testing

import echo.session as es
from echo.protocol import ECHO_STREAM_ID
from echo.session.timers import echo_timers
from echo.transport import open_transport
from echo.transport.core.frames import SM_SETUP_FLAG, Setup, StatusMessage
from tests.server.test_server import Events, free_base, hello, server_config

SHARED = es.DuologuePorts.SHARED


async def echo_app(session: es.Session) -> None:
    async for message in session:
        await session.send(message)


def shared_config(base: int, **overrides: Any) -> es.ServerConfig:
    return server_config(base, duologue_ports="shared", **overrides)


def connect(config: es.ServerConfig, **options: Any) -> Any:
    options.setdefault("timeout", 5.0)
    options.setdefault("duologue_ports", SHARED)
    return es.connect(config.address, config.port, config.control_port, **options)


def test_the_config_names_two_ports_and_rejects_unknown_modes() -> None:
    config = shared_config(20000, max_clients=1000)
    assert config.shared and list(config.clients_port_range) == [20002, 20003]
    assert config.clients_port_count == 2
    with pytest.raises(ValueError, match="--duologue-ports"):
        server_config(20000, duologue_ports="sometimes")
    # A per-client server of 1,000 clients needs 2,000 ports; the same shared server two.
    assert server_config(20000, max_clients=1000).clients_port_count == 2000


async def test_several_clients_share_two_ports_and_each_hears_only_itself() -> None:
    config = shared_config(free_base(4), max_clients=8, max_per_ip=8)
    events = Events()
    async with trio.open_nursery() as nursery:
        server: es.SessionServer = await nursery.start(
            es.SessionServer(config, echo_app, events=events).run
        )
        async with (
            connect(config) as a,
            connect(config) as b,
            connect(config) as c,
            open_transport(echo_timers()) as shared_transport,
        ):
            async with connect(config, transport=shared_transport) as d:
                sessions = [a, b, c, d]
                assert len({s.session_id for s in sessions}) == 4
                data_port, control_port = config.clients_base_port, config.clients_base_port + 1
                assert {s.peer for s in sessions} == {("127.0.0.1", data_port)}
                created = events.of("duologue_created")
                assert {(f["data_port"], f["control_port"]) for f in created} == {
                    (data_port, control_port)
                }
                for round_ in range(3):
                    for s in sessions:
                        await s.send(b"%d from %d" % (round_, s.session_id))
                    for s in sessions:
                        assert await s.receive() == b"%d from %d" % (round_, s.session_id)
                assert server.transport is not None
                ports = {u.local_address[1] for u in server.transport._driver.sockets}
                assert ports == {config.port, config.control_port, data_port, control_port}
                assert server.ports.in_use == 2 * 4
        await _idle(server)
        assert server.ports.in_use == 0
        await server.stop()


async def _idle(server: es.SessionServer) -> None:
    with trio.fail_after(10):
        while server.duologues or server.tasks:  # noqa: ASYNC110 (no event for it)
            await trio.sleep(0.01)


async def test_an_unjoined_or_forged_registration_receives_nothing() -> None:
    # Validation off so the stranger's bare SETUP from 127.0.0.2 makes an image at all.
    config = shared_config(free_base(4))
    events = Events()
    async with trio.open_nursery() as nursery, open_transport(echo_timers()) as transport:
        server = await nursery.start(
            es.SessionServer(
                config,
                echo_app,
                events=events,
                transport_config=echo_timers(validate_addresses=False),
            ).run
        )
        _, reply = await hello(transport, config, pad=0)
        session_id = reply.encrypted_session  # pad 0: not encrypted
        assert (reply.data_port, reply.control_port) == (
            config.clients_base_port,
            config.clients_base_port + 1,
        )
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as stranger:
            stranger.bind(("127.0.0.2", 0))
            stranger.setblocking(False)
            setup = Setup(
                term_offset=0,
                session_id=session_id,
                stream_id=ECHO_STREAM_ID,
                initial_term_id=5,
                active_term_id=5,
                term_length=65536,
                mtu=1408,
                flags=0x80,
            ).encode()
            stranger.sendto(setup, ("127.0.0.1", reply.data_port))
            refused = await events.wait_for("image_refused")
            assert refused["source_ip"] == "127.0.0.2" and refused["reason"] == "wrong address"
            # The registration the guide's client would send, and one naming the session:
            # neither makes the response port send anything (no response publication exists).
            for session in (0, session_id):
                sm = StatusMessage(
                    session_id=session,
                    stream_id=0 if session == 0 else ECHO_STREAM_ID,
                    consumption_term_id=0,
                    consumption_term_offset=0,
                    receiver_window=0,
                    receiver_id=7,
                    flags=SM_SETUP_FLAG,
                ).encode()
                stranger.sendto(sm, ("127.0.0.1", reply.control_port))
            await trio.testing.wait_all_tasks_blocked(cushion=0.1)
            received = []
            while True:
                try:
                    received.append(stranger.recv(2048))
                except BlockingIOError:
                    break
            # What the data port owes any SETUP's source (its image's goodbye when refused) may
            # come back; nothing from the response port: no SETUP, no DATA.
            assert all(len(d) != 40 and (len(d) < 8 or d[6] != 0x01) for d in received)
        (duologue,) = server.duologues.values()
        assert duologue.publication is None and not duologue.ever_connected
        await server.stop()


async def test_a_per_client_client_is_refused_by_a_shared_server() -> None:
    config = shared_config(free_base(4))
    events = Events()
    async with trio.open_nursery() as nursery:
        server = await nursery.start(es.SessionServer(config, echo_app, events=events).run)
        with pytest.raises(es.HandshakeTimeout):
            async with connect(config, duologue_ports="per-client", timeout=2.0):
                pass
        refused = await events.wait_for("image_refused")
        assert refused["reason"] == "no response channel"
        await server.stop()


async def test_a_shared_port_held_by_another_program_fails_at_start() -> None:
    config = shared_config(free_base(4))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as blocker:
        blocker.bind(("127.0.0.1", config.clients_base_port + 1))
        with pytest.RaisesGroup(
            pytest.RaisesExc(OSError, match="a duologue port"), flatten_subgroups=True
        ):
            await es.SessionServer(config, echo_app).run()


async def test_a_shared_control_port_taken_while_idle_ends_that_duologue_not_the_server() -> None:
    """Between duologues the control port is held by a placeholder, and let go while a
    response publication binds it: another program (a client's ephemeral port on the same
    host) can take it then. A soak's echo-server died of it (exit 1, "cannot bind
    UDP ...: Address already in use"); now that duologue ends and the server goes on."""
    config = shared_config(free_base(4))
    control_port = config.clients_base_port + 1
    events = Events()
    async with trio.open_nursery() as nursery:
        server = await nursery.start(es.SessionServer(config, echo_app, events=events).run)
        assert server._held is not None
        server._held.idle.pop(control_port).close()  # the instant between, as in the race
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as blocker:
            blocker.bind(("127.0.0.1", control_port))
            with pytest.raises(es.HandshakeTimeout):
                async with connect(config, timeout=2.0):
                    pass
            closed = await events.wait_for("duologue_closed")
            assert "unavailable" in closed["reason"]
        # The other program let the port go: the next client is served.
        async with connect(config) as session:
            await session.send(b"still here")
            assert await session.receive() == b"still here"
        await server.stop()


async def test_a_session_on_shared_ports_resumes_and_loses_nothing() -> None:
    # Resume moves the client's request stream to a new path; on shared ports the answer is a
    # response publication tied to a request image, so the server opens a new one for the
    # new image (the client's new response subscription names itself in its SETUPs).
    config = shared_config(free_base(4))
    async with trio.open_nursery() as nursery:
        server = await nursery.start(es.SessionServer(config, echo_app).run)
        async with connect(config) as session:
            assert session.resumable
            await session.send(b"before")
            assert await session.receive() == b"before"
            (duologue,) = server.duologues.values()
            old_publication = duologue.publication
            await session.resume()
            for i in range(10):  # several in flight right after the move
                await session.send(b"%d" % i)
            assert [await session.receive() for _ in range(10)] == [b"%d" % i for i in range(10)]
            assert session.counters.resumes == 1 and server.resumes == 1
            assert duologue.publication is not old_publication
            assert "control-mode=response" in duologue.publication.channel
            await session.resume()  # and again
            await session.send(b"after")
            assert await session.receive() == b"after"
            assert duologue.session is not None and duologue.session.counters.resumes == 2
            # Still two duologue ports, still one duologue.
            assert len(server.duologues) == 1
        await server.stop()


async def test_a_plain_hello_on_shared_ports_gets_no_resume_secret() -> None:
    config = shared_config(free_base(4))
    async with trio.open_nursery() as nursery:
        server = await nursery.start(es.SessionServer(config, echo_app).run)
        async with connect(config, resume=False) as session:
            await session.send(b"still here")
            assert await session.receive() == b"still here"
            (duologue,) = server.duologues.values()
            assert duologue.slot.resume_secret is None
            assert not session.resumable
        await server.stop()
