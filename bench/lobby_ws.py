"""L1-WS: the L1 scenario (bench/lobby_bench.py) with echo's members on WebSocket.

Target ``echo-ws`` of `python -m bench.lobby_bench --targets echo-ws,colyseus`: `echo-lobby`
with its WebSocket door (``--ws-port``), driven by bots that speak the JSON protocol
(bench/colyseus/echo_ws_bots.js) on the same Node and the same `ws` package as Colyseus's own
client in bots.js, so both servers are on WebSocket and both are driven by bots of the same
cost. The phases, the line protocol and the measures are L1's.

The result file is ``bench/results/lobby_ws.json`` (label L1-WS): echo's figures per repeat
against Colyseus's of the same repeat, with the issue's targets: joins/s at least Colyseus's,
chat delivery p99 and server RSS at most Colyseus's, search p99 at most twice Colyseus's.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

from bench import results as result_files

ECHO_WS = "echo-ws"
SUBJECT = "echo_lobby_ws"
#: The issue's goals, as ratios to Colyseus's figure of the same repeat.
TARGETS: dict[str, tuple[str, float, str]] = {
    "joins/s": (">=", 1.0, "ratio"),
    "chat delivery p99": ("<=", 1.0, "ratio"),
    "server RSS peak": ("<=", 1.0, "ratio"),
    "search p99": ("<=", 2.0, "ratio"),
}


def tcp_listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def start_server(
    args: argparse.Namespace, log: IO[bytes], echo_argv: list[str]
) -> subprocess.Popen[bytes]:
    """echo-lobby (`echo_argv`: L1's command line) with its door on --echo-ws-port."""
    members = args.lobbies * args.members + 64
    # No UDP member comes: a few duologue ports, not L1's 2 x 8,000 (which, on a machine
    # shared with test runs, meet their port ranges).
    argv = list(echo_argv)
    for flag in ("--max-clients", "--max-per-ip"):
        argv[argv.index(flag) + 1] = "16"
    argv += ["--ws-port", str(args.echo_ws_port), "--ws-max-connections", str(members)]
    proc = subprocess.Popen(argv, cwd=Path(__file__).resolve().parents[1], stdout=log,
                            stderr=subprocess.STDOUT)  # fmt: skip
    deadline = time.monotonic() + 60
    while not tcp_listening(args.echo_ws_port):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"echo-lobby --ws-port did not start (exit {proc.poll()})")
        time.sleep(0.05)
    return proc


def bot_argv(args: argparse.Namespace, bots_js: Path, offset: int, lobbies: int) -> list[str]:
    return [
        "node",
        str(bots_js),
        "--url",
        f"ws://127.0.0.1:{args.echo_ws_port}",
        "--lobbies",
        str(lobbies),
        "--members",
        str(args.members),
        "--offset",
        str(offset),
        "--concurrency",
        str(args.join_concurrency),
    ]


def write_result_file(
    repeats: list[list[dict[str, Any]]],
    args: argparse.Namespace,
    command: str,
    directory: Path,
    load_before: dict[str, float],
) -> Path | None:
    """bench/results/lobby_ws.json: echo-ws's figures per repeat against Colyseus's of the
    same repeat (repeats where echo-ws failed are left out; without Colyseus in every repeat
    that echo-ws ran, no baseline at all rather than another run's)."""
    from bench.lobby_bench import PEER_LABEL, PEER_SUBJECT, figures_of, with_targets

    measured = [
        {r["target"]: r for r in repeat}
        for repeat in repeats
        if any(r["target"] == ECHO_WS and "join" in r for r in repeat)
    ]
    if not measured:
        return None
    with_peer = all("join" in repeat.get(PEER_SUBJECT, {}) for repeat in measured)
    by_key = []
    for repeat in measured:
        figures = with_targets(
            figures_of(repeat[ECHO_WS], SUBJECT, with_peer), TARGETS, with_peer
        )
        if with_peer:
            figures.update(figures_of(repeat[PEER_SUBJECT], PEER_SUBJECT, False))
        by_key.append(figures)
    own = [key for key in by_key[0] if key[0] == SUBJECT]
    record, left_out = result_files.from_repeats(
        bench_id="lobby_ws",
        label="L1-WS",
        title=f"L1-WS: {args.lobbies} lobbies of {args.members} on one echo-lobby, members on "
        f"its WebSocket door (JSON), Node bots in {args.bot_procs} processes, "
        f"{args.chat_rate:g} chat lines/s for {args.chat_seconds:g} s, {args.searches} "
        "searches per bot process",
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
