"""The matchmaker's metrics (echo.ops.queue_metrics): scraped over HTTP from a real echo-lobby
process while members queue, match, wait, cancel and are refused; and, on the desk itself,
the parties dropped and the bound on (mode, region) series."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

import echo.lobby
from echo.lobby.client import LobbyError
from echo.lobby.matchmaker import MatchRules
from echo.lobby.protocol import ErrorCode
from echo.lobby.queue_stats import OTHER, WaitHistogram, queued_by_queue
from echo.lobby.queue_wire import CancelMatch, EnqueueMatch
from echo.lobby.queues import QueueDesk
from echo.lobby.state import LobbyRegistry
from echo.ops.queue_metrics import queue_metrics
from tests.lobby.test_cli import LOBBY
from tests.ops.scrape import Samples, scrape, scrape_until, value
from tests.ops.test_processes import running
from tests.ports import free_base


def players(samples: Samples, mode: str, region: str) -> float:
    return samples.get(
        ("echo_lobby_queue_players", frozenset({("mode", mode), ("region", region)})), 0.0
    )


async def queue_and_match(server: str, metrics: int) -> None:
    async with (
        echo.lobby.connect([server], member="ann") as ann,
        echo.lobby.connect([server], member="bob") as bob,
        echo.lobby.connect([server], member="cid") as cid,
    ):
        # cid waits alone in duel/us: the gauge shows it, by mode and region
        await cid.queue("duel", "us", skill=10, size=2, strict_region=True)
        samples = await trio.to_thread.run_sync(
            lambda: scrape_until(metrics, lambda s: players(s, "duel", "us") == 1)
        )
        assert value(samples, "echo_lobby_matches_formed_total") == 0
        # ann and bob make a match in duel/eu
        await ann.queue("duel", "eu", skill=10, size=2)
        await bob.queue("duel", "eu", skill=12, size=2)
        await ann.wait_until(lambda c: c.replica is not None, timeout=30)
        await bob.wait_until(lambda c: c.replica is not None, timeout=30)
        # cid cancels, then asks the server to cancel again (the client itself would not):
        # refused, and counted by its code
        await cid.cancel_queue()
        try:
            await cid.request(CancelMatch(0))
        except LobbyError as error:
            assert error.code is ErrorCode.NOT_QUEUED
        else:
            raise AssertionError("a second cancel was not refused")


def test_a_lobby_server_exports_its_matchmaker_over_http(tmp_path: Path) -> None:
    base = free_base(40)
    metrics = base + 39  # the last port of the range (the duologues of 16 members before it)
    argv = [*LOBBY, "--port", str(base), "--max-clients", "16",
            "--metrics", f"127.0.0.1:{metrics}"]  # fmt: skip
    with running(argv, tmp_path / "lobby.log"):
        before = scrape(metrics)
        assert value(before, "echo_lobby_queue_wait_seconds_count") == 0
        assert value(before, "echo_lobby_queue_refusals_total", code="not_queued") == 0
        trio.run(queue_and_match, f"127.0.0.1:{base}", metrics)
        after = scrape(metrics)
    assert value(after, "echo_lobby_matches_formed_total") == 1
    assert value(after, "echo_lobby_players_matched_total") == 2
    assert value(after, "echo_lobby_queue_entries_total") == 3
    assert value(after, "echo_lobby_queue_cancelled_total") == 1
    assert value(after, "echo_lobby_queue_refusals_total", code="not_queued") == 1
    assert value(after, "echo_lobby_queue_refusals_total", code="rate_limited") == 0
    assert players(after, "duel", "us") == 0 and players(after, "duel", "eu") == 0
    # both matched players' waits, each well under the 120 s bucket
    assert value(after, "echo_lobby_queue_wait_seconds_count") == 2
    assert value(after, "echo_lobby_queue_wait_seconds_bucket", le="120.0") == 2
    assert value(after, "echo_lobby_queue_wait_seconds_bucket", le="+Inf") == 2
    assert 0 <= value(after, "echo_lobby_queue_wait_seconds_sum") < 60


class _Desk(Collector):
    def __init__(self, desk: QueueDesk) -> None:
        self.desk = desk

    def collect(self) -> Iterator[object]:  # type: ignore[override]
        yield from queue_metrics(self.desk)


def collected(desk: QueueDesk) -> Samples:
    registry = CollectorRegistry(auto_describe=True)
    registry.register(_Desk(desk))
    text = generate_latest(registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def entry(member: str, mode: str = "duel", region: str = "eu", **fields: int) -> EnqueueMatch:
    values = {"skill": 0, "size": 4, "party": 0, "party_size": 1} | fields
    return EnqueueMatch(
        1, mode, region, values["skill"], values["size"], values["party"], values["party_size"],
        b"", False, False, 0,
    )  # fmt: skip


def test_a_party_that_does_not_gather_is_dropped_and_counted() -> None:
    registry = LobbyRegistry()
    desk = QueueDesk(registry, rules=MatchRules(party_wait=5.0))
    members = {"p1": b"", "p2": b"", "p3": b""}
    lobby = registry.seat_match(members, 0.0, name="party", metadata={})[0]
    for member in ("p1", "p2"):  # p3 never queues
        handled = desk.handle(member, entry(member, party=lobby, party_size=3), 0.0, secret=b"")
        assert type(handled.reply).__name__ == "Queued", handled.reply
    gathering = collected(desk)
    assert players(gathering, "duel", "eu") == 2
    desk.tick(10.0)
    dropped = collected(desk)
    assert value(dropped, "echo_lobby_queue_parties_dropped_total") == 1
    assert value(dropped, "echo_lobby_queue_players_dropped_total") == 2
    assert players(dropped, "duel", "eu") == 0
    assert value(dropped, "echo_lobby_queue_wait_seconds_count") == 0  # never matched


def test_queue_series_are_bounded_whatever_modes_the_clients_invent() -> None:
    desk = QueueDesk(LobbyRegistry())
    for n in range(120):
        desk.handle(f"m{n}", entry(f"m{n}", mode=f"mode{n}"), 0.0, secret=b"")
    desk.handle("x1", entry("x1", mode="mode0"), 0.0, secret=b"")  # mode0/eu: 2 players
    samples = collected(desk)
    series = [k for k in samples if k[0] == "echo_lobby_queue_players"]
    assert len(series) == 51  # the 50 busiest, and the rest summed
    assert players(samples, "mode0", "eu") == 2
    assert players(samples, OTHER, OTHER) == 121 - 2 - 49
    assert sum(samples[k] for k in series) == 121
    assert queued_by_queue([("a", "b", 1), ("a", "b", 2)]) == {("a", "b"): 3}


def test_the_wait_histogram_is_cumulative() -> None:
    waits = WaitHistogram((1.0, 10.0))
    waits.observe(0.5)
    waits.observe(1.0)  # on a bound: counted in it (le)
    waits.observe(5.0, times=2)
    waits.observe(500.0)
    assert waits.buckets() == [(1.0, 2), (10.0, 4), (float("inf"), 5)]
    assert (waits.count, waits.sum) == (5, 511.5)
