"""The lobby server's timers and topics: seats expiring, the matchmaker's rounds, listings
published and other servers' listings, game servers' announcements and results taken in;
and the game server's side of the games and results topics.

Driver: trio, sessions and the clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import structlog
import trio

from echo.lobby.games import (
    GameServerAnnouncement,
    encode_announcement,
    parse_announcement_untrusted,
)
from echo.lobby.listings import (
    encode_listing_record,
    parse_listing_record_untrusted,
)
from echo.lobby.protocol import (
    LobbyProtocolError,
)
from echo.lobby.queues import Seated
from echo.lobby.results import GameResult, sign_result, verify_result
from echo.lobby.server.config import (
    GAMES_TOPIC,
    RESULTS_TOPIC,
)
from echo.lobby.server.sessions import (
    _Sessions,
)
from echo.tickets import TicketKey

log = structlog.get_logger("echo.lobby")


class _Replication(_Sessions):
    """The expiry and match loops, and the topics."""

    async def _expiry_loop(self) -> None:
        while True:
            deadline = self.registry.next_deadline()
            self._wake_expiry = trio.Event()
            with trio.move_on_at(deadline if deadline is not None else math.inf):
                await self._wake_expiry.wait()
            now = trio.current_time()
            if deadline is not None and now >= deadline:
                self._deliver(self.registry.expire(now))

    async def _match_loop(self) -> None:
        """Match the queues when an entry arrives, and every `match_interval` while any
        wait (their windows widen with time); seat each match (`QueueDesk.tick`)."""
        while True:
            wait = self.config.match_interval if len(self.queues) else math.inf
            with trio.move_on_after(wait):
                await self._wake_match.wait()
            self._wake_match = trio.Event()
            seated, sends = self.queues.tick(trio.current_time())
            for done in seated:
                self._note_match(done)
            self._deliver(sends)

    def _note_match(self, done: Seated) -> None:
        """Bind each seat to its session; the events of a lobby created and joined (as for
        any lobby: the event log's lobbies stay whole), then `lobby_matched`."""
        members = done.match.members
        self._emit("lobby_created", lobby_id=done.lobby_id, member_id=members[0],
                   max_members=len(members), visibility="private")
        for count, member_id in enumerate(members, 1):
            conn = self.conns.get(member_id)
            secret = b"" if conn is None else conn.secret
            self.bindings.bind(member_id, done.lobby_id, secret)
            self._emit("lobby_joined", lobby_id=done.lobby_id, member_id=member_id, members=count)
        self._emit("lobby_matched", lobby_id=done.lobby_id, members=len(members),
                   tickets=len(done.match.tickets), started=int(done.started))
        if done.started:
            self._emit("lobby_started", lobby_id=done.lobby_id, members=len(members),
                       game_server=done.game_server)

    # ------------------------------------------------------------------ topics

    async def _topics_loop(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        from echo.topics import ClientConfig, open_topic_client

        config = self.config
        k = max(1, min(config.topic_k, len(config.topics)))
        client_config = ClientConfig(k=k, max_datagram=8192)
        async with open_topic_client(list(config.topics), client_config) as client:
            self.topic_client = client
            client.subscribe(config.listings_topic, config.games_topic, config.results_topic)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._publish_listings)
                task_status.started()
                async for message in client.messages():
                    self._on_topic(message.topic.decode("utf-8", "replace"), message.data)

    def _on_topic(self, topic: str, data: bytes) -> None:
        now = trio.current_time()
        try:
            if topic == self.config.listings_topic:
                self.board.apply(parse_listing_record_untrusted(data), now)
            elif topic == self.config.games_topic:
                self.games.announce(parse_announcement_untrusted(data), now)
            elif topic == self.config.results_topic:
                self._on_result(data)
        except LobbyProtocolError:
            self.counters["bad_topic_records"] += 1

    def _on_result(self, data: bytes) -> None:
        """A game server's result: believed only under one of our ticket keys. Every lobby
        server hears it (the results topic): the lobby's home ends the game; the others hold
        it a while (`LobbyConfig.result_hold`), since the home may have died and the
        lobby's members be re-creating it here with its game (`echo.lobby.gameloop`)."""
        verdict = verify_result(data, self._result_keys)
        if isinstance(verdict, str):
            self.counters["game_results_refused"] += 1
            self._emit("game_result_refused", reason=verdict)
            log.info("game_result_refused", reason=verdict)
            return
        outcome, sends = self.registry.game_result(
            verdict.lobby_id, verdict.match_id, verdict.server_id, verdict.result,
            trio.current_time(),
        )
        if outcome == "ended":
            self._emit(
                "game_ended",
                lobby_id=verdict.lobby_id,
                match_id=verdict.match_id,
                game_server=verdict.server_id,
            )
            self._deliver(sends)

    def _publish(self, record: Any) -> None:
        try:
            self.topic_client.publish(self.config.listings_topic, encode_listing_record(record))
            self.counters["listings_published"] += 1
        except (LobbyProtocolError, ValueError):
            self.counters["listings_unpublishable"] += 1

    def _publish_gone(self, lobby_id: int) -> None:
        from echo.lobby.listings import ListingGone

        self._publish(ListingGone(lobby_id, self.server_id))

    async def _publish_listings(self) -> None:
        """Changes as they happen (every `listing_interval`), everything every ttl/3: soft
        state that a restarted or new server learns within one refresh."""
        config = self.config
        refresh_every = config.listing_ttl / 3
        next_refresh = trio.current_time()
        while True:
            now = trio.current_time()
            if self._listings_dirty or now >= next_refresh:
                self._listings_dirty = False
                changed, gone = self.registry.listing_changes()
                if now >= next_refresh:
                    changed = self.registry.listings()
                    next_refresh = now + refresh_every
                for record in [*changed, *gone]:
                    self._publish(record)
            self.board.expire(now)
            await trio.sleep(config.listing_interval)


async def announce_game_server(
    topic_client: Any,
    announcement: Callable[[], GameServerAnnouncement],
    *,
    topic: str = GAMES_TOPIC,
    interval: float = 1.0,
) -> None:
    """A game server's side of the games topic: announce itself and its free slots every
    `interval` seconds (soft state: lobby servers forget it `game_ttl` after the last one).

    `topic_client`: an open `echo.topics` client (`open_topic_client(["host:port"])`);
    `announcement`: a function returning the `GameServerAnnouncement` to publish, asked each
    time, so the free slots can follow the server's load; `topic`: the lobby servers' games
    topic (`LobbyServerConfig.games_topic`). Runs until cancelled. For example::

        def announcement() -> GameServerAnnouncement:
            return GameServerAnnouncement(
                server_id="10.0.0.5:9100",       # what this server's tickets must name
                address="10.0.0.5:9100",         # its data port, where players connect
                free_slots=64 - len(server.duologues),
                control_port=9101,
                duologue_ports="shared",         # its ServerConfig.duologue_ports
                tags={"region": "eu", "mode": "ctf", "version": "3"},
            )

        nursery.start_soon(announce_game_server, topics, announcement)
    """
    while True:
        topic_client.publish(topic, encode_announcement(announcement()))
        await trio.sleep(interval)


async def report_game_result(
    topic_client: Any,
    key: TicketKey,
    result: GameResult,
    *,
    topic: str = RESULTS_TOPIC,
    repeats: int = 5,
    interval: float = 0.2,
) -> None:
    """A game server's side of the results topic: publish `result`, signed with `key` (the
    first key of its ticket key file), `repeats` times `interval` apart: topic records are
    datagrams, and the lobby applies a result once and ignores its repeats. Every lobby
    server hears it, so it reaches the lobby wherever it is, also re-created on another
    server after its home died (one that does not hold the lobby yet keeps the result a
    while for it). Raises `echo.lobby.results.ResultError` for a result that does not fit."""
    record = sign_result(key, result)
    for i in range(repeats):
        if i:
            await trio.sleep(interval)
        topic_client.publish(topic, record)
