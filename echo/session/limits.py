"""Per-address duologue limits (the io7m Aeron guide §4.4: "at most m duologues per IP
address").

Clients are counted by an *address key*, not by the raw address: an IPv6 host usually owns a
whole /64 (the guide §5.1: "every client has access to 18446744073709551616 addresses"), so counting
per IPv6 address would make the limit useless. IPv6 addresses are grouped by a configurable
prefix (default /64); IPv4 and IPv4-mapped IPv6 addresses count as the IPv4 address, so a
dual-stack socket does not give one host two budgets.

Pure module: no trio, no clock.
"""

from __future__ import annotations

import ipaddress
from typing import Final

DEFAULT_IPV6_PREFIX: Final = 64
_V6_ALL_ONES: Final = (1 << 128) - 1


def address_key(
    ip: str | ipaddress.IPv4Address | ipaddress.IPv6Address,
    *,
    ipv6_prefix: int = DEFAULT_IPV6_PREFIX,
) -> str:
    """The key `ip` is counted under.

    IPv4 -> "192.0.2.7"; IPv4-mapped IPv6 ("::ffff:192.0.2.7") -> "192.0.2.7";
    other IPv6 -> the network of `ipv6_prefix` bits, e.g. "2001:db8::/64" (scope ids such as
    "%eth0" are dropped: the network is what the limit is about).
    Raises ValueError for anything that is not an IP address or a prefix outside 0..128.
    """
    if isinstance(ipv6_prefix, bool) or not isinstance(ipv6_prefix, int):
        raise ValueError(f"ipv6_prefix must be an int, not {type(ipv6_prefix).__name__}")
    if not 0 <= ipv6_prefix <= 128:
        raise ValueError(f"ipv6_prefix {ipv6_prefix} is out of range 0..128")
    if isinstance(ip, ipaddress.IPv4Address | ipaddress.IPv6Address):
        addr: ipaddress.IPv4Address | ipaddress.IPv6Address = ip
    elif isinstance(ip, str):
        # ip_address raises ValueError for garbage; that is the error we promise.
        addr = ipaddress.ip_address(ip)
    else:
        raise ValueError(f"not an IP address: {ip!r}")
    if isinstance(addr, ipaddress.IPv4Address):
        return str(addr)
    mapped = addr.ipv4_mapped
    if mapped is not None:
        return str(mapped)
    mask = (_V6_ALL_ONES << (128 - ipv6_prefix)) & _V6_ALL_ONES
    network = ipaddress.IPv6Network((int(addr) & mask, ipv6_prefix))
    return str(network)


class AddressCounter:
    """How many live duologues each address key owns (the guide's EchoServerAddressCounter).

    Entries are removed when they reach zero, so memory follows the live duologues. Decrementing
    a key that is at zero raises: it would mean a duologue was released twice, and hiding that
    would let the per-address limit drift.
    """

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._total = 0

    def count(self, key: str) -> int:
        return self._counts.get(key, 0)

    def increment(self, key: str) -> int:
        """Add one for `key`; returns the new count."""
        n = self._counts.get(key, 0) + 1
        self._counts[key] = n
        self._total += 1
        return n

    def decrement(self, key: str) -> int:
        """Remove one for `key`; returns the new count. Raises ValueError if it is already zero."""
        n = self._counts.get(key, 0)
        if n <= 0:
            raise ValueError(f"address {key!r} has no duologues to release (double release?)")
        if n == 1:
            del self._counts[key]
        else:
            self._counts[key] = n - 1
        self._total -= 1
        return n - 1

    def __len__(self) -> int:
        """How many keys have at least one duologue."""
        return len(self._counts)

    def __contains__(self, key: object) -> bool:
        return key in self._counts

    @property
    def total(self) -> int:
        """Sum of all counts."""
        return self._total
