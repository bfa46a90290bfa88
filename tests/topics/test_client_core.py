"""Pure client cores and pure server cores wired by hand, with a scripted clock.

The network is a list of datagrams moved by the test: servers can be "down" (datagrams to
them vanish) and single datagrams can be dropped by index.
"""

from __future__ import annotations

import random

import pytest

from echo.topics.client import COOKIE_REPLY_SIZE, ClientConfig, ClientCore, Message
from echo.topics.codec import CodecError, solve_work
from echo.topics.server import ServerConfig, TopicServerCore

Address = tuple[str, int]


class Net:
    def __init__(self, count: int, config: ServerConfig | None = None) -> None:
        self.names = [f"10.0.0.{i + 1}:7400" for i in range(count)]
        self.servers = {name: TopicServerCore(config) for name in self.names}
        self.clients: dict[Address, ClientCore] = {}
        self.down: set[str] = set()
        self.sent = 0
        self.drop: set[int] = set()  # indexes of client->server datagrams to lose

    def client(
        self, config: ClientConfig, names: list[str] | None = None, seed: int = 1
    ) -> ClientCore:
        address = (f"10.1.0.{len(self.clients) + 1}", 5000)
        core = ClientCore(names or self.names, config, rng=random.Random(seed))
        self.clients[address] = core
        return core

    def run(self, now: float) -> None:
        """Deliver everything until the network is quiet (all at time ``now``)."""
        for _ in range(100):
            moved = False
            for address, client in self.clients.items():
                client.on_timer(now)
                for name, cookie, difficulty in client.work_wanted():
                    client.on_work(name, cookie, solve_work(cookie, difficulty), now)
                for name, datagram in client.datagrams_to_send():
                    moved = True
                    index = self.sent
                    self.sent += 1
                    if name in self.down or index in self.drop:
                        continue
                    self.servers[name].on_datagram(datagram, address, now)
            for name, server in self.servers.items():
                server.on_timer(now)
                for datagram, address in server.datagrams_to_send():
                    moved = True
                    if name not in self.down:
                        self.clients[address].on_datagram(datagram, name, now)
            if not moved:
                return
        raise AssertionError("the network never went quiet")

    def advance(self, start: float, end: float, step: float = 0.01) -> None:
        t = start
        while t <= end:
            self.run(t)
            t = round(t + step, 6)


def taken(client: ClientCore) -> list[Message]:
    out = list(client.received)
    client.received.clear()
    return out


def test_subscribe_publish_deduplicated_over_k_servers() -> None:
    net = Net(5)
    sub = net.client(ClientConfig(k=3))
    pub = net.client(ClientConfig(k=3, copies=2, resend_interval=0.05))
    sub.subscribe([b"lobby/eu"], 0.0)
    net.run(0.0)
    assert len(sub.confirmed_servers(b"lobby/eu")) == 3
    pub.publish(b"lobby/eu", b"hello", 1.0)
    net.advance(1.0, 1.2)
    messages = taken(sub)
    assert [(m.topic, m.data) for m in messages] == [(b"lobby/eu", b"hello")]
    # 3 servers x 2 copies arrived; 5 of the 6 were duplicates.
    assert sub.counters.duplicates == 5


def test_unconfirmed_requests_are_padded_to_the_cookie_size() -> None:
    core = ClientCore(["10.0.0.1:7400"], ClientConfig(k=1))
    core.subscribe([b"a"], 0.0)
    ((_, datagram),) = core.datagrams_to_send()
    assert len(datagram) >= COOKIE_REPLY_SIZE
    assert datagram.startswith(b"a\n!pad ")


