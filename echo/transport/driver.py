"""The trio driver: the only module that touches sockets.

It owns one non-blocking UDP socket per channel endpoint, one reader task per socket (each wakes
on readability and drains the socket until it would block, DESIGN.md §7), and one timer loop for
the whole transport that sleeps until the earliest deadline of any endpoint. The protocol itself
lives in the pure endpoints of sender.py and receiver.py; the driver hands them datagrams with
`now = trio.current_time()` and gives them a `send` that writes to the socket.
"""

from __future__ import annotations

import errno
import heapq
import itertools
import math
import random
import socket
import struct
from collections.abc import Callable
from typing import Any

import attrs
import structlog
import trio

from echo.transport.counters import Counters
from echo.transport.destinations import Address
from echo.transport.receiver import (
    ImageAvailable,
    ImageUnavailable,
    ReceiveEndpoint,
    ReceiverTimers,
)
from echo.transport.sender import WOULD_BLOCK, Send, SendEndpoint, SenderTimers
from echo.transport.sender import Publication as PublicationState
from echo.transport.validation import CookieJar, RateLimiter

_log = structlog.get_logger("echo.transport")

# UDP generic segmentation and receive offload (Linux 4.18 / 5.0; linux/udp.h).
SOL_UDP = 17
UDP_SEGMENT = 103
UDP_GRO = 104
#: datagrams one sendmsg may carry (the kernel's UDP_MAX_SEGMENTS)
GSO_MAX_SEGMENTS = 64
_U16 = struct.Struct("=H")
_I32_NATIVE = struct.Struct("=i")
_GRO_CMSG_SPACE = socket.CMSG_SPACE(_I32_NATIVE.size)
_NOTHING_QUEUED = bytes(4)
# sendmsg errors that mean "no runs on this route", after which datagrams go one by one
_NO_GSO_ERRORS = frozenset((errno.EIO, errno.EINVAL, errno.EOPNOTSUPP, errno.EMSGSIZE))

# Datagrams drained from one socket before the reader yields to other tasks.
_READ_BUDGET = 256
_RECV_BUFFER = 65536
# Offers closer together than this are a burst: batch them instead of sending each at once.
_BURST_GAP = 0.0002
# Lending a subscription's socket to the application task that waits on it (see
# `Driver.read_as_application`): the socket goes back to its reader task once nobody has
# waited on it for _LEND_IDLE. Checks start _LEND_IDLE apart and back off to _LEND_CHECK_MAX
# while the borrower keeps coming back.
_LEND_IDLE = 0.001
_LEND_CHECK_MAX = 1.0


