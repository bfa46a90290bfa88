"""Address validation for dynamic MDC: stateless cookies and the per-source rate limiter.

These are the anti-reflection parts of the transport (Aeron's dynamic MDC has none): a cookie that
an attacker could reuse for another address, or a limiter that never refills, would go unnoticed by
the driver tests, which only ever see well-behaved peers.
"""

from __future__ import annotations

import hashlib
import struct

import pytest

from echo.transport.core import validation
from echo.transport.core.validation import COOKIE_EPOCH, SM_COOKIE_FLAG, CookieJar, RateLimiter

SECRET = bytes(range(32))
ALICE = ("192.0.2.10", 40001)
RECEIVER = 0x1234


def jar() -> CookieJar:
    return CookieJar(SECRET)


# ------------------------------------------------------------------ cookies


def test_the_cookie_is_the_documented_keyed_hash() -> None:
    # The cookie is blake2b-64 keyed with the transport's secret over "host|port|receiver|epoch",
    # split into the SM's two int32 fields: a receiver echoes it without understanding it, but a
    # change here changes what every deployed publisher accepts within one epoch.
    digest = hashlib.blake2b(
        f"{ALICE[0]}|{ALICE[1]}|{RECEIVER}|2".encode(), key=SECRET, digest_size=8
    ).digest()
    assert jar().make(ALICE, RECEIVER, now=2 * COOKIE_EPOCH + 1.0) == struct.unpack("<ii", digest)


def test_a_cookie_is_accepted_from_the_address_it_was_made_for() -> None:
    cookie = jar().make(ALICE, RECEIVER, now=100.0)
    assert jar().check(ALICE, RECEIVER, cookie, now=100.0)


def test_a_cookie_is_bound_to_its_source_ip() -> None:
    # Accepting Alice's cookie from another host would let an attacker who once saw (or earned)
    # a cookie register a victim as a destination: the reflection attack all over again.
    cookie = jar().make(ALICE, RECEIVER, now=100.0)
    assert not jar().check(("192.0.2.11", ALICE[1]), RECEIVER, cookie, now=100.0)


def test_a_cookie_is_bound_to_its_source_port() -> None:
    cookie = jar().make(ALICE, RECEIVER, now=100.0)
    assert not jar().check((ALICE[0], ALICE[1] + 1), RECEIVER, cookie, now=100.0)


def test_a_cookie_is_bound_to_its_receiver_id() -> None:
    cookie = jar().make(ALICE, RECEIVER, now=100.0)
    assert not jar().check(ALICE, RECEIVER + 1, cookie, now=100.0)


def test_a_cookie_of_the_previous_epoch_is_still_accepted() -> None:
    # A challenge answered just after an epoch boundary must not be refused: the receiver did
    # nothing wrong, and a refusal costs it a whole extra round of challenge and answer.
    made = 3 * COOKIE_EPOCH - 0.5
    cookie = jar().make(ALICE, RECEIVER, now=made)
    assert jar().check(ALICE, RECEIVER, cookie, now=made + 1.0)
    assert jar().check(ALICE, RECEIVER, cookie, now=4 * COOKIE_EPOCH - 0.001)


def test_a_cookie_two_epochs_old_is_refused() -> None:
    made = 3 * COOKIE_EPOCH + 1.0
    cookie = jar().make(ALICE, RECEIVER, now=made)
    assert jar().check(ALICE, RECEIVER, cookie, now=5 * COOKIE_EPOCH - 0.001)
    assert not jar().check(ALICE, RECEIVER, cookie, now=5 * COOKIE_EPOCH)
    assert not jar().check(ALICE, RECEIVER, cookie, now=9 * COOKIE_EPOCH)


def test_a_cookie_from_the_next_epoch_is_refused() -> None:
    # Only the current and the previous epoch count: a cookie cannot be made ahead of time.
    cookie = jar().make(ALICE, RECEIVER, now=4 * COOKIE_EPOCH)
    assert not jar().check(ALICE, RECEIVER, cookie, now=4 * COOKIE_EPOCH - 1.0)


def test_one_epoch_gives_one_cookie_and_the_next_another() -> None:
    first = jar().make(ALICE, RECEIVER, now=2 * COOKIE_EPOCH)
    assert jar().make(ALICE, RECEIVER, now=3 * COOKIE_EPOCH - 0.001) == first
    assert jar().make(ALICE, RECEIVER, now=3 * COOKIE_EPOCH) != first
    assert jar().make(ALICE, RECEIVER, now=3 * COOKIE_EPOCH, epoch_offset=1) == first


def test_the_all_zero_cookie_is_never_accepted() -> None:
    # (0, 0) is what plain Aeron leaves in those SM fields: it must never count as a cookie.
    assert not jar().check(ALICE, RECEIVER, (0, 0), now=0.0)


def test_a_hash_of_zeros_is_not_sent_as_the_no_cookie_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Zeros:
        def __init__(self, *_: object, **__: object) -> None:
            pass

        def digest(self) -> bytes:
            return bytes(8)

    monkeypatch.setattr(validation.hashlib, "blake2b", Zeros)
    assert jar().make(ALICE, RECEIVER, now=0.0) == (0, 1)
    assert jar().check(ALICE, RECEIVER, (0, 1), now=0.0)


