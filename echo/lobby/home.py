"""Which lobby server is a lobby's home: consistent hashing of its id.

The ring itself is the topics service's (`echo.topics.ring.HashRing`, the soft-state
publish/subscribe note's CH); this module
only asks it, through the `Ring` protocol, so any object with ``servers_for`` fits (the tests
use a tiny fake). Every member and every server computes the same answer from the same server
list, so when a home dies its members agree, without talking, on where to recreate the lobby.

Pure module: no trio, no clock.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Protocol

import attrs


class Ring(Protocol):
    def servers_for(self, key: str, k: int) -> list[str]:
        """The first `k` distinct servers clockwise from `key`'s point on the ring."""
        ...


def lobby_key(lobby_id: int) -> str:
    """The ring key of a lobby: fixed-width hex so every implementation hashes the same text."""
    if not 0 <= lobby_id < 2**64:
        raise ValueError("a lobby id is a u64")
    return f"lobby:{lobby_id:016x}"


@attrs.frozen
class Home:
    home: str
    next: str | None  # where the lobby is recreated if `home` dies; None with a single server


def home_of(ring: Ring, lobby_id: int) -> Home:
    """The lobby's home and its successor on the ring. Raises ValueError for an empty ring."""
    servers = ring.servers_for(lobby_key(lobby_id), 2)
    if not servers:
        raise ValueError("the ring has no servers")
    return Home(servers[0], servers[1] if len(servers) > 1 else None)


def past_dead(walk: Iterable[str], dead: Collection[str]) -> list[str]:
    """`walk` with the servers marked dead moved to its end, each once: they are asked after
    every other, not never. A mark is what a past silence said; a server that restarted or
    came back from a stall answers again, and a client whose only server went silent once
    must be able to reach it again."""
    order = list(dict.fromkeys(walk))
    return [server for server in order if server not in dead] + [
        server for server in order if server in dead
    ]


def failover_home(ring: Ring, lobby_id: int, dead: Collection[str]) -> str | None:
    """The first server on the lobby's ring walk that is not in `dead` (None if all are).

    With the ring still listing a dead server (membership not yet updated), members must skip
    it rather than wait; every member skipping the same set reaches the same server.
    """
    servers = ring.servers_for(lobby_key(lobby_id), len(dead) + 1)
    for server in servers:
        if server not in dead:
            return server
    return None
