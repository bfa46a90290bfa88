"""The topics client: smart clients for dumb servers (pub/sub note). Pure core, then a trio driver.

What a server does not do, the client does:

- it picks a topic's servers from its own server list by consistent hashing (CH: the K
  servers next to the topic on the ring) or random consistent hashing (RCH: a random K' of
  those K, for publishing or for subscribing, never both);
- it stays subscribed by refreshing every N/M seconds, N being the lifetime the server
  confirmed (``!life``) and M the reliability factor;
- it makes a publish more likely to arrive by sending it ``copies`` times;
- it deduplicates what arrives from several servers, and the copies, by message id;
- it answers the server's cookie, with proof of work if asked.

Clients whose server lists differ still meet as long as one of the publisher's servers for a
topic is one of the subscriber's (the note: "As long as one of your K matches one of my K, your
message will reach me").
"""

from __future__ import annotations

import contextlib
import heapq
import hmac
import random
import socket
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

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
    solve_work,
)
from echo.topics.ring import HashRing, choose_random

__all__ = [
    "ClientConfig",
    "ClientCore",
    "Message",
    "TopicClient",
    "open_topic_client",
    "parse_servers",
    "read_servers_file",
]

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


def read_servers_file(path: str | Path) -> list[str]:
    """One ``host:port`` a line; blank lines and ``#`` comments ignored. OSError/ValueError."""
    servers: list[str] = []
    for line in Path(path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            servers.extend(parse_servers(line))
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


# --------------------------------------------------------------------------------------------
# The trio driver


class TopicClient:
    """A client on one UDP socket. Use ``open_topic_client``; every method is trio-safe."""

    def __init__(self, core: ClientCore, sock: socket.socket, addresses: dict[str, Address]):
        self.core = core
        self._sock = sock
        self._addresses = addresses
        self._names = {address: name for name, address in addresses.items()}
        self._scope: trio.CancelScope | None = None
        self._changed = trio.Condition()
        self._send_channel, self._receive_channel = trio.open_memory_channel[Message](10_000)
        self.dropped = 0  # messages the application did not take in time (queue full)
        self.send_errors = 0

    @property
    def counters(self) -> dict[str, Any]:
        out = self.core.counters.snapshot()
        out["queue_dropped"] = self.dropped
        out["send_errors"] = self.send_errors
        return out

    def subscribe(self, *topics: str | bytes) -> None:
        self.core.subscribe([_raw(t) for t in topics], trio.current_time())
        self._flush()

    def unsubscribe(self, *topics: str | bytes) -> None:
        self.core.unsubscribe([_raw(t) for t in topics])

    def publish(self, topic: str | bytes, message: str | bytes) -> bytes:
        """Send a message to the topic's servers (then ``copies - 1`` resends); its id."""
        message_id = self.core.publish(_raw(topic), _raw(message), trio.current_time())
        self._flush()
        return message_id

    async def receive(self) -> Message:
        return await self._receive_channel.receive()

    async def messages(self) -> AsyncIterator[Message]:
        async for message in self._receive_channel:
            yield message

    def _subscribed(self, topic: str | bytes, servers: int | None) -> bool:
        chosen = self.core.subscriptions.get(encode(_raw(topic)), [])
        want = len(chosen) if servers is None else min(servers, len(chosen))
        return len(self.core.confirmed_servers(_raw(topic))) >= want

    async def wait_subscribed(self, *topics: str | bytes, servers: int | None = None) -> None:
        """Until each of ``topics`` is confirmed by ``servers`` of its servers (default all)."""
        async with self._changed:
            while not all(self._subscribed(topic, servers) for topic in topics):
                await self._changed.wait()

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Until ``predicate()`` (about this client's state) holds; checked whenever datagrams
        have been handled."""
        async with self._changed:
            while not predicate():
                await self._changed.wait()

    async def wait_sent(self) -> None:
        """Until every scheduled resend of every publish has gone out."""
        async with self._changed:
            while self.core.pending_resends:
                await self._changed.wait()

    def _flush(self) -> None:
        sendto = self._sock.sendto
        for name, datagram in self.core.datagrams_to_send():
            try:
                sendto(datagram, self._addresses[name])
            except OSError:
                # A full buffer or an unreachable server: lost as UDP may lose it; the
                # resends and refreshes are the reliability (the pub/sub note).
                self.send_errors += 1
        if self._scope is not None:
            # A new subscribe or publish may need the loop awake before it planned to be.
            self._scope.deadline = min(self._scope.deadline, self.core.next_deadline())

    async def _run_work(self, nursery: trio.Nursery, busy: set[tuple[str, bytes]]) -> None:
        for name, cookie, difficulty in self.core.work_wanted():
            if (name, cookie) in busy:
                continue
            busy.add((name, cookie))

            async def solve(name: str = name, cookie: bytes = cookie, d: int = difficulty) -> None:
                work = await trio.to_thread.run_sync(solve_work, cookie, d)
                busy.discard((name, cookie))
                self.core.on_work(name, cookie, work, trio.current_time())
                self._flush()

            nursery.start_soon(solve)

    async def _loop(self, nursery: trio.Nursery) -> None:
        core = self.core
        sock = self._sock
        buffer = bytearray(65536)
        busy: set[tuple[str, bytes]] = set()
        while True:
            with trio.CancelScope(deadline=core.next_deadline()) as scope:
                self._scope = scope
                await trio.lowlevel.wait_readable(sock)
            self._scope = None
            now = trio.current_time()
            for _ in range(256):
                try:
                    size, source = sock.recvfrom_into(buffer)
                except BlockingIOError:
                    break
                except OSError:
                    continue  # ICMP port unreachable from a dead server
                core.on_datagram(bytes(buffer[:size]), self._names.get(source[:2]), now)
            core.on_timer(now)
            self._flush()
            await self._run_work(nursery, busy)
            for message in core.received:
                try:
                    self._send_channel.send_nowait(message)
                except trio.WouldBlock:
                    self.dropped += 1
            core.received.clear()
            async with self._changed:
                self._changed.notify_all()


def _raw(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else value


async def resolve(servers: Sequence[str]) -> dict[str, Address]:
    """host:port names to socket addresses (OSError if a host does not resolve)."""
    out: dict[str, Address] = {}
    for server in servers:
        host, port = split_server(server)
        try:
            infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
        except OSError as error:
            raise OSError(f"cannot resolve server {server}: {error.strerror or error}") from None
        if not infos:
            raise OSError(f"cannot resolve server {server}")
        infos.sort(key=lambda info: info[0] != socket.AF_INET)
        address = infos[0][4]
        out[server] = (str(address[0]), int(address[1]))
    return out


@contextlib.asynccontextmanager
async def open_topic_client(
    servers: Sequence[str],
    config: ClientConfig | None = None,
    *,
    bind: str | None = None,
    rng: random.Random | None = None,
) -> AsyncIterator[TopicClient]:
    """A running client for ``servers`` (``host:port`` strings).

    ::

        async with open_topic_client(["10.0.0.1:7000", "10.0.0.2:7000"]) as client:
            client.subscribe("lobby/eu")
            await client.wait_subscribed("lobby/eu")
            client.publish("lobby/eu", b"hello")
            message = await client.receive()
    """
    if not servers:
        raise ValueError("the server list is empty")
    addresses = await resolve(servers)
    families = {
        socket.AF_INET6 if ":" in host else socket.AF_INET for host, _ in addresses.values()
    }
    if len(families) > 1:
        raise ValueError("mixing IPv4 and IPv6 servers in one list is not supported")
    family = families.pop()
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
        sock.bind((bind or ("::" if family == socket.AF_INET6 else "0.0.0.0"), 0))
        sock.setblocking(False)
        client = TopicClient(ClientCore(list(servers), config, rng=rng), sock, addresses)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client._loop, nursery)
            yield client
            nursery.cancel_scope.cancel()
    finally:
        sock.close()
