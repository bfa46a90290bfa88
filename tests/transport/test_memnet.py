"""The in-memory network itself (echo.transport.testing): addressing, readiness, and that each
link does what it says (loss, duplication, reordering, delay) at the rates it says, seeded."""

from __future__ import annotations

import errno
import socket

import pytest
import trio
import trio.testing

from echo.transport.driver.sockets import more_waiting
from echo.transport.testing import Datagram, Link, MemoryNetwork, MemorySocket

N = 10_000


def drain(sock: MemorySocket) -> list[tuple[bytes, tuple[str, int]]]:
    got = []
    while True:
        try:
            got.append(sock.recvfrom(65536))
        except BlockingIOError:
            return got


def numbers(received: list[tuple[bytes, tuple[str, int]]]) -> list[int]:
    return [int.from_bytes(data, "big") for data, _ in received]


async def test_unicast_in_order_with_the_senders_address() -> None:
    net = MemoryNetwork()
    a = net.open_socket(("127.0.0.1", 0))
    b = net.open_socket(("127.0.0.1", 9000))
    for i in range(5):
        assert a.sendto(bytearray(b"m%d" % i), ("localhost", 9000)) == 2
    got = drain(b)
    assert [data for data, _ in got] == [b"m%d" % i for i in range(5)]
    assert {source for _, source in got} == {a.getsockname()}
    assert a.getsockname()[1] >= 49152  # bound to 0: an ephemeral port
    assert net.counters.sent == net.counters.delivered == 5


async def test_a_memoryview_is_copied_when_sent() -> None:
    net = MemoryNetwork()
    a, b = net.open_socket(), net.open_socket(("127.0.0.1", 9000))
    buffer = bytearray(b"first")
    a.sendto(memoryview(buffer), ("127.0.0.1", 9000))
    buffer[:] = b"later"  # a term buffer reused after the send
    assert drain(b)[0][0] == b"first"


async def test_recvfrom_into_truncates_like_a_socket() -> None:
    net = MemoryNetwork()
    a, b = net.open_socket(), net.open_socket(("127.0.0.1", 9000))
    a.sendto(b"0123456789", ("127.0.0.1", 9000))
    buffer = bytearray(4)
    assert b.recvfrom_into(buffer) == (4, a.getsockname())
    assert buffer == b"0123"
    with pytest.raises(BlockingIOError):
        b.recvfrom_into(buffer)


async def test_binding_wildcards_conflicts_and_unroutable() -> None:
    net = MemoryNetwork()
    anywhere = net.open_socket(("0.0.0.0", 7000))
    with pytest.raises(OSError) as info:
        net.open_socket(("127.0.0.1", 7000))
    assert info.value.errno == errno.EADDRINUSE
    with pytest.raises(OSError):
        net.open_socket(("0.0.0.0", 7000))
    sender = net.open_socket(("0.0.0.0", 0))
    sender.sendto(b"x", ("127.0.0.1", 7000))
    sender.sendto(b"y", ("10.1.2.3", 7000))  # any address of the host reaches a wildcard
    sender.sendto(b"z", ("127.0.0.1", 7001))  # nobody there
    got = drain(anywhere)
    assert [data for data, _ in got] == [b"x", b"y"]
    # A wildcard-bound socket sends from the network's host address.
    assert got[0][1] == ("127.0.0.1", sender.getsockname()[1])
    assert net.counters.unroutable == 1
    anywhere.close()
    assert net.open_socket(("127.0.0.1", 7000)).getsockname() == ("127.0.0.1", 7000)


async def test_ipv6_addresses_come_as_four_tuples() -> None:
    net = MemoryNetwork()
    a = net.open_socket(("::1", 0), socket.AF_INET6)
    b = net.open_socket(("::", 9000), socket.AF_INET6)
    a.sendto(b"six", ("::1", 9000, 0, 0))
    data, source = b.recvfrom(100)
    assert data == b"six" and source == ("::1", a.getsockname()[1], 0, 0)
    assert b.getsockname() == ("::", 9000, 0, 0)


async def test_one_socket_reaches_several_destinations() -> None:
    # What an MDC publication does: the same datagram to each destination address.
    net = MemoryNetwork()
    publisher = net.open_socket()
    receivers = [net.open_socket(("127.0.0.1", 0)) for _ in range(3)]
    for i in range(3):
        for receiver in receivers:
            publisher.sendto(bytes([i]), receiver.getsockname())
    for receiver in receivers:
        assert [data for data, _ in drain(receiver)] == [b"\x00", b"\x01", b"\x02"]


