"""RSS under churn: `echo-server` from the code before a change beside the code after it.

    python -m bench.churn_memory --before REV [--seconds 900] [--concurrency 8] [--spray-rate 100]

Two `echo-server`s run side by side, one from a git revision (`--before`, extracted with
`git archive` into a temporary folder and run from there) and one from this checkout, under the
same load in the same run: `--concurrency` workers each (connect through the session library,
three echoes, close, again) and a spray of random datagrams at every port of each. Every
`--sample` seconds each server's memory is read from /proc/PID/smaps by kind: the log terms
(the anonymous mappings of 8 MiB and more: terms are 16 MiB by default and adjacent ones merge),
the C heap ([heap]), the other anonymous mappings (pymalloc's arenas, large mallocs), files;
and the number of mappings (a leak of mmaps would show there). The slope is over the samples
after the first quarter (bench.churn). Writes the result file `churn_memory` (the change's
RSS slope and end RSS with the code before as the baseline) and prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from bench import results as result_files
from bench.churn import slope_mib_per_minute
from bench.duologue_bench import EchoServerProcess
from bench.harness import BenchError, free_udp_port
from echo.protocol import Echo, format_message

#: an anonymous mapping this large (or larger) holds log terms
TERMS_MAPPING = 8 * 1024 * 1024
KINDS = ("terms", "heap", "anon", "file")


def memory_by_kind(pid: int) -> dict[str, float]:
    """Resident MiB of one process by kind of mapping, and its number of mappings."""
    kib = dict.fromkeys(KINDS, 0)
    mappings = 0
    kind = "file"
    with open(f"/proc/{pid}/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5 and ":" in fields[3]:
                mappings += 1
                low, high = (int(x, 16) for x in fields[0].split("-"))
                path = fields[5] if len(fields) > 5 else ""
                if path == "[heap]":
                    kind = "heap"
                elif path == "":
                    kind = "terms" if high - low >= TERMS_MAPPING else "anon"
                elif path.startswith("["):
                    kind = "anon"  # stack, vdso: a few pages that do not move
                else:
                    kind = "file"
            elif fields[0] == "Rss:":
                kib[kind] += int(fields[1])
    row: dict[str, float] = {k: round(v / 1024, 3) for k, v in kib.items()}
    row["rss"] = round(sum(kib.values()) / 1024, 3)
    row["mappings"] = mappings
    return row


def extract(revision: str, into: Path) -> str:
    """The tree of `revision` under `into`; returns the full commit id."""
    root = result_files.REPO
    commit = subprocess.run(
        ["git", "rev-parse", "--verify", f"{revision}^{{commit}}"],
        cwd=root, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    archive = into / "tree.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "archive", commit], cwd=root, stdout=out, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into / "tree", filter="data")
    archive.unlink()
    return commit


def start(name: str, tree: Path, concurrency: int, duologue_ports: str) -> EchoServerProcess:
    """`echo-server` run from `tree` (its `echo` package first on the path), ready."""
    max_clients = 2 * concurrency
    span = 2 if duologue_ports == "shared" else 2 * max_clients
    error: BenchError | None = None
    for _ in range(3):
        port, control_port = free_udp_port(), free_udp_port()
        base = random.randrange(20000, 32000 - span, 2)
        server = EchoServerProcess(
            port, control_port, base, max_clients, cpu=None, duologue_ports=duologue_ports
        )
        server.name = name
        server.argv = ["env", f"PYTHONPATH={tree}", *server.argv]  # env execs: the same pid
        server.start()
        try:
            server.wait_ready(60)
        except BenchError as failed:
            server.kill()
            error = failed
            continue
        server.clients_base_port = base  # type: ignore[attr-defined]
        server.span = span  # type: ignore[attr-defined]
        return server
    assert error is not None
    raise error


async def churn(
    servers: Sequence[EchoServerProcess],
    seconds: float,
    concurrency: int,
    spray_rate: float,
    sample: float,
    duologue_ports: str,
) -> dict[str, Any]:
    import echo.session as es
    from echo.transport import open_transport

    served = dict.fromkeys((s.name for s in servers), 0)
    failed = dict.fromkeys((s.name for s in servers), 0)
    samples: dict[str, list[tuple[float, dict[str, float]]]] = {s.name: [] for s in servers}
    start_at = trio.current_time()
    stop_at = start_at + seconds

    async def worker(server: EchoServerProcess, transport: Any) -> None:
        while trio.current_time() < stop_at:
            try:
                async with es.connect(
                    "127.0.0.1",
                    server.port,
                    server.control_port,
                    transport=transport,
                    timeout=10.0,
                    duologue_ports=duologue_ports,
                ) as session:
                    for i in range(3):
                        await session.send(format_message(Echo(f"churn {i}")))
                        await session.receive()
                served[server.name] += 1
            except es.SessionError:
                failed[server.name] += 1

    async def sprayer() -> None:
        import socket

        rng = random.Random(34)
        targets = [
            port
            for s in servers
            for port in (
                s.port,
                s.control_port,
                *range(s.clients_base_port, s.clients_base_port + s.span),  # type: ignore[attr-defined]
            )
        ]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.setblocking(False)
            tick, owed, next_at = 0.01, 0.0, trio.current_time()
            while trio.current_time() < stop_at:
                owed += spray_rate * len(servers) * tick
                while owed >= 1.0:
                    owed -= 1.0
                    try:
                        data = os.urandom(rng.randrange(0, 200))
                        sock.sendto(data, ("127.0.0.1", rng.choice(targets)))
                    except OSError:
                        pass
                next_at += tick
                await trio.sleep_until(next_at)  # a rate, not an event: ticks of 10 ms

    async def sampler() -> None:
        while True:
            at = trio.current_time() - start_at
            for s in servers:
                samples[s.name].append((round(at, 1), memory_by_kind(s.pid)))
            if trio.current_time() >= stop_at:
                return
            await trio.sleep(sample)  # a sampling period: nothing to wait for

    async with open_transport(es.server_transport_config()) as transport:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sampler)
            if spray_rate > 0:
                nursery.start_soon(sprayer)
            for server in servers:
                for _ in range(concurrency):
                    nursery.start_soon(worker, server, transport)
    return {"served": served, "failed": failed, "samples": samples}


def summarise(samples: list[tuple[float, dict[str, float]]]) -> dict[str, Any]:
    steady = samples[len(samples) // 4 :]
    figures: dict[str, Any] = {
        "rss_mib_first": samples[0][1]["rss"],
        "rss_mib_last": samples[-1][1]["rss"],
        "mappings_first_last": [samples[0][1]["mappings"], samples[-1][1]["mappings"]],
    }
    for kind in ("rss", *KINDS):
        points = [(t, row[kind]) for t, row in steady]
        figures[f"{kind}_slope_mib_per_h"] = round(slope_mib_per_minute(points) * 60, 2)
        figures[f"{kind}_mib_last"] = samples[-1][1][kind]
    return figures


def run(
    before: str, seconds: float, concurrency: int, spray_rate: float, sample: float, ports: str
) -> dict[str, Any]:
    load_before = result_files.system_load()
    after_commit = result_files.git_commit()  # the code the "after" server starts with
    workdir = Path(tempfile.mkdtemp(prefix="echo-churn-memory-"))
    servers: list[EchoServerProcess] = []
    try:
        before_commit = extract(before, workdir)
        servers.append(start("before", workdir / "tree", concurrency, ports))
        servers.append(start("after", result_files.REPO, concurrency, ports))
        row = trio.run(churn, servers, seconds, concurrency, spray_rate, sample, ports)
    finally:
        for server in servers:
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return {
        "before": before_commit,
        "after": after_commit,
        "seconds": seconds,
        "concurrency": concurrency,
        "spray_rate": spray_rate,
        "duologue_ports": ports,
        "served": row["served"],
        "failed": row["failed"],
        "servers": {name: summarise(points) for name, points in row["samples"].items()},
        "samples": row["samples"],
        "load_before": load_before,
        "load_after": result_files.system_load(),
    }


def result_file(summary: dict[str, Any], command: str) -> result_files.BenchResult:
    before, after = summary["servers"]["before"], summary["servers"]["after"]
    label = f"echo-server at {summary['before'][:7]}"
    metrics = [
        result_files.metric_from_repeats(
            "echo-server under churn", name, unit, True, [after[key]], (label, label, [before[key]])
        )
        for name, unit, key in (
            ("RSS slope", "MiB/h", "rss_slope_mib_per_h"),
            ("log terms' RSS slope", "MiB/h", "terms_slope_mib_per_h"),
            ("RSS at the end", "MiB", "rss_mib_last"),
        )
    ]
    served = summary["served"]
    settings = {k: summary[k] for k in ("seconds", "concurrency", "spray_rate", "duologue_ports")}
    settings |= {"before": summary["before"], "served": served, "failed": summary["failed"]}
    settings |= {"servers": summary["servers"]}
    return result_files.BenchResult(
        id="churn_memory",
        label="S2",
        title=f"Memory under churn: echo-server before and after, {summary['seconds']:g} s",
        command=command,
        date=result_files.utc_now(),
        commit=summary["after"],
        repeats=1,
        machine=result_files.machine_info(summary["load_before"], summary["load_after"]),
        metrics=tuple(metrics),
        settings=settings,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the git revision to compare with")
    parser.add_argument("--seconds", type=float, default=900.0)
    parser.add_argument("--concurrency", type=int, default=8, help="workers per server")
    parser.add_argument("--spray-rate", type=float, default=100.0, help="datagrams/s per server")
    parser.add_argument("--sample", type=float, default=10.0)
    parser.add_argument("--duologue-ports", choices=("shared", "per-client"), default="shared")
    parser.add_argument("--details", default=None, help="Write every sample to this JSON file.")
    parser.add_argument("--no-result-file", action="store_true")
    args = parser.parse_args(argv)
    started = time.time()
    summary = run(
        args.before,
        args.seconds,
        args.concurrency,
        args.spray_rate,
        args.sample,
        args.duologue_ports,
    )
    if args.details:
        Path(args.details).write_text(json.dumps(summary, indent=1))
    summary.pop("samples")
    summary["wall_s"] = round(time.time() - started, 1)
    print(json.dumps(summary))
    if not args.no_result_file:
        command = "python -m bench.churn_memory " + " ".join(
            argv if argv is not None else sys.argv[1:]
        )
        path = result_file(summary, command.strip()).write()
        print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
