"""Giving back the pages of a publication's log that nothing can read again.

A log's terms are anonymous mmaps, backed page by page as the appender writes (logbuffer.py),
and a term is cleaned only when its partition comes round again, three terms on. So, left
alone, a long-lived publication holds in memory every page it has written, up to its three
terms: a server's all-clients channel, a few hundred bytes of replies per session, grew by them
for hours under churn. Here the publication gives its pages back as its receivers consume
them, once a second, and refuses NAKs for what it gave back (they read as zeros).

What nothing reads again: the scanner sends from the sender position on; a NAK is answered no
further back than the resend reach (retransmit.resend_length); a receiver NAKs only what it has
not consumed, and each receiver heard from has consumed up to its last status message's
position. A receiver not heard from yet made its image from a SETUP: for the connection
timeout after a SETUP went, the floor stays at or below the position that SETUP announced.

Pure: `now` is passed in.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Final

from echo.transport.core.appender import LogAppender
from echo.transport.core.liveness import ReceiverLiveness
from echo.transport.core.logbuffer import PAGE_SIZE, PARTITION_COUNT, compute_fragmented_length

#: how often a publication gives its consumed pages back: at most a second's data stays
#: resident beyond what the publication must keep
RELEASE_INTERVAL: Final = 1.0


class LogRelease:
    """What of one publication's log (its appender's) is given back, and when to look again."""

    __slots__ = ("appender", "due", "reach", "released", "setup_at", "setup_position", "timeout")

    def __init__(self, appender: LogAppender, now: float, timeout: float) -> None:
        self.appender = appender
        #: how far behind the sender position a NAK is answered: Aeron's half a term and a
        #: max-size message (retransmit.resend_length says why its fragmented length)
        self.reach = appender.term_length // 2 + compute_fragmented_length(
            appender.max_message_length, appender.max_payload
        )
        #: the log below this position is never read again: its pages are given back
        self.released = 0
        self.due = now + RELEASE_INTERVAL
        #: the last SETUP sent: the position it announced, and when; `timeout`: how long a
        #: receiver may take to answer it (the publication's connection timeout)
        self.setup_position = 0
        self.setup_at = -math.inf
        self.timeout = timeout

    def setup_sent(self, sender_position: int, now: float) -> float:
        """A SETUP went at `now`, announcing `sender_position`; returns `now`."""
        self.setup_position = sender_position
        self.setup_at = now
        return now

    def nak_reach(self, sender_position: int) -> int:
        """How far behind `sender_position` a NAK may be answered: never below `released`."""
        return min(self.reach, sender_position - self.released)

    def held(self, ranges: Iterable[tuple[int, int]]) -> Iterator[tuple[int, int]]:
        """The resends due whose bytes are still held (a range every receiver has since
        consumed was given back: it is dropped, never sent as zeros)."""
        return ((position, length) for position, length in ranges if position >= self.released)

    def floor(self, sender_position: int, liveness: ReceiverLiveness, now: float) -> int:
        """The position below which nothing will read the log again (see the module's note)."""
        consumed = min((r.position for r in liveness.receivers.values()), default=0)
        floor = max(sender_position - self.reach, consumed)
        if now < self.setup_at + self.timeout and self.setup_position < floor:
            floor = self.setup_position
        return max(floor, self.released)

    def poll(self, sender_position: int, liveness: ReceiverLiveness, now: float) -> int:
        """Once a release interval: give back the pages below `floor` not given back yet;
        returns the bytes given back."""
        if now < self.due:
            return 0
        self.due = now + RELEASE_INTERVAL
        floor = self.floor(sender_position, liveness, now)
        appender = self.appender
        bits = appender.bits
        # From the first page not given back yet, within the three terms the log holds (the
        # appender's and the two before it: an older one's partition was cleaned and reused).
        start = self.released - self.released % PAGE_SIZE
        held_from = max(0, appender.term_count - (PARTITION_COUNT - 1)) << bits
        if start < held_from:
            start = held_from
        self.released = floor
        given = 0
        while start < floor:
            term_start = (start >> bits) << bits
            end = min(floor, term_start + appender.term_length)
            index = (start >> bits) % PARTITION_COUNT
            given += appender.log.release(index, start - term_start, end - term_start)
            start = end
        return given