async def test_readiness_follows_the_queue() -> None:
    net = MemoryNetwork()
    a, b = net.open_socket(), net.open_socket(("127.0.0.1", 9000))
    assert not more_waiting(b)  # type: ignore[arg-type]

    async def send_later() -> None:
        await trio.testing.wait_all_tasks_blocked()
        a.sendto(b"ding", ("127.0.0.1", 9000))
        a.sendto(b"dong", ("127.0.0.1", 9000))

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_later)
            await trio.lowlevel.wait_readable(b)
    assert more_waiting(b)  # type: ignore[arg-type]
    assert b.recvfrom(100)[0] == b"ding"
    assert more_waiting(b)  # type: ignore[arg-type]
    assert b.recvfrom(100)[0] == b"dong"
    assert not more_waiting(b)  # type: ignore[arg-type]
    with trio.move_on_after(0.05) as scope:  # nothing queued: not readable
        await trio.lowlevel.wait_readable(b)
    assert scope.cancelled_caught


async def test_a_closed_socket_refuses_calls_and_drops_arrivals() -> None:
    net = MemoryNetwork()
    a, b = net.open_socket(), net.open_socket(("127.0.0.1", 9000))
    b.close()
    b.close()  # twice is fine, as for a socket
    a.sendto(b"late", ("127.0.0.1", 9000))
    assert net.counters.unroutable == 1
    with pytest.raises(OSError):
        b.recvfrom(10)
    a.close()
    with pytest.raises(OSError):
        a.sendto(b"x", ("127.0.0.1", 9000))


async def test_a_full_receive_queue_drops_like_the_kernel() -> None:
    net = MemoryNetwork()
    a, b = net.open_socket(), net.open_socket(("127.0.0.1", 9000), rcvbuf=1000)
    for _ in range(15):
        a.sendto(bytes(100), ("127.0.0.1", 9000))
    assert len(drain(b)) == 10
    assert net.counters.overflowed == 5
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 200)
    for _ in range(3):
        a.sendto(bytes(100), ("127.0.0.1", 9000))
    assert len(drain(b)) == 2


async def test_udp_offload_is_refused() -> None:
    sock = MemoryNetwork().open_socket()
    with pytest.raises(OSError):
        sock.setsockopt(socket.SOL_UDP, 104, 1)  # UDP_GRO


def lossy_run(link: Link, seed: int) -> tuple[list[int], MemoryNetwork]:
    net = MemoryNetwork(seed=seed, link=link)
    a, b = net.open_socket(), net.open_socket(("127.0.0.1", 9000))
    for i in range(N):
        a.sendto(i.to_bytes(4, "big"), ("127.0.0.1", 9000))
    return numbers(drain(b)), net


async def test_loss_rate_and_order() -> None:
    got, net = lossy_run(Link(loss=0.2), seed=1)
    assert net.counters.lost == N - len(got)
    assert 0.18 * N < net.counters.lost < 0.22 * N
    assert got == sorted(got)  # loss alone never reorders
    # Same seed, same fate for every datagram; another seed, another.
    assert lossy_run(Link(loss=0.2), seed=1)[0] == got
    assert lossy_run(Link(loss=0.2), seed=2)[0] != got


async def test_duplication_rate() -> None:
    got, net = lossy_run(Link(duplicate=0.1), seed=3)
    assert len(got) == N + net.counters.duplicated
    assert 0.08 * N < net.counters.duplicated < 0.12 * N
    assert sorted(set(got)) == list(range(N))
    # With no delay the copy follows its original at once.
    assert got == sorted(got)


async def test_reordering_holds_datagrams_back_to_be_overtaken(
    autojump_clock: trio.testing.MockClock,
) -> None:
    net = MemoryNetwork(seed=4, link=Link(reorder=0.1, reorder_delay=0.005))
    a, b = net.open_socket(), net.open_socket(("127.0.0.1", 9000))
    count = 2000
    for i in range(count):
        a.sendto(i.to_bytes(4, "big"), ("127.0.0.1", 9000))
        await trio.sleep(0.001)  # pacing in virtual time: five more are sent while one waits
    await trio.sleep(0.01)  # virtual: past the last held-back datagram's delivery
    got = numbers(drain(b))
    assert sorted(got) == list(range(count))  # nothing lost or duplicated
    assert 0.08 * count < net.counters.reordered < 0.12 * count
    # Each held-back datagram arrives after one sent later than it, and only those do.
    late, highest = 0, -1
    for number in got:
        late += number < highest
        highest = max(highest, number)
    assert late == net.counters.reordered


