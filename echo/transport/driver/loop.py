"""The trio driver: the only module that runs sockets.

It owns one non-blocking UDP socket per channel endpoint (sockets.py), one reader task for all
of them (readiness.py: it waits on one epoll set and drains each ready socket until it would
block, docs/architecture.md, Performance rules; a task per socket where there is no epoll), and one
timer loop for the whole transport that sleeps until the earliest deadline of any socket. The
protocol itself lives in the pure endpoints of sender.py and receiver.py; the driver hands them
datagrams with `now = trio.current_time()` and gives them a `send` that writes to the socket.
Streams are wired by wiring.py, which hands the api a channel (channels.py).
"""

from __future__ import annotations

import math
import random
import socket
from collections.abc import Callable
from typing import Any

import structlog
import trio

from echo.transport.core.config import TransportConfig
from echo.transport.core.counters import Counters
from echo.transport.core.destinations import Address
from echo.transport.core.offering import BURST_GAP, Ticker
from echo.transport.core.receiver import PublicationImage, ReceiveEndpoint
from echo.transport.core.sender import NetworkPublication, SendEndpoint
from echo.transport.core.timerheap import TimerHeap
from echo.transport.core.validation import CookieJar, RateLimiter
from echo.transport.driver.channels import PublicationChannel, SubscriptionChannel
from echo.transport.driver.lending import LendingDriver
from echo.transport.driver.readiness import Readiness, open_readiness
from echo.transport.driver.sockets import (
    GRO_CMSG_SPACE,
    DriverSocket,
    ReceiveSocket,
    SendSocket,
    SocketFactory,
    gro_segment,
    more_waiting,
    open_udp_socket,
)
from echo.transport.driver.wiring import (
    StreamIds,
    open_publication,
    open_subscription,
    release_publication,
    release_subscription,
    shut_down,
)

_log = structlog.get_logger("echo.transport")

# Datagrams drained from one socket before the reader yields to other tasks.
_READ_BUDGET = 256
# A socket last read at least this long ago is read once per wake-up (see _drain).
_READ_QUIET = 0.01
#: The timer loop woke this much after its alarm: the process stalled (load, a long pass), and
#: a due socket is read before its timers act (`_service_due`).
_LATE = 0.1
_RECV_BUFFER = 65536
#: internal errors logged with their traceback before the rest are only counted
_LOGGED_INTERNAL_ERRORS = 10


