"""An in-memory UDP network for tests: lossy, duplicating, reordering, delayed, seeded.

`MemoryNetwork` is a `socket_factory` for `open_transport` (sockets.SocketFactory): every
transport opened with the same network talks over it instead of the kernel, so a test of the
transport, or of an application built on it (sessions, a game server), can lose, duplicate,
reorder and delay datagrams on purpose, reproducibly (one seeded generator per network), and
run its timers in virtual time under `trio.testing.MockClock(autojump_threshold=0)`
(pytest-trio's `autojump_clock`): a 5 s liveness timeout then takes no real time at all.

It lives in the package, not in tests/, because it is as useful to a game developer testing
their own server under loss as it is to echo's own tests; it is never imported by the product.

Precedent: trio's DTLS tests run over `trio.testing._fake_net.FakeNet` (a `route_packet`
hook that drops, duplicates and delays) and aioquic's tests move datagrams over scripted links.
The driver waits on its sockets with `trio.lowlevel.wait_readable`, which needs a file
descriptor, so each memory socket owns a local AF_UNIX socket pair used only as a doorbell:
it holds one byte exactly while datagrams are queued, so readiness, `FIONREAD` (which
sockets.more_waiting asks) and `notify_closing` all behave as for a real socket, and trio's
autojump sees a delivered datagram as I/O, not as idleness.

What the kernel adds is not modelled (ICMP errors, GSO/GRO, multicast, real buffer sizes):
those tests stay on real sockets and network namespaces.
"""

from __future__ import annotations

import errno
import heapq
import itertools
import math
import random
import socket
from collections import deque
from collections.abc import Callable
from typing import Any, cast

import attrs
import trio

#: an address as this network keys it: (host, port), host normalised ("localhost" -> 127.0.0.1)
HostPort = tuple[str, int]
#: a rule's end: any address (None), every port of a host (str), or one address (HostPort)
Pattern = str | HostPort | None

_WILDCARDS: dict[int, str] = {socket.AF_INET: "0.0.0.0", socket.AF_INET6: "::"}
_LOOPBACKS: dict[int, str] = {socket.AF_INET: "127.0.0.1", socket.AF_INET6: "::1"}
# Where ports bound to 0 are taken from (the IANA dynamic range, as a kernel would).
_EPHEMERAL_FIRST = 49152
_EPHEMERAL_LAST = 65535


@attrs.frozen
class Link:
    """What happens to each datagram on a link (every rate is a probability per datagram).

    loss: dropped. duplicate: delivered twice (each copy meets delay, jitter and reordering on
    its own). reorder: held back by `reorder_delay`, so that what is sent meanwhile overtakes
    it. delay: one-way latency; jitter: up to this much more, uniformly (which reorders too).
    """

    loss: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    delay: float = 0.0
    jitter: float = 0.0
    reorder_delay: float = 0.01

    def __attrs_post_init__(self) -> None:
        for name in ("loss", "duplicate", "reorder"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1]")
        for name in ("delay", "jitter", "reorder_delay"):
            if not 0.0 <= getattr(self, name) < math.inf:
                raise ValueError(f"{name} must be a finite number of seconds >= 0")


@attrs.frozen
class Datagram:
    """One datagram as sent: who from, to whom, what, and when (the run's clock)."""

    source: HostPort
    destination: HostPort
    payload: bytes
    sent_at: float


@attrs.define
class NetworkCounters:
    """What the network did, over every socket (a datagram sent twice counts once in `sent`)."""

    sent: int = 0
    delivered: int = 0
    lost: int = 0
    dropped_by_intercept: int = 0
    duplicated: int = 0
    reordered: int = 0
    #: nobody bound at the destination (a kernel would drop it too, or send ICMP)
    unroutable: int = 0
    #: the destination's receive queue was full (SO_RCVBUF): dropped, as the kernel does
    overflowed: int = 0


def _normalise(address: Any) -> HostPort:
    host, port = str(address[0]), int(address[1])
    if host == "localhost":
        host = "127.0.0.1"
    return host, port


def _family_of(host: str) -> int:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _matches(pattern: Pattern, address: HostPort) -> bool:
    if pattern is None:
        return True
    if isinstance(pattern, str):
        return pattern == address[0]
    return _normalise(pattern) == address