async def test_per_link_delay_in_virtual_time(autojump_clock: trio.testing.MockClock) -> None:
    net = MemoryNetwork(link=Link(delay=0.05))
    net.set_link(Link(delay=0.5), destination=("127.0.0.1", 9002))
    net.set_link(Link(delay=2.0), source="127.0.0.2", destination="127.0.0.1")
    a = net.open_socket(("127.0.0.1", 0))
    far = net.open_socket(("127.0.0.2", 0))
    near_rx = net.open_socket(("127.0.0.1", 9001))
    slow_rx = net.open_socket(("127.0.0.1", 9002))
    assert net.link_for(("127.0.0.2", 5), ("127.0.0.1", 9002)).delay == 2.0  # last rule wins

    async def arrival(sock: MemorySocket) -> float:
        await trio.lowlevel.wait_readable(sock)
        return trio.current_time()

    start = trio.current_time()
    a.sendto(b"near", ("127.0.0.1", 9001))
    a.sendto(b"slow", ("127.0.0.1", 9002))
    assert net.in_flight == 2 and not near_rx.queued
    assert await arrival(near_rx) - start == pytest.approx(0.05)
    assert await arrival(slow_rx) - start == pytest.approx(0.5)
    drain(near_rx)
    start = trio.current_time()
    far.sendto(b"far", ("127.0.0.1", 9001))
    assert await arrival(near_rx) - start == pytest.approx(2.0)
    assert net.in_flight == 0


async def test_an_earlier_datagram_wakes_a_courier_waiting_for_a_later_one(
    autojump_clock: trio.testing.MockClock,
) -> None:
    net = MemoryNetwork()
    net.set_link(Link(delay=10.0), destination=("127.0.0.1", 9001))
    net.set_link(Link(delay=0.1), destination=("127.0.0.1", 9002))
    a = net.open_socket()
    slow, quick = net.open_socket(("127.0.0.1", 9001)), net.open_socket(("127.0.0.1", 9002))
    start = trio.current_time()
    a.sendto(b"slow", ("127.0.0.1", 9001))
    await trio.testing.wait_all_tasks_blocked()  # the courier sleeps until +10 s
    a.sendto(b"quick", ("127.0.0.1", 9002))
    await trio.lowlevel.wait_readable(quick)
    assert trio.current_time() - start == pytest.approx(0.1)
    assert not slow.queued


async def test_jitter_spreads_arrivals_within_its_bound(
    autojump_clock: trio.testing.MockClock,
) -> None:
    net = MemoryNetwork(seed=5, link=Link(delay=0.02, jitter=0.03))
    arrivals: list[float] = []
    a, b = net.open_socket(), net.open_socket(("127.0.0.1", 9000))
    start = trio.current_time()
    for i in range(200):
        a.sendto(i.to_bytes(4, "big"), ("127.0.0.1", 9000))
    while len(arrivals) < 200:
        await trio.lowlevel.wait_readable(b)
        arrivals += [trio.current_time() - start for _ in drain(b)]
    assert all(0.02 <= t <= 0.05 + 1e-9 for t in arrivals)
    assert max(arrivals) - min(arrivals) > 0.02


async def test_intercept_scripts_which_datagrams_are_lost() -> None:
    net = MemoryNetwork()
    seen: list[Datagram] = []

    def drop_every_third(datagram: Datagram) -> bool:
        seen.append(datagram)
        return len(seen) % 3 == 0

    net.intercept = drop_every_third
    a, b = net.open_socket(), net.open_socket(("127.0.0.1", 9000))
    for i in range(9):
        a.sendto(bytes([i]), ("127.0.0.1", 9000))
    assert [data for data, _ in drain(b)] == [bytes([i]) for i in range(9) if i % 3 != 2]
    assert net.counters.dropped_by_intercept == 3
    assert seen[0].source == a.getsockname() and seen[0].destination == ("127.0.0.1", 9000)


def test_link_rates_are_checked() -> None:
    with pytest.raises(ValueError, match="loss"):
        Link(loss=1.5)
    with pytest.raises(ValueError, match="delay"):
        Link(delay=-1)
