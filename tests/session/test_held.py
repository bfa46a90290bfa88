"""A server holds every duologue port from its start (echo.session.held): a second server on
the same range fails at its start, naming the port, and no longer starts to refuse its clients
as "server full"; the held ports are handed to the transport and held again after."""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Iterator
from typing import Any

import pytest
import trio

import echo.session as es
from echo.session.held import HeldPorts
from tests.ports import free_base


async def echo_app(session: es.Session) -> None:
    async for data in session:
        await session.send(data)


def config(base: int, shared: bool, **overrides: Any) -> es.ServerConfig:
    options: dict[str, Any] = {"clients_base_port": base + 2, "max_clients": 3, **overrides}
    return es.ServerConfig(
        port=base,
        control_port=base + 1,
        duologue_ports="shared" if shared else "per-client",
        **options,
    )


def bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@pytest.fixture
def held_v6() -> Iterator[int]:
    with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as holder:
        try:
            holder.bind(("::1", 0))
        except OSError:
            pytest.skip("no IPv6 loopback")
        yield holder.getsockname()[1]


def test_hold_binds_every_port_and_close_lets_them_go() -> None:
    base = free_base(4)
    held = HeldPorts("127.0.0.1", range(base, base + 4))
    held.hold()
    assert not any(bindable(port) for port in range(base, base + 4))
    held.close()
    assert all(bindable(port) for port in range(base, base + 4))


def test_a_port_taken_is_named_with_its_errno_and_nothing_stays_held() -> None:
    base = free_base(4)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as other:
        other.bind(("127.0.0.1", base + 2))
        held = HeldPorts("127.0.0.1", range(base, base + 4))
        with pytest.raises(OSError) as caught:
            held.hold()
    assert caught.value.errno == errno.EADDRINUSE
    assert str(caught.value) == (
        f"[Errno {errno.EADDRINUSE}] cannot bind UDP 127.0.0.1:{base + 2} (a duologue port): "
        + os.strerror(errno.EADDRINUSE)
    )
    assert all(bindable(port) for port in (base, base + 1, base + 3))


def test_an_ipv6_port_is_named_in_brackets(held_v6: int) -> None:
    with pytest.raises(OSError, match=rf"cannot bind UDP \[::1\]:{held_v6} \(a duologue port\)"):
        HeldPorts("::1", [held_v6]).hold()


def test_the_factory_hands_a_held_port_over_and_it_is_held_again_once_closed() -> None:
    base = free_base(2)
    held = HeldPorts("127.0.0.1", [base, base + 1])
    held.hold()
    sock = held.socket_factory(("127.0.0.1", base), socket.AF_INET, 65536, 65536)
    assert sock.getsockname() == ("127.0.0.1", base) and base not in held.idle
    held.returned([base])
    assert base in held.pending  # the transport still has it open: not held yet
    sock.close()
    held.sweep()
    assert base in held.idle and not held.pending and not bindable(base)
    held.close()
    assert bindable(base)


async def test_a_second_server_on_the_same_duologue_range_fails_at_start() -> None:
    for shared in (True, False):
        base = free_base(20)
        first = config(base, shared)
        async with trio.open_nursery() as nursery:
            server = await nursery.start(es.SessionServer(first, echo_app).run)
            # The first server has no client: its duologue ports are held all the same.
            second = config(base + 10, shared, clients_base_port=first.clients_base_port)
            with pytest.RaisesGroup(
                pytest.RaisesExc(
                    OSError,
                    match=f"cannot bind UDP 127.0.0.1:{first.clients_base_port} "
                    r"\(a duologue port\)",
                ),
                flatten_subgroups=True,
            ):
                await es.SessionServer(second, echo_app).run()
            # A session comes and goes; its ports are held again after.
            async with es.connect(
                "127.0.0.1",
                first.port,
                first.control_port,
                duologue_ports="shared" if shared else "per-client",
            ) as session:
                await session.send(b"hi")
                assert await session.receive() == b"hi"
            with trio.fail_after(10):
                while set(server._held.idle) != set(first.clients_port_range):
                    server._held.sweep()
                    await trio.sleep(0.01)
            assert not any(bindable(port) for port in first.clients_port_range)
            await server.stop()
        assert all(bindable(port) for port in first.clients_port_range)
