"""B1: echo round trips over an Echo 2.0 duologue, against the real `echo-server`.

    python -m bench.run --only duologue_echo [--duration 5]

The server is `python -m echo.server.cli` (what users run) in its own process, on free ports,
pinned to the first CPU. Two clients take turns on the second CPU:

1. `duologue_echo_64`: a lean client process that does the Echo 2.0 handshake the way
   `echo.client.EchoClient` does (the session's `HandshakeMachine` decides: HELLO with a fresh
   pad on the all-clients channel, our CONNECT among everyone's replies, the session id
   decrypted, the duologue channels opened with it), then echoes 64-byte `ECHO <text>` messages
   in a tight loop: `pub.send`, `sub.receive`, check that the reply is the ECHO of what was
   sent. After a warm-up, round trips/s and p50 / p99 / p99.9, compared to `raw_echo_64` of the
   same run; the targets are >= 0.8 x raw round trips/s and p99 <= 1.5 x raw
   p99. The server's CPU is sampled from /proc around exactly the measured part.
2. `echo_client_cli_64`: `echo-client --interval 0 --count N --json` against the same server,
   what a user of the CLI sees: its `rtt_ms` p50 / p99, and round trips/s as N over the time
   the run took beyond a `--count 0` run (start-up, handshake and exit cancel out). No target.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import subprocess
import sys
import time
from typing import Any, Literal

import trio

from bench.harness import (
    BenchError,
    Child,
    CliProcess,
    Control,
    Result,
    RoundTrips,
    Settings,
    cpu_seconds_of,
    free_udp_port,
    round_trip_results,
    usage_extra,
)
from bench.transport_bench import require_transport

HOST = "127.0.0.1"
#: "ECHO " + text: the messages are this long on the wire, like the raw baseline's datagrams.
MESSAGE_SIZE = 64
#: The text after the sequence number that makes "ECHO <text>" MESSAGE_SIZE bytes.
_FILLER = "." * (MESSAGE_SIZE - len("ECHO ") - 16)
#: Duologues the server may hold: the two clients run one after the other, but the first one's
#: duologue may still be closing when the second says HELLO.
MAX_CLIENTS = 4
HANDSHAKE_TIMEOUT = 10.0
#: The goals for B1 (ratios to raw trio UDP echo of the same run).
TARGETS = {"round trips/s": (">=", 0.8, "ratio"), "p99": ("<=", 1.5, "ratio")}


def echo_text(sequence: int) -> str:
    return f"{sequence:016x}{_FILLER}"


# ------------------------------------------------------------------ the server


class EchoServerProcess(CliProcess):
    """`python -m echo.server.cli` on the given ports, JSON logs on stderr."""

    def __init__(
        self,
        port: int,
        control_port: int,
        clients_base_port: int,
        max_clients: int,
        *,
        cpu: int | Literal["next"] | None = "next",
        duologue_ports: str = "per-client",
    ) -> None:
        argv = [
            sys.executable,
            "-m",
            "echo.server.cli",
            "--port",
            str(port),
            "--control-port",
            str(control_port),
            "--clients-base-port",
            str(clients_base_port),
            "--max-clients",
            str(max_clients),
            "--max-per-ip",
            str(max_clients),  # every client comes from 127.0.0.1
            # Named, not the CLI's default: the lean client and EchoClient's default are
            # per-client; B4 measures both modes (bench.scale).
            "--duologue-ports",
            duologue_ports,
            "--log-format",
            "json",
            "--log-level",
            "info",
        ]
        super().__init__("echo-server", argv, ready_event="listening", cpu=cpu)
        self.port = port
        self.control_port = control_port
        self.duologue_ports = duologue_ports


def start_server(
    max_clients: int = MAX_CLIENTS,
    *,
    cpu: int | Literal["next"] | None = "next",
    attempts: int = 3,
    duologue_ports: str = "per-client",
) -> EchoServerProcess:
    """`echo-server` on free ports, ready (it logged "listening"), pinned to `cpu`.

    The ports are free when chosen but may be taken before the server binds them (another
    benchmark on this machine): then it exits at once and we try other ones.
    """
    error: BenchError | None = None
    for _ in range(attempts):
        port = free_udp_port()
        control_port = free_udp_port()
        while control_port == port:
            control_port = free_udp_port()
        # Duologue ports below the ephemeral range (32768+), where client sockets come from;
        # the server binds them all at start (one that another program holds: it exits, and
        # other ports are tried).
        # (Shared duologue ports need two, whatever max_clients: B4's 5,000-client row.)
        span = 2 if duologue_ports == "shared" else 2 * max_clients
        if 20000 + span > 32000:
            raise BenchError(
                f"{max_clients} per-client duologues need {span} ports, more than the "
                "12,000 below the ephemeral range: use --duologue-ports shared"
            )
        base = random.randrange(20000, 32000 - span, 2)
        server = EchoServerProcess(
            port, control_port, base, max_clients, cpu=cpu, duologue_ports=duologue_ports
        ).start()
        cpu = server.cpu  # a retry keeps the CPU
        try:
            server.wait_ready(30)
        except BenchError as failed:
            server.kill()
            error = failed
            continue
        return server
    assert error is not None
    raise error


# ------------------------------------------------------------------ the lean client


async def join_duologue(transport: Any, port: int, control_port: int) -> tuple[Any, Any]:
    """HELLO -> CONNECT -> duologue, as `EchoClient` does; returns (publication, subscription).

    The session library's `HandshakeMachine` makes every decision (the HELLO, which reply is
    ours, the decrypted session id, its range check); the channel URIs are those of
    `echo.session.client` (per-client ports).
    """
    from echo.protocol import ECHO_STREAM_ID
    from echo.session.machine import HandshakeMachine, OpenDuologue, SendHello

    now = trio.current_time
    machine = HandshakeMachine(pad=secrets.randbits(32), timeout=HANDSHAKE_TIMEOUT)
    machine.start(now())
    sub = await transport.add_subscription(
        f"aeron:udp?control={HOST}:{control_port}|control-mode=dynamic", ECHO_STREAM_ID
    )
    pub = await transport.add_publication(f"aeron:udp?endpoint={HOST}:{port}", ECHO_STREAM_ID)
    await _connected(pub, sub)
    (hello,) = machine.on_all_clients_connected(pub.session_id, now())
    assert isinstance(hello, SendHello), hello
    await pub.send(hello.data, timeout=HANDSHAKE_TIMEOUT)
    actions: list[Any] = []
    while not actions:
        # Replies to every client in its handshake share this channel: the machine ignores
        # the others' and answers ours with [CloseAllClients, OpenDuologue] (or a failure).
        message = await sub.receive()
        actions = machine.on_all_clients_message(message.data, now())
    if machine.failure is not None:
        raise BenchError(f"handshake failed: {machine.failure.message}")
    join = actions[-1]
    assert isinstance(join, OpenDuologue), actions
    await sub.close()
    await pub.close(timeout=0.5)
    session = join.session_id
    sub = await transport.add_subscription(
        f"aeron:udp?control={HOST}:{join.control_port}|control-mode=dynamic|session-id={session}",
        ECHO_STREAM_ID,
    )
    pub = await transport.add_publication(
        f"aeron:udp?endpoint={HOST}:{join.data_port}|session-id={session}", ECHO_STREAM_ID
    )
    await _connected(pub, sub)
    return pub, sub


async def _connected(pub: Any, sub: Any) -> None:
    """Both ways up: our publication has its receiver, our subscription the server's image."""
    await pub.wait_connected()
    while not sub.images:
        await sub.wait_activity()


