"""The trio drivers over real loopback sockets: server, client library, events, lapse."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import trio

from echo.topics import ClientConfig, ServerConfig, TopicClient, TopicServer, open_topic_client
from echo.topics.codec import format_publish
from echo.topics.events import TopicEvents


async def until(party: TopicServer | TopicClient, predicate: Callable[[], bool]) -> None:
    """Wait (bounded) for a condition of a server's or client's state."""
    with trio.fail_after(10):
        await party.wait_until(predicate)


@pytest.fixture
async def servers(nursery: trio.Nursery) -> AsyncIterator[list[TopicServer]]:
    started = []
    for _ in range(3):
        server = TopicServer(ServerConfig(lifetime=2.0))
        await nursery.start(server.run)
        started.append(server)
    yield started


def names(servers: list[TopicServer]) -> list[str]:
    return [f"{s.bound[0]}:{s.bound[1]}" for s in servers if s.bound]


async def test_publish_reaches_every_subscriber_once(servers: list[TopicServer]) -> None:
    listed = names(servers)
    async with (
        open_topic_client(listed, ClientConfig(k=2)) as a,
        open_topic_client(listed, ClientConfig(k=2)) as b,
        open_topic_client(listed, ClientConfig(k=2, copies=3)) as pub,
    ):
        for sub in (a, b):
            sub.subscribe("lobby/eu", "spectate/42")
        with trio.fail_after(10):
            await a.wait_subscribed("lobby/eu", "spectate/42")
            await b.wait_subscribed("lobby/eu", "spectate/42")
        pub.publish("lobby/eu", b"room\n1 \x00\xff")
        pub.publish("spectate/42", "frame")
        await pub.wait_sent()
        for sub in (a, b):
            with trio.fail_after(10):
                got = {(m.topic, m.data) for m in [await sub.receive(), await sub.receive()]}
            assert got == {(b"lobby/eu", b"room\n1 \x00\xff"), (b"spectate/42", b"frame")}
        # 2 messages x K = 2 servers x 3 copies = 12 arrive, 10 of them duplicates.
        await until(a, lambda: a.counters["duplicates"] == 10)
        await until(b, lambda: b.counters["duplicates"] == 10)
        assert a.counters["messages_received"] == 2


async def test_subscription_lapses_n_seconds_after_the_last_refresh_end_to_end(
    servers: list[TopicServer],
) -> None:
    server = servers[0]
    (listed,) = names([server])
    async with (
        open_topic_client([listed], ClientConfig(k=1, refresh_factor=4)) as sub,
        open_topic_client([listed], ClientConfig(k=1, copies=1)) as pub,
    ):
        sub.subscribe("t")
        with trio.fail_after(10):
            await sub.wait_subscribed("t")
        # Refreshed every N/M = 0.5 s: still subscribed after 2 N.
        await until(server, lambda: server.core.counters.subscriptions_refreshed >= 6)
        assert server.core.subscription_count == 1
        sub.unsubscribe("t")
        (last_refresh,) = server.core.order.values()
        await until(server, lambda: server.core.subscription_count == 0)
        lapsed_at = trio.current_time()
        assert server.core.counters.subscriptions_expired == 1
        # Never before N after the last refresh, and by a timer, not by the next datagram.
        assert lapsed_at >= last_refresh + 2.0
        assert lapsed_at < last_refresh + 2.0 + 1.0
        pub.publish("t", "after")
        await pub.wait_sent()
        await until(server, lambda: server.core.counters.publishes == 1)
        assert server.core.counters.deliveries == 0


async def test_garbage_is_counted_and_the_server_keeps_serving(servers: list[TopicServer]) -> None:
    server = servers[0]
    (listed,) = names([server])
    raw = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with raw:
        await raw.bind(("127.0.0.1", 0))
        garbage = [b"", b"\n", b"%%%\n", b"a b c d\n", b"!nope\n", b"\xff" * 1000, b"x" * 60000]
        for datagram in garbage:
            await raw.sendto(datagram, server.bound)
        await until(server, lambda: server.core.counters.datagrams_received == len(garbage))
        malformed = server.core.counters.malformed
        assert malformed["empty"] == 1 and malformed["bad_topic"] >= 1
        assert malformed["too_many_fields"] == 1 and malformed["unknown_control"] == 1
        assert malformed["unterminated"] == 2
        # Not one byte went back to the unconfirmed garbage sender except cookies it earned.
        assert server.core.counters.unconfirmed_bytes_sent <= 60000
        async with open_topic_client([listed], ClientConfig(k=1)) as client:
            client.subscribe("still")
            with trio.fail_after(10):
                await client.wait_subscribed("still")


async def test_events_are_json_lines_like_echo_servers(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    path = tmp_path / "events.jsonl"
    events = TopicEvents(path, server_id="t1")
    server = TopicServer(ServerConfig(lifetime=0.5), events=events, stats_interval=0.2)
    await nursery.start(server.run)
    (listed,) = names([server])
    async with open_topic_client([listed], ClientConfig(k=1)) as client:
        client.subscribe("news")
        with trio.fail_after(10):
            await client.wait_subscribed("news")
        client.unsubscribe("news")
        await until(server, lambda: server.core.counters.subscriptions_expired == 1)
        await until(server, lambda: '"topics_counters"' in path.read_text())
    records = [json.loads(line) for line in path.read_text().splitlines()]
    kinds = [r["event"] for r in records]
    assert "subscription_added" in kinds and "subscription_expired" in kinds
    added = records[kinds.index("subscription_added")]
    assert added["server_id"] == "t1" and added["topic"] == "news" and "ts" in added
    counters = next(r for r in records if r["event"] == "topics_counters")
    assert counters["subscriptions_added"] == 1 and "malformed" in counters
    events.close()


async def test_a_publish_line_is_forwarded_byte_for_byte(servers: list[TopicServer]) -> None:
    server = servers[1]
    (listed,) = names([server])
    async with open_topic_client([listed], ClientConfig(k=1)) as sub:
        sub.subscribe("t")
        with trio.fail_after(10):
            await sub.wait_subscribed("t")
        (subscriber,) = server.core.subscribers(b"t")
        raw = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        with raw:
            await raw.bind(("127.0.0.1", 0))
            line = format_publish(b"t", b"payload", b"abc")
            await raw.sendto(line, server.bound)
            with trio.fail_after(10):
                message = await sub.receive()
        assert message.data == b"payload" and message.message_id == b"abc"
        assert subscriber[0] == "127.0.0.1"
