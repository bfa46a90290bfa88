"""What an idle session costs: one SessionServer process and client processes holding N idle
sessions, their CPU over fixed idle windows, and the datagrams that CPU went on.

    python -m bench.idle                                  # 1,000 sessions, lobby timers, 5 x 10 s
    python -m bench.idle --sessions 1200 --timers echo --ports shared
    python -m bench.idle --smoke                          # seconds: it runs at all
    python -m bench.idle --profile /tmp/idle-prof         # py-spy of both sides, 1 window
    python -m bench.idle --repeat 3 --write               # bench/results/idle.json (the page)

A lobby server of thousands of mostly idle members (the lobby's L1), or an echo server of
thousands of quiet clients (B4), spends its CPU on the transport's idle traffic:
heartbeats, status messages, liveness and expiry checks, the timer loop and the reader that
serve them. This measures exactly that and nothing else: the server runs `echo.session`'s
`SessionServer` with an application that waits on each session's `receive` (as a lobby's or an
echo server's reader does); each client process opens its share of the sessions on one shared
transport (as the lobby bench's bot processes do) and waits on `receive` too. Nobody sends a
message. Once every session is open and the handshakes' leftovers have gone (`--settle`), each
of `--repeat` windows of `--seconds` reads every process's CPU (utime + stime from /proc) and
its transport's datagram counters at both ends of the window.

Printed per window and as median [min - max] over the windows:
- server and clients: % of one core, µs of CPU per session-second, µs per datagram (the
  process's datagrams sent + received), datagrams per session-second sent and received;
- sessions still open at the end (an idle session must not drop).

`--timers lobby` is `echo.lobby.timers` (server: lobby_server_timers, clients:
lobby_client_timers), `--timers echo` is `echo.session.timers.echo_timers` on both ends.
`--ports` is the server's `ServerConfig.duologue_ports` (per-client: two sockets per session on
each end; shared: two for all on the server). The load average before and after is recorded:
this machine is shared, and only runs taken close together (interleaved) compare.
`ECHO_INTERPRETED=1` in the environment (or `--interpreted`) runs the children on the sources
where a compiled build exists. `--write` records the run in bench/results/idle.json (through
bench/results.py, each window a repeat) for the generated benchmark page: the server's CPU per
idle session-second against its target (15 µs), its datagrams, the clients' CPU, and the
sessions that dropped (none may).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parents[1]
#: the goal for the server's CPU per idle session-second (µs)
TARGET_US_PER_SESSION_SECOND = 15.0
#: handshakes each client process runs at once while the sessions open
CONNECT_CONCURRENCY = 40
#: tries of each session's handshake
CONNECT_ATTEMPTS = 3


def _raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _quiet_logging() -> None:
    from echo.log import configure_logging

    configure_logging("json", "warning", sys.stderr)


def _timers(kind: str, side: str) -> Any:
    if kind == "lobby":
        from echo.lobby.timers import lobby_client_timers, lobby_server_timers

        return lobby_server_timers() if side == "server" else lobby_client_timers()
    from echo.session.timers import echo_timers

    return echo_timers()


def _say(payload: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(payload) + "\n")
    sys.stdout.flush()


async def _commands(snapshot: Any) -> None:
    """Answer the parent's lines on stdin: 'snap' -> a JSON snapshot, 'quit' (or EOF) -> end."""
    import trio

    while True:
        line = await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
        command = line.strip()
        if command == "snap":
            _say({"snap": snapshot()})
        elif command in ("quit", ""):
            return


# ------------------------------------------------------------------------------ children