class MemorySocket:
    """A bound, non-blocking UDP socket of a `MemoryNetwork`.

    It has what the transport's driver calls on a socket (driver/sockets.py, driver/loop.py):
    `sendto`, `sendmsg`, `recvfrom_into`, `recvmsg_into`, `recvfrom`, `getsockname`, `setsockopt`,
    `setblocking`, `fileno` (for trio's readiness waits) and `close`; UDP GSO/GRO options
    are refused, so every datagram meets its own fate and the driver sends and reads one at a
    time.
    """

    def __init__(self, network: MemoryNetwork, family: int, address: HostPort, rcvbuf: int):
        self.network = network
        self.family = family
        self.type = socket.SOCK_DGRAM
        self.address = address
        #: the address its datagrams come from (a wildcard binding sends from a host address)
        self.source = address
        if address[0] == _WILDCARDS[family]:
            host = network.host if family == socket.AF_INET else _LOOPBACKS[family]
            self.source = (host, address[1])
        #: bytes the receive queue holds at most (SO_RCVBUF); beyond, arrivals are dropped
        self.rcvbuf = rcvbuf
        self._queue: deque[tuple[bytes, HostPort]] = deque()
        self._queued_bytes = 0
        self._doorbell, self._ringer = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._doorbell.setblocking(False)
        self._ringer.setblocking(False)
        self.closed = False

    # ------------------------------------------------------------------ the socket calls

    def fileno(self) -> int:
        return self._doorbell.fileno()

    def getsockname(self) -> tuple[Any, ...]:
        host, port = self.address
        return (host, port, 0, 0) if self.family == socket.AF_INET6 else (host, port)

    def setblocking(self, flag: bool) -> None:
        """Always non-blocking (the driver never asks otherwise)."""

    def setsockopt(self, level: int, option: int, value: Any, *rest: Any) -> None:
        if level == socket.SOL_UDP:  # UDP_SEGMENT, UDP_GRO: a kernel feature, not modelled
            raise OSError(errno.ENOPROTOOPT, "no UDP offload on a memory socket")
        if (level, option) == (socket.SOL_SOCKET, socket.SO_RCVBUF):
            self.rcvbuf = int(value)

    def getsockopt(self, level: int, option: int, *rest: Any) -> int:
        if (level, option) == (socket.SOL_SOCKET, socket.SO_RCVBUF):
            return self.rcvbuf
        return 0

    def sendto(self, data: Any, address: Any) -> int:
        if self.closed:
            raise OSError(errno.EBADF, "Bad file descriptor")
        payload = bytes(data)  # the caller may reuse its buffer (a term, a memoryview)
        self.network.send(self, payload, _normalise(address))
        return len(payload)

    def sendmsg(self, buffers: Any, ancdata: Any = (), flags: int = 0, address: Any = None) -> int:
        if ancdata:  # UDP_SEGMENT and friends: as a route that cannot take runs
            raise OSError(errno.EOPNOTSUPP, "no ancillary data on a memory socket")
        return self.sendto(b"".join(bytes(part) for part in buffers), address)

    def recvmsg_into(
        self, buffers: Any, ancbufsize: int = 0, flags: int = 0
    ) -> tuple[int, list[Any], int, Any]:
        size, source = self.recvfrom_into(buffers[0])
        return size, [], 0, source

    def recvfrom_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> tuple[int, Any]:
        payload, source = self._pop()
        view = memoryview(buffer).cast("B")
        size = min(len(payload), nbytes or len(view))
        view[:size] = payload[:size]  # longer datagrams are truncated, as recvfrom does
        return size, self._sockaddr(source)

    def recvfrom(self, bufsize: int, flags: int = 0) -> tuple[bytes, Any]:
        payload, source = self._pop()
        return payload[:bufsize], self._sockaddr(source)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.network.unbind(self)
        self._queue.clear()
        self._doorbell.close()
        self._ringer.close()

    def __enter__(self) -> MemorySocket:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the network's side

    @property
    def queued(self) -> int:
        """Datagrams waiting to be read."""
        return len(self._queue)

    def deliver(self, payload: bytes, source: HostPort) -> bool:
        """Queue an arriving datagram; False if it was dropped (closed, or the queue is full)."""
        if self.closed:
            return False
        if self._queued_bytes + len(payload) > self.rcvbuf:
            return False
        self._queue.append((payload, source))
        self._queued_bytes += len(payload)
        if len(self._queue) == 1:
            self._ringer.send(b"\x01")  # readable from now until the queue is empty again
        return True

    def _pop(self) -> tuple[bytes, HostPort]:
        if self.closed:
            raise OSError(errno.EBADF, "Bad file descriptor")
        if not self._queue:
            raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
        payload, source = self._queue.popleft()
        self._queued_bytes -= len(payload)
        if not self._queue:
            self._doorbell.recv(1)
        return payload, source

    def _sockaddr(self, address: HostPort) -> tuple[Any, ...]:
        if self.family == socket.AF_INET6:
            return (address[0], address[1], 0, 0)
        return address


