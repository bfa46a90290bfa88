"""The lobby part of a generated event log: N lobbies on the lobby servers, as `echo-lobby
--events` writes them (lobby_* events), each counted into the `LobbyTruth` from its own lines.
"""


from __future__ import annotations

import heapq
import math
import random
from collections.abc import Iterator
from typing import Any, Final

from echo.telemetry.truth import _US, LobbyTruth
from echo.telemetry.writer import _tail

LOBBY_SERVER_PREFIX: Final = "lobby-"


class _LobbySim:
    """N lobbies on the lobby servers, one at a time, each with every line it will write."""

    # As echo-lobby logs them: the request's message type and the ErrorCode's name.
    CREATE_REFUSALS: Final = ("RATE_LIMITED", "NAME_INVALID", "METADATA_LIMIT", "SERVER_FULL")
    JOIN_REFUSALS: Final = ("LOBBY_LOCKED", "BANNED", "PRIVATE_LOBBY", "ALREADY_IN_LOBBY")

    def __init__(
        self, rng: random.Random, truth: LobbyTruth, server_ids: list[str], members_from: int
    ) -> None:
        self.rng = rng
        self.truth = truth
        self.server_ids = server_ids
        self.next_member = members_from

    def member(self) -> str:
        self.next_member += 1
        return f"player-{self.next_member}"

    def lobby(self, t: int) -> list[tuple[int, str, str, dict[str, Any]]]:
        """Every line of one lobby arriving at `t` (µs), counted into the truth."""
        run = _Lobby(self, t)
        run.create()
        run.fill()
        run.rehome()
        run.chat()
        run.finish()
        self.truth.add_lobby(run.lines)
        return run.lines


class _Lobby:
    """One lobby's life, line by line: created, filled (with leavers and refusals), maybe
    re-created on the next server, chatted in, started or abandoned, emptied and deleted."""

    def __init__(self, sim: _LobbySim, t: int) -> None:
        self.sim = sim
        self.rng = sim.rng
        self.t = t
        self.lines: list[tuple[int, str, str, dict[str, Any]]] = []
        self.s = self.rng.randrange(len(sim.server_ids))
        self.lobby_id = 0
        self.cap = 0
        self.roster: list[str] = []

    def emit(self, ev: str, **fields: Any) -> None:
        self.lines.append((self.t, self.sim.server_ids[self.s], ev, fields))

    def step(self, median_s: float, sigma: float = 1.0) -> int:
        # Strictly increasing: the job's "first" of a lobby must never be a tie.
        return 1 + int(self.rng.lognormvariate(math.log(median_s), sigma) * _US)

    def refuse(self, member: str, request: str, code: str) -> None:
        self.t += 1
        self.emit("lobby_refused", member_id=member, request=request, code=code)

    def create(self) -> None:
        rng, sim = self.rng, self.sim
        if rng.random() < 0.03:
            self.refuse(sim.member(), "CreateLobby", rng.choice(sim.CREATE_REFUSALS))
            self.t += self.step(2.0)
        self.lobby_id = rng.getrandbits(63) | 1
        self.cap = rng.choice((2, 4, 4, 6, 8, 8, 8, 16))
        owner = sim.member()
        visibility = "public" if rng.random() < 0.85 else "private"
        self.roster = [owner]
        self.t += 1
        self.emit(
            "lobby_created",
            lobby_id=self.lobby_id,
            member_id=owner,
            max_members=self.cap,
            visibility=visibility,
        )
        # The server logs the creator's seat as a join of the lobby's first member.
        self.t += 1
        self.emit("lobby_joined", lobby_id=self.lobby_id, member_id=owner, members=1)

    def fill(self) -> None:
        rng, sim, roster, lobby_id = self.rng, self.sim, self.roster, self.lobby_id
        target = self.cap if rng.random() < 0.55 else rng.randint(1, self.cap)
        while len(roster) < target:
            self.t += self.step(4.0)
            if rng.random() < 0.04:
                self.refuse(sim.member(), "JoinLobby", rng.choice(sim.JOIN_REFUSALS))
                continue
            roster.append(sim.member())
            self.emit("lobby_joined", lobby_id=lobby_id, member_id=roster[-1], members=len(roster))
            if len(roster) >= 3 and rng.random() < 0.08:
                self.t += self.step(3.0)
                gone = roster.pop(rng.randrange(1, len(roster)))
                reason = rng.choices(("left", "kicked", "dropped", "banned"), (70, 10, 15, 5))[0]
                self.emit(
                    "lobby_left",
                    lobby_id=lobby_id,
                    member_id=gone,
                    members=len(roster),
                    reason=reason,
                )
        if len(roster) == self.cap and rng.random() < 0.3:
            self.t += self.step(2.0)
            self.refuse(sim.member(), "JoinLobby", "LOBBY_FULL")

    def rehome(self) -> None:
        rng, servers, roster = self.rng, len(self.sim.server_ids), self.roster
        if servers > 1 and len(roster) >= 2 and rng.random() < 0.03:
            # The home died: the members re-create the lobby on the next server of the ring
            # within the 5 s failover bound; the new home logs each of them as a join.
            self.t += 1 + int(rng.uniform(0.5, 4.0) * _US)
            self.s = (self.s + 1) % servers
            for i, m in enumerate(roster, start=1):
                self.t += 1 + rng.randrange(1_000, 200_000)
                self.emit("lobby_joined", lobby_id=self.lobby_id, member_id=m, members=i)

    def chat(self) -> None:
        rng, roster, lobby_id = self.rng, self.roster, self.lobby_id
        chats = int(rng.lognormvariate(math.log(4.0), 1.2)) if rng.random() < 0.8 else 0
        for _ in range(chats):
            self.t += self.step(2.0)
            self.emit(
                "lobby_chat",
                lobby_id=lobby_id,
                member_id=rng.choice(roster),
                bytes=rng.randint(1, 200),
            )
        if rng.random() < 0.02:  # a chat flood: the member's bucket runs dry
            flooder = rng.choice(roster)
            for _ in range(rng.randrange(10, 30)):
                self.t += rng.randrange(1_000, 20_000)
                self.emit("lobby_chat", lobby_id=lobby_id, member_id=flooder, bytes=200)
            for _ in range(rng.randrange(5, 50)):
                self.refuse(flooder, "SendChat", "RATE_LIMITED")

    def finish(self) -> None:
        rng, roster, lobby_id = self.rng, self.roster, self.lobby_id
        if len(roster) >= 2 and rng.random() < 0.7:
            if rng.random() < 0.05:
                self.refuse(roster[-1], "StartGame", "NOT_OWNER")
            if rng.random() < 0.1:
                self.refuse(roster[0], "StartGame", "NOT_READY")
            self.t += self.step(8.0, 0.8)
            self.emit(
                "lobby_started",
                lobby_id=lobby_id,
                members=len(roster),
                game_server=f"game-{rng.randrange(1, 4)}:40500",
            )
            reasons: tuple[tuple[str, ...], tuple[int, ...]] = (("left",), (1,))
        else:
            self.t += self.step(60.0)
            reasons = (("left", "dropped"), (80, 20))
        while roster:
            self.t += self.step(1.0)
            gone = roster.pop(rng.randrange(len(roster)))
            self.emit(
                "lobby_left",
                lobby_id=lobby_id,
                member_id=gone,
                members=len(roster),
                reason=rng.choices(*reasons)[0],
            )
        self.t += 1
        self.emit("lobby_deleted", lobby_id=lobby_id, reason="empty")


