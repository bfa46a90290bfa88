"""The driver's half of socket lending (sockets.Lending).

An application task waiting on a subscription reads the subscription's socket itself, saving
the task switch from the driver's reader task to it; the driver keeps the checks that give the
socket back to its reader. `Driver` (loop.py) is a `LendingDriver`: this module holds those
methods, loop.py the rest (reading, timers, wiring).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from echo.transport.driver.sockets import DriverSocket, ReceiveSocket, more_waiting

if TYPE_CHECKING:
    from echo.transport.core.timerheap import TimerHeap
    from echo.transport.driver.channels import LentReader
    from echo.transport.driver.readiness import Readiness


class LendingDriver:
    """Lending, for `Driver`: what it needs of the driver is declared here."""

    now: Callable[[], float]
    timers: TimerHeap[DriverSocket]
    nursery: trio.Nursery
    _readiness: Readiness[DriverSocket] | None

    def _drain(self, udp: DriverSocket, *, now: float | None = None) -> int:
        raise NotImplementedError  # Driver's

    def _read_lent(self, udp: ReceiveSocket, now: float) -> None:
        raise NotImplementedError  # Driver's

    async def _reader(self, udp: DriverSocket) -> None:
        raise NotImplementedError  # Driver's

    def _give_back(self, udp: DriverSocket) -> None:
        """A lent socket goes back to its reader (the set's, or its own task's)."""
        lending = udp.lending
        assert lending is not None
        lending.give_back()  # (wakes the socket's own reader task, if it has one)
        readiness = self._readiness
        if not udp.shared_reader or readiness is None or udp.closed:
            return
        if not readiness.add(udp):
            # (Cannot happen for a socket that was in the set; if it does, read it alone.)
            udp.shared_reader = False
            self.nursery.start_soon(self._reader, udp)

    async def wait_lent(self, udp: ReceiveSocket, reader: LentReader) -> bool:
        """Lending's one entry for a channel: wait on the lent `udp` in the calling task until
        what arrives is news for `reader` (its subscription: data, an image that came or
        went, the end). True when it came; False when the socket is not lent to this task
        (not lent, another task reads it, or it went back to its reader because nothing but
        heartbeats came for LEND_BUSY): the caller then waits to be told, as on a socket that
        is not lent."""
        endpoint = udp.endpoint
        while True:
            data_before = endpoint.data_received
            events_before = reader.image_events
            if not await self.read_as_application(udp):
                return False
            if reader.has_news(data_before, events_before):
                return True
            if self.give_back_if_quiet(udp):
                return False

    async def read_as_application(self, udp: ReceiveSocket) -> bool:
        """Wait on `udp`'s socket in the calling task and handle what arrives.

        Returns False at once if the socket is not lent out (or another task is already
        waiting on it): the caller then waits for the channel's notification instead.
        """
        lending = udp.lending
        if not lending.lent or lending.borrowed or udp.closed:
            return False
        if lending.unasked:
            lending.unasked = False
            if more_waiting(udp.sock, udp.fionread):
                # More came than the last read took (a burst): read it now, without a wait.
                # (This read asks after each datagram, so the next call waits: no loop here
                # that never yields.)
                now = self.now()
                endpoint = udp.endpoint
                data_before = endpoint.data_received
                self._drain(udp, now=now)
                if endpoint.data_received != data_before:
                    lending.data_at = now
                return True
        lending.borrowed = True
        try:
            await trio.lowlevel.wait_readable(udp.sock)
        except (trio.ClosedResourceError, OSError):
            # The socket is closing (the caller sees `udp.closed`), or `wake_borrower`.
            pass
        finally:
            lending.borrowed = False
            # (One clock read for the wake-up, the read and the data: a few microseconds
            # apart at most, and three reads were 5 % of an echo's interpreted calls.)
            now = lending.returned_at = self.now()
        if not udp.closed:
            endpoint = udp.endpoint
            data_before = endpoint.data_received
            self._read_lent(udp, now)
            if endpoint.data_received != data_before:
                lending.data_at = now
        return True

    def give_back_if_quiet(self, udp: ReceiveSocket) -> bool:
        """The task that read the lent `udp` found nothing for it (heartbeats): if no data has
        come for LEND_BUSY, the socket goes back to the reader (sockets.LEND_BUSY). True if it
        did: the task then waits to be told, as on a socket that is not lent."""
        lending = udp.lending
        if not lending.lent or udp.closed or not lending.quiet(self.now()):
            return False
        self._give_back(udp)
        return True

    def wake_borrower(self, udp: ReceiveSocket) -> None:
        """Wake the application task waiting on `udp`'s socket: something happened that did
        not come through the socket (an image timed out, the subscription is closing).

        A task in `wait_readable` wakes only on readability or `notify_closing`; a cancel scope
        around every wait would cost more than the task switch that lending saves (3.4 µs
        here), so the rare wake-up uses `notify_closing`. It only tells the waiters (the
        borrower, and a task waiting to write, which waits again); the socket stays open and
        the next `wait_readable` registers it anew.
        """
        if udp.lending.borrowed and not udp.closed:
            trio.lowlevel.notify_closing(udp.sock)

    def stop_waiting(self, udp: ReceiveSocket) -> None:
        """An application task that waited on `udp` goes off to do something else."""
        lending = udp.lending
        if lending.lent and lending.waiters and not lending.borrowed:
            # Other tasks are parked waiting for this socket, and nobody reads it now. (With
            # many subscriptions on one socket, a shared server port, another task may be
            # reading it: the reader task must not wait on the same socket beside it.)
            self._give_back(udp)

    def drain_stale(self, udp: ReceiveSocket, now: float) -> None:
        """Read a lent socket that nobody has waited on for LEND_IDLE, so that datagrams may
        wait unread (`SubscriptionChannel.poll` checks, on every poll)."""
        self._drain(udp, now=now)

    def _check_lent(self, now: float) -> None:
        timers = self.timers
        for udp in timers.lend_checks_due(now):
            lending = udp.lending
            assert lending is not None
            if not lending.lent or udp.closed:
                continue
            again = lending.check(now)
            if again is None:
                self._give_back(udp)
            else:
                timers.queue_lend_check(udp, again)
