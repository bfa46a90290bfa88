"""The driver's one timer loop: it services a socket when the socket's deadline comes, and not
at a deadline the socket has since moved later (driver.py `_schedule_at`, issue 13 item 5).

An offer that goes out at once pushes the publication's next deadline later: with
`probe_after_data` a probe heartbeat is due 2 ms after the last data, so a stream offered to
every millisecond never needs its probe. The timer heap used to keep the entry of the first
offer's probe, and the loop serviced the socket 2 ms after it for nothing, again and again.
Virtual time on the memory network, so a second of offers costs no real second.
"""

from __future__ import annotations

import math

import trio
import trio.testing

from echo.transport import TransportConfig, open_transport
from echo.transport.driver import Driver
from echo.transport.sockets import DriverSocket
from echo.transport.testing import MemoryNetwork

STREAM = 1001
CHANNEL = "aeron:udp?endpoint=127.0.0.1:40123"


def _count_timer_services(driver: Driver, udp: DriverSocket) -> list[float]:
    """When the timer loop finds `udp` due (its deadline came, or it was woken): a list that
    fills as the loop runs."""
    serviced: list[float] = []
    due = driver._due

    def counting(now: float) -> list[DriverSocket]:
        sockets = due(now)
        serviced.extend(now for found in sockets if found is udp)
        return sockets

    driver._due = counting  # type: ignore[method-assign]
    return serviced


async def test_a_deadline_moved_later_is_not_serviced_at_the_old_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    net = MemoryNetwork()
    config = TransportConfig(probe_after_data=True)
    async with (
        open_transport(config, socket_factory=net) as sender,
        open_transport(config, socket_factory=net) as receiver,
    ):
        sub = await receiver.add_subscription(CHANNEL, STREAM)
        pub = await sender.add_publication(CHANNEL, STREAM)
        await pub.wait_connected(timeout=5)
        driver = sender._driver
        udp = pub._channel.socket
        serviced = _count_timer_services(driver, udp)
        ticks = driver.tick
        got: list[bytes] = []
        # 1,000 offers 1 ms apart: each goes out at once (far more than the burst gap apart)
        # and moves the probe 2 ms past itself, so no probe is ever due.
        for index in range(1000):
            assert pub.offer(index.to_bytes(4, "little")) > 0
            await trio.sleep(0.001)
            sub.poll(lambda message: got.append(message.data), 10)
        assert len(got) >= 990
        # Nothing fell due on the publication's socket but the once-a-second housekeeping; the
        # old heap serviced it every 2 ms (about 500 times).
        assert len(serviced) <= 5, serviced[:10]
        # ... and the loop barely woke at all (the old one woke for each of those services).
        assert driver.tick - ticks <= 50
        # The probe still goes out once the offers stop.
        heartbeats = sender.counters.heartbeats_sent
        await trio.sleep(0.003)
        assert sender.counters.heartbeats_sent == heartbeats + 1


async def test_a_deadline_moved_earlier_is_serviced_at_the_new_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The other direction, which must not regress: a deadline brought nearer wakes the
    # sleeping loop at the nearer time.
    net = MemoryNetwork()
    config = TransportConfig(probe_after_data=True, heartbeat_interval=1.0)
    async with (
        open_transport(config, socket_factory=net) as sender,
        open_transport(config, socket_factory=net) as receiver,
    ):
        await receiver.add_subscription(CHANNEL, STREAM)
        pub = await sender.add_publication(CHANNEL, STREAM)
        await pub.wait_connected(timeout=5)
        await trio.sleep(2.0)  # quiet: the loop sleeps towards the next idle heartbeat
        heartbeats = sender.counters.heartbeats_sent
        sent_at = trio.current_time()
        assert pub.offer(b"tail") > 0
        with trio.fail_after(0.5):
            while sender.counters.heartbeats_sent == heartbeats:  # noqa: ASYNC110 (virtual)
                await trio.sleep(0.0001)
        # the probe, 2 ms after the data, not the idle heartbeat up to a second later
        assert trio.current_time() - sent_at < 0.003


def test_the_loop_never_sleeps_towards_a_deadline_that_moved_later() -> None:
    # The heap keeps the socket's entry where it was (lazy deletion); what the loop sleeps
    # until is the socket's current deadline, and when the old time passes nothing is due.
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            driver = Driver(TransportConfig(), nursery, socket_factory=MemoryNetwork())
            udp = _FakeSocket()
            now = trio.current_time()
            driver._schedule_at(udp, now + 1.0, now)  # type: ignore[arg-type]
            assert driver._next_timer() == now + 1.0
            driver._schedule_at(udp, now + 3.0, now)  # type: ignore[arg-type]
            assert driver._next_timer() == now + 3.0
            assert driver._due(now + 2.0) == []
            assert driver._due(now + 3.0) == [udp]
            assert udp.scheduled == math.inf
            # Moved later while its old entry is already due (the loop has not run yet).
            driver._schedule_at(udp, now + 4.0, now + 3.5)  # type: ignore[arg-type]
            driver._schedule_at(udp, now + 5.0, now + 3.5)  # type: ignore[arg-type]
            assert driver._due(now + 4.5) == []
            assert driver._due(now + 5.0) == [udp]
            # Brought nearer: a new entry, and the later one no longer counts.
            driver._schedule_at(udp, now + 8.0, now + 5.0)  # type: ignore[arg-type]
            driver._schedule_at(udp, now + 6.0, now + 5.0)  # type: ignore[arg-type]
            assert driver._due(now + 7.0) == [udp]
            assert driver._due(now + 9.0) == []
            # No deadline at all: nothing left to sleep towards.
            driver._schedule_at(udp, now + 10.0, now + 9.0)  # type: ignore[arg-type]
            driver._schedule_at(udp, math.inf, now + 9.0)  # type: ignore[arg-type]
            assert driver._next_timer() == math.inf
            nursery.cancel_scope.cancel()

    trio.run(main)


class _FakeSocket:
    """What the scheduling reads of a socket."""

    def __init__(self) -> None:
        from echo.transport.sockets import TimerHandle

        self.scheduled = math.inf
        self.queued = math.inf
        self.closed = False
        self.timer_handle = TimerHandle(self)  # type: ignore[arg-type]
