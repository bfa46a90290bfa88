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

The parts: `echo.telemetry.truth` (the exact answers), `echo.telemetry.writer` (lines in time
order, bad copies, counts), `echo.telemetry.lobby_sim` (the lobbies); here the echo servers'
players, abusers and crowds.
"""

from __future__ import annotations

import datetime
import math
import os
import random
from collections import Counter
from collections.abc import Callable
from typing import Final

from echo.telemetry.bins import LIFETIME_EDGES_S, MESSAGE_EDGES, bin_index
from echo.telemetry.lobby_sim import LOBBY_SERVER_PREFIX, _lobby_lines
from echo.telemetry.schema import prefix_key, pseudonymise_ip
from echo.telemetry.truth import (
    _CONNECTED,
    _CREATED,
    _HELLO,
    _REJECTED,
    _US,
    GroundTruth,
    LobbyTruth,
)
from echo.telemetry.writer import UNKNOWN_EVENT, _Writer

EXPIRY_S: Final = 10.0
MAX_PER_IP: Final = 4
CLIENT_SERVER_ID: Final = "echo-client"

#: The names users import from here (the truth's and the writer's modules hold some).
__all__ = [
    "CLIENT_SERVER_ID",
    "EXPIRY_S",
    "LOBBY_SERVER_PREFIX",
    "MAX_PER_IP",
    "UNKNOWN_EVENT",
    "GroundTruth",
    "LobbyTruth",
    "generate",
]

def _public_v4(rng: random.Random) -> str:
    while True:
        a = rng.randrange(1, 224)
        if a not in (10, 100, 127, 169, 172, 192):  # keep clear of private and special ranges
            return f"{a}.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(1, 255)}"


def _v6_host(net: str, rng: random.Random) -> str:
    # four non-zero groups: the text is already in canonical (compressed, lower-case) form
    groups = ":".join(f"{rng.randrange(1, 0x10000):x}" for _ in range(4))
    return f"{net}:{groups}"



class _EchoSim:
    """The echo servers' part of a generated log: arrivals of players, garbage, abusers and
    server-full crowds, pushed to the writer, with the ground truth counted as they go."""

    def __init__(
        self, out: _Writer, rng: random.Random, anon: Callable[[str], str], servers: int,
        events: int,
    ) -> None:  # fmt: skip
        self.out = out
        self.rng = rng
        self.anon = anon
        self.server_ids = [f"echo-{i + 1}" for i in range(servers)]
        self.next_id = [0] * servers
        self.host = "echo.example.net"
        # Returning players: a pool, skewed so some play a lot (top-source tables have a head).
        self.pool: list[tuple[str, str]] = []
        for _ in range(max(200, events // 50)):
            if rng.random() < 0.8:
                ip = _public_v4(rng)
            else:
                net = f"2001:db8:{rng.randrange(1, 0x10000):x}:{rng.randrange(1, 0x10000):x}"
                ip = _v6_host(net, rng)
            self.pool.append((anon(ip), anon(prefix_key(ip))))
        self.abusers_v4 = [_public_v4(rng) for _ in range(6)]
        self.abuse_net = "2001:db8:bad:1"
        self.abuse_prefix = prefix_key(f"{self.abuse_net}::1")
        self.by_source: dict[str, list[int]] = {}
        self.by_prefix: dict[str, list[int]] = {}
        self.rejected: Counter[str] = Counter()
        self.closed: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        self.created = self.connected = self.expired = self.hellos = 0
        self.summaries = self.messages_total = 0
        self.life_hist = [0] * len(LIFETIME_EDGES_S)
        self.msg_hist = [0] * len(MESSAGE_EDGES)

    # ------------------------------------------------------------------ one event each

    def bump(self, ip: str, pfx: str, metric: int) -> None:
        self.by_source.setdefault(ip, [0, 0, 0])[metric] += 1
        if pfx != ip:
            self.by_prefix.setdefault(pfx, [0, 0, 0])[metric] += 1

    def hello(self, ts: int, sid: str, cs: int, ip: str, pfx: str) -> None:
        self.hellos += 1
        self.out.push(
            ts,
            sid,
            "hello_received",
            f',"client_session":{cs},"source_ip":"{ip}","source_prefix":"{pfx}"',
        )
        self.out.count_minute(ts, _HELLO)

    def reject(self, ts: int, sid: str, cs: int, ip: str, pfx: str, reason: str) -> None:
        self.rejected[reason] += 1
        self.bump(ip, pfx, 0)
        self.out.push(
            ts,
            sid,
            "hello_rejected",
            f',"client_session":{cs},"source_ip":"{ip}","source_prefix":"{pfx}","reason":"{reason}"',
        )
        self.out.count_minute(ts, _REJECTED)

    def create(self, ts: int, s: int, cs: int, ip: str, pfx: str) -> int:
        self.created += 1
        self.next_id[s] += 1
        did = self.next_id[s]
        port = 20000 + 2 * (did % 1000)
        self.bump(ip, pfx, 1)
        self.out.push(
            ts,
            self.server_ids[s],
            "duologue_created",
            f',"duologue_id":{did},"client_session":{cs},"source_ip":"{ip}","source_prefix":"{pfx}","data_port":{port},"control_port":{port + 1}',  # noqa: E501 (one JSON template per line reads best)
        )
        self.out.count_minute(ts, _CREATED)
        return did

    def close(
        self, ts: int, sid: str, did: int, ip: str, pfx: str, reason: str, life_us: int, msgs: int
    ) -> None:
        self.closed[reason] += 1
        lifetime = life_us / _US
        if reason != "expired":
            self.life_hist[bin_index(lifetime, LIFETIME_EDGES_S)] += 1
            self.msg_hist[bin_index(msgs, MESSAGE_EDGES)] += 1
            self.messages_total += msgs
        self.out.push(
            ts,
            sid,
            "duologue_closed",
            f',"duologue_id":{did},"source_ip":"{ip}","source_prefix":"{pfx}","reason":"{reason}","lifetime_s":{lifetime!r},"messages":{msgs}',
        )

    def expire(self, ts: int, sid: str, did: int, ip: str, pfx: str, age_us: int) -> None:
        self.expired += 1
        self.bump(ip, pfx, 2)
        self.out.push(
            ts,
            sid,
            "duologue_expired",
            f',"duologue_id":{did},"source_ip":"{ip}","source_prefix":"{pfx}","age_s":{age_us / _US!r}',  # noqa: E501 (one JSON template per line reads best)
        )
        self.close(ts + 1, sid, did, ip, pfx, "expired", age_us, 0)

    # ------------------------------------------------------------------ arrivals

    def start(self, t: int) -> None:
        for s, sid in enumerate(self.server_ids):
            self.out.push(
                t + s,
                sid,
                "server_started",
                f',"address":"0.0.0.0","port":40123,"control_port":40124,"clients_base_port":20000,"max_clients":1000,"max_per_ip":{MAX_PER_IP}',
            )

    def arrival(self, t: int) -> None:
        """What arrives at `t` on a random server."""
        rng = self.rng
        s = rng.randrange(len(self.server_ids))
        sid = self.server_ids[s]
        cs = rng.randrange(-(2**31), 2**31)
        r = rng.random()
        if r < 0.9735:  # a player
            self.player(t, s, cs)
        elif r < 0.9935:  # garbage instead of a HELLO
            ip, pfx = self.pool[rng.randrange(len(self.pool))]
            self.hello(t, sid, cs, ip, pfx)
            self.reject(t + 80, sid, cs, ip, pfx, "bad message")
        elif r < 0.9955:  # an abuser hammering the server
            self.abuser(t, s)
        elif r < 0.9983:  # a crowd arrives while the server is full
            self.crowd(t, sid)
        else:  # an event from a newer server version: valid, but unknown to schema v1
            self.out.push(t, sid, UNKNOWN_EVENT, ',"changed":["max_clients"]')

    def player(self, t: int, s: int, cs: int) -> None:
        """A returning player: HELLO, a duologue, a join (or never), a session, a close."""
        rng, out, sid = self.rng, self.out, self.server_ids[s]
        ip, pfx = self.pool[int(len(self.pool) * rng.random() ** 2)]
        self.hello(t, sid, cs, ip, pfx)
        did = self.create(t + rng.randrange(50, 400), s, cs, ip, pfx)
        t_c = t + 400
        if rng.random() < 0.06:  # never joins
            age = int((EXPIRY_S + rng.random() * 0.5) * _US)
            self.expire(t_c + age, sid, did, ip, pfx, age)
            return
        join = t_c + int(rng.lognormvariate(math.log(0.15), 0.7) * _US)
        self.connected += 1
        out.push(
            join,
            sid,
            "duologue_connected",
            f',"duologue_id":{did},"source_ip":"{ip}","source_port":{rng.randrange(1024, 65536)}',
        )
        out.count_minute(join, _CONNECTED)
        if rng.random() < 0.01:  # a stranger (or the NAT's second mapping) tries the duologue
            other = self.pool[rng.randrange(len(self.pool))][0]
            self.refused["wrong address"] += 1
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
        self.close(end, sid, did, ip, pfx, reason, end - t_c, msgs)
        if rng.random() < 0.25:
            self.client_summary(end, msgs, reason)

    def client_summary(self, end: int, msgs: int, reason: str) -> None:
        """The `client_summary` line `echo-client --events` writes at the end."""
        rng = self.rng
        self.summaries += 1
        if msgs and rng.random() < 0.97:
            p50 = rng.lognormvariate(math.log(25.0), 0.6)
            p90 = p50 * rng.uniform(1.2, 2.0)
            p99 = p90 * rng.uniform(1.1, 2.0)
            mx = p99 * rng.uniform(1.0, 3.0)
            rtt = f'"rtt_ms_p50":{p50:.3f},"rtt_ms_p90":{p90:.3f},"rtt_ms_p99":{p99:.3f},"rtt_ms_max":{mx:.3f},"state":"closed","error":null'  # noqa: E501 (one JSON template per line reads best)
        else:
            rtt = '"rtt_ms_p50":null,"rtt_ms_p90":null,"rtt_ms_p99":null,"rtt_ms_max":null,"state":"failed","error":"server timeout"'  # noqa: E501 (one JSON template per line reads best)
        self.out.push(
            end + 1500,
            CLIENT_SERVER_ID,
            "client_summary",
            f',"server":"{self.host}:40123","sent":{msgs + (reason != "client gone")},"received":{msgs},{rtt}',  # noqa: E501 (one JSON template per line reads best)
        )

    def abuser(self, t: int, s: int) -> None:
        """A burst of HELLOs from one IPv4 address, or from one IPv6 /64 with a fresh address
        each: the first `MAX_PER_IP` get duologues that expire, the rest are rejected."""
        rng, anon, sid = self.rng, self.anon, self.server_ids[s]
        v6 = rng.random() < 0.3
        ip4 = anon(rng.choice(self.abusers_v4))
        ts = t
        for i in range(rng.randrange(20, 200)):
            ts += rng.randrange(5_000, 50_000)
            cs = rng.randrange(-(2**31), 2**31)
            if v6:
                ip, pfx = anon(_v6_host(self.abuse_net, rng)), anon(self.abuse_prefix)
            else:
                ip, pfx = ip4, ip4
            self.hello(ts, sid, cs, ip, pfx)
            if i < MAX_PER_IP:
                did = self.create(ts + 100, s, cs, ip, pfx)
                age = int((EXPIRY_S + rng.random() * 0.5) * _US)
                self.expire(ts + 100 + age, sid, did, ip, pfx, age)
            else:
                why = "rate limited" if i >= 50 else "too many connections for IP address"
                self.reject(ts + 100, sid, cs, ip, pfx, why)

    def crowd(self, t: int, sid: str) -> None:
        rng = self.rng
        ts = t
        for _ in range(rng.randrange(10, 60)):
            ts += rng.randrange(10_000, 100_000)
            ip, pfx = self.pool[rng.randrange(len(self.pool))]
            cs = rng.randrange(-(2**31), 2**31)
            self.hello(ts, sid, cs, ip, pfx)
            self.reject(ts + 100, sid, cs, ip, pfx, "server full")

    def stop(self) -> None:
        # Every open duologue has its close queued, so stopping after the last one leaves none
        # open.
        out = self.out
        out.flush_until(2**63)
        for s, sid in enumerate(self.server_ids):
            out.push(
                out.echo_last_us + _US + s,
                sid,
                "server_stopped",
                ',"reason":"shutdown","duologues_open":0',
            )
        out.close()

    def truth(self, path: str, lobby_truth: LobbyTruth) -> GroundTruth:
        out = self.out
        return GroundTruth(
            path=path,
            lines_total=out.lines,
            bad_lines=out.bad,
            events_total=out.lines - out.bad,
            unknown_events=out.unknown,
            events_by_type=dict(sorted(out.by_type.items())),
            events_by_day=dict(sorted(out.by_day.items())),
            servers=sorted(self.server_ids + lobby_truth.servers),
            first_ts=out._ts(out.first_us or 0),
            last_ts=out._ts(out.last_us),
            hello_received=self.hellos,
            hello_rejected=dict(sorted(self.rejected.items())),
            duologues_created=self.created,
            duologues_connected=self.connected,
            duologues_expired=self.expired,
            duologues_closed=dict(sorted(self.closed.items())),
            image_refused=dict(sorted(self.refused.items())),
            client_summaries=self.summaries,
            lifetime_histogram=self.life_hist,
            message_histogram=self.msg_hist,
            messages_total=self.messages_total,
            by_source={k: (v[0], v[1], v[2]) for k, v in self.by_source.items()},
            by_prefix={k: (v[0], v[1], v[2]) for k, v in self.by_prefix.items()},
            per_minute={k: (v[0], v[1], v[2], v[3]) for k, v in out.per_minute.items()},
            lobbies=lobby_truth,
        )


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

    sim = _EchoSim(out, rng, anon, servers, events)
    lines_per_arrival = 4.6  # measured mean of the mixture below; only sets the time span
    mean_gap_us = days * 86400 * _US / max(1.0, events / lines_per_arrival)
    t = int(start.timestamp() * _US)
    day_us = 86400 * _US
    sim.start(t)
    t += _US
    while out.lines - out.lobby_lines + len(out.heap) < events:
        # Busier in the evening than at dawn: a sine over the day around the mean rate.
        phase = 2 * math.pi * (t % day_us) / day_us
        t += 1 + int(rng.expovariate(1.0) * mean_gap_us / (1.0 + 0.6 * math.sin(phase - 1.5)))
        out.flush_until(t - 1)
        sim.arrival(t)
    sim.stop()
    return sim.truth(os.fspath(path), lobby_truth)