def test_kill_two_of_five_servers_and_every_message_still_arrives() -> None:
    net = Net(5)
    topics = [b"topic-%d" % i for i in range(20)]
    subscribers = [net.client(ClientConfig(k=3), seed=i) for i in range(3)]
    pub = net.client(ClientConfig(k=3, copies=1))
    for sub in subscribers:
        sub.subscribe(topics, 0.0)
    net.run(0.0)
    net.down = {net.names[0], net.names[3]}
    for i, topic in enumerate(topics):
        pub.publish(topic, b"m%d" % i, 1.0)
    net.run(1.0)
    for sub in subscribers:
        got = sorted((m.topic, m.data) for m in taken(sub))
        assert got == sorted((t, b"m%d" % i) for i, t in enumerate(topics))


def test_refresh_every_n_over_m_keeps_a_subscription_alive_and_stopping_lets_it_lapse() -> None:
    net = Net(1, ServerConfig(lifetime=6.0))
    sub = net.client(ClientConfig(k=1, refresh_factor=3))
    sub.subscribe([b"t"], 0.0)
    net.run(0.0)
    server = net.servers[net.names[0]]
    assert sub.next_deadline() == pytest.approx(2.0)  # N/M = 6/3
    net.advance(0.0, 30.0, step=0.5)
    assert server.subscribers(b"t") and server.counters.subscriptions_expired == 0
    assert server.counters.subscriptions_refreshed == 15  # every 2 s from 2 to 30
    sub.unsubscribe([b"t"])
    net.advance(30.5, 35.5, step=0.5)
    assert server.subscribers(b"t")  # last refresh at t=30: lives until 36
    net.run(36.0)
    assert not server.subscribers(b"t")


def test_a_lost_first_request_is_retried() -> None:
    net = Net(1)
    sub = net.client(ClientConfig(k=1, handshake_retry=0.5))
    net.drop = {0}
    sub.subscribe([b"t"], 0.0)
    net.run(0.0)
    assert sub.confirmed_servers(b"t") == []
    net.run(0.5)
    assert sub.confirmed_servers(b"t") == [net.names[0]]


def test_a_restarted_server_is_confirmed_again_at_the_next_refresh() -> None:
    net = Net(1, ServerConfig(lifetime=3.0))
    sub = net.client(ClientConfig(k=1, refresh_factor=3))
    sub.subscribe([b"t"], 0.0)
    net.run(0.0)
    name = net.names[0]
    net.servers[name] = TopicServerCore(ServerConfig(lifetime=3.0))  # new secret, no state
    net.run(1.0)  # refresh with the old cookie -> a fresh cookie -> confirm at once
    assert net.servers[name].subscribers(b"t")


def test_proof_of_work_is_done_by_the_client() -> None:
    net = Net(1, ServerConfig(work_difficulty=8))
    sub = net.client(ClientConfig(k=1))
    sub.subscribe([b"t"], 0.0)
    net.run(0.0)
    assert sub.confirmed_servers(b"t") and sub.counters.works_solved == 1


def test_fifo_lifetime_estimate_sets_the_refresh_interval() -> None:
    net = Net(1, ServerConfig(lifetime=60.0, table_size=2))
    a = net.client(ClientConfig(k=1, refresh_factor=2))
    a.subscribe([b"x"], 0.0)
    net.run(0.0)
    b = net.client(ClientConfig(k=1, refresh_factor=2))
    b.subscribe([b"y"], 10.0)
    net.run(10.0)
    # Table full at t=10 with the oldest entry 10 s old: b is told 10 s, refreshes at 5 s.
    assert b.next_deadline() == pytest.approx(15.0)


def test_rch_publish_to_k_prime_subscribe_to_k() -> None:
    net = Net(8)
    sub = net.client(ClientConfig(k=4))
    pub = net.client(ClientConfig(k=4, publish_k_prime=1, copies=1))
    topics = [b"t%d" % i for i in range(30)]
    sub.subscribe(topics, 0.0)
    net.run(0.0)
    for topic in topics:
        pub.publish(topic, b"m", 1.0)
    sends = pub.datagrams_to_send()
    assert len(sends) <= 30  # one server per topic (some packed together)
    for name, datagram in sends:
        net.servers[name].on_datagram(datagram, ("10.1.0.2", 5000), 1.0)
    net.run(1.0)
    assert sorted(m.topic for m in taken(sub)) == sorted(topics)
    assert sub.counters.duplicates == 0  # each message arrived K' = 1 times