def _lobby_lines(
    rng: random.Random,
    truth: LobbyTruth,
    *,
    lobbies: int,
    servers: int,
    start_us: int,
    span_us: int,
) -> Iterator[tuple[int, str, str, str]]:
    """The lines of `lobbies` lobbies arriving over `span_us`, in time order (streaming)."""
    server_ids = [f"{LOBBY_SERVER_PREFIX}{i + 1}" for i in range(servers)]
    truth.servers = list(server_ids)
    sim = _LobbySim(rng, truth, server_ids, members_from=0)
    heap: list[tuple[int, int, str, str, str]] = []
    seq = 0

    def push(ts: int, sid: str, event: str, tail: str) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (ts, seq, sid, event, tail))

    for i, sid in enumerate(server_ids):
        push(
            start_us + i,
            sid,
            "lobby_server_started",
            ',"address":"0.0.0.0","port":40600,"control_port":40601',
        )
    mean_gap = span_us / lobbies
    arrival = start_us + _US
    made = 0
    last = start_us
    while made < lobbies or heap:
        # A lobby's lines all come after its arrival, and arrivals only grow: simulating the
        # next lobby once the heap's head is later than its arrival keeps the output sorted.
        while made < lobbies and (not heap or arrival <= heap[0][0]):
            for ts, sid, event, fields in sim.lobby(arrival):
                push(ts, sid, event, _tail(fields))
            made += 1
            arrival += 1 + int(rng.expovariate(1.0) * mean_gap)
        ts, _, sid, event, tail = heapq.heappop(heap)
        last = ts
        yield ts, sid, event, tail
    for i, sid in enumerate(server_ids):
        yield last + _US + i, sid, "lobby_server_stopped", ',"reason":"shutdown","lobbies_open":0'

