"""Port ranges for tests that start servers on loopback.

A server now binds its whole duologue range when it starts, so a test must hand it a range
that nothing else takes between the probe and the bind. Two things used to: the kernel, which
gives ephemeral ports (32768-60999 on Linux) to every client socket of every test, and the
other pytest processes of `./dev test`, which run side by side and drew their ranges at random
from the same span. So the ranges come from below the ephemeral range, each pytest process
draws from its own share of it (`ECHO_TEST_PORT_SLOT`, set by `./dev test`; a lone pytest
takes the whole span), and within a process the ranges are handed out in turn rather than at
random, so that two tests of one process meet only after the share has wrapped around.
"""

from __future__ import annotations

import os
import socket
import threading

LOW, HIGH = 20000, 32768  # below Linux's ephemeral range
SLOTS = 4  # the pytest processes of `./dev test`


def _share() -> tuple[int, int]:
    slot = os.environ.get("ECHO_TEST_PORT_SLOT")
    if slot is None:
        return LOW, HIGH
    width = (HIGH - LOW) // SLOTS
    start = LOW + int(slot) % SLOTS * width
    return start, start + width


_lock = threading.Lock()
_cursor: int | None = None


def _all_free(base: int, offsets: list[int] | range) -> bool:
    socks: list[socket.socket] = []
    try:
        for offset in offsets:
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            socks.append(sock)
            sock.bind(("127.0.0.1", base + offset))
    except OSError:
        return False
    finally:
        for sock in socks:
            sock.close()
    return True


def free_ports(offsets: list[int] | range) -> int:
    """A base port p with p + every offset free on 127.0.0.1, not handed out lately."""
    global _cursor
    low, high = _share()
    span = max(offsets) + 1
    if span > high - low:
        raise ValueError(f"a span of {span} ports does not fit in {low}-{high}")
    with _lock:
        if _cursor is None:
            # a different start in each run, so that a rerun does not meet its own leftovers
            _cursor = low + os.getpid() * 97 % (high - low - span)
        for _ in range((high - low) // span + 1):
            base = _cursor
            if base + span > high:
                base = low
            _cursor = base + span
            if _all_free(base, offsets):
                return base
    raise RuntimeError(f"no {span} free ports in {low}-{high}")


def free_base(span: int) -> int:
    """A base port p such that p .. p+span-1 are free on 127.0.0.1."""
    return free_ports(range(span))