@attrs.frozen
class TransportConfig:
    """Every timer and size of the transport, with Aeron's defaults (reference §2.7)."""

    mtu: int = 1408
    term_length: int = 16 * 1024 * 1024
    rcv_wnd: int = 2 * 1024 * 1024
    setup_interval: float = 0.1
    heartbeat_interval: float = 0.1
    status_message_interval: float = 0.2
    image_liveness_timeout: float = 10.0
    publication_connection_timeout: float = 5.0
    linger: float = 5.0
    nak_delay: float = 0.0001
    nak_retry_ratio: int = 100
    group_nak_max_backoff: float = 0.01
    retransmit_linger: float = 0.01
    #: unicast publications resend a range NAKed again after this (a receiver's retry)
    unicast_retransmit_linger: float = 0.00025
    #: the soonest a unicast receiver NAKs a gap again (it waits for its measured repair time)
    nak_retry_min: float = 0.0005
    #: send one heartbeat a couple of milliseconds after each burst of data (see README)
    probe_after_data: bool = False
    #: retransmits in flight per publication (Aeron: 1 unicast, 16 group; more keep heavy loss
    #: from costing a linger period per gap: one per gap a receiver NAKs, see receiver._MAX_GAPS)
    max_retransmits: int = 64
    destination_timeout: float = 5.0
    max_destinations: int = 1024
    #: images (publishers) one subscription endpoint accepts at once; more SETUPs are refused
    max_images: int = 1024
    mdc_registration_interval: float = 1.0
    setup_elicit_interval: float = 0.2
    image_cooldown: float = 10.0
    #: largest term length a SETUP from the network may ask a receiver to allocate
    max_receiver_term_length: int = 64 * 1024 * 1024
    socket_rcvbuf: int = 4 * 1024 * 1024
    socket_sndbuf: int = 4 * 1024 * 1024
    #: on Linux, hand the kernel runs of equal datagrams in one system call (UDP GSO) and
    #: read coalesced ones (UDP GRO); the datagrams on the wire are the same either way
    gso: bool = True
    #: auto-assigned publication session ids avoid [low, high] (Aeron's reserved range)
    reserved_session_low: int = -1
    reserved_session_high: int = 1000
    #: anti-amplification (validation.py): dynamic-MDC destinations must echo a cookie, and
    #: nothing is sent to an unvalidated address beyond the bytes received from it. Turn off
    #: only to serve plain Aeron receivers, which cannot answer the cookie.
    validate_addresses: bool = True
    #: replies to unvalidated sources (cookie challenges) per second and burst, per host
    unvalidated_reply_rate: float = 500.0
    unvalidated_reply_burst: float = 1000.0
    #: test-only: drop this fraction of received datagrams at random, before parsing
    test_receive_loss: float = 0.0
    seed: int | None = None

    def sender_timers(self) -> SenderTimers:
        return SenderTimers(
            setup_interval=self.setup_interval,
            heartbeat_interval=self.heartbeat_interval,
            connection_timeout=self.publication_connection_timeout,
            linger=self.linger,
            retransmit_linger=self.retransmit_linger,
            unicast_retransmit_linger=self.unicast_retransmit_linger,
            probe_after_data=self.probe_after_data,
        )

    def receiver_timers(self, nak_delay: float | None = None) -> ReceiverTimers:
        return ReceiverTimers(
            status_message_interval=self.status_message_interval,
            liveness_timeout=self.image_liveness_timeout,
            nak_delay=self.nak_delay if nak_delay is None else nak_delay,
            nak_retry_ratio=self.nak_retry_ratio,
            nak_retry_min=self.nak_retry_min,
            group_nak_max_backoff=self.group_nak_max_backoff,
            setup_elicit_interval=self.setup_elicit_interval,
            mdc_registration_interval=self.mdc_registration_interval,
            cooldown=self.image_cooldown,
        )


Endpoint = SendEndpoint | ReceiveEndpoint


try:
    import fcntl
    import termios

    def _more_waiting(sock: socket.socket) -> bool:
        """Is a datagram queued on `sock`? (FIONREAD: the next one's size, 0 if none.)"""
        try:
            return bool(
                fcntl.ioctl(sock.fileno(), termios.FIONREAD, _NOTHING_QUEUED) != _NOTHING_QUEUED
            )
        except (OSError, ValueError):
            return True  # cannot tell (or closed meanwhile): the read that follows says

except ImportError:  # pragma: no cover - Windows

    def _more_waiting(sock: socket.socket) -> bool:
        return True


def _gro_segment(ancillary: list[tuple[int, int, bytes]], size: int) -> int:
    """The segment size of a coalesced read (the UDP_GRO control message), else `size`."""
    for level, kind, data in ancillary:
        if level == SOL_UDP and kind == UDP_GRO and len(data) >= _I32_NATIVE.size:
            segment = _I32_NATIVE.unpack_from(data)[0]
            if segment > 0:
                return int(segment)
    return size or 1


class _TimerHandle:
    __slots__ = ("sep",)

    def __init__(self, sep: SocketEndpoint) -> None:
        self.sep: SocketEndpoint | None = sep


def _send_nothing(datagram: bytes | memoryview, address: Address, segment: int = 0) -> int:
    return 0  # the endpoint is closed: what it would send is dropped, nothing leaves