class Driver(LendingDriver):
    def __init__(
        self,
        config: TransportConfig,
        nursery: trio.Nursery,
        socket_factory: SocketFactory = open_udp_socket,
    ) -> None:
        self.config = config
        self._socket_factory = socket_factory
        self.nursery = nursery
        self.counters = Counters()
        self.rng = random.Random(config.seed) if config.seed is not None else random.SystemRandom()
        #: socket deadlines and lend checks, and the alarm of the one timer loop
        self.timers: TimerHeap[DriverSocket] = TimerHeap()
        # One receive buffer for every socket: a datagram is handled (copied into a term or
        # dropped) before the next is read, so the readers can share it, and a server with
        # 2,000 sockets does not hold 2,000 x 64 KiB of buffers.
        self._buffer = bytearray(_RECV_BUFFER)
        self._view = memoryview(self._buffer)
        #: the buffer as recvmsg_into takes it (a list, made once rather than on every read)
        self._buffers = [self._buffer]
        #: the run's clock, read on every datagram and offer: `trio.current_time()` without the
        #: look-up of the run on every read (trio's public clock interface; a MockClock under
        #: tests, so virtual time works the same). The core is given the time, never a clock.
        self.now: Callable[[], float] = trio.lowlevel.current_clock().current_time
        self._dirty: set[DriverSocket] = set()
        #: the same set, read by the offer path (PublicationChannel.offer): a socket in it is
        #: serviced on the timer loop's next pass, so an offer in a burst need not call `wake`
        self.pending: set[DriverSocket] = self._dirty
        self._wakeup = trio.lowlevel.ParkingLot()
        self._woken = False
        #: advanced whenever a driver task wakes (a socket was readable, a timer was due):
        #: offers made between two ticks were made without the network having a say
        self.ticker = Ticker()
        #: every open socket by its wiring key (wiring.py: a channel's socket is shared by the
        #: streams whose URIs name the same address)
        self.endpoints: dict[Any, DriverSocket] = {}
        self._closed = False
        self.cookies = CookieJar() if config.validate_addresses else None
        self.limiter = RateLimiter(config.unvalidated_reply_rate, config.unvalidated_reply_burst)
        self.ids = StreamIds(config, self.rng)
        #: the sockets read by the one reader task (None: a reader task per socket)
        self._readiness: Readiness[DriverSocket] | None = open_readiness()
        self._ready_reader = False
        #: publications closed with `close_soon`, still lingering in this driver's nursery
        self.lingering: set[PublicationChannel] = set()
        #: woken whenever one of them is done (Transport.settle)
        self.lingering_done = trio.lowlevel.ParkingLot()
        #: response subscriptions by registration id: where an RSP_SETUP is routed
        self.response_subscriptions: dict[int, SubscriptionChannel] = {}

    # ---------------------------------------------------------------- streams (wiring.py)

    async def add_publication(self, channel: str, stream_id: int) -> PublicationChannel:
        return await open_publication(self, channel, stream_id)

    async def add_subscription(self, channel: str, stream_id: int) -> SubscriptionChannel:
        return await open_subscription(self, channel, stream_id)

    def release_publication(self, publication: PublicationChannel) -> None:
        release_publication(self, publication)

    def release_subscription(self, subscription: SubscriptionChannel) -> None:
        release_subscription(self, subscription)

    @property
    def tick(self) -> int:
        return self.ticker.tick

    def shut_down(self) -> None:
        """Close every stream at once, telling peers (end-of-stream), then every socket."""
        shut_down(self)

    # ---------------------------------------------------------------- sockets

    def open_socket(self, bind: tuple[str, int], family: int) -> socket.socket:
        config = self.config
        return self._socket_factory(bind, family, config.socket_rcvbuf, config.socket_sndbuf)

    def register(self, udp: DriverSocket) -> None:
        self.endpoints[udp.key] = udp
        if self.config.gso:
            udp.enable_offload()
        readiness = self._readiness
        if readiness is not None and readiness.add(udp):
            udp.shared_reader = True
            if not self._ready_reader:
                self._ready_reader = True
                self.nursery.start_soon(self._read_ready, readiness)
        else:
            self.nursery.start_soon(self._reader, udp)
        self.wake(udp)

    def unregister(self, udp: DriverSocket) -> None:
        if udp.closed:
            return
        self.endpoints.pop(udp.key, None)
        self._dirty.discard(udp)
        if self._readiness is not None:
            # Before the close: the descriptor's number may be reused by the next socket.
            self._readiness.remove(udp)
        udp.close()

    @property
    def sockets(self) -> list[DriverSocket]:
        return list(self.endpoints.values())

    def publications(self) -> list[PublicationChannel]:
        """Every open publication, socket by socket."""
        return [
            publication
            for udp in self.endpoints.values()
            if isinstance(udp, SendSocket)
            for publication in udp.channels
            if isinstance(publication, PublicationChannel)
        ]

    def subscriptions(self) -> list[SubscriptionChannel]:
        """Every open subscription, socket by socket."""
        return [
            subscription
            for udp in self.endpoints.values()
            if isinstance(udp, ReceiveSocket)
            for subscription in udp.subscriptions.values()
            if isinstance(subscription, SubscriptionChannel)
        ]

    # ---------------------------------------------------------------- scheduling

    def wake(self, udp: DriverSocket) -> None:
        """Ask the timer loop to service `udp` as soon as the current task yields."""
        self._dirty.add(udp)
        if not self._woken:
            self._woken = True
            self._wakeup.unpark_all()

    def flush(self, udp: SendSocket, publication: NetworkPublication, now: float) -> None:
        """Send what an offer just appended: at once, unless this is a burst.

        An offer that answers something (a driver task ran since this socket last sent at
        once, e.g. the reader delivered the message being echoed) or that follows a quiet spell
        goes out at once, inside `offer`, saving a task switch on the latency path. Offers that
        follow one another with nothing in between are a burst: they wait for the timer loop,
        which runs when the offering task yields, and go out batched into as few datagrams as
        fit.
        """
        if udp.blocked or udp.closed:
            self.wake(udp)
            return
        burst = udp.burst
        tick = self.ticker.tick
        # (Burst.in_burst inline: one interpreted call fewer per message sent at once)
        if tick == burst.flush_tick and now - burst.last_flush < BURST_GAP:
            self.wake(udp)
            return
        burst.flush_tick = tick
        burst.last_flush = now
        udp.endpoint.flush(publication, now, udp.send)
        if udp.blocked:
            self._await_writable_soon(udp)
            return
        # Only this publication's deadlines moved (a probe heartbeat may now be due soon).
        # (_schedule_at's and _schedule_by's bodies inline: one interpreted call fewer for
        # every message sent at once.)
        deadline, whole = udp.deadline_after_flush(publication, now)
        if not whole and deadline >= udp.scheduled:
            return
        if deadline <= now:
            self.wake(udp)
        else:
            self.timers.schedule(udp, deadline, now)

    def service(self, udp: DriverSocket, now: float) -> None:
        """Let the socket's endpoint act (send what is due), tell its channels, re-arm."""
        if udp.closed:
            return
        if isinstance(udp, SendSocket):
            udp.endpoint.poll(now, udp.send)
            udp.notify_channels()
        elif isinstance(udp, ReceiveSocket):
            # The receive side is pull-based: the core answers what to send (status messages,
            # NAKs, setup elicitations: small frames; one the socket cannot take now is lost
            # as UDP loses one and sent again on its timer) and what happened (image events).
            endpoint = udp.endpoint
            send = udp.send
            for datagram, address in endpoint.datagrams_to_send(now):
                send(datagram, address)
            if endpoint.has_events:
                udp.dispatch(endpoint.take_events())
                if udp.lending.borrowed:
                    # An image came or went while an application task waits on the socket.
                    self.wake_borrower(udp)
            udp.notify_subscriptions()
        self._schedule(udp, now)

    def consumed(self, udp: ReceiveSocket, images: list[PublicationImage]) -> None:
        """An application's poll consumed past the status-message threshold of `images`
        (window/4, or a sender waiting at the window's edge): their SMs go out now, not after
        a pass of the timer loop (the sender may be idle until they come)."""
        endpoint = udp.endpoint
        for image in images:
            endpoint.touch(image.session_id, image.stream_id)
        self.service(udp, self.now())

    def _schedule(self, udp: DriverSocket, now: float) -> None:
        if udp.blocked:
            self._await_writable_soon(udp)  # the writable waiter re-queues it
            return
        self._schedule_at(udp, udp.endpoint.next_deadline(now), now)

    def _schedule_at(self, udp: DriverSocket, deadline: float, now: float) -> None:
        """`deadline` is when `udp` must next be serviced: its endpoint's whole deadline,
        which may have moved later (timerheap.py)."""
        if deadline <= now:
            self.wake(udp)
        else:
            self.timers.schedule(udp, deadline, now)

    def _due(self, now: float) -> list[DriverSocket]:
        """The sockets whose timers fell due, and those woken meanwhile."""
        due = self.timers.due(now)
        if self._dirty:
            due.extend(self._dirty)
            self._dirty.clear()
        return due

    def _service_due(self, now: float, late: bool = False) -> None:
        due = self._due(now)
        self._woken = False
        for udp in due:
            if udp.closed or udp.blocked:
                continue
            lending = udp.lending
            if lending is not None and lending.lent and not lending.borrowed:
                # A lent socket nobody waits on may hold datagrams: the timers must act on
                # what has arrived, so read it first.
                self._drain(udp, timers_due=True)
            elif late and more_waiting(udp.sock, udp.fionread):
                # The process stalled (the timers are late): datagrams that came meanwhile
                # wait unread, since the reader wakes with the timers, not before them. Read
                # them first, or the timers would take our own backlog for a silent peer
                # (under load, a server closed members whose heartbeats sat in its sockets).
                self._drain(udp, timers_due=True)
            else:
                self.service(udp, now)

    async def timer_loop(self) -> None:
        timers = self.timers
        alarm_at = math.inf
        while not self._closed:
            now = self.now()
            self._check_lent(now)
            # (In a method of its own: this frame would otherwise keep the last socket
            # serviced alive while it sleeps.)
            self._service_due(now, now - alarm_at > _LATE)
            if self._dirty:
                # Something is due again at once (more data than one poll sends): let other
                # tasks run, then go round again.
                alarm_at = math.inf
                await trio.lowlevel.checkpoint()
                continue
            with trio.move_on_at(timers.next_alarm()) as alarm:
                if not self._woken:
                    timers.sleeping(alarm)
                    await self._wakeup.park()
            timers.awake()
            # (The heap moves the alarm while we sleep: its deadline now is the one we woke for.)
            alarm_at = alarm.deadline
            self.ticker.tick += 1

    def _await_writable_soon(self, udp: DriverSocket) -> None:
        if not udp.awaiting_writable and not udp.closed:
            udp.awaiting_writable = True
            self.nursery.start_soon(self._await_writable, udp)

    async def _await_writable(self, udp: DriverSocket) -> None:
        try:
            while True:
                try:
                    await trio.lowlevel.wait_writable(udp.sock)
                    break
                except (trio.ClosedResourceError, OSError):
                    if udp.closed:
                        return
                    # `wake_borrower` woke every waiter of the socket: wait again.
        finally:
            udp.awaiting_writable = False
        udp.blocked = False
        self.wake(udp)

    # ---------------------------------------------------------------- reading

    def _drain(
        self,
        udp: DriverSocket,
        timers_due: bool = False,
        now: float | None = None,
    ) -> int:
        """Handle every datagram waiting on the socket (up to a budget), then service the
        socket; returns how many were handled. Never blocks. (`now`: the clock just read by
        the caller, so that one read serves both.)"""
        self.ticker.tick += 1
        if now is None:
            now = self.now()
        endpoint = udp.endpoint
        counters = self.counters
        buffer = self._buffer
        view = self._view
        sock = udp.sock
        gro = udp.gro
        recvfrom_into = sock.recvfrom_into
        recvmsg_into = sock.recvmsg_into
        buffers = self._buffers
        # A send socket's NAK that makes a resend due is acted on before the next read
        # (SendEndpoint.repair): the socket may hold many more behind it.
        repairs = endpoint if isinstance(endpoint, SendEndpoint) else None
        received = 0
        # A socket that was quiet (not read for _READ_QUIET: an idle stream's heartbeat or
        # status message, a message a second) has one datagram: read it and stop. Whatever
        # else came leaves the socket readable, and every reader waits on it again (the
        # readiness set is level-triggered), so it is read on the next pass. A socket read
        # moments ago is busy: drain it, asking the kernel (FIONREAD) after the first
        # datagram whether another is queued, which costs a third of a read that fails with
        # EAGAIN. (That question per idle datagram was 7-9 % of an idle server's samples.)
        alone = now - udp.read_at >= _READ_QUIET
        udp.read_at = now
        for attempt in range(_READ_BUDGET):
            if attempt == 1:
                if alone:
                    break
                if not more_waiting(sock, udp.fionread):
                    break
            try:
                if gro:
                    size, ancillary, _, source = recvmsg_into(buffers, GRO_CMSG_SPACE)
                else:
                    size, source = recvfrom_into(buffer)
            except BlockingIOError:
                break
            except OSError:
                # ECONNREFUSED from an ICMP port-unreachable and the like: count and go on.
                counters.receive_errors += 1
                continue
            if gro and ancillary and isinstance(endpoint, ReceiveEndpoint):
                received += self._handle_coalesced(
                    endpoint, view[:size], gro_segment(ancillary, size), source, now
                )
                continue
            # (_handle's body, inline: one interpreted call fewer per datagram read.)
            counters.datagrams_received += 1
            counters.bytes_received += size
            try:
                endpoint.on_datagram(view[:size], source, now)
            except Exception:  # a bug must not take the transport down: count, log, go on
                self._handle_failed(source)
            received += 1
            if repairs is not None and repairs.repair_due:
                repairs.repair(now, udp.send)
        if timers_due or (received and not udp.quiet_after_read()):
            # (Skipped when an application task reads a lent socket and the datagrams were
            # data in order: no SM or NAK is due, no image came or went, nobody else to
            # wake. The messages are there for its next poll; timers run as scheduled.)
            self.service(udp, now)
        return received

    def _read_lent(self, udp: ReceiveSocket, now: float) -> None:
        """What the borrower of a lent socket reads when its wait wakes: `_drain`'s first
        datagram, then the service if one is due. A socket read moments ago (busy) may have
        more queued: the borrower's next wait asks first (Lending.unasked), after the
        application has answered this one. (Its own method, without `_drain`'s loop, budget
        and question: one read per message of an echo, each side.)"""
        self.ticker.tick += 1
        busy = now - udp.read_at < _READ_QUIET
        udp.read_at = now
        endpoint = udp.endpoint
        counters = self.counters
        lending = udp.lending
        try:
            if udp.gro:
                size, ancillary, _, source = udp.sock.recvmsg_into(self._buffers, GRO_CMSG_SPACE)
            else:
                size, source = udp.sock.recvfrom_into(self._buffer)
                ancillary = None
        except BlockingIOError:
            return
        except OSError:
            # ECONNREFUSED from an ICMP port-unreachable and the like: count and go on.
            counters.receive_errors += 1
            if busy:
                lending.unasked = True
            return
        if busy:
            lending.unasked = True
        if ancillary:
            received = self._handle_coalesced(
                endpoint, self._view[:size], gro_segment(ancillary, size), source, now
            )
            if not received:
                return
        else:
            counters.datagrams_received += 1
            counters.bytes_received += size
            try:
                endpoint.on_datagram(self._view[:size], source, now)
            except Exception:  # a bug must not take the transport down: count, log, go on
                self._handle_failed(source)
        if not (lending.lent and not lending.waiters and endpoint.quiet()):
            # (ReceiveSocket.quiet_after_read's body: the service is skipped when the data
            # came in order to a lent socket and nobody else waits, as in `_drain`.)
            self.service(udp, now)

    def _handle_coalesced(
        self, endpoint: ReceiveEndpoint, data: memoryview, segment: int, source: Address, now: float
    ) -> int:
        """Several datagrams coalesced by the kernel (UDP GRO): `segment` bytes each, the last
        maybe shorter. If they continue one another on one image (a run the sender made with
        GSO) they are handled as one; else each as if it came alone. Returns how many."""
        counters = self.counters
        counters.gro_batches_received += 1
        size = len(data)
        try:
            count = endpoint.on_datagram_run(data, segment, source, now)
        except Exception:  # as in _handle: count, log, go on
            counters.invalid("internal_error")
            _log.exception("datagram_handling_failed", source=str(source))
            count = -1
        if count > 0:
            counters.datagrams_received += count
            counters.bytes_received += size
            return count
        if count < 0:
            return 0
        handled = 0
        for start in range(0, size, segment):
            self._handle(endpoint, data[start : min(start + segment, size)], source, now)
            handled += 1
        return handled

    def _handle(
        self,
        endpoint: SendEndpoint | ReceiveEndpoint,
        data: memoryview,
        source: Address,
        now: float,
    ) -> None:
        counters = self.counters
        counters.datagrams_received += 1
        counters.bytes_received += len(data)
        try:
            endpoint.on_datagram(data, source, now)
        except Exception:  # a bug must not take the transport down: count, log, go on
            self._handle_failed(source)

    def _handle_failed(self, source: Address) -> None:
        """Handling a datagram raised (a bug): count it, log the first few (with the
        exception being handled)."""
        counters = self.counters
        counters.invalid("internal_error")
        if counters.invalid_by_reason["internal_error"] <= _LOGGED_INTERNAL_ERRORS:
            _log.exception("datagram_handling_failed", source=str(source))

    async def _read_ready(self, readiness: Readiness[DriverSocket]) -> None:
        """The reader of every socket in `readiness`: drains each one that is ready."""
        while not self._closed:
            try:
                await trio.lowlevel.wait_readable(readiness)
            except (trio.ClosedResourceError, OSError):
                return
            # (In a method of its own: this frame would otherwise keep the last socket read
            # alive while it waits, and a closed stream's socket must go at once.)
            self._read_ready_sockets(readiness)

    def _read_ready_sockets(self, readiness: Readiness[DriverSocket]) -> None:
        for udp in readiness.ready():
            if udp.closed:
                continue
            if not isinstance(udp, ReceiveSocket):
                self._drain(udp)
                continue
            lending = udp.lending
            endpoint = udp.endpoint
            data_before = endpoint.data_received
            if not self._drain(udp) or not lending.waiters:
                continue
            now = self.now()
            if lending.on_read(endpoint.data_received != data_before, now):
                # As `_reader` does: an application task waits on this busy socket's
                # subscriptions, so it reads the socket itself from now on; out of the set
                # until it is given back (`_give_back`).
                readiness.remove(udp)
                self.timers.queue_lend_check(udp, lending.lend(now))

    async def _reader(self, udp: DriverSocket) -> None:
        sock = udp.sock
        lending = udp.lending
        # (Receive sockets: the count of data datagrams tells a busy stream, LEND_BUSY.)
        endpoint = udp.endpoint if isinstance(udp, ReceiveSocket) else None
        while not udp.closed:
            if lending is not None and lending.lent:
                await lending.reader_lot.park()
                continue
            try:
                await trio.lowlevel.wait_readable(sock)
            except (trio.ClosedResourceError, OSError):
                return
            if udp.closed:
                return
            data_before = endpoint.data_received if endpoint is not None else 0
            if not self._drain(udp):
                await trio.lowlevel.checkpoint()
            elif lending is not None and endpoint is not None and lending.waiters:
                now = self.now()
                if lending.on_read(endpoint.data_received != data_before, now):
                    self.timers.queue_lend_check(udp, lending.lend(now))

    def close(self) -> None:
        self._closed = True
        for udp in list(self.endpoints.values()):
            self.unregister(udp)
        self._wakeup.unpark_all()
        for publication in list(self.lingering):
            publication.notify()  # shut down: their stream ended (shut_down announced it)
        readiness, self._readiness = self._readiness, None
        if readiness is not None:
            trio.lowlevel.notify_closing(readiness)
            readiness.close()
