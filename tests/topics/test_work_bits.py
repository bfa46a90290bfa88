"""The proof-of-work check against an independent count of leading zero bits.

The codec's tests check proofs with `work_bits`, the same counter the check uses: a counter one
bit too lenient (or a `>` become `>=`) would pass them. Here the bits are counted another way
(the hex digest spelt out as a string of 0s and 1s), and for every difficulty a proof with
exactly that many zero bits must pass and the same proof must fail one bit higher; the server
core must refuse, and count, a confirm one bit short.
"""

from __future__ import annotations

import hashlib

import pytest

from echo.topics.codec import (
    Cookie,
    check_work,
    format_confirm,
    format_pad,
    make_cookie,
    parse_datagram,
    work_bits,
)
from echo.topics.server import ServerConfig, TopicServerCore

SOURCE = ("10.0.0.2", 5000)
MAX_BITS = 12


def zero_bits(cookie: bytes, work: bytes) -> int:
    """Leading zero bits of SHA-256(cookie ' ' work), counted on the digest's binary spelling."""
    spelt = "".join(
        f"{int(digit, 16):04b}" for digit in hashlib.sha256(cookie + b" " + work).hexdigest()
    )
    return len(spelt) - len(spelt.lstrip("0"))


def exact_proofs(cookie: bytes, most: int) -> dict[int, bytes]:
    """For each k in 0..most, a work whose hash has exactly k leading zero bits."""
    found: dict[int, bytes] = {}
    nonce = 0
    while len(found) < most + 1:
        work = b"%x" % nonce  # the hex digits a confirm carries
        bits = zero_bits(cookie, work)
        if bits <= most:
            found.setdefault(bits, work)
        nonce += 1
    return found


COOKIE = make_cookie(b"k" * 32, 3, "10.0.0.2", 5000)
PROOFS = exact_proofs(COOKIE, MAX_BITS)


def test_the_independent_count_agrees_on_known_digests() -> None:
    # The counter under test must agree with the independent one on every proof found.
    for bits, work in PROOFS.items():
        assert zero_bits(COOKIE, work) == bits
        assert work_bits(COOKIE, work) == bits


@pytest.mark.parametrize("bits", range(1, MAX_BITS + 1))
def test_a_proof_passes_at_its_bits_and_fails_one_bit_higher(bits: int) -> None:
    work = PROOFS[bits]
    assert check_work(COOKIE, work, bits)
    assert not check_work(COOKIE, work, bits + 1)
    # and one bit short of a difficulty is refused, whatever the difficulty
    assert not check_work(COOKIE, PROOFS[bits - 1], bits)


def test_difficulty_zero_asks_for_no_work() -> None:
    assert check_work(COOKIE, b"", 0)


@pytest.mark.parametrize("difficulty", [1, 8, MAX_BITS])
def test_the_server_refuses_a_confirm_one_bit_short_and_counts_it(difficulty: int) -> None:
    core = TopicServerCore(ServerConfig(work_difficulty=difficulty))
    now = 200.0
    core.on_datagram(b"t\n" + format_pad(64), SOURCE, now)
    (datagram, _), *_ = core.datagrams_to_send()
    (cookie,) = list(parse_datagram(datagram))
    assert isinstance(cookie, Cookie) and cookie.difficulty == difficulty
    proofs = exact_proofs(cookie.cookie, difficulty)
    core.on_datagram(format_confirm(cookie.cookie, proofs[difficulty - 1]) + b"t\n", SOURCE, now)
    core.datagrams_to_send()
    assert core.subscription_count == 0
    assert core.counters.insufficient_work == 1
    core.on_datagram(format_confirm(cookie.cookie, proofs[difficulty]) + b"t\n", SOURCE, now)
    assert core.subscribers(b"t") == [SOURCE]
    assert core.counters.insufficient_work == 1
