"""A seeded generator of realistic synthetic event logs, and the exact answers they must give.

What it simulates (all schema v1, in time order, as `echo-server --events` writes them):
- returning players from an address pool (80 % IPv4, 20 % IPv6 each in its own /64) who say
  HELLO, get a duologue, join it and echo for a log-normal lifetime, a quarter of them also
  writing the `client_summary` that `echo-client --events` produces;
- players whose duologue is never joined (NAT trouble, a crashed client): it expires;
- clients that send garbage ("bad message");
- abusers: bursts of HELLOs from a few IPv4 addresses and from one IPv6 /64 with a fresh
  address per HELLO; the first `MAX_PER_IP` get duologues that expire, the rest are rejected
  ("too many connections for IP address", later "rate limited");
- "server full" bursts; a few events of a type this job does not know (a newer server);
- bad lines mixed in: truncated lines, garbage, missing fields, wrong types, a future
  schema_version. Each bad line is an *extra* mangled copy of a good line, so the good events
  are exactly the simulated ones.

With `lobbies=N` it also simulates N lobbies on `lobby_servers` lobby servers, as `echo-lobby
--events` writes them (lobby_* events, see LobbyTruth): lobbies that fill and start, lobbies
that are abandoned, members who leave or drop, chat, refused requests, and (with more than one
lobby server) lobbies re-created on the next server after their home died. The lobby part has
its own random stream, so `lobbies=0` writes exactly the echo-server-only file it always did.

It streams: pending future events (closes, expiries) sit in a heap whose size follows the number
of open duologues, and the ground truth keeps counters, never the events. The address pool
grows with `events` (a fiftieth), which bounds the per-source counters.
"""

from __future__ import annotations

import datetime
import heapq
import json
import math
import os
import random
import re
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any, Final

import attrs

from echo.telemetry.bins import LIFETIME_EDGES_S, LOBBY_WAIT_EDGES_S, MESSAGE_EDGES, bin_index
from echo.telemetry.schema import SCHEMA_VERSION, prefix_key, pseudonymise_ip

EXPIRY_S: Final = 10.0
MAX_PER_IP: Final = 4
CLIENT_SERVER_ID: Final = "echo-client"
UNKNOWN_EVENT: Final = "config_reloaded"  # stands in for an event a newer server might add

_US: Final = 1_000_000
_HELLO, _REJECTED, _CREATED, _CONNECTED = range(4)
_SERIES: Final = ("hello_received", "hello_rejected", "duologue_created", "duologue_connected")


def _top(counts: dict[str, tuple[int, int, int]], metric: int, n: int) -> list[dict[str, Any]]:
    rows = [(key, c) for key, c in counts.items() if c[metric] > 0]
    rows.sort(key=lambda kc: (-kc[1][metric], kc[0]))
    return [
        {"source": key, "rejections": c[0], "duologues": c[1], "expiries": c[2]}
        for key, c in rows[:n]
    ]


LOBBY_SERVER_PREFIX: Final = "lobby-"


def _sorted_counts(counter: Counter[str] | Counter[int]) -> dict[str, int]:
    """A count dict with string keys (as JSON has them), numbers in numeric order."""
    keys = sorted(counter, key=lambda k: (isinstance(k, str), k))
    return {str(k): counter[k] for k in keys}  # type: ignore[index]


