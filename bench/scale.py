"""B4: N concurrent Echo 2.0 clients against one echo-server process.

    python -m bench.scale [--clients 100,500,1000] [--seconds 30] [--processes 4] [--pin 0,1]
                          [--after-storm 10] [--ramp S] [--duologue-ports shared]
                          [--profile DIR] [--interval 1] [--sources client|one]
                          [--storm-clients K] [--per-transport K]
    python -m bench.scale --clients 5000 --duologue-ports shared --interval 5   # 5,000 row
    python -m bench.run --only scale [--quick]

The 5,000-client row runs with shared duologue ports only: per-client ports would need 20,000
ports for the server's 2 N duologues (start_server says so). Its clients echo every 5 s, so
the server sees the 1,000-client row's 1,000 echoes/s over five times the connections: echoing
once a second, 5,000 `EchoClient`s need more than this 2-core machine (the 1,000-client row's
client processes take about half a core, so 5,000 would take 2.5 cores beside the server).
`--storm-clients K` makes the storm K clients (0: none, the steady part alone): every reply of
the storm goes to every client still in its handshake (the all-clients channel is one MDC
publication), so a storm's work grows with the square of its size.

Each client sends from an address of its own (`--sources client`: 127.N.x.y, every 127/8
address being this host's; `EchoClient`'s `source`), as clients behind different NATs do, so
the server's per-host limits (the rate of cookie challenges to unvalidated addresses,
`--max-per-ip`) count each on its own. `--sources one` sends them all from 127.0.0.1, as the
bench did before 2026-11-28: at 5,000 clients the per-host limits then hold most of them back.
`--per-transport K` makes K clients of a process share one transport (`EchoClient(transport=)`,
as a game's bots would), sending from one address (K clients behind one NAT): each client then
costs its process its session's streams only, not a driver, its sockets and timers of its own.

The server is `python -m echo.server.cli` in its own process. The clients share a few
processes, as a library user would run them (many `EchoClient`s in one trio program); each
client echoes once a second (`--interval`). The issue asks for two things, measured in two
parts per N:

1. storm: all N clients start within the same second (each at a random moment of it).
   handshakes/s = clients connected / time from the start until the last one's first echo
   (the client processes are started and have imported everything before that clock starts).
   Also each phase of a handshake, as the clients saw it: the all-clients channel connecting
   (start -> HELLO sent), the CONNECT (HELLO -> CONNECT), the duologue (CONNECT -> first echo
   back). The storm's clients then echo for `--after-storm` seconds: `echo p99 after storm`,
   without a target, because these clients echo in step: the server answers the HELLOs that
   queued up together in one batch, so the clients of a batch join their duologues together
   and, each echoing a second after its last ECHO, keep echoing together (bursts of a few
   hundred echoes within 100 ms at 1,000 clients).
2. steady: the storm's clients leave; once the server has closed their duologues, N new
   clients start at random moments over `--ramp` seconds, so that each echoes once a second
   at a moment of its own, as independent clients do. (Each keeps its moment because
   `EchoClient` sends on its own cadence, a second after its last ECHO; when the next ECHO was
   due a second after the last *reply*, as before 2026-11-28, a slow moment of the server or
   of a client process delayed a group of replies together, that group then echoed together,
   and such groups grew: at 1,000 clients pinned, bursts of ~200 echoes within 100 ms and p99
   80 ms against 18 ms now.) Once every one has connected (or
   failed), they echo for `--seconds`; the server's CPU (% of one core, from /proc) and the
   clients' round trips (as `EchoClient` reports them) are taken from `min(5, seconds / 4)`
   seconds into that phase to its end, the server's RSS at its end. The targets apply
   to these figures and to the storm's handshakes/s.

The server holds up to 2 N duologues, so the storm's may still be closing while the steady
clients arrive. With `--pin A,B,...` the server runs on CPU A and the client processes on the
others: the server's figures are then its own, not shared with the clients it serves. Each
row also has the client processes' CPU and their longest garbage-collector pauses, so a reader
can tell when the clients, not the server, set the latency; once a population is in, each
client process freezes it out of its collector's passes (a load generator's 250 clients in
one process are not what a game runs). Raises RLIMIT_NOFILE (every client holds a few UDP
sockets) for itself and its children.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import multiprocessing as mp
import os
import queue
import random
import resource
import shlex
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

from bench import results as result_files
from bench import scale_raw
from bench.duologue_bench import start_server
from bench.harness import (
    BenchError,
    Result,
    Settings,
    Target,
    cpu_seconds_of,
    format_figure,
    percentile,
)
from bench.scale_raw import client_address, per_datagram, udp_datagrams

DEFAULT_CLIENTS = (100, 500, 1000)
#: an extra row (not in the defaults: it takes minutes, and shared ports only)
LARGE_CLIENTS = 5000
DEFAULT_SECONDS = 30.0
#: Seconds the storm's clients echo after the last one is in (`echo p99 after storm`).
DEFAULT_AFTER_STORM = 10.0
#: The steady part's clients start over N / RAMP_RATE seconds (at least one).
RAMP_RATE = 200.0
#: `bench.run --quick`: one small N, a few seconds, so the smoke run stays short.
QUICK_CLIENTS = (20,)
QUICK_SECONDS = 3.0
QUICK_AFTER_STORM = 1.0
PROCESSES = 4
#: B4 runs each N with both duologue modes (echo-server --duologue-ports)
MODES = ("per-client", "shared")
#: Every wait of a client (connect, CONNECT reply, echo) is bounded by this; at 1,000 clients
#: starting at once the handshakes may take tens of seconds.
CLIENT_TIMEOUT = 60.0
#: Bound on the wait for the server to close the storm's duologues before the steady part.
STORM_CLOSE_TIMEOUT = 15.0
#: Echoes of the storm's clients in their first seconds are still part of the storm.
AFTER_STORM_SKIP = 2.0
#: A collector pause at least this long is reported with its time (shorter ones only counted).
GC_PAUSE_REPORTED = 0.001
#: The goals, at 1,000 clients.
TARGET_CLIENTS = 1000
TARGETS: dict[str, Target] = {
    "handshakes/s": Target(">=", 200),
    "server CPU": Target("<=", 60),
    "server RSS": Target("<=", 600e6 / 2**20, note="600 MB"),
    "echo p99": Target("<=", 20),
}


def raise_fd_limit() -> int:
    """Soft RLIMIT_NOFILE up to the hard limit (children inherit it); returns the new soft."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 65536
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        target = soft
    return target


