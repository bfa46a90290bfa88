"""The topics client: smart clients for dumb servers (pub/sub note). The pure core is
`echo.topics.client_core` (`ClientCore`); here its trio driver.

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
import random
import socket
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import trio

from echo.topics.client_core import (
    COOKIE_REPLY_SIZE,
    Address,
    ClientConfig,
    ClientCore,
    Message,
    parse_servers,
    split_server,
)
from echo.topics.codec import encode, solve_work

__all__ = [
    "COOKIE_REPLY_SIZE",
    "ClientConfig",
    "ClientCore",
    "Message",
    "TopicClient",
    "open_topic_client",
    "parse_servers",
    "read_servers_file",
    "split_server",
]


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
