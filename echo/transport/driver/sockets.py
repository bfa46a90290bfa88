"""The driver's UDP sockets: one class per direction, and what the driver keeps per socket.

A `SendSocket` carries the publications of one send channel endpoint (`sender.SendEndpoint`);
a `ReceiveSocket` the subscriptions of one receive channel endpoint (`receiver.ReceiveEndpoint`)
and the `Lending` record of who reads it. Each has its `send` function (sendto, or sendmsg with
UDP GSO for runs of datagrams) that counts what it sends and reports a full socket buffer. The
driver (loop.py) schedules them and reads them; channels.py hands them to the api.
"""

from __future__ import annotations

import errno
import math
import socket
import struct
from collections.abc import Callable
from typing import Any, Protocol

import trio

from echo.transport.core.counters import Counters
from echo.transport.core.destinations import Address
from echo.transport.core.offering import Burst
from echo.transport.core.receiver import ImageEvent, ReceiveEndpoint
from echo.transport.core.response import ResponseSendEndpoint
from echo.transport.core.sender import WOULD_BLOCK, NetworkPublication, Send, SendEndpoint


class PublicationListener(Protocol):
    """What a send socket knows of a publication's channel (channels.PublicationChannel):
    told after each service, and its state announced at shut-down. (A protocol, so that this
    module does not import channels.py, which builds on it.)"""

    state: NetworkPublication
    session_id: int

    def notify(self) -> None: ...


class SubscriptionListener(Protocol):
    """What a receive socket knows of a subscription's channel (channels.SubscriptionChannel)."""

    def notify(self) -> None: ...

    def on_image_event(self, event: ImageEvent) -> None: ...

    def detach(self) -> None: ...

# UDP generic segmentation and receive offload (Linux 4.18 / 5.0; linux/udp.h).
SOL_UDP = 17
UDP_SEGMENT = 103
UDP_GRO = 104
#: datagrams one sendmsg may carry (the kernel's UDP_MAX_SEGMENTS)
GSO_MAX_SEGMENTS = 64
_U16 = struct.Struct("=H")
_I32_NATIVE = struct.Struct("=i")
GRO_CMSG_SPACE = socket.CMSG_SPACE(_I32_NATIVE.size)
_NOTHING_QUEUED = bytes(4)
# sendmsg errors that mean "no runs on this route", after which datagrams go one by one
_NO_GSO_ERRORS = frozenset((errno.EIO, errno.EINVAL, errno.EOPNOTSUPP, errno.EMSGSIZE))

#: Lending (see loop.py): the socket goes back to its reader task once nobody has waited on
#: it for LEND_IDLE. Checks start LEND_IDLE apart and back off (x LEND_BACKOFF) to
#: LEND_CHECK_MAX while the borrower keeps coming back.
LEND_IDLE = 0.001
LEND_CHECK_MAX = 1.0
LEND_BACKOFF = 2
#: A socket is lent only while its data comes this close together (a busy stream: an echo
#: loop, a burst), and a borrower woken by anything else after this long without data gives
#: it back. A lent socket wakes its borrower for every datagram, heartbeats too, and each wait
#: re-arms its descriptor in trio's epoll set; the driver's reader serves every ready socket
#: of its set in one wake-up with no re-arming. An idle stream (heartbeats and status
#: messages only, a lobby member's) or one with a message a second (B4's clients) saves
#: nothing by lending and paid that per datagram, plus a lend check a second.
LEND_BUSY = 0.01


try:
    import fcntl
    import termios

    _FIONREAD = termios.FIONREAD

    def more_waiting(sock: socket.socket, answer: bytearray | None = None) -> bool:
        """Is a datagram queued on `sock`? (FIONREAD: the next one's size, 0 if none.)
        `answer`: a 4-byte buffer of the caller's for the kernel's answer (the socket's own,
        DriverSocket.fionread), else a new one."""
        # The kernel writes the answer into a buffer of ours (mutate_flag): half the time of
        # passing bytes and comparing the bytes object ioctl builds for the answer (0.33 µs
        # against 0.64 µs here, most of it Python's; the system call is the smaller part).
        # A lent socket's borrower asks once per message it waits for (Lending.unasked).
        # (A buffer kept per socket, not a new one per question: its allocation was a third
        # of the question's cost in Python. Per socket, not one for all: a socket is read by
        # one task at a time, and transports in other threads have sockets of their own.)
        queued = bytearray(4) if answer is None else answer
        try:
            fcntl.ioctl(sock.fileno(), _FIONREAD, queued, True)
        except (OSError, ValueError):
            return True  # cannot tell (or closed meanwhile): the read that follows says
        return queued != _NOTHING_QUEUED

