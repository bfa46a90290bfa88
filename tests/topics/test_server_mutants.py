"""The topics server core's edges, each something an operator or a client would notice: the
configuration's bounds, every counter and event, the amplification figure, the lifetime a
confirmation announces, the cookie hand-over, and how deliveries pack at the datagram size.

Pure: a scripted clock, no sockets (these tests are in `./dev mutate topics`'s selection).
"""

from __future__ import annotations

import math

import pytest

from echo.topics.codec import (
    Cookie,
    Life,
    format_confirm,
    format_cookie,
    format_life,
    format_pad,
    format_publish,
    make_cookie,
    parse_datagram,
)
from echo.topics.server import ServerConfig, TopicServerCore
from tests.topics.test_server_core import SUB, cookie_from, subscribe

PUB = ("10.0.0.3", 6000)
OTHER = ("10.0.0.4", 6001)


# --- the configuration's bounds ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"lifetime": 0.0}, "lifetime (N) must be positive"),
        ({"lifetime": -1.0}, "lifetime (N) must be positive"),
        ({"lifetime": math.nan}, "lifetime (N) must be positive"),
        ({"table_size": -1}, "table_size must be 0 (off) or positive"),
        ({"max_subscriptions": 0}, "max_subscriptions must be positive"),
        ({"work_difficulty": -1}, "work_difficulty must be within 0..40 bits"),
        ({"work_difficulty": 41}, "work_difficulty must be within 0..40 bits"),
        ({"cookie_period": 0.0}, "cookie_period must be positive"),
        ({"max_datagram": 63}, "max_datagram must be within 64..65507 bytes"),
        ({"max_datagram": 65508}, "max_datagram must be within 64..65507 bytes"),
        ({"rate_limit": -0.5}, "rate_limit must be >= 0 and rate_burst >= 1"),
        ({"rate_burst": 0.5}, "rate_limit must be >= 0 and rate_burst >= 1"),
        ({"max_sources": 0}, "max_sources must be positive"),
    ],
)
def test_a_configuration_out_of_bounds_is_refused_with_its_reason(
    fields: dict[str, float], message: str
) -> None:
    with pytest.raises(ValueError) as refused:
        ServerConfig(**fields)  # type: ignore[arg-type]
    assert str(refused.value) == message


@pytest.mark.parametrize(
    "fields",
    [
        {"lifetime": 0.001},
        {"table_size": 0},
        {"table_size": 1},
        {"max_subscriptions": 1},
        {"work_difficulty": 0},
        {"work_difficulty": 40},
        {"cookie_period": 0.001},
        {"max_datagram": 64},
        {"max_datagram": 65507},
        {"rate_limit": 0.0},
        {"rate_burst": 1.0},
        {"max_sources": 1},
    ],
)
def test_every_bound_itself_is_accepted(fields: dict[str, float]) -> None:
    config = ServerConfig(**fields)  # type: ignore[arg-type]
    for name, value in fields.items():
        assert getattr(config, name) == value


# --- counters, events and the amplification figure --------------------------------------------


def test_a_fresh_server_reports_zeroes_and_no_amplification() -> None:
    core = TopicServerCore()
    snapshot = core.counters.snapshot()
    assert snapshot["amplification"] == 0.0 and snapshot["malformed_lines"] == 0
    assert all(v == 0 for k, v in snapshot.items() if k != "malformed")
    assert set(snapshot["malformed"]) >= {"unterminated", "empty", "unknown_control"}
    assert core.queued == 0 and core.next_deadline() == math.inf
    assert core.datagrams_to_send() == []
    assert core.counters.datagrams_sent == 0 and core.counters.bytes_sent == 0


def test_the_bytes_in_and_out_of_an_unconfirmed_source_are_counted() -> None:
    core = TopicServerCore(ServerConfig(work_difficulty=3))
    request = b"t\nu\n" + format_pad(100)
    core.on_datagram(request, SUB, 1.0)
    (reply, to), *rest = core.datagrams_to_send()
    assert rest == [] and to == SUB
    c = core.counters
    assert (c.datagrams_received, c.bytes_received, c.lines_received) == (1, len(request), 3)
    assert (c.subscribes, c.unconfirmed_subscribes, c.cookies_sent) == (2, 2, 1)
    assert c.unconfirmed_bytes_received == len(request)
    assert c.unconfirmed_bytes_sent == len(reply)
    assert (c.datagrams_sent, c.bytes_sent) == (1, len(reply))
    assert reply == format_cookie(cookie_from([(reply, to)]).cookie, 3)
    snapshot = c.snapshot()
    assert snapshot["amplification"] == round(len(reply) / len(request), 4)
    assert 0 < snapshot["amplification"] < 1