def ramp_seconds(clients: int) -> float:
    return max(1.0, clients / RAMP_RATE)


# ------------------------------------------------------------------ client processes


class _GcPauses:
    """Every collection of this process: how many, and when the longer ones were (wall s)."""

    def __init__(self) -> None:
        self.long: list[tuple[float, int, float]] = []  # (time.time(), generation, seconds)
        self.counts = [0, 0, 0]
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        pause = time.perf_counter() - self._started
        generation = info["generation"]
        self.counts[generation] += 1
        if pause >= GC_PAUSE_REPORTED:
            self.long.append((time.time(), generation, pause))


def client_process(
    index: int,
    port: int,
    control_port: int,
    count: int,
    ramp: float,
    out: Any,
    events: dict[str, Any],
    duologue_ports: str = "per-client",
    interval: float = 1.0,
    sources: str = "client",
    storm_count: int | None = None,
    per_transport: int = 1,
) -> None:
    try:
        raise_fd_limit()
        # Imported before "ready": the handshake clock starts after every process is loaded.
        import echo.client.client  # noqa: F401

        pauses = _GcPauses()
        gc.callbacks.append(pauses)
        out.put(("ready", index, None))
        events["go"].wait()
        trio.run(
            _clients,
            index,
            port,
            control_port,
            count,
            ramp,
            out,
            events,
            duologue_ports,
            interval,
            sources,
            count if storm_count is None else storm_count,
            per_transport,
        )
        out.put(("done", index, {"gc_long": pauses.long, "gc_counts": pauses.counts}))
    except BaseException:
        out.put(("error", index, traceback.format_exc()))


