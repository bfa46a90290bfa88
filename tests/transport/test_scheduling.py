"""The driver's one timer loop: it services a socket when the socket's deadline comes, and not
at a deadline the socket has since moved later (driver/loop.py `_schedule_at`, docs/profile-b4.txt).

An offer that goes out at once pushes the publication's next deadline later: with
`probe_after_data` a probe heartbeat is due 2 ms after the last data, so a stream offered to
every millisecond never needs its probe. The timer heap used to keep the entry of the first
offer's probe, and the loop serviced the socket 2 ms after it for nothing, again and again.
Virtual time on the memory network, so a second of offers costs no real second.

The rest hold the heap itself (timerheap.py) with stand-in sockets, no clock and no trio run:
superseded and closed entries, the lend checks of lent receive sockets (sockets.Lending) and
the sleeping loop's alarm. `./dev mutate timerheap` runs them.
"""

from __future__ import annotations

import math

import trio
import trio.testing

from echo.transport import TransportConfig, open_transport
from echo.transport.core.timerheap import (
    IDLE_AHEAD,
    IDLE_SLACK,
    LAZY_AHEAD,
    SLACK,
    TimerHeap,
    tier_of,
)
from echo.transport.driver.loop import Driver
from echo.transport.driver.sockets import DriverSocket, Lending, TimerHandle
from echo.transport.testing import MemoryNetwork

STREAM = 1001
CHANNEL = "aeron:udp?endpoint=127.0.0.1:40123"


def _count_timer_services(driver: Driver, udp: DriverSocket) -> list[float]:
    """When the timer heap hands `udp` to the loop as due: a list that fills as it runs."""
    serviced: list[float] = []
    due = driver.timers.due

    def counting(now: float) -> list[DriverSocket]:
        sockets = due(now)
        serviced.extend(now for found in sockets if found is udp)
        return sockets

    driver.timers.due = counting  # type: ignore[method-assign]
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
    timers = TimerHeap()
    udp = _FakeSocket()
    now = 100.0
    timers.schedule(udp, now + 1.0, now)  # type: ignore[arg-type]
    assert timers.next_alarm() == now + 1.0 + IDLE_SLACK  # (idle: set a second ahead)
    timers.schedule(udp, now + 3.0, now)  # type: ignore[arg-type]
    assert timers.next_alarm() == now + 3.0 + IDLE_SLACK
    assert timers.due(now + 2.0) == []
    assert timers.due(now + 3.0) == [udp]
    assert udp.scheduled == math.inf
    # Moved later while its old entry is already due (the loop has not run yet).
    timers.schedule(udp, now + 4.0, now + 3.5)  # type: ignore[arg-type]
    timers.schedule(udp, now + 5.0, now + 3.5)  # type: ignore[arg-type]
    assert timers.due(now + 4.5) == []
    assert timers.due(now + 5.0) == [udp]
    # Brought nearer: a new entry, and the later one no longer counts.
    timers.schedule(udp, now + 8.0, now + 5.0)  # type: ignore[arg-type]
    timers.schedule(udp, now + 6.0, now + 5.0)  # type: ignore[arg-type]
    assert timers.due(now + 7.0) == [udp]
    assert timers.due(now + 9.0) == []
    # No deadline at all: nothing left to sleep towards.
    timers.schedule(udp, now + 10.0, now + 9.0)  # type: ignore[arg-type]
    timers.schedule(udp, math.inf, now + 9.0)  # type: ignore[arg-type]
    assert timers.next_alarm() == math.inf
    # A closed socket's entry is forgotten.
    timers.schedule(udp, now + 11.0, now + 9.0)  # type: ignore[arg-type]
    udp.timer_handle.socket = None
    assert timers.next_alarm() == math.inf


