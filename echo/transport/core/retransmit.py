"""Retransmit handling for a publication: which NAKed ranges to resend, and which NAKs to
ignore because a resend of the same bytes is on its way (Aeron's RetransmitHandler).

Pure: `now` is passed in. The publication validates a NAK against its log, asks `on_nak`
whether to resend, and `resend_due` sends what is due from the log through the publication's
term scanner and its `emit`.
"""

from __future__ import annotations

import math

import attrs

from echo.transport.core.counters import Counters
from echo.transport.core.scanner import Emit, TermScanner

Range = tuple[int, int]  # (position, length)


def resend_length(position: int, length: int, sender_position: int, reach: int, cap: int) -> int:
    """How much of a NAK for `length` bytes at `position` may be resent: 0 for none.

    Only what was sent, and no further back than `reach` behind the sender position. Aeron's
    floor is `senderPosition - termLength/2 - maxMessageLength`, but a term-end PAD is skipped
    whole, so the sender position can pass the limit (SM position + window <= term/2) by up to
    the PAD, i.e. a max-size message's *fragmented* length less 64: with a window of term/2 the
    gap at the SM position then fell below the floor and its NAKs were ignored forever. The
    caller widens the floor by the headers (`reach`), which keeps that gap resendable and is
    still far inside the two terms the sender has not cleaned. `cap`: a multiple of the
    receiver window (Aeron 1.48: 16 x for unicast, 4 x for a group).
    """
    if position >= sender_position or position < max(0, sender_position - reach):
        return 0
    return min(length, sender_position - position, cap)


@attrs.define
class _Retransmit:
    position: int
    length: int
    sent: bool = False
    linger_until: float = 0.0


class RetransmitHandler:
    """Resends in flight: each NAKed range is sent once, then lingers for `linger` seconds, in
    which NAKs overlapping it are taken for duplicates (from a receiver, or a group, that has
    not yet seen the resend) and ignored."""

    __slots__ = ("_actions", "linger", "max_in_flight")

    def __init__(self, max_in_flight: int, linger: float) -> None:
        self.max_in_flight = max_in_flight
        self.linger = linger
        self._actions: list[_Retransmit] = []

    def __bool__(self) -> bool:
        return bool(self._actions)

    def on_nak(self, position: int, length: int, now: float) -> bool:
        """A NAK for [position, position + length): True if it is to be resent."""
        end = position + length
        live = [a for a in self._actions if not a.sent or now < a.linger_until]
        for action in live:
            if position < action.position + action.length and action.position < end:
                return False  # being resent, or just was
        self._actions = live
        if len(live) >= self.max_in_flight:
            return False
        live.append(_Retransmit(position, length))
        return True

    def due(self, now: float) -> list[Range]:
        """The ranges to resend now; from here they linger. Lingering that is over is dropped."""
        ranges: list[Range] = []
        keep: list[_Retransmit] = []
        linger_until = now + self.linger
        for action in self._actions:
            if not action.sent:
                ranges.append((action.position, action.length))
                action.sent = True
                action.linger_until = linger_until
                keep.append(action)
            elif now < action.linger_until:
                keep.append(action)
        self._actions = keep
        return ranges

    def unsent(self, start: int, reached: int) -> None:
        """The resend of the range `due` gave at `start` stopped at `reached` (the socket was
        full, or the scan's datagram bound came first): the rest is not on its way, so it is
        due again rather than lingering as if sent (NAKs for it stay duplicates meanwhile)."""
        for action in self._actions:
            if action.sent and action.position == start:
                end = action.position + action.length
                if reached < end:
                    action.position = reached
                    action.length = end - reached
                    action.sent = False
                return

    def next_deadline(self, now: float) -> float:
        """`now` if a resend is waiting, else when the first linger ends (inf: none)."""
        deadline = math.inf
        for action in self._actions:
            if not action.sent:
                return now
            if action.linger_until < deadline:
                deadline = action.linger_until
        return deadline


def resend_due(
    handler: RetransmitHandler, now: float, scanner: TermScanner, emit: Emit, counters: Counters
) -> None:
    """Send the ranges `handler` has due at `now`, whole frames out of the log (`scanner`).

    A full socket (WOULD_BLOCK) stops the resends: what was not sent stays due, and the driver
    polls again once the socket is writable. A range the scan's datagram bound cut short is
    continued on the next poll. (A range that sends nothing without either, e.g. one no whole
    frame fits in, is dropped: it is answered as far as it can be.)"""
    ranges = handler.due(now)
    for index, (position, length) in enumerate(ranges):
        end = position + length
        reached = scanner.send(position, end, emit)
        if scanner.wire_datagrams:
            # One retransmit action (Aeron's unit: a NAK answered) that put something on
            # the wire; with no destination or a full buffer nothing was resent.
            counters.retransmits_sent += 1
            counters.retransmitted_bytes += reached - position
        if scanner.blocked:
            counters.send_would_block += 1
            handler.unsent(position, reached)
            for later, _ in ranges[index + 1 :]:
                handler.unsent(later, later)
            return
        if position < reached < end:
            handler.unsent(position, reached)
