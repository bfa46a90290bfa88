"""The collectors in-process: each reads its server's own counts at scrape time, with the
names, types and labels docs/metrics.md lists."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

import echo.session as es
from echo.lobby.protocol import CreateLobby, LockChanged, SetLocked
from echo.lobby.server import LobbyServer
from echo.ops.http import Health
from echo.ops.metrics import (
    LobbyCollector,
    TicketCollector,
    TopicsCollector,
    TransportCollector,
    new_registry,
    session_collectors,
)
from echo.topics.driver import TopicServer
from echo.transport.core.counters import Counters
from tests.ops.scrape import Samples, value
from tests.server.test_server import free_base, server_config
from tests.session.test_sessions import connect, idle

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def samples_of(*collectors: Collector) -> Samples:
    """Render as a scrape would, and parse back with the client library's parser."""
    registry = CollectorRegistry()
    for collector in collectors:
        registry.register(collector)
    samples: Samples = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def test_transport_counters_by_name_and_drops_by_reason() -> None:
    counters = Counters()
    counters.datagrams_received = 7
    counters.naks_sent = 2
    counters.retransmits_sent = 3
    counters.unvalidated_drops = 4
    counters.invalid("beyond_term")
    counters.invalid("beyond_term")
    samples = samples_of(TransportCollector(lambda: counters))
    assert value(samples, "echo_transport_datagrams_received_total") == 7
    assert value(samples, "echo_transport_naks_sent_total") == 2
    assert value(samples, "echo_transport_retransmits_sent_total") == 3
    assert value(samples, "echo_transport_drops_total", reason="unvalidated") == 4
    assert value(samples, "echo_transport_drops_total", reason="invalid_frame") == 2
    assert value(samples, "echo_transport_invalid_frames_total", reason="beyond_term") == 2
    assert value(samples, "echo_transport_drops_total", reason="rate_limited") == 0
    # Read at scrape time: a later count shows in the next scrape.
    counters.datagrams_received += 1
    later = samples_of(TransportCollector(lambda: counters))
    assert value(later, "echo_transport_datagrams_received_total") == 8


def test_a_transport_not_open_yet_reads_as_zeros() -> None:
    samples = samples_of(TransportCollector(lambda: None))
    assert value(samples, "echo_transport_datagrams_sent_total") == 0
    assert value(samples, "echo_transport_drops_total", reason="unknown_session") == 0


async def failing(session: es.Session) -> None:
    async for message in session:
        if message == b"boom":
            raise RuntimeError("the application failed")
        await session.send(b"fine")


async def test_session_server_admissions_sessions_and_closes() -> None:
    config = server_config(free_base(12), max_per_ip=1)
    async with trio.open_nursery() as nursery:
        server: es.SessionServer = await nursery.start(es.SessionServer(config, failing).run)
        collectors = session_collectors(server)
        async with connect(config) as first:
            await first.send(b"hi")
            assert await first.receive() == b"fine"
            during = samples_of(*collectors)
            assert value(during, "echo_session_sessions_open") == 1
            assert value(during, "echo_session_duologues_open") == 1
            with pytest.raises(es.Rejected):
                async with connect(config):
                    pass
        await idle(server)
        async with connect(config) as second:
            await second.send(b"boom")
            with pytest.raises(es.SessionClosed):
                await second.receive()
        await idle(server)
        after = samples_of(*collectors)
        assert value(after, "echo_session_sessions_open") == 0
        assert value(after, "echo_session_hellos_total") == 3
        assert value(after, "echo_session_admissions_total", result="accepted") == 2
        assert value(after, "echo_session_admissions_total", result="per_ip_limit") == 1
        assert value(after, "echo_session_admissions_total", result="server_full") == 0
        assert value(after, "echo_session_sessions_opened_total") == 2
        assert value(after, "echo_session_application_errors_total") == 1
        assert value(after, "echo_session_sessions_closed_total", reason="application_error") == 1
        closed = [v for (n, _), v in after.items() if n == "echo_session_sessions_closed_total"]
        assert sum(closed) == 2
        assert value(after, "echo_transport_datagrams_received_total") > 0
        assert value(after, "echo_transport_setups_received_total") >= 2
        nursery.cancel_scope.cancel()


