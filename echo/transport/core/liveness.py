"""The receivers a publication has heard from: when each last sent a status message, how far
each has consumed, and when they time out (Aeron: the publication's connection timeout).

Pure: `now` is passed in. A publication is connected while some receiver's last SM is younger
than the timeout; `is_alive` runs on every offer, so it looks at one number, not at every
receiver, and timeouts are checked a few times a second, not on every poll.
"""

from __future__ import annotations

import math

import attrs

#: receiver timeouts are seconds long: checked at most this often, so that a publication with
#: many receivers does not pay O(receivers) on every poll
RECEIVER_EXPIRY_CHECK_INTERVAL = 0.1
#: a lingering publication announces end-of-stream once a receiver has sent this many SMs in a
#: row that neither report the tail nor move its position: an Aeron 1.4x receiver repeats a
#: stale position on its timer, while one whose application is still consuming (a loaded
#: machine, an Aeron 1.15 subscriber behind) reports progress and is waited for
SMS_WITHOUT_TAIL = 2


@attrs.define
class Receiver:
    last_sm: float
    position: int
    #: SMs in a row that did not move `position`, counted while lingering (see all_caught_up)
    sms_without_progress: int = 0


class ReceiverLiveness:
    __slots__ = ("expiry", "newest_sm", "next_check", "receivers", "timeout")

    def __init__(self, timeout: float, now: float) -> None:
        self.timeout = timeout
        self.receivers: dict[int, Receiver] = {}
        #: the latest SM time of any receiver (-inf if none)
        self.newest_sm = -math.inf
        #: no receiver times out before this (see expire)
        self.expiry = math.inf
        self.next_check = now

    def __bool__(self) -> bool:
        return bool(self.receivers)

    def is_alive(self, now: float) -> bool:
        """Has some receiver sent an SM within the timeout?"""
        return now - self.timeout <= self.newest_sm

    def on_status_message(self, receiver_id: int, position: int, now: float) -> None:
        receiver = self.receivers.get(receiver_id)
        if receiver is None:
            self.receivers[receiver_id] = Receiver(now, position)
            expiry = now + self.timeout
            if expiry < self.expiry:
                self.expiry = expiry
        else:
            receiver.last_sm = now
            if position > receiver.position:
                receiver.position = position
                receiver.sms_without_progress = 0
            else:
                receiver.sms_without_progress += 1
        if now > self.newest_sm:
            self.newest_sm = now

    def forget(self, receiver_id: int) -> None:
        """The receiver said goodbye (an end-of-stream SM) or refused the stream (ERR)."""
        if self.receivers.pop(receiver_id, None) is not None:
            self.newest_sm = max((r.last_sm for r in self.receivers.values()), default=-math.inf)

    def expire(self, now: float) -> bool:
        """Drop receivers silent for the timeout; False if it is too soon to look again."""
        if now < self.next_check:
            return False
        self.next_check = now + RECEIVER_EXPIRY_CHECK_INTERVAL
        timeout = self.timeout
        receivers = self.receivers
        oldest = min((r.last_sm for r in receivers.values()), default=math.inf)
        if oldest < now - timeout:
            deadline = now - timeout
            receivers = self.receivers = {
                k: r for k, r in receivers.items() if r.last_sm >= deadline
            }
            self.newest_sm = max((r.last_sm for r in receivers.values()), default=-math.inf)
            oldest = min((r.last_sm for r in receivers.values()), default=math.inf)
        # SMs only move a receiver's time later, so this is a lower bound on when the next
        # one can time out: next_deadline wakes us then, never late, at worst early.
        self.expiry = oldest + timeout
        return True

    def all_at(self, tail: int) -> bool:
        """Has every receiver reported consuming up to `tail`? (Vacuously true if none.)"""
        return all(r.position >= tail for r in self.receivers.values())

    def start_lingering(self) -> None:
        for receiver in self.receivers.values():
            receiver.sms_without_progress = 0

    def all_caught_up(self, tail: int) -> bool:
        """Has every receiver shown it has `tail`, or stopped moving (SMS_WITHOUT_TAIL)?"""
        return all(
            r.position >= tail or r.sms_without_progress >= SMS_WITHOUT_TAIL
            for r in self.receivers.values()
        )
