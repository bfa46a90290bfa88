"""The internet-scale simulation (tools/topics_simulate.py): closed forms checked by brute force,
the Monte Carlo's short form (what CI runs) checked against the closed forms."""

from __future__ import annotations

import itertools
import math
import random
import xml.etree.ElementTree as ET
from pathlib import Path

import attrs
import pytest

from echo.topics.ring import HashRing
from tools import topics_simulate as simulate
from tools.topics_simulate import (
    Estimate,
    Params,
    Results,
    delivery_random_subsets,
    delivery_rch_with_overlap,
    expected_overlap,
    filtered_walk,
    flood_needed,
    flooded_fraction,
)

# --- closed forms against enumeration -------------------------------------------------------


def _overlap_by_enumeration(k: int, q: float, length: int) -> float:
    # Every pair of "which of the first `length` servers does each client hold".
    total = 0.0
    for a in itertools.product((0, 1), repeat=length):
        pa = math.prod(q if v else 1 - q for v in a)
        ka = {i for i, v in enumerate(a) if v}
        ka = set(sorted(ka)[:k])
        for b in itertools.product((0, 1), repeat=length):
            pb = math.prod(q if v else 1 - q for v in b)
            kb = set(sorted(i for i, v in enumerate(b) if v)[:k])
            total += pa * pb * len(ka & kb)
    return total


@pytest.mark.parametrize(("k", "q"), [(2, 0.8), (3, 0.9)])
def test_expected_overlap_matches_enumeration(k: int, q: float) -> None:
    # Truncating the walk at 8 servers loses < 1e-4 of the mass for these q.
    assert expected_overlap(k, q) == pytest.approx(_overlap_by_enumeration(k, q, 8), abs=1e-3)


def test_expected_overlap_for_one_server() -> None:
    # K = 1: the i-th server met is common and first for both with probability
    # q^2 (1-q)^(2(i-1)); the geometric sum is q / (2 - q).
    for q in (0.1, 0.5, 0.99):
        assert expected_overlap(1, q) == pytest.approx(q / (2 - q))


def test_expected_overlap_edges() -> None:
    assert expected_overlap(1000, 1.0) == 1000
    # Roughly K * q: both hold the server (q^2) over the ~K/q servers walked.
    assert expected_overlap(1000, 0.9) == pytest.approx(900, rel=0.01)
    assert expected_overlap(1000, 0.9) < 900


def test_random_subsets_by_enumeration() -> None:
    n, r, p = 7, 3, 0.8
    subsets = list(itertools.combinations(range(n), r))
    fail = 0.0
    for a in subsets:
        for b in subsets:
            fail += (1 - p) ** len(set(a) & set(b))
    assert delivery_random_subsets(n, r, p) == pytest.approx(1 - fail / len(subsets) ** 2)
    # r > n/2: every pair of subsets overlaps.
    assert delivery_random_subsets(5, 3, 1.0) == pytest.approx(1.0)


def test_flooded_fraction_by_enumeration() -> None:
    k, k_prime, f = 8, 3, 5
    flooded = set(range(f))
    picks = list(itertools.combinations(range(k), k_prime))
    cut = sum(1 for pick in picks if set(pick) <= flooded) / len(picks)
    assert flooded_fraction(f, k, k_prime) == pytest.approx(cut)
    assert flood_needed(0.5, 1000, 3) == 794
    assert flood_needed(1.0, 1000, 3) == 1000
    assert flood_needed(1.0, 1000, 1000) == 1000


def test_rch_with_overlap_by_enumeration() -> None:
    k, k_prime, overlap, p = 6, 2, 3, 0.7
    common = range(overlap)
    picks = list(itertools.combinations(range(k), k_prime))
    ok = 0.0
    for ups in itertools.product((0, 1), repeat=overlap):
        p_ups = math.prod(p if u else 1 - p for u in ups)
        good = {s for s, u in zip(common, ups, strict=True) if u}
        ok += p_ups * sum(1 for pick in picks if good & set(pick)) / len(picks)
    assert delivery_rch_with_overlap(overlap, k, k_prime, p) == pytest.approx(ok)
    assert delivery_rch_with_overlap(1000, 1000, 3, 0.9) == pytest.approx(0.999)


# --- the shortcut the simulation relies on --------------------------------------------------


def test_a_clients_k_is_the_full_walk_filtered_by_its_list() -> None:
    # simulate.run computes a client's K from the full list's walk instead of building a ring
    # per client. That is only faithful if it equals what the client's own ring says.
    servers = simulate.server_names(400)
    full = HashRing(servers, 20)
    rng = random.Random(5)
    for x in (0.1, 0.5):
        mine = [s for s in servers if rng.random() >= x]
        held = set(mine)
        own = HashRing(mine, 20)
        for i in range(200):
            walk = full.servers_for(f"t/{i}", len(servers))
            assert filtered_walk(walk, 12, held.__contains__) == own.servers_for(f"t/{i}", 12)


def test_deliveries_counts_copies_through_up_servers_only() -> None:
    rng = random.Random(1)
    got = simulate.deliveries(
        ["a", "b", "c"], [["a", "b"], ["d"], ["c", "x"]], 1.0, rng, frozenset({"b"})
    )
    assert got == [1, 0, 1]
    assert simulate.deliveries(["a"], [["a"]], 0.0, rng) == [0]


# --- the short form, as CI runs it ----------------------------------------------------------


@pytest.fixture(scope="module")
def short() -> Results:
    return simulate.run(Params.short())


