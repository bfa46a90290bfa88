"""The matchmaker over real sockets: players and parties queue on their queue's home, are
seated together in a new lobby (and started), floods are refused, and a queue survives the
loss of its server (the clients send their entries again to the next home)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

import echo.lobby
from echo.lobby.client import LobbyError
from echo.lobby.matchmaker import MatchRules, queue_home
from echo.lobby.protocol import ErrorCode, GameStarting
from echo.lobby.queue_wire import Matched, QueueLeft
from tests.lobby.servers import GAME_KEY, cluster, until
from tests.lobby.test_server_games import echo_once, game_server, write_key

RULES = MatchRules(skill_window=100, widen_per_second=50, region_wait=2, open_after=4)


async def test_players_are_matched_and_seated_together_on_the_queues_home() -> None:
    events: list = []
    async with cluster(2, match_rules=RULES, events=events) as c:
        home = queue_home(c.lobby[0].ring, "duel", "eu")
        async with (
            echo.lobby.connect(c.names, member="a") as a,
            echo.lobby.connect(c.names, member="b") as b,
            echo.lobby.connect(c.names, member="c") as cc,
            echo.lobby.connect(c.names, member="d") as d,
        ):
            for player, skill in ((a, 1000), (b, 3000), (cc, 1050), (d, 3020)):
                await player.queue("duel", "eu", skill=skill, size=2)
                assert player.server == home
            matched = {p.member: await p.next_event(Matched) for p in (a, b, cc, d)}
            assert matched["a"].lobby_id == matched["c"].lobby_id
            assert matched["b"].lobby_id == matched["d"].lobby_id
            assert matched["a"].lobby_id != matched["b"].lobby_id
            for p in (a, b, cc, d):
                await p.wait_until(lambda c, p=p: c.lobby_id == matched[p.member].lobby_id)
                assert p.replica is not None and len(p.replica.members) == 2
                assert p.waiting is None
            # The match's lobby is an ordinary lobby of the home: chat and ready work.
            await a.chat("gg")
            await cc.ready()
    assert sum(1 for e, _ in events if e == "lobby_matched") == 2
    # A matched lobby is in the event log as any lobby: created, joined, then matched.
    lobby_a = matched["a"].lobby_id
    mine = [
        (e, f.get("member_id"), f.get("members")) for e, f in events if f.get("lobby_id") == lobby_a
    ]
    first = next(
        f["member_id"] for e, f in events if e == "lobby_created" and f["lobby_id"] == lobby_a
    )
    second = ({"a", "c"} - {first}).pop()
    assert mine[:4] == [
        ("lobby_created", first, None),
        ("lobby_joined", first, 1),
        ("lobby_joined", second, 2),
        ("lobby_matched", None, 2),
    ]


async def test_a_party_queues_whole_and_a_match_can_start_at_once(tmp_path: Path) -> None:
    key_file = write_key(tmp_path, GAME_KEY)
    async with cluster(2, topics=1, ticket_keys=(GAME_KEY,), match_rules=RULES) as c:
        game, _ = await game_server(c.nursery, key_file, c.topic_names)
        await until(lambda: all(s.games.live(trio.current_time()) for s in c.lobby))
        async with (
            echo.lobby.connect(c.names, member="lead") as lead,
            echo.lobby.connect(c.names, member="mate") as mate,
            echo.lobby.connect(c.names, member="solo1") as s1,
            echo.lobby.connect(c.names, member="solo2") as s2,
        ):
            party = await lead.create("our party", 2)
            await mate.join(party)
            await lead.wait_until(lambda c: c.replica is not None and len(c.replica.members) == 2)
            for p in (lead, mate):
                await p.queue("squad", "eu", skill=500, size=4, party=True, start=True)
            for p in (s1, s2):
                await p.queue("squad", "eu", skill=520, size=4, start=True)
            players = (lead, mate, s1, s2)
            tickets = {p.member: (await p.next_event(Matched)) for p in players}
            assert len({m.lobby_id for m in tickets.values()}) == 1
            assert tickets["lead"].ticket == tickets["mate"].ticket  # one ticket, whole
            starts = [await p.next_event(GameStarting) for p in players]
            for start in starts:
                assert await echo_once(game, start.ticket) == b"ECHO through the lobby"


async def test_cancel_floods_and_bad_entries_are_refused_with_a_code() -> None:
    async with cluster(1, match_rules=RULES) as c:
        async with echo.lobby.connect(c.names, member="a") as a:
            with pytest.raises(LobbyError) as refused:
                await a.cancel_queue()
            assert refused.value.code is ErrorCode.NOT_QUEUED
            with pytest.raises(LobbyError) as refused:
                await a.queue("duel", "eu", size=1)
            assert refused.value.code is ErrorCode.BAD_REQUEST
            with pytest.raises(LobbyError) as refused:
                await a.queue("duel", "eu", party=True)  # not in a lobby
            assert refused.value.code is ErrorCode.PARTY_INVALID
            codes = []
            for _ in range(12):
                try:
                    await a.queue("duel", "eu", size=3)
                    await a.cancel_queue()
                except LobbyError as error:
                    codes.append(error.code)
            assert ErrorCode.RATE_LIMITED in codes
            assert c.lobby[0].queues.counters["queue_rate_limited"] >= 1
            assert len(c.lobby[0].queues) <= 1  # and the server is still answering
            await a.create("still here", 2)


async def test_a_party_member_with_a_forged_seat_is_refused() -> None:
    async with cluster(2, match_rules=RULES) as c:
        async with echo.lobby.connect(c.names, member="x") as x:
            from echo.lobby.queue_wire import EnqueueMatch

            with pytest.raises(LobbyError) as refused:
                await x.request(EnqueueMatch(0, "duel", "eu", 1, 2, 12345, 2, b"forged"))
            assert refused.value.code is ErrorCode.PARTY_INVALID


async def test_a_queue_survives_the_loss_of_its_server() -> None:
    async with cluster(3, match_rules=RULES, liveness=1.0) as c:
        ring = c.lobby[0].ring
        home = queue_home(ring, "duel", "eu")
        async with echo.lobby.connect(c.names, member="early") as early:
            await early.queue("duel", "eu", skill=100, size=2)
            assert early.server == home
            c.kill(c.by_name(home))
            # Its client sends the entry again to the next home once the old one is silent.
            nxt = queue_home(ring, "duel", "eu", {home})
            await until(lambda: len(c.by_name(nxt).queues) == 1, timeout=20)
            async with echo.lobby.connect(c.names, member="late") as late:
                # (it tries the dead home first, finds it silent, walks on to the next)
                await late.queue("duel", "eu", skill=110, size=2)
                assert late.server == nxt
                m1 = await early.next_event(Matched)
                m2 = await late.next_event(Matched)
                assert m1.lobby_id == m2.lobby_id
                # it waited since its first entry: its priority was kept across the move
                assert m1.waited_ms > m2.waited_ms


async def test_a_party_that_does_not_gather_is_told() -> None:
    rules = MatchRules(party_wait=0.5)
    async with cluster(1, match_rules=rules) as c:
        async with (
            echo.lobby.connect(c.names, member="p") as p,
            echo.lobby.connect(c.names, member="q") as q,
        ):
            party = await p.create("party", 2)
            await q.join(party)
            # The party is its lobby as the owner's replica shows it: both seated.
            await p.wait_until(lambda c: c.replica is not None and len(c.replica.members) == 2)
            await p.queue("duel", "eu", size=2, party=True)
            left = await p.next_event(QueueLeft)
            assert "arrive" in left.reason and p.waiting is None


async def test_a_party_whose_lobby_lives_on_another_server_queues_with_its_seats() -> None:
    async with cluster(2, match_rules=RULES) as c:
        async with (
            echo.lobby.connect(c.names, member="lead") as lead,
            echo.lobby.connect(c.names, member="mate") as mate,
            echo.lobby.connect(c.names, member="solo") as solo,
        ):
            party = await lead.create("party", 2)
            await mate.join(party)
            # The leader queues the party as its own lobby shows it: both seated.
            await lead.wait_until(lambda c: c.replica is not None and len(c.replica.members) == 2)
            where = lead.server
            ring = c.lobby[0].ring
            region = next(
                r for r in (f"r{i}" for i in range(64)) if queue_home(ring, "trio", r) != where
            )
            for p in (lead, mate):
                await p.queue("trio", region, skill=10, size=3, party=True)
                assert p.server != where  # the queue's home, not the party's
            await solo.queue("trio", region, skill=12, size=3)
            matched = [await p.next_event(Matched) for p in (lead, mate, solo)]
            assert len({m.lobby_id for m in matched}) == 1
            for p in (lead, mate, solo):
                await p.wait_until(lambda c: c.lobby_id == matched[0].lobby_id)
                assert p.replica is not None and len(p.replica.members) == 3
            # A stranger cannot queue into that party: it holds no seat in it.
            async with echo.lobby.connect(c.names, member="stranger") as stranger:
                from echo.lobby.queue_wire import EnqueueMatch

                with pytest.raises(LobbyError) as refused:
                    await stranger.request(EnqueueMatch(0, "trio", region, 1, 3, party, 2))
                assert refused.value.code is ErrorCode.PARTY_INVALID
