"""The driver's one readiness set (readiness.py) and its fallback, a reader task per socket."""

from __future__ import annotations

import select
import socket

import pytest
import trio

from echo.transport import open_transport
from echo.transport.driver import loop as driver_module
from echo.transport.driver.readiness import Readiness, open_readiness
from echo.transport.driver.sockets import more_waiting
from tests.transport.test_driver import STREAM, channel, free_port

pytestmark = pytest.mark.skipif(open_readiness() is None, reason="no epoll on this OS")


class _Held:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def fileno(self) -> int:
        return self.sock.fileno()


def _pair() -> tuple[socket.socket, socket.socket]:
    a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    a.bind(("127.0.0.1", 0))
    b.bind(("127.0.0.1", 0))
    return a, b


def test_ready_lists_exactly_the_sockets_with_datagrams_waiting() -> None:
    readiness: Readiness[_Held] | None = open_readiness()
    assert readiness is not None
    a, b = _pair()
    try:
        held_a, held_b = _Held(a), _Held(b)
        assert readiness.add(held_a) and readiness.add(held_b)
        assert held_a in readiness and held_b in readiness
        assert readiness.ready() == []
        a.sendto(b"x", b.getsockname())
        assert readiness.ready() == [held_b]
        # Level-triggered: still ready until it is read.
        assert readiness.ready() == [held_b]
        b.recv(16)
        assert readiness.ready() == []
        # A removed socket is not reported, however much waits on it.
        readiness.remove(held_b)
        assert held_b not in readiness
        a.sendto(b"y", b.getsockname())
        assert readiness.ready() == []
        readiness.remove(held_b)  # twice is harmless
        assert readiness.add(held_b)
        assert readiness.ready() == [held_b]
    finally:
        readiness.close()
        a.close()
        b.close()


def test_a_socket_without_a_descriptor_is_refused() -> None:
    readiness: Readiness[_Held] | None = open_readiness()
    assert readiness is not None
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.close()  # fileno() is -1 now
    try:
        assert not readiness.add(_Held(sock))
        assert readiness.ready() == []
    finally:
        readiness.close()


async def _echo_many(pairs: int) -> tuple[list[bytes], list[str]]:
    """`pairs` streams on their own ports, each sends three messages; what arrived, and the
    names of the transport's reader tasks."""
    got: list[bytes] = []
    with trio.fail_after(20):
        async with open_transport() as transport:
            streams = []
            for index in range(pairs):
                port = free_port()
                sub = await transport.add_subscription(channel(port), STREAM)
                pub = await transport.add_publication(channel(port), STREAM)
                streams.append((index, sub, pub))
            for index, _, pub in streams:
                await pub.wait_connected(timeout=5)
                for n in range(3):
                    await pub.send(b"%d:%d" % (index, n))
            for _, sub, _ in streams:
                for _ in range(3):
                    got.append((await sub.receive()).data)
            root = trio.lowlevel.current_root_task()
            names = _task_names(root)
    return got, [n for n in names if n.startswith("echo.transport.driver.loop.Driver._read")]


def _task_names(task: trio.lowlevel.Task) -> list[str]:
    names = [task.name]
    for nursery in task.child_nurseries:
        for child in nursery.child_tasks:
            names += _task_names(child)
    return names


def _expected(pairs: int) -> list[bytes]:
    return [b"%d:%d" % (index, n) for index in range(pairs) for n in range(3)]


async def test_one_reader_task_reads_every_socket() -> None:
    got, readers = await _echo_many(4)
    assert got == _expected(4)
    # 8 sockets (a send and a receive socket per stream), read by one task.
    assert [name.rsplit(".", 1)[-1] for name in readers] == ["_read_ready"]