def _within(est: Estimate, closed: float, units: int) -> bool:
    # Four standard errors, the larger of the observed one and the binomial one the closed
    # form implies (a rare event may not occur at all in a short run, giving se = 0).
    binomial = math.sqrt(closed * (1 - closed) / units)
    return abs(est.mean - closed) <= 4 * max(est.se, binomial) + 1e-12


def test_short_form_reproduces_the_delivery_figures(short: Results) -> None:
    p = short.params
    assert p.servers == 100_000 and p.k == 1000 and p.k_prime == 3
    for name, (closed, est) in short.delivery.items():
        units = est.rounds * (2 if name.startswith("random") else p.subscribers)
        assert _within(est, closed, units), (name, closed, est)
    # The note's figure itself.
    assert short.delivery["sub_kprime"][0] == pytest.approx(0.999)
    assert short.delivery["pub_kprime"][0] == pytest.approx(0.999)
    assert short.delivery["single"][0] == pytest.approx(0.9)
    assert short.random_sizes == (317, 873)


def test_short_form_counts_the_costs_of_both_rch_modes(short: Results) -> None:
    assert short.costs["sub_kprime"] == {
        "per_publish": 1000,
        "per_subscriber": 3,
        "per_delivery": 3,
    }
    assert short.costs["pub_kprime"] == {
        "per_publish": 3,
        "per_subscriber": 1000,
        "per_delivery": 3,
    }


def test_short_form_flooding(short: Results) -> None:
    for _f, closed, est in short.flood:
        assert _within(est, closed, est.rounds * short.params.subscribers), (_f, closed, est)
    by_f = {f: est.mean for f, _c, est in short.flood}
    assert by_f[1000] == 1.0  # flooding all K silences the topic
    assert by_f[0] == 0.0


def test_short_form_differing_lists(short: Results) -> None:
    units = short.params.list_rounds * short.params.list_subscribers
    for x, overlap, overlap_est, _ch, ch_est, rch, rch_est in short.lists:
        assert _within(overlap_est, overlap, units), (x, overlap, overlap_est)
        assert _within(rch_est, rch, units), (x, rch, rch_est)
        # CH's miss rate is (1/10)^overlap: nothing is ever lost.
        assert ch_est.mean == 0.0


def test_dirichlet_model_of_the_shares() -> None:
    rng = random.Random(4)
    shares = simulate.dirichlet_shares(20_000, 100, rng)
    assert math.fsum(shares) == pytest.approx(1.0)
    sd = math.sqrt(math.fsum((x * 20_000 - 1) ** 2 for x in shares) / 20_000)
    assert sd == pytest.approx(math.sqrt(19_999 / (20_000 * 100 + 1)), rel=0.05)


def test_short_form_balance(short: Results) -> None:
    # The real ring's spread of shares is the closed form's, within the sampling error of a
    # few hundred servers; more points, a flatter ring; more servers, a busier busiest one.
    rows = short.balance
    assert [b.points for b in rows] == list(short.params.balance_points)
    for b in rows:
        assert b.ring_sd == pytest.approx(b.sd_closed, rel=0.35)
        assert b.model_max[0] <= b.model_max[1] <= b.model_max[2]
        assert b.model_max_full > b.model_max[1]
    assert rows[-1].ring_max < rows[0].ring_max
    assert rows[-1].model_max_full < rows[0].model_max_full


def test_markdown_and_svg(short: Results, tmp_path: Path) -> None:
    table = simulate.markdown(short)
    for figure in ("99.9 %", "33,000x", "1,000 (1 % of the network)", "33,333x", "100x"):
        assert figure in table
    root = ET.fromstring(simulate.svg(short))
    ns = "{http://www.w3.org/2000/svg}"
    assert root.tag == f"{ns}svg"
    assert len(root.findall(f"{ns}polyline")) == 5
    assert len(root.findall(f"{ns}circle")) == len(short.flood) + 2 * len(short.lists)


TINY = Params(
    servers=3000,
    k=30,
    k_prime=3,
    points_per_server=2,
    rounds=60,
    random_rounds=5,
    subscribers=4,
    missing=(0.0, 0.2),
    list_rounds=10,
    list_subscribers=2,
    flood=(0, 15, 30),
    flood_rounds=10,
    cost_topics=5,
    real_client_rings=1,
    real_ring_topics=10,
    balance_servers=50,
    balance_points=(1, 20),
    balance_draws=2,
)


def test_same_seed_same_files_and_the_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Params, "short", classmethod(lambda cls: TINY))
    assert simulate.main(["--short", "--out", str(tmp_path / "a")]) == 0
    assert simulate.main(["--short", "--out", str(tmp_path / "b")]) == 0
    assert simulate.main(["--short", "--seed", "7", "--out", str(tmp_path / "c")]) == 0
    a = (tmp_path / "a" / "topics-sim.md").read_text()
    assert a == (tmp_path / "b" / "topics-sim.md").read_text()
    assert a != (tmp_path / "c" / "topics-sim.md").read_text()
    assert (tmp_path / "a" / "topics-sim.svg").read_text() == (
        tmp_path / "b" / "topics-sim.svg"
    ).read_text()
    assert "rings built from the clients' own lists" in a


def test_params_are_the_seeds_network() -> None:
    full = Params()
    assert (full.servers, full.k, full.k_prime, full.p_up) == (100_000, 1000, 3, 0.9)
    assert attrs.evolve(full, seed=1).seed == 1
