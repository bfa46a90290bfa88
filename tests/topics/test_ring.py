"""CH and RCH server choice (echo.topics.ring): the pub/sub note's "Consistent Hashing"."""

from __future__ import annotations

import collections
import hashlib
import math
import os
import random
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echo.topics.ring import HashRing, choose_random, key_point, server_points

FIVE = [
    "alpha.example:7000",
    "beta.example:7000",
    "gamma.example:7000",
    "delta.example:7000",
    "epsilon.example:7000",
]


def addresses(n: int) -> list[str]:
    return [f"10.{i // 65536}.{i // 256 % 256}.{i % 256}:7000" for i in range(n)]


# --- stability ------------------------------------------------------------------------------


def test_points_are_blake2b_with_a_fixed_layout() -> None:
    # Pinned to the hash function itself, not to the module's output: if somebody changes the
    # digest, the personalisation or the label, clients of two versions stop agreeing.
    key = hashlib.blake2b(b"lobby/eu", digest_size=8, person=b"echo.topics.key").digest()
    assert key_point("lobby/eu") == int.from_bytes(key, "big") == 0x089B36D55E847819
    word = hashlib.blake2b(
        b"alpha.example:7000#0", digest_size=64, person=b"echo.topics.srv"
    ).digest()
    assert server_points("alpha.example:7000", 9)[:8] == [
        int.from_bytes(word[i : i + 8], "big") for i in range(0, 64, 8)
    ]
    assert server_points("alpha.example:7000", 2) == [0x26C2E23F35E856F8, 0xBC315C3ED8E91EED]
    assert len(server_points("alpha.example:7000", 1001)) == 1001


def test_fixed_vector() -> None:
    ring = HashRing(FIVE)
    assert ring.servers_for("lobby/eu", 3) == [
        "gamma.example:7000",
        "alpha.example:7000",
        "beta.example:7000",
    ]
    assert ring.servers_for("presence/42", 3) == [
        "epsilon.example:7000",
        "alpha.example:7000",
        "gamma.example:7000",
    ]
    assert ring.servers_for("", 3) == [
        "delta.example:7000",
        "alpha.example:7000",
        "epsilon.example:7000",
    ]


def test_same_answer_in_another_process_with_another_hash_seed() -> None:
    code = (
        "from echo.topics.ring import HashRing;"
        f"r = HashRing({FIVE!r});"
        "print(r.servers_for('presence/42', 4))"
    )
    results = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        results.add(out.stdout.strip())
    assert results == {str(HashRing(FIVE).servers_for("presence/42", 4))}


def test_order_of_the_list_does_not_matter() -> None:
    servers = addresses(40)
    shuffled = servers[:]
    random.Random(7).shuffle(shuffled)
    a, b = HashRing(servers, 50), HashRing(shuffled, 50)
    for i in range(300):
        assert a.servers_for(f"t{i}", 5) == b.servers_for(f"t{i}", 5)


# --- balance --------------------------------------------------------------------------------


def loads(ring: HashRing, keys: int) -> collections.Counter[str]:
    return collections.Counter(ring.servers_for(f"topic/{i}", 1)[0] for i in range(keys))


def test_a_thousand_points_per_server_balance_the_load() -> None:
    # Each server's share of the circle is a sum of 1,000 arcs, so its relative spread is
    # about 1/sqrt(1000) = 3.2 %; counting 40,000 keys over 10 servers adds 1.6 %. Every
    # server within 12 % of the mean is ~3.3 standard deviations of room.
    servers = addresses(10)
    count = loads(HashRing(servers, 1000), 40_000)
    mean = 40_000 / len(servers)
    assert set(count) == set(servers)
    assert all(abs(c - mean) / mean < 0.12 for c in count.values()), count
    # The same keys on one point per server: the note's reason for "a thousand bit strings".
    # Arcs are then exponential and the largest of ten is ~3x the mean.
    count_1 = loads(HashRing(servers, 1), 40_000)
    assert max(count_1.values()) / mean > 1.5


def test_shares_are_the_arcs_keys_fall_into() -> None:
    servers = addresses(10)
    ring = HashRing(servers, 1000)
    shares = ring.shares()
    assert set(shares) == set(servers)
    assert sum(shares.values()) == pytest.approx(1.0)
    # The same 40,000 keys as above: counts follow the shares within binomial noise
    # (sd ~ 60 keys of ~4,000), far tighter than the shares' own 3 % spread.
    count = loads(ring, 40_000)
    for s in servers:
        assert abs(count[s] - 40_000 * shares[s]) < 5 * math.sqrt(40_000 * shares[s])
    one = HashRing(["a:1"], 3).shares()
    assert one == {"a:1": 1.0}
    assert HashRing([]).shares() == {}


