"""The matchmaker's pure core: properties (hypothesis) and the rules one by one."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echo.lobby.matchmaker import (
    Entry,
    Match,
    Matchmaker,
    MatchRules,
    QueueError,
    queue_home,
    queue_key,
)
from echo.topics.ring import HashRing

RULES = MatchRules(skill_window=100, widen_per_second=20, region_wait=5, open_after=15)
MODES = ("duel", "squad")
REGIONS = ("eu", "us", "asia")

# One step of a run: (kind, member number, mode, region, skill, size, party size, dt)
step = st.tuples(
    st.sampled_from(["solo", "solo", "solo", "party", "withdraw", "cancel", "wait"]),
    st.integers(0, 59),
    st.sampled_from(MODES),
    st.sampled_from(REGIONS),
    st.integers(0, 3000),
    st.sampled_from([2, 3, 4]),
    st.integers(2, 3),
    st.floats(0, 6),
)


def check_match(match: Match, now: float, rules: MatchRules) -> None:
    sizes = {t.size for t in match.tickets}
    assert len(sizes) == 1 and len(match.members) == sizes.pop(), "sizes exact"
    assert len(set(match.members)) == len(match.members)
    assert len({t.mode for t in match.tickets}) == 1
    spread = max(t.skill for t in match.tickets) - min(t.skill for t in match.tickets)
    assert spread <= min(rules.window(t.waited(now)) for t in match.tickets), "skill window"
    if len({t.region for t in match.tickets}) > 1:
        assert all(t.waited(now) >= rules.region_wait for t in match.tickets), "region first"
        assert not any(t.strict_region for t in match.tickets)


@settings(max_examples=300, deadline=None)
@given(st.lists(step, max_size=120))
def test_no_player_in_two_matches_parties_whole_sizes_exact(steps: list) -> None:
    mm = Matchmaker(RULES)
    now = 0.0
    matched: set[str] = set()
    parties: dict[int, tuple[str, ...]] = {}  # party id -> its members
    party_of: dict[str, int] = {}
    next_party = 1
    for kind, n, mode, region, skill, size, party_size, dt in steps:
        member = f"m{n}"
        if kind == "wait":
            now += dt
        elif member in matched:
            continue
        elif kind == "solo" and member not in party_of:
            mm.enqueue(Entry(member, mode, region, skill, size), now)
        elif kind == "party" and member not in party_of:
            others = [f"m{(n + k) % 60}" for k in range(1, party_size)]
            group = (member, *others)
            if any(m in matched or m in party_of for m in group) or party_size > size:
                continue
            party = next_party
            next_party += 1
            parties[party] = group
            for m in group:
                party_of[m] = party
                mm.enqueue(Entry(m, mode, region, skill, size, party, party_size), now)
        elif kind == "withdraw":
            mm.withdraw(member, now)
        elif kind == "cancel":
            dropped = mm.cancel(member)
            if dropped is not None:
                assert member in dropped.members
        mm.expire(now)
        for match in mm.match(now):
            check_match(match, now, RULES)
            members = set(match.members)
            assert not members & matched, "a player in two matches"
            matched |= members
            for m in members:
                if m in party_of:
                    assert set(parties[party_of[m]]) <= members, "a party split"
            for m in members:
                assert mm.ticket_of(m) is None


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(MODES),
            st.sampled_from(REGIONS),
            st.integers(-(10**6), 10**6),
            st.sampled_from([2, 3, 5]),
            st.floats(0, 20),
        ),
        max_size=80,
    )
)
def test_a_lone_players_wait_is_bounded(entries: list) -> None:
    """Whatever the skills and regions: once every ticket has waited `open_after`, one
    `match` leaves fewer players than a match's size in each (mode, size)."""
    mm = Matchmaker(RULES)
    for i, (mode, region, skill, size, at) in enumerate(entries):
        mm.enqueue(Entry(f"p{i}", mode, region, skill, size), at)
    last = max((e[4] for e in entries), default=0.0)
    mm.match(last)  # what can be matched early is (by the rules of that moment)
    mm.match(last + RULES.open_after + 1e-9)  # (float: every wait is open_after or more)
    left = Counter((t.mode, t.size) for t in mm.tickets())
    for (_, size), count in left.items():
        assert count < size


def test_skill_window_widens_with_waiting() -> None:
    mm = Matchmaker(RULES)
    mm.enqueue(Entry("a", "duel", "eu", 1000, 2), 0)
    mm.enqueue(Entry("b", "duel", "eu", 1300, 2), 0)
    assert mm.match(0) == []  # 300 apart, window 100
    assert mm.match(9) == []  # window 280
    [match] = mm.match(10)  # window 300
    assert match.members == ("a", "b")