class SocketEndpoint:
    """A socket bound for one endpoint, and who to tell when something happens on it."""

    def __init__(self, sock: socket.socket, endpoint: Endpoint, key: Any) -> None:
        self.sock = sock
        self.endpoint = endpoint
        self.key = key
        self.scheduled = math.inf
        self.last_flush = -math.inf
        #: the driver's tick when an offer last sent from this endpoint at once
        self.flush_tick = -1
        self.blocked = False
        #: a task waits for the socket to become writable again (blocked is set)
        self.awaiting_writable = False
        self.closed = False
        #: called after datagrams were handled or the endpoint was serviced
        self.listeners: list[Callable[[], None]] = []
        #: receive endpoints: where image events go
        self.on_image_event: Callable[[ImageAvailable | ImageUnavailable], None] | None = None
        self.local_address: Address = sock.getsockname()
        self.send = self._make_send()
        #: datagrams may arrive coalesced (UDP GRO): read them with their segment size
        self.gro = False
        #: what the driver's timer heaps hold instead of the endpoint itself
        self.timer_handle = _TimerHandle(self)
        # Lending (receive endpoints, Driver.read_as_application):
        #: the reader task has handed the socket to application tasks and sleeps
        self.lent = False
        self.reader_lot = trio.lowlevel.ParkingLot()
        #: an application task is waiting on the socket right now
        self.borrowed = False
        #: when the last application task stopped waiting on it
        self.returned_at = -math.inf
        #: the pending lend check (while lent there is always one) and its backoff
        self.lend_check_at = math.inf
        self.lend_check_interval = _LEND_IDLE
        #: application tasks parked until this endpoint is serviced by someone else
        self.activity_waiters = 0

    def _make_send(self) -> Send:
        sendto = self.sock.sendto
        sendmsg = self.sock.sendmsg
        counters = self.endpoint.counters

        # Three closures that call each other one way only (send -> send_run -> send_one): no
        # cycle among them, so they go with the endpoint when it closes (see unregister).
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

        def send_run(datagram: bytes | memoryview, address: Address, segment: int) -> int:
            # Datagrams of `segment` bytes back to back (the last may be shorter): one
            # sendmsg with UDP_SEGMENT, the kernel (or the NIC) cuts them apart.
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

        def send(datagram: bytes | memoryview, address: Address, segment: int = 0) -> int:
            if segment:
                return send_run(datagram, address, segment)
            return send_one(datagram, address)

        return send

    def stop_runs(self) -> None:
        endpoint = self.endpoint
        if isinstance(endpoint, SendEndpoint) and endpoint.run_segments:
            endpoint.set_run_segments(0)
            endpoint.counters.gso_disabled += 1


