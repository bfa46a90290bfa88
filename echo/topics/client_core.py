"""The topics client's pure core (pub/sub note): which servers a topic has, subscriptions
kept alive by refreshing, publishes sent as copies and resent, deduplication by message id,
the servers' cookies answered (with proof of work if asked). No trio, no sockets, no clock:
``now`` is passed in; the trio driver is `echo.topics.client`.
"""

from __future__ import annotations

import heapq
import hmac
import random
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from echo.topics.codec import (
    MALFORMED_REASONS,
    CodecError,
    Confirm,
    Cookie,
    Life,
    Malformed,
    Pad,
    Publish,
    Subscribe,
    decode,
    encode,
    format_confirm,
    format_cookie,
    format_pad,
    format_publish,
    new_message_id,
    pack,
    parse_datagram,
)
from echo.topics.ring import HashRing, choose_random

Address = tuple[str, int]

#: The largest ``!cookie`` line a server sends (20-digit epoch, 3-digit difficulty): an
#: unconfirmed request is padded to at least this size, or the server would not answer it.
COOKIE_REPLY_SIZE = len(format_cookie(b"9" * 20 + b"." + b"f" * 24, 999))


def parse_servers(text: str) -> list[str]:
    """``host:port,host:port`` as a list; raises ValueError naming the first bad entry."""
    servers = [part.strip() for part in text.split(",") if part.strip()]
    for server in servers:
        split_server(server)
    if len(set(servers)) != len(servers):
        raise ValueError("a server is listed twice")
    return servers



def split_server(server: str) -> tuple[str, int]:
    host, sep, port_text = server.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"{server!r} is not host:port")
    return host, int(port_text)


@attrs.frozen
class ClientConfig:
    """How a client uses its servers.

    ``k`` servers per topic by CH; ``publish_k_prime`` / ``subscribe_k_prime`` turn on RCH for
    that side (K' random of the K). ``lifetime`` is N until a server confirms its own;
    ``refresh_factor`` is M: refresh every N/M. ``copies`` sends of each publish,
    ``resend_interval`` apart.
    """

    k: int = 3
    publish_k_prime: int | None = None
    subscribe_k_prime: int | None = None
    lifetime: float = 30.0
    refresh_factor: float = 3.0
    copies: int = 2
    resend_interval: float = 0.05
    #: An unanswered unconfirmed request is sent again after this long (doubling, capped at N/M).
    handshake_retry: float = 0.5
    max_datagram: int = 1400
    dedup_window: float = 300.0
    dedup_max: int = 100_000
    points_per_server: int = 1000

    def __attrs_post_init__(self) -> None:
        if self.k < 1:
            raise ValueError("k must be at least 1")
        for name in ("publish_k_prime", "subscribe_k_prime"):
            value = getattr(self, name)
            if value is not None and not 1 <= value <= self.k:
                raise ValueError(f"{name} must be within 1..k ({self.k})")
        if self.publish_k_prime is not None and self.subscribe_k_prime is not None:
            raise ValueError(
                "RCH picks K' of K on one side only: publishing to K' and subscribing to K' "
                "would rarely meet"
            )
        if not self.lifetime > 0 or not self.refresh_factor >= 1:
            raise ValueError("lifetime must be positive and refresh_factor at least 1")
        if self.copies < 1 or self.resend_interval < 0:
            raise ValueError("copies must be at least 1 and resend_interval not negative")
        if not 64 <= self.max_datagram <= 65507:
            raise ValueError("max_datagram must be within 64..65507 bytes")


@attrs.frozen
class Message:
    """A message received once (after deduplication): raw topic and message bytes."""

    topic: bytes
    data: bytes
    message_id: bytes | None
    server: str


