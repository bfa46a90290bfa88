"""Consistent hashing (CH) and random consistent hashing (RCH) of topics onto servers.

The soft-state publish/subscribe note (Kragen Sitaker's, on application-layer multicast):
"Hash each server's address into a thousand bit strings. Hash the topic into a bit string. Sort
the list of bit strings. Take the K bit strings in the sorted list [next to] the topic (wrapping
around ...) and use the corresponding servers. As long as one of your K matches one of my K,
your message will reach me." RCH then uses a random K' of those K for publishing or for
subscribing (not both).

Everything here is pure and deterministic. Points are blake2b digests, never Python's
``hash()``: that one is salted per process (PYTHONHASHSEED), and two clients that must agree
on a topic's servers are two processes, often on two machines. The ring depends only on the
*set* of server names, not on the order a client happens to list them in.

The note takes the K points "right before" the topic; we walk the other way (increasing hash,
"clockwise"). The two are mirror images with the same distribution; what matters is that every
client walks the same way, and all clients use this module.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import random
import struct
from collections.abc import Sequence

__all__ = ["HashRing", "choose_random", "key_point", "server_points"]

# Domain separation: a topic named like a server's point label must not land on that point
# by construction. blake2b's personalisation string does this without changing the digest
# size or the cost.
_SERVER_PERSON = b"echo.topics.srv"
_KEY_PERSON = b"echo.topics.key"
_DIGEST_BYTES = 8  # 64-bit points: with 1e8 points a collision has probability ~3e-4
_WORDS = 8  # points per blake2b-512 digest
_RING = 1 << (8 * _DIGEST_BYTES)
_UNPACK = struct.Struct(f">{_WORDS}Q").unpack


def server_points(server: str, count: int) -> list[int]:
    """The first ``count`` points of ``server`` on the ring (64-bit unsigned integers).

    Point ``i`` is the ``i % 8``-th 64-bit word of blake2b-512 of ``"server#(i // 8)"``: eight
    points per digest make building a ring of a million points about ten times faster than one
    digest per point, and every word of a blake2b digest is as uniform as a short digest.
    """
    out: list[int] = []
    for j in range((count + _WORDS - 1) // _WORDS):
        digest = hashlib.blake2b(
            f"{server}#{j}".encode(), digest_size=_WORDS * 8, person=_SERVER_PERSON
        ).digest()
        out.extend(_UNPACK(digest))
    del out[count:]
    return out


def key_point(key: str) -> int:
    """Where ``key`` (a topic) sits on the ring (a 64-bit unsigned integer)."""
    h = hashlib.blake2b(key.encode(), digest_size=_DIGEST_BYTES, person=_KEY_PERSON)
    return int.from_bytes(h.digest(), "big")


class HashRing:
    """A consistent-hash ring of ``points_per_server`` points for each of ``servers``.

    ``servers`` are ``"host:port"`` strings; they are only hashed, never parsed, so whatever
    spelling the server list uses is the identity (two spellings of one address are two
    servers). Duplicates raise ``ValueError``: a duplicated entry would silently double that
    server's share of topics.

    An empty list is allowed and gives an empty ring whose ``servers_for`` returns ``[]``:
    the note's "if an attacker can empty your server list, then it will cut you off from the
    world" is a state a client can be in, and the caller decides how to report it.
    """

    __slots__ = ("_hashes", "_owners", "_servers", "points_per_server")

    def __init__(self, servers: Sequence[str], points_per_server: int = 1000) -> None:
        if points_per_server < 1:
            raise ValueError(f"points_per_server must be >= 1, not {points_per_server}")
        if isinstance(servers, str):
            # A bare string is a Sequence[str] of characters: certainly a mistake.
            raise TypeError("servers must be a sequence of 'host:port' strings, not one string")
        names = sorted(servers)
        for a, b in itertools.pairwise(names):
            if a == b:
                raise ValueError(f"duplicate server in list: {a!r}")
        self._servers: tuple[str, ...] = tuple(names)
        self.points_per_server = points_per_server
        points: list[int] = []
        for name in names:
            points.extend(server_points(name, points_per_server))
        # An index sort is faster than sorting (hash, owner) tuples. It is stable, and points
        # were appended in name order, so equal hashes (2**-64 per pair) break by server name:
        # the ring is independent of the order of the caller's list.
        order = sorted(range(len(points)), key=points.__getitem__)
        self._hashes: list[int] = [points[i] for i in order]
        self._owners: list[int] = [i // points_per_server for i in order]

    @property
    def servers(self) -> tuple[str, ...]:
        """The ring's servers, sorted by name."""
        return self._servers

    def __len__(self) -> int:
        return len(self._servers)

    def __contains__(self, server: object) -> bool:
        if not isinstance(server, str):
            return False
        i = bisect.bisect_left(self._servers, server)
        return i < len(self._servers) and self._servers[i] == server

    def __repr__(self) -> str:
        return f"HashRing({len(self._servers)} servers, {self.points_per_server} points each)"

    def shares(self) -> dict[str, float]:
        """Each server's share of the circle: the fraction of all keys whose first server it is.

        A key belongs to the first point clockwise from it, so point i owns the arc from point
        i-1 up to itself (point 0 also owns the wrap-around). With P points per server a share
        is a sum of P arcs, so shares spread by about 1/sqrt(P) around 1/len(servers).
        """
        hashes, owners = self._hashes, self._owners
        if not hashes:
            return {}
        length = [0] * len(self._servers)
        prev = hashes[-1] - _RING
        for h, owner in zip(hashes, owners, strict=True):
            length[owner] += h - prev
            prev = h
        return {name: length[i] / _RING for i, name in enumerate(self._servers)}

    def servers_for(self, key: str, k: int) -> list[str]:
        """The first ``k`` distinct servers clockwise from ``key``'s point, nearest first.

        All servers (in ring order) if there are fewer than ``k``; ``[]`` for ``k == 0`` or an
        empty ring. The walk is O(k) points in the usual case (k much smaller than the number
        of servers) and at most one turn of the ring.
        """
        if k < 0:
            raise ValueError(f"k must be >= 0, not {k}")
        n = len(self._servers)
        want = min(k, n)
        if want == 0:
            return []
        owners = self._owners
        total = len(owners)
        start = bisect.bisect_right(self._hashes, key_point(key))
        seen: set[int] = set()
        out: list[str] = []
        # Walk in slices rather than point by point: a slice and a plain for loop cost far
        # less per point than indexing modulo the ring size, and most walks end in the first.
        pos, walked, chunk = start, 0, 2 * want + 16
        while walked < total:
            take = min(chunk, total - walked, total - pos)
            for owner in owners[pos : pos + take]:
                if owner not in seen:
                    seen.add(owner)
                    out.append(self._servers[owner])
                    if len(out) == want:
                        return out
            walked += take
            pos = (pos + take) % total
            chunk *= 2
        return out


def choose_random(servers: Sequence[str], k_prime: int, rng: random.Random) -> list[str]:
    """RCH: a uniformly random ``k_prime`` of ``servers`` (all of them if fewer).

    The randomness is the point (the note: "there's no way to tell which K' servers a
    subscriber has subscribed to, so you still have to flood all K servers"), so the caller
    passes an ``rng``: a ``random.SystemRandom`` in production, a seeded ``random.Random``
    in tests and the simulation.
    """
    if k_prime < 0:
        raise ValueError(f"k_prime must be >= 0, not {k_prime}")
    pool = list(servers)
    return rng.sample(pool, min(k_prime, len(pool)))
