"""M1 over the network (`python -m bench.matchmaker_bench --net`): the same players queued on
one real `echo-lobby` process by bot processes over UDP, through the lobby client library.

The server is started as L1 starts it (`bench.procs`). Each bot process (this module's `bot`
role) holds its share of the players as lobby client sessions on one shared transport, as
L1's bots do, and speaks to the driver by lines (JSON out, commands in):

1. connect: every player opens its session (`echo.lobby.connect`), `--connect-concurrency`
   at a time per bot process, then waits. Timed on its own: not part of the figures below.
2. idle: a few seconds with every session open and nobody queued; the server's CPU then is
   the cost of holding the sessions, which the queueing phase pays too.
3. queue: every player queues (`LobbyClient.queue`, mode/region/skill/size of the in-process
   run's entries), `--queue-concurrency` requests in flight per bot process (each player
   queues once: the server takes them as fast as it answers), and waits for its `Matched`
   and the match's lobby (its snapshot: seated). Its time in queue is measured at the client:
   from its EnqueueMatch sent to its seat in the match's lobby.

Figures: matches/s and players/s over the wave (first enqueue sent to the last match seated
of those seated by the last `Queued` reply plus one match interval), as the in-process run
counts the matches formed while the entries arrive; the few matched later, as their windows
widen, count in the time in queue and in the players matched, and `all seated s` says when
the last one was. The server's CPU (utime+stime from /proc, sampled every 50 ms) over the
wave, per 1,000 players. Every match is checked to hold exactly its size of players.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import procs

MATCH_INTERVAL = 0.25  # (LobbyServerConfig.match_interval: what echo-lobby runs with)
#: A duologue holds two UDP ports on the server (--max-clients' help), bound when it starts.
FDS_PER_SESSION = 2
SPARE_SESSIONS = 32


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile (p in 0..100), the in-process run's."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


class CpuSampler:
    """A process's CPU seconds sampled every `period` by a thread, so that the CPU of a span
    known only afterwards (the wave, from the bots' clocks) can be read."""

    def __init__(self, pid: int, period: float = 0.05) -> None:
        self.pid, self.period = pid, period
        self.samples: list[tuple[float, float]] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.is_set():
            try:
                self.samples.append((time.time(), procs.cpu_seconds(self.pid)))
            except OSError:
                return
            self._done.wait(self.period)

    def stop(self) -> None:
        self._done.set()
        self._thread.join()

    def at(self, when: float) -> float:
        """CPU seconds at wall time `when` (the first sample at or after it, else the last)."""
        for t, cpu in self.samples:
            if t >= when:
                return cpu
        return self.samples[-1][1]

    def between(self, t0: float, t1: float) -> float:
        return self.at(t1) - self.at(t0)


def fd_room() -> str | None:
    """What this machine's open-file limit allows one server (None if it reads nothing)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return None
    return (
        f"open files: soft {soft}, hard {hard}: one echo-lobby binds {FDS_PER_SESSION} UDP "
        f"sockets per --max-clients at start, so at most about {(soft - 16) // FDS_PER_SESSION} "
        f"sessions ({SPARE_SESSIONS} spare: {(soft - 16) // FDS_PER_SESSION - SPARE_SESSIONS} "
        "players)"
    )


# ------------------------------------------------------------------------------ the driver


def bot_argv(args: argparse.Namespace, seed: int, offset: int, count: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "bench.matchmaker_net",
        "bot",
        "--server",
        f"127.0.0.1:{args.port}",
        "--players",
        str(args.players),
        "--regions",
        str(args.regions),
        "--skill-sd",
        str(args.skill_sd),
        "--seed",
        str(seed),
        "--offset",
        str(offset),
        "--count",
        str(count),
        "--connect-concurrency",
        str(args.connect_concurrency),
        "--queue-concurrency",
        str(args.queue_concurrency),
        "--connect-timeout",
        str(args.connect_timeout),
        "--match-timeout",
        str(args.match_timeout),
        *(["--liveness", str(args.liveness)] if args.liveness else []),
    ]


def start_bots(
    args: argparse.Namespace, seed: int, work: Path
) -> tuple[list[subprocess.Popen[bytes]], list[procs.Lines]]:
    share = [args.players // args.bot_procs] * args.bot_procs
    for i in range(args.players % args.bot_procs):
        share[i] += 1
    bots, outs, offset = [], [], 0
    for i, n in enumerate(share):
        proc = subprocess.Popen(
            bot_argv(args, seed, offset, n),
            cwd=procs.REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=(work / f"m1-net-bot{i}.err").open("wb"),
        )
        bots.append(proc)
        outs.append(procs.Lines(proc, f"m1 bot {i}"))
        offset += n
    return bots, outs


def start_server(args: argparse.Namespace, work: Path, log: Any) -> subprocess.Popen[bytes]:
    """echo-lobby for the run's players (and a few sessions to spare), once it holds all its
    duologue ports (it binds its HELLO port first, then those)."""
    sessions = args.players + SPARE_SESSIONS
    server = procs.start_udp_server(procs.lobby_server_argv(args.port, sessions), args.port, log)
    deadline = time.monotonic() + 60
    while (procs.open_fds(server.pid) or 0) < FDS_PER_SESSION * sessions:
        if server.poll() is not None or time.monotonic() > deadline:
            procs.stop(server)
            said = (work / "m1-net-server.log").read_text(errors="replace").strip()
            last = said.splitlines()[-1] if said else "nothing"
            raise RuntimeError(f"echo-lobby for {sessions} sessions did not start: {last}")
        time.sleep(0.05)
    return server


def start_server_again(args: argparse.Namespace, work: Path, log: Any) -> subprocess.Popen[bytes]:
    """`start_server`, tried again a few seconds later while one of its ports is taken (the
    machine is shared: something may hold one of its 20,000 ports a moment)."""
    for attempt in range(3):
        try:
            return start_server(args, work, log)
        except RuntimeError as error:
            if "Address already in use" not in str(error) or attempt == 2:
                raise
            print(f"echo-lobby: {error}; again in 5 s", file=sys.stderr, flush=True)
            time.sleep(5)
    raise AssertionError("unreachable")


def run_net(args: argparse.Namespace, seed: int, work: Path) -> dict[str, Any]:
    """One repeat over the network: a fresh server and bots; the figures (`summarize`)."""
    work.mkdir(parents=True, exist_ok=True)
    with (work / "m1-net-server.log").open("wb") as log:
        server = start_server_again(args, work, log)
        sampler = CpuSampler(server.pid)
        bots: list[subprocess.Popen[bytes]] = []
        try:
            bots, outs = start_bots(args, seed, work)
            connected = [o.wait_json("connected", args.phase_timeout) for o in outs]
            fds = procs.open_fds(server.pid)
            idle0 = time.time()
            time.sleep(args.idle_seconds)
            idle = sampler.between(idle0, time.time()) / args.idle_seconds
            bots_cpu0 = sum(procs.cpu_seconds(p.pid) for p in bots)
            for proc in bots:
                procs.say(proc, "queue")
            timeout = args.phase_timeout + args.match_timeout
            queued = [o.wait_json("queued", timeout) for o in outs]
            bots_cpu = sum(procs.cpu_seconds(p.pid) for p in bots) - bots_cpu0
            for proc in bots:
                procs.say(proc, "quit")
        finally:
            for proc in bots:
                procs.stop(proc)
            procs.stop(server)
            sampler.stop()
    out = summarize(connected, queued, sampler, args.players)
    # The wave's CPU less what holding the sessions costs (the idle phase's rate): the
    # queueing's own share.
    above = (out["queue cpu s"] - idle * out["wave s"]) / args.players * 1e6
    out.update(
        server_fds=fds, idle_cpu_pct=100 * idle, bots_cpu_s=bots_cpu, cpu_per_1000_above_idle=above
    )
    return out


def connect_figures(connected: list[dict[str, Any]], sampler: CpuSampler) -> dict[str, Any]:
    t0 = min(c["t0"] for c in connected)
    t1 = max(c["t1"] for c in connected)
    count = sum(c["connected"] for c in connected)
    errors: Counter[str] = Counter()
    for c in connected:
        errors.update(c["errors"])
    return {
        "connected": count,
        "connect s": t1 - t0,
        "connects/s": count / (t1 - t0) if t1 > t0 else 0.0,
        "connect cpu s": sampler.between(t0, t1),
        "connect failed": sum(c["failed"] for c in connected),
        "lost by the last connect": sum(c.get("lost", 0) for c in connected),
        "connect errors": dict(errors.most_common(5)),
    }


def summarize(
    connected: list[dict[str, Any]],
    queued: list[dict[str, Any]],
    sampler: CpuSampler,
    players: int,
) -> dict[str, Any]:
    """The repeat's figures from the bots' reports and the server's CPU samples."""
    if not any(q["t_queued"] for q in queued):
        raise RuntimeError(f"no player queued: {connect_figures(connected, sampler)}")
    seats = [s for q in queued for s in q["seated"]]  # [wall time, lobby id, size] each
    by_lobby: dict[int, list[tuple[float, int]]] = {}
    for when, lobby, size in seats:
        by_lobby.setdefault(lobby, []).append((when, size))
    wrong = sum(1 for members in by_lobby.values() if len(members) != members[0][1])
    first = min(q["t_first"] for q in queued if q["t_first"] is not None)
    wave_end = max(q["t_queued"] for q in queued if q["t_queued"] is not None) + MATCH_INTERVAL
    # A match is seated when its last member is.
    done = {lobby: max(w for w, _ in members) for lobby, members in by_lobby.items()}
    in_wave = [lobby for lobby, when in done.items() if when <= wave_end]
    wave_players = sum(len(by_lobby[lobby]) for lobby in in_wave)
    # The wave: from the first entry sent to the last match seated in it.
    span = max((done[lobby] for lobby in in_wave), default=wave_end) - first
    wave_end = first + span
    waits = [w for q in queued for w in q["waits"]]
    errors: Counter[str] = Counter()
    for q in queued:
        errors.update(q["errors"])
    queue_cpu = sampler.between(first, wave_end)
    return {
        **connect_figures(connected, sampler),
        "matches/s": len(in_wave) / span,
        "players/s": wave_players / span,
        "queue p50": percentile(waits, 50),
        "queue p99": percentile(waits, 99),
        "cpu per 1000": queue_cpu / players * 1000 * 1000,
        "queued": sum(q["queued"] for q in queued),
        "matched": len(seats),
        "matched %": 100 * len(seats) / players,
        "matches": len(by_lobby),
        "wrong size": wrong,
        "late": len(seats) - wave_players,
        "left": sum(q["left"] for q in queued),
        "lost before queueing": sum(q.get("lost", 0) for q in queued),
        "refused": sum(q["refused"] for q in queued),
        "queue errors": dict(errors.most_common(5)),
        "wave s": span,
        "all seated s": max(done.values()) - first if done else None,
        "queue cpu s": queue_cpu,
    }


# ------------------------------------------------------------------------------ the bots


def liveness_of(args: argparse.Namespace) -> float:
    """The players' image liveness (`--liveness`), or the library's."""
    from echo.lobby.timers import CLIENT_LIVENESS

    return float(args.liveness or CLIENT_LIVENESS)


def bot_main(args: argparse.Namespace) -> None:
    import trio

    from echo.log import configure_logging

    # Warnings only, on stderr (the .err file): stdout is the line protocol to the driver.
    configure_logging("console", "warning")
    trio.run(_bot, args)


def out(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


async def _bot(args: argparse.Namespace) -> None:
    import trio

    from bench.matchmaker_bench import entries
    from echo.lobby.timers import lobby_client_timers
    from echo.session.client import client_transport_config
    from echo.transport import open_transport

    todo = entries(args.players, args.seed, args.regions, args.skill_sd)
    mine = list(range(args.offset, args.offset + args.count))
    # The lobby client's own timers, on one transport for all the process's players, as
    # `echo.lobby.connect` would give each player alone (L1's bots do the same).
    config = client_transport_config(lobby_client_timers(liveness=liveness_of(args)))
    async with open_transport(config) as transport, trio.open_nursery() as nursery:
        clients = await connect_all(args, nursery, transport, mine)
        stdin = trio.wrap_file(sys.stdin)
        while True:
            words = (await stdin.readline()).split()
            if not words or words[0] == "quit":
                break
            if words[0] == "queue":
                out({"phase": "queued", **await queue_all(args, clients, todo)})
        nursery.cancel_scope.cancel()


async def connect_all(
    args: argparse.Namespace, nursery: Any, transport: Any, mine: list[int]
) -> dict[int, Any]:
    """Every player's session, `--connect-concurrency` handshakes at a time (a player that
    fails is tried twice more); reports the phase on stdout."""
    import trio

    from echo.lobby.client import connect as lobby_connect

    async def player(i: int, *, task_status: Any) -> None:
        async with lobby_connect(
            [args.server],
            member=f"p{i}",
            transport=transport,
            timeout=120,
            connect_timeout=args.connect_timeout,
        ) as client:
            task_status.started(client)
            await trio.sleep_forever()

    clients: dict[int, Any] = {}
    errors: Counter[str] = Counter()
    failed = 0
    left = iter(mine)

    async def worker() -> None:
        nonlocal failed
        for i in left:
            for _attempt in range(3):
                try:
                    clients[i] = await nursery.start(player, i)
                    if len(clients) % 500 == 0:  # (the rate's course, in the .err file)
                        print(
                            f"{time.time() - t0:.1f} s: {len(clients)} connected", file=sys.stderr
                        )
                    break
                except Exception as error:  # counted by kind; the run goes on
                    errors[f"{type(error).__name__}: {str(error)[:80]}"] += 1
            else:
                failed += 1

    t0 = time.time()
    async with trio.open_nursery() as workers:
        for _ in range(min(args.connect_concurrency, len(mine))):
            workers.start_soon(worker)
    out(
        {
            "phase": "connected",
            "connected": len(clients),
            "failed": failed,
            # (those whose session dropped meanwhile and did not come back)
            "lost": sum(1 for client in clients.values() if client.server is None),
            "errors": dict(errors),
            "t0": t0,
            "t1": time.time(),
        }
    )
    return clients


async def queue_all(
    args: argparse.Namespace, clients: dict[int, Any], todo: Sequence[Any]
) -> dict[str, Any]:
    """Every connected player queues and waits for its seat in its match's lobby."""
    import trio

    from echo.lobby.client import LobbyError, LobbyUnavailable
    from echo.lobby.queue_wire import Matched, QueueLeft

    # Sessions that dropped since they connected and did not come back (the client retries
    # once, then gives a server that was silent up): they are queued all the same, and are
    # refused at once (no server for their queue), as a game's client would be.
    lost = sum(1 for client in clients.values() if client.server is None)
    in_flight = trio.CapacityLimiter(args.queue_concurrency)
    sent: list[float] = []
    replied: list[float] = []
    seated: list[tuple[float, int, int]] = []
    waits: list[float] = []
    errors: Counter[str] = Counter()
    counts = {"left": 0, "refused": 0}
    all_sent = trio.Event()

    async def play(client: Any, i: int) -> None:
        entry = todo[i]
        async with in_flight:
            t = time.time()
            sent.append(t)
            try:
                await client.queue(entry.mode, entry.region, skill=entry.skill, size=entry.size)
            except (LobbyError, LobbyUnavailable) as error:
                counts["refused"] += 1
                errors[f"{type(error).__name__}: {str(error)[:80]}"] += 1
                return
            finally:
                if len(sent) == len(clients) and not in_flight.borrowed_tokens - 1:
                    all_sent.set()
            replied.append(time.time())
        event = await client.next_event((Matched, QueueLeft))
        if isinstance(event, QueueLeft):
            counts["left"] += 1
            errors[f"QueueLeft: {event.reason[:80]}"] += 1
            return
        await client.wait_until(lambda c: c.lobby_id == event.lobby_id)
        now = time.time()
        seated.append((now, event.lobby_id, entry.size))
        waits.append((now - t) * 1000)

    await every_player(clients, play, all_sent, args.match_timeout)
    return {
        "queued": len(replied),
        "lost": lost,
        "refused": counts["refused"],
        "left": counts["left"],
        "errors": dict(errors),
        "t_first": min(sent, default=None),
        "t_queued": max(replied, default=None),
        "seated": seated,
        "waits": waits,
    }


async def every_player(
    clients: dict[int, Any], play: Any, all_sent: Any, match_timeout: float
) -> None:
    """`play` for every player, until all are done or `match_timeout` after `all_sent`."""
    import trio

    async with trio.open_nursery() as players:

        async def deadline() -> None:
            # Every entry answered: the last ones get `--match-timeout` to be matched.
            await all_sent.wait()
            await trio.sleep(match_timeout)
            players.cancel_scope.cancel()

        players.start_soon(deadline)
        async with trio.open_nursery() as each:
            for i, client in clients.items():
                each.start_soon(play, client, i)
        players.cancel_scope.cancel()  # (everyone seated or out: no deadline to wait for)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="(internal) M1's bots over the network")
    sub = parser.add_subparsers(dest="role", required=True)
    bot = sub.add_parser("bot", help="the players of one bot process")
    bot.add_argument("--server", required=True)
    bot.add_argument("--players", type=int, required=True, help="of the whole run")
    bot.add_argument("--regions", type=int, default=3)
    bot.add_argument("--skill-sd", type=float, default=300.0)
    bot.add_argument("--seed", type=int, default=0)
    bot.add_argument("--offset", type=int, default=0)
    bot.add_argument("--count", type=int, required=True)
    bot.add_argument("--connect-concurrency", type=int, default=20)
    bot.add_argument("--queue-concurrency", type=int, default=64)
    bot.add_argument("--connect-timeout", type=float, default=10.0)
    bot.add_argument("--match-timeout", type=float, default=60.0)
    bot.add_argument("--liveness", type=float, default=None)
    bot_main(parser.parse_args(argv))


if __name__ == "__main__":
    main()
