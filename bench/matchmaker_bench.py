"""M1: 10,000 queued players matched in one run, on the lobby server's matchmaking path.

    python -m bench.matchmaker_bench --players 10000 --repeats 3

What runs is what a lobby server runs for the matchmaker, minus the sockets: every entry is an
`EnqueueMatch` encoded and parsed with the lobby codec, handled by the server's `QueueDesk`
(rate limits, checks, the `Matchmaker` core), and every match formed is seated in a new lobby
of a real `LobbyRegistry` with its seats signed (`TicketSeats`), and its messages encoded once
as the server does (Matched, LobbyJoined, the snapshot). The driver's batching is kept: the
queues are matched after every `--batch` entries (the server matches when woken by entries).
Players are in 3 regions and 2 modes (duels of 2, squads of 4), skills normal around 1,500
(sd 300); all arrive as fast as the desk takes them.

Figures, per repeat: matches/s and players/s while the entries arrive (first entry to the
match after the last), against the same entries through the `Matchmaker` core alone in the
same repeat (the baseline: what the codec, the desk and the seating cost on top); time in
queue p50/p99 (from an entry handled to its match seated, wall clock, the few matched later
as their windows widened included); the CPU the process spent per 1,000 players while they
arrived (the server's share: the bench has no client side).

    python -m bench.matchmaker_bench --net --players 9920 --repeats 3

`--net` also queues the same players, in each repeat after the in-process run, on a real
`echo-lobby` process from bot processes over UDP through the lobby client library
(bench.matchmaker_net says how and what it measures); its figures are compared to the
in-process run's of the same repeat. `--smoke` is a seconds-long run of 40 players that says
it runs at all (tests/bench/test_matchmaker_net.py).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from bench import results as result_files
from echo.lobby.limits import LobbyConfig, RateLimit
from echo.lobby.matchmaker import Entry, Matchmaker, MatchRules
from echo.lobby.protocol import encode, parse_request_untrusted
from echo.lobby.queue_wire import EnqueueMatch
from echo.lobby.queues import QueueDesk
from echo.lobby.state import LobbyRegistry
from echo.tickets import TicketKey, TicketSeats

REGIONS = ("eu", "us", "asia")
MODES = (("duel", 2), ("squad", 4))


@attrs.frozen
class Figure:
    name: str
    metric: str
    value: float
    unit: str
    lower_is_better: bool
    baseline: tuple[str, str] | None = None
    target: Any = None


def percentile(values: Sequence[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def entries(
    players: int, seed: int, regions: int = 3, skill_sd: float = 300.0
) -> list[EnqueueMatch]:
    """The run's entries (the same for every path of one repeat, and for the bots of the
    network mode, which make them again from the seed)."""
    rng = random.Random(seed)
    out = []
    for i in range(players):
        mode, size = MODES[i % 2]
        skill = round(rng.gauss(1500, skill_sd))
        out.append(EnqueueMatch(i, mode, REGIONS[rng.randrange(regions)], skill, size))
    return out


def run_core(todo: list[EnqueueMatch], batch: int) -> dict[str, float]:
    """The baseline: the same entries through the `Matchmaker` core alone (no codec, no
    desk, no lobby seating), matched after every `batch` as the server does."""
    mm = Matchmaker(MatchRules())
    matches = 0
    start = time.perf_counter()
    for i, req in enumerate(todo):
        entry = Entry(f"player-{i}", req.mode, req.region, req.skill, req.size)
        mm.enqueue(entry, time.perf_counter())
        if (i + 1) % batch == 0:
            matches += len(mm.match(time.perf_counter()))
    matches += len(mm.match(time.perf_counter()))
    return {"matches/s": matches / (time.perf_counter() - start)}


def run_server_path(todo: list[EnqueueMatch], batch: int, interval: float) -> dict[str, float]:
    players = len(todo)
    registry = LobbyRegistry(LobbyConfig(max_lobbies=players))
    seats = TicketSeats(TicketKey(1, b"m" * 32), ttl=3600.0, clock=time.time)
    registry._seats = seats  # (as LobbyServer builds it: seats signed for every lobby)
    desk = QueueDesk(
        registry, rules=MatchRules(), seats=seats, limit=RateLimit(rate=1000.0, burst=1000)
    )
    entered: dict[str, float] = {}
    waits: list[float] = []
    matches = 0

    def tick() -> None:
        nonlocal matches
        seated, sends = desk.tick(time.perf_counter())
        for send in sends:
            encode(send.message)  # (the server encodes each message once)
        done = time.perf_counter()
        for s in seated:
            matches += 1
            for member in s.match.members:
                waits.append(done - entered.pop(member))

    cpu0 = time.process_time()
    start = time.perf_counter()
    for i, request in enumerate(todo):
        member = f"player-{i}"
        parsed = parse_request_untrusted(encode(request))
        assert isinstance(parsed, EnqueueMatch)
        now = time.perf_counter()
        handled = desk.handle(member, parsed, now, secret=b"s" * 16)
        encode(handled.reply)
        entered[member] = now
        if (i + 1) % batch == 0:
            tick()
    tick()
    burst = time.perf_counter() - start
    burst_cpu = time.process_time() - cpu0
    burst_matches, burst_matched = matches, players - len(entered)
    # The few left (fewer than a match in some pool, or outside every window) wait for their
    # windows to widen, matched every `interval` as the server's timer does, until a second
    # passes without a match; their waits count in the percentiles.
    last = time.perf_counter()
    while entered and time.perf_counter() - last < 1.0:
        time.sleep(interval)  # (the server's match interval: a timer, nothing to await here)
        before = matches
        tick()
        if matches > before:
            last = time.perf_counter()
    return {
        "matches/s": burst_matches / burst,
        "players/s": burst_matched / burst,
        "queue p50": percentile(waits, 50) * 1000,
        "queue p99": percentile(waits, 99) * 1000,
        "cpu per 1000": burst_cpu / players * 1000 * 1000,
        "matched": players - len(entered),
        "seconds": burst,
    }


UNITS = {
    "matches/s": ("matches/s", False),
    "players/s": ("players/s", False),
    "queue p50": ("ms", True),
    "queue p99": ("ms", True),
    "cpu per 1000": ("ms CPU", True),
}
#: The network mode's own figures besides UNITS' (those have the in-process run's as baseline).
NET_UNITS = {
    "matched": ("%", False),
    "connects/s": ("connects/s", False),
}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--players", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--interval", type=float, default=0.25, help="the match interval")
    parser.add_argument("--regions", type=int, default=3, help="1 to 3")
    parser.add_argument("--skill-sd", type=float, default=300.0, help="around 1,500")
    parser.add_argument("--results-dir", default=None, help="[default: bench/results]")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="40 players in 1 region, skills close (every pool fills at once), 1 repeat, "
        "2 bot processes: that it runs; no result file unless --results-dir is given",
    )
    net = parser.add_argument_group("network mode (bench.matchmaker_net)")
    net.add_argument(
        "--net",
        action="store_true",
        help="also queue the same players on a real echo-lobby process, from bot processes "
        "over UDP through the lobby client library",
    )
    net.add_argument("--port", type=int, default=12400, help="echo-lobby's HELLO port")
    net.add_argument("--bot-procs", type=int, default=4)
    net.add_argument(
        "--connect-concurrency", type=int, default=20, help="handshakes at once per bot process"
    )
    net.add_argument(
        "--queue-concurrency", type=int, default=64, help="entries in flight per bot process"
    )
    net.add_argument("--connect-timeout", type=float, default=10.0, help="per handshake")
    net.add_argument(
        "--match-timeout",
        type=float,
        default=60.0,
        help="seconds the last players get to be matched once every entry is answered",
    )
    net.add_argument(
        "--liveness",
        type=float,
        default=None,
        help="the players' image liveness in seconds [default: the library's, "
        "echo.lobby.timers.CLIENT_LIVENESS]",
    )
    net.add_argument("--idle-seconds", type=float, default=3.0)
    net.add_argument("--phase-timeout", type=float, default=900.0, help="for the connects")
    net.add_argument(
        "--work-dir",
        default=str(result_files.RESULTS_DIR / "runs"),
        help="the server's and the bots' logs (not kept in git)",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.players, args.regions, args.skill_sd, args.repeats = 40, 1, 50.0, 1
        args.bot_procs, args.idle_seconds, args.match_timeout = 2, 1.0, 30.0
        args.no_write = args.no_write or args.results_dir is None
    if not 1 <= args.regions <= len(REGIONS):
        parser.error(f"--regions must be 1 to {len(REGIONS)}")
    return args


def run_repeat(args: argparse.Namespace, seed: int) -> tuple[dict[str, Any], ...]:
    """One repeat: the core alone, the server path in process, and (--net) over UDP."""
    todo = entries(args.players, seed, args.regions, args.skill_sd)
    core = run_core(todo, args.batch)
    run = run_server_path(todo, args.batch, args.interval)
    print(
        f"repeat {seed + 1}: core alone {core['matches/s']:.3g} matches/s; "
        + ", ".join(f"{k} {v:.3g}" for k, v in run.items()),
        "| load",
        open("/proc/loadavg").read().split()[:3],
        flush=True,
    )
    if not args.net:
        return core, run
    from bench import matchmaker_net

    try:
        net = matchmaker_net.run_net(args, seed, Path(args.work_dir))
    except RuntimeError as error:  # (the in-process figures of the repeat still count)
        print(f"repeat {seed + 1} over UDP: FAILED: {error}", flush=True)
        return core, run, {"error": str(error)}
    print(
        f"repeat {seed + 1} over UDP: "
        + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in net.items()),
        "| load",
        open("/proc/loadavg").read().split()[:3],
        flush=True,
    )
    return core, run, net


def repeat_figures(
    args: argparse.Namespace, repeat: tuple[dict[str, Any], ...]
) -> dict[tuple[str, str], Figure]:
    """One repeat's figures; the network mode's against the in-process run of the repeat."""
    core_run, run = repeat[0], repeat[1]
    subject, core = f"matchmaker_{args.players}", f"matchmaker_core_{args.players}"
    figures = {
        (subject, k): Figure(subject, k, run[k], *UNITS[k], (core, k) if k == "matches/s" else None)
        for k in UNITS
    }
    figures[(core, "matches/s")] = Figure(
        core, "matches/s", core_run["matches/s"], "matches/s", False
    )
    if len(repeat) > 2 and "error" not in repeat[2]:
        net, name = repeat[2], f"matchmaker_net_{args.players}"
        for k in UNITS:
            if net[k] is not None:
                figures[(name, k)] = Figure(name, k, net[k], *UNITS[k], (subject, k))
        values = {"matched": net["matched %"], "connects/s": net["connects/s"]}
        for k, value in values.items():
            figures[(name, k)] = Figure(name, k, value, *NET_UNITS[k])
    return figures


def settings_of(
    args: argparse.Namespace, repeats: list[tuple[dict[str, Any], ...]]
) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "players": args.players,
        "batch": args.batch,
        "regions": args.regions,
        "skill_sd": args.skill_sd,
        "matched": [repeat[1]["matched"] for repeat in repeats],
    }
    if args.net:
        from bench import matchmaker_net

        keep = ("port", "bot_procs", "connect_concurrency", "queue_concurrency", "liveness")
        settings["net"] = {k: getattr(args, k) for k in keep}
        settings["net"]["fd_room"] = matchmaker_net.fd_room()
        figures = (*UNITS, "matched %", "connects/s")
        settings["net"]["repeats"] = [
            {k: v for k, v in repeat[2].items() if k not in figures} for repeat in repeats
        ]
    return settings


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.net:
        from bench import matchmaker_net

        print(f"M1 over UDP: {args.players} players; {matchmaker_net.fd_room()}", flush=True)
    load_before = result_files.system_load()
    repeats = [run_repeat(args, seed) for seed in range(args.repeats)]
    subject = f"matchmaker_{args.players}"
    own = [(subject, name) for name in UNITS]
    how = "matching path (codec, desk, core, lobby seating; no sockets)"
    if args.net:
        name = f"matchmaker_net_{args.players}"
        own += [(name, k) for k in (*UNITS, *NET_UNITS)]
        how = (
            f"matching path in process (codec, desk, core, lobby seating), and over UDP: one "
            f"echo-lobby process, the players' lobby clients in {args.bot_procs} bot processes"
        )
    command = "python -m bench.matchmaker_bench " + " ".join(argv or sys.argv[1:])
    record, left_out = result_files.from_repeats(
        bench_id="m1",
        label="M1",
        title=f"M1: {args.players:,} players queued and matched on one lobby server's {how}, "
        f"2 modes, {args.regions} region{'s' if args.regions > 1 else ''}",
        command=command.strip(),
        own=own,
        repeats=[repeat_figures(args, repeat) for repeat in repeats],
        machine=result_files.machine_info(load_before, result_files.system_load()),
        settings=settings_of(args, repeats),
    )
    for line in left_out:
        print("left out:", line)
    for label, index in (("in process", 1), ("over UDP", 2)):
        for k in UNITS if index == 1 or args.net else ():
            values = [r[index][k] for r in repeats if r[index].get(k) is not None]
            if values:
                print(
                    f"{label}: {k}: median {statistics.median(values):.4g} "
                    f"(min {min(values):.4g}, max {max(values):.4g})"
                )
    if record is not None and not args.no_write:
        directory = Path(args.results_dir) if args.results_dir else result_files.RESULTS_DIR
        print("wrote", record.write(directory))


if __name__ == "__main__":
    main()
