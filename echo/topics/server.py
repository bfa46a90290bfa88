"""The topics server core (the pub/sub note): soft-state subscriptions, forwarding, handshake. Pure.

No sockets, no clock: the driver calls ``on_datagram(data, source, now)`` for each datagram
received, ``on_timer(now)`` at ``next_deadline()``, and sends what ``datagrams_to_send()``
returns. Every malformed line, refused request and drop is a counter, never an exception.

Forgery and amplification (the note's three fixes):

1. A subscribe is accepted only with a ``!confirm`` line carrying the cookie the server gave
   that source address. The cookie is a keyed MAC of (epoch, address), so the server keeps no
   state for unconfirmed sources. To an unconfirmed request the server answers one datagram
   ``!cookie C D`` and only if it is no larger than the request: a forged subscription in a
   victim's name gets the victim at most one datagram no larger than the forgery.
2. With ``work_difficulty`` D > 0 the confirm must also carry W with SHA-256(C ' ' W) starting
   with D zero bits: about 2**D hashes per address and cookie epoch.
3. Nothing else is ever sent to a source that has not confirmed: a publish gets no answer, a
   malformed line none. Per-source rate limits bound what any one address costs the server.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from typing import Any

import attrs

from echo.topics.codec import (
    MALFORMED_REASONS,
    Confirm,
    Cookie,
    Life,
    Malformed,
    Pad,
    Publish,
    Subscribe,
    check_work,
    format_cookie,
    format_life,
    make_cookie,
    parse_line,
    verify_cookie,
)

__all__ = ["Counters", "ServerConfig", "TopicServerCore"]

Address = tuple[str, int]


@attrs.frozen
class ServerConfig:
    """Everything a topics server decides, declared once.

    ``lifetime`` is the note's N: a subscription lasts N seconds after its last refresh.
    ``table_size`` > 0 turns on the note's variant: a fixed-size FIFO subscriber table that
    evicts the oldest subscription when full, and tells clients in every confirmation how long
    a subscription made now is expected to survive (at most N).
    """

    lifetime: float = 30.0
    table_size: int = 0
    #: Without a FIFO table, the most subscriptions held at once (memory bound); more are refused.
    max_subscriptions: int = 1_000_000
    work_difficulty: int = 0
    #: A cookie is valid in its epoch and the next: between this and twice this many seconds.
    cookie_period: float = 60.0
    max_datagram: int = 1400
    #: Datagrams per second and burst per source address; 0 turns rate limiting off.
    rate_limit: float = 2000.0
    rate_burst: float = 4000.0
    #: Source addresses tracked by the rate limiter (least recently seen forgotten first).
    max_sources: int = 65536

    def __attrs_post_init__(self) -> None:
        if not self.lifetime > 0:
            raise ValueError("lifetime (N) must be positive")
        if self.table_size < 0:
            raise ValueError("table_size must be 0 (off) or positive")
        if self.max_subscriptions < 1:
            raise ValueError("max_subscriptions must be positive")
        if not 0 <= self.work_difficulty <= 40:
            raise ValueError("work_difficulty must be within 0..40 bits")
        if not self.cookie_period > 0:
            raise ValueError("cookie_period must be positive")
        if not 64 <= self.max_datagram <= 65507:
            raise ValueError("max_datagram must be within 64..65507 bytes")
        if self.rate_limit < 0 or self.rate_burst < 1:
            raise ValueError("rate_limit must be >= 0 and rate_burst >= 1")
        if self.max_sources < 1:
            raise ValueError("max_sources must be positive")


@attrs.define
class Counters:
    datagrams_received: int = 0
    bytes_received: int = 0
    lines_received: int = 0
    datagrams_sent: int = 0
    bytes_sent: int = 0
    rate_limited: int = 0
    subscribes: int = 0
    subscriptions_added: int = 0
    subscriptions_refreshed: int = 0
    subscriptions_expired: int = 0
    subscriptions_evicted: int = 0
    subscriptions_refused: int = 0
    unconfirmed_subscribes: int = 0
    cookies_sent: int = 0
    cookies_withheld: int = 0
    bad_cookies: int = 0
    insufficient_work: int = 0
    confirms_without_subscribe: int = 0
    publishes: int = 0
    publishes_too_large: int = 0
    deliveries: int = 0
    #: What sources without a valid cookie sent, and what the server sent them: the
    #: amplification factor is the second over the first (the note: must not exceed 1).
    unconfirmed_bytes_received: int = 0
    unconfirmed_bytes_sent: int = 0
    malformed: dict[str, int] = attrs.field(factory=lambda: dict.fromkeys(MALFORMED_REASONS, 0))

    @property
    def malformed_lines(self) -> int:
        return sum(self.malformed.values())

    @property
    def amplification(self) -> float:
        if not self.unconfirmed_bytes_received:
            return 0.0
        return self.unconfirmed_bytes_sent / self.unconfirmed_bytes_received

    def snapshot(self) -> dict[str, Any]:
        out = attrs.asdict(self)
        out["malformed_lines"] = self.malformed_lines
        out["amplification"] = round(self.amplification, 4)
        return out


class _Bucket:
    __slots__ = ("stamp", "tokens")

    def __init__(self, tokens: float, stamp: float) -> None:
        self.tokens = tokens
        self.stamp = stamp


class TopicServerCore:
    """One topics server's state. ``events`` collects (name, fields) for the driver to log."""

    def __init__(self, config: ServerConfig | None = None, *, secret: bytes | None = None) -> None:
        self.config = config or ServerConfig()
        self.secret = secret if secret is not None else secrets.token_bytes(32)
        self.counters = Counters()
        #: topic -> subscribers, and (topic, subscriber) -> last refresh, oldest first: expiry
        #: and FIFO eviction both pop from the front, so each costs O(1).
        self.topics: dict[bytes, dict[Address, None]] = {}
        self.order: OrderedDict[tuple[bytes, Address], float] = OrderedDict()
        self.events: list[tuple[str, dict[str, Any]]] = []
        self._out: list[tuple[bytes, Address]] = []
        #: what is queued for each subscriber: lines packed into one datagram as they come
        self._pending: dict[Address, bytes] = {}
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()

    # ---------------------------------------------------------------------------------------
    # Queries

    @property
    def subscription_count(self) -> int:
        return len(self.order)

    def subscribers(self, topic: bytes) -> list[Address]:
        """Current subscribers of the encoded ``topic``."""
        return list(self.topics.get(topic, ()))

    def lifetime_estimate(self, now: float) -> float:
        """How long a subscription made now is expected to last.

        N, unless the FIFO table is full: then a new entry lives until as many newer ones have
        pushed it out as there are entries, and the oldest entry's age is how long that took
        for the entry now at the front. Clients refresh every estimate / M (the note: "this
        holds N/M constant for a fixed number of clients, and shrinks N as the number of
        clients grows").
        """
        n = self.config.lifetime
        if not self.config.table_size or len(self.order) < self.config.table_size:
            return n
        oldest = next(iter(self.order.values()))
        return max(0.0, min(n, now - oldest))

    @property
    def queued(self) -> int:
        """Datagrams waiting for ``datagrams_to_send`` (at least; lines may pack further)."""
        return len(self._out) + len(self._pending)

    def next_deadline(self) -> float:
        """When the oldest subscription lapses (inf when there is none)."""
        if not self.order:
            return float("inf")
        return next(iter(self.order.values())) + self.config.lifetime

    # ---------------------------------------------------------------------------------------
    # Input

    def on_timer(self, now: float) -> None:
        self._expire(now)

    def _expire(self, now: float) -> None:
        order = self.order
        if not order:
            return
        horizon = now - self.config.lifetime
        while order:
            key, stamp = next(iter(order.items()))
            if stamp > horizon:
                break
            order.popitem(last=False)
            self._drop(key)
            self.counters.subscriptions_expired += 1
            self.events.append(("subscription_expired", _fields(key)))

    def _drop(self, key: tuple[bytes, Address]) -> None:
        topic, address = key
        subscribers = self.topics.get(topic)
        if subscribers is not None:
            subscribers.pop(address, None)
            if not subscribers:
                del self.topics[topic]

    def _allow(self, host: str, now: float) -> bool:
        rate = self.config.rate_limit
        if not rate:
            return True
        buckets = self._buckets
        bucket = buckets.get(host)
        if bucket is None:
            if len(buckets) >= self.config.max_sources:
                buckets.popitem(last=False)
            bucket = buckets[host] = _Bucket(self.config.rate_burst, now)
        else:
            buckets.move_to_end(host)
            bucket.tokens = min(self.config.rate_burst, bucket.tokens + (now - bucket.stamp) * rate)
            bucket.stamp = now
        if bucket.tokens < 1:
            return False
        bucket.tokens -= 1
        return True

    def on_datagram(self, data: bytes, source: Address, now: float) -> None:
        """Handle one received datagram (untrusted bytes; never raises)."""
        counters = self.counters
        counters.datagrams_received += 1
        size = len(data)
        counters.bytes_received += size
        host, port = source[0], source[1]
        if not self._allow(host, now):
            counters.rate_limited += 1
            return
        self._expire(now)
        confirm, subscribes = self._read_lines(data)
        confirmed = confirm is not None and self._confirmed(confirm, host, port, now)
        if not confirmed:
            counters.unconfirmed_bytes_received += size
        if confirm is not None and not subscribes:
            counters.confirms_without_subscribe += 1
        if not subscribes:
            return
        counters.subscribes += len(subscribes)
        if not confirmed:
            counters.unconfirmed_subscribes += len(subscribes)
            self._send_cookie(host, port, size, now)
            return
        assert confirm is not None
        self._subscribe_confirmed(subscribes, confirm, host, port, now)

    def _read_lines(self, data: bytes) -> tuple[Confirm | None, list[bytes]]:
        """Publish what the datagram publishes; its confirm line and the topics it subscribes
        to (counting what is malformed)."""
        counters = self.counters
        confirm: Confirm | None = None
        subscribes: list[bytes] = []
        lines = bytes(data).split(b"\n")
        last = lines.pop()
        if last:
            counters.malformed["unterminated"] += 1
        counters.lines_received += len(lines)
        for raw in lines:
            parsed = parse_line(raw)
            if type(parsed) is Publish:
                self._publish(parsed)
            elif type(parsed) is Subscribe:
                subscribes.append(parsed.topic)
            elif type(parsed) is Confirm:
                confirm = parsed
            elif type(parsed) is Pad:
                pass
            elif type(parsed) is Malformed:
                counters.malformed[parsed.reason] += 1
            else:
                # Cookie and life lines go from servers to clients, never the other way.
                assert isinstance(parsed, Cookie | Life)
                counters.malformed["unknown_control"] += 1
        return confirm, subscribes

    def _send_cookie(self, host: str, port: int, size: int, now: float) -> None:
        """Answer an unconfirmed subscribe with a cookie, unless the answer would be larger
        than the request."""
        counters = self.counters
        cookie = make_cookie(self.secret, self._epoch(now), host, port)
        reply = format_cookie(cookie, self.config.work_difficulty)
        if len(reply) > size:
            # Answering would amplify: an honest client pads its first request (the note's
            # third fix: "request packets should be no smaller ... than their responses").
            counters.cookies_withheld += 1
            return
        counters.cookies_sent += 1
        counters.unconfirmed_bytes_sent += len(reply)
        self._send(reply, (host, port))

    def _subscribe_confirmed(
        self, subscribes: list[bytes], confirm: Confirm, host: str, port: int, now: float
    ) -> None:
        """Keep the confirmed subscriptions; answer with the lifetime (and the next cookie)."""
        address = (host, port)
        for topic in subscribes:
            self._subscribe(topic, address, now)
        reply = format_life(self.lifetime_estimate(now))
        epoch = self._epoch(now)
        if not confirm.cookie.startswith(b"%d." % epoch):
            # The cookie is in its last epoch: hand over the next one before it lapses, so a
            # refreshing client never has a subscribe refused.
            reply += format_cookie(
                make_cookie(self.secret, epoch, host, port), self.config.work_difficulty
            )
        self._send(reply, address)

    def _epoch(self, now: float) -> int:
        return max(0, int(now // self.config.cookie_period))

    def _confirmed(self, confirm: Confirm, host: str, port: int, now: float) -> bool:
        epoch = self._epoch(now)
        if verify_cookie(self.secret, confirm.cookie, (epoch, epoch - 1), host, port) < 0:
            self.counters.bad_cookies += 1
            return False
        if not check_work(confirm.cookie, confirm.work, self.config.work_difficulty):
            self.counters.insufficient_work += 1
            return False
        return True

    def _subscribe(self, topic: bytes, address: Address, now: float) -> None:
        key = (topic, address)
        order = self.order
        if key in order:
            order.move_to_end(key)
            order[key] = now
            self.counters.subscriptions_refreshed += 1
            return
        table_size = self.config.table_size
        if table_size:
            while len(order) >= table_size:
                evicted, _ = order.popitem(last=False)
                self._drop(evicted)
                self.counters.subscriptions_evicted += 1
                self.events.append(("subscription_evicted", _fields(evicted)))
        elif len(order) >= self.config.max_subscriptions:
            self.counters.subscriptions_refused += 1
            return
        order[key] = now
        self.topics.setdefault(topic, {})[address] = None
        self.counters.subscriptions_added += 1
        self.events.append(("subscription_added", _fields(key)))

    def _publish(self, publish: Publish) -> None:
        counters = self.counters
        counters.publishes += 1
        subscribers = self.topics.get(publish.topic)
        if not subscribers:
            return
        line = publish.line
        size = len(line)
        max_size = self.config.max_datagram
        if size > max_size:
            counters.publishes_too_large += 1
            return
        pending = self._pending
        queued_for = pending.get
        out = self._out
        counters.deliveries += len(subscribers)
        # The hot loop of a fan-out (once per subscriber per publish): no allocation when a
        # subscriber has nothing queued, which is the usual case.
        for address in subscribers:
            queued = queued_for(address)
            if queued is None:
                pending[address] = line
            elif len(queued) + size > max_size:
                out.append((queued, address))
                pending[address] = line
            else:
                pending[address] = queued + line

    def _send(self, datagram: bytes, address: Address) -> None:
        self._out.append((datagram, address))

    # ---------------------------------------------------------------------------------------
    # Output

    def datagrams_to_send(self) -> list[tuple[bytes, Address]]:
        """Everything to send now, lines for one address packed into as few datagrams as fit."""
        out = self._out
        pending = self._pending
        counters = self.counters
        if out:
            counters.bytes_sent += sum([len(datagram) for datagram, _ in out])
        if pending:
            # zip and map run in C: this is once per subscriber per fan-out.
            counters.bytes_sent += sum(map(len, pending.values()))
            out.extend(zip(pending.values(), pending.keys(), strict=True))
            pending.clear()
        self._out = []
        counters.datagrams_sent += len(out)
        return out


def _fields(key: tuple[bytes, Address]) -> dict[str, Any]:
    topic, (host, port) = key
    return {"topic": topic.decode("ascii"), "source_ip": host, "source_port": port}