def test_region_first_then_other_regions() -> None:
    mm = Matchmaker(RULES)
    mm.enqueue(Entry("eu1", "duel", "eu", 1000, 2), 0)
    mm.enqueue(Entry("us1", "duel", "us", 1000, 2), 0)
    assert mm.match(4) == []
    mm.enqueue(Entry("eu2", "duel", "eu", 1050, 2), 4.5)
    # Past the region wait, eu1 could take us1, but its own region comes first.
    [match] = mm.match(5)
    assert set(match.members) == {"eu1", "eu2"}
    mm.enqueue(Entry("us2", "duel", "us", 5000, 2, strict_region=True), 5)
    mm.enqueue(Entry("asia1", "duel", "asia", 1000, 2), 0)
    [match] = mm.match(6)
    assert set(match.members) == {"us1", "asia1"}
    assert mm.match(100) == []  # strict: alone in its region
    assert [t.members for t in mm.tickets()] == [("us2",)]


def test_parties_are_kept_whole_and_gather_before_matching() -> None:
    mm = Matchmaker(RULES)
    t1 = mm.enqueue(Entry("a", "squad", "eu", 1000, 4, party=7, party_size=3), 0)
    for m in ("x", "y"):
        mm.enqueue(Entry(m, "squad", "eu", 1000, 4), 0)
    assert mm.match(0) == []  # the party is not all there: x and y cannot fill 4 alone
    assert mm.enqueue(Entry("b", "squad", "eu", 1010, 4, party=7, party_size=3), 0) == t1
    assert mm.enqueue(Entry("c", "squad", "eu", 1020, 4, party=7, party_size=3), 0) == t1
    [match] = mm.match(1)
    assert set(match.members) >= {"a", "b", "c"} and len(match.members) == 4
    assert len(mm) == 1  # x or y: a party of 3 and two solos make 5, not 4


def test_a_member_of_a_party_queued_without_it_is_refused_not_left_waiting() -> None:
    # The leader's view of its lobby was behind: it queued the party as a party of 1.
    mm = Matchmaker(RULES)
    t1 = mm.enqueue(Entry("lead", "trio", "eu", 10, 3, party=9, party_size=1), 0)
    with pytest.raises(QueueError) as refused:
        mm.enqueue(Entry("mate", "trio", "eu", 10, 3, party=9, party_size=2), 0)
    assert refused.value.reason == "party" and "as 1" in str(refused.value)
    assert mm.ticket_of("mate") is None and mm.ticket_of("lead") == t1
    mm.cancel("lead")  # once that ticket is gone, the party can queue whole
    t2 = mm.enqueue(Entry("lead", "trio", "eu", 10, 3, party=9, party_size=2), 1)
    assert mm.enqueue(Entry("mate", "trio", "eu", 10, 3, party=9, party_size=2), 1) == t2


def test_a_party_that_does_not_gather_is_dropped_and_a_withdrawn_member_holds_it() -> None:
    mm = Matchmaker(RULES)
    mm.enqueue(Entry("a", "duel", "eu", 1, 2, party=3, party_size=2), 0)
    [dropped] = mm.expire(RULES.party_wait)
    assert dropped.members == ("a",) and "arrive" in dropped.reason
    assert len(mm) == 0
    mm.enqueue(Entry("a", "squad", "eu", 1, 4, party=4, party_size=2), 100)
    mm.enqueue(Entry("b", "squad", "eu", 1, 4, party=4, party_size=2), 100)
    mm.withdraw("b", 101)  # its session ended: the party waits for it again
    for m in ("x", "y"):
        mm.enqueue(Entry(m, "squad", "eu", 1, 4), 101)
    assert mm.match(101) == []
    mm.enqueue(Entry("b", "squad", "eu", 1, 4, party=4, party_size=2, waited=1), 102)
    [match] = mm.match(102)
    assert set(match.members) == {"a", "b", "x", "y"}


def test_sent_again_keeps_its_place_changed_replaces_cancel_takes_the_party() -> None:
    mm = Matchmaker(RULES)
    t = mm.enqueue(Entry("a", "duel", "eu", 1, 2), 0)
    assert mm.enqueue(Entry("a", "duel", "eu", 1, 2), 5) == t
    t2 = mm.enqueue(Entry("a", "duel", "us", 1, 2), 5)
    assert t2 != t and len(mm) == 1
    mm.enqueue(Entry("p", "duel", "eu", 1, 2, party=9, party_size=2), 0)
    mm.enqueue(Entry("q", "duel", "eu", 1, 2, party=9, party_size=2), 0)
    dropped = mm.cancel("q")
    assert dropped is not None and set(dropped.members) == {"p", "q"}
    assert mm.ticket_of("p") is None and mm.cancel("p") is None


