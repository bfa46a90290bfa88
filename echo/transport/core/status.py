"""When an image sends its status message (SM): periodically, when consumption has moved a
quarter of the window, at once when a sender waits at the window's edge, and again after a
repair time while a window-opening SM may have been lost.

Pure: `now` is passed in; nothing here sends. The image asks `due`, sends the SM, and tells
the scheduler (`sent`); data and heartbeats from the sender tell it what the sender knows.
"""

from __future__ import annotations

import math

#: a window update (an SM about consumption to a sender at the window's edge, or in answer to
#: its probes) goes at most this often, so a slow reader does not send one per message
WINDOW_UPDATE_MIN_GAP = 0.001
#: a status message once consumption has moved this fraction of the window (Aeron's receiver
#: window threshold, window / 4) as a shift
SM_THRESHOLD_SHIFT = 2
#: an unconfirmed window-opening SM is repeated with this backoff factor
CONFIRM_BACKOFF = 2
#: heartbeats from one position closer together than this are a blocked sender's probes
#: (the sender backs them off from 2 ms; idle heartbeats come every 100 ms or more)
PROBE_REPEAT = 0.05


class StatusScheduler:
    """The SM timing of one image: `deadline` is when the next SM is due regardless."""

    __slots__ = (
        "_confirm_delay",
        "_heartbeat_position",
        "_heartbeat_time",
        "_previous_grant",
        "_unconfirmed_edge",
        "deadline",
        "interval",
        "last_sm_position",
        "last_window_update",
        "mtu",
        "window",
    )

    def __init__(self, join: int, window: int, mtu: int, interval: float, now: float) -> None:
        self.window = window
        self.mtu = mtu
        self.interval = interval
        #: the first SM goes out at once: it is what connects the sender
        self.deadline = now
        #: the consumption position the last SM reported
        self.last_sm_position = join
        self.last_window_update = -math.inf
        # What the SM before the last one let the sender send up to: a sender that probes at
        # that edge never got our last SM (see on_heartbeat).
        self._previous_grant = join + window
        # The last heartbeat: where and when (two from one position in quick succession are a
        # blocked sender's probes).
        self._heartbeat_position = -1
        self._heartbeat_time = -math.inf
        #: the window edge a blocked sender waits at until it hears of our latest SM
        self._unconfirmed_edge: int | None = None
        self._confirm_delay = 0.0

    def on_heartbeat(self, position: int, now: float) -> None:
        """A heartbeat from the sender at `position` (where it stopped sending)."""
        edge = position + self.mtu
        probing = position == self._heartbeat_position and now - self._heartbeat_time < PROBE_REPEAT
        self._heartbeat_position = position
        self._heartbeat_time = now
        unconfirmed = self._unconfirmed_edge
        granted = self.last_sm_position + self.window
        if unconfirmed is not None and unconfirmed < position <= granted:
            # The sender has sent beyond the old edge, so it has our window-opening SM (the data
            # itself may have been lost: a NAK repairs that), as data beyond it would prove.
            # (Not beyond the window we granted: no sender of ours is there, so that heartbeat
            # is forged or corrupt and proves nothing.)
            self._unconfirmed_edge = None
        if (
            edge >= self.last_sm_position + self.window
            or edge >= self._previous_grant
            # (A closing publication waits for proof of delivery, an SM at its tail, before
            # it announces end-of-stream: it probes from its tail until it hears one
            # (publication.py, _send_heartbeat), and that repeat is answered here. A single
            # heartbeat at what we consumed is not: it is the probe that follows every burst
            # of data, and answering each one was a third datagram for every message.)
            or probing
        ):
            # The sender idles at the edge of the window we gave it, or of the one before
            # (then our last SM, which moved it, was lost), or it probes again and again
            # from one position: it waits for an SM, perhaps after several were lost. Answer
            # now (at most once a WINDOW_UPDATE_MIN_GAP), not at the periodic SM.
            self.deadline = min(
                self.deadline, max(now, self.last_window_update + WINDOW_UPDATE_MIN_GAP)
            )

    def on_setup(self, now: float) -> None:
        """A repeated SETUP means our SM was lost: answer soon."""
        self.deadline = min(self.deadline, now)

    def on_new_data(self, end: int) -> None:
        """Data up to `end`, beyond anything seen before, arrived."""
        if self._unconfirmed_edge is not None and end > self._unconfirmed_edge:
            self._unconfirmed_edge = None  # the sender has our SM: it sends beyond

    def threshold_reached(self, consumption: int, hwm: int) -> bool:
        """Has consumption moved far enough that the sender should hear of it now?"""
        progress = consumption - self.last_sm_position
        return progress >= self.window >> SM_THRESHOLD_SHIFT or (
            progress > 0 and hwm + self.mtu >= self.last_sm_position + self.window
        )

    def window_update_due(self, consumption: int, hwm: int, now: float) -> bool:
        progress = consumption - self.last_sm_position
        if progress <= 0:
            return False
        if progress >= self.window >> SM_THRESHOLD_SHIFT:
            return True
        # The sender has used (nearly) all the window we gave it and is waiting: tell it about
        # what we consumed now rather than at the next periodic SM (TCP's window update).
        return self._at_edge(hwm) and now >= self.last_window_update + WINDOW_UPDATE_MIN_GAP

    def window_update_at(self, consumption: int, hwm: int) -> float:
        """When a pending window update may go (inf: none pending)."""
        if consumption > self.last_sm_position and self._at_edge(hwm):
            return self.last_window_update + WINDOW_UPDATE_MIN_GAP
        return math.inf

    def _at_edge(self, hwm: int) -> bool:
        return hwm + self.mtu >= self.last_sm_position + self.window

    def due(self, consumption: int, hwm: int, now: float) -> bool:
        return now >= self.deadline or self.window_update_due(consumption, hwm, now)

    def sent(self, consumption: int, hwm: int, now: float, retry_delay: float) -> None:
        """An SM reporting `consumption` went out; `retry_delay` is the image's repair time."""
        old_grant = self.last_sm_position + self.window
        opens = consumption + self.window > old_grant
        if opens:
            self._previous_grant = old_grant  # (a repeat of the same grant is not news)
        self.last_sm_position = consumption
        self.last_window_update = now
        interval = self.interval
        if opens and hwm + self.mtu >= old_grant:
            # This SM frees a sender that used up its window. If it is lost, the sender waits
            # for it: repeat it after a repair time (backing off) until data or a heartbeat
            # from beyond the old edge shows it arrived.
            self._unconfirmed_edge = old_grant
            self._confirm_delay = retry_delay
        elif self._unconfirmed_edge is not None:
            self._confirm_delay = min(CONFIRM_BACKOFF * self._confirm_delay, interval)
        if self._unconfirmed_edge is not None:
            interval = min(interval, self._confirm_delay)
        self.deadline = now + interval
