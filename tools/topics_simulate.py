"""Internet scale on paper: the pub/sub note's figures for 100,000 servers, K = 1,000, K' = 3.

Run ``python -m tools.topics_simulate --out docs/`` (about a minute) to regenerate
``docs/topics-sim.md`` (tables) and ``docs/topics-sim.svg`` (chart); ``--short`` is the few-second
form CI runs. Pure Python, one seeded ``random.Random``: the same arguments give the same
files byte for byte.

Every figure comes twice: a closed form (exact combinatorics) and a Monte Carlo run of the
protocol itself on the real :class:`~echo.topics.ring.HashRing` of 100,000 servers: a publisher
sends a message to its target servers, each server that is up forwards it to the subscribers it
holds, and we count what arrives.

Why the ring is built with fewer than the note's 1,000 points per server (10 in the full run,
1 in the short one), and why that changes none of the figures below: a topic's K servers are
the first K *distinct* servers met walking clockwise from the topic's point. Every server's
points are independent uniform hashes and servers are interchangeable, so for a topic at a
random place the order of first meeting is a uniformly random permutation of the servers, and
K is a uniformly random K-subset, whatever the number of points per server. Every figure here
is about one topic at a time (delivery, flooding, two clients' overlap), so none depends on it.
What the thousand points buy is *balance across topics* (each server's share of the circle
varies by about 1/sqrt(points)), which the ring's own tests measure at 1,000 points; at 10^5
servers x 10^3 points a pure-Python ring would be 10^8 points and many gigabytes.

Server failures are independent and drawn lazily: a server's up/down state is drawn the first
time a round touches it. By independence that is the same distribution as drawing all 100,000
states every round, at a thousandth of the cost. Likewise a client that "misses a random x %
of the servers" decides each server's absence the first time its walk meets it.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs

from echo.topics.ring import HashRing, choose_random

__all__ = [
    "BalanceRow",
    "Estimate",
    "Params",
    "Results",
    "delivery_random_subsets",
    "delivery_rch_with_overlap",
    "dirichlet_shares",
    "expected_overlap",
    "filtered_walk",
    "flood_needed",
    "flooded_fraction",
    "main",
    "run",
]


# --- closed forms -------------------------------------------------------------------------


def delivery_any_of(p_up: float, m: int) -> float:
    """A message gets through if any of ``m`` independent servers is up."""
    return 1.0 - (1.0 - p_up) ** m


def flooded_fraction(f: int, k: int, k_prime: int) -> float:
    """RCH: share of subscribers (subscribe-to-K') or messages (publish-to-K') cut off when an
    attacker floods ``f`` of a topic's ``k`` servers. The K' are a uniform random subset the
    attacker cannot see (the note), so all K' must fall among the f: C(f, K') / C(K, K').
    """
    return math.comb(f, k_prime) / math.comb(k, k_prime)


def flood_needed(share: float, k: int, k_prime: int) -> int:
    """The fewest flooded servers that cut off at least ``share`` of a topic's subscribers."""
    return next(f for f in range(k + 1) if flooded_fraction(f, k, k_prime) >= share)


def delivery_random_subsets(n: int, r: int, p_up: float) -> float:
    """The note's R: publisher and subscriber each pick a random ``r`` of ``n`` servers.

    The overlap O is hypergeometric; the message arrives if any of the O common servers is up:
    1 - sum_o P(O = o) (1 - p)^o.
    """
    log_total = _log_comb(n, r)
    fail = 0.0
    for o in range(max(0, 2 * r - n), r + 1):
        log_p = _log_comb(r, o) + _log_comb(n - r, r - o) - log_total
        fail += math.exp(log_p) * (1.0 - p_up) ** o
    return 1.0 - fail


def random_subset_size_for(n: int, p_up: float, target: float) -> int:
    """Smallest r for which R reaches ``target`` delivery (bisection; monotone in r)."""
    lo, hi = 1, n
    while lo < hi:
        mid = (lo + hi) // 2
        if delivery_random_subsets(n, mid, p_up) >= target:
            hi = mid
        else:
            lo = mid + 1
    return lo


def expected_overlap(k: int, present: float) -> float:
    """E|K_a ∩ K_b| for two clients that each hold every server independently with
    probability ``present``.

    Walking clockwise, both clients meet the same servers in the same order and each keeps the
    first K it holds. The i-th server met is in both K sets iff both hold it (present^2) and
    each client has kept at most K-1 of the i-1 servers before it; the two lists are
    independent, so E = present^2 * sum_i P(Bin(i-1, present) <= K-1)^2.
    """
    if present >= 1.0:
        return float(k)
    q = present
    # below(m) = P(Bin(m, q) <= K-1) is 1 for m < K, then falls by q * P(Bin(m, q) = K-1) per
    # step: O(1) per term instead of carrying a whole binomial distribution along.
    total = float(k)  # i = 1 .. K
    below = 1.0
    m = k - 1
    log_q, log_1q = math.log(q), math.log1p(-q)
    # Past the mean (m ~ K/q) the pmf only shrinks; stop when the remaining tail is nil. The
    # subtraction leaves rounding dust of ~1e-16, so "below == 0" is not a usable test.
    while below > 1e-12:
        log_pmf = _log_comb(m, k - 1) + (k - 1) * log_q + (m - k + 1) * log_1q
        step = q * math.exp(log_pmf)
        below = max(0.0, below - step)
        m += 1
        total += below * below
        if m > k / q and step < 1e-18:
            break
    return q * q * total


def delivery_rch_with_overlap(overlap: float, k: int, k_prime: int, p_up: float) -> float:
    """Subscribe-to-K' when the publisher's K and the subscriber's K share ``overlap`` servers:
    the subscriber's K' (uniform among its K) must include a common server that is up. The
    number of good servers G is Bin(overlap, p); P(miss | G) = C(K-G, K') / C(K, K'). A
    non-integer ``overlap`` (a mean) is interpolated linearly between its neighbours.
    """
    lo = math.floor(overlap)
    frac = overlap - lo

    def at(o: int) -> float:
        fail = 0.0
        for g in range(o + 1):
            p_g = math.comb(o, g) * p_up**g * (1 - p_up) ** (o - g)
            fail += p_g * math.comb(k - g, k_prime) / math.comb(k, k_prime)
        return 1.0 - fail

    return at(lo) if frac == 0 else (1 - frac) * at(lo) + frac * at(lo + 1)


def _log_comb(n: int, r: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(r + 1) - math.lgamma(n - r + 1)


# --- the Monte Carlo ----------------------------------------------------------------------


@attrs.frozen
class Estimate:
    """A Monte Carlo mean over independent rounds with its standard error."""

    mean: float
    se: float
    rounds: int

    @classmethod
    def of(cls, samples: Sequence[float]) -> Estimate:
        n = len(samples)
        mean = math.fsum(samples) / n
        var = math.fsum((x - mean) ** 2 for x in samples) / (n - 1) if n > 1 else 0.0
        return cls(mean, math.sqrt(var / n), n)


DEFAULT_SEED = 2004  # the pub/sub note was written in September 2004


@attrs.frozen
class Params:
    servers: int = 100_000
    k: int = 1000
    k_prime: int = 3
    p_up: float = 0.9
    points_per_server: int = 10
    rounds: int = 4000  # topics per delivery figure; each round is a fresh topic
    random_rounds: int = 400  # of which R (random subsets) uses the first few
    subscribers: int = 10  # subscribers per topic per round
    missing: tuple[float, ...] = (0.0, 0.01, 0.05, 0.1, 0.2, 0.3, 0.5)
    list_rounds: int = 1000
    list_subscribers: int = 5
    flood: tuple[int, ...] = (0, 200, 400, 500, 600, 700, 794, 800, 900, 950, 990, 999, 1000)
    flood_rounds: int = 1000
    cost_topics: int = 300
    real_client_rings: int = 2  # pairs of clients with their own HashRing (x = 10 %)
    real_ring_topics: int = 300
    balance_servers: int = 1000  # a real ring of this many servers at each of balance_points
    balance_points: tuple[int, ...] = (1, 10, 1000)
    balance_draws: int = 20  # draws of the Dirichlet model at balance_servers
    seed: int = DEFAULT_SEED

    @classmethod
    def short(cls) -> Params:
        # Same network (100,000 servers, K = 1,000), fewer points and rounds: a few seconds.
        return cls(
            points_per_server=1,
            rounds=400,
            random_rounds=40,
            subscribers=10,
            missing=(0.0, 0.1, 0.5),
            list_rounds=40,
            list_subscribers=4,
            flood=(0, 500, 794, 1000),
            flood_rounds=100,
            cost_topics=20,
            real_client_rings=0,
            balance_servers=200,
            balance_points=(1, 100),
            balance_draws=5,
        )


@attrs.frozen
class BalanceRow:
    """How evenly a ring of ``points`` points per server spreads keys (shares x N, mean 1)."""

    points: int
    sd_closed: float  # Dirichlet(P, ..., P): sqrt((N-1) / (N P + 1)) at balance_servers
    ring_sd: float  # the real ring of balance_servers servers
    ring_max: float
    model_max: tuple[float, float, float]  # min, mean, max over draws at balance_servers
    model_max_full: float  # one draw at params.servers


@attrs.frozen
class Results:
    params: Params
    delivery: dict[str, tuple[float, Estimate]]  # scenario -> (closed form, simulation)
    random_sizes: tuple[int, int]  # R's r = sqrt(N) and the r that reaches 99.9 %
    costs: dict[str, dict[str, float]]  # mode -> per-unit server work
    flood: list[tuple[int, float, Estimate]]
    lists: list[
        tuple[float, float, Estimate, float, Estimate, float, Estimate]
    ]  # see _differing_lists
    real_rings: Estimate | None  # overlap / K with real per-client rings at x = 10 %
    balance: list[BalanceRow]
    seconds: float


def server_names(n: int) -> list[str]:
    # Distinct "host:port" names; the ring only hashes them.
    return [f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}:7000" for i in range(n)]


def deliveries(
    pub_targets: Sequence[str],
    sub_targets: Sequence[Sequence[str]],
    p_up: float,
    rng: random.Random,
    flooded: frozenset[str] = frozenset(),
) -> list[int]:
    """One message round: copies each subscriber receives.

    The publisher sends to ``pub_targets``; every server that is up (and not flooded) forwards
    to each subscriber that subscribed there. A subscriber counts one copy per such server.
    """
    sent_to = set(pub_targets)
    state: dict[str, bool] = {}

    def up(server: str) -> bool:
        if server not in state:
            state[server] = server not in flooded and (p_up >= 1.0 or rng.random() < p_up)
        return state[server]

    return [sum(1 for s in targets if s in sent_to and up(s)) for targets in sub_targets]


def filtered_walk(walk: Sequence[str], k: int, holds: Callable[[str], bool]) -> list[str]:
    """The K a client computes with its own server list, from the full list's walk.

    Removing servers from a ring removes their points and nothing else, so a client's walk is
    the full walk with the servers it lacks left out (tests/topics/test_simulate.py checks this
    against a HashRing built from the client's list).
    """
    out: list[str] = []
    for s in walk:
        if holds(s):
            out.append(s)
            if len(out) == k:
                break
    return out


def _lazy_list(missing: float, rng: random.Random) -> Callable[[str], bool]:
    """A client's server list that lacks each server with probability ``missing``, decided
    the first time the client's walk meets the server."""
    table: dict[str, bool] = {}

    def holds(server: str) -> bool:
        if server not in table:
            table[server] = rng.random() >= missing
        return table[server]

    return holds


Targets = tuple[list[str], list[list[str]]]  # (publisher's servers, each subscriber's servers)


class _World:
    """The network of one run: its ring, its single seeded rng, and a supply of topics."""

    def __init__(self, params: Params) -> None:
        self.p = params
        self.rng = random.Random(params.seed)
        self.names = server_names(params.servers)
        self.ring = HashRing(self.names, params.points_per_server)
        self._topics = 0

    def topic_servers(self, k: int | None = None) -> list[str]:
        """A fresh topic's first ``k`` (default K) servers on the full list's ring."""
        self._topics += 1
        return self.ring.servers_for(f"topic/{self.p.seed}/{self._topics}", k or self.p.k)

    def new_topic(self) -> str:
        self._topics += 1
        return f"topic/{self.p.seed}/{self._topics}"

    # Ways of choosing targets from a topic's K servers ``ks``:
    def sub_kprime(self, ks: list[str]) -> Targets:
        return ks, [choose_random(ks, self.p.k_prime, self.rng) for _ in range(self.p.subscribers)]

    def pub_kprime(self, ks: list[str]) -> Targets:
        return choose_random(ks, self.p.k_prime, self.rng), [ks]

    def ch(self, ks: list[str]) -> Targets:
        return ks, [ks]

    def single(self, ks: list[str]) -> Targets:
        return ks[:1], [ks[:1]]

    def random_r(self, r: int) -> Callable[[list[str]], Targets]:
        def pick(_ks: list[str]) -> Targets:
            return self.rng.sample(self.names, r), [
                self.rng.sample(self.names, r) for _ in range(2)
            ]

        return pick


def _delivery(w: _World, r_sqrt: int, r_999: int) -> dict[str, tuple[float, Estimate]]:
    """Delivery with p-reliable independent servers, one scenario per way of choosing."""
    p = w.p
    # (closed form, choice of targets, messages per round). Where every subscriber of a
    # round would see the same servers (they all hold all of K, or the one server), extra
    # subscribers add nothing, so those rounds send several independent messages instead.
    scenarios: dict[str, tuple[float, Callable[[list[str]], Targets], int]] = {
        "sub_kprime": (delivery_any_of(p.p_up, p.k_prime), w.sub_kprime, 1),
        "pub_kprime": (delivery_any_of(p.p_up, p.k_prime), w.pub_kprime, p.subscribers),
        "ch": (delivery_any_of(p.p_up, p.k), w.ch, 1),
        "single": (p.p_up, w.single, p.subscribers),
        "random_sqrt": (
            delivery_random_subsets(p.servers, r_sqrt, p.p_up),
            w.random_r(r_sqrt),
            1,
        ),
        "random_999": (delivery_random_subsets(p.servers, r_999, p.p_up), w.random_r(r_999), 1),
    }
    # One walk per topic serves every scenario (each draws its own server states), so the
    # ring is walked once per round, not once per scenario.
    samples: dict[str, list[float]] = {name: [] for name in scenarios}
    for i in range(p.rounds):
        ks = w.topic_servers()
        for name, (_closed, choose, messages) in scenarios.items():
            if name.startswith("random") and i >= p.random_rounds:
                continue  # R ignores the ring and costs 2r random draws per client
            got: list[int] = []
            for _ in range(messages):
                pub, subs = choose(ks)
                got += deliveries(pub, subs, p.p_up, w.rng)
            samples[name].append(sum(1 for c in got if c) / len(got))
    return {
        name: (closed, Estimate.of(samples[name])) for name, (closed, _c, _m) in scenarios.items()
    }


def _costs(w: _World) -> dict[str, dict[str, float]]:
    """Server work per unit, with every server up: a publish costs one server receipt per
    target; a subscription one table entry (and one refresh every N/M seconds) per server; a
    delivery one datagram per server that forwards it."""
    p = w.p
    costs: dict[str, dict[str, float]] = {}
    for mode, choose in (("sub_kprime", w.sub_kprime), ("pub_kprime", w.pub_kprime)):
        ingest = entries = copies = 0
        for _ in range(p.cost_topics):
            pub, subs = choose(w.topic_servers())
            subs = subs if len(subs) > 1 else subs * p.subscribers
            ingest += len(pub)
            entries += sum(len(s) for s in subs)
            copies += sum(deliveries(pub, subs, 1.0, w.rng))
        units = p.cost_topics * p.subscribers
        costs[mode] = {
            "per_publish": ingest / p.cost_topics,
            "per_subscriber": entries / units,
            "per_delivery": copies / units,
        }
    return costs


def _flooding(w: _World) -> list[tuple[int, float, Estimate]]:
    """The attacker knows the topic and the server list, hence K, but not which K' each
    client drew, so its best move is any f of the K."""
    p = w.p
    flood: list[tuple[int, float, Estimate]] = []
    for f in p.flood:
        cut: list[float] = []
        for _ in range(p.flood_rounds):
            ks = w.topic_servers()
            flooded = frozenset(w.rng.sample(ks, f))
            pub, subs = w.sub_kprime(ks)
            got = deliveries(pub, subs, 1.0, w.rng, flooded)
            cut.append(sum(1 for c in got if not c) / len(got))
        flood.append((f, flooded_fraction(f, p.k, p.k_prime), Estimate.of(cut)))
    return flood


ListsRow = tuple[float, float, Estimate, float, Estimate, float, Estimate]


def _differing_lists(w: _World) -> list[ListsRow]:
    """Clients each missing every server with probability x: (x, K overlap closed and
    simulated, CH miss rate as log10 and simulated, RCH miss rate closed and simulated)."""
    p = w.p
    rows: list[ListsRow] = []
    for x in p.missing:
        q = 1.0 - x
        e_overlap = expected_overlap(p.k, q)
        overlaps, d_ch, d_rch = [], [], []
        walk_len = min(p.servers, int(p.k / q + 10 * math.sqrt(p.k * x) / q) + 50)
        for _ in range(p.list_rounds):
            walk = w.topic_servers(walk_len)
            k_pub = filtered_walk(walk, p.k, _lazy_list(x, w.rng))
            k_subs = [
                filtered_walk(walk, p.k, _lazy_list(x, w.rng)) for _ in range(p.list_subscribers)
            ]
            overlaps.append(
                math.fsum(len(set(k_pub) & set(ks)) for ks in k_subs) / (p.k * len(k_subs))
            )
            got = deliveries(k_pub, k_subs, p.p_up, w.rng)
            d_ch.append(sum(1 for c in got if c) / len(got))
            picks = [choose_random(ks, p.k_prime, w.rng) for ks in k_subs]
            got = deliveries(k_pub, picks, p.p_up, w.rng)
            d_rch.append(sum(1 for c in got if c) / len(got))
        rows.append(
            (
                x,
                e_overlap / p.k,
                Estimate.of(overlaps),
                # CH: both use all of their K; a miss needs every common server down.
                # Kept as log10: (1/10)^900 underflows a float.
                e_overlap * math.log10(1 - p.p_up) if p.p_up < 1 else -math.inf,
                Estimate.of([1 - d for d in d_ch]),
                1 - delivery_rch_with_overlap(e_overlap, p.k, p.k_prime, p.p_up),
                Estimate.of([1 - d for d in d_rch]),
            )
        )
    return rows


def _real_client_rings(w: _World, say: Callable[[str], None]) -> Estimate:
    """The shortcut of ``_differing_lists`` (a client's K = the full walk filtered by its
    list) checked with rings built from the clients' own lists (x = 10 %), as a client would."""
    p = w.p
    shared: list[float] = []
    for pair in range(p.real_client_rings):
        say(f"real client rings: pair {pair + 1}")
        a = HashRing([s for s in w.names if w.rng.random() >= 0.1], p.points_per_server)
        b = HashRing([s for s in w.names if w.rng.random() >= 0.1], p.points_per_server)
        for _ in range(p.real_ring_topics):
            t = w.new_topic()
            common = set(a.servers_for(t, p.k)) & set(b.servers_for(t, p.k))
            shared.append(len(common) / p.k)
    return Estimate.of(shared)


def dirichlet_shares(n: int, points: int, rng: random.Random) -> list[float]:
    """One draw of n servers' shares of the circle, each holding ``points`` uniform points.

    The gaps between n*P uniform points on a circle are Dirichlet(1, ..., 1); a server's share
    is the sum of the P gaps its points close, so the shares are exactly Dirichlet(P, ..., P),
    drawn as normalised Gamma(P) variates. This gives the balance of a 10^8-point ring
    without building it.
    """
    g = [rng.gammavariate(points, 1.0) for _ in range(n)]
    total = math.fsum(g)
    return [x / total for x in g]


def _balance(w: _World, say: Callable[[str], None]) -> list[BalanceRow]:
    p = w.p
    n = p.balance_servers
    names = server_names(n)
    rows = []
    for points in p.balance_points:
        say(f"balance: {n} servers x {points} points")
        shares = list(HashRing(names, points).shares().values())
        mean_sq = math.fsum((x * n - 1) ** 2 for x in shares) / n
        model = [max(dirichlet_shares(n, points, w.rng)) * n for _ in range(p.balance_draws)]
        rows.append(
            BalanceRow(
                points=points,
                sd_closed=math.sqrt((n - 1) / (n * points + 1)),
                ring_sd=math.sqrt(mean_sq),
                ring_max=max(shares) * n,
                model_max=(min(model), math.fsum(model) / len(model), max(model)),
                model_max_full=max(dirichlet_shares(p.servers, points, w.rng)) * p.servers,
            )
        )
    return rows


def run(params: Params, progress: Callable[[str], None] | None = None) -> Results:
    say = progress or (lambda _m: None)
    t0 = time.monotonic()
    p = params
    say(f"building the ring: {p.servers} servers x {p.points_per_server} points")
    w = _World(p)
    r_sqrt = math.isqrt(p.servers - 1) + 1
    r_999 = random_subset_size_for(p.servers, p.p_up, 0.999)
    say("delivery")
    delivery = _delivery(w, r_sqrt, r_999)
    say("costs")
    costs = _costs(w)
    say("flooding")
    flood = _flooding(w)
    say("different server lists")
    lists = _differing_lists(w)
    real = _real_client_rings(w, say) if p.real_client_rings else None
    balance = _balance(w, say)
    return Results(
        params=p,
        delivery=delivery,
        random_sizes=(r_sqrt, r_999),
        costs=costs,
        flood=flood,
        lists=lists,
        real_rings=real,
        balance=balance,
        seconds=time.monotonic() - t0,
    )


# --- reporting ----------------------------------------------------------------------------


def _pct(x: float, digits: int = 2) -> str:
    return f"{100 * x:.{digits}f} %"


def _est_pct(e: Estimate, digits: int = 2) -> str:
    return f"{100 * e.mean:.{digits}f} % ± {100 * 1.96 * e.se:.{digits}f}"


def _mult(x: float) -> str:
    return f"{x:,.0f}x"


def markdown(res: Results) -> str:
    p = res.params
    n, k, kp = p.servers, p.k, p.k_prime
    d = res.delivery
    r_sqrt, r_999 = res.random_sizes
    lines = [
        f"<!-- generated by `python -m tools.topics_simulate` (seed {p.seed}); do not edit -->",
        "",
        f"N = {n:,} servers, K = {k:,}, K' = {kp}, servers up with probability {p.p_up} "
        f"independently; ring of {p.points_per_server} point(s) per server; "
        f"{p.rounds:,} topics x {p.subscribers} subscribers per delivery figure. "
        "Simulation: mean ± 95 % interval over independent rounds.",
        "",
        "| Figure | The soft-state pub/sub note says | Closed form | Simulation |",
        "|---|---|---|---|",
    ]

    def row(fig: str, seed: str, closed: str, sim: str) -> None:
        lines.append(f"| {fig} | {seed} | {closed} | {sim} |")

    def deliv(key: str, fig: str, seed: str, digits: int = 3) -> None:
        closed, est = d[key]
        row(fig, seed, _pct(closed, digits), _est_pct(est, digits))

    deliv("sub_kprime", "Delivery, subscribe-to-K' (publish to all K)", "99.9 %")
    deliv("pub_kprime", "Delivery, publish-to-K' (subscribe to all K)", "99.9 %")
    deliv("ch", "Delivery, CH (publish and subscribe to all K)", "—")
    deliv("single", "Delivery, S (one server per topic)", "—")
    deliv(
        "random_sqrt",
        f"Delivery, R with r = ⌈√N⌉ = {r_sqrt} random servers each side",
        "“r² comparable to N”",
    )
    deliv(
        "random_999",
        f"Delivery, R with r = {r_999} (smallest r reaching 99.9 %)",
        "“two to six orders of magnitude more resources than S”",
    )
    for mode, label, seed_bw, seed_subs in (
        ("sub_kprime", "subscribe-to-K'", "33,000x “bandwidth”", "100x"),
        ("pub_kprime", "publish-to-K'", "100x “bandwidth”", "33,000x"),
    ):
        c = res.costs[mode]
        pub_cost = k if mode == "sub_kprime" else kp
        sub_cost = kp if mode == "sub_kprime" else k
        row(
            f"Publish rate vs one server, {label} (server receipts per publish)",
            seed_bw,
            f"N / {pub_cost} = {_mult(n / pub_cost)}",
            f"{c['per_publish']:.0f} per publish → {_mult(n / c['per_publish'])}",
        )
        row(
            f"Subscribers vs one server, {label} (table entries per subscriber)",
            seed_subs,
            f"N / {sub_cost} = {_mult(n / sub_cost)}",
            f"{c['per_subscriber']:.0f} per subscriber → {_mult(n / c['per_subscriber'])}",
        )
        row(
            f"Deliveries vs one server, {label} (copies per subscriber per message)",
            f"“each subscriber receives each message K' times”: {kp}",
            f"N / {kp} = {_mult(n / kp)}",
            f"{c['per_delivery']:.2f} per delivery → {_mult(n / c['per_delivery'])}",
        )
    full = [e for f, _c, e in res.flood if f == k]
    row(
        "Servers an attacker must flood to silence a topic",
        "1,000 (1 % of the network)",
        f"K = {k:,} ({k / n:.0%} of the network)",
        (f"{_est_pct(full[0], 1)} of subscribers cut off at {k:,}" if full else "—"),
    )
    half = flood_needed(0.5, k, kp)
    at_half = [e for f, _c, e in res.flood if f == half]
    row(
        "Servers to flood to cut off half the subscribers (RCH)",
        "—",
        f"{half} (C(f,{kp}) / C(K,{kp}) ≥ ½)",
        (f"{_est_pct(at_half[0], 1)} cut off at {half}" if at_half else "—"),
    )
    lines += [
        "",
        "**Flooding f of a topic's K servers** (subscribe-to-K'; the attacker knows K, not the K'"
        " each subscriber drew; share of subscribers that receive nothing):",
        "",
        "| f flooded | share of network | Closed form C(f,K')/C(K,K') | Simulation |",
        "|---:|---:|---:|---:|",
    ]
    for f, closed, est in res.flood:
        lines.append(f"| {f:,} | {f / n:.2%} | {_pct(closed, 1)} | {_est_pct(est, 1)} |")
    lines += [
        "",
        "**Clients with different server lists** (each client misses every server independently"
        " with probability x; publisher and subscribers draw their lists separately; servers "
        f"{p.p_up:.0%} reliable):",
        "",
        "| x missing | K overlap, closed form | K overlap, simulation "
        "| CH miss rate, closed form | CH miss rate, sim. "
        "| RCH subscribe-to-K' miss rate, closed form | RCH miss rate, sim. |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for x, ov, ov_e, ch_c, ch_e, rch_c, rch_e in res.lists:
        lines.append(
            f"| {x:.0%} | {_pct(ov, 1)} | {_est_pct(ov_e, 1)} | 10^{ch_c:.0f} | "
            f"{_est_pct(ch_e, 3)} | {_pct(rch_c, 3)} | {_est_pct(rch_e, 3)} |"
        )
    if res.real_rings is not None:
        x10 = [ov for x, ov, *_ in res.lists if abs(x - 0.1) < 1e-9]
        lines += [
            "",
            f"Check of the shortcut with rings built from the clients' own lists (x = 10 %, "
            f"{p.real_client_rings} pairs of {p.points_per_server}-point rings, "
            f"{p.real_ring_topics} topics each): K overlap {_est_pct(res.real_rings, 1)}"
            + (f" (closed form {_pct(x10[0], 1)})." if x10 else "."),
        ]
    lines += [
        "",
        f"**Balance across topics** (each server's share of the circle x N, mean 1: the load "
        f"of S, and of the first of each topic's K). Real rings of {p.balance_servers:,} "
        "servers, and the exact distribution of the shares, Dirichlet(P, ..., P), drawn at "
        f"{p.balance_servers:,} and at {n:,} servers, where a real ring of 1,000 points per "
        "server would hold 10^8 points:",
        "",
        "| points per server (P) | spread (sd), closed form | spread, real ring "
        "| busiest server, real ring | busiest, model (range of draws) "
        f"| busiest, model at {n:,} servers |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for b in res.balance:
        lo, mid, hi = b.model_max
        lines.append(
            f"| {b.points:,} | {b.sd_closed:.3f} | {b.ring_sd:.3f} | {b.ring_max:.2f}x | "
            f"{mid:.2f}x ({lo:.2f} to {hi:.2f}) | {b.model_max_full:.2f}x |"
        )
    lines.append("")
    return "\n".join(lines)


def svg(res: Results) -> str:
    """Two panels drawn by hand (no plotting dependency): flooding, and differing lists."""
    width, height = 900, 380
    panel_w, panel_h = 360, 260
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
    ]
    p = res.params

    def panel(
        x0: float,
        title: str,
        xlabel: str,
        ylabel: str,
        xmax: float,
        xticks: Sequence[tuple[float, str]],
        curves: Sequence[tuple[str, str, Sequence[tuple[float, float]]]],
        points: Sequence[tuple[str, Sequence[tuple[float, float, float]]]],
        legend_at_bottom: bool = False,
    ) -> None:
        y0 = 50.0

        def sx(v: float) -> float:
            return x0 + v / xmax * panel_w

        def sy(v: float) -> float:
            return y0 + panel_h - v * panel_h

        out.append(
            f'<text x="{x0 + panel_w / 2}" y="30" text-anchor="middle" font-size="14" '
            f'font-weight="bold">{title}</text>'
        )
        out.append(
            f'<rect x="{x0}" y="{y0}" width="{panel_w}" height="{panel_h}" fill="none" '
            'stroke="#333"/>'
        )
        for v in (0.0, 0.25, 0.5, 0.75, 1.0):
            out.append(
                f'<line x1="{x0}" y1="{sy(v)}" x2="{x0 + panel_w}" y2="{sy(v)}" stroke="#ddd"/>'
            )
            out.append(f'<text x="{x0 - 6}" y="{sy(v) + 4}" text-anchor="end">{v:.0%}</text>')
        for v, label in xticks:
            out.append(
                f'<line x1="{sx(v)}" y1="{y0 + panel_h}" x2="{sx(v)}" y2="{y0 + panel_h + 5}" '
                'stroke="#333"/>'
            )
            out.append(
                f'<text x="{sx(v)}" y="{y0 + panel_h + 18}" text-anchor="middle">{label}</text>'
            )
        out.append(
            f'<text x="{x0 + panel_w / 2}" y="{y0 + panel_h + 36}" text-anchor="middle">'
            f"{xlabel}</text>"
        )
        out.append(
            f'<text x="{x0 - 42}" y="{y0 + panel_h / 2}" text-anchor="middle" '
            f'transform="rotate(-90 {x0 - 42} {y0 + panel_h / 2})">{ylabel}</text>'
        )
        legend_y = y0 + 14 if not legend_at_bottom else y0 + panel_h - 16 * (len(curves) + 1)
        for colour, label, pts in curves:
            path = " ".join(f"{sx(a):.1f},{sy(b):.1f}" for a, b in pts)
            out.append(
                f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>'
            )
            out.append(
                f'<line x1="{x0 + 10}" y1="{legend_y}" x2="{x0 + 30}" y2="{legend_y}" '
                f'stroke="{colour}" stroke-width="2"/>'
            )
            out.append(f'<text x="{x0 + 35}" y="{legend_y + 4}">{label}</text>')
            legend_y += 16
        for colour, marks in points:
            for a, b, err in marks:
                out.append(
                    f'<line x1="{sx(a):.1f}" y1="{sy(b - err):.1f}" x2="{sx(a):.1f}" '
                    f'y2="{sy(b + err):.1f}" stroke="{colour}"/>'
                )
                out.append(
                    f'<circle cx="{sx(a):.1f}" cy="{sy(b):.1f}" r="3.5" fill="none" '
                    f'stroke="{colour}" stroke-width="1.5"/>'
                )
        out.append(
            f'<text x="{x0 + 10}" y="{legend_y + 4}" fill="#555">'
            "○ simulation (95 % interval), lines closed form</text>"
        )

    k, kp = p.k, p.k_prime
    fs = list(range(0, k + 1, max(1, k // 100)))
    panel(
        80,
        f"Flooding f of a topic's K = {k:,} servers",
        "servers flooded (f)",
        "subscribers cut off",
        k,
        [(v, f"{v:,}") for v in range(0, k + 1, k // 5)],
        [
            (
                "#c0392b",
                "RCH, K' = 1",
                [(f, flooded_fraction(f, k, 1)) for f in fs],
            ),
            (
                "#2471a3",
                f"RCH, K' = {kp}",
                [(f, flooded_fraction(f, k, kp)) for f in fs],
            ),
            (
                "#1e8449",
                "CH, all K",
                [(f, 1.0 if f == k else 0.0) for f in fs],
            ),
        ],
        [("#2471a3", [(f, e.mean, 1.96 * e.se) for f, _c, e in res.flood])],
    )
    xs = [i / 100 for i in range(0, 91, 5)]
    panel(
        520,
        "Clients missing x of the server list",
        "x (share of servers each client lacks)",
        "share of K in common / delivery",
        0.9,
        [(v, f"{v:.0%}") for v in (0.0, 0.2, 0.4, 0.6, 0.8)],
        [
            ("#7d3c98", "K overlap", [(x, expected_overlap(k, 1 - x) / k) for x in xs]),
            (
                "#2471a3",
                f"RCH delivery, K' = {kp}",
                [
                    (x, delivery_rch_with_overlap(expected_overlap(k, 1 - x), k, kp, p.p_up))
                    for x in xs
                ],
            ),
        ],
        [
            ("#7d3c98", [(x, e.mean, 1.96 * e.se) for x, _o, e, *_ in res.lists]),
            ("#2471a3", [(row[0], 1 - row[6].mean, 1.96 * row[6].se) for row in res.lists]),
        ],
        legend_at_bottom=True,
    )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.topics_simulate",
        description="The pub/sub note's CH/RCH figures for 100,000 servers, K = 1,000, K' = 3.",
    )
    parser.add_argument("--out", type=Path, help="directory for topics-sim.md and .svg")
    parser.add_argument("--short", action="store_true", help="the few-second CI form")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    args = parser.parse_args(argv)
    params = Params.short() if args.short else Params()
    params = attrs.evolve(params, seed=args.seed)
    res = run(params, progress=lambda m: print(f"  {m}", file=sys.stderr))
    table = markdown(res)
    print(table)
    print(f"({res.seconds:.0f} s)", file=sys.stderr)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "topics-sim.md").write_text(table)
        (args.out / "topics-sim.svg").write_text(svg(res))
        print(
            f"wrote {args.out / 'topics-sim.md'} and {args.out / 'topics-sim.svg'}", file=sys.stderr
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
