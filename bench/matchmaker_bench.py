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
arrived (the server's share: the bench has no client side). The sockets' cost is the lobby's
L1 benchmark's; this one isolates the matchmaker.
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


def entries(players: int, seed: int) -> list[EnqueueMatch]:
    """The run's entries (the same for both paths of one repeat)."""
    rng = random.Random(seed)
    out = []
    for i in range(players):
        mode, size = MODES[i % 2]
        skill = round(rng.gauss(1500, 300))
        out.append(EnqueueMatch(i, mode, REGIONS[rng.randrange(3)], skill, size))
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


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--players", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--interval", type=float, default=0.25, help="the match interval")
    parser.add_argument("--results-dir", default=str(result_files.RESULTS_DIR))
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    load_before = result_files.system_load()
    runs = []
    core_runs = []
    for r in range(args.repeats):
        todo = entries(args.players, seed=r)
        core_runs.append(run_core(todo, args.batch))
        run = run_server_path(todo, args.batch, args.interval)
        print(
            f"repeat {r + 1}: core alone {core_runs[-1]['matches/s']:.3g} matches/s; "
            + ", ".join(f"{k} {v:.3g}" for k, v in run.items()),
            "| load",
            open("/proc/loadavg").read().split()[:3],
        )
        runs.append(run)
    subject = f"matchmaker_{args.players}"
    own = [(subject, name) for name in UNITS]
    core = f"matchmaker_core_{args.players}"
    repeats = []
    for run, core_run in zip(runs, core_runs, strict=True):
        figures = {
            (subject, k): Figure(
                subject,
                k,
                run[k],
                UNITS[k][0],
                UNITS[k][1],
                (core, k) if k == "matches/s" else None,
            )
            for k in UNITS
        }
        figures[(core, "matches/s")] = Figure(
            core, "matches/s", core_run["matches/s"], "matches/s", False
        )
        repeats.append(figures)
    command = "python -m bench.matchmaker_bench " + " ".join(argv or sys.argv[1:])
    record, left_out = result_files.from_repeats(
        bench_id="m1",
        label="M1",
        title=f"M1: {args.players:,} players queued and matched on one lobby server's "
        "matchmaking path (codec, desk, core, lobby seating; no sockets), 2 modes, 3 regions",
        command=command.strip(),
        own=own,
        repeats=repeats,
        machine=result_files.machine_info(load_before, result_files.system_load()),
        settings={
            "players": args.players,
            "batch": args.batch,
            "matched": [run["matched"] for run in runs],
        },
    )
    for line in left_out:
        print("left out:", line)
    for k in UNITS:
        values = [run[k] for run in runs]
        print(
            f"{k}: median {statistics.median(values):.4g} "
            f"(min {min(values):.4g}, max {max(values):.4g})"
        )
    if record is not None and not args.no_write:
        print("wrote", record.write(Path(args.results_dir)))


if __name__ == "__main__":
    main()