def test_a_confirmed_request_is_not_counted_as_unconfirmed_bytes() -> None:
    core = TopicServerCore()
    subscribe(core, SUB, [b"t"], now=1.0)
    before = core.counters.unconfirmed_bytes_received
    core.on_datagram(b"t\n", SUB, 1.0)  # no confirm line: unconfirmed
    assert core.counters.unconfirmed_bytes_received == before + 2
    cookie = make_cookie(core.secret, 0, *SUB)
    confirmed = format_confirm(cookie) + b"t\n"
    core.on_datagram(confirmed, SUB, 2.0)
    assert core.counters.unconfirmed_bytes_received == before + 2
    assert core.counters.subscriptions_refreshed == 1


def test_a_confirm_without_a_subscribe_is_counted_and_answered_with_nothing() -> None:
    core = TopicServerCore()
    cookie = make_cookie(core.secret, 0, *SUB)
    core.on_datagram(format_confirm(cookie), SUB, 1.0)
    assert core.counters.confirms_without_subscribe == 1
    assert core.counters.subscribes == 0 and core.datagrams_to_send() == []
    core.on_datagram(b"t\n" + format_pad(64), SUB, 1.0)
    assert core.counters.confirms_without_subscribe == 1


def test_an_unterminated_tail_and_server_only_lines_are_malformed() -> None:
    core = TopicServerCore()
    cookie = format_cookie(make_cookie(b"k", 0, *PUB), 0)
    core.on_datagram(format_life(5) + cookie + b"t m", PUB, 1.0)
    c = core.counters
    assert c.malformed["unknown_control"] == 2 and c.malformed["unterminated"] == 1
    assert c.malformed_lines == 3 and c.lines_received == 2
    assert core.counters.snapshot()["malformed_lines"] == 3
    core.on_datagram(b"\n", PUB, 1.0)
    assert c.malformed["empty"] == 1 and c.malformed_lines == 4


def test_each_subscription_added_refreshed_and_expired_is_an_event() -> None:
    core = TopicServerCore(ServerConfig(lifetime=10))
    subscribe(core, SUB, [b"lobby-eu"], now=0.0)
    assert core.events == [
        ("subscription_added", {"topic": "lobby-eu", "source_ip": SUB[0], "source_port": SUB[1]})
    ]
    assert core.counters.subscriptions_added == 1
    core.on_timer(10.0)
    assert core.events[-1] == (
        "subscription_expired",
        {"topic": "lobby-eu", "source_ip": SUB[0], "source_port": SUB[1]},
    )
    assert core.subscription_count == 0 and core.topics == {}


def test_an_evicted_subscription_is_an_event_and_leaves_no_empty_topic() -> None:
    core = TopicServerCore(ServerConfig(table_size=1))
    subscribe(core, SUB, [b"a"], now=0.0)
    subscribe(core, OTHER, [b"b"], now=1.0)
    assert core.events[-2] == (
        "subscription_evicted",
        {"topic": "a", "source_ip": SUB[0], "source_port": SUB[1]},
    )
    assert core.events[-1][0] == "subscription_added"
    assert core.topics == {b"b": {OTHER: None}}
    assert core.counters.subscriptions_evicted == 1


def test_a_lapsed_subscriber_leaves_the_others_of_its_topic() -> None:
    core = TopicServerCore(ServerConfig(lifetime=10))
    subscribe(core, SUB, [b"t"], now=0.0)
    subscribe(core, OTHER, [b"t"], now=5.0)
    assert core.next_deadline() == 10.0
    core.on_timer(10.0)
    assert core.subscribers(b"t") == [OTHER] and core.next_deadline() == 15.0
    assert core.counters.subscriptions_expired == 1


def test_a_refresh_moves_a_subscription_to_the_back_of_the_expiry_order() -> None:
    core = TopicServerCore(ServerConfig(lifetime=10))
    subscribe(core, SUB, [b"t"], now=0.0)
    subscribe(core, OTHER, [b"t"], now=2.0)
    subscribe(core, SUB, [b"t"], now=4.0)  # refreshed: now the later of the two
    assert core.next_deadline() == 12.0
    core.on_timer(12.0)
    assert core.subscribers(b"t") == [SUB]


# --- the lifetime a confirmation announces, and the cookie hand-over ---------------------------


