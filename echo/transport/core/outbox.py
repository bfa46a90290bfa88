"""The datagrams an endpoint has decided to send, until its driver takes them.

The core's output in the pull form (aioquic's `QuicConnection.datagrams_to_send`): an endpoint
that is asked `datagrams_to_send(now)` runs what is due at `now` with `Outbox.send` as its
`send`, and hands back what that queued. Each datagram is copied out (`bytes`) as it is queued:
a datagram the publication sends is a view of its term buffer, which the next lap overwrites.
The outbox takes everything (it never answers WOULD_BLOCK): a datagram the driver then cannot
write is lost as UDP loses one, and the protocol repairs it (a NAK, the next status message).
"""

from __future__ import annotations

from echo.transport.core.destinations import Address

#: one datagram to write: its bytes and where to
Datagram = tuple[bytes, Address]

#: what `datagrams_to_send` answers when nothing is queued (no list made for nothing)
NOTHING: tuple[Datagram, ...] = ()


class Outbox:
    """Datagrams queued in the order they were sent; `send` is a `sender.Send`."""

    __slots__ = ("queued",)

    def __init__(self) -> None:
        #: the datagrams queued, oldest first (read it to know whether any are; `take` them)
        self.queued: list[Datagram] = []

    def send(self, datagram: bytes | memoryview, address: Address, segment: int = 0) -> int:
        """Queue `datagram` for `address` (a run of `segment`-byte datagrams is queued as the
        datagrams it is, the last maybe shorter); returns how many were queued."""
        queued = self.queued
        size = len(datagram)
        if not segment or size <= segment:
            queued.append((bytes(datagram), address))
            return 1
        count = 0
        for start in range(0, size, segment):
            queued.append((bytes(datagram[start : start + segment]), address))
            count += 1
        return count

    def take(self) -> list[Datagram]:
        """Everything queued, oldest first (a list of the caller's own); the outbox is empty
        afterwards."""
        datagrams = self.queued
        self.queued = []
        return datagrams

    def __len__(self) -> int:
        return len(self.queued)