def test_a_sleeping_loops_alarm_moves_with_the_deadline() -> None:
    timers = TimerHeap()
    udp = _FakeSocket()
    now = 100.0
    timers.schedule(udp, now + 10.0, now)  # type: ignore[arg-type]
    alarm = trio.CancelScope(deadline=timers.next_alarm())  # what the loop sleeps in
    timers.sleeping(alarm)
    # Nearer: the alarm comes forward at once (idle deadlines, set seconds ahead: IDLE_SLACK
    # late).
    timers.schedule(udp, now + 5.0, now)  # type: ignore[arg-type]
    assert alarm.deadline == now + 5.0 + IDLE_SLACK
    # Later, but the old time is still far off compared to the move: left alone (another
    # offer will most likely move it again first), and moved once it is near.
    timers.schedule(udp, now + 5.5, now)  # type: ignore[arg-type]
    assert alarm.deadline == now + 5.0 + IDLE_SLACK
    timers.schedule(udp, now + 9.0, now + 2.0)  # type: ignore[arg-type]
    assert alarm.deadline == now + 9.0 + IDLE_SLACK
    # A lazy one (set 0.2 s ahead: Aeron's status message interval): SLACK late.
    timers.schedule(udp, now + 8.2, now + 8.0)  # type: ignore[arg-type]
    assert alarm.deadline == now + 8.2 + SLACK
    # A precise deadline (set closer than LAZY_AHEAD): on time.
    timers.schedule(udp, now + 8.01, now + 8.0)  # type: ignore[arg-type]
    assert alarm.deadline == now + 8.01
    timers.awake()
    assert timers.sleep_until == -math.inf


def test_a_closed_sockets_entry_is_skipped_and_the_rest_still_fall_due() -> None:
    # A closed socket empties its TimerHandle; its entry stays in the heap until it comes up
    # and must then be passed over, not end the walk or be looked into.
    timers = TimerHeap()
    closed, live = _FakeSocket(), _FakeSocket()
    now = 100.0
    timers.schedule(closed, now + 1.0, now)  # type: ignore[arg-type]
    timers.schedule(live, now + 2.0, now)  # type: ignore[arg-type]
    closed.timer_handle.socket = None
    assert timers.due(now + 3.0) == [live]
    # ... and likewise an entry superseded by a nearer one, ahead of another socket's.
    superseded, other = _FakeSocket(), _FakeSocket()
    timers.schedule(superseded, now + 6.0, now + 3.0)  # type: ignore[arg-type]
    timers.schedule(superseded, now + 4.0, now + 3.0)  # type: ignore[arg-type]
    assert timers.due(now + 4.0) == [superseded]
    timers.schedule(other, now + 7.0, now + 4.0)  # type: ignore[arg-type]
    assert timers.due(now + 8.0) == [other]


def test_one_wake_up_serves_lazy_deadlines_within_slack_precise_ones_on_time() -> None:
    timers = TimerHeap()
    now = 100.0
    idle = [_FakeSocket() for _ in range(5)]
    # Five idle heartbeats set a second ahead, 5 ms apart: one wake-up, IDLE_SLACK after the
    # first, serves them all.
    for index, udp in enumerate(idle):
        timers.schedule(udp, now + 1.0 + index * 0.005, now)  # type: ignore[arg-type]
    alarm = timers.next_alarm()
    assert alarm == now + 1.0 + IDLE_SLACK
    assert set(timers.due(alarm)) == set(idle)
    # A probe 2 ms ahead among lazy deadlines (Aeron's cadence, 0.2 s ahead): the loop wakes
    # for it on time, and serves only what has come by then.
    probe = _FakeSocket()
    later = [_FakeSocket() for _ in range(2)]
    now = 200.0
    timers.schedule(later[0], now + 0.2, now)  # type: ignore[arg-type]
    timers.schedule(probe, now + 0.199, now + 0.197)  # type: ignore[arg-type]
    timers.schedule(later[1], now + 0.201, now)  # type: ignore[arg-type]
    assert timers.next_alarm() == now + 0.199
    assert timers.due(now + 0.199) == [probe]
    assert timers.next_alarm() == now + 0.2 + SLACK
    assert set(timers.due(now + 0.2 + SLACK)) == set(later)
    # A lazy deadline pushed on by data to a precise one (the probe after it): on time.
    timers.schedule(probe, now + 1.5, now + 0.5)  # type: ignore[arg-type]
    timers.schedule(probe, now + 1.502, now + 1.5)  # type: ignore[arg-type]
    assert timers.next_alarm() == now + 1.502
    assert LAZY_AHEAD > 0.002 > 0  # (a probe's delay is precise)
    assert timers.due(now + 1.502) == [probe]
    # An idle heartbeat pushed on to a lazy deadline: SLACK late at most, not IDLE_SLACK.
    timers.schedule(probe, now + 3.0, now + 2.0)  # type: ignore[arg-type]
    assert timers.next_alarm() == now + 3.0 + IDLE_SLACK
    timers.schedule(probe, now + 3.1, now + 3.0)  # type: ignore[arg-type]
    assert timers.next_alarm() == now + 3.1 + SLACK