def test_the_lifetime_estimate_is_n_until_the_fifo_table_is_full() -> None:
    core = TopicServerCore(ServerConfig(lifetime=60, table_size=2))
    assert core.lifetime_estimate(0.0) == 60.0
    subscribe(core, SUB, [b"t"], now=0.0)
    assert core.lifetime_estimate(500.0) == 60.0  # one entry of two: not full
    subscribe(core, OTHER, [b"t"], now=10.0)
    assert core.lifetime_estimate(25.0) == 25.0  # the oldest entry's age
    assert core.lifetime_estimate(100.0) == 60.0  # never more than N
    assert core.lifetime_estimate(-5.0) == 0.0  # never less than 0


def test_without_a_fifo_table_a_full_server_still_announces_n() -> None:
    core = TopicServerCore(ServerConfig(lifetime=60, max_subscriptions=1))
    subscribe(core, SUB, [b"t"], now=0.0)
    assert core.lifetime_estimate(30.0) == 60.0


def test_a_cookie_of_the_current_epoch_gets_only_the_lifetime_back() -> None:
    core = TopicServerCore(ServerConfig(cookie_period=60, lifetime=30))
    reply = subscribe(core, SUB, [b"t"], now=61.0)  # cookie and confirm both in epoch 1
    assert reply == [(format_life(30), SUB)]
    late = make_cookie(core.secret, 1, *SUB)
    core.on_datagram(format_confirm(late) + b"t\n", SUB, 125.0)  # epoch 2: hand over epoch 2's
    (datagram, _), *_ = core.datagrams_to_send()
    lines = list(parse_datagram(datagram))
    assert lines[0] == Life(30.0)
    assert lines[1] == Cookie(make_cookie(core.secret, 2, *SUB), 0)


def test_a_clock_before_the_epoch_counts_as_epoch_zero() -> None:
    core = TopicServerCore(ServerConfig(cookie_period=60))
    core.on_datagram(b"t\n" + format_pad(64), SUB, -30.0)
    cookie = cookie_from(core.datagrams_to_send())
    assert cookie.cookie == make_cookie(core.secret, 0, *SUB)


def test_a_cookie_answer_exactly_as_large_as_the_request_is_sent() -> None:
    core = TopicServerCore()
    answer = format_cookie(make_cookie(core.secret, 0, *SUB), 0)
    request = b"t\n" + format_pad(len(answer) - 2)
    assert len(request) == len(answer)
    core.on_datagram(request, SUB, 1.0)
    assert core.datagrams_to_send() == [(answer, SUB)]
    core.on_datagram(b"t\n" + format_pad(len(answer) - 3), SUB, 1.0)  # a byte less
    assert core.datagrams_to_send() == []
    assert core.counters.cookies_withheld == 1 and core.counters.cookies_sent == 1


# --- rate limits --------------------------------------------------------------------------------


def test_without_a_rate_limit_no_source_is_limited_or_tracked() -> None:
    core = TopicServerCore(ServerConfig(rate_limit=0, rate_burst=1))
    for _ in range(20):
        core.on_datagram(b"t m\n", PUB, 1.0)
    assert core.counters.publishes == 20 and core.counters.rate_limited == 0
    assert len(core._buckets) == 0


def test_a_bucket_refills_at_the_rate_up_to_the_burst_and_one_token_passes() -> None:
    core = TopicServerCore(ServerConfig(rate_limit=1, rate_burst=2))
    for _ in range(3):
        core.on_datagram(b"t m\n", PUB, 0.0)
    assert core.counters.publishes == 2 and core.counters.rate_limited == 1
    core.on_datagram(b"t m\n", PUB, 100.0)  # long idle: back to the burst of 2, not 100
    core.on_datagram(b"t m\n", PUB, 100.0)
    core.on_datagram(b"t m\n", PUB, 100.0)
    assert core.counters.publishes == 4 and core.counters.rate_limited == 2
    core.on_datagram(b"t m\n", PUB, 100.5)  # half a token: still limited
    assert core.counters.rate_limited == 3
    core.on_datagram(b"t m\n", PUB, 101.0)  # half a token more: exactly one
    assert core.counters.publishes == 5


def test_the_rate_limiter_forgets_the_least_recently_seen_source() -> None:
    core = TopicServerCore(ServerConfig(rate_limit=1, rate_burst=1, max_sources=2))
    core.on_datagram(b"t m\n", ("10.0.0.1", 1), 0.0)
    core.on_datagram(b"t m\n", ("10.0.0.2", 1), 0.0)
    core.on_datagram(b"t m\n", ("10.0.0.1", 1), 0.0)  # limited, and now the most recent
    core.on_datagram(b"t m\n", ("10.0.0.3", 1), 0.0)  # 10.0.0.2 is forgotten, not 10.0.0.1
    assert list(core._buckets) == ["10.0.0.1", "10.0.0.3"]
    core.on_datagram(b"t m\n", ("10.0.0.1", 1), 0.0)
    assert core.counters.rate_limited == 2