def test_lobby_census_counters_and_refusals() -> None:
    server = LobbyServer(es.ServerConfig(port=free_base(4)))
    registry = server.registry
    created = []
    for member, private in (("ann", False), ("bea", True), ("cat", False)):
        reply = registry.handle(member, CreateLobby(1, f"{member}'s", 4, private, {}), 1.0).reply
        created.append(reply.lobby_id)
    handled = registry.handle("cat", SetLocked(2, created[2], True), 1.0)
    assert any(isinstance(s.message, LockChanged) for s in handled.sends)
    registry.disconnected("ann", 2.0)
    registry.handle("dan", SetLocked(3, created[0], True), 2.0)  # not a member: refused
    server.counters["chat_dropped"] += 5
    samples = samples_of(LobbyCollector(server))
    assert value(samples, "echo_lobby_lobbies", state="listed") == 1
    assert value(samples, "echo_lobby_lobbies", state="private") == 1
    assert value(samples, "echo_lobby_lobbies", state="locked") == 1
    assert value(samples, "echo_lobby_members", presence="connected") == 2
    assert value(samples, "echo_lobby_members", presence="reconnecting") == 1
    assert value(samples, "echo_lobby_lobbies_created_total") == 3
    assert value(samples, "echo_lobby_members_dropped_total") == 1
    assert value(samples, "echo_lobby_chat_dropped_total") == 5
    refusals = {
        dict(labels)["code"]: v
        for (name, labels), v in samples.items()
        if name == "echo_lobby_refusals_total" and v
    }
    assert sum(refusals.values()) == 1 and set(refusals) <= {"not_member", "no_such_lobby"}
    assert value(samples, "echo_lobby_join_duration_seconds_count") == 0
    assert value(samples, "echo_lobby_search_duration_seconds_bucket", le="0.001") == 0


def test_topics_subscriptions_fan_out_and_drops() -> None:
    server = TopicServer(port=0)
    core = server.core
    core.on_datagram(b"\x00\x01 not a line", ("192.0.2.1", 5000), 1.0)
    samples = samples_of(TopicsCollector(server))
    assert value(samples, "echo_topics_subscriptions") == 0
    assert value(samples, "echo_topics_datagrams_received_total") == 1
    malformed = [v for (n, _), v in samples.items() if n == "echo_topics_malformed_lines_total"]
    assert sum(malformed) == value(samples, "echo_topics_drops_total", reason="malformed_line")
    assert sum(malformed) >= 1
    assert value(samples, "echo_topics_deliveries_total") == 0


def test_tickets_by_verdict() -> None:
    outcomes: Counter[str] = Counter(admitted=3, expired=1)
    samples = samples_of(TicketCollector(outcomes))
    assert value(samples, "echo_server_tickets_total", result="admitted") == 3
    assert value(samples, "echo_server_tickets_total", result="expired") == 1
    assert value(samples, "echo_server_tickets_total", result="bad_signature") == 0


def test_a_registry_has_the_process_and_readiness_and_nothing_shared() -> None:
    health = Health()
    first, second = new_registry(health), new_registry(Health())
    health.ready()
    one = samples_of(*first._collector_to_names)  # type: ignore[attr-defined]
    two = samples_of(*second._collector_to_names)  # type: ignore[attr-defined]
    assert value(one, "echo_ready") == 1 and value(two, "echo_ready") == 0
    assert value(one, "process_open_fds") > 0


def exported_families() -> set[str]:
    """The name of every family the servers export (each collector over a fresh server)."""
    lobby = LobbyServer(es.ServerConfig(port=free_base(4)))
    collectors = [
        LobbyCollector(lobby),
        *session_collectors(lobby.sessions),
        TopicsCollector(TopicServer(port=0)),
        TicketCollector(Counter()),
    ]
    registry = new_registry(Health(), *collectors)
    text = generate_latest(registry).decode()
    return {f.name for f in text_string_to_metric_families(text)}


def test_every_exported_metric_is_in_the_docs_table() -> None:
    table = DOCS.read_text()
    missing = [
        name
        for name in exported_families()
        if not name.startswith("process_") and f"`{name}" not in table
    ]
    assert not missing, f"not in docs/metrics.md: {sorted(missing)}"