async def test_without_epoll_each_socket_has_its_own_reader(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(driver_module, "open_readiness", lambda: None)
    got, readers = await _echo_many(4)
    assert got == _expected(4)
    assert len(readers) == 8
    assert {name.rsplit(".", 1)[-1] for name in readers} == {"_reader"}


async def _lend_and_give_back(monkeypatch: pytest.MonkeyPatch, addable: bool) -> list[str]:
    """Lend a subscription's socket to a waiting task, let it be given back, then receive
    again; the reader tasks' names at the end."""
    from echo.transport.driver.readiness import Readiness
    from tests.transport.test_lending import endpoint_of, lend, pair

    if not addable:
        monkeypatch.setattr(Readiness, "add", lambda self, udp: False)
    with trio.fail_after(20):
        async with open_transport() as sender, open_transport() as receiver:
            pub, sub = await pair(sender, receiver)
            await lend(pub, sub)
            udp = endpoint_of(sub)
            assert udp.shared_reader is addable
            while udp.lending.lent:  # noqa: ASYNC110 - the give-back is a timer of 1 ms
                await trio.sleep(0.001)
            await pub.send(b"after")
            assert (await sub.receive()).data == b"after"
            names = _task_names(trio.lowlevel.current_root_task())
    return [name for name in names if name.startswith("echo.transport.driver.loop.Driver._read")]


async def test_a_socket_given_back_is_read_by_the_set_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    readers = await _lend_and_give_back(monkeypatch, addable=True)
    # Two transports, one reader each; nothing else reads.
    assert [name.rsplit(".", 1)[-1] for name in readers] == ["_read_ready", "_read_ready"]


async def test_a_socket_outside_the_set_keeps_exactly_one_reader_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    readers = await _lend_and_give_back(monkeypatch, addable=False)
    # Every socket (a send and a receive socket) has its own task: none got a second one when
    # the lent socket came back.
    assert {name.rsplit(".", 1)[-1] for name in readers} == {"_reader"}
    assert len(readers) == 2


async def _two_at_once_after_quiet() -> list[bytes]:
    """Two datagrams reach a subscription's quiet socket together: a quiet socket is read
    once per wake-up (driver._drain, _READ_QUIET), so the second must come on the next pass."""
    port = free_port()
    with trio.fail_after(20):
        async with open_transport() as sender, open_transport() as receiver:
            uri = channel(port)
            sub = await receiver.add_subscription(uri, STREAM)
            pubs = [
                await sender.add_publication(f"{uri}|session-id={session}", STREAM)
                for session in (11, 12)
            ]
            for pub in pubs:
                await pub.wait_connected(timeout=5)
            await trio.sleep(0.1)  # both quiet now
            # One task, no checkpoint between: both datagrams are queued before any read.
            assert pubs[0].offer(b"first") > 0 and pubs[1].offer(b"second") > 0
            got = [(await sub.receive()).data, (await sub.receive()).data]
    return sorted(got)


async def test_datagrams_queued_together_on_a_quiet_socket_are_all_read() -> None:
    assert await _two_at_once_after_quiet() == [b"first", b"second"]


async def test_datagrams_queued_together_on_a_quiet_socket_are_all_read_without_epoll(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(driver_module, "open_readiness", lambda: None)
    assert await _two_at_once_after_quiet() == [b"first", b"second"]


def test_more_waiting_asks_the_kernel_for_the_queue_of_a_real_socket() -> None:
    # sockets.more_waiting on a kernel UDP socket: nothing queued, one queued, the queue read
    # empty again, and a closed socket (cannot tell: True, the read that follows says).
    a, b = _pair()
    with a, b:
        b.setblocking(False)
        assert not more_waiting(b)
        a.sendto(b"one", b.getsockname())
        a.sendto(b"two", b.getsockname())
        select.select([b], [], [], 5)
        assert more_waiting(b)
        assert b.recv(100) == b"one"
        select.select([b], [], [], 5)
        assert more_waiting(b)
        assert b.recv(100) == b"two"
        assert not more_waiting(b)
    assert more_waiting(b)
