"""Giving back the pages of a log that nothing can read again: a publication's and an image's.

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

An image (image.py) gives back what its subscriber has consumed, but not the term of a message
part-way assembled: its fragments are views of that term until its END arrives.

Pure: `now` is passed in.
"""

from __future__ import annotations

import math
from typing import Final

from echo.transport.core.appender import LogAppender
from echo.transport.core.liveness import ReceiverLiveness
from echo.transport.core.logbuffer import (
    PAGE_SIZE,
    PARTITION_COUNT,
    TermBuffers,
    compute_fragmented_length,
)

#: how often a publication gives its consumed pages back: at most a second's data stays
#: resident beyond what the publication must keep
RELEASE_INTERVAL: Final = 1.0


def give_back(log: TermBuffers, bits: int, start: int, floor: int, oldest_term: int) -> int:
    """Give back the whole pages of `log` in the positions [start, floor), no further back than
    the term `oldest_term` (an older term's partition holds a newer one now); returns the
    bytes. `start`: where the last call's `floor` was (its page was not given back whole)."""
    start -= start % PAGE_SIZE
    held_from = max(0, oldest_term) << bits
    if start < held_from:
        start = held_from
    given = 0
    while start < floor:
        term_start = (start >> bits) << bits
        end = min(floor, term_start + (1 << bits))
        index = (start >> bits) % PARTITION_COUNT
        given += log.release(index, start - term_start, end - term_start)
        start = end
    return given


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
        # The log holds the appender's term and the two before it.
        oldest = appender.term_count - (PARTITION_COUNT - 1)
        given = give_back(appender.log, appender.bits, self.released, floor, oldest)
        self.released = floor
        return given
