"""The pure topics server core with a scripted clock: soft state, handshake, limits, counters."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echo.topics.codec import (
    Cookie,
    Life,
    Publish,
    format_confirm,
    format_pad,
    format_publish,
    make_cookie,
    parse_datagram,
    parse_line,
    solve_work,
)
from echo.topics.server import ServerConfig, TopicServerCore

SUB = ("10.0.0.2", 5000)
PUB = ("10.0.0.3", 6000)
VICTIM = ("10.0.0.9", 7000)


def cookie_from(out: list[tuple[bytes, tuple[str, int]]]) -> Cookie:
    (datagram, _), *_ = out
    (line,) = list(parse_datagram(datagram))
    assert isinstance(line, Cookie)
    return line


def subscribe(
    core: TopicServerCore, source: tuple[str, int], topics: list[bytes], now: float
) -> list[tuple[bytes, tuple[str, int]]]:
    """The full handshake: request (padded), cookie, confirm; returns the confirmation."""
    body = b"".join(t + b"\n" for t in topics)
    core.on_datagram(body + format_pad(64), source, now)
    cookie = cookie_from(core.datagrams_to_send())
    work = solve_work(cookie.cookie, cookie.difficulty)
    core.on_datagram(format_confirm(cookie.cookie, work) + body, source, now)
    return core.datagrams_to_send()


def test_handshake_then_publish_reaches_the_subscriber_unchanged() -> None:
    core = TopicServerCore(ServerConfig(lifetime=30))
    reply = subscribe(core, SUB, [b"lobby/eu"], now=100.0)
    assert [parse_line(d[:-1]) for d, _ in reply] == [Life(30.0)]
    assert core.subscribers(b"lobby/eu") == [SUB]
    line = format_publish(b"lobby/eu", b"room 1", b"id1")
    core.on_datagram(line, PUB, 101.0)
    assert core.datagrams_to_send() == [(line, SUB)]
    assert core.counters.deliveries == 1 and core.counters.publishes == 1


def test_an_unconfirmed_subscription_is_not_added() -> None:
    core = TopicServerCore()
    core.on_datagram(b"t\n" + format_pad(64), SUB, 1.0)
    assert core.subscribers(b"t") == []
    assert core.counters.unconfirmed_subscribes == 1 and core.counters.cookies_sent == 1


def test_a_forged_subscription_gets_the_victim_one_datagram_no_larger_than_the_forgery() -> None:
    core = TopicServerCore()
    forged = b"".join(b"topic%d\n" % i for i in range(20))
    core.on_datagram(forged, VICTIM, 1.0)
    out = core.datagrams_to_send()
    assert len(out) == 1 and out[0][1] == VICTIM and len(out[0][0]) <= len(forged)
    # Publishes on those topics reach nobody: the victim never confirmed.
    core.on_datagram(format_publish(b"topic1", b"x" * 1000), PUB, 2.0)
    assert core.datagrams_to_send() == []
    # A forged confirm with a guessed cookie is no better.
    guess = make_cookie(b"not the secret", 0, *VICTIM)
    core.on_datagram(format_confirm(guess) + forged, VICTIM, 3.0)
    out = core.datagrams_to_send()
    assert core.counters.bad_cookies == 1
    assert len(out) == 1 and len(out[0][0]) <= len(format_confirm(guess) + forged)
    assert core.subscription_count == 0


def test_a_request_smaller_than_the_cookie_gets_no_answer() -> None:
    core = TopicServerCore()
    core.on_datagram(b"t\n", VICTIM, 1.0)
    assert core.datagrams_to_send() == []
    assert core.counters.cookies_withheld == 1


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=300), min_size=1, max_size=30))
def test_amplification_for_unconfirmed_sources_is_at_most_one(datagrams: list[bytes]) -> None:
    core = TopicServerCore()
    # A confirmed subscriber elsewhere, so forged publishes have somewhere to go.
    subscribe(core, SUB, [b"t", b"u"], now=0.0)
    sent_to_victim = received_from_victim = 0
    for i, data in enumerate(datagrams):
        core.on_datagram(data, VICTIM, 1.0 + i)
        received_from_victim += len(data)
        for datagram, address in core.datagrams_to_send():
            if address == VICTIM:
                sent_to_victim += len(datagram)
                assert len(datagram) <= len(data)
    assert sent_to_victim <= received_from_victim
    assert core.counters.amplification <= 1.0


def test_a_subscription_lapses_exactly_n_seconds_after_its_last_refresh() -> None:
    core = TopicServerCore(ServerConfig(lifetime=10))
    subscribe(core, SUB, [b"t"], now=100.0)
    subscribe(core, SUB, [b"t"], now=105.0)  # refresh: lives until 115
    assert core.counters.subscriptions_refreshed == 1
    line = format_publish(b"t", b"m")
    core.on_datagram(line, PUB, 114.999)
    assert core.datagrams_to_send() == [(line, SUB)]
    assert core.next_deadline() == pytest.approx(115.0)
    core.on_timer(115.0)
    assert core.subscribers(b"t") == [] and core.counters.subscriptions_expired == 1
    core.on_datagram(line, PUB, 115.0)
    assert core.datagrams_to_send() == []
    assert core.events[-1][0] == "subscription_expired"
    assert core.next_deadline() == float("inf")


def test_lapse_is_exact_even_without_a_timer_call() -> None:
    core = TopicServerCore(ServerConfig(lifetime=10))
    subscribe(core, SUB, [b"t"], now=0.0)
    core.on_datagram(format_publish(b"t", b"m"), PUB, 10.0)
    assert core.datagrams_to_send() == []


def test_fifo_table_evicts_the_oldest_and_estimates_the_lifetime() -> None:
    core = TopicServerCore(ServerConfig(lifetime=60, table_size=3))
    for i in range(3):
        reply = subscribe(core, (f"10.0.1.{i}", 1000), [b"t"], now=float(i * 10))
        # N until the table is full; then the oldest entry's age (20 s at t = 20).
        expected = 60.0 if i < 2 else 20.0
        assert parse_line(reply[0][0].split(b"\n")[0]) == Life(expected)
    # Full at t=20: the oldest entry (t=0) is 25 s old at t=25, so a new one lives ~25 s.
    assert core.lifetime_estimate(25.0) == 25.0
    reply = subscribe(core, ("10.0.1.9", 1000), [b"t"], now=25.0)
    assert core.counters.subscriptions_evicted == 1
    assert ("10.0.1.0", 1000) not in core.subscribers(b"t")
    assert parse_line(reply[0][0].split(b"\n")[0]) == Life(15.0)  # oldest now from t=10, 15 s ago
    assert core.subscription_count == 3


def test_proof_of_work_is_required_when_asked() -> None:
    core = TopicServerCore(ServerConfig(work_difficulty=10))
    core.on_datagram(b"t\n" + format_pad(64), SUB, 1.0)
    cookie = cookie_from(core.datagrams_to_send())
    assert cookie.difficulty == 10
    core.on_datagram(format_confirm(cookie.cookie, b"0") + b"t\n", SUB, 1.0)
    assert core.subscription_count == 0 or core.counters.insufficient_work == 0
    if core.subscription_count == 0:
        assert core.counters.insufficient_work == 1
    core.datagrams_to_send()
    work = solve_work(cookie.cookie, 10)
    core.on_datagram(format_confirm(cookie.cookie, work) + b"t\n", SUB, 1.0)
    assert core.subscribers(b"t") == [SUB]


def test_a_cookie_from_another_address_does_not_confirm() -> None:
    core = TopicServerCore()
    core.on_datagram(b"t\n" + format_pad(64), SUB, 1.0)
    cookie = cookie_from(core.datagrams_to_send())
    core.on_datagram(format_confirm(cookie.cookie) + b"t\n", VICTIM, 1.0)
    assert core.subscription_count == 0 and core.counters.bad_cookies == 1


def test_cookies_last_one_to_two_periods_and_are_handed_over() -> None:
    core = TopicServerCore(ServerConfig(cookie_period=60, lifetime=100))
    core.on_datagram(b"t\n" + format_pad(64), SUB, 10.0)  # epoch 0
    cookie = cookie_from(core.datagrams_to_send()).cookie
    core.on_datagram(format_confirm(cookie) + b"t\n", SUB, 70.0)  # epoch 1: still valid
    lines = list(parse_datagram(core.datagrams_to_send()[0][0]))
    assert isinstance(lines[0], Life) and isinstance(lines[1], Cookie)  # the next one
    core.on_datagram(format_confirm(cookie) + b"t\n", SUB, 120.0)  # epoch 2: expired
    assert core.counters.bad_cookies == 1
    core.datagrams_to_send()
    core.on_datagram(format_confirm(lines[1].cookie) + b"t\n", SUB, 120.0)
    assert core.counters.subscriptions_refreshed == 1


def test_deliveries_to_one_subscriber_are_packed_up_to_the_datagram_size() -> None:
    core = TopicServerCore(ServerConfig(max_datagram=200))
    subscribe(core, SUB, [b"t"], now=0.0)
    lines = [format_publish(b"t", b"m" * 40, b"i%d" % i) for i in range(10)]
    core.on_datagram(b"".join(lines), PUB, 1.0)
    out = core.datagrams_to_send()
    assert all(len(d) <= 200 and a == SUB for d, a in out)
    assert b"".join(d for d, _ in out) == b"".join(lines)
    assert len(out) == 3  # 4 lines of 49 bytes fit 200
    core.on_datagram(format_publish(b"t", b"m" * 300), PUB, 1.0)
    assert core.datagrams_to_send() == [] and core.counters.publishes_too_large == 1


def test_per_source_rate_limit() -> None:
    core = TopicServerCore(ServerConfig(rate_limit=10, rate_burst=5))
    for _ in range(8):
        core.on_datagram(b"t m\n", PUB, 1.0)
    assert core.counters.publishes == 5 and core.counters.rate_limited == 3
    core.on_datagram(b"t m\n", PUB, 1.1)  # 0.1 s at 10/s: one token back
    assert core.counters.publishes == 6
    core.on_datagram(b"t m\n", SUB, 1.1)  # another source has its own bucket
    assert core.counters.publishes == 7


def test_the_rate_limiter_forgets_the_least_recent_sources() -> None:
    core = TopicServerCore(ServerConfig(max_sources=10))
    for i in range(100):
        core.on_datagram(b"t m\n", (f"10.1.0.{i}", 1), 1.0)
    assert len(core._buckets) == 10


def test_max_subscriptions_bounds_memory_without_a_fifo_table() -> None:
    core = TopicServerCore(ServerConfig(max_subscriptions=2))
    subscribe(core, SUB, [b"a", b"b", b"c"], now=0.0)
    assert core.subscription_count == 2 and core.counters.subscriptions_refused == 1


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=1500))
def test_any_bytes_never_raise_and_every_malformed_line_is_counted(data: bytes) -> None:
    core = TopicServerCore(ServerConfig(rate_limit=0))
    subscribe(core, SUB, [b"t"], now=0.0)
    before = core.counters.malformed_lines
    core.on_datagram(data, PUB, 1.0)
    core.datagrams_to_send()
    lines = list(parse_datagram(data))
    malformed = sum(type(line).__name__ == "Malformed" for line in lines)
    # Cookie and life lines are malformed in a request too: clients do not send them.
    misdirected = sum(type(line).__name__ in ("Cookie", "Life") for line in lines)
    assert core.counters.malformed_lines - before == malformed + misdirected
    publishes = sum(isinstance(line, Publish) for line in lines)
    assert core.counters.publishes == publishes


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.binary(max_size=20),
            st.sampled_from([b"t", b"!pad", b"!confirm 0.aaaaaaaaaaaaaaaaaaaaaaaa", b"t m i"]),
        ),
        max_size=30,
    )
)
def test_hostile_lines_mixed_with_valid_ones(parts: list[bytes]) -> None:
    core = TopicServerCore(ServerConfig(rate_limit=0))
    data = b"\n".join(parts) + b"\n"
    core.on_datagram(data, VICTIM, 5.0)
    out = core.datagrams_to_send()
    assert len(out) <= 1 and all(len(d) <= len(data) for d, _ in out)
    assert core.subscription_count == 0