@attrs.define
class LobbyTruth:
    """Exact lobby counts of a generated log: the `lobbies` part of summary.json.

    The per-lobby numbers are computed from the lines written for that lobby, with the rules
    the Spark job documents (echo.telemetry.pipeline._lobbies), never from the simulation's
    intentions: a drift between the two definitions fails the exact-count tests.
    """

    servers: list[str] = attrs.field(factory=list)
    created: int = 0
    rehomed: int = 0
    joins: int = 0
    started: int = 0
    never_filled: int = 0
    left: Counter[str] = attrs.field(factory=Counter)
    deleted: Counter[str] = attrs.field(factory=Counter)
    capacity: Counter[int] = attrs.field(factory=Counter)
    peak: Counter[int] = attrs.field(factory=Counter)
    at_start: Counter[int] = attrs.field(factory=Counter)
    fill_s: list[float] = attrs.field(factory=list, repr=False)
    start_s: list[float] = attrs.field(factory=list, repr=False)
    chat_lines: int = 0
    chat_bytes: int = 0
    lobbies_with_chat: int = 0
    refused_by_code: Counter[str] = attrs.field(factory=Counter)
    refused_by_request: Counter[str] = attrs.field(factory=Counter)
    resumed: int = 0
    # lobby_matched: matches, and the members, tickets and at-once starts they carried
    matched: Counter[str] = attrs.field(factory=Counter)

    def add_lobby(self, lines: list[tuple[int, str, str, dict[str, Any]]]) -> None:
        """Count one lobby's lines (ts_us, server_id, event, fields), in time order."""
        created = [(ts, f) for ts, _, ev, f in lines if ev == "lobby_created"]
        assert created, "a simulated lobby always has its lobby_created"
        t0, first = created[0]
        cap = first["max_members"]
        self.created += 1
        self.rehomed += len({sid for _, sid, ev, _ in lines if ev != "lobby_refused"}) > 1
        self.capacity[cap] += 1
        sizes = [f["members"] for _, _, ev, f in lines if "members" in f]
        self.peak[max([1, *sizes])] += 1
        full = [ts for ts, _, ev, f in lines if ev == "lobby_joined" and f["members"] >= cap]
        starts = [(ts, f) for ts, _, ev, f in lines if ev == "lobby_started"]
        ends = ([full[0]] if full else []) + ([starts[0][0]] if starts else [])
        if ends:
            self.fill_s.append((min(ends) - t0) / _US)
        else:
            self.never_filled += 1
        if starts:
            self.started += 1
            self.start_s.append((starts[0][0] - t0) / _US)
            self.at_start[starts[0][1]["members"]] += 1
        chats = [f["bytes"] for _, _, ev, f in lines if ev == "lobby_chat"]
        self.chat_lines += len(chats)
        self.chat_bytes += sum(chats)
        self.lobbies_with_chat += bool(chats)
        for _, _, ev, f in lines:
            if ev == "lobby_joined":
                self.joins += 1
            elif ev == "lobby_left":
                self.left[f["reason"]] += 1
            elif ev == "lobby_deleted":
                self.deleted[f["reason"]] += 1
            elif ev == "lobby_refused":
                self.refused(f["request"], f["code"])
            elif ev == "lobby_resumed":
                self.resumed += 1
            elif ev == "lobby_matched":
                self.matched.update(
                    matches=1, members=f["members"], tickets=f["tickets"], started=f["started"]
                )

    def refused(self, request: str, code: str) -> None:
        self.refused_by_code[code] += 1
        self.refused_by_request[request] += 1

    def expected_summary(self) -> dict[str, Any]:
        """summary.json's `lobbies` for this log.

        Percentiles are nearest-rank (the smallest value with at least p of the values at or
        below it): what Spark's percentile_approx returns when its accuracy exceeds the count.
        """

        def waits(values: list[float]) -> dict[str, Any]:
            hist = [0] * len(LOBBY_WAIT_EDGES_S)
            for v in values:
                hist[bin_index(v, LOBBY_WAIT_EDGES_S)] += 1
            ranked = sorted(values)

            def rank(p: float) -> float | None:
                return ranked[max(0, math.ceil(p * len(ranked)) - 1)] if ranked else None

            return {
                "count": len(values),
                "edges": list(LOBBY_WAIT_EDGES_S),
                "histogram": hist,
                "p50": rank(0.5),
                "p90": rank(0.9),
                "p99": rank(0.99),
            }

        return {
            "servers": sorted(self.servers),
            "created": self.created,
            "rehomed": self.rehomed,
            "joins": self.joins,
            "started": self.started,
            "left": _sorted_counts(self.left),
            "deleted": _sorted_counts(self.deleted),
            "sizes": {
                "capacity": _sorted_counts(self.capacity),
                "peak": _sorted_counts(self.peak),
                "at_start": _sorted_counts(self.at_start),
            },
            "time_to_fill_s": {**waits(self.fill_s), "never": self.never_filled},
            "time_to_start_s": waits(self.start_s),
            "chat": {
                "lines": self.chat_lines,
                "bytes": self.chat_bytes,
                "lobbies_with_chat": self.lobbies_with_chat,
                "bytes_per_line": self.chat_bytes / self.chat_lines if self.chat_lines else None,
            },
            "refusals": {
                "total": sum(self.refused_by_code.values()),
                "by_code": _sorted_counts(self.refused_by_code),
                "by_request": _sorted_counts(self.refused_by_request),
            },
            "resumed": self.resumed,
            "matched": {k: self.matched[k] for k in ("matches", "members", "tickets", "started")},
        }