def test_the_tiers_by_how_far_ahead_a_deadline_is_set() -> None:
    # Aeron's own cadence (a heartbeat 100 ms, an SM 200 ms ahead) is lazy, a session's or a
    # lobby's (0.5 s and more) idle, a probe, a NAK delay or a retransmit precise; the slack
    # stretches an interval by at most a tenth (lazy) and a sixteenth (idle).
    assert [tier_of(ahead) for ahead in (0.002, 0.1, 0.2, 0.5, 0.8, 1.5)] == [0, 1, 1, 2, 2, 2]
    assert SLACK / LAZY_AHEAD <= 0.1 and IDLE_SLACK / IDLE_AHEAD <= 1 / 16



def test_a_deadline_rescheduled_unchanged_adds_no_heap_entry() -> None:
    # The driver reschedules a socket after every service and every offer that goes out at
    # once, and often to the deadline it already has (the next housekeeping, status message or
    # heartbeat, which what just happened did not move): that must be no heap work at all, not
    # one entry per call (each pushed now, then popped and thrown away when it comes up).
    timers = TimerHeap()
    udp = _FakeSocket()
    now = 100.0
    for _ in range(1000):
        timers.schedule(udp, now + 1.0, now)  # type: ignore[arg-type]
    assert sum(map(len, timers._heaps)) == 1
    # ... and a socket with nothing due that is told so again holds no entry at all (one at
    # infinity never falls due: the heap would only grow).
    idle = _FakeSocket()
    for _ in range(1000):
        timers.schedule(idle, math.inf, now)  # type: ignore[arg-type]
    assert sum(map(len, timers._heaps)) == 1
    assert timers.due(now + 1.0) == [udp]


def test_a_running_loop_has_no_alarm_to_move() -> None:
    # Awake, the loop works out its next alarm itself before it sleeps again: a deadline set
    # meanwhile leaves `sleep_until` at -inf and the cancel scope of the last sleep alone.
    timers = TimerHeap()
    udp = _FakeSocket()
    now = 100.0
    alarm = trio.CancelScope(deadline=now + 10.0)
    timers.sleeping(alarm)
    assert timers.sleep_until == now + 10.0
    timers.awake()
    timers.schedule(udp, now + 1.0, now)  # type: ignore[arg-type]
    timers.queue_lend_check(_FakeSocket(Lending()), now + 0.5)  # type: ignore[arg-type]
    assert timers.sleep_until == -math.inf
    assert alarm.deadline == now + 10.0
    assert timers.next_alarm() == now + 0.5


def test_a_lend_check_falls_due_at_its_time_and_once() -> None:
    timers = TimerHeap()
    lending = Lending()
    udp = _FakeSocket(lending)
    now = 100.0
    when = lending.lend(now)
    timers.queue_lend_check(udp, when)  # type: ignore[arg-type]
    assert lending.check_at == when
    assert timers.next_alarm() == when
    assert timers.lend_checks_due(when - 0.0005) == []
    assert timers.lend_checks_due(when) == [udp]  # due at its time, not after it
    assert lending.check_at == math.inf  # no check pending until the driver queues one
    assert timers.lend_checks_due(when + 1.0) == []
    assert timers.next_alarm() == math.inf


def test_the_alarm_is_the_earlier_of_a_socket_deadline_and_a_lend_check() -> None:
    timers = TimerHeap()
    udp = _FakeSocket()
    lent = _FakeSocket(Lending())
    now = 100.0
    # (A deadline 2 s ahead is idle: the alarm for it is IDLE_SLACK later.)
    timers.schedule(udp, now + 2.0, now)  # type: ignore[arg-type]
    timers.queue_lend_check(lent, now + 5.0)  # type: ignore[arg-type]
    assert timers.next_alarm() == now + 2.0 + IDLE_SLACK
    timers.queue_lend_check(lent, now + 1.0)  # type: ignore[arg-type]
    assert timers.next_alarm() == now + 1.0
    assert timers.lend_checks_due(now + 1.0) == [lent]
    assert timers.next_alarm() == now + 2.0 + IDLE_SLACK