def run_server(args: argparse.Namespace) -> None:
    import trio

    from echo.session import ServerConfig, SessionError, SessionServer

    _raise_nofile()
    _quiet_logging()
    base = args.base_port
    config = ServerConfig(
        address="127.0.0.1",
        port=base,
        control_port=base + 1,
        clients_base_port=base + 2,
        # (Room for handshakes retried while the server is busy admitting hundreds at once:
        # each retried HELLO holds a duologue until it expires.)
        max_clients=2 * args.sessions + 16,
        max_per_ip=2 * args.sessions + 16,
        duologue_ports=args.ports,
    )
    joined = 0

    class Quiet:
        def emit(self, event: str, **fields: Any) -> None:
            pass

    async def app(session: Any) -> None:
        nonlocal joined
        joined += 1
        try:
            async for _ in session:
                pass
        except SessionError:
            pass
        finally:
            joined -= 1

    async def main() -> None:
        server = SessionServer(
            config, app, transport_config=_timers(args.timers, "server"), events=Quiet()
        )

        def snapshot() -> dict[str, Any]:
            assert server.transport is not None
            counters = server.transport.counters
            return {
                "cpu": time.process_time(),
                "sessions": joined,
                "sent": counters.datagrams_sent,
                "received": counters.datagrams_received,
            }

        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            _say({"ready": True})
            await _commands(snapshot)
            nursery.cancel_scope.cancel()

    trio.run(main)


def run_clients(args: argparse.Namespace) -> None:
    import trio

    from echo.session import SessionError, connect
    from echo.session.client import client_transport_config
    from echo.transport import open_transport

    _raise_nofile()
    _quiet_logging()
    base = args.base_port
    opened = 0
    failed = 0

    alive = 0
    reasons: dict[str, int] = {}
    #: why sessions that were open ended (an idle session must not end)
    ends: dict[str, int] = {}

    async def one(transport: Any, limiter: trio.CapacityLimiter, done: trio.Event) -> None:
        nonlocal opened, failed, alive
        # (A handshake that fails on a loaded machine is tried again, as a game's client
        # would: what is measured is the idle sessions, not the admission.) The limiter holds
        # back only the handshakes; the session is used inside `connect`'s block (its
        # nursery and cancel scopes must close in the order they opened).
        for _ in range(CONNECT_ATTEMPTS):
            await limiter.acquire()
            holding = True
            try:
                async with connect(
                    "127.0.0.1",
                    base,
                    base + 1,
                    transport=transport,
                    timeout=10.0,
                    duologue_ports=args.ports,
                ) as session:
                    limiter.release()
                    holding = False
                    opened += 1
                    alive += 1
                    if opened + failed == args.sessions:
                        done.set()
                    try:
                        async for _ in session:
                            pass
                    except SessionError as error:
                        ended = type(error).__name__ + ": " + str(error)[:80]
                        ends[ended] = ends.get(ended, 0) + 1
                    finally:
                        alive -= 1
                return
            except SessionError as error:
                if not holding:
                    return  # the session was open: leaving it went wrong, it is gone anyway
                reason = type(error).__name__ + ": " + str(error)[:80]
                reasons[reason] = reasons.get(reason, 0) + 1
            finally:
                if holding:
                    limiter.release()
        failed += 1
        if opened + failed == args.sessions:
            done.set()

    async def main() -> None:
        config = client_transport_config(_timers(args.timers, "client"))
        async with open_transport(config) as transport:

            def snapshot() -> dict[str, Any]:
                counters = transport.counters
                return {
                    "cpu": time.process_time(),
                    "sessions": alive,
                    "failed": failed,
                    "ended": dict(ends),
                    "sent": counters.datagrams_sent,
                    "received": counters.datagrams_received,
                }

            async with trio.open_nursery() as nursery:
                limiter = trio.CapacityLimiter(CONNECT_CONCURRENCY)
                done = trio.Event()
                for _ in range(args.sessions):
                    nursery.start_soon(one, transport, limiter, done)
                await done.wait()
                _say({"ready": True, "opened": opened, "failed": failed, "retried": reasons})
                await _commands(snapshot)
                nursery.cancel_scope.cancel()

    trio.run(main)


# ------------------------------------------------------------------------------ the parent