except ImportError:  # pragma: no cover - Windows

    def more_waiting(sock: socket.socket, answer: bytearray | None = None) -> bool:
        return True


def gro_segment(ancillary: list[tuple[int, int, bytes]], size: int) -> int:
    """The segment size of a coalesced read (the UDP_GRO control message), else `size`."""
    for level, kind, data in ancillary:
        if level == SOL_UDP and kind == UDP_GRO and len(data) >= _I32_NATIVE.size:
            segment = _I32_NATIVE.unpack_from(data)[0]
            if segment > 0:
                return int(segment)
    return size or 1


_SendOne = Callable[[bytes | memoryview, Address], int]
_SendRun = Callable[[bytes | memoryview, Address, int], int]

#: opens a non-blocking UDP socket bound to (host, port): (bind, family, rcvbuf, sndbuf). The
#: driver's only way to a socket, so a test can hand it one that loses, delays or records.
SocketFactory = Callable[[tuple[str, int], int, int, int], socket.socket]


def open_udp_socket(
    bind: tuple[str, int],
    family: int,
    rcvbuf: int,
    sndbuf: int,
    sock: socket.socket | None = None,
) -> socket.socket:
    """A non-blocking UDP socket bound to `bind`; a clear OSError if it cannot be. `sock`: a
    socket (of a subclass) to set up instead of a new plain one."""
    if sock is None:
        sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.setblocking(False)
        for option, size in ((socket.SO_RCVBUF, rcvbuf), (socket.SO_SNDBUF, sndbuf)):
            try:
                sock.setsockopt(socket.SOL_SOCKET, option, size)
            except OSError:
                pass
        sock.bind(bind)
    except OSError as error:
        sock.close()
        host, port = bind[0], bind[1]
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        raise OSError(error.errno, f"cannot bind UDP {where}: {error.strerror}") from None
    return sock


class TimerHandle:
    """What the driver's timer heaps hold instead of the socket itself: a closed socket empties
    it, so an entry left in a heap does not keep a closed stream alive until it falls due."""

    __slots__ = ("socket",)

    def __init__(self, owner: DriverSocket) -> None:
        self.socket: DriverSocket | None = owner


def _send_nothing(datagram: bytes | memoryview, address: Address, segment: int = 0) -> int:
    return 0  # the socket is closed: what it would send is dropped, nothing leaves