@attrs.frozen
class GroundTruth:
    """Exact counts of a generated log: what `echo-analyze` must report for it."""

    path: str
    lines_total: int
    bad_lines: int
    events_total: int
    unknown_events: int
    events_by_type: dict[str, int]
    events_by_day: dict[str, int]
    servers: list[str]
    first_ts: str
    last_ts: str
    hello_received: int
    hello_rejected: dict[str, int]
    duologues_created: int
    duologues_connected: int
    duologues_expired: int
    duologues_closed: dict[str, int]
    image_refused: dict[str, int]
    client_summaries: int
    lifetime_histogram: list[int]
    message_histogram: list[int]
    messages_total: int
    # source -> (rejections, duologues created, expiries); prefixes only for IPv6 networks
    by_source: dict[str, tuple[int, int, int]] = attrs.field(repr=False)
    by_prefix: dict[str, tuple[int, int, int]] = attrs.field(repr=False)
    per_minute: dict[int, tuple[int, int, int, int]] = attrs.field(repr=False)
    lobbies: LobbyTruth = attrs.field(factory=lambda: LobbyTruth(), repr=False)

    def top_sources(self, n: int = 20) -> dict[str, list[dict[str, Any]]]:
        return {
            "by_rejections": _top(self.by_source, 0, n),
            "by_duologues": _top(self.by_source, 1, n),
            "prefixes_by_rejections": _top(self.by_prefix, 0, n),
            "prefixes_by_duologues": _top(self.by_prefix, 1, n),
        }

    def connections_over_time(self, bucket_s: int) -> list[dict[str, Any]]:
        per_bucket: dict[int, list[int]] = {}
        for minute, counts in self.per_minute.items():
            start = minute * 60 // bucket_s * bucket_s
            acc = per_bucket.setdefault(start, [0, 0, 0, 0])
            for i, c in enumerate(counts):
                acc[i] += c
        return [
            {
                "t": datetime.datetime.fromtimestamp(start, datetime.UTC).strftime(
                    "%Y-%m-%dT%H:%M:%SZ"
                ),
                **dict(zip(_SERIES, per_bucket[start], strict=True)),
            }
            for start in sorted(per_bucket)
        ]

    def expected_summary(self, top_n: int = 20) -> dict[str, Any]:
        """The keys of summary.json this log determines exactly, with their values."""
        return {
            "lines_total": self.lines_total,
            "bad_lines": self.bad_lines,
            "events_total": self.events_total,
            "unknown_events": self.unknown_events,
            "events_by_type": self.events_by_type,
            "events_by_day": self.events_by_day,
            "servers": self.servers,
            "first_ts": self.first_ts,
            "last_ts": self.last_ts,
            "hello_received": self.hello_received,
            "hello_rejected": self.hello_rejected,
            "hello_rejected_total": sum(self.hello_rejected.values()),
            "duologues_created": self.duologues_created,
            "duologues_connected": self.duologues_connected,
            "duologues_expired": self.duologues_expired,
            "duologues_closed": self.duologues_closed,
            "image_refused": self.image_refused,
            "client_summaries": self.client_summaries,
            "top_sources": self.top_sources(top_n),
            "lobbies": self.lobbies.expected_summary(),
        }