@attrs.define
class ClientCounters:
    datagrams_sent: int = 0
    bytes_sent: int = 0
    datagrams_received: int = 0
    bytes_received: int = 0
    from_unknown: int = 0
    messages_received: int = 0
    duplicates: int = 0
    not_subscribed: int = 0
    publishes_sent: int = 0
    refreshes_sent: int = 0
    cookies_received: int = 0
    confirmations_received: int = 0
    works_solved: int = 0
    malformed: dict[str, int] = attrs.field(factory=lambda: dict.fromkeys(MALFORMED_REASONS, 0))

    def snapshot(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.define
class _ServerState:
    name: str
    cookie: bytes | None = None
    difficulty: int = 0
    work: bytes | None = None  # None while the work for ``cookie`` is still to be done
    #: lifetime the server confirmed last (None: assume the config's N)
    life: float | None = None
    last_confirmed: float = float("-inf")
    topics: dict[bytes, float] = attrs.Factory(dict)  # encoded topic -> first confirmed send
    next_refresh: float = float("inf")
    retry: float = 0.0


class ClientCore:
    """Subscriptions, publishes, handshakes and deduplication; no sockets, no clock.

    Feed it ``on_datagram(data, server, now)`` and ``on_timer(now)``; send what
    ``datagrams_to_send()`` returns (server name, datagram); do the proofs of work that
    ``work_wanted()`` lists and hand them back with ``on_work``.
    """

    def __init__(
        self,
        servers: Sequence[str],
        config: ClientConfig | None = None,
        *,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config or ClientConfig()
        self.ring = HashRing(list(servers), self.config.points_per_server)
        self.rng = rng or random.SystemRandom()
        self.counters = ClientCounters()
        self.servers: dict[str, _ServerState] = {name: _ServerState(name) for name in servers}
        #: encoded topic -> the servers it is subscribed at
        self.subscriptions: dict[bytes, list[str]] = {}
        self.received: list[Message] = []
        self._out: list[tuple[str, bytes]] = []  # packed datagrams
        self._lines: list[tuple[str, bytes]] = []  # publish lines, packed when sent
        self._resends: list[tuple[float, int, str, bytes]] = []
        self._sequence = 0
        self._seen: OrderedDict[tuple[bytes, bytes], float] = OrderedDict()

    # ---------------------------------------------------------------------------------------
    # Choosing servers

    def servers_for(self, topic: bytes, k_prime: int | None = None) -> list[str]:
        """The servers of an encoded topic: its K by CH, or a random K' of them."""
        chosen = self.ring.servers_for(topic.decode("ascii"), self.config.k)
        if k_prime is not None:
            chosen = choose_random(chosen, k_prime, self.rng)
        return chosen

    # ---------------------------------------------------------------------------------------
    # Commands

    def subscribe(self, topics: Iterable[bytes], now: float) -> None:
        """Subscribe to raw ``topics`` (CodecError for one that cannot be a topic)."""
        touched: set[str] = set()
        for topic in topics:
            encoded = encode(topic)
            if not encoded or len(encoded) > 255:
                raise CodecError("a topic is 1-255 bytes once %-encoded")
            if encoded in self.subscriptions:
                continue
            chosen = self.servers_for(encoded, self.config.subscribe_k_prime)
            self.subscriptions[encoded] = chosen
            for name in chosen:
                self.servers[name].topics[encoded] = float("inf")
                touched.add(name)
        for name in touched:
            self._refresh(self.servers[name], now)

    def unsubscribe(self, topics: Iterable[bytes]) -> None:
        """Stop refreshing (the note: the server forgets it N seconds later)."""
        for topic in topics:
            encoded = encode(topic)
            for name in self.subscriptions.pop(encoded, []):
                self.servers[name].topics.pop(encoded, None)

    def publish(self, topic: bytes, message: bytes, now: float) -> bytes:
        """Publish ``message`` on ``topic`` (raw bytes); returns its message id.

        CodecError if the line cannot fit one datagram.
        """
        message_id = new_message_id()
        line = format_publish(topic, message, message_id)
        if len(line) > self.config.max_datagram:
            raise CodecError(
                f"a publish line of {len(line)} bytes does not fit the "
                f"{self.config.max_datagram}-byte datagrams; shorten the message"
            )
        encoded = line.split(b" ", 1)[0]
        servers = self.servers_for(encoded, self.config.publish_k_prime)
        for name in servers:
            self._lines.append((name, line))
            for copy in range(1, self.config.copies):
                self._sequence += 1
                when = now + copy * self.config.resend_interval
                heapq.heappush(self._resends, (when, self._sequence, name, line))
        self.counters.publishes_sent += len(servers) * self.config.copies
        return message_id

    # ---------------------------------------------------------------------------------------
    # Queries

    def confirmed_servers(self, topic: bytes) -> list[str]:
        """The servers that confirmed a subscription to raw ``topic``."""
        encoded = encode(topic)
        out = []
        for name in self.subscriptions.get(encoded, []):
            state = self.servers[name]
            if state.last_confirmed >= state.topics.get(encoded, float("inf")):
                out.append(name)
        return out

    def work_wanted(self) -> list[tuple[str, bytes, int]]:
        """(server, cookie, difficulty) for every cookie whose proof of work is still due."""
        return [
            (s.name, s.cookie, s.difficulty)
            for s in self.servers.values()
            if s.cookie is not None and s.work is None
        ]

    @property
    def pending_resends(self) -> int:
        return len(self._resends)

    def next_deadline(self) -> float:
        deadline = min((s.next_refresh for s in self.servers.values()), default=float("inf"))
        if self._resends:
            deadline = min(deadline, self._resends[0][0])
        return deadline

    # ---------------------------------------------------------------------------------------
    # Events

    def on_work(self, server: str, cookie: bytes, work: bytes, now: float) -> None:
        state = self.servers[server]
        # Cookies are compared in constant time everywhere (docs/security.md), here too.
        if state.cookie is None or not hmac.compare_digest(state.cookie, cookie):
            return  # a newer cookie came meanwhile
        state.work = work
        self.counters.works_solved += 1
        if state.topics:
            self._refresh(state, now)

    def on_timer(self, now: float) -> None:
        resends = self._resends
        while resends and resends[0][0] <= now:
            _, _, name, line = heapq.heappop(resends)
            self._lines.append((name, line))
        for state in self.servers.values():
            if state.next_refresh <= now:
                self._refresh(state, now)

    def on_datagram(self, data: bytes, server: str | None, now: float) -> None:
        """A datagram from ``server`` (None: from an address not in our list). Never raises."""
        counters = self.counters
        counters.datagrams_received += 1
        counters.bytes_received += len(data)
        if server is None or server not in self.servers:
            counters.from_unknown += 1
            return
        state = self.servers[server]
        cookie: Cookie | None = None
        confirmed = False
        for line in parse_datagram(data):
            kind = type(line)
            if kind is Publish:
                assert isinstance(line, Publish)
                self._deliver(line, server, now)
            elif kind is Cookie:
                assert isinstance(line, Cookie)
                counters.cookies_received += 1
                cookie = line
            elif kind is Life:
                assert isinstance(line, Life)
                counters.confirmations_received += 1
                state.life = line.seconds
                state.last_confirmed = now
                state.retry = 0.0
                # A full FIFO table may promise (almost) nothing; refreshing faster than once
                # a second would not keep up with it either, only flood it.
                interval = max(1.0, line.seconds)
                state.next_refresh = now + interval / self.config.refresh_factor
                confirmed = True
            elif kind is Malformed:
                assert isinstance(line, Malformed)
                counters.malformed[line.reason] += 1
            else:
                assert isinstance(line, Subscribe | Confirm | Pad)
                counters.malformed["unknown_control"] += 1
        if cookie is not None:
            self._on_cookie(state, cookie, now, handover=confirmed)

    def _on_cookie(self, state: _ServerState, line: Cookie, now: float, *, handover: bool) -> None:
        if state.cookie is not None and hmac.compare_digest(line.cookie, state.cookie):
            return
        state.cookie = line.cookie
        state.difficulty = line.difficulty
        state.work = b"" if line.difficulty <= 0 else None
        # A cookie alone answers a request the server did not accept (our first, or one with
        # a cookie it no longer knows: it restarted): confirm at once. One handed over with a
        # confirmation (the old one is in its last epoch) is used from the next refresh.
        if not handover and state.work is not None and state.topics:
            self._refresh(state, now)

    def _deliver(self, line: Publish, server: str, now: float) -> None:
        counters = self.counters
        if line.topic not in self.subscriptions:
            counters.not_subscribed += 1
            return
        if line.message_id is not None:
            key = (line.topic, line.message_id)
            seen = self._seen
            if key in seen:
                counters.duplicates += 1
                return
            seen[key] = now
            horizon = now - self.config.dedup_window
            while seen and (
                len(seen) > self.config.dedup_max or next(iter(seen.values())) < horizon
            ):
                seen.popitem(last=False)
        try:
            topic, data = decode(line.topic), decode(line.message)
        except CodecError:  # pragma: no cover - parse_line checked both
            counters.malformed["bad_message"] += 1
            return
        counters.messages_received += 1
        self.received.append(Message(topic, data, line.message_id, server))

    def _refresh(self, state: _ServerState, now: float) -> None:
        """Send ``state``'s topics to it, confirmed if we can, and plan the next refresh."""
        if not state.topics:
            state.next_refresh = float("inf")
            return
        config = self.config
        topics = list(state.topics)
        lines = [topic + b"\n" for topic in topics]
        if state.cookie is not None and state.work is not None:
            head = format_confirm(state.cookie, state.work)
            for topic in topics:
                if state.topics[topic] == float("inf"):
                    state.topics[topic] = now
            interval = (state.life or config.lifetime) / config.refresh_factor
            # Until the server confirms, retry as for an unanswered handshake.
            state.retry = config.handshake_retry if not state.retry else state.retry * 2
            state.next_refresh = now + min(interval, state.retry)
        elif state.cookie is not None:
            return  # the proof of work is being done; on_work refreshes
        else:
            head = b""
            state.retry = config.handshake_retry if not state.retry else state.retry * 2
            state.next_refresh = now + min(state.retry, config.lifetime / config.refresh_factor)
        room = config.max_datagram - len(head)
        for body in pack(lines, room):
            datagram = head + body
            if len(datagram) < COOKIE_REPLY_SIZE:
                # Pad the request to the cookie's size: the server never answers a source it
                # has not confirmed (a first request, or a stale cookie) with more than it sent.
                datagram += format_pad(COOKIE_REPLY_SIZE - len(datagram))
            self._out.append((state.name, datagram))
        self.counters.refreshes_sent += 1

    def datagrams_to_send(self) -> list[tuple[str, bytes]]:
        """Datagrams for servers; publish lines to one server packed together."""
        out = self._out
        lines: dict[str, list[bytes]] = {}
        for name, line in self._lines:
            lines.setdefault(name, []).append(line)
        for name, queued in lines.items():
            out.extend((name, datagram) for datagram in pack(queued, self.config.max_datagram))
        self._out = []
        self._lines = []
        self.counters.datagrams_sent += len(out)
        self.counters.bytes_sent += sum(len(d) for _, d in out)
        return out