def duologue_client(
    ctl: Control, port: int, control_port: int, server_pid: int, duration: float
) -> dict[str, Any]:
    return trio.run(_duologue_client, ctl, port, control_port, server_pid, duration)


async def _duologue_client(
    ctl: Control, port: int, control_port: int, server_pid: int, duration: float
) -> dict[str, Any]:
    from echo.protocol import Echo, format_message, parse_duologue_reply_untrusted
    from echo.session.client import client_transport_config
    from echo.transport import open_transport

    server_cpu_before = 0.0

    def sample_server_cpu() -> None:
        nonlocal server_cpu_before
        server_cpu_before = cpu_seconds_of(server_pid)

    rounds = RoundTrips(ctl, duration, on_begin=sample_server_cpu)
    async with open_transport(client_transport_config()) as transport:
        with trio.fail_after(HANDSHAKE_TIMEOUT):
            pub, sub = await join_duologue(transport, port, control_port)
        ctl.ready()
        send = pub.send
        receive = sub.receive
        with trio.fail_after(duration + 30):
            for sequence in rounds:
                text = echo_text(sequence)
                await send(format_message(Echo(text)), timeout=10)
                reply = await receive()
                if parse_duologue_reply_untrusted(reply.data) != Echo(text):
                    raise BenchError(f"duologue echo: {reply.data!r} in reply to {text!r}")
            server_cpu = cpu_seconds_of(server_pid) - server_cpu_before
            ctl.end()
        # End of stream: the server sees its client go and closes the duologue.
        await pub.close(timeout=2)
        await sub.close()
    summary: dict[str, Any] = rounds.summary()
    summary["echoes"] = rounds.total
    summary["server_cpu_pct"] = round(100 * server_cpu / rounds.elapsed, 1)
    return summary


