"""The one path watch of a transport's sessions (echo.session.pathwatch)."""

from __future__ import annotations

import trio
import trio.testing

from echo.session.pathwatch import PathWatch, path_watch


async def test_a_waiter_wakes_within_one_interval_of_its_condition(
    autojump_clock: trio.testing.MockClock,
) -> None:
    watch = PathWatch(1.0)
    state = {"broken": False}
    woke: list[float] = []

    async def wait() -> None:
        await watch.until(lambda: state["broken"])
        woke.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait)
        await trio.sleep(3.5)
        assert not woke
        state["broken"] = True
        broke_at = trio.current_time()
    assert len(woke) == 1
    assert 0 < woke[0] - broke_at <= 1.0
    assert len(watch) == 0


async def test_a_condition_that_holds_returns_at_once() -> None:
    watch = PathWatch(1.0)
    with trio.fail_after(0.1):
        await watch.until(lambda: True)
    assert len(watch) == 0


async def test_many_waiters_one_look_each_only_those_whose_condition_holds(
    autojump_clock: trio.testing.MockClock,
) -> None:
    watch = PathWatch(1.0)
    broken = [False] * 100
    looks = [0] * 100
    woke: list[int] = []

    def condition(index: int) -> bool:
        looks[index] += 1
        return broken[index]

    async def wait(index: int) -> None:
        await watch.until(lambda: condition(index))
        woke.append(index)

    async with trio.open_nursery() as nursery:
        for index in range(100):
            nursery.start_soon(wait, index)
        await trio.sleep(10.5)
        # Once when each began waiting, then once a second: one task looks at all of them.
        assert looks == [11] * 100
        for index in range(0, 100, 10):
            broken[index] = True
        await trio.sleep(1.0)
        assert sorted(woke) == list(range(0, 100, 10))
        assert len(watch) == 90
        nursery.cancel_scope.cancel()
    # A cancelled waiter leaves the watch; with nobody waiting its task ends.
    assert len(watch) == 0
    await trio.sleep(2.0)
    assert not watch._running


async def test_a_condition_that_raises_wakes_its_waiter(
    autojump_clock: trio.testing.MockClock,
) -> None:
    watch = PathWatch(1.0)
    calls = 0

    def condition() -> bool:
        nonlocal calls
        calls += 1
        if calls > 1:
            raise RuntimeError("the stream is gone")
        return False

    with trio.fail_after(1.5):
        await watch.until(condition)


async def test_one_watch_per_transport() -> None:
    class Transport:
        pass

    first, second = Transport(), Transport()
    assert path_watch(first, 1.0) is path_watch(first, 1.0)
    assert path_watch(first, 1.0) is not path_watch(second, 1.0)
