"""trim_heap: every server hands the pages glibc freed back to the kernel on a period."""

from __future__ import annotations

import sys

import pytest
import trio
import trio.testing

from echo.ops.heap import HEAP_TRIM_INTERVAL, malloc_trim, trim_heap


def test_trim_heap_trims_once_per_interval_until_cancelled() -> None:
    calls: list[float] = []

    async def main() -> None:
        with trio.move_on_after(3.5 * HEAP_TRIM_INTERVAL):
            await trim_heap(trim=lambda: calls.append(trio.current_time()))

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert calls == [HEAP_TRIM_INTERVAL * n for n in (1, 2, 3)]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_glibcs_malloc_trim_is_found_and_answers() -> None:
    trim = malloc_trim()
    assert trim is not None
    blocks = [bytearray(100_000) for _ in range(200)]  # freed below: something to give back
    del blocks
    assert trim() in (0, 1)