def test_a_lend_check_brings_a_sleeping_loops_alarm_forward() -> None:
    timers = TimerHeap()
    lent = _FakeSocket(Lending())
    now = 100.0
    alarm = trio.CancelScope(deadline=now + 10.0)
    timers.sleeping(alarm)
    timers.queue_lend_check(lent, now + 12.0)  # type: ignore[arg-type]
    assert (alarm.deadline, timers.sleep_until) == (now + 10.0, now + 10.0)
    timers.queue_lend_check(lent, now + 3.0)  # type: ignore[arg-type]
    assert (alarm.deadline, timers.sleep_until) == (now + 3.0, now + 3.0)


def test_a_given_back_sockets_old_lend_check_does_not_count() -> None:
    # The socket goes back to its reader (give_back) with its check still in the heap, and is
    # lent again: only the new check falls due, once, even when both have come.
    timers = TimerHeap()
    lending = Lending()
    udp = _FakeSocket(lending)
    now = 100.0
    first = lending.lend(now)
    timers.queue_lend_check(udp, first)  # type: ignore[arg-type]
    lending.give_back()
    second = lending.lend(now + 0.5)
    timers.queue_lend_check(udp, second)  # type: ignore[arg-type]
    assert first < second
    assert timers.lend_checks_due(second) == [udp]
    # A closed socket's pending check is passed over, and the walk goes on past it.
    closed, other = _FakeSocket(Lending()), _FakeSocket(Lending())
    timers.queue_lend_check(closed, now + 2.0)  # type: ignore[arg-type]
    timers.queue_lend_check(other, now + 3.0)  # type: ignore[arg-type]
    closed.timer_handle.socket = None
    assert timers.lend_checks_due(now + 3.0) == [other]


class _FakeSocket:
    """What the timer heap reads of a socket (a receive socket's has its Lending)."""

    def __init__(self, lending: Lending | None = None) -> None:
        self.scheduled = math.inf
        self.queued = math.inf
        self.queued_tier = 0
        self.lending = lending
        self.timer_handle = TimerHandle(self)  # type: ignore[arg-type]


def test_every_deadline_is_served_in_time_under_random_rescheduling() -> None:
    # A model check of the heap and the lazy slots: sockets rescheduled at random (nearer,
    # later, to no deadline at all, precise and lazy), the loop stepping from alarm to alarm.
    # Each socket with a deadline is served once it has come: precise ones exactly then, lazy
    # ones within SLACK; none is lost, none served early, none while it has no deadline.
    import random

    rng = random.Random(7)
    timers = TimerHeap()
    sockets = [_FakeSocket() for _ in range(40)]
    wanted: dict[int, float] = {}  # id(socket) -> its deadline (what the driver last set)
    slack_of: dict[int, float] = {}
    now = 1000.0
    for _ in range(3000):
        for udp in rng.sample(sockets, 3):
            ahead = rng.choice([0.0005, 0.002, 0.03, 0.06, 0.2, 0.8, 1.5, math.inf])
            deadline = now + ahead
            timers.schedule(udp, deadline, now)  # type: ignore[arg-type]
            if deadline == math.inf:
                wanted.pop(id(udp), None)
            else:
                wanted[id(udp)] = deadline
                slack_of[id(udp)] = (0.0, SLACK, IDLE_SLACK)[tier_of(ahead)]
        alarm = timers.next_alarm()
        earliest = min(wanted.values(), default=math.inf)
        assert alarm >= earliest or alarm == math.inf or earliest == math.inf
        if alarm == math.inf:
            assert not wanted
            continue
        # Step to the alarm, or a little before it now and then (a wake-up for other reasons).
        exact = rng.random() < 0.8
        now = alarm if exact else max(now, alarm - rng.random() * 0.01)
        for udp in timers.due(now):
            deadline = wanted.pop(id(udp))
            assert deadline <= now
            if exact:  # on time: a precise deadline at the alarm, the others within slack
                assert now - deadline <= slack_of[id(udp)] + 1e-9
        for udp in sockets:
            deadline = wanted.get(id(udp))
            if deadline is not None:
                # a precise deadline that came was served, the others within their slack
                assert deadline + slack_of[id(udp)] > now or deadline > now
