"""Home choice through any ring with `servers_for` (echo.lobby.home), tested with a fake ring.

The real ring (`echo.topics.ring.HashRing`) is plugged in at integration; this fake is a
rendezvous hash, enough to have a stable, key-dependent order of distinct servers.
"""

from __future__ import annotations

import hashlib

import pytest

from echo.lobby.home import Home, Ring, failover_home, home_of, lobby_key, past_dead


class FakeRing:
    def __init__(self, servers: list[str]) -> None:
        self.servers = servers
        self.asked: list[tuple[str, int]] = []

    def servers_for(self, key: str, k: int) -> list[str]:
        self.asked.append((key, k))
        ranked = sorted(self.servers, key=lambda s: hashlib.sha256(f"{key}|{s}".encode()).digest())
        return ranked[:k]


def test_lobby_key_is_fixed_width_hex() -> None:
    assert lobby_key(255) == "lobby:00000000000000ff"
    assert lobby_key(2**64 - 1) == "lobby:ffffffffffffffff"
    with pytest.raises(ValueError):
        lobby_key(2**64)


def test_home_and_next_come_from_the_ring() -> None:
    ring = FakeRing(["s1", "s2", "s3"])
    r: Ring = ring  # the protocol is satisfied structurally
    home = home_of(r, 42)
    assert ring.asked == [(lobby_key(42), 2)]
    assert home == Home(*ring.servers_for(lobby_key(42), 2))
    assert home.home != home.next
    # Different lobbies spread over the servers.
    homes = {home_of(ring, i).home for i in range(60)}
    assert homes == {"s1", "s2", "s3"}


def test_the_next_server_is_where_failover_lands() -> None:
    ring = FakeRing(["s1", "s2", "s3", "s4"])
    for lobby_id in range(20):
        home = home_of(ring, lobby_id)
        assert failover_home(ring, lobby_id, dead={home.home}) == home.next
        assert failover_home(ring, lobby_id, dead=()) == home.home
        walk = ring.servers_for(lobby_key(lobby_id), 4)
        assert failover_home(ring, lobby_id, dead=set(walk[:3])) == walk[3]
    assert failover_home(ring, 1, dead={"s1", "s2", "s3", "s4"}) is None


def test_single_and_empty_rings() -> None:
    assert home_of(FakeRing(["only"]), 7) == Home("only", None)
    with pytest.raises(ValueError):
        home_of(FakeRing([]), 7)


def test_servers_marked_dead_are_walked_last_not_left_out() -> None:
    assert past_dead(["a", "b", "c", "b"], {"a"}) == ["b", "c", "a"]
    assert past_dead(["a", "b"], {"a", "b"}) == ["a", "b"]  # all marked: asked anyway, in order
    assert past_dead([], {"a"}) == []
