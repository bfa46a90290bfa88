"""One kernel readiness set for every socket the driver reads (Linux epoll).

A server with a thousand duologues has a thousand sockets, each getting a heartbeat every
100 ms and a status message every 200 ms (Aeron's timers, on the wire) besides its data. With
one reader task per socket, each of those datagrams cost a pass through trio's scheduler: the
task is rescheduled, and trio re-arms the socket in its own epoll set (an `epoll_ctl` for every
wait). The profile of the 1,000-client run (docs/profile-b4.txt) had that machinery at a fifth
of the server's CPU. Here the sockets stay registered, level-triggered, in one epoll set of the
driver's; one task waits on that set's descriptor and reads every socket that is ready, so a
wake-up serves all the sockets that became readable meanwhile and no registration changes per
datagram.

Where there is no epoll (not Linux) or a socket cannot be registered (a test's socket without a
descriptor of its own), `open_readiness()` gives None or `add` gives False and the driver reads
that socket with a task of its own, as before: the same datagrams in the same order either way.
"""

from __future__ import annotations

import select
from typing import Generic, Protocol, TypeVar


class _HasSocket(Protocol):
    def fileno(self) -> int: ...


_S = TypeVar("_S", bound=_HasSocket)

#: events taken from the kernel per wake-up; more stay ready (level-triggered) for the next
MAX_EVENTS = 1024


class Readiness(Generic[_S]):
    """Sockets registered for reading; `ready()` lists those with datagrams waiting."""

    def __init__(self, epoll: select.epoll) -> None:
        self._epoll = epoll
        self._by_fd: dict[int, _S] = {}
        self._fd_of: dict[_S, int] = {}

    def fileno(self) -> int:
        """The set's own descriptor: readable when any registered socket is (trio waits on it)."""
        return self._epoll.fileno()

    def add(self, udp: _S) -> bool:
        """Register `udp`; False if it cannot be (then it needs a reader of its own)."""
        try:
            fd = udp.fileno()
            self._epoll.register(fd, select.EPOLLIN)
        except (OSError, ValueError, TypeError, AttributeError):
            return False
        self._by_fd[fd] = udp
        self._fd_of[udp] = fd
        return True

    def remove(self, udp: _S) -> None:
        """Stop watching `udp` (lent to an application task, or about to close)."""
        fd = self._fd_of.pop(udp, None)
        if fd is None:
            return
        if self._by_fd.get(fd) is udp:
            del self._by_fd[fd]
        try:
            self._epoll.unregister(fd)
        except (OSError, ValueError):
            pass  # closed already: the kernel dropped it from the set itself

    def __contains__(self, udp: _S) -> bool:
        return udp in self._fd_of

    def ready(self) -> list[_S]:
        """The registered sockets with something to read now (never blocks)."""
        try:
            events = self._epoll.poll(0, MAX_EVENTS)
        except (OSError, ValueError):  # closed with the driver meanwhile
            return []
        by_fd = self._by_fd
        return [by_fd[fd] for fd, _ in events if fd in by_fd]

    def close(self) -> None:
        self._by_fd.clear()
        self._fd_of.clear()
        self._epoll.close()


def open_readiness() -> Readiness[_S] | None:
    """A readiness set, or None where the OS has no epoll."""
    epoll = getattr(select, "epoll", None)
    if epoll is None:
        return None
    try:
        return Readiness(epoll())
    except OSError:
        return None