# --- deliveries -----------------------------------------------------------------------------------


def test_a_publish_exactly_the_datagram_size_is_delivered_and_packing_fills_to_it() -> None:
    core = TopicServerCore(ServerConfig(max_datagram=64))
    subscribe(core, SUB, [b"t"], now=0.0)
    sent, sent_bytes = core.counters.datagrams_sent, core.counters.bytes_sent
    whole = format_publish(b"t", b"m" * 61)
    assert len(whole) == 64
    core.on_datagram(whole, PUB, 1.0)
    assert core.datagrams_to_send() == [(whole, SUB)]
    half = format_publish(b"t", b"m" * 29)
    assert len(half) == 32
    core.on_datagram(half * 3, PUB, 1.0)
    assert core.queued == 2  # one full datagram of two lines out, one line pending
    out = core.datagrams_to_send()
    assert out == [(half * 2, SUB), (half, SUB)]
    assert core.counters.datagrams_sent == sent + 3
    assert core.counters.bytes_sent == sent_bytes + 64 + 96
    assert core.counters.deliveries == 4 and core.counters.publishes_too_large == 0


def test_a_publish_nobody_subscribed_to_is_counted_and_goes_nowhere() -> None:
    core = TopicServerCore(ServerConfig(max_datagram=64))
    core.on_datagram(format_publish(b"t", b"m" * 100), PUB, 1.0)
    assert core.counters.publishes == 1 and core.counters.publishes_too_large == 0
    assert core.counters.deliveries == 0 and core.queued == 0


def test_a_fan_out_reaches_each_subscriber_once() -> None:
    core = TopicServerCore()
    subscribe(core, SUB, [b"t"], now=0.0)
    subscribe(core, OTHER, [b"t"], now=0.0)
    line = format_publish(b"t", b"hello")
    core.on_datagram(line, PUB, 1.0)
    assert sorted(core.datagrams_to_send()) == sorted([(line, SUB), (line, OTHER)])
    assert core.counters.deliveries == 2


def test_every_counter_adds_up_over_several_datagrams() -> None:
    """Each counter accumulates: the figures an operator graphs are totals, not the last event."""
    core = TopicServerCore(ServerConfig(table_size=1))
    c = core.counters
    guess = format_confirm(make_cookie(b"not the secret", 0, *SUB))
    small = b"t\n"
    core.on_datagram(small, SUB, 1.0)  # withheld: smaller than the cookie
    core.on_datagram(small + b"x", SUB, 1.0)  # withheld again, and an unterminated tail
    core.on_datagram(b"y", SUB, 1.0)  # another unterminated tail, no line
    assert c.cookies_withheld == 2 and c.malformed["unterminated"] == 2
    assert c.lines_received == 2 and c.datagrams_received == 3
    assert c.bytes_received == 2 + 3 + 1
    core.on_datagram(guess + small, SUB, 1.0)  # a bad cookie
    core.on_datagram(guess + small, SUB, 1.0)  # and another
    assert c.bad_cookies == 2
    core.on_datagram(guess, SUB, 1.0)  # confirms of nothing
    core.on_datagram(guess, SUB, 1.0)
    core.on_datagram(format_publish(b"t", b"m"), PUB, 1.0)  # neither confirm nor subscribe
    assert c.confirms_without_subscribe == 2
    assert c.bad_cookies == 4
    subscribe(core, SUB, [b"a"], now=2.0)
    subscribe(core, OTHER, [b"b"], now=3.0)  # evicts SUB's
    subscribe(core, SUB, [b"c"], now=4.0)  # evicts OTHER's
    assert c.subscriptions_added == 3 and c.subscriptions_evicted == 2
    # the two subscribes with a bad cookie were answered as unconfirmed, then 3 handshakes
    assert c.cookies_sent == 2 + 3
    # 2, then 2 x 2 (confirm, subscribe), 2 confirms, a publish, 3 handshakes of 2 x 2 lines
    assert c.lines_received == 2 + 4 + 2 + 1 + 3 * 4


def test_a_server_given_its_secret_keeps_it_so_a_restart_honours_its_cookies() -> None:
    secret = b"k" * 32
    first = TopicServerCore(secret=secret)
    assert first.secret == secret
    first.on_datagram(b"t\n" + format_pad(64), SUB, 1.0)
    cookie = cookie_from(first.datagrams_to_send())
    again = TopicServerCore(secret=secret)  # the same server, restarted with its secret
    again.on_datagram(format_confirm(cookie.cookie) + b"t\n", SUB, 2.0)
    assert again.subscribers(b"t") == [SUB]
    other = TopicServerCore()
    assert len(other.secret) == 32 and other.secret != secret
