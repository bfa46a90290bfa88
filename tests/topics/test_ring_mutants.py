"""The ring's walk at its edges (echo.topics.ring), beside test_ring.py's properties.

With one point per server a walk that needs every server must visit every point: a walk that
stops one point short (or starts its count at one) misses the last server, which the
thousand-point rings of the other tests never show.
"""

from __future__ import annotations

import pytest

from echo.topics.ring import HashRing

SERVERS = [f"s{i}.example:7000" for i in range(7)]


@pytest.mark.parametrize("key", [f"topic/{i}" for i in range(40)])
def test_one_point_per_server_still_reaches_every_server(key: str) -> None:
    ring = HashRing(SERVERS, points_per_server=1)
    everyone = ring.servers_for(key, len(SERVERS))
    assert sorted(everyone) == sorted(SERVERS)
    # more than there are: the same servers, once each, in the same order
    assert ring.servers_for(key, 100) == everyone
    # the first k are a prefix of the walk
    for k in range(len(SERVERS) + 1):
        assert ring.servers_for(key, k) == everyone[:k]


def test_two_servers_with_one_point_each_own_the_two_arcs() -> None:
    ring = HashRing(["a:1", "b:1"], points_per_server=1)
    shares = ring.shares()
    assert set(shares) == {"a:1", "b:1"}
    assert sum(shares.values()) == pytest.approx(1.0)
    assert all(0.0 < share < 1.0 for share in shares.values())
    assert sorted(ring.servers_for("x", 2)) == ["a:1", "b:1"]


def test_the_default_is_a_thousand_points_per_server() -> None:
    # every client and server must place the same points: the default is part of the format
    ring = HashRing(SERVERS)
    assert ring.points_per_server == 1000
    explicit = HashRing(SERVERS, points_per_server=1000)
    assert ring.shares() == explicit.shares()
    assert ring.servers_for("lobby/eu", 3) == explicit.servers_for("lobby/eu", 3)


def test_one_string_for_a_list_says_so() -> None:
    with pytest.raises(TypeError, match=r"^servers must be a sequence of 'host:port' strings"):
        HashRing("a.example:7000")