class MemoryNetwork:
    """A UDP network in memory, and a `socket_factory` for `open_transport`.

        network = MemoryNetwork(seed=7, link=Link(loss=0.1, delay=0.01))
        async with open_transport(socket_factory=network) as a, \\
                   open_transport(socket_factory=network) as b:
            ...

    `link` applies to every datagram unless a rule set with `set_link` matches it (the rule set
    last wins). `intercept`, if set, sees every datagram before its link does and drops it by
    returning True (a scripted loss, as aioquic's tests drop chosen datagrams; it may also
    just record). Everything random comes from one `random.Random(seed)`, drawn in send order,
    so a run is reproducible as long as the program sends the same datagrams in the same order
    (which under MockClock it does).

    Datagrams due now are delivered inside `sendto`; later ones (delay, jitter, reordering) by
    one trio system task started with the first of them, in the trio run that sent it.
    """

    def __init__(self, seed: int = 0, link: Link | None = None, host: str = "127.0.0.1") -> None:
        self.rng = random.Random(seed)
        self.link = link if link is not None else Link()
        #: the address a socket bound to a wildcard address sends from
        self.host = host
        self.counters = NetworkCounters()
        self.intercept: Callable[[Datagram], bool] | None = None
        self._rules: list[tuple[Pattern, Pattern, Link]] = []
        self._bound: dict[HostPort, MemorySocket] = {}
        self._ports = itertools.cycle(range(_EPHEMERAL_FIRST, _EPHEMERAL_LAST + 1))
        self._pending: list[tuple[float, int, Datagram]] = []
        self._seq = itertools.count()
        self._wakeup = trio.lowlevel.ParkingLot()
        self._courier_run: trio.lowlevel.TrioToken | None = None

    # ------------------------------------------------------------------ configuration

    def set_link(self, link: Link, *, source: Pattern = None, destination: Pattern = None) -> None:
        """Datagrams from `source` to `destination` (None: any; a host: any of its ports;
        (host, port): that one) meet `link` from now on, overriding earlier rules."""
        self._rules.append((source, destination, link))

    def link_for(self, source: HostPort, destination: HostPort) -> Link:
        for rule_source, rule_destination, link in reversed(self._rules):
            if _matches(rule_source, source) and _matches(rule_destination, destination):
                return link
        return self.link

    # ------------------------------------------------------------------ sockets

    def __call__(
        self, bind: tuple[str, int], family: int, rcvbuf: int, sndbuf: int
    ) -> socket.socket:
        """The `socket_factory` signature (sockets.SocketFactory). The memory socket is not a
        `socket.socket`, but has every call the driver makes on one."""
        return cast(socket.socket, self.open_socket(bind, family, rcvbuf))

    def open_socket(
        self,
        bind: tuple[str, int] = ("127.0.0.1", 0),
        family: int | None = None,
        rcvbuf: int = 4 * 1024 * 1024,
    ) -> MemorySocket:
        """A socket bound to `bind` (port 0: a free one); OSError EADDRINUSE if taken. Also
        for a test that plays a peer by hand (sends forged frames, reads replies)."""
        host, port = _normalise(bind)
        if family is None:
            family = _family_of(host)
        if port == 0:
            port = self._free_port(host)
        elif self._taken(host, port):
            raise OSError(errno.EADDRINUSE, f"cannot bind UDP {host}:{port}: Address in use")
        sock = MemorySocket(self, family, (host, port), rcvbuf)
        self._bound[(host, port)] = sock
        return sock

    def unbind(self, sock: MemorySocket) -> None:
        if self._bound.get(sock.address) is sock:
            del self._bound[sock.address]

    def _taken(self, host: str, port: int) -> bool:
        if (host, port) in self._bound:
            return True
        # A wildcard binding takes the port on every address of its family, and the reverse.
        family = _family_of(host)
        if host == _WILDCARDS[family]:
            return any(p == port and _family_of(h) == family for h, p in self._bound)
        return (_WILDCARDS[family], port) in self._bound

    def _free_port(self, host: str) -> int:
        for _ in range(_EPHEMERAL_LAST - _EPHEMERAL_FIRST + 1):
            port = next(self._ports)
            if not self._taken(host, port):
                return port
        raise OSError(errno.EADDRINUSE, "no free port left on the memory network")

    def socket_at(self, address: HostPort) -> MemorySocket | None:
        """The socket a datagram to `address` reaches (an exact binding, else a wildcard)."""
        sock = self._bound.get(address)
        if sock is None:
            sock = self._bound.get((_WILDCARDS[_family_of(address[0])], address[1]))
        return sock

    # ------------------------------------------------------------------ moving datagrams

    def send(self, sock: MemorySocket, payload: bytes, destination: HostPort) -> None:
        """A datagram leaves `sock`: decide its fate and deliver it now or schedule it."""
        counters = self.counters
        counters.sent += 1
        source = sock.source
        if self.intercept is not None and self.intercept(
            Datagram(source, destination, payload, trio.current_time())
        ):
            counters.dropped_by_intercept += 1
            return
        link = self.link_for(source, destination) if self._rules else self.link
        if not (link.loss or link.duplicate or link.reorder or link.delay or link.jitter):
            self._deliver(payload, source, destination)  # a perfect link: the common case
            return
        rng = self.rng
        if link.loss and rng.random() < link.loss:
            counters.lost += 1
            return
        copies = 1
        if link.duplicate and rng.random() < link.duplicate:
            counters.duplicated += 1
            copies = 2
        now = trio.current_time()
        for _ in range(copies):
            at = now + link.delay
            if link.jitter:
                at += rng.uniform(0.0, link.jitter)
            if link.reorder and rng.random() < link.reorder:
                counters.reordered += 1
                at += link.reorder_delay
            if at <= now:
                self._deliver(payload, source, destination)
            else:
                self._schedule(at, Datagram(source, destination, payload, now))

    def _deliver(self, payload: bytes, source: HostPort, destination: HostPort) -> None:
        sock = self._bound.get(destination)
        if sock is None:
            sock = self.socket_at(destination)
        if sock is None:
            self.counters.unroutable += 1
        elif sock.deliver(payload, source):
            self.counters.delivered += 1
        else:
            self.counters.overflowed += 1

    def _schedule(self, at: float, datagram: Datagram) -> None:
        # The sequence number keeps datagrams due at the same instant in send order.
        entry = (at, next(self._seq), datagram)
        heapq.heappush(self._pending, entry)
        token = trio.lowlevel.current_trio_token()
        if self._courier_run is not token:
            # The first delayed datagram of this trio run (a network outlives no run: a test
            # that reuses one in a second run starts a courier there).
            self._courier_run = token
            trio.lowlevel.spawn_system_task(self._carry, name="memory-network-courier")
        elif self._pending[0] is entry:
            self._wakeup.unpark_all()  # due before the courier's alarm: re-arm it

    @property
    def in_flight(self) -> int:
        """Datagrams sent and not yet delivered (delayed or held back)."""
        return len(self._pending)

    async def _carry(self) -> None:
        pending = self._pending
        while True:
            deadline = pending[0][0] if pending else math.inf
            with trio.move_on_at(deadline):
                await self._wakeup.park()
            now = trio.current_time()
            while pending and pending[0][0] <= now:
                _, _, datagram = heapq.heappop(pending)
                self._deliver(datagram.payload, datagram.source, datagram.destination)
