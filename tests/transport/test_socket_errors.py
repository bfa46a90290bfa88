"""ICMP port-unreachable on real sockets never ends a task (the io7m Aeron guide §4.2).

Linux reports an ICMP port-unreachable to a UDP socket only when the socket is *connected*
(or has IP_RECVERR set): the error is stored on the socket and the next `recvfrom` or `sendto`
raises ConnectionRefusedError. The transport's sockets are unconnected, so on a plain host
they never see one; these tests connect the driver's socket to a closed loopback port to make
the kernel deliver the error, as a connected socket, a future IP_RECVERR or another kernel
would. The driver's reader (`Driver._reader`) and send function (`SocketEndpoint._make_send`)
must count it and go on; without their `except OSError` clauses the error would end the
reader task or the offering task and so the whole transport.
"""

from __future__ import annotations

import select
import socket

import trio
import trio.testing

from echo.transport import Transport, open_transport
from echo.transport.core.offering import BURST_GAP
from echo.transport.driver.sockets import DriverSocket

STREAM = 1001


def closed_port() -> int:
    """A loopback UDP port nobody listens on (bound once, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def endpoint_of(transport: Transport, kind: str) -> DriverSocket:
    """The transport's only socket whose key starts with `kind` ("sub" or "pub")."""
    (sep,) = [sep for key, sep in transport._driver.endpoints.items() if key[0] == kind]
    return sep


def wait_for_socket_error(sock: socket.socket) -> None:
    """Block (no trio checkpoint, so no task can consume it) until the ICMP error is pending.

    POLLERR is reported whatever the requested events are; on loopback the ICMP reply comes
    back within microseconds, the 5 s are only a bound.
    """
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLPRI)
    events = poller.poll(5000)
    assert events and events[0][1] & select.POLLERR, f"no ICMP error reported: {events}"


async def test_port_unreachable_on_the_reader_is_counted_and_the_reader_goes_on() -> None:
    with trio.fail_after(20):
        async with open_transport() as transport:
            sub = await transport.add_subscription("aeron:udp?endpoint=127.0.0.1:0", STREAM)
            sep = endpoint_of(transport, "sub")
            counters = transport._driver.counters
            # A subscription with no image sends nothing, so the only syscall that can meet
            # the error is the reader's recvfrom_into.
            dead = closed_port()
            sep.sock.connect(("127.0.0.1", dead))
            sep.sock.send(b"are you there?")  # -> ICMP port unreachable -> ECONNREFUSED
            wait_for_socket_error(sep.sock)
            await trio.testing.wait_all_tasks_blocked()  # the reader woke, read, went back
            assert counters.receive_errors == 1
            assert counters.datagrams_received == 0

            # The same reader task still reads and hands datagrams to the endpoint: a
            # publication from this transport (re-connect the socket to it: a connected UDP
            # socket takes datagrams only from its peer) connects and is delivered.
            pub = await transport.add_publication(f"aeron:udp?endpoint={sub.local_address}", STREAM)
            pub_port = int(pub.local_address.rsplit(":", 1)[1])
            sep.sock.connect(("127.0.0.1", pub_port))
            await pub.wait_connected(timeout=5)
            await pub.send(b"after the ICMP error")
            message = await sub.receive()
            assert message.data == b"after the ICMP error"
            assert counters.receive_errors == 1


async def test_port_unreachable_on_send_is_counted_and_the_publication_goes_on() -> None:
    with trio.fail_after(30):
        async with open_transport() as transport:
            first = await transport.add_subscription("aeron:udp?endpoint=127.0.0.1:0", STREAM)
            port = int(first.local_address.rsplit(":", 1)[1])
            pub = await transport.add_publication(f"aeron:udp?endpoint=127.0.0.1:{port}", STREAM)
            await pub.wait_connected(timeout=5)
            await pub.send(b"before")
            assert (await first.receive()).data == b"before"
            sep = endpoint_of(transport, "pub")
            counters = transport._driver.counters
            sep.sock.connect(("127.0.0.1", port))
            # Pull the receiver's cable: its socket closes without an end-of-stream, so the
            # publication still counts it as a receiver (for its 5 s connection timeout) and
            # goes on sending. (After an orderly leave it would not offer data at all.)
            transport._driver.unregister(endpoint_of(transport, "sub"))

            # Provoke the ICMP error and wait for it without a checkpoint, so that the reader
            # cannot take it first: the next sendto, inside offer -> flush -> service -> send,
            # is the syscall that meets it.
            # An offer within BURST_GAP of the last flush waits for the timer loop instead
            # of sending at once; let that gap pass (a time, not an event, to wait for).
            await trio.sleep(2 * BURST_GAP)
            sep.sock.send(b"are you there?")
            wait_for_socket_error(sep.sock)
            errors_before = counters.send_errors, counters.receive_errors
            position = pub.offer(b"into the void")
            assert position > 0  # the offer itself succeeded; the datagram is lost
            assert counters.send_errors == errors_before[0] + 1
            assert counters.receive_errors == errors_before[1]

            # The timer loop and the reader are alive: a new receiver on the same port gets
            # the publication again and new messages arrive.
            second = await transport.add_subscription(
                f"aeron:udp?endpoint=127.0.0.1:{port}", STREAM
            )
            # A heartbeat is too small to elicit a SETUP (anti-amplification), data is: offer
            # until a message gets through (the first ones may precede the image).
            async with trio.open_nursery() as nursery:

                async def keep_offering() -> None:
                    while True:
                        assert pub.offer(b"after the ICMP error") > 0
                        await trio.sleep(0.05)  # pacing: one offer per 50 ms until one lands

                nursery.start_soon(keep_offering)
                assert (await second.receive()).data == b"after the ICMP error"
                nursery.cancel_scope.cancel()
