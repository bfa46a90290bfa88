"""Multi-destination-cast destination tracking (Aeron's SendChannelEndpoint). Pure.

Dynamic mode: every status message that reaches a publication's control socket registers its
*source address* as a destination. Behind a NAT that source is the NAT's public mapping of the
receiver's data socket, so data sent there passes back through the hole the receiver punched
(the io7m Aeron guide §4.1). A destination is matched by receiver id and address, refreshed by each
SM and dropped after `timeout` seconds without one.
"""

from __future__ import annotations

from typing import Any

from echo.transport.core.config import DEFAULTS

Address = Any  # a socket address tuple as returned by recvfrom: (host, port[, flow, scope])

DESTINATION_TIMEOUT = DEFAULTS.destination_timeout
DEFAULT_MAX_DESTINATIONS = DEFAULTS.max_destinations


class DynamicDestinations:
    __slots__ = ("_entries", "_known", "addresses", "max_destinations", "timeout")

    def __init__(
        self,
        *,
        timeout: float = DESTINATION_TIMEOUT,
        max_destinations: int = DEFAULT_MAX_DESTINATIONS,
    ) -> None:
        self.timeout = timeout
        self.max_destinations = max_destinations
        # (receiver_id, address) -> time of last SM; insertion order is the send order.
        self._entries: dict[tuple[int, Address], float] = {}
        #: the live addresses, deduplicated, in the order data is sent to them
        self.addresses: list[Address] = []
        self._known: dict[Address, None] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def contains(self, receiver_id: int, address: Address) -> bool:
        return (receiver_id, address) in self._entries

    def has_address(self, address: Address) -> bool:
        """Is `address` a live destination (of any receiver)?"""
        return address in self._known

    def on_status_message(self, receiver_id: int, address: Address, now: float) -> str:
        """Returns "added", "refreshed" or "refused" (the table is full)."""
        key = (receiver_id, address)
        if key in self._entries:
            self._entries[key] = now
            return "refreshed"
        if len(self._entries) >= self.max_destinations:
            return "refused"
        self._entries[key] = now
        self._rebuild()
        return "added"

    def remove_receiver(self, receiver_id: int, address: Address) -> bool:
        if self._entries.pop((receiver_id, address), None) is None:
            return False
        self._rebuild()
        return True

    def expire(self, now: float) -> int:
        """Drop destinations silent for longer than the timeout; returns how many went.

        The survivors are rebuilt into a new table: Aeron's swap-with-last removal once lost a
        live destination sitting between two idle ones ([idle, live, idle], PR #2145).
        """
        # The same sum as `next_expiry` (strictly after it): `last < now - timeout` missed, by
        # one rounding, an entry that a wake-up just after `next_expiry` was meant to drop, and
        # the timer loop woke for it again and again at that instant (for ever under a mock
        # clock, where that instant does not pass).
        timeout = self.timeout
        stale = [key for key, last in self._entries.items() if last + timeout < now]
        if not stale:
            return 0
        for key in stale:
            del self._entries[key]
        self._rebuild()
        return len(stale)

    def next_expiry(self) -> float | None:
        if not self._entries:
            return None
        return min(self._entries.values()) + self.timeout

    def _rebuild(self) -> None:
        # dict.fromkeys keeps first-seen order and runs in C: cheap even with a thousand
        # clients registering and leaving the all-clients channel.
        self._known = dict.fromkeys(address for _, address in self._entries)
        self.addresses = list(self._known)


class ManualDestinations:
    __slots__ = ("addresses",)

    def __init__(self) -> None:
        self.addresses: list[Address] = []

    def __len__(self) -> int:
        return len(self.addresses)

    def add(self, address: Address) -> bool:
        if address in self.addresses:
            return False
        self.addresses.append(address)
        return True

    def remove(self, address: Address) -> bool:
        if address not in self.addresses:
            return False
        self.addresses.remove(address)
        return True