# --- minimal disruption ---------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 3, 8])
def test_removing_a_server_moves_only_its_keys(k: int) -> None:
    servers = addresses(30)
    gone = servers[11]
    before = HashRing(servers, 200)
    after = HashRing([s for s in servers if s != gone], 200)
    moved = 0
    for i in range(3000):
        old = before.servers_for(f"topic/{i}", k)
        new = after.servers_for(f"topic/{i}", k)
        kept = [s for s in old if s != gone]
        # The survivors keep their order; the departed server's place is filled by the next
        # server clockwise, at the end of the list.
        assert new[: len(kept)] == kept
        assert len(new) == k
        if gone in old:
            moved += 1
        else:
            assert new == old
    # About k/30 of the topics had the departed server among their K.
    assert 0.5 * k / 30 < moved / 3000 < 1.5 * k / 30


def test_adding_a_server_moves_keys_only_to_it() -> None:
    servers = addresses(30)
    before = HashRing(servers, 200)
    after = HashRing([*servers, "new.example:7000"], 200)
    for i in range(2000):
        old = before.servers_for(f"topic/{i}", 3)
        new = after.servers_for(f"topic/{i}", 3)
        # Only the newcomer can enter a topic's K; everyone else keeps their place.
        kept = [s for s in new if s != "new.example:7000"]
        assert kept == old[: len(kept)]


# --- edges ----------------------------------------------------------------------------------


def test_k_larger_than_the_list_gives_every_server_once() -> None:
    ring = HashRing(FIVE, 20)
    got = ring.servers_for("lobby/eu", 50)
    assert sorted(got) == sorted(FIVE)
    assert got[:3] == ring.servers_for("lobby/eu", 3)
    assert ring.servers_for("lobby/eu", 0) == []


def test_empty_list_is_an_empty_ring() -> None:
    ring = HashRing([])
    assert len(ring) == 0
    assert ring.servers_for("anything", 3) == []
    assert choose_random([], 3, random.Random(1)) == []


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="duplicate server"):
        HashRing(["a:1", "b:2", "a:1"])
    with pytest.raises(ValueError, match="points_per_server"):
        HashRing(["a:1"], 0)
    with pytest.raises(TypeError):
        HashRing("a:1")
    with pytest.raises(ValueError, match="k must be"):
        HashRing(["a:1"]).servers_for("t", -1)
    with pytest.raises(ValueError, match="k_prime"):
        choose_random(["a:1"], -1, random.Random(1))


def test_ring_introspection() -> None:
    ring = HashRing(["b:2", "a:1"], 3)
    assert ring.servers == ("a:1", "b:2")
    assert "a:1" in ring and "c:3" not in ring and 5 not in ring
    assert len(ring) == 2
    assert "2 servers" in repr(ring)


# --- RCH ------------------------------------------------------------------------------------


def test_choose_random_is_a_uniform_k_prime_subset() -> None:
    k_set = addresses(10)
    rng = random.Random(3)
    count: collections.Counter[str] = collections.Counter()
    for _ in range(3000):
        pick = choose_random(k_set, 3, rng)
        assert len(pick) == len(set(pick)) == 3 and set(pick) <= set(k_set)
        count.update(pick)
    # Each server is in a given pick with probability 3/10: 900 +- 25 (binomial sd).
    assert all(abs(c - 900) < 120 for c in count.values()), count
    assert sorted(choose_random(k_set[:2], 3, rng)) == sorted(k_set[:2])
    assert choose_random(k_set, 3, random.Random(9)) == choose_random(k_set, 3, random.Random(9))


# --- properties -----------------------------------------------------------------------------

server_names = st.lists(st.text(min_size=1, max_size=12), min_size=0, max_size=12, unique=True)


@settings(max_examples=150, deadline=None)
@given(servers=server_names, key=st.text(max_size=20), k=st.integers(0, 15))
def test_servers_for_properties(servers: list[str], key: str, k: int) -> None:
    ring = HashRing(servers, 5)
    got = ring.servers_for(key, k)
    assert len(got) == min(k, len(servers))
    assert len(set(got)) == len(got)
    assert set(got) <= set(servers)
    # K for a smaller k is a prefix: a client with K=3 and one with K=5 share their first 3.
    for j in range(k + 1):
        assert ring.servers_for(key, j) == got[:j]
    assert HashRing(list(reversed(servers)), 5).servers_for(key, k) == got


@settings(max_examples=100, deadline=None)
@given(servers=server_names, k_prime=st.integers(0, 15), seed=st.integers(0, 2**32))
def test_choose_random_properties(servers: list[str], k_prime: int, seed: int) -> None:
    got = choose_random(servers, k_prime, random.Random(seed))
    assert len(got) == min(k_prime, len(servers))
    assert len(set(got)) == len(got) and set(got) <= set(servers)