def test_a_hash_with_one_zero_half_is_sent_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    # Only both halves zero mean "no cookie"; a zero in one half is an ordinary cookie.
    class HalfZero:
        def __init__(self, *_: object, **__: object) -> None:
            pass

        def digest(self) -> bytes:
            return bytes(4) + struct.pack("<i", 5)

    monkeypatch.setattr(validation.hashlib, "blake2b", HalfZero)
    assert jar().make(ALICE, RECEIVER, now=0.0) == (0, 5)


def test_a_transport_draws_a_32_byte_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    drawn: list[int] = []

    def urandom(size: int) -> bytes:
        drawn.append(size)
        return bytes(size)

    monkeypatch.setattr(validation.os, "urandom", urandom)
    CookieJar()
    assert drawn == [32]
    CookieJar(SECRET)  # a given secret is used as it is
    assert drawn == [32]


def test_cookies_depend_on_the_secret() -> None:
    assert jar().make(ALICE, RECEIVER, 0.0) != CookieJar(bytes(32)).make(ALICE, RECEIVER, 0.0)
    # Without a secret each jar draws its own: another transport's cookie is worthless here.
    one, two = CookieJar(), CookieJar()
    assert not two.check(ALICE, RECEIVER, one.make(ALICE, RECEIVER, 0.0), now=0.0)
    assert one.check(ALICE, RECEIVER, one.make(ALICE, RECEIVER, 0.0), now=0.0)


def test_the_cookie_flag_is_not_an_aeron_sm_flag() -> None:
    # SETUP (0x80) and EOS (0x40) are Aeron's; the challenge must not look like either.
    assert SM_COOKIE_FLAG == 0x20


# ------------------------------------------------------------------ rate limiter


def test_a_burst_then_refusals() -> None:
    limiter = RateLimiter(rate=10.0, burst=3.0)
    assert [limiter.allow("a", now=0.0) for _ in range(5)] == [True, True, True, False, False]


def test_the_defaults_allow_forty_at_once_and_twenty_a_second() -> None:
    limiter = RateLimiter()
    assert sum(limiter.allow("a", now=0.0) for _ in range(100)) == 40
    assert sum(limiter.allow("a", now=1.0) for _ in range(100)) == 20


def test_the_limiter_refills_after_its_interval() -> None:
    # A NAT in front of many clients shares one host: it must get tokens back, not be locked
    # out for good after one busy moment.
    limiter = RateLimiter(rate=10.0, burst=2.0)
    assert limiter.allow("nat", now=0.0)
    assert limiter.allow("nat", now=0.0)
    assert not limiter.allow("nat", now=0.05)  # half a token back
    assert limiter.allow("nat", now=0.1)  # one whole token (0.05 s more)
    assert not limiter.allow("nat", now=0.1)
    assert limiter.allow("nat", now=10.0)
    assert limiter.allow("nat", now=10.0)


def test_a_refill_never_exceeds_the_burst() -> None:
    limiter = RateLimiter(rate=10.0, burst=2.0)
    assert limiter.allow("a", now=0.0)
    # An hour of silence is worth the burst, not 36,000 tokens.
    assert [limiter.allow("a", now=3600.0) for _ in range(4)] == [True, True, False, False]


def test_exactly_one_token_is_enough() -> None:
    limiter = RateLimiter(rate=4.0, burst=1.0)
    assert limiter.allow("a", now=0.0)
    assert not limiter.allow("a", now=0.0)
    assert limiter.allow("a", now=0.25)  # 0.25 s at 4/s is exactly 1.0 token


def test_refused_requests_do_not_spend_tokens() -> None:
    limiter = RateLimiter(rate=1.0, burst=1.0)
    assert limiter.allow("a", now=0.0)
    for i in range(1, 10):
        assert not limiter.allow("a", now=i * 0.1)
    assert limiter.allow("a", now=1.0)


def test_hosts_have_separate_buckets() -> None:
    limiter = RateLimiter(rate=1.0, burst=1.0)
    assert limiter.allow("a", now=0.0)
    assert not limiter.allow("a", now=0.0)
    assert limiter.allow("b", now=0.0)


def test_a_full_table_is_reset_for_a_new_host() -> None:
    # Memory stays bounded under a flood of forged sources; the reset forgives everyone.
    limiter = RateLimiter(rate=1.0, burst=1.0, max_sources=2)
    assert limiter.allow("a", now=0.0)
    assert limiter.allow("b", now=0.0)
    assert not limiter.allow("a", now=0.0)  # a known host: no reset
    assert not limiter.allow("b", now=0.0)
    assert limiter.allow("c", now=0.0)  # a third host: the table starts again
    assert limiter.allow("a", now=0.0)
    assert not limiter.allow("c", now=0.0)


def test_the_table_is_not_reset_before_it_is_full() -> None:
    limiter = RateLimiter(rate=1.0, burst=1.0, max_sources=3)
    assert limiter.allow("a", now=0.0)
    assert limiter.allow("b", now=0.0)
    assert limiter.allow("c", now=0.0)
    assert not limiter.allow("a", now=0.0)


def test_the_default_table_holds_8192_sources() -> None:
    limiter = RateLimiter()
    while limiter.allow("first", now=0.0):
        pass
    for i in range(8191):
        assert limiter.allow(f"10.0.{i // 256}.{i % 256}", now=0.0)
    assert not limiter.allow("first", now=0.0)  # 8192 sources: full, but nobody new yet
    assert limiter.allow("newcomer", now=0.0)  # the 8193rd resets the table
    assert limiter.allow("first", now=0.0)
