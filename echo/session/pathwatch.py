"""One look a second at every client session's path, for all the sessions of a transport.

A client session's watcher (`echo.session.client_path._Path.keep`) waits for its path to break: its
publication hears no status message for the connection timeout. Nothing in the transport says
so when it happens (being connected is a matter of time passing), so the watcher looks once a
`PATH_CHECK_INTERVAL`. As a sleep per session that was a timer of trio's per session and
second: a cancel scope opened, its deadline registered, expired and delivered as a Cancelled
exception, a task switch, for each of a bot process's hundreds of sessions (the lobby bench's
bots: 10-15 % of their idle CPU). Here one task per transport looks at every waiting session
per interval, and wakes only the sessions whose condition holds.

The task is a trio system task (it belongs to no session, so no session's end can cancel it);
it runs while some session waits and ends when none does. A condition that raises wakes its
session, which then meets the error in its own task.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import trio


class PathWatch:
    """Wakes each waiting task once its condition holds, looking every `interval` seconds."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._waiting: dict[int, tuple[Callable[[], bool], trio.Event]] = {}
        self._next_key = 0
        self._running = False

    def __len__(self) -> int:
        return len(self._waiting)

    async def until(self, condition: Callable[[], bool]) -> None:
        """Return once `condition()` holds: at once if it does now, else within one interval
        of it starting to hold (looked at once an interval)."""
        if condition():
            return
        event = trio.Event()
        key = self._next_key
        self._next_key += 1
        self._waiting[key] = (condition, event)
        if not self._running:
            self._running = True
            trio.lowlevel.spawn_system_task(self._run, name="echo.session.pathwatch")
        try:
            await event.wait()
        finally:
            self._waiting.pop(key, None)

    async def _run(self) -> None:
        try:
            while self._waiting:
                await trio.sleep(self.interval)
                self.look()
        finally:
            self._running = False

    def look(self) -> None:
        """Wake the tasks whose condition holds now."""
        waiting = self._waiting
        for key, (condition, event) in list(waiting.items()):
            try:
                holds = condition()
            except Exception:  # the waiting task meets it itself, in its own context
                holds = True
            if holds:
                del waiting[key]
                event.set()


_WATCHES: weakref.WeakKeyDictionary[object, PathWatch] = weakref.WeakKeyDictionary()


def path_watch(transport: object, interval: float) -> PathWatch:
    """The one watch of `transport`'s sessions."""
    watch = _WATCHES.get(transport)
    if watch is None:
        watch = _WATCHES[transport] = PathWatch(interval)
    return watch
