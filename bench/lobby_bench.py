"""L1 (the lobby benchmark): lobbies of members on ONE lobby server, bots in other processes.

For each target, in the same run:
- echo: `echo-lobby` (python -m echo.lobby.cli server) and bots on `echo.lobby.connect`
  (this module's `bot` role, many members per process on one shared transport);
- colyseus: Colyseus 0.16 on Node (bench/colyseus/server.js, a room per lobby) and its bots
  (bench/colyseus/bots.js); `npm ci` installs the pinned versions into bench/colyseus first.

Phases, the same for both (the bots of a target share one line protocol, see bots.js):
1. join: every bot process creates its share of the lobbies and fills each with members (the
   creator, then joins by id); a join is a new member connecting and being seated.
   joins/s = all members seated / (last seat - first attempt).
2. chat: `--chat-rate` lines/s over all lobbies for `--chat-seconds`, each from a random member;
   every other member's delivery latency (wall clock across processes of this machine).
3. search: `--searches` per bot process, `--search-concurrency` at a time, from random members:
   string equality on "mode" (a quarter of the lobbies match), first page of 20; round trips.
Server CPU (utime+stime from /proc) per phase and RSS (after the joins, and the peak) are read
for the server process; the load average is recorded, because this machine is shared.

One run, not a test: `python -m bench.lobby_bench` (the full L1: 1,000 lobbies of 8), or scaled
with options; `--smoke` is a seconds-long check that both targets run at all.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from bench import procs
from bench import results as result_files
from bench.harness import Result
from bench.procs import Lines, cpu_seconds, memory_kib, say, stop

REPO = Path(__file__).resolve().parents[1]
COLYSEUS_DIR = REPO / "bench" / "colyseus"
MODES = ("ffa", "duel", "team", "coop")


# ------------------------------------------------------------------------------ measuring


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile (p in 0..100)."""
    if not values:
        return None
    ranked = sorted(values)
    index = max(0, min(len(ranked) - 1, -(-len(ranked) * p // 100) - 1))
    return ranked[int(index)]


# ------------------------------------------------------------------------------ targets


def _ensure_colyseus() -> str | None:
    """`npm ci` into bench/colyseus when needed; None, or why Colyseus cannot run here."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        return "node/npm not found on PATH"
    version = subprocess.run([node, "--version"], capture_output=True, text=True).stdout.strip()
    if not version.startswith("v20."):
        return f"Colyseus 0.16 is measured on Node 20 here; this is node {version}"
    stamp = COLYSEUS_DIR / "node_modules" / ".package-lock.json"
    lock = COLYSEUS_DIR / "package-lock.json"
    if not stamp.exists() or stamp.stat().st_mtime < lock.stat().st_mtime:
        print("==> npm ci in bench/colyseus (pinned Colyseus 0.16)", file=sys.stderr)
        done = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"],
            cwd=COLYSEUS_DIR,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode != 0:
            return f"npm ci failed: {done.stderr.strip()[-400:]}"
    return None


class Target:
    name = ""

    def start_server(self, args: argparse.Namespace, log: IO[bytes]) -> subprocess.Popen[bytes]:
        raise NotImplementedError

    def bot_argv(self, args: argparse.Namespace, offset: int, lobbies: int) -> list[str]:
        raise NotImplementedError


class Echo(Target):
    name = "echo"

    def start_server(self, args: argparse.Namespace, log: IO[bytes]) -> subprocess.Popen[bytes]:
        return self._start(self.argv(args), args.echo_port, log)

    def argv(self, args: argparse.Namespace) -> list[str]:
        """echo-lobby's command line for L1."""
        members = args.lobbies * args.members + 64
        return procs.lobby_server_argv(args.echo_port, members, "--indexed-keys", "mode,skill")

    def _start(self, argv: list[str], port: int, log: IO[bytes]) -> subprocess.Popen[bytes]:
        return procs.start_udp_server(argv, port, log)

    def bot_argv(self, args: argparse.Namespace, offset: int, lobbies: int) -> list[str]:
        return [
            sys.executable,
            "-m",
            "bench.lobby_bench",
            "bot",
            "--server",
            f"127.0.0.1:{args.echo_port}",
            "--lobbies",
            str(lobbies),
            "--members",
            str(args.members),
            "--offset",
            str(offset),
            "--concurrency",
            str(args.join_concurrency),
            "--join-rate",
            str(args.join_rate / args.bot_procs if args.join_rate else 0),
            "--connect-timeout",
            str(args.echo_connect_timeout),
            "--join-seconds",
            str(args.join_seconds),
            *(["--liveness", str(args.echo_client_liveness)] if args.echo_client_liveness else []),
        ]


class EchoWs(Echo):
    """L1-WS: echo-lobby's WebSocket door, Node bots on the JSON protocol (bench.lobby_ws)."""

    name = "echo-ws"

    def start_server(self, args: argparse.Namespace, log: IO[bytes]) -> subprocess.Popen[bytes]:
        from bench import lobby_ws

        return lobby_ws.start_server(args, log, self.argv(args))

    def bot_argv(self, args: argparse.Namespace, offset: int, lobbies: int) -> list[str]:
        from bench import lobby_ws

        return lobby_ws.bot_argv(args, COLYSEUS_DIR / "echo_ws_bots.js", offset, lobbies)


class Colyseus(Target):
    name = "colyseus"

    def start_server(self, args: argparse.Namespace, log: IO[bytes]) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            ["node", "server.js", str(args.colyseus_port)],
            cwd=COLYSEUS_DIR,
            stdout=subprocess.PIPE,
            stderr=log,
        )
        Lines(proc, "colyseus server").wait_text("listening", 60)
        return proc

    def bot_argv(self, args: argparse.Namespace, offset: int, lobbies: int) -> list[str]:
        return [
            "node",
            str(COLYSEUS_DIR / "bots.js"),
            "--url",
            f"ws://127.0.0.1:{args.colyseus_port}",
            "--lobbies",
            str(lobbies),
            "--members",
            str(args.members),
            "--offset",
            str(offset),
            "--concurrency",
            str(args.join_concurrency),
        ]


class Profiles:
    """`--profile DIR`: py-spy records the server and the first bot process through each
    phase (raw collapsed stacks, DIR/<target>-<phase>-<who>.txt); nothing without it."""

    def __init__(self, args: argparse.Namespace, target: str) -> None:
        self.dir = Path(args.profile) if args.profile else None
        self.target = target
        self.running: list[subprocess.Popen[bytes]] = []

    def start(self, phase: str, pids: dict[str, int]) -> None:
        self.stop()
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        if self.dir is None or not Path(spy).exists():
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        for who, pid in pids.items():
            out = self.dir / f"{self.target}-{phase}-{who}.txt"
            argv = [spy, "record", "-p", str(pid), "-r", "100", "-f", "raw", "-o", str(out)]
            self.running.append(
                subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            )

    def stop(self) -> None:
        for proc in self.running:
            proc.send_signal(signal.SIGINT)  # py-spy writes its file on ^C
        for proc in self.running:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.running = []


def run_target(target: Target, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    result: dict[str, Any] = {"target": target.name, "load_before": os.getloadavg()}
    server_log = (work / f"{target.name}-server.log").open("wb")
    server = target.start_server(args, server_log)
    bots: list[subprocess.Popen[bytes]] = []
    try:
        cpu0 = cpu_seconds(server.pid)
        share = [args.lobbies // args.bot_procs] * args.bot_procs
        for i in range(args.lobbies % args.bot_procs):
            share[i] += 1
        outs: list[Lines] = []
        offset = 0
        for i, n in enumerate(share):
            if n == 0:
                continue
            proc = subprocess.Popen(
                target.bot_argv(args, offset, n),
                cwd=REPO,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=(work / f"{target.name}-bot{i}.err").open("wb"),
            )
            bots.append(proc)
            outs.append(Lines(proc, f"{target.name} bot {i}"))
            offset += n

        profiles = Profiles(args, target.name)
        who = {"server": server.pid, "bot0": bots[0].pid} if target.name == "echo" else {}
        profiles.start("join", who)
        joined = [o.wait_json("joined", args.phase_timeout) for o in outs]
        profiles.start("idle", who)
        bots_cpu = [sum(cpu_seconds(p.pid) for p in bots)]
        cpu_joined = cpu_seconds(server.pid)
        mem_joined = memory_kib(server.pid)
        # Everyone seated, nobody talking: what keeping the sessions alive costs.
        time.sleep(args.idle_seconds)
        cpu1 = cpu_seconds(server.pid)
        bots_cpu.append(sum(cpu_seconds(p.pid) for p in bots))
        joins = sum(j["joins"] for j in joined)
        span = (max(j["t1"] for j in joined) - min(j["t0"] for j in joined)) / 1000
        lat = [x for j in joined for x in j["lat"]]
        result["join"] = {
            "members_seated": joins,
            "expected": args.lobbies * args.members,
            "errors": sum(j["errors"] for j in joined),
            "seconds": span,
            "joins_per_s": joins / span if span > 0 else None,
            "latency_ms_p50": percentile(lat, 50),
            "latency_ms_p99": percentile(lat, 99),
            "server_cpu_s": cpu_joined - cpu0,
            "bots_cpu_s": bots_cpu[0],
        }
        result["idle"] = {
            "seconds": args.idle_seconds,
            "server_cpu_pct": 100 * (cpu1 - cpu_joined) / args.idle_seconds,
            "bots_cpu_pct": 100 * (bots_cpu[1] - bots_cpu[0]) / args.idle_seconds,
        }

        profiles.start("chat", who)
        rate = args.chat_rate / len(outs)
        for proc in bots:
            say(proc, f"chat {rate} {args.chat_seconds}")
        chats = [o.wait_json("chat", args.chat_seconds + args.phase_timeout) for o in outs]
        cpu2 = cpu_seconds(server.pid)
        bots_cpu.append(sum(cpu_seconds(p.pid) for p in bots))
        lat = [x for c in chats for x in c["lat"]]
        sent = sum(c["sent"] for c in chats)
        result["chat"] = {
            "lines_sent": sent,
            "lines_per_s": sent / args.chat_seconds,
            "deliveries": sum(c["deliveries"] for c in chats),
            "expected_deliveries": sum(c["expected"] for c in chats),
            "send_errors": sum(c.get("errors", 0) for c in chats),
            "send_error_kinds": [c["error_kinds"] for c in chats if c.get("error_kinds")],
            "sessions_dropped_and_back": sum(c.get("reconnects", 0) for c in chats),
            "delivery_ms_p50": percentile(lat, 50),
            "delivery_ms_p99": percentile(lat, 99),
            "sender_ack_ms_p50": percentile([x for c in chats for x in c.get("ack_lat", [])], 50),
            "sender_ack_ms_p99": percentile([x for c in chats for x in c.get("ack_lat", [])], 99),
            "server_cpu_s": cpu2 - cpu1,
            "server_cpu_pct": 100 * (cpu2 - cpu1) / (args.chat_seconds + 3),
            "bots_cpu_pct": 100 * (bots_cpu[2] - bots_cpu[1]) / (args.chat_seconds + 3),
        }

        profiles.start("search", who)
        for proc in bots:
            say(proc, f"search {args.searches} {args.search_concurrency}")
        searches = [o.wait_json("search", args.phase_timeout) for o in outs]
        profiles.stop()
        cpu3 = cpu_seconds(server.pid)
        lat = [x for s in searches for x in s["lat"]]
        n = sum(s["n"] for s in searches)
        result["search"] = {
            "searches": n,
            "errors": sum(s.get("errors", 0) for s in searches),
            "mean_results": sum(s["results"] for s in searches) / n if n else None,
            "latency_ms_p50": percentile(lat, 50),
            "latency_ms_p99": percentile(lat, 99),
            "server_cpu_s": cpu3 - cpu2,
        }
        result["server"] = {
            "cpu_s_total": cpu3 - cpu0,
            "rss_mib_after_joins": mem_joined.get("VmRSS", 0) / 1024,
            "rss_mib_peak": memory_kib(server.pid).get("VmHWM", 0) / 1024,
        }
        for proc in bots:
            say(proc, "quit")
    finally:
        for proc in bots:
            stop(proc)
        stop(server)
        server_log.close()
    result["load_after"] = os.getloadavg()
    return result


# ------------------------------------------------------------------------------ echo's bots


def bot_main(args: argparse.Namespace) -> None:
    import trio

    trio.run(_bot, args)


async def _bot(args: argparse.Namespace) -> None:
    import trio

    from echo.lobby.client import (
        LobbyClient,
        LobbyError,
        LobbyUnavailable,
        Reconnected,
        Rehomed,
        filters_from,
    )
    from echo.lobby.client import connect as lobby_connect
    from echo.lobby.protocol import ChatLine
    from echo.lobby.timers import CLIENT_LIVENESS, lobby_client_timers
    from echo.log import configure_logging
    from echo.session.client import client_transport_config
    from echo.transport import open_transport

    # Warnings only, on stderr (the .err file): the library's info lines (a session opened,
    # ...) are thousands per run, and stdout is the line protocol to the bench.
    configure_logging("console", "warning")

    def now_ms() -> float:
        return time.time() * 1000

    def out(obj: dict[str, Any]) -> None:
        print(json.dumps(obj), flush=True)

    chat_lat: list[float] = []
    deliveries = 0
    errors = 0
    reconnects = 0
    liveness = args.liveness or CLIENT_LIVENESS
    # The lobby client's own idle cadence (echo.lobby.timers), on one transport for all the
    # process's members, as `echo.lobby.connect` would give each member alone.
    config = client_transport_config(lobby_client_timers(liveness=liveness))
    async with open_transport(config) as transport, trio.open_nursery() as nursery:

        async def member(name: str, *, task_status: Any) -> None:
            nonlocal deliveries, reconnects
            async with lobby_connect(
                [args.server],
                member=name,
                transport=transport,
                timeout=120,
                connect_timeout=args.connect_timeout,
            ) as client:
                task_status.started(client)
                async for event in client.events():
                    if isinstance(event, ChatLine) and event.member_id != name:
                        deliveries += 1
                        chat_lat.append(now_ms() - float(event.text.split()[0]))
                    elif isinstance(event, Reconnected | Rehomed):
                        reconnects += 1  # the session dropped (liveness) and came back

        lobbies: list[list[LobbyClient]] = []
        join_lat: list[float] = []

        # Joins are paced (a ramp, `--join-rate`), so the measure is how fast the server
        # seats members, not how a storm of handshakes times out.
        pace = 1.0 / args.join_rate if args.join_rate > 0 else 0.0
        next_start = trio.current_time()

        async def paced() -> None:
            nonlocal next_start
            if pace:
                next_start = max(next_start + pace, trio.current_time())
                await trio.sleep_until(next_start)

        async def fill(i: int) -> None:
            nonlocal errors
            idx = args.offset + i
            await paced()
            t = now_ms()
            owner = await nursery.start(member, f"o{idx}")
            lobby_id = await owner.create(
                f"lobby-{idx}",
                args.members,
                metadata={"mode": MODES[idx % len(MODES)], "skill": idx % 100},
            )
            join_lat.append(now_ms() - t)
            seats = [owner]
            lobbies.append(seats)
            for j in range(1, args.members):
                if trio.current_time() > join_deadline:
                    return
                await paced()
                t = now_ms()
                try:
                    client = await nursery.start(member, f"m{idx}-{j}")
                    await client.join(lobby_id)
                except Exception as error:  # one member lost; the lobby fills on
                    errors += 1
                    print(f"lobby {i} member {j}: {error!r}", file=sys.stderr, flush=True)
                    continue
                join_lat.append(now_ms() - t)
                seats.append(client)

        t0 = now_ms()
        # Past --join-seconds no new member starts: the run goes on with those seated (a run
        # that cannot seat everyone still ends, and says how many it seated).
        join_deadline = trio.current_time() + args.join_seconds
        queue = iter(range(args.lobbies))

        async def worker() -> None:
            nonlocal errors
            for i in queue:
                if trio.current_time() > join_deadline:
                    break
                try:
                    await fill(i)
                except Exception as error:  # a failed lobby is counted, the run goes on
                    errors += 1
                    print(f"lobby {i}: {error!r}", file=sys.stderr, flush=True)

        async with trio.open_nursery() as workers:
            for _ in range(min(args.concurrency, args.lobbies)):
                workers.start_soon(worker)
        out(
            {
                "phase": "joined",
                "joins": len(join_lat),
                "t0": t0,
                "t1": now_ms(),
                "errors": errors,
                "lat": join_lat,
            }
        )

        stdin = trio.wrap_file(sys.stdin)
        while True:
            line = await stdin.readline()
            words = line.split()
            if not words or words[0] == "quit":
                break
            if words[0] == "chat":
                rate, seconds = float(words[1]), float(words[2])
                chat_lat.clear()
                deliveries = 0
                sent = 0
                chat_errors: dict[str, int] = {}

                ack_lat: list[float] = []

                async def say(
                    client: LobbyClient, text: str, kinds: dict[str, int], acks: list[float]
                ) -> None:
                    try:
                        await client.chat(text)
                    except (LobbyError, LobbyUnavailable) as error:
                        kinds[str(error)[:120]] = kinds.get(str(error)[:120], 0) + 1
                    else:
                        # the sender's round trip: its line taken by the server (Done)
                        acks.append(now_ms() - float(text.split()[0]))

                start = trio.current_time()
                expected = 0
                async with trio.open_nursery() as senders:
                    while lobbies and trio.current_time() - start < seconds:
                        seats = lobbies[sent % len(lobbies)]
                        text = f"{now_ms():.3f} ".ljust(32, "x")
                        senders.start_soon(say, random.choice(seats), text, chat_errors, ack_lat)
                        sent += 1
                        expected += len(seats) - 1  # (a lobby the joins did not fill)
                        await trio.sleep_until(start + sent / rate)
                await trio.sleep(3.0)  # lines still in flight
                out(
                    {
                        "phase": "chat",
                        "sent": sent,
                        "deliveries": deliveries,
                        "expected": expected,
                        "lat": list(chat_lat),
                        "ack_lat": ack_lat,
                        "errors": sum(chat_errors.values()),
                        "error_kinds": chat_errors,
                        "reconnects": reconnects,
                    }
                )
            elif words[0] == "search":
                count, concurrency = int(words[1]), int(words[2])
                lat: list[float] = []
                found = 0
                refused = 0
                todo = iter(range(count))

                async def searcher(todo: Any, lat: list[float]) -> None:
                    nonlocal found, refused
                    for k in todo:
                        if not lobbies:
                            return
                        client = random.choice(random.choice(lobbies))
                        t = now_ms()
                        try:
                            page = await client.search(
                                filters_from({"mode": MODES[k % len(MODES)]}), limit=20
                            )
                        except (LobbyError, LobbyUnavailable):
                            refused += 1  # (rate limited: that member searched just now)
                            continue
                        lat.append(now_ms() - t)
                        found += len(page.listings)

                async with trio.open_nursery() as searchers:
                    for _ in range(concurrency):
                        searchers.start_soon(searcher, todo, lat)
                out(
                    {
                        "phase": "search",
                        "n": len(lat),
                        "lat": lat,
                        "results": found,
                        "errors": refused,
                    }
                )
        nursery.cancel_scope.cancel()


# ------------------------------------------------------------------------------ main


def summary_table(results: list[dict[str, Any]]) -> str:
    def f(x: float | None, digits: int = 1) -> str:
        return "-" if x is None else f"{x:,.{digits}f}"

    rows = [
        ("joins/s", lambda r: f(r["join"]["joins_per_s"])),
        ("members seated", lambda r: f"{r['join']['members_seated']}/{r['join']['expected']}"),
        (
            "join p50 / p99 ms",
            lambda r: f"{f(r['join']['latency_ms_p50'])} / {f(r['join']['latency_ms_p99'])}",
        ),
        ("chat lines/s sent", lambda r: f(r["chat"]["lines_per_s"])),
        (
            "chat delivered",
            lambda r: f"{r['chat']['deliveries']}/{r['chat']['expected_deliveries']}",
        ),
        (
            "chat send errors / drops",
            lambda r: (
                f"{r['chat'].get('send_errors', 0)} / "
                f"{r['chat'].get('sessions_dropped_and_back', 0)}"
            ),
        ),
        (
            "chat delivery p50 / p99 ms",
            lambda r: f"{f(r['chat']['delivery_ms_p50'])} / {f(r['chat']['delivery_ms_p99'])}",
        ),
        (
            "chat sender ack p50 / p99 ms",
            lambda r: (
                f"{f(r['chat'].get('sender_ack_ms_p50'))} / {f(r['chat'].get('sender_ack_ms_p99'))}"
            ),
        ),
        (
            "search p50 / p99 ms",
            lambda r: f"{f(r['search']['latency_ms_p50'])} / {f(r['search']['latency_ms_p99'])}",
        ),
        ("searches (refused)", lambda r: f"{r['search']['searches']} ({r['search']['errors']})"),
        (
            "server CPU s join/chat/search",
            lambda r: (
                f"{f(r['join']['server_cpu_s'])}/"
                f"{f(r['chat']['server_cpu_s'])}/{f(r['search']['server_cpu_s'])}"
            ),
        ),
        (
            "idle CPU % server / bots",
            lambda r: f"{f(r['idle']['server_cpu_pct'], 0)} / {f(r['idle']['bots_cpu_pct'], 0)}",
        ),
        (
            "chat CPU % server / bots",
            lambda r: (
                f"{f(r['chat']['server_cpu_pct'], 0)} / {f(r['chat'].get('bots_cpu_pct'), 0)}"
            ),
        ),
        (
            "server RSS MiB (joined/peak)",
            lambda r: f"{f(r['server']['rss_mib_after_joins'])}/{f(r['server']['rss_mib_peak'])}",
        ),
        ("load avg before/after", lambda r: f"{r['load_before'][0]:.1f}/{r['load_after'][0]:.1f}"),
    ]
    ok = [r for r in results if "join" in r]
    width = max(len(name) for name, _ in rows)
    lines = [f"{'':<{width}}  " + "  ".join(f"{r['target']:>22}" for r in ok)]
    for name, cell in rows:
        lines.append(f"{name:<{width}}  " + "  ".join(f"{cell(r):>22}" for r in ok))
    for r in results:
        if "error" in r:
            lines.append(f"{r['target']}: NOT MEASURED: {r['error']}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="role")
    bot = sub.add_parser("bot", help="(internal) echo bots of one process")
    bot.add_argument("--server", required=True)
    bot.add_argument("--lobbies", type=int, required=True)
    bot.add_argument("--members", type=int, default=8)
    bot.add_argument("--offset", type=int, default=0)
    bot.add_argument("--concurrency", type=int, default=20)
    bot.add_argument("--liveness", type=float, default=None)
    bot.add_argument("--join-rate", type=float, default=0.0)
    bot.add_argument("--join-seconds", type=float, default=math.inf)
    bot.add_argument("--connect-timeout", type=float, default=10.0)
    parser.add_argument("--lobbies", type=int, default=1000)
    parser.add_argument("--members", type=int, default=8)
    parser.add_argument("--bot-procs", type=int, default=4, help="bot processes per target")
    parser.add_argument(
        "--join-concurrency",
        type=int,
        default=20,
        help="lobbies being filled at once in each bot process",
    )
    parser.add_argument(
        "--join-rate",
        type=float,
        default=0.0,
        help="joins (members connecting) started per second over all bot processes of a "
        "target, a ramp; 0: as fast as --join-concurrency allows [default: 0]",
    )
    parser.add_argument(
        "--join-seconds",
        type=float,
        default=150.0,
        help="no new member starts joining after this many seconds (echo's bots): the run "
        "goes on with those seated and reports how many that was",
    )
    parser.add_argument(
        "--echo-connect-timeout",
        type=float,
        default=10.0,
        help="the echo bots' handshake timeout per server (the library's default is "
        "echo.lobby.client.CONNECT_TIMEOUT, 3 s: too tight for a server admitting hundreds "
        "of members a second on a shared machine)",
    )
    parser.add_argument(
        "--chat-rate", type=float, default=200.0, help="chat lines per second over all lobbies"
    )
    parser.add_argument("--chat-seconds", type=float, default=10.0)
    parser.add_argument(
        "--idle-seconds",
        type=float,
        default=5.0,
        help="all seated, nobody talking: the cost of keeping sessions",
    )
    parser.add_argument("--searches", type=int, default=100, help="per bot process")
    parser.add_argument("--search-concurrency", type=int, default=2)
    parser.add_argument("--targets", default="echo,colyseus")
    parser.add_argument(
        "--echo-port",
        type=int,
        default=12000,
        help="HELLO port; duologues use the 2 x members ports above it",
    )
    parser.add_argument("--colyseus-port", type=int, default=12567)
    parser.add_argument(
        "--echo-ws-port",
        type=int,
        default=12600,
        help="echo-lobby's WebSocket door (TCP) for the echo-ws target (L1-WS, bench.lobby_ws)",
    )
    parser.add_argument(
        "--echo-client-liveness",
        type=float,
        default=None,
        help="the echo bots' image liveness in seconds [default: the library's, "
        "echo.lobby.timers.CLIENT_LIVENESS]",
    )
    parser.add_argument(
        "--phase-timeout",
        type=float,
        default=300.0,
        help="seconds a phase (the joins, the searches) may take before the target fails",
    )
    parser.add_argument(
        "--profile",
        default=None,
        metavar="DIR",
        help="py-spy (pip install py-spy) records echo's server and first bot process in "
        "each phase into DIR (raw collapsed stacks); it costs them some CPU",
    )
    parser.add_argument(
        "--out",
        default=str(REPO / "bench" / "results" / "runs" / "lobby_bench.json"),
        help="every figure of every repeat, and the logs beside it (not kept in git)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="run both targets this many times, one after the other each time",
    )
    parser.add_argument(
        "--results-dir",
        default=None,
        help="where lobby.json (the figures over the repeats, echo against Colyseus of the same "
        "repeat) goes [default: bench/results; a --smoke run writes none unless given]",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="10 lobbies of 4, 2 bot processes, 2 s of chat: that it runs",
    )
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.role == "bot":
        bot_main(args)
        return
    if args.smoke:
        args.lobbies, args.members, args.bot_procs = 10, 4, 2
        args.chat_rate, args.chat_seconds, args.searches = 20.0, 2.0, 10
        args.phase_timeout = 300.0
    work = Path(args.out).parent
    work.mkdir(parents=True, exist_ok=True)
    print(
        f"L1: {args.lobbies} lobbies x {args.members} members on one server, "
        f"{args.bot_procs} bot processes per target; load average {os.getloadavg()}",
        flush=True,
    )
    load_before = result_files.system_load()
    repeats: list[list[dict[str, Any]]] = []
    for repeat in range(args.repeats):
        if args.repeats > 1:
            print(f"== repeat {repeat + 1} of {args.repeats}", flush=True)
        repeats.append(run_targets(args, work))
    results = [result for repeat in repeats for result in repeat]
    record = {
        "scenario": {k: v for k, v in vars(args).items() if k not in ("role", "out")},
        "node": shutil.which("node")
        and subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip(),
        "cpus": os.cpu_count(),
        "results": results,
    }
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(summary_table(results))
    print(f"results: {args.out}")
    if args.smoke and args.results_dir is None:
        print("a --smoke run: no result file written (give --results-dir to have one)")
        return
    argv_used = sys.argv[1:] if argv is None else list(argv)
    written = write_result_file(
        repeats,
        args,
        shlex.join(["python", "-m", "bench.lobby_bench", *argv_used]),
        Path(args.results_dir) if args.results_dir else result_files.RESULTS_DIR,
        load_before,
    )
    print(f"wrote {written}" if written else "no repeat measured echo: no result file written")
    if "echo-ws" in args.targets.split(","):
        from bench import lobby_ws

        written = lobby_ws.write_result_file(
            repeats,
            args,
            shlex.join(["python", "-m", "bench.lobby_bench", *argv_used]),
            Path(args.results_dir) if args.results_dir else result_files.RESULTS_DIR,
            load_before,
        )
        print(f"wrote {written}" if written else "no repeat measured echo-ws: no L1-WS file")


def run_targets(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    """One run of every target, one after the other."""
    results: list[dict[str, Any]] = []
    for name in args.targets.split(","):
        if name in ("colyseus", "echo-ws"):  # (echo-ws's bots run on Colyseus's Node packages)
            why = _ensure_colyseus()
            if why is not None:
                results.append({"target": name, "error": why})
                print(f"{name}: not measured: {why}", flush=True)
                continue
            target: Target = Colyseus() if name == "colyseus" else EchoWs()
        else:
            target = Echo()
        print(f"==> {name}", flush=True)
        try:
            results.append(run_target(target, args, work))
        except RuntimeError as error:
            results.append({"target": name, "error": str(error)})
            print(f"{name}: failed: {error}", flush=True)
    return results


#: The figures of the result file: (metric, unit, lower is better, how to read it from a
#: target's record). Chat delivered is the share of the deliveries the bots expected that came.
FIGURES: tuple[tuple[str, str, bool, Callable[[dict[str, Any]], float | None]], ...] = (
    ("joins/s", "joins/s", False, lambda r: r["join"]["joins_per_s"]),
    (
        "members seated",
        "%",
        False,
        lambda r: 100 * r["join"]["members_seated"] / r["join"]["expected"],
    ),
    ("join p50", "ms", True, lambda r: r["join"]["latency_ms_p50"]),
    ("join p99", "ms", True, lambda r: r["join"]["latency_ms_p99"]),
    (
        "chat delivered",
        "%",
        False,
        lambda r: (
            100 * r["chat"]["deliveries"] / r["chat"]["expected_deliveries"]
            if r["chat"]["expected_deliveries"]
            else None
        ),
    ),
    ("chat delivery p50", "ms", True, lambda r: r["chat"]["delivery_ms_p50"]),
    ("chat delivery p99", "ms", True, lambda r: r["chat"]["delivery_ms_p99"]),
    ("search p50", "ms", True, lambda r: r["search"]["latency_ms_p50"]),
    ("search p99", "ms", True, lambda r: r["search"]["latency_ms_p99"]),
    ("server CPU idle", "%", True, lambda r: r["idle"]["server_cpu_pct"]),
    ("server CPU chat", "%", True, lambda r: r["chat"]["server_cpu_pct"]),
    # (per search answered: the phase's server CPU seconds over the searches that got a page)
    (
        "server CPU per search",
        "ms",
        True,
        lambda r: (
            1000 * r["search"]["server_cpu_s"] / r["search"]["searches"]
            if r["search"]["searches"]
            else None
        ),
    ),
    ("server RSS peak", "MiB", True, lambda r: r["server"]["rss_mib_peak"]),
)
ECHO_SUBJECT = "echo_lobby"
PEER_SUBJECT = "colyseus"
PEER_LABEL = "Colyseus 0.16 on Node 20"


#: The issue's goals for L1, as ratios to Colyseus's figure of the same repeat.
TARGETS: dict[str, tuple[str, float, str]] = {
    "joins/s": (">=", 1.0, "ratio"),
    "server RSS peak": ("<=", 1.0, "ratio"),
    "server CPU idle": ("<=", 1.0, "ratio"),
    "chat delivery p99": ("<=", 1.0, "ratio"),
    "search p99": ("<=", 2.0, "ratio"),
}


def with_targets(
    figures: dict[tuple[str, str], Result],
    targets: dict[str, tuple[str, float, str]],
    with_peer: bool,
) -> dict[tuple[str, str], Result]:
    """`figures` with each one `targets` names carrying its goal (only next to the peer)."""
    if not with_peer:
        return figures
    import attrs

    return {
        key: attrs.evolve(figure, target=targets[key[1]]) if key[1] in targets else figure
        for key, figure in figures.items()
    }


def figures_of(record: dict[str, Any], subject: str, peer: bool) -> dict[tuple[str, str], Result]:
    """A target's record as Results; echo's compared to the peer's of the same repeat."""
    found: dict[tuple[str, str], Result] = {}
    if "join" not in record:
        return found  # the target failed in this repeat
    for metric, unit, lower, read in FIGURES:
        try:
            value = read(record)
        except (KeyError, TypeError, ZeroDivisionError):
            value = None
        if value is None:
            continue
        found[subject, metric] = Result(
            subject,
            metric,
            float(value),
            unit,
            baseline=(PEER_SUBJECT, metric) if peer else None,
            lower_is_better=lower,
        )
    return found


def write_result_file(
    repeats: list[list[dict[str, Any]]],
    args: argparse.Namespace,
    command: str,
    directory: Path,
    load_before: dict[str, float],
) -> Path | None:
    """bench/results/lobby.json: echo's figures per repeat against Colyseus's of the same one.

    Repeats in which echo failed are left out; if Colyseus did not run (or failed) in a repeat
    that echo ran, echo's figures have no baseline at all rather than one from another run.
    """
    measured = [
        {r["target"]: r for r in repeat}
        for repeat in repeats
        if any(r["target"] == "echo" and "join" in r for r in repeat)
    ]
    if not measured:
        return None
    with_peer = all("join" in repeat.get("colyseus", {}) for repeat in measured)
    by_key = []
    for repeat in measured:
        echo = figures_of(repeat["echo"], ECHO_SUBJECT, with_peer)
        figures = with_targets(echo, TARGETS, with_peer)
        if with_peer:
            figures.update(figures_of(repeat["colyseus"], PEER_SUBJECT, False))
        by_key.append(figures)
    own = [key for key in by_key[0] if key[0] == ECHO_SUBJECT]
    record, left_out = result_files.from_repeats(
        bench_id="lobby",
        label="L1",
        title=f"L1: {args.lobbies} lobbies of {args.members} on one echo-lobby, bots in "
        f"{args.bot_procs} processes, {args.chat_rate:g} chat lines/s for "
        f"{args.chat_seconds:g} s, {args.searches} searches per bot process",
        command=command,
        own=own,
        repeats=by_key,
        machine=result_files.machine_info(load_before, result_files.system_load()),
        settings={
            key: value
            for key, value in vars(args).items()
            if key not in ("role", "out", "results_dir", "profile")
        },
        labels={PEER_SUBJECT: PEER_LABEL},
    )
    for note in left_out:
        print(f"left out of the result file: {note}", file=sys.stderr)
    return record.write(directory) if record is not None else None


if __name__ == "__main__":
    main()