class Child:
    """A child process speaking JSON lines on stdout, commands on stdin."""

    def __init__(self, argv: list[str], label: str, env: dict[str, str]) -> None:
        self.label = label
        self.proc = subprocess.Popen(
            argv,
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.pid = self.proc.pid
        self.lines: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.cond = threading.Condition()
        self.eof = False
        assert self.proc.stdout is not None and self.proc.stderr is not None
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()
        self._error_reader = threading.Thread(
            target=self._errors, args=(self.proc.stderr,), daemon=True
        )
        self._error_reader.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            if line.startswith("{"):
                with self.cond:
                    self.lines.append(json.loads(line))
                    self.cond.notify_all()
        with self.cond:
            self.eof = True
            self.cond.notify_all()

    def _errors(self, stream: IO[str]) -> None:
        for line in stream:
            self.errors.append(line.rstrip())
            del self.errors[:-400]

    def wait_for(self, key: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for i, line in enumerate(self.lines):
                    if key in line:
                        return self.lines.pop(i)
                left = deadline - time.monotonic()
                if self.eof or left <= 0:
                    why = "exited" if self.eof else f"no {key!r} within {timeout:.0f} s"
                    errors = "\n".join(self.errors)
                    raise RuntimeError(f"{self.label}: {why}; stderr:\n{errors}")
                self.cond.wait(left)

    def tell(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def snap(self) -> dict[str, Any]:
        self.tell("snap")
        found: dict[str, Any] = self.wait_for("snap", 10.0)["snap"]
        return found

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.tell("quit")
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.send_signal(signal.SIGKILL)
                self.proc.wait()
        # (Every line of its stderr read: a caller looks there for why it ended.)
        self._error_reader.join(timeout=5)


def _free_base(ports: str, sessions: int) -> int:
    """A base port with room for the server's ports, all of them free when probed (the
    machine is shared: other runs and test suites hold ports in the same ranges; one taken
    between the probe and the server's bind is tried again by `run`)."""
    span = 2 + (2 if ports == "shared" else 2 * (2 * sessions + 16))
    for _ in range(50):
        base = random.randrange(20000, 60000 - span, 2)
        if _all_free(base, span):
            return base
    raise RuntimeError(f"no {span} free ports found in 20000-60000")


def _all_free(base: int, span: int) -> bool:
    import socket

    socks: list[socket.socket] = []
    try:
        for port in range(base, base + span):
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            socks.append(sock)
            sock.bind(("127.0.0.1", port))
    except OSError:
        return False
    finally:
        for sock in socks:
            sock.close()
    return True


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def _window(
    server: Child, clients: Sequence[Child], seconds: float, sessions: int
) -> dict[str, Any]:
    """One idle window: CPU and datagrams of each side over `seconds`."""
    procs = [server, *clients]
    # (The children's own process CPU clock: nanoseconds, where /proc counts 10 ms ticks.)
    before = [(snap["cpu"], snap) for snap in (c.snap() for c in procs)]
    start = time.monotonic()
    time.sleep(seconds)
    after = [(snap["cpu"], snap) for snap in (c.snap() for c in procs)]
    elapsed = time.monotonic() - start

    def side(indices: range) -> dict[str, float]:
        cpu = sum(after[i][0] - before[i][0] for i in indices)
        sent = sum(after[i][1]["sent"] - before[i][1]["sent"] for i in indices)
        received = sum(after[i][1]["received"] - before[i][1]["received"] for i in indices)
        session_seconds = sessions * elapsed
        return {
            "cpu_percent": 100 * cpu / elapsed,
            "us_per_session_second": 1e6 * cpu / session_seconds,
            "us_per_datagram": 1e6 * cpu / (sent + received) if sent + received else 0.0,
            "sent_per_session_second": sent / session_seconds,
            "received_per_session_second": received / session_seconds,
        }

    return {
        "seconds": elapsed,
        "server": side(range(0, 1)),
        "clients": side(range(1, len(procs))),
        "server_sessions": after[0][1]["sessions"],
        "client_sessions": sum(after[i][1]["sessions"] for i in range(1, len(procs))),
        # why client sessions ended, over the whole run so far
        "client_ends": _merged(after[i][1].get("ended", {}) for i in range(1, len(procs))),
    }


def _merged(counts: Any) -> dict[str, int]:
    total: dict[str, int] = {}
    for each in counts:
        for key, n in each.items():
            total[key] = total.get(key, 0) + n
    return total


def _summary(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    env = dict(os.environ)
    if args.interpreted:
        env["ECHO_INTERPRETED"] = "1"
    load_before = os.getloadavg()
    _raise_nofile()
    for attempt in range(5):  # (a port taken between the probe and the bind: another base)
        base = _free_base(args.ports, args.sessions)
        common = [
            "--sessions", str(args.sessions), "--timers", args.timers, "--ports", args.ports,
            "--base-port", str(base),
        ]  # fmt: skip
        server = Child([sys.executable, "-m", "bench.idle", "_server", *common], "server", env)
        try:
            server.wait_for("ready", 30)
            break
        except RuntimeError:
            server.stop()
            if attempt == 4 or not any("cannot bind" in line for line in server.errors):
                raise
    clients: list[Child] = []
    try:
        for index, count in enumerate(_split(args.sessions, args.client_procs)):
            argv = [sys.executable, "-m", "bench.idle", "_clients", *common]
            argv[argv.index("--sessions") + 1] = str(count)
            clients.append(Child(argv, f"clients {index}", env))
        opened = 0
        for child in clients:
            ready = child.wait_for("ready", args.connect_timeout)
            opened += ready["opened"]
            if ready["retried"]:
                print(f"{child.label}: handshakes tried again: {ready['retried']}", file=sys.stderr)
        if opened < args.sessions:
            raise RuntimeError(f"only {opened} of {args.sessions} sessions opened")
        time.sleep(args.settle)
        profilers: list[subprocess.Popen[bytes]] = []
        if args.profile:
            profilers = _start_profiles(args.profile, server, clients, args.seconds)
        windows = []
        for index in range(args.repeat):
            window = _window(server, clients, args.seconds, args.sessions)
            windows.append(window)
            if not args.quiet:
                _print_window(index, window)
        for profiler in profilers:
            profiler.wait()
    finally:
        for child in [*clients, server]:
            child.stop()
    load_after = os.getloadavg()
    result: dict[str, Any] = {
        "sessions": args.sessions,
        "timers": args.timers,
        "ports": args.ports,
        "client_procs": args.client_procs,
        "interpreted": bool(args.interpreted or os.environ.get("ECHO_INTERPRETED")),
        "seconds": args.seconds,
        "load_before": load_before,
        "load_after": load_after,
        "windows": windows,
    }
    for side in ("server", "clients"):
        result[side] = {
            metric: _summary([w[side][metric] for w in windows]) for metric in windows[0][side]
        }
    result["sessions_open_at_end"] = {
        "server": windows[-1]["server_sessions"],
        "clients": windows[-1]["client_sessions"],
    }
    return result


def _start_profiles(
    directory: str, server: Child, clients: Sequence[Child], seconds: float
) -> list[subprocess.Popen[bytes]]:
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    Path(directory).mkdir(parents=True, exist_ok=True)
    started = []
    for child in [server, *clients]:
        name = child.label.replace(" ", "")
        started.append(
            subprocess.Popen(
                [spy, "record", "--nonblocking", "-r", "250", "-d", str(int(seconds)),
                 "-f", "raw", "-o", f"{directory}/{name}.txt", "-p", str(child.pid)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )  # fmt: skip
    return started


def _print_window(index: int, window: dict[str, Any]) -> None:
    parts = [f"window {index}:"]
    for side in ("server", "clients"):
        figures = window[side]
        parts.append(
            f"{side} {figures['cpu_percent']:.1f} % {figures['us_per_session_second']:.1f} "
            f"us/session-s {figures['us_per_datagram']:.1f} us/dgram "
            f"({figures['sent_per_session_second']:.2f} out, "
            f"{figures['received_per_session_second']:.2f} in /session-s);"
        )
    print(" ".join(parts), file=sys.stderr, flush=True)


def format_result(result: dict[str, Any]) -> str:
    def figure(side: str, metric: str, digits: int = 1) -> str:
        s = result[side][metric]
        return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}-{s['max']:.{digits}f}]"

    build = "interpreted" if result["interpreted"] else "as built"
    lines = [
        f"idle: {result['sessions']} sessions, {result['timers']} timers, {result['ports']} ports, "
        f"{result['client_procs']} client procs, {build}, {len(result['windows'])} x "
        f"{result['seconds']:g} s; load {result['load_before'][0]:.2f} -> "
        f"{result['load_after'][0]:.2f}",
    ]
    for side in ("server", "clients"):
        lines.append(
            f"  {side:7}  cpu {figure(side, 'cpu_percent')} %  "
            f"{figure(side, 'us_per_session_second')} us/session-s  "
            f"{figure(side, 'us_per_datagram')} us/datagram  "
            f"out {figure(side, 'sent_per_session_second', 2)} "
            f"in {figure(side, 'received_per_session_second', 2)} /session-s"
        )
    end = result["sessions_open_at_end"]
    lines.append(f"  sessions open at the end: server {end['server']}, clients {end['clients']}")
    return "\n".join(lines)


def result_record(result: dict[str, Any], argv: Sequence[str]) -> Any:
    """The run as bench/results/idle.json: each window a repeat."""
    import shlex

    from bench import results as result_files
    from bench.harness import Result

    sessions = result["sessions"]
    repeats = []
    for window in result["windows"]:
        server, clients = window["server"], window["clients"]
        figures = [
            Result("idle_server", "CPU per session-second", server["us_per_session_second"],
                   "µs", lower_is_better=True,
                   target=("<=", TARGET_US_PER_SESSION_SECOND, "value")),
            Result("idle_server", "CPU per datagram", server["us_per_datagram"], "µs",
                   lower_is_better=True),
            Result("idle_server", "datagrams out per session-second",
                   server["sent_per_session_second"], "", lower_is_better=True),
            Result("idle_server", "datagrams in per session-second",
                   server["received_per_session_second"], "", lower_is_better=True),
            Result("idle_clients", "CPU per session-second", clients["us_per_session_second"],
                   "µs", lower_is_better=True),
            Result("idle_sessions", "dropped", sessions - min(
                window["server_sessions"], window["client_sessions"]), "",
                lower_is_better=True, target=("<=", 0, "value")),
        ]  # fmt: skip
        repeats.append({(figure.name, figure.metric): figure for figure in figures})
    names = ("loadavg_1m", "loadavg_5m", "loadavg_15m")
    load_before = dict(zip(names, result["load_before"], strict=True))
    load_after = dict(zip(names, result["load_after"], strict=True))
    build = "interpreted" if result["interpreted"] else result_files.echo_build()
    machine = {**result_files.machine_info(load_before, load_after), "echo_build": build}
    record, left_out = result_files.from_repeats(
        bench_id="idle",
        label="",
        title=f"Idle sessions: what {sessions} idle sessions (lobby timers) cost a SessionServer "
        "per session-second, in CPU and datagrams",
        command=shlex.join(["python", "-m", "bench.idle", *argv]),
        own=list(repeats[0]),
        repeats=repeats,
        machine=machine,
        settings={
            key: result[key]
            for key in ("sessions", "timers", "ports", "client_procs", "seconds", "interpreted")
        },
    )
    for note in left_out:
        print(f"left out of idle.json: {note}", file=sys.stderr)
    return record


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.idle", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("role", nargs="?", default="run", choices=("run", "_server", "_clients"))
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--timers", choices=("lobby", "echo"), default="lobby")
    parser.add_argument("--ports", choices=("per-client", "shared"), default="per-client")
    parser.add_argument("--client-procs", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=10.0, help="one idle window")
    parser.add_argument("--repeat", type=int, default=5, help="idle windows measured")
    parser.add_argument("--settle", type=float, default=5.0,
                        help="seconds after the last session opened before measuring")
    parser.add_argument("--connect-timeout", type=float, default=300.0)
    parser.add_argument("--interpreted", action="store_true",
                        help="children import the sources even where a build exists")
    parser.add_argument("--profile", metavar="DIR", help="py-spy of every process (sampled "
                        "without pausing it: a paused process lets idle sessions time out), "
                        "over the first window (raw collapsed stacks, one file per process)")
    parser.add_argument("--json", metavar="FILE", help="also write the result here")
    parser.add_argument("--write", action="store_true",
                        help="record the run in bench/results/idle.json (the benchmark page)")
    parser.add_argument("--smoke", action="store_true",
                        help="20 sessions, 2 windows of 1 s: it runs at all")
    parser.add_argument("--quiet", action="store_true", help="no line per window")
    parser.add_argument("--base-port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.smoke:
        args.sessions, args.seconds, args.repeat, args.settle = 20, 1.0, 2, 0.5
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.role == "_server":
        run_server(args)
        return 0
    if args.role == "_clients":
        run_clients(args)
        return 0
    result = run(args)
    print(format_result(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    if args.write:
        record = result_record(result, sys.argv[1:] if argv is None else list(argv))
        if record is not None:
            print(f"wrote {record.write()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