class _Population:
    """`count` EchoClients started at random moments of `spread` seconds, and what they saw."""

    def __init__(
        self,
        port: int,
        control_port: int,
        count: int,
        spread: float,
        seed: int,
        duologue_ports: str = "per-client",
        interval: float = 1.0,
        source_octet: int | None = None,
        per_transport: int = 1,
    ):
        self.duologue_ports = duologue_ports
        #: clients sharing one transport (1: each its own, as `echo-client` runs)
        self.per_transport = per_transport
        self.interval = interval
        #: N: client k sends from 127.N.x.y (scale_raw.client_address); None: the system's choice
        self.source_octet = source_octet
        self.port = port
        self.control_port = control_port
        self.count = count
        self.spread = spread
        self.rng = random.Random(seed)
        self.clients: list[Any] = []
        # Per client (wall clock): started, HELLO sent, CONNECT received, first echo back.
        self.phases: list[dict[str, float]] = []
        self.rtts: list[tuple[float, float]] = []  # (time.time() of the reply, rtt s)
        self.failures: list[str] = []
        self.settled = 0
        self.all_settled = trio.Event()
        self.stopped = False
        self.numbered = 0
        if count == 0:
            self.all_settled.set()  # no storm (--storm-clients 0)

    def _settle(self) -> None:
        # Connected or failed: the parent moves on when every client is one.
        self.settled += 1
        if self.settled == self.count:
            self.all_settled.set()

    async def run(self) -> None:
        async with contextlib.AsyncExitStack() as stack:
            shared: list[Any] = []
            if self.per_transport > 1:
                from echo.client.client import bound_to
                from echo.session.client import client_transport_config
                from echo.transport import open_transport
                from echo.transport.driver.sockets import open_udp_socket

                # Transport j sends from client j's address (the clients that share it, from
                # one address, as clients behind one NAT).
                for j in range(-(-self.count // self.per_transport)):
                    factory = (
                        open_udp_socket
                        if self.source_octet is None
                        else bound_to(client_address(self.source_octet, j))
                    )
                    opened = open_transport(client_transport_config(), socket_factory=factory)
                    shared.append(await stack.enter_async_context(opened))
            async with trio.open_nursery() as nursery:
                for k in range(self.count):
                    transport = shared[k // self.per_transport] if shared else None
                    nursery.start_soon(self._one, self.rng.uniform(0.0, self.spread), transport)

    def stop(self) -> None:
        self.stopped = True
        for client in self.clients:
            client.stop()

    async def _one(self, delay: float, transport: Any = None) -> None:
        from echo.client.application import EchoReceived
        from echo.client.client import ClientConfig, EchoClient

        number = self.numbered
        self.numbered += 1
        source = None
        if self.source_octet is not None and transport is None:
            source = client_address(self.source_octet, number)
        await trio.sleep(delay)
        if self.stopped:
            return
        phases = {"start": time.time()}
        self.phases.append(phases)
        first = True

        def on_state(name: str, fields: dict[str, Any]) -> None:
            if name == "hello_sent":
                phases["hello"] = time.time()
            elif name == "joining_duologue":
                phases["connect"] = time.time()

        def on_echo(echo: EchoReceived) -> None:
            nonlocal first
            now = time.time()
            if first:
                first = False
                phases["first_echo"] = now
                self._settle()
            self.rtts.append((now, echo.rtt))

        client = EchoClient(
            ClientConfig(
                port=self.port,
                control_port=self.control_port,
                interval=self.interval,
                timeout=CLIENT_TIMEOUT,
                duologue_ports=self.duologue_ports,
                source=source,
            ),
            on_echo=on_echo,
            on_state=on_state,
            transport=transport,
        )
        self.clients.append(client)
        machine = await client.run()
        if machine.failure is not None:
            self.failures.append(machine.failure.message)
            if first:
                self._settle()

    def report(self) -> dict[str, Any]:
        return {"phases": self.phases, "rtts": self.rtts, "failures": self.failures}


async def _wait_for(event: Any) -> None:
    await trio.to_thread.run_sync(event.wait, abandon_on_cancel=True)


async def _clients(
    index: int,
    port: int,
    control_port: int,
    count: int,
    ramp: float,
    out: Any,
    events: dict[str, Any],
    duologue_ports: str = "per-client",
    interval: float = 1.0,
    sources: str = "client",
    storm_count: int | None = None,
    per_transport: int = 1,
) -> None:
    from echo.log import configure_logging

    configure_logging("console", "warning")
    # (part, spread, settled event, end event, seed, second octet of its clients' addresses)
    storm = count if storm_count is None else storm_count
    parts = (
        ("storm", storm, 1.0, "storm_settled", "storm_stop", index, 10 + index),
        ("steady", count, ramp, "steady_settled", "stop", 1000 + index, 110 + index),
    )
    for part, size, spread, settled, ended, seed, octet in parts:
        if part == "steady":
            await _wait_for(events["steady_go"])
        # The steady clients' addresses are not the storm's: the server may still be
        # closing a storm client's duologue when a steady one arrives.
        population = _Population(
            port,
            control_port,
            size,
            spread,
            seed,
            duologue_ports,
            interval,
            octet if sources == "client" else None,
            per_transport,
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(population.run)
            waiting = trio.CancelScope()
            nursery.start_soon(_say_settled, population, out, settled, index, waiting)
            # The parent ends each part; the clients echo until then, then leave as a user's
            # Ctrl-C makes them (closing their duologues, which the server sees at once).
            await _wait_for(events[ended])
            waiting.cancel()
            gc.unfreeze()
            population.stop()
            # A client stuck in a wait is cut off (its wait is bounded by CLIENT_TIMEOUT).
            nursery.cancel_scope.deadline = trio.current_time() + 10
        out.put((f"{part}_report", index, population.report()))


async def _say_settled(
    population: _Population, out: Any, kind: str, index: int, scope: trio.CancelScope
) -> None:
    with scope:
        await population.all_settled.wait()
        # A load generator's own pauses: a full pass of the cyclic collector over this
        # process's 250 clients (~130,000 objects) takes 70-100 ms of CPU, and several times
        # that of wall time on the core the client processes share; one that fell into the
        # measured window made p99 142 ms. A game runs one client per process. Now that the
        # clients are in, freeze them out of later passes (collected first, so no garbage is
        # frozen); they are unfrozen when the part ends, before they leave.
        gc.collect()
        gc.freeze()
        out.put((kind, index, {"at": time.time(), "frozen": gc.get_freeze_count()}))


def _shares(clients: int, processes: int) -> list[int]:
    """`clients` spread over `processes` as evenly as they go."""
    return [clients // processes + (1 if i < clients % processes else 0) for i in range(processes)]


class _Workers:
    """The client processes and the queue they report on."""

    EVENTS = ("go", "storm_stop", "steady_go", "stop")

    def __init__(
        self,
        clients: int,
        processes: int,
        port: int,
        control_port: int,
        ramp: float,
        duologue_ports: str = "per-client",
        interval: float = 1.0,
        sources: str = "client",
        storm_clients: int | None = None,
        per_transport: int = 1,
    ) -> None:
        ctx = mp.get_context("spawn")
        self.out: Any = ctx.Queue()
        self.events = {name: ctx.Event() for name in self.EVENTS}
        self._early: list[tuple[str, int, Any]] = []
        per = _shares(clients, processes)
        storm = _shares(clients if storm_clients is None else storm_clients, processes)
        self.processes = [
            ctx.Process(
                target=client_process,
                args=(
                    i,
                    port,
                    control_port,
                    n,
                    ramp,
                    self.out,
                    self.events,
                    duologue_ports,
                    interval,
                    sources,
                    storm[i],
                    per_transport,
                ),
                name=f"scale clients {i}",
                daemon=True,
            )
            for i, n in enumerate(per)
            if n
        ]
        #: each process's index (what it sends with its messages), in `processes` order
        self.indices = [i for i, n in enumerate(per) if n]

    def start(self, cpus: set[int] | None) -> None:
        for process in self.processes:
            process.start()
            if cpus:
                os.sched_setaffinity(process.pid, cpus)  # type: ignore[arg-type]

    def signal(self, name: str) -> None:
        self.events[name].set()

    def expect(self, kind: str, timeout: float, *, partial_ok: bool = False) -> dict[int, Any]:
        """One `kind` message from every process: {index: payload}.

        BenchError if a process failed or died, or on the timeout unless `partial_ok` (then
        what came in time is returned). Messages of other kinds that come meanwhile are kept
        for their own `expect` (a process may say "done" before another one's last report).
        """
        got: dict[int, Any] = {}
        for message, index, payload in [m for m in self._early if m[0] == kind]:
            self._early.remove((message, index, payload))
            got[index] = payload
        deadline = time.monotonic() + timeout
        while len(got) < len(self.processes):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if partial_ok:
                    return got
                raise BenchError(f"scale: {len(got)} of {len(self.processes)} said {kind!r}")
            try:
                message, index, payload = self.out.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                # Only a process that died without its message counts: one that sent it and
                # exited (its part is over) while the others still close their clients is fine.
                dead = [
                    f"{p.name} (exit code {p.exitcode})"
                    for i, p in zip(self.indices, self.processes, strict=True)
                    if i not in got and not p.is_alive()
                ]
                if dead and self.out.empty():
                    raise BenchError(f"scale: {', '.join(dead)} exited before {kind!r}") from None
                continue
            if message == "error":
                raise BenchError(f"scale: client process {index} failed:\n{payload}")
            if message == kind:
                got[index] = payload
            else:
                self._early.append((message, index, payload))
        return got

    def cpu_seconds(self) -> float:
        return sum(cpu_seconds_of(p.pid) for p in self.processes if p.pid is not None)

    def kill(self) -> None:
        for process in self.processes:
            if process.is_alive():
                process.kill()
            process.join(5)


#: py-spy's sampling rate for --profile (per second)
PROFILE_RATE = 200


def _profile(
    directory: str | None,
    server_pid: int,
    workers: _Workers,
    seconds: float,
    clients: int,
    mode: str,
) -> list[Any]:
    """py-spy over the steady window: the server and the first client process (--profile)."""
    if directory is None:
        return []
    import shutil
    import subprocess
    import sys

    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    spy = beside if os.path.exists(beside) else shutil.which("py-spy") or "py-spy"
    os.makedirs(directory, exist_ok=True)
    targets = [("server", server_pid)]
    if workers.processes and workers.processes[0].pid is not None:
        targets.append(("client0", workers.processes[0].pid))
    spies = []
    for name, pid in targets:
        path = os.path.join(directory, f"{name}-{mode}-{clients}.txt")
        spies.append(
            subprocess.Popen(
                [
                    spy,
                    "record",
                    "-r",
                    str(PROFILE_RATE),
                    "--nonblocking",
                    "-f",
                    "raw",
                    "-d",
                    str(max(1, int(seconds - 1))),
                    "-p",
                    str(pid),
                    "-o",
                    path,
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    return spies


def _phase_ms(phases: list[dict[str, float]], start: str, end: str) -> dict[str, float]:
    spans = sorted(1000 * (p[end] - p[start]) for p in phases if start in p and end in p)
    if not spans:
        return {}
    return {
        "p50": round(percentile(spans, 50), 1),
        "p90": round(percentile(spans, 90), 1),
        "max": round(spans[-1], 1),
    }


def _rtts_ms(reports: dict[int, Any], t0: float, t1: float) -> list[float]:
    return sorted(
        rtt * 1000 for r in reports.values() for when, rtt in r["rtts"] if t0 <= when <= t1
    )


def _gc_pauses(done: dict[int, Any], t0: float, t1: float) -> dict[str, Any]:
    """The client processes' collector pauses between t0 and t1 (wall clock)."""
    pauses = [(g, s) for d in done.values() for when, g, s in d["gc_long"] if t0 <= when <= t1]
    return {
        "max_ms": round(1000 * max((s for _, s in pauses), default=0.0), 1),
        "over_5ms": sum(1 for _, s in pauses if s >= 0.005),
        "full_collections": sum(1 for g, _ in pauses if g == 2),
    }


def _storm_duologues(storm: dict[int, Any]) -> int:
    """Duologues the storm's clients joined (each sent a HELLO that was answered)."""
    return sum(1 for r in storm.values() for p in r["phases"] if "connect" in p)


def _wait_closed(server: Any, duologues: int, timeout: float) -> int:
    """Until the server has logged `duologues` duologue_closed events (or the timeout); how
    many it had logged."""
    deadline = time.monotonic() + timeout
    while True:
        closed = len(server.records("duologue_closed"))
        if closed >= duologues or time.monotonic() >= deadline:
            return closed
        time.sleep(0.2)


def run(
    clients: int,
    seconds: float,
    processes: int = PROCESSES,
    cpus: Sequence[int] = (),
    *,
    after_storm: float = DEFAULT_AFTER_STORM,
    ramp: float | None = None,
    duologue_ports: str = "per-client",
    profile: str | None = None,
    interval: float = 1.0,
    sources: str = "client",
    storm_clients: int | None = None,
    per_transport: int = 1,
) -> dict[str, Any]:
    """One N: the storm (handshakes/s), then the steady state (CPU, RSS, echo latency).

    `profile`: a directory; py-spy samples the server and the first client process over the
    steady window into it (raw collapsed stacks, idle excluded: docs/profile-b4.txt)."""
    raise_fd_limit()
    ramp = ramp_seconds(clients) if ramp is None else ramp
    server_cpu = cpus[0] if cpus else None
    client_cpus = set(cpus[1:]) if len(cpus) > 1 else None
    nan = float("nan")
    # Room for the storm's duologues while they close and the steady clients' at once.
    with start_server(2 * clients, cpu=server_cpu, duologue_ports=duologue_ports) as server:
        workers = _Workers(
            clients,
            processes,
            server.port,
            server.control_port,
            ramp,
            duologue_ports,
            interval,
            sources,
            storm_clients,
            per_transport,
        )
        try:
            workers.start(client_cpus)
            workers.expect("ready", 60)
            # 1. storm
            start_at = time.time()
            storm_cpu0, storm_clients_cpu0 = server.cpu_seconds(), workers.cpu_seconds()
            workers.signal("go")
            # Every client connected or failed (each wait of a client is bounded); if some
            # are still stuck the run goes on and says so (all_settled).
            storm_settled = workers.expect("storm_settled", CLIENT_TIMEOUT + 30, partial_ok=True)
            settled_at = time.time()
            storm_cpu1, storm_clients_cpu1 = server.cpu_seconds(), workers.cpu_seconds()
            storm_size = clients if storm_clients is None else storm_clients
            time.sleep(after_storm if storm_size else 0.0)
            storm_end = time.time()
            workers.signal("storm_stop")
            storm = workers.expect("storm_report", 60)
            # 2. steady, once the server has closed the storm's duologues: the steady clients
            # are to start one by one, not to queue up behind that and be answered in batches
            # (then they would echo in step, as the storm's do).
            storm_closed = _wait_closed(server, _storm_duologues(storm), STORM_CLOSE_TIMEOUT)
            workers.signal("steady_go")
            steady_settled = workers.expect(
                "steady_settled", ramp + CLIENT_TIMEOUT + 30, partial_ok=True
            )
            # Skip the first moments after the last handshake (its duologue's first status
            # messages, the server's log).
            margin = min(5.0, seconds / 4)
            time.sleep(margin)
            t0, cpu0, clients_cpu0 = time.time(), server.cpu_seconds(), workers.cpu_seconds()
            udp0 = udp_datagrams()
            spies = _profile(
                profile, server.pid, workers, seconds - margin, clients, duologue_ports
            )
            time.sleep(seconds - margin)
            t1, cpu1, clients_cpu1 = time.time(), server.cpu_seconds(), workers.cpu_seconds()
            udp1 = udp_datagrams()
            rss = server.rss_mib()
            peak_rss = server.peak_rss_mib()
            for spy in spies:
                spy.wait(30)
        finally:
            for name in _Workers.EVENTS:
                workers.signal(name)
        try:
            steady = workers.expect("steady_report", 60)
            done = workers.expect("done", 60)
        finally:
            workers.kill()
        server.stop()
        counters = server.records("transport_counters")
    phases = [p for r in storm.values() for p in r["phases"]]
    connected = sorted(p["first_echo"] for p in phases if "first_echo" in p)
    failures = [f for r in storm.values() for f in r["failures"]]
    steady_connected = sum(1 for r in steady.values() for p in r["phases"] if "first_echo" in p)
    steady_failures = [f for r in steady.values() for f in r["failures"]]
    rtts = _rtts_ms(steady, t0, t1)
    storm_rtts = _rtts_ms(storm, settled_at + min(AFTER_STORM_SKIP, after_storm / 2), storm_end)
    # Clients start spread over the first second; the rate counts from the start.
    span = connected[-1] - start_at if connected else 0.0
    storm_s = max(settled_at - start_at, 1e-9)
    return {
        "clients": clients,
        "duologue_ports": duologue_ports,
        "interval_s": interval,
        "sources": sources,
        "per_transport": per_transport,
        "storm_clients": storm_size,
        "seconds": seconds,
        "processes": len(workers.processes),
        # the storm
        "connected": len(connected),
        "failures": len(failures),
        "failure_examples": failures[:3],
        "all_settled": len(storm_settled) == len(workers.processes),
        "handshake_s": round(span, 3),
        "handshakes_per_s": len(connected) / span if span > 0 else (0.0 if storm_size else nan),
        "handshake_phases_ms": {
            "all_clients_channel": _phase_ms(phases, "start", "hello"),
            "connect_reply": _phase_ms(phases, "hello", "connect"),
            "duologue_first_echo": _phase_ms(phases, "connect", "first_echo"),
            "total": _phase_ms(phases, "start", "first_echo"),
        },
        "storm_server_cpu_percent": round(100.0 * (storm_cpu1 - storm_cpu0) / storm_s, 1),
        "storm_clients_cpu_percent": round(
            100.0 * (storm_clients_cpu1 - storm_clients_cpu0) / storm_s, 1
        ),
        "after_storm_s": after_storm,
        "echo_after_storm_p50_ms": percentile(storm_rtts, 50) if storm_rtts else nan,
        "echo_after_storm_p99_ms": percentile(storm_rtts, 99) if storm_rtts else nan,
        # the steady state
        "storm_duologues_closed_before_steady": storm_closed,
        "ramp_s": ramp,
        "steady_connected": steady_connected,
        "steady_failures": len(steady_failures),
        "steady_failure_examples": steady_failures[:3],
        "steady_all_settled": len(steady_settled) == len(workers.processes),
        "steady_s": round(t1 - t0, 3),
        # seconds from the start of the storm, for reading the clients' reports against
        "steady_window": [round(t0 - start_at, 3), round(t1 - start_at, 3)],
        "server_cpu_percent": 100.0 * (cpu1 - cpu0) / (t1 - t0),
        # B4's per-datagram figure (bench.scale_raw: exact in a network namespace of its own)
        **per_datagram(cpu1 - cpu0, udp1 - udp0, len(rtts), t1 - t0),
        "server_rss_mib": rss,
        "server_peak_rss_mib": peak_rss,
        "clients_cpu_percent": round(100.0 * (clients_cpu1 - clients_cpu0) / (t1 - t0), 1),
        "clients_gc": {
            **_gc_pauses(done, t0, t1),
            "frozen": sum(settled["frozen"] for settled in steady_settled.values()),
        },
        "echo_p50_ms": percentile(rtts, 50) if rtts else nan,
        "echo_p99_ms": percentile(rtts, 99) if rtts else nan,
        "echo_max_ms": rtts[-1] if rtts else nan,
        "echoes_per_s": round(len(rtts) / (t1 - t0), 1),
        "server_cpu": server.cpu,
        "client_cpus": sorted(client_cpus) if client_cpus else None,
        "server_counters": {
            k: v for k, v in (counters[-1] if counters else {}).items() if isinstance(v, int)
        },
    }


# ------------------------------------------------------------------ in bench.run


def results(row: dict[str, Any]) -> list[Result]:
    """One N's figures. No raw baseline exists for them; at 1,000 clients they have targets."""
    n = row["clients"]
    interval = row.get("interval_s", 1.0)
    targets = TARGETS if n == TARGET_CLIENTS and interval == 1.0 else {}
    # per-client keeps the name it has always had; shared is the row beside it
    name = (
        f"scale_{n}"
        if row.get("duologue_ports", "per-client") == "per-client"
        else (f"scale_shared_{n}")
    )
    if interval != 1.0:
        name += f"_every_{interval:g}s"
    if row.get("sources", "client") == "one":
        name += "_one_source"
    if row.get("per_transport", 1) != 1:
        name += f"_{row['per_transport']}_per_transport"
    storm = row.get("storm_clients", n)
    if storm != n:
        name += f"_storm_{storm}"
    figures = [
        ("handshakes/s", row["handshakes_per_s"], "hs/s", dict(row)),
        ("server CPU", row["server_cpu_percent"], "%", {}),
        ("server RSS", row["server_rss_mib"], "MiB", {}),
        ("server CPU/datagram", row["server_cpu_us_per_datagram"], "µs", {}),
        ("server CPU/echo", row["server_cpu_us_per_echo"], "µs", {}),
        ("echo p50", row["echo_p50_ms"], "ms", {}),
        ("echo p99", row["echo_p99_ms"], "ms", {}),
        ("echo p99 after storm", row["echo_after_storm_p99_ms"], "ms", {}),
        ("clients CPU", row["clients_cpu_percent"], "%", {}),
        ("connected", row["connected"], "clients", {}),
        ("steady connected", row["steady_connected"], "clients", {}),
        ("failures", row["failures"] + row["steady_failures"], "clients", {}),
    ]
    if not storm:
        storm_figures = ("handshakes/s", "echo p99 after storm", "connected")
        figures = [f for f in figures if f[0] not in storm_figures]
    return [
        Result(
            name,
            metric,
            float(value),
            unit,
            fields,
            lower_is_better=metric not in ("handshakes/s", "connected", "steady connected"),
            target=targets.get(metric),
        )
        for metric, value, unit, fields in figures
    ]


#: The figures that have a raw counterpart in bench.scale_raw's run at the same N.
RAW_METRICS = ("server CPU", "server CPU/datagram", "server CPU/echo", "echo p50", "echo p99")


def raw_results(row: dict[str, Any]) -> list[Result]:
    """bench.scale_raw's row (N raw trio UDP clients echoing once a second) as raw figures."""
    name = f"raw_scale_{row['clients']}"
    units = {"server CPU": "%", "echo p50": "ms", "echo p99": "ms"}
    keys = {
        "server CPU": "server_cpu_percent",
        "server CPU/datagram": "server_cpu_us_per_datagram",
        "server CPU/echo": "server_cpu_us_per_echo",
        "echo p50": "echo_p50_ms",
        "echo p99": "echo_p99_ms",
    }
    return [
        Result(
            name,
            metric,
            float(row[keys[metric]]),
            units.get(metric, "µs"),
            lower_is_better=True,
            raw=True,
        )
        for metric in RAW_METRICS
    ]


def with_raw_baseline(result: Result, clients: int, raw: list[Result]) -> Result:
    """`result` compared to the raw run at its N, if it is of that N and has a counterpart."""
    if not result.name.startswith("scale") or not result.name.endswith(f"_{clients}"):
        return result
    if result.metric not in RAW_METRICS or not any(r.metric == result.metric for r in raw):
        return result
    return attrs.evolve(result, baseline=(f"raw_scale_{clients}", result.metric))


def scale(settings: Settings) -> list[Result]:
    """B4 for bench.run: N = 100, 500, 1000 for 30 s each, per-client then shared duologue
    ports (the same N one after the other); --quick: 20 clients, 3 s."""
    plan = QUICK_CLIENTS if settings.quick else DEFAULT_CLIENTS
    seconds = QUICK_SECONDS if settings.quick else DEFAULT_SECONDS
    after_storm = QUICK_AFTER_STORM if settings.quick else DEFAULT_AFTER_STORM
    found: list[Result] = []
    for n in plan:
        for mode in MODES:
            row = run(
                n, seconds, PROCESSES, settings.pin, after_storm=after_storm, duologue_ports=mode
            )
            if not row["connected"]:
                raise BenchError(
                    f"scale ({mode}): none of {n} clients connected: {row['failure_examples']}"
                )
            found += results(row)
    return found


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scale", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--clients", default=",".join(map(str, DEFAULT_CLIENTS)))
    parser.add_argument("--seconds", type=float, default=DEFAULT_SECONDS)
    parser.add_argument("--processes", type=int, default=PROCESSES)
    parser.add_argument(
        "--duologue-ports",
        default=",".join(MODES),
        help="the server's --duologue-ports, one run each (default: per-client,shared)",
    )
    parser.add_argument(
        "--after-storm",
        type=float,
        default=DEFAULT_AFTER_STORM,
        help="seconds the storm's clients echo after the last is in (echo p99 after storm)",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=1.0,
        help="seconds between one client's ECHOs (default 1; the 5,000-client row uses 5: "
        "the same echoes/s as 1,000 clients, see the module docstring)",
    )
    parser.add_argument(
        "--storm-clients",
        type=int,
        default=None,
        help="clients in the storm (default: N; 0: no storm, the steady part only)",
    )
    parser.add_argument(
        "--sources",
        choices=("client", "one"),
        default="client",
        help="where the clients send from: 'client', each from an address of its own "
        "(127.x.y.z, as clients behind different NATs; the default), or 'one', all from "
        "127.0.0.1 (as before 2026-11-28: the server's per-host limits then apply to all)",
    )
    parser.add_argument(
        "--per-transport",
        type=int,
        default=1,
        metavar="K",
        help="clients sharing one transport in a client process (EchoClient(transport=...)), "
        "each transport from an address of its own with --sources client (default 1: every "
        "client opens its own, as echo-client does)",
    )
    parser.add_argument(
        "--ramp",
        type=float,
        default=None,
        help=f"seconds over which the steady part's clients start (default N / {RAMP_RATE:.0f})",
    )
    parser.add_argument(
        "--pin",
        default=None,
        help="CPUs: the server on the first, the client processes on the others "
        "(default: the first two allowed ones; 'none' leaves placement to the scheduler)",
    )
    parser.add_argument(
        "--profile",
        default=None,
        metavar="DIR",
        help="py-spy (pip install py-spy, or the bench extra) samples the server and the first "
        "client process over each steady window into DIR (collapsed stacks)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="run every row this many times; scale.json keeps each repeat's figures",
    )
    parser.add_argument(
        "--no-raw-baseline",
        dest="raw_baseline",
        action="store_false",
        help="leave out the raw trio UDP run at each N (bench.scale_raw) that the server's CPU "
        "per datagram and the echo latencies are compared to in scale.json",
    )
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=None,
        help="where scale.json (the figures over the repeats) goes [default: bench/results]",
    )
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    from bench.run import pin_cpus

    cpus = pin_cpus(args.pin)
    load_before = result_files.system_load()
    repeats: list[dict[tuple[str, str], Result]] = []
    for repeat in range(args.repeats):
        if args.repeats > 1:
            print(f"== repeat {repeat + 1} of {args.repeats}", file=sys.stderr, flush=True)
        rows = [
            run(
                int(n),
                args.seconds,
                args.processes,
                cpus,
                after_storm=args.after_storm,
                ramp=args.ramp,
                duologue_ports=mode,
                profile=args.profile,
                interval=args.interval,
                sources=args.sources,
                storm_clients=args.storm_clients,
                per_transport=args.per_transport,
            )
            for n in args.clients.split(",")
            for mode in args.duologue_ports.split(",")
        ]
        print(json.dumps(rows, indent=2))
        found = [result for row in rows for result in results(row)]
        if args.raw_baseline:
            for n in dict.fromkeys(int(n) for n in args.clients.split(",")):
                raw_row = scale_raw.run(
                    n, args.seconds, args.processes, cpus, args.interval, args.sources
                )
                print(json.dumps(raw_row, indent=2))
                raw = raw_results(raw_row)
                found = [with_raw_baseline(r, n, raw) for r in found] + raw
        for result in found:
            print(f"{result.name:11} {result.metric:20} {format_figure(result.value, result.unit)}")
        repeats.append({(r.name, r.metric): r for r in found})
    argv_used = sys.argv[1:] if argv is None else list(argv)
    record, left_out = result_files.from_repeats(
        bench_id="scale",
        label="B4",
        title="B4: N echo-clients (once a second) on one echo-server: handshakes/s, CPU, RSS, p99",
        command=shlex.join(["python", "-m", "bench.scale", *argv_used]),
        # the raw run's figures are baselines: they show beside the figures compared to them
        own=[key for key, result in repeats[0].items() if not result.raw],
        repeats=repeats,
        machine=result_files.machine_info(load_before, result_files.system_load()),
        settings={
            key: value for key, value in vars(args).items() if key not in ("results_dir", "profile")
        },
    )
    for note in left_out:
        print(f"left out of scale.json: {note}", file=sys.stderr)
    if record is not None:
        print(f"wrote {record.write(args.results_dir or result_files.RESULTS_DIR)}")


if __name__ == "__main__":
    main()