# ------------------------------------------------------------------ echo-client, the CLI


def run_echo_client(
    server: EchoServerProcess, count: int, cpu: int | None, timeout: float
) -> tuple[dict[str, Any], float]:
    """`echo-client --interval 0 --count COUNT --json`: its summary and the wall time it took."""
    argv = [
        sys.executable,
        "-m",
        "echo.client.cli",
        "--port",
        str(server.port),
        "--control-port",
        str(server.control_port),
        "--count",
        str(count),
        "--interval",
        "0",
        "--message",
        echo_text(0),
        "--json",
        "--duologue-ports",
        server.duologue_ports,
    ]
    started = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if cpu is not None:
            os.sched_setaffinity(process.pid, {cpu})
        out, err = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    elapsed = time.perf_counter() - started
    if process.returncode != 0:
        raise BenchError(f"echo-client --count {count} exited {process.returncode}: {err}{out}")
    summary: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    if summary["received"] != count or summary["error"] is not None:
        raise BenchError(f"echo-client --count {count}: {summary}")
    return summary, elapsed


# ------------------------------------------------------------------ the benchmark


def duologue_echo(settings: Settings) -> list[Result]:
    require_transport()
    limit = settings.duration + settings.slack
    with start_server() as server:
        with Child(
            "duologue client",
            duologue_client,
            server.port,
            server.control_port,
            server.pid,
            settings.duration,
        ) as client:
            summary = client.result(limit)
        # Every echo (warm-up included) went through the server's duologue, which it closed
        # when the client's stream ended.
        closed = server.wait_for_record(
            "duologue_closed", lambda record: record.get("messages", 0) > 0, settings.slack
        )
        if closed["messages"] != summary["echoes"]:
            raise BenchError(
                f"the server echoed {closed['messages']} messages, the client {summary['echoes']}"
            )
        # The CLI: N echoes, about `duration` seconds' worth, and a --count 0 run whose time
        # (interpreter start, handshake, exit) is subtracted from it.
        count = max(100, int(summary["round_trips_per_s"] * settings.duration / 2))
        # Interpreter start-up varies by more than the echoes take on a loaded machine: the
        # fastest of three --count 0 runs is the fixed cost least inflated by other work.
        fixed = min(run_echo_client(server, 0, client.cpu, limit)[1] for _ in range(3))
        cli, total = run_echo_client(server, count, client.cpu, limit)
        server_peak_rss = server.peak_rss_mib()
    extra: dict[str, Any] = {
        "size": MESSAGE_SIZE,
        "round_trips": summary["round_trips"],
        "server_cpu_pct": summary["server_cpu_pct"],
        "server_peak_rss_mib": round(server_peak_rss, 1),
        "server_duologue_messages": closed["messages"],
    }
    extra.update(usage_extra(client=client))
    results = round_trip_results(
        f"duologue_echo_{MESSAGE_SIZE}", summary, "raw_echo_64", extra, targets=TARGETS
    )
    results += cli_results(cli, count, total, fixed)
    return results


def cli_results(cli: dict[str, Any], count: int, total: float, fixed: float) -> list[Result]:
    """round trips/s, p50, p99 of an `echo-client --json` run (its ms shown as µs)."""
    name = f"echo_client_cli_{MESSAGE_SIZE}"
    echoing = total - fixed
    # Start-up noise larger than the echoing itself: the wall-time difference says nothing, so
    # the rate is the client's own median round trip (one echo outstanding at a time), marked.
    estimated = echoing <= 0
    if estimated:
        echoing = count * cli["rtt_ms"]["p50"] / 1000
    extra = {
        "rate_from_p50": estimated,
        "count": count,
        "elapsed_s": round(total, 3),
        "count_0_elapsed_s": round(fixed, 3),
        "rtt_ms": cli["rtt_ms"],
    }
    results = [
        Result(
            name, "round trips/s", count / echoing, "RT/s", extra, ("raw_echo_64", "round trips/s")
        )
    ]
    for metric in ("p50", "p99"):
        results.append(
            Result(
                name,
                metric,
                cli["rtt_ms"][metric] * 1000,
                "µs",
                {},
                ("raw_echo_64", metric),
                lower_is_better=True,
            )
        )
    return results