class Driver:
    def __init__(self, config: TransportConfig, nursery: trio.Nursery) -> None:
        self.config = config
        self.nursery = nursery
        self.counters = Counters()
        self.rng = random.Random(config.seed) if config.seed is not None else random.SystemRandom()
        self._loss_rng = random.Random(config.seed)
        # Timers hold an endpoint through its `_TimerHandle`, which a closed endpoint empties:
        # an entry left in a heap does not keep a closed endpoint alive until it falls due.
        self._heap: list[tuple[float, int, _TimerHandle]] = []
        self._lend_checks: list[tuple[float, int, _TimerHandle]] = []
        # One receive buffer for every socket: a datagram is handled (copied into a term or
        # dropped) before the next is read, so the readers can share it, and a server with
        # 2,000 sockets does not hold 2,000 x 64 KiB of buffers.
        self._buffer = bytearray(_RECV_BUFFER)
        self._view = memoryview(self._buffer)
        self._seq = itertools.count()
        #: self.now() without its two lookups: read on every datagram and offer.
        #: (The run's clock: a MockClock under tests, so virtual time works the same.)
        self.now: Callable[[], float] = trio.lowlevel.current_clock().current_time
        self._dirty: set[SocketEndpoint] = set()
        self._wakeup = trio.lowlevel.ParkingLot()
        self._woken = False
        self._sleep_until = math.inf
        #: advanced whenever a driver task wakes (a socket was readable, a timer was due):
        #: offers made between two ticks were made without the network having a say
        self.tick = 0
        self.endpoints: dict[Any, SocketEndpoint] = {}
        self._closed = False
        self._next_session = self._random_unreserved(
            config.reserved_session_low, config.reserved_session_high
        )
        self._receiver_id_base = self.rng.getrandbits(63)
        self._receiver_ids = itertools.count(1)
        self.cookies = CookieJar() if config.validate_addresses else None
        self.limiter = RateLimiter(config.unvalidated_reply_rate, config.unvalidated_reply_burst)

    # ---------------------------------------------------------------- ids

    def next_session_id(self, taken: Callable[[int], bool]) -> int:
        """A session id outside the reserved range, not used by another publication here.

        Aeron jumps to `high + 1` when its counter enters the reserved range, so with Echo's
        range [1, 2^31 - 1] every such client got -2^31 and two of them clashed on the server.
        Here a counter that enters the reserved range restarts at a random allowed value.
        """
        low, high = self.config.reserved_session_low, self.config.reserved_session_high
        for _ in range(1 << 16):
            candidate = self._next_session
            self._next_session = ((candidate + 1 + 2**31) % 2**32) - 2**31
            if low <= candidate <= high:
                self._next_session = self._random_unreserved(low, high)
                continue
            if not taken(candidate):
                return candidate
        raise RuntimeError("no free session id outside the reserved range")

    def _random_unreserved(self, low: int, high: int) -> int:
        below = max(0, low - -(2**31))  # how many ids lie under the range
        above = max(0, 2**31 - 1 - high)
        pick = self.rng.randrange(below + above)
        return -(2**31) + pick if pick < below else high + 1 + (pick - below)

    def next_receiver_id(self) -> int:
        return (self._receiver_id_base + next(self._receiver_ids)) & 0x7FFFFFFFFFFFFFFF

    def initial_term_id(self) -> int:
        return self.rng.randrange(-(2**31), 2**31)

    # ---------------------------------------------------------------- sockets

    async def open_socket(self, bind: tuple[str, int], family: int) -> socket.socket:
        sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            sock.setblocking(False)
            for option, size in (
                (socket.SO_RCVBUF, self.config.socket_rcvbuf),
                (socket.SO_SNDBUF, self.config.socket_sndbuf),
            ):
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

    def register(self, sep: SocketEndpoint) -> None:
        self.endpoints[sep.key] = sep
        if self.config.gso:
            self._enable_offload(sep)
        self.nursery.start_soon(self._reader, sep)
        self.wake(sep)

    @staticmethod
    def _enable_offload(sep: SocketEndpoint) -> None:
        """UDP GSO for a publication's socket, GRO for a subscription's, where the OS has them."""
        endpoint = sep.endpoint
        try:
            if isinstance(endpoint, SendEndpoint):
                # Setting the socket's default segment size to 0 (none) only proves support.
                sep.sock.setsockopt(SOL_UDP, UDP_SEGMENT, 0)
                endpoint.set_run_segments(GSO_MAX_SEGMENTS)
            else:
                sep.sock.setsockopt(SOL_UDP, UDP_GRO, 1)
                sep.gro = True
        except OSError:
            pass  # not Linux, or an old kernel: one datagram per system call

    def unregister(self, sep: SocketEndpoint) -> None:
        if sep.closed:
            return
        sep.closed = True
        self.endpoints.pop(sep.key, None)
        self._dirty.discard(sep)
        trio.lowlevel.notify_closing(sep.sock)
        sep.sock.close()
        sep.reader_lot.unpark_all()  # a reader that lent the socket out sees it closed
        # Break the reference cycles through the endpoint (its send closure, the emitter the
        # send endpoint caches, the callbacks into the API objects), so that a closed stream's
        # sockets and term buffers are freed now, by reference counting, not by a later pass
        # of the cyclic collector (100-200 ms when a thousand clients leave at once).
        sep.send = _send_nothing
        sep.timer_handle.sep = None
        sep.listeners = []
        sep.on_image_event = None
        if isinstance(sep.endpoint, SendEndpoint):
            sep.endpoint.forget_send()

    # ---------------------------------------------------------------- scheduling

    def wake(self, sep: SocketEndpoint) -> None:
        """Ask the timer loop to service `sep` as soon as the current task yields."""
        self._dirty.add(sep)
        if not self._woken:
            self._woken = True
            self._wakeup.unpark_all()

    def flush(self, sep: SocketEndpoint, publication: PublicationState, now: float) -> None:
        """Send what an offer just appended: at once, unless this is a burst.

        An offer that answers something (a driver task ran since this endpoint last sent at
        once, e.g. the reader delivered the message being echoed) or that follows a quiet spell
        goes out at once, inside `offer`, saving a task switch on the latency path. Offers that
        follow one another with nothing in between are a burst: they wait for the timer loop,
        which runs when the offering task yields, and go out batched into as few datagrams as
        fit.
        """
        if sep.blocked or sep.closed:
            self.wake(sep)
            return
        tick = self.tick
        if tick == sep.flush_tick and now - sep.last_flush < _BURST_GAP:
            self.wake(sep)
            return
        sep.flush_tick = tick
        sep.last_flush = now
        endpoint = sep.endpoint
        assert isinstance(endpoint, SendEndpoint)
        endpoint.flush(publication, now, sep.send)
        if sep.blocked:
            self._await_writable_soon(sep)
            return
        # Only this publication's deadlines moved (a probe heartbeat may now be due soon).
        self._schedule_at(sep, publication.next_deadline(now), now)

    def service(self, sep: SocketEndpoint, now: float) -> None:
        if sep.closed:
            return
        endpoint = sep.endpoint
        endpoint.poll(now, sep.send)
        if isinstance(endpoint, ReceiveEndpoint) and endpoint.events:
            events = endpoint.events[:]
            endpoint.events.clear()
            if sep.on_image_event is not None:
                for event in events:
                    sep.on_image_event(event)
            if sep.borrowed:
                # An image came or went while an application task waits on the socket.
                self.wake_borrower(sep)
        for listener in sep.listeners:
            listener()
        self._schedule(sep, now)

    def _schedule(self, sep: SocketEndpoint, now: float) -> None:
        if sep.blocked:
            self._await_writable_soon(sep)  # the writable waiter re-queues it
            return
        self._schedule_at(sep, sep.endpoint.next_deadline(now), now)

    def _schedule_at(self, sep: SocketEndpoint, deadline: float, now: float) -> None:
        """Make sure the timer loop services `sep` no later than `deadline`."""
        if deadline <= now:
            self.wake(sep)
            return
        if deadline < sep.scheduled or sep.scheduled <= now:
            sep.scheduled = deadline
            if deadline != math.inf:
                heapq.heappush(self._heap, (deadline, next(self._seq), sep.timer_handle))
                if deadline < self._sleep_until and not self._woken:
                    # The timer loop sleeps until a later time: wake it to re-arm.
                    self._woken = True
                    self._wakeup.unpark_all()

    async def timer_loop(self) -> None:
        heap = self._heap
        checks = self._lend_checks
        while not self._closed:
            now = self.now()
            if checks and checks[0][0] <= now:
                self._check_lent(now)
            due: list[SocketEndpoint] = []
            while heap and heap[0][0] <= now:
                deadline, _, handle = heapq.heappop(heap)
                sep = handle.sep
                if sep is not None and deadline == sep.scheduled:
                    sep.scheduled = math.inf
                    due.append(sep)
            if self._dirty:
                due.extend(self._dirty)
                self._dirty.clear()
            self._woken = False
            for sep in due:
                if sep.closed or sep.blocked:
                    continue
                if sep.lent and not sep.borrowed:
                    # A lent socket nobody waits on may hold datagrams: the timers must act
                    # on what has arrived, so read it first.
                    self._drain(sep, timers_due=True)
                else:
                    self.service(sep, now)
            # (This frame would otherwise keep the last endpoint serviced alive while it sleeps.)
            due = []
            sep = None
            if self._dirty:
                # Something is due again at once (more data than one poll sends): let other
                # tasks run, then go round again.
                await trio.lowlevel.checkpoint()
                continue
            timeout = heap[0][0] if heap else math.inf
            if checks and checks[0][0] < timeout:
                timeout = checks[0][0]
            self._sleep_until = timeout
            with trio.move_on_at(timeout):
                if not self._woken:
                    await self._wakeup.park()
            self._sleep_until = -math.inf
            self.tick += 1

    def _await_writable_soon(self, sep: SocketEndpoint) -> None:
        if not sep.awaiting_writable and not sep.closed:
            sep.awaiting_writable = True
            self.nursery.start_soon(self._await_writable, sep)

    async def _await_writable(self, sep: SocketEndpoint) -> None:
        try:
            while True:
                try:
                    await trio.lowlevel.wait_writable(sep.sock)
                    break
                except (trio.ClosedResourceError, OSError):
                    if sep.closed:
                        return
                    # `wake_borrower` woke every waiter of the socket: wait again.
        finally:
            sep.awaiting_writable = False
        sep.blocked = False
        self.wake(sep)

    def _drain(self, sep: SocketEndpoint, timers_due: bool = False) -> int:
        """Handle every datagram waiting on the socket (up to a budget), then service the
        endpoint; returns how many were handled. Never blocks."""
        self.tick += 1
        now = self.now()
        endpoint = sep.endpoint
        counters = self.counters
        buffer = self._buffer
        view = self._view
        sock = sep.sock
        gro = sep.gro
        recvfrom_into = sock.recvfrom_into
        recvmsg_into = sock.recvmsg_into
        buffers = [buffer]
        received = 0
        for attempt in range(_READ_BUDGET):
            if attempt == 1 and not _more_waiting(sock):
                # Usually one datagram per wake-up (an echo): asking the kernel whether
                # another is queued costs a third of a read that fails with EAGAIN.
                break
            try:
                if gro:
                    size, ancillary, _, source = recvmsg_into(buffers, _GRO_CMSG_SPACE)
                else:
                    size, source = recvfrom_into(buffer)
            except BlockingIOError:
                break
            except OSError:
                # ECONNREFUSED from an ICMP port-unreachable and the like: count and go on.
                counters.receive_errors += 1
                continue
            if gro and ancillary:
                # Several datagrams coalesced by the kernel (UDP GRO): `segment` bytes each,
                # the last maybe shorter. If they continue one another on one image (a run the
                # sender made with GSO) they are handled as one; else each as if it came alone.
                segment = _gro_segment(ancillary, size)
                counters.gro_batches_received += 1
                if not self.config.test_receive_loss:
                    assert isinstance(endpoint, ReceiveEndpoint)
                    try:
                        count = endpoint.on_datagram_run(view[:size], segment, source, now)
                    except Exception:  # as in _handle: count, log, go on
                        counters.invalid("internal_error")
                        _log.exception("datagram_handling_failed", source=str(source))
                        count = -1
                    if count:
                        if count > 0:
                            counters.datagrams_received += count
                            counters.bytes_received += size
                            received += count
                        continue
                for start in range(0, size, segment):
                    end = min(start + segment, size)
                    self._handle(endpoint, view[start:end], source, now)
                    received += 1
                continue
            self._handle(endpoint, view[:size], source, now)
            received += 1
        if timers_due or (
            received
            and not (
                sep.lent
                and not sep.activity_waiters
                and isinstance(endpoint, ReceiveEndpoint)
                and endpoint.quiet()
            )
        ):
            # (Skipped when an application task reads a lent socket and the datagrams were
            # data in order: no SM or NAK is due, no image came or went, nobody else to
            # wake. The messages are there for its next poll; timers run as scheduled.)
            self.service(sep, now)
        return received

    def _handle(self, endpoint: Endpoint, data: memoryview, source: Address, now: float) -> None:
        counters = self.counters
        counters.datagrams_received += 1
        counters.bytes_received += len(data)
        loss = self.config.test_receive_loss
        if loss and self._loss_rng.random() < loss:
            counters.dropped_by_test_loss += 1
            return
        try:
            endpoint.on_datagram(data, source, now)
        except Exception:  # a bug must not take the transport down: count, log, go on
            counters.invalid("internal_error")
            if counters.invalid_by_reason["internal_error"] <= 10:
                _log.exception("datagram_handling_failed", source=str(source))

    async def _reader(self, sep: SocketEndpoint) -> None:
        sock = sep.sock
        while not sep.closed:
            if sep.lent:
                await sep.reader_lot.park()
                continue
            try:
                await trio.lowlevel.wait_readable(sock)
            except (trio.ClosedResourceError, OSError):
                return
            if sep.closed:
                return
            if not self._drain(sep):
                await trio.lowlevel.checkpoint()
            elif sep.activity_waiters:
                self._lend(sep)

    # ---------------------------------------------------------------- lending
    #
    # An application task waiting for a subscription (`receive`, `wait_activity`) would be
    # woken by the reader task after each datagram: one more pass of trio's scheduler on every
    # message's path. Instead, once the reader sees such a task, it lends it the socket and
    # sleeps: the task then waits on the socket itself and handles what arrives, as a plain
    # trio UDP program does. The socket goes back to the reader when no task has waited on it
    # for _LEND_IDLE; meanwhile the timer loop and `Subscription.poll` read it if they need
    # fresh data, so nothing waits on a task that walked away.

    def _lend(self, sep: SocketEndpoint) -> None:
        sep.lent = True
        sep.returned_at = self.now()
        sep.lend_check_interval = _LEND_IDLE
        self._queue_lend_check(sep, sep.returned_at + _LEND_IDLE)

    async def read_as_application(self, sep: SocketEndpoint) -> bool:
        """Wait on `sep`'s socket in the calling task and handle what arrives.

        Returns False at once if the socket is not lent out (or another task is already
        waiting on it): the caller then waits for the endpoint's notification instead.
        """
        if not sep.lent or sep.borrowed or sep.closed:
            return False
        sep.borrowed = True
        try:
            await trio.lowlevel.wait_readable(sep.sock)
        except (trio.ClosedResourceError, OSError):
            # The socket is closing (the caller sees `sep.closed`), or `wake_borrower`.
            pass
        finally:
            sep.borrowed = False
            sep.returned_at = self.now()
        if not sep.closed:
            self._drain(sep)
        return True

    def wake_borrower(self, sep: SocketEndpoint) -> None:
        """Wake the application task waiting on `sep`'s socket: something happened that did
        not come through the socket (an image timed out, the subscription is closing).

        A task in `wait_readable` wakes only on readability or `notify_closing`; a cancel scope
        around every wait would cost more than the task switch that lending saves (3.4 µs
        here), so the rare wake-up uses `notify_closing`. It only tells the waiters (the
        borrower, and a task waiting to write, which waits again); the socket stays open and
        the next `wait_readable` registers it anew.
        """
        if sep.borrowed and not sep.closed:
            trio.lowlevel.notify_closing(sep.sock)

    def stop_waiting(self, sep: SocketEndpoint) -> None:
        """An application task that waited on `sep` goes off to do something else."""
        if sep.lent and sep.activity_waiters:
            # Other tasks are parked waiting for this endpoint, and nobody reads it now.
            self._give_back(sep)

    def drain_if_stale(self, sep: SocketEndpoint) -> None:
        """Read a lent socket that nobody has waited on for a while (`Subscription.poll`)."""
        if sep.lent and not sep.borrowed and not sep.closed:
            if self.now() - sep.returned_at >= _LEND_IDLE:
                self._drain(sep)

    def _queue_lend_check(self, sep: SocketEndpoint, when: float) -> None:
        sep.lend_check_at = when
        heapq.heappush(self._lend_checks, (when, next(self._seq), sep.timer_handle))
        if when < self._sleep_until and not self._woken:
            self._woken = True
            self._wakeup.unpark_all()

    def _check_lent(self, now: float) -> None:
        checks = self._lend_checks
        while checks and checks[0][0] <= now:
            when, _, handle = heapq.heappop(checks)
            sep = handle.sep
            if sep is None or when != sep.lend_check_at:
                continue
            sep.lend_check_at = math.inf
            if not sep.lent or sep.closed:
                continue
            if sep.borrowed:
                # In use: look again later, less and less often while it stays in use.
                sep.lend_check_interval = min(2 * sep.lend_check_interval, _LEND_CHECK_MAX)
                self._queue_lend_check(sep, now + sep.lend_check_interval)
            elif now - sep.returned_at >= _LEND_IDLE:
                self._give_back(sep)
            else:
                self._queue_lend_check(sep, sep.returned_at + _LEND_IDLE)

    def _give_back(self, sep: SocketEndpoint) -> None:
        """The reader task waits on the socket again (no application task does now)."""
        sep.lent = False
        sep.lend_check_at = math.inf
        sep.reader_lot.unpark_all()

    def close(self) -> None:
        self._closed = True
        for sep in list(self.endpoints.values()):
            self.unregister(sep)
        self._wakeup.unpark_all()