class DriverSocket:
    """A bound UDP socket and the driver's bookkeeping for it (SendSocket, ReceiveSocket)."""

    endpoint: SendEndpoint | ReceiveEndpoint
    #: datagrams may arrive coalesced (UDP GRO, receive sockets): read them with their size
    gro = False
    #: receive sockets: who reads the socket (None: always its reader task)
    lending: Lending | None = None
    #: read by the driver's one reader of every ready socket (readiness.py), not a task of its
    #: own
    shared_reader = False

    def __init__(self, sock: socket.socket, key: Any, counters: Counters) -> None:
        self.sock = sock
        self.key = key
        #: where the kernel answers more_waiting's question about this socket
        self.fionread = bytearray(4)
        #: when the timer loop must next service this socket (inf: nothing due)
        self.scheduled = math.inf
        #: the time of this socket's live entry in the timer heap (inf: none); never later
        #: than `scheduled`. A deadline that moves later leaves the entry where it is and the
        #: driver moves it when it comes up (Driver._schedule_at): no heap work per offer.
        self.queued = math.inf
        #: the timer heap's tier that entry is in (timerheap.PRECISE, LAZY or IDLE)
        self.queued_tier = 0
        #: when the driver last read the socket (driver._drain: a quiet one is read once)
        self.read_at = -math.inf
        #: the socket buffer was full: nothing is sent until it is writable again
        self.blocked = False
        #: a task waits for the socket to become writable again (blocked is set)
        self.awaiting_writable = False
        self.closed = False
        self.local_address: Address = sock.getsockname()
        self.send: Send = self._make_send(counters)
        self.timer_handle = TimerHandle(self)

    def _make_send(self, counters: Counters) -> Send:
        # Three closures that call each other one way only (send -> send_run -> send_one): no
        # cycle among them, so they go with the socket when it closes (see Driver.unregister).
        send_one = self._make_send_one(counters)
        send_run = self._make_send_run(counters, send_one)
        sendto = self.sock.sendto

        def send(datagram: bytes | memoryview, address: Address, segment: int = 0) -> int:
            if segment:
                return send_run(datagram, address, segment)
            # send_one's body again, not a call to it: one interpreted call fewer for every
            # datagram sent (an echo sends one per message).
            try:
                sent = sendto(datagram, address)
            except BlockingIOError:
                counters.send_would_block += 1
                self.blocked = True
                return WOULD_BLOCK
            except OSError:
                counters.send_errors += 1
                return 0
            counters.datagrams_sent += 1
            counters.bytes_sent += sent
            return 1

        return send

    def _make_send_one(self, counters: Counters) -> _SendOne:
        """One datagram, one sendto."""
        sendto = self.sock.sendto

        def send_one(datagram: bytes | memoryview, address: Address) -> int:
            try:
                sent = sendto(datagram, address)
            except BlockingIOError:
                counters.send_would_block += 1
                self.blocked = True
                return WOULD_BLOCK
            except OSError:
                # EPERM from a firewall, ENETUNREACH, an ICMP error reported late: the datagram is
                # lost, which the protocol recovers from. It must never end a task, and it did
                # not go on the wire: 0, so no frame counter counts it.
                counters.send_errors += 1
                return 0
            counters.datagrams_sent += 1
            counters.bytes_sent += sent
            return 1

        return send_one

    def _make_send_run(self, counters: Counters, send_one: _SendOne) -> _SendRun:
        """Datagrams of `segment` bytes back to back (the last may be shorter): one sendmsg
        with UDP_SEGMENT, the kernel (or the NIC) cuts them apart; one by one through
        `send_one` on a route that cannot take runs."""
        sendmsg = self.sock.sendmsg

        def send_run(datagram: bytes | memoryview, address: Address, segment: int) -> int:
            length = len(datagram)
            try:
                sent = sendmsg([datagram], [(SOL_UDP, UDP_SEGMENT, _U16.pack(segment))], 0, address)
            except BlockingIOError:
                counters.send_would_block += 1
                self.blocked = True
                return WOULD_BLOCK
            except OSError as error:
                if error.errno not in _NO_GSO_ERRORS:
                    counters.send_errors += 1
                    return 0
                # This route cannot take runs (no checksum offload, a segment larger than the
                # path MTU, ...): send this one datagram by datagram and stop making runs.
                self.stop_runs()
                view = memoryview(datagram)
                total = 0
                for start in range(0, length, segment):
                    one = send_one(view[start : start + segment], address)
                    if one < 0:
                        return WOULD_BLOCK
                    total += one
                return total
            count = -(-length // segment)
            counters.datagrams_sent += count
            counters.bytes_sent += sent
            counters.gso_runs_sent += 1
            return count

        return send_run

    def fileno(self) -> int:
        return self.sock.fileno()

    def quiet_after_read(self) -> bool:
        """May the driver skip servicing the socket after the datagrams it just read?"""
        return False

    def stop_runs(self) -> None:
        """The route refused a run of datagrams (UDP GSO): send them one by one from now on."""

    def enable_offload(self) -> None:
        """UDP GSO (send) or GRO (receive) where the OS has them."""

    def close(self) -> None:
        """Close the socket and break the reference cycles through it (its send closure, the
        emitter the send endpoint caches, the channels), so that a closed stream's socket and
        term buffers are freed now, by reference counting, not by a later pass of the cyclic
        collector (100-200 ms when a thousand clients leave at once)."""
        self.closed = True
        trio.lowlevel.notify_closing(self.sock)
        self.sock.close()
        self.send = _send_nothing
        self.timer_handle.socket = None


class SendSocket(DriverSocket):
    """The socket of one send channel endpoint and the publications' channels on it."""

    endpoint: SendEndpoint

    def __init__(self, sock: socket.socket, key: Any, endpoint: SendEndpoint) -> None:
        self.endpoint = endpoint
        super().__init__(sock, key, endpoint.counters)
        #: when an offer last sent from this socket at once (Driver.flush, offering.OfferGate)
        self.burst = Burst()
        #: told each time the endpoint has been serviced (a publication's waiters)
        self.channels: list[PublicationListener] = []
        #: the channels a task waits on now (PublicationChannel.wait): a service tells only
        #: those, not every publication of a server's shared port (1,000 response
        #: publications: telling each one cost O(publications) per status message)
        self.waiting: set[PublicationListener] = set()

    def deadline_after_flush(
        self, publication: NetworkPublication, now: float
    ) -> tuple[float, bool]:
        """When the socket next needs a service after an offer flushed `publication`, and
        whether that is the socket's whole deadline (True) or only a bound on it (False).

        The socket's deadline is its endpoint's, the earliest of its publications' and its
        destinations' expiries: O(publications + destinations) to find. An offer on a
        server's shared port or on an all-clients MDC channel cannot pay that, so it learns
        only its own publication's deadline, which may bring the socket's nearer but cannot
        move it later. Where the whole is cheap it is asked for: one publication and no
        dynamic destinations (a client's stream), or a response port, which keeps its
        publications' deadlines in a heap. Then an offer that pushes the probe heartbeat on
        (probe_after_data) moves the socket's timer on with it, and the loop is not woken at
        the probe's old time for nothing.
        """
        endpoint = self.endpoint
        if isinstance(endpoint, ResponseSendEndpoint) or (
            len(self.channels) == 1 and endpoint.dynamic is None
        ):
            return endpoint.next_deadline(now), True
        return publication.next_deadline(now), False

    def quiet_after_read(self) -> bool:
        # Status messages that only repeated what the publications knew (an idle receiver's):
        # nothing is due before the next timer and no offering task has news.
        return self.endpoint.quiet()

    def notify_channels(self) -> None:
        """The endpoint was serviced: wake the tasks waiting on its publications."""
        waiting = self.waiting
        if waiting:
            self.waiting = set()
            for channel in waiting:
                channel.notify()

    def stop_runs(self) -> None:
        endpoint = self.endpoint
        if endpoint.run_segments:
            endpoint.set_run_segments(0)
            endpoint.counters.gso_disabled += 1

    def enable_offload(self) -> None:
        try:
            # Setting the socket's default segment size to 0 (none) only proves support.
            self.sock.setsockopt(SOL_UDP, UDP_SEGMENT, 0)
            self.endpoint.set_run_segments(GSO_MAX_SEGMENTS)
        except OSError:
            pass  # not Linux, or an old kernel: one datagram per system call

    def close(self) -> None:
        super().close()
        self.channels = []
        self.waiting = set()
        self.endpoint.forget_send()


class Lending:
    """Who reads a receive socket: its reader task, or an application task it lends it to.

    An application task waiting for a subscription (`receive`, `wait_activity`) would be woken
    by the reader task after each datagram: one more pass of trio's scheduler on every
    message's path. Instead, once the reader sees such a task, it lends it the socket and
    sleeps: the task then waits on the socket itself and handles what arrives, as a plain trio
    UDP program does. The socket goes back to the reader when no task has waited on it for
    LEND_IDLE; meanwhile the timer loop and `poll` read it if they need fresh data, so nothing
    waits on a task that walked away. (The driver keeps the timers; this is the state.)
    """

    __slots__ = (
        "borrowed",
        "check_at",
        "check_interval",
        "data_at",
        "lent",
        "reader_lot",
        "returned_at",
        "unasked",
        "waiters",
    )

    def __init__(self) -> None:
        #: the reader task has handed the socket to application tasks and sleeps
        self.lent = False
        self.reader_lot = trio.lowlevel.ParkingLot()
        #: an application task is waiting on the socket right now
        self.borrowed = False
        #: when the last application task stopped waiting on it
        self.returned_at = -math.inf
        #: the pending lend check (while lent there is always one) and its backoff
        self.check_at = math.inf
        self.check_interval = LEND_IDLE
        #: application tasks parked until this socket is serviced by someone else
        self.waiters = 0
        #: when a read of the socket last brought data (see LEND_BUSY)
        self.data_at = -math.inf
        #: the borrower's last read stopped after its first datagram without asking the
        #: kernel whether more were queued (FIONREAD): its next wait asks first. The question
        #: then comes after the application's answer, not between a datagram and the answer.
        self.unasked = False

    def on_read(self, data: bool, now: float) -> bool:
        """A read of the socket brought `data` (or only heartbeats and the like): is the
        stream busy, so that lending the socket pays? (LEND_BUSY)"""
        if not data:
            return False
        busy = now - self.data_at < LEND_BUSY
        self.data_at = now
        return busy

    def quiet(self, now: float) -> bool:
        """No data for LEND_BUSY: a borrower woken for nothing should give the socket back."""
        return now - self.data_at >= LEND_BUSY

    def lend(self, now: float) -> float:
        """The reader hands the socket out; returns when to check whether it is still used."""
        self.lent = True
        self.returned_at = now
        self.check_interval = LEND_IDLE
        return now + LEND_IDLE

    def check(self, now: float) -> float | None:
        """A lend check fell due: when to check again, or None (give the socket back now)."""
        if self.borrowed:
            # In use: look again later, less and less often while it stays in use.
            self.check_interval = min(LEND_BACKOFF * self.check_interval, LEND_CHECK_MAX)
            return now + self.check_interval
        # (One comparison of the same sum: `now - returned_at < LEND_IDLE` can hold while
        # `returned_at + LEND_IDLE <= now` does too, by rounding, and the check then fell due
        # again at once, for ever: the timer loop spun in virtual time.)
        due = self.returned_at + LEND_IDLE
        if due <= now:
            return None
        return due

    def give_back(self) -> None:
        """The reader task waits on the socket again (no application task does now)."""
        self.lent = False
        self.check_at = math.inf
        self.reader_lot.unpark_all()


class ReceiveSocket(DriverSocket):
    """The socket of one receive channel endpoint, its subscriptions' channels and its
    lending."""

    endpoint: ReceiveEndpoint

    def __init__(self, sock: socket.socket, key: Any, endpoint: ReceiveEndpoint) -> None:
        self.endpoint = endpoint
        super().__init__(sock, key, endpoint.counters)
        self.lending: Lending = Lending()
        #: the subscriptions on this socket by (stream id, session id or None for all
        #: sessions): image events and notifications
        self.subscriptions: dict[tuple[int, int | None], SubscriptionListener] = {}
        #: all-sessions subscriptions a task waits on now (SubscriptionChannel.wait): with
        #: many session-specific ones on the socket, a service tells these and the sessions
        #: that got data, without looking at every subscription
        self.waiting_all: set[SubscriptionListener] = set()

    def enable_offload(self) -> None:
        try:
            self.sock.setsockopt(SOL_UDP, UDP_GRO, 1)
            self.gro = True
        except OSError:
            pass  # not Linux, or an old kernel: one datagram per system call

    def quiet_after_read(self) -> bool:
        # An application task reads the lent socket and the datagrams were data in order: no
        # SM or NAK is due, no image came or went, nobody else to wake. Or nobody reads it
        # and they were an idle stream's heartbeats: nothing due, no data to tell anyone of.
        lending = self.lending
        endpoint = self.endpoint
        if lending.lent:
            return not lending.waiters and endpoint.quiet()
        return not endpoint.news and endpoint.quiet()

    def dispatch(self, events: list[ImageEvent]) -> None:
        subscriptions = self.subscriptions
        for event in events:
            image = event.image
            channel = subscriptions.get((image.stream_id, image.session_id)) or (
                subscriptions.get((image.stream_id, None))
            )
            if channel is not None:
                channel.on_image_event(event)

    def notify_subscriptions(self) -> None:
        """Wake the subscriptions' waiting tasks after a service. Many session-specific
        subscriptions share a server's port (response channels): those wake only for their
        own image's data (or its coming and going), not for every datagram of every session,
        and not for heartbeats."""
        subscriptions = self.subscriptions
        fresh = self.endpoint.fresh
        if len(subscriptions) == 1:
            # (Only for data: an idle stream's heartbeats are nothing its reader can poll.)
            if fresh:
                for channel in subscriptions.values():
                    channel.notify()
                fresh.clear()
            return
        waiting = self.waiting_all
        if waiting:
            self.waiting_all = set()
            for channel in waiting:
                channel.notify()
        # An image that came or went woke its channel already (on_image_event).
        for session_id, stream_id in fresh:
            found = subscriptions.get((stream_id, session_id))
            if found is not None:
                found.notify()
        fresh.clear()

    def close(self) -> None:
        super().close()
        self.lending.reader_lot.unpark_all()  # a reader that lent the socket out sees it closed
        for subscription in self.subscriptions.values():
            subscription.detach()
        self.subscriptions = {}
        self.waiting_all = set()