def test_waited_is_carried_to_the_next_home_and_bounded() -> None:
    mm = Matchmaker(RULES)
    mm.enqueue(Entry("a", "duel", "eu", 0, 2, waited=14), 100)
    mm.enqueue(Entry("b", "duel", "us", 10**6, 2, waited=10**9), 100)
    [match] = mm.match(101)  # both open: a waited 15 s in all
    assert match.tickets[0].since == pytest.approx(100 - RULES.open_after)


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        (Entry("a", "", "eu", 1, 2), "name"),
        (Entry("a", "x" * 33, "eu", 1, 2), "name"),
        (Entry("a", "duel", "e\nu", 1, 2), "name"),
        (Entry("a", "duel", "eu", 1, 1), "size"),
        (Entry("a", "duel", "eu", 1, 65), "size"),
        (Entry("a", "duel", "eu", 1, 2, party_size=2), "party"),
        (Entry("a", "duel", "eu", 1, 2, party=1, party_size=3), "party"),
        (Entry("a", "duel", "eu", 1, 2, waited=float("nan")), "waited"),
    ],
)
def test_bad_entries_are_refused_with_a_reason(entry: Entry, reason: str) -> None:
    mm = Matchmaker(RULES)
    with pytest.raises(QueueError) as refused:
        mm.enqueue(entry, 0)
    assert refused.value.reason == reason
    assert len(mm) == 0


def test_a_party_member_asking_for_another_match_is_refused() -> None:
    mm = Matchmaker(RULES)
    mm.enqueue(Entry("a", "duel", "eu", 1, 4, party=2, party_size=2), 0)
    with pytest.raises(QueueError) as refused:
        mm.enqueue(Entry("b", "duel", "us", 1, 4, party=2, party_size=2), 0)
    assert refused.value.reason == "party"


def test_the_queues_are_bounded() -> None:
    mm = Matchmaker(MatchRules(max_tickets=2))
    mm.enqueue(Entry("a", "duel", "eu", 1, 3), 0)
    mm.enqueue(Entry("b", "duel", "eu", 1000, 3), 0)
    with pytest.raises(QueueError) as refused:
        mm.enqueue(Entry("c", "duel", "eu", 1, 3), 0)
    assert refused.value.reason == "full"
    mm.enqueue(Entry("a", "duel", "us", 1, 3), 0)  # replacing its own entry is not more


def test_the_queue_home_is_the_rings_and_walks_past_the_dead() -> None:
    ring = HashRing(["s1", "s2", "s3"])
    home = queue_home(ring, "duel", "eu")
    assert home == ring.servers_for(queue_key("duel", "eu"), 1)[0]
    nxt = queue_home(ring, "duel", "eu", {home})
    assert nxt not in (None, home)
    assert queue_home(ring, "duel", "eu", {"s1", "s2", "s3"}) is None
    assert queue_key("a:b", "c") != queue_key("a", "b:c")


def test_ten_thousand_players_are_matched_in_one_pass() -> None:
    mm = Matchmaker(RULES)
    for i in range(10_000):
        mm.enqueue(Entry(f"p{i}", "duel", REGIONS[i % 3], (i * 7919) % 3000, 2), 0)
    matches = mm.match(0)
    assert sum(len(m.members) for m in matches) >= 9_900


def test_a_party_too_big_for_the_seats_left_is_passed_over_for_smaller_tickets() -> None:
    mm = Matchmaker(RULES)
    mm.enqueue(Entry("a", "squad", "eu", 1000, 4, party=1, party_size=2), 0)
    mm.enqueue(Entry("b", "squad", "eu", 1000, 4, party=1, party_size=2), 0)
    for m in ("x", "y", "z"):  # the closest in skill, but 3 do not fit in 2 seats
        mm.enqueue(Entry(m, "squad", "eu", 1001, 4, party=2, party_size=3), 1)
    mm.enqueue(Entry("s1", "squad", "eu", 1050, 4), 1)
    mm.enqueue(Entry("s2", "squad", "eu", 1060, 4), 1)
    [match] = mm.match(1)
    assert set(match.members) == {"a", "b", "s1", "s2"}