def test_rch_subscribe_to_k_prime_publish_to_k() -> None:
    net = Net(8)
    sub = net.client(ClientConfig(k=4, subscribe_k_prime=2))
    pub = net.client(ClientConfig(k=4, copies=1))
    topics = [b"t%d" % i for i in range(30)]
    sub.subscribe(topics, 0.0)
    assert all(len(servers) == 2 for servers in sub.subscriptions.values())
    net.run(0.0)
    for topic in topics:
        pub.publish(topic, b"m", 1.0)
    net.run(1.0)
    assert sorted(m.topic for m in taken(sub)) == sorted(topics)
    assert sub.counters.duplicates == 30  # K' = 2 copies of each


def test_both_sides_rch_is_refused() -> None:
    with pytest.raises(ValueError, match="one side"):
        ClientConfig(k=4, publish_k_prime=1, subscribe_k_prime=1)


def test_clients_with_different_server_lists_meet_on_shared_servers() -> None:
    net = Net(10)
    topics = [b"room-%d" % i for i in range(40)]
    # The subscriber does not know two of the servers, and knows one that is gone.
    partial = [*net.names[2:], "10.0.0.99:7400"]
    net.servers["10.0.0.99:7400"] = TopicServerCore()
    net.down = {"10.0.0.99:7400"}
    sub = net.client(ClientConfig(k=3), names=partial)
    pub = net.client(ClientConfig(k=3, copies=1))
    sub.subscribe(topics, 0.0)
    net.run(0.0)
    for topic in topics:
        pub.publish(topic, b"m", 1.0)
    net.run(1.0)
    got = {m.topic for m in taken(sub)}
    for topic in topics:
        shared = set(sub.subscriptions[topic]) & set(pub.servers_for(topic)) - net.down
        assert (topic in got) == bool(shared)
    # Consistent hashing keeps most topics on shared servers despite the differences.
    assert len(got) >= 30


def test_messages_on_topics_not_subscribed_and_from_unknown_sources_are_counted() -> None:
    core = ClientCore(["10.0.0.1:7400"], ClientConfig(k=1))
    core.on_datagram(b"t m id1\n", "10.0.0.1:7400", 0.0)
    core.on_datagram(b"t m id1\n", None, 0.0)
    core.on_datagram(b"t\n%zz\n", "10.0.0.1:7400", 0.0)
    assert core.counters.not_subscribed == 1 and core.counters.from_unknown == 1
    assert core.counters.malformed["unknown_control"] == 1  # a subscribe line from a server
    assert core.counters.malformed["bad_topic"] == 1
    assert core.received == []


def test_a_message_too_long_for_a_datagram_is_refused_locally() -> None:
    core = ClientCore(["10.0.0.1:7400"], ClientConfig(k=1, max_datagram=100))
    with pytest.raises(CodecError):
        core.publish(b"t", b"x" * 100, 0.0)


def test_the_dedup_memory_is_bounded() -> None:
    core = ClientCore(["10.0.0.1:7400"], ClientConfig(k=1, dedup_max=10, dedup_window=5.0))
    core.subscribe([b"t"], 0.0)
    for i in range(50):
        core.on_datagram(b"t m id%d\n" % i, "10.0.0.1:7400", 0.0)
    assert len(core._seen) == 10
    core.on_datagram(b"t m late\n", "10.0.0.1:7400", 100.0)
    assert len(core._seen) == 1


def test_a_lifetime_of_zero_does_not_make_the_client_spin() -> None:
    core = ClientCore(["10.0.0.1:7400"], ClientConfig(k=1, refresh_factor=2))
    core.subscribe([b"t"], 0.0)
    core.on_datagram(b"!life 0\n", "10.0.0.1:7400", 1.0)
    assert core.next_deadline() == pytest.approx(1.5)