class _Writer:
    """Heap of pending lines, the output file, the bad-line mangler and the truth counters."""

    def __init__(
        self,
        path: str,
        rng: random.Random,
        bad_rate: float,
        lobby_lines: Iterator[tuple[int, str, str, str]] | None = None,
        lobby_rng: random.Random | None = None,
    ) -> None:
        self.rng = rng
        # Lobby lines come time-ordered from their own simulation and are merged in as the
        # echo lines are written; their bad copies use their own random stream, so the echo
        # part of the file is the same with or without lobbies.
        self._lobby = lobby_lines
        self._lobby_next = next(lobby_lines, None) if lobby_lines is not None else None
        self.lobby_rng = lobby_rng or rng
        self.bad_rate = bad_rate
        self.out = open(path, "w", encoding="utf-8", buffering=1 << 20)
        self.heap: list[tuple[int, int, str, str, str]] = []
        self.seq = 0
        self.lines = 0
        self.bad = 0
        self.unknown = 0
        self.by_type: Counter[str] = Counter()
        self.by_day: Counter[str] = Counter()
        self.per_minute: dict[int, list[int]] = {}
        self.first_us: int | None = None
        self.last_us = 0
        self.echo_last_us = 0
        self.lobby_lines = 0  # lines (bad copies too) of the lobby part: `events` excludes them
        self._sec = -1
        self._sec_prefix = ""
        self._day_of: dict[int, str] = {}

    def push(self, ts_us: int, server_id: str, event: str, tail: str) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (ts_us, self.seq, server_id, event, tail))

    def flush_until(self, ts_us: int) -> None:
        heap = self.heap
        while heap and heap[0][0] <= ts_us:
            self._write(*heapq.heappop(heap))

    def _ts(self, ts_us: int) -> str:
        sec, us = divmod(ts_us, _US)
        if sec != self._sec:
            self._sec = sec
            self._sec_prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec))
        return f"{self._sec_prefix}.{us:06d}Z"

    def _drain_lobby(self, ts_us: int) -> None:
        while self._lobby_next is not None and self._lobby_next[0] <= ts_us:
            before = self.lines
            self._emit(*self._lobby_next, self.lobby_rng)
            self.lobby_lines += self.lines - before
            assert self._lobby is not None
            self._lobby_next = next(self._lobby, None)

    def _write(self, ts_us: int, _seq: int, server_id: str, event: str, tail: str) -> None:
        self._drain_lobby(ts_us)
        self._emit(ts_us, server_id, event, tail, self.rng)
        self.echo_last_us = ts_us

    def _emit(self, ts_us: int, server_id: str, event: str, tail: str, rng: random.Random) -> None:
        line = (
            f'{{"ts":"{self._ts(ts_us)}","server_id":"{server_id}","event":"{event}",'
            f'"schema_version":{SCHEMA_VERSION}{tail}}}\n'
        )
        self.out.write(line)
        self.lines += 1
        if self.first_us is None:
            self.first_us = ts_us
        self.last_us = ts_us
        self.by_type[event] += 1
        if event == UNKNOWN_EVENT:
            self.unknown += 1
        day_n = ts_us // (86400 * _US)
        day = self._day_of.get(day_n)
        if day is None:
            day = self._day_of[day_n] = time.strftime("%Y-%m-%d", time.gmtime(day_n * 86400))
        self.by_day[day] += 1
        if rng.random() < self.bad_rate:
            self.out.write(_mangle(line[:-1], rng) + "\n")
            self.lines += 1
            self.bad += 1

    def count_minute(self, ts_us: int, series: int) -> None:
        counts = self.per_minute.get(ts_us // (60 * _US))
        if counts is None:
            counts = self.per_minute[ts_us // (60 * _US)] = [0, 0, 0, 0]
        counts[series] += 1

    def close(self) -> None:
        self.flush_until(2**63)
        self._drain_lobby(2**63)
        self.out.close()


_INT_FIELD = re.compile(
    r'"(duologue_id|client_session|port|sent|messages|lobby_id|members|bytes)":(-?\d+)'
)
_STR_FIELD = re.compile(r'"(source_ip|reason|address|server|state|member_id|code)":"[^"]*"')


def _mangle(line: str, rng: random.Random) -> str:
    """A copy of a good line that schema v1 rejects, in one of the ways real logs go bad."""
    kind = rng.randrange(8)
    if kind == 0:  # a crash mid-write, or two writers interleaving
        return line[: rng.randrange(1, len(line) - 1)]
    if kind == 1:
        return rng.choice(("GET / HTTP/1.1", "\x00\x00\x00", "not json at all", "[1, 2, 3]", "42"))
    if kind == 2:
        return line.replace('"schema_version":1', '"schema_version":"1"')
    if kind == 3:
        return re.sub(r'"server_id":"[^"]*",', "", line)
    if kind == 4:
        return line.replace('"schema_version":1', '"schema_version":2')
    if kind == 5:
        return line.replace("T", " ", 1)  # a timestamp that is not RFC 3339
    if kind == 6 and _INT_FIELD.search(line):
        return _INT_FIELD.sub(lambda m: f'"{m[1]}":"{m[2]}"', line, count=1)
    if kind == 7 and _STR_FIELD.search(line):
        return _STR_FIELD.sub(lambda m: f'"{m[1]}":12345', line, count=1)
    return line.replace('"event":', '"evnt":')  # missing event name


def _tail(fields: dict[str, Any]) -> str:
    return "".join(f',"{k}":{json.dumps(v)}' for k, v in fields.items())


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
        rng = self.rng
        lines: list[tuple[int, str, str, dict[str, Any]]] = []
        s = rng.randrange(len(self.server_ids))

        def emit(ev: str, **fields: Any) -> None:
            lines.append((t, self.server_ids[s], ev, fields))

        def step(median_s: float, sigma: float = 1.0) -> int:
            # Strictly increasing: the job's "first" of a lobby must never be a tie.
            return 1 + int(rng.lognormvariate(math.log(median_s), sigma) * _US)

        def refuse(member: str, request: str, code: str) -> None:
            nonlocal t
            t += 1
            emit("lobby_refused", member_id=member, request=request, code=code)

        if rng.random() < 0.03:
            refuse(self.member(), "CreateLobby", rng.choice(self.CREATE_REFUSALS))
            t += step(2.0)
        lobby_id = rng.getrandbits(63) | 1
        cap = rng.choice((2, 4, 4, 6, 8, 8, 8, 16))
        owner = self.member()
        visibility = "public" if rng.random() < 0.85 else "private"
        roster = [owner]
        t += 1
        emit(
            "lobby_created",
            lobby_id=lobby_id,
            member_id=owner,
            max_members=cap,
            visibility=visibility,
        )
        # The server logs the creator's seat as a join of the lobby's first member.
        t += 1
        emit("lobby_joined", lobby_id=lobby_id, member_id=owner, members=1)
        target = cap if rng.random() < 0.55 else rng.randint(1, cap)
        while len(roster) < target:
            t += step(4.0)
            if rng.random() < 0.04:
                refuse(self.member(), "JoinLobby", rng.choice(self.JOIN_REFUSALS))
                continue
            roster.append(self.member())
            emit("lobby_joined", lobby_id=lobby_id, member_id=roster[-1], members=len(roster))
            if len(roster) >= 3 and rng.random() < 0.08:
                t += step(3.0)
                gone = roster.pop(rng.randrange(1, len(roster)))
                reason = rng.choices(("left", "kicked", "dropped", "banned"), (70, 10, 15, 5))[0]
                emit(
                    "lobby_left",
                    lobby_id=lobby_id,
                    member_id=gone,
                    members=len(roster),
                    reason=reason,
                )
        if len(roster) == cap and rng.random() < 0.3:
            t += step(2.0)
            refuse(self.member(), "JoinLobby", "LOBBY_FULL")
        if len(self.server_ids) > 1 and len(roster) >= 2 and rng.random() < 0.03:
            # The home died: the members re-create the lobby on the next server of the ring
            # within the 5 s failover bound; the new home logs each of them as a join.
            t += 1 + int(rng.uniform(0.5, 4.0) * _US)
            s = (s + 1) % len(self.server_ids)
            for i, m in enumerate(roster, start=1):
                t += 1 + rng.randrange(1_000, 200_000)
                emit("lobby_joined", lobby_id=lobby_id, member_id=m, members=i)
        chats = int(rng.lognormvariate(math.log(4.0), 1.2)) if rng.random() < 0.8 else 0
        for _ in range(chats):
            t += step(2.0)
            emit(
                "lobby_chat",
                lobby_id=lobby_id,
                member_id=rng.choice(roster),
                bytes=rng.randint(1, 200),
            )
        if rng.random() < 0.02:  # a chat flood: the member's bucket runs dry
            flooder = rng.choice(roster)
            for _ in range(rng.randrange(10, 30)):
                t += rng.randrange(1_000, 20_000)
                emit("lobby_chat", lobby_id=lobby_id, member_id=flooder, bytes=200)
            for _ in range(rng.randrange(5, 50)):
                refuse(flooder, "SendChat", "RATE_LIMITED")
        if len(roster) >= 2 and rng.random() < 0.7:
            if rng.random() < 0.05:
                refuse(roster[-1], "StartGame", "NOT_OWNER")
            if rng.random() < 0.1:
                refuse(roster[0], "StartGame", "NOT_READY")
            t += step(8.0, 0.8)
            emit(
                "lobby_started",
                lobby_id=lobby_id,
                members=len(roster),
                game_server=f"game-{rng.randrange(1, 4)}:40500",
            )
            reasons: tuple[tuple[str, ...], tuple[int, ...]] = (("left",), (1,))
        else:
            t += step(60.0)
            reasons = (("left", "dropped"), (80, 20))
        while roster:
            t += step(1.0)
            gone = roster.pop(rng.randrange(len(roster)))
            emit(
                "lobby_left",
                lobby_id=lobby_id,
                member_id=gone,
                members=len(roster),
                reason=rng.choices(*reasons)[0],
            )
        t += 1
        emit("lobby_deleted", lobby_id=lobby_id, reason="empty")
        self.truth.add_lobby(lines)
        return lines


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


def _public_v4(rng: random.Random) -> str:
    while True:
        a = rng.randrange(1, 224)
        if a not in (10, 100, 127, 169, 172, 192):  # keep clear of private and special ranges
            return f"{a}.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(1, 255)}"


def _v6_host(net: str, rng: random.Random) -> str:
    # four non-zero groups: the text is already in canonical (compressed, lower-case) form
    groups = ":".join(f"{rng.randrange(1, 0x10000):x}" for _ in range(4))
    return f"{net}:{groups}"


def generate(
    path: str | os.PathLike[str],
    *,
    events: int,
    seed: int,
    servers: int = 1,
    start: datetime.datetime = datetime.datetime(2026, 11, 20, tzinfo=datetime.UTC),
    days: int = 2,
    bad_rate: float = 0.002,
    ip_salt: bytes | None = None,
    lobbies: int = 0,
    lobby_servers: int = 1,
) -> GroundTruth:
    """Write about `events` lines (a few more: open sessions are closed at the end) to `path`.

    `events` counts the echo-server lines; `lobbies` > 0 adds the lines of that many lobbies on
    `lobby_servers` servers over the same days. Same arguments, same file, byte for byte.
    Returns the exact counts the job must report.
    """
    if events < 1 or servers < 1 or days < 1 or lobby_servers < 1 or lobbies < 0:
        raise ValueError("events, servers, days and lobby_servers must be positive")
    if start.tzinfo is None:
        raise ValueError("start must be timezone-aware (UTC)")
    rng = random.Random(seed)
    lobby_truth = LobbyTruth()
    lobby_rng = random.Random(f"lobbies-{seed}")
    lobby_lines = (
        _lobby_lines(
            lobby_rng,
            lobby_truth,
            lobbies=lobbies,
            servers=lobby_servers,
            start_us=int(start.timestamp() * _US),
            span_us=days * 86400 * _US,
        )
        if lobbies
        else None
    )
    out = _Writer(os.fspath(path), rng, bad_rate, lobby_lines, lobby_rng)
    anon = (lambda ip: pseudonymise_ip(ip, ip_salt)) if ip_salt is not None else (lambda ip: ip)

    server_ids = [f"echo-{i + 1}" for i in range(servers)]
    next_id = [0] * servers
    host = "echo.example.net"

    # Returning players: a pool, skewed so some play a lot (top-source tables have a head).
    pool: list[tuple[str, str]] = []
    for _ in range(max(200, events // 50)):
        if rng.random() < 0.8:
            ip = _public_v4(rng)
        else:
            net = f"2001:db8:{rng.randrange(1, 0x10000):x}:{rng.randrange(1, 0x10000):x}"
            ip = _v6_host(net, rng)
        pool.append((anon(ip), anon(prefix_key(ip))))
    abusers_v4 = [_public_v4(rng) for _ in range(6)]
    abuse_net = "2001:db8:bad:1"
    abuse_prefix = prefix_key(f"{abuse_net}::1")

    lines_per_arrival = 4.6  # measured mean of the mixture below; only sets the time span
    mean_gap_us = days * 86400 * _US / max(1.0, events / lines_per_arrival)
    t = int(start.timestamp() * _US)
    day_us = 86400 * _US

    by_source: dict[str, list[int]] = {}
    by_prefix: dict[str, list[int]] = {}
    rejected: Counter[str] = Counter()
    closed: Counter[str] = Counter()
    refused: Counter[str] = Counter()
    created = connected = expired = hellos = summaries = messages_total = 0
    life_hist = [0] * len(LIFETIME_EDGES_S)
    msg_hist = [0] * len(MESSAGE_EDGES)

    def bump(ip: str, pfx: str, metric: int) -> None:
        by_source.setdefault(ip, [0, 0, 0])[metric] += 1
        if pfx != ip:
            by_prefix.setdefault(pfx, [0, 0, 0])[metric] += 1

    def hello(ts: int, sid: str, cs: int, ip: str, pfx: str) -> None:
        nonlocal hellos
        hellos += 1
        out.push(
            ts,
            sid,
            "hello_received",
            f',"client_session":{cs},"source_ip":"{ip}","source_prefix":"{pfx}"',
        )
        out.count_minute(ts, _HELLO)

    def reject(ts: int, sid: str, cs: int, ip: str, pfx: str, reason: str) -> None:
        rejected[reason] += 1
        bump(ip, pfx, 0)
        out.push(
            ts,
            sid,
            "hello_rejected",
            f',"client_session":{cs},"source_ip":"{ip}","source_prefix":"{pfx}","reason":"{reason}"',
        )
        out.count_minute(ts, _REJECTED)

    def create(ts: int, s: int, cs: int, ip: str, pfx: str) -> int:
        nonlocal created
        created += 1
        next_id[s] += 1
        did = next_id[s]
        port = 20000 + 2 * (did % 1000)
        bump(ip, pfx, 1)
        out.push(
            ts,
            server_ids[s],
            "duologue_created",
            f',"duologue_id":{did},"client_session":{cs},"source_ip":"{ip}","source_prefix":"{pfx}","data_port":{port},"control_port":{port + 1}',  # noqa: E501 (one JSON template per line reads best)
        )
        out.count_minute(ts, _CREATED)
        return did

    def close(
        ts: int, sid: str, did: int, ip: str, pfx: str, reason: str, life_us: int, msgs: int
    ) -> None:
        nonlocal messages_total
        closed[reason] += 1
        lifetime = life_us / _US
        if reason != "expired":
            life_hist[bin_index(lifetime, LIFETIME_EDGES_S)] += 1
            msg_hist[bin_index(msgs, MESSAGE_EDGES)] += 1
            messages_total += msgs
        out.push(
            ts,
            sid,
            "duologue_closed",
            f',"duologue_id":{did},"source_ip":"{ip}","source_prefix":"{pfx}","reason":"{reason}","lifetime_s":{lifetime!r},"messages":{msgs}',
        )

    def expire(ts: int, sid: str, did: int, ip: str, pfx: str, age_us: int) -> None:
        nonlocal expired
        expired += 1
        bump(ip, pfx, 2)
        out.push(
            ts,
            sid,
            "duologue_expired",
            f',"duologue_id":{did},"source_ip":"{ip}","source_prefix":"{pfx}","age_s":{age_us / _US!r}',  # noqa: E501 (one JSON template per line reads best)
        )
        close(ts + 1, sid, did, ip, pfx, "expired", age_us, 0)

    for s, sid in enumerate(server_ids):
        out.push(
            t + s,
            sid,
            "server_started",
            f',"address":"0.0.0.0","port":40123,"control_port":40124,"clients_base_port":20000,"max_clients":1000,"max_per_ip":{MAX_PER_IP}',
        )
    t += _US

    while out.lines - out.lobby_lines + len(out.heap) < events:
        # Busier in the evening than at dawn: a sine over the day around the mean rate.
        phase = 2 * math.pi * (t % day_us) / day_us
        t += 1 + int(rng.expovariate(1.0) * mean_gap_us / (1.0 + 0.6 * math.sin(phase - 1.5)))
        out.flush_until(t - 1)
        s = rng.randrange(servers)
        sid = server_ids[s]
        cs = rng.randrange(-(2**31), 2**31)
        r = rng.random()
        if r < 0.9735:  # a player
            ip, pfx = pool[int(len(pool) * rng.random() ** 2)]
            hello(t, sid, cs, ip, pfx)
            did = create(t + rng.randrange(50, 400), s, cs, ip, pfx)
            t_c = t + 400
            if rng.random() < 0.06:  # never joins
                age = int((EXPIRY_S + rng.random() * 0.5) * _US)
                expire(t_c + age, sid, did, ip, pfx, age)
                continue
            join = t_c + int(rng.lognormvariate(math.log(0.15), 0.7) * _US)
            connected += 1
            out.push(
                join,
                sid,
                "duologue_connected",
                f',"duologue_id":{did},"source_ip":"{ip}","source_port":{rng.randrange(1024, 65536)}',  # noqa: E501 (one JSON template per line reads best)
            )
            out.count_minute(join, _CONNECTED)
            if rng.random() < 0.01:  # a stranger (or the NAT's second mapping) tries the duologue
                other = pool[rng.randrange(len(pool))][0]
                refused["wrong address"] += 1
                out.push(
                    join + 2000,
                    sid,
                    "image_refused",
                    f',"duologue_id":{did},"source_ip":"{other}","reason":"wrong address"',
                )
            life = min(6 * 3600.0, rng.lognormvariate(math.log(45.0), 1.3))
            end = join + int(life * _US)
            rate = rng.lognormvariate(math.log(5.0), 0.8) if rng.random() < 0.97 else 0.0
            msgs = int(life * rate)
            reason = rng.choices(("client gone", "send failed", "bad message"), (93, 3, 4))[0]
            close(end, sid, did, ip, pfx, reason, end - t_c, msgs)
            if rng.random() < 0.25:
                summaries += 1
                if msgs and rng.random() < 0.97:
                    p50 = rng.lognormvariate(math.log(25.0), 0.6)
                    p90 = p50 * rng.uniform(1.2, 2.0)
                    p99 = p90 * rng.uniform(1.1, 2.0)
                    mx = p99 * rng.uniform(1.0, 3.0)
                    rtt = f'"rtt_ms_p50":{p50:.3f},"rtt_ms_p90":{p90:.3f},"rtt_ms_p99":{p99:.3f},"rtt_ms_max":{mx:.3f},"state":"closed","error":null'  # noqa: E501 (one JSON template per line reads best)
                else:
                    rtt = '"rtt_ms_p50":null,"rtt_ms_p90":null,"rtt_ms_p99":null,"rtt_ms_max":null,"state":"failed","error":"server timeout"'  # noqa: E501 (one JSON template per line reads best)
                out.push(
                    end + 1500,
                    CLIENT_SERVER_ID,
                    "client_summary",
                    f',"server":"{host}:40123","sent":{msgs + (reason != "client gone")},"received":{msgs},{rtt}',  # noqa: E501 (one JSON template per line reads best)
                )
        elif r < 0.9935:  # garbage instead of a HELLO
            ip, pfx = pool[rng.randrange(len(pool))]
            hello(t, sid, cs, ip, pfx)
            reject(t + 80, sid, cs, ip, pfx, "bad message")
        elif r < 0.9955:  # an abuser hammering the server
            v6 = rng.random() < 0.3
            ip4 = anon(rng.choice(abusers_v4))
            ts = t
            for i in range(rng.randrange(20, 200)):
                ts += rng.randrange(5_000, 50_000)
                cs = rng.randrange(-(2**31), 2**31)
                ip, pfx = (anon(_v6_host(abuse_net, rng)), anon(abuse_prefix)) if v6 else (ip4, ip4)
                hello(ts, sid, cs, ip, pfx)
                if i < MAX_PER_IP:
                    did = create(ts + 100, s, cs, ip, pfx)
                    age = int((EXPIRY_S + rng.random() * 0.5) * _US)
                    expire(ts + 100 + age, sid, did, ip, pfx, age)
                else:
                    why = "rate limited" if i >= 50 else "too many connections for IP address"
                    reject(ts + 100, sid, cs, ip, pfx, why)
        elif r < 0.9983:  # a crowd arrives while the server is full
            ts = t
            for _ in range(rng.randrange(10, 60)):
                ts += rng.randrange(10_000, 100_000)
                ip, pfx = pool[rng.randrange(len(pool))]
                cs = rng.randrange(-(2**31), 2**31)
                hello(ts, sid, cs, ip, pfx)
                reject(ts + 100, sid, cs, ip, pfx, "server full")
        else:  # an event from a newer server version: valid, but unknown to schema v1
            out.push(t, sid, UNKNOWN_EVENT, ',"changed":["max_clients"]')

    # Every open duologue has its close queued, so stopping after the last one leaves none open.
    out.flush_until(2**63)
    for s, sid in enumerate(server_ids):
        out.push(
            out.echo_last_us + _US + s,
            sid,
            "server_stopped",
            ',"reason":"shutdown","duologues_open":0',
        )
    out.close()

    def iso(us: int) -> str:
        return out._ts(us)

    return GroundTruth(
        path=os.fspath(path),
        lines_total=out.lines,
        bad_lines=out.bad,
        events_total=out.lines - out.bad,
        unknown_events=out.unknown,
        events_by_type=dict(sorted(out.by_type.items())),
        events_by_day=dict(sorted(out.by_day.items())),
        servers=sorted(server_ids + lobby_truth.servers),
        first_ts=iso(out.first_us or 0),
        last_ts=iso(out.last_us),
        hello_received=hellos,
        hello_rejected=dict(sorted(rejected.items())),
        duologues_created=created,
        duologues_connected=connected,
        duologues_expired=expired,
        duologues_closed=dict(sorted(closed.items())),
        image_refused=dict(sorted(refused.items())),
        client_summaries=summaries,
        lifetime_histogram=life_hist,
        message_histogram=msg_hist,
        messages_total=messages_total,
        by_source={k: (v[0], v[1], v[2]) for k, v in by_source.items()},
        by_prefix={k: (v[0], v[1], v[2]) for k, v in by_prefix.items()},
        per_minute={k: (v[0], v[1], v[2], v[3]) for k, v in out.per_minute.items()},
        lobbies=lobby_truth,
    )
