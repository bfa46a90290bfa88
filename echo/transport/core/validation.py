"""Address validation for dynamic MDC: stateless cookies and per-source rate limits. Pure.

Dynamic MDC is a reflection vector in Aeron (its SendChannelEndpoint): one spoofed 36-byte SM sent
to a control port makes the publication stream data, SETUPs and heartbeats to the forged address for
5 s. echo closes it the way DTLS (HelloVerifyRequest) and QUIC (Retry) do: an SM from an address
that is not yet a destination is answered with one *cookie challenge*, no larger than the SM,
and only a registration SM that echoes the cookie adds the address. The cookie is a keyed hash
of the address, the receiver id and the time, so the publisher keeps no state per stranger.

On the wire (valid Aeron frames, docs/security.md): the challenge is an SM from the publisher to
the receiver with flags COOKIE (0x20), session 0, stream 0, the cookie in the consumption
term-id/offset fields and the receiver's id; the receiver's registration SM (session 0, stream
0, SETUP flag) carries the cookie in the same two fields, which plain Aeron leaves zero.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct

from echo.transport.core.destinations import Address
from echo.transport.core.frames import (
    DATA_HEADER_LENGTH,
    FRAME_ALIGNMENT,
    MAX_UDP_PAYLOAD_LENGTH,
    Setup,
)
from echo.transport.core.logbuffer import check_term_length, compute_max_message_length, i32

SM_COOKIE_FLAG = 0x20
COOKIE_EPOCH = 60.0  # seconds; a cookie is good for its epoch and the next one

_PAIR = struct.Struct("<ii")


class CookieJar:
    """Makes and checks cookies with a per-transport secret."""

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret or os.urandom(32)

    def make(
        self, address: Address, receiver_id: int, now: float, *, epoch_offset: int = 0
    ) -> tuple[int, int]:
        epoch = int(now // COOKIE_EPOCH) - epoch_offset
        text = f"{address[0]}|{address[1]}|{receiver_id}|{epoch}".encode()
        digest = hashlib.blake2b(text, key=self._secret, digest_size=8).digest()
        first, second = _PAIR.unpack(digest)
        if first == 0 and second == 0:  # zeros mean "no cookie" on the wire
            second = 1
        return first, second

    def check(
        self, address: Address, receiver_id: int, cookie: tuple[int, int], now: float
    ) -> bool:
        if cookie == (0, 0):
            return False
        # In constant time: how far a forged cookie matched must not show in the reply's delay.
        try:
            given = _PAIR.pack(*cookie)
        except struct.error:
            return False  # not two int32s: no cookie this jar made
        current = _PAIR.pack(*self.make(address, receiver_id, now))
        previous = _PAIR.pack(*self.make(address, receiver_id, now, epoch_offset=1))
        # Both compared, always: which epoch matched must not show either.
        return hmac.compare_digest(given, current) | hmac.compare_digest(given, previous)


class RateLimiter:
    """A token bucket per source host, bounded in memory (the table is reset when full).

    Used for every reply made to traffic from an address that has not been validated, so that a
    flood of forged requests cannot turn into a flood of replies to a victim.
    """

    def __init__(self, rate: float = 20.0, burst: float = 40.0, max_sources: int = 8192) -> None:
        self.rate = rate
        self.burst = burst
        self.max_sources = max_sources
        self._buckets: dict[str, tuple[float, float]] = {}

    def allow(self, host: str, now: float) -> bool:
        tokens, last = self._buckets.get(host, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        if tokens < 1.0:
            self._buckets[host] = (tokens, now)
            return False
        if len(self._buckets) >= self.max_sources and host not in self._buckets:
            self._buckets.clear()
        self._buckets[host] = (tokens - 1.0, now)
        return True


def setup_problem(frame: Setup, max_term_length: int) -> str | None:
    """Why a SETUP from the network cannot make an image (the counter's reason), or None if it
    can; `max_term_length` is the subscription's bound on a term."""
    try:
        check_term_length(frame.term_length)
    except ValueError:
        return "bad_setup_term_length"
    if frame.term_length > max_term_length:
        return "setup_term_too_long"
    mtu = frame.mtu
    if (
        mtu <= DATA_HEADER_LENGTH
        or mtu % FRAME_ALIGNMENT
        or mtu > MAX_UDP_PAYLOAD_LENGTH
        or mtu > compute_max_message_length(frame.term_length)
    ):
        return "bad_setup_mtu"
    if (
        frame.term_offset < 0
        or frame.term_offset % FRAME_ALIGNMENT
        or frame.term_offset >= frame.term_length
    ):
        return "bad_setup_offset"
    if i32(frame.active_term_id - frame.initial_term_id) < 0:
        return "bad_setup_term_id"
    return None
