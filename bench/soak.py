"""The soak: every server of echo as a process, under churn, for a chosen time.

    python -m bench.soak [--seconds 3600] [--echo-workers 4] [--lobby-groups 2] [--spray-rate 50]

Starts `echo-server` (shared duologue ports), three `echo-lobby` (one ring, one seat key, the
topics servers for listings) and two `echo-topics`, each with ``--metrics``; runs the load of
bench/soak_load.py against them (echo sessions, lobby members that join, chat, crash and
resume, leave; a topics subscriber and publisher; a garbage spray at every UDP port); every
`--sample` seconds (10) reads each server's RSS, open fds and CPU time from /proc and scrapes
its /metrics. At the end every server gets SIGTERM and must exit 0.

Prints a summary (per server: RSS first/last and its slope in MiB per hour over the samples
after the first quarter, fds first/last/max, CPU seconds; every client outcome) and writes it
as the result file bench/results/soak.json (bench/report.py shows it); `--details FILE` keeps
every sample. The test suite runs it for about a minute (tests/bench/test_soak.py).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
from prometheus_client.parser import text_string_to_metric_families

from bench import results as result_files
from bench import soak_load

CLK_TCK = os.sysconf("SC_CLK_TCK")
#: ports the soak uses from its base: echo-server 0-3, lobby servers 10-49, 50-89, 90-129
#: (16 members each), topics 130-131, metrics (TCP) 140-145
SPAN = 150
LOBBY_MAX_CLIENTS = 16
#: the metrics a sample keeps (summed over their labels), beside RSS, fds and CPU
KEPT_METRICS = (
    "echo_session_sessions_open",
    "echo_session_admissions_total",
    "echo_lobby_lobbies",
    "echo_lobby_members",
    "echo_lobby_chat_lines_total",
    "echo_topics_subscriptions",
)


@dataclass
class Server:
    """One server process of the soak and its samples."""

    name: str
    argv: list[str]
    metrics_port: int
    udp_ports: list[int]
    log: Path
    process: subprocess.Popen[bytes] | None = None
    #: (seconds since start, RSS MiB, open fds, CPU seconds, kept metrics)
    samples: list[tuple[float, float, int, float, dict[str, float]]] = field(default_factory=list)
    exit_code: int | None = None

    def start(self) -> None:
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def rss_mib(self) -> float:
        with open(f"/proc/{self.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        raise RuntimeError(f"{self.name}: no VmRSS")

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def cpu_s(self) -> float:
        with open(f"/proc/{self.pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def http(self, path: str, method: str = "GET") -> tuple[int, str]:
        connection = http.client.HTTPConnection("127.0.0.1", self.metrics_port, timeout=10)
        try:
            connection.request(method, path)
            response = connection.getresponse()
            return response.status, response.read().decode()
        finally:
            connection.close()

    def scrape(self) -> dict[str, float]:
        status, body = self.http("/metrics")
        if status != 200:
            raise RuntimeError(f"{self.name}: /metrics answered {status}")
        kept: dict[str, float] = {}
        for family in text_string_to_metric_families(body):
            for sample in family.samples:
                if sample.name in KEPT_METRICS:
                    kept[sample.name] = kept.get(sample.name, 0.0) + sample.value
        return kept

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.process.returncode}: {self.tail()}")
            try:
                if self.http("/readyz")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} not ready within {timeout} s: {self.tail()}")

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:]

    def stop(self, timeout: float = 60.0) -> None:
        if self.process is None or self.process.poll() is not None:
            self.exit_code = None if self.process is None else self.process.returncode
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.exit_code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            self.exit_code = -9


def free_base(span: int = SPAN, low: int = 20000, high: int = 32000) -> int:
    """A base port whose next `span` ports are free for UDP and TCP now (below the
    ephemeral range: client sockets cannot take them meanwhile)."""
    import random

    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(low, high - span)
        if all(_free(port) for port in range(base, base + span)):
            return base
    raise RuntimeError(f"no {span} free ports in [{low}, {high})")


def _free(port: int) -> bool:
    for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM):
        with socket.socket(socket.AF_INET, kind) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def _cli(program: str) -> list[str]:
    """A console script of this environment (as users run the servers)."""
    return [str(Path(sys.executable).parent / program)]


def plan(base: int, workdir: Path) -> list[Server]:
    """The servers of the soak on the ports from `base`."""
    seat_key = workdir / "seat.key"
    from echo.tickets import new_key_text

    seat_key.write_text(new_key_text(1))
    seat_key.chmod(0o600)
    logs = ["--log-format", "json", "--log-level", "warning"]
    servers = [
        Server(
            "echo-server",
            [
                *_cli("echo-server"), "--port", str(base), "--control-port", str(base + 1),
                "--clients-base-port", str(base + 2), "--duologue-ports", "shared",
                "--max-clients", "64", "--max-per-ip", "64",
                "--metrics", f"127.0.0.1:{base + 140}", *logs,
            ],
            base + 140,
            [base, base + 1, base + 2, base + 3],
            workdir / "echo-server.log",
        )
    ]  # fmt: skip
    topics = [f"127.0.0.1:{base + 130 + i}" for i in range(2)]
    for i in range(2):
        servers.append(
            Server(
                f"echo-topics-{i}",
                [
                    *_cli("echo-topics"), "--port", str(base + 130 + i),
                    "--metrics", f"127.0.0.1:{base + 144 + i}", *logs,
                ],
                base + 144 + i,
                [base + 130 + i],
                workdir / f"echo-topics-{i}.log",
            )
        )  # fmt: skip
    lobby_ports = [base + 10 + 40 * i for i in range(3)]
    ring = ",".join(f"127.0.0.1:{port}" for port in lobby_ports)
    for i, port in enumerate(lobby_ports):
        span = 2 + 2 * LOBBY_MAX_CLIENTS
        servers.append(
            Server(
                f"echo-lobby-{i}",
                [
                    *_cli("echo-lobby"), "--port", str(port),
                    "--max-clients", str(LOBBY_MAX_CLIENTS),
                    "--lobby-servers", ring, "--topics", ",".join(topics),
                    "--seat-key", str(seat_key), "--metrics", f"127.0.0.1:{base + 141 + i}",
                    *logs,
                ],
                base + 141 + i,
                list(range(port, port + span)),
                workdir / f"echo-lobby-{i}.log",
            )
        )  # fmt: skip
    return servers


def lobby_ring(servers: Sequence[Server]) -> list[str]:
    return [f"127.0.0.1:{s.udp_ports[0]}" for s in servers if s.name.startswith("echo-lobby")]


def topic_servers(servers: Sequence[Server]) -> list[str]:
    return [f"127.0.0.1:{s.udp_ports[0]}" for s in servers if s.name.startswith("echo-topics")]


@dataclass(frozen=True)
class Load:
    seconds: float
    echo_workers: int = 4
    lobby_groups: int = 2
    spray_rate: float = 50.0
    sample: float = 10.0


async def _run_load(servers: list[Server], load: Load, outcomes: Counter[str]) -> None:
    import echo.session as es
    from echo.lobby.timers import lobby_client_timers
    from echo.session.client import client_transport_config
    from echo.transport import open_transport

    start = trio.current_time()
    stop_at = start + load.seconds
    echo_server = servers[0]
    targets = [port for server in servers for port in server.udp_ports]

    async def sampler() -> None:
        next_at = start
        while True:
            for server in servers:
                # /proc first: the scrape's own connection is an fd of the server a while
                at = round(trio.current_time() - start, 1)
                rss, fds, cpu = round(server.rss_mib(), 3), server.fds(), round(server.cpu_s(), 2)
                kept = await trio.to_thread.run_sync(server.scrape)
                server.samples.append((at, rss, fds, cpu, kept))
            if trio.current_time() >= stop_at:
                return
            next_at = min(next_at + load.sample, stop_at)
            await trio.sleep_until(next_at)

    async with (
        open_transport(es.server_transport_config()) as echo_transport,
        open_transport(client_transport_config(lobby_client_timers())) as lobby_transport,
    ):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sampler)
            nursery.start_soon(soak_load.spray, outcomes, targets, stop_at, load.spray_rate)
            nursery.start_soon(soak_load.topics_churn, outcomes, topic_servers(servers), stop_at)
            for _ in range(load.echo_workers):
                nursery.start_soon(
                    soak_load.echo_churn,
                    outcomes,
                    echo_server.udp_ports[0],
                    echo_server.udp_ports[1],
                    stop_at,
                    echo_transport,
                )
            for group in range(load.lobby_groups):
                nursery.start_soon(
                    soak_load.lobby_churn,
                    outcomes,
                    lobby_ring(servers),
                    stop_at,
                    group,
                    lobby_transport,
                )


def slope_per_hour(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value) points, per hour."""
    if len(points) < 2:
        return 0.0
    xs = [t for t, _ in points]
    ys = [v for _, v in points]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mean_x) ** 2 for x in xs)
    if var == 0:
        return 0.0
    cov = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True))
    return cov / var * 3600.0


def server_summary(server: Server) -> dict[str, Any]:
    samples = server.samples
    steady = samples[len(samples) // 4 :]
    fds = [s[2] for s in samples]
    return {
        "rss_mib_first": samples[0][1],
        "rss_mib_steady_start": steady[0][1],
        "rss_mib_last": samples[-1][1],
        "rss_mib_max": max(s[1] for s in samples),
        "rss_slope_mib_per_h": round(slope_per_hour([(s[0], s[1]) for s in steady]), 3),
        "fds_first": fds[0],
        "fds_steady_start": steady[0][2],
        "fds_last": fds[-1],
        "fds_max": max(fds),
        "cpu_s": round(samples[-1][3] - samples[0][3], 2),
        "metrics_last": samples[-1][4],
        "exit_code": server.exit_code,
        "samples": len(samples),
    }


def start_all(bases: Callable[[], int], workdir: Path, attempts: int = 5) -> list[Server]:
    """Every server started and ready, on ports from `bases()`; a port that another program
    took between the probe and the start (a shared machine) means another try elsewhere."""
    for _ in range(attempts):
        servers = plan(bases(), workdir)
        try:
            for server in servers:
                server.start()
            for server in servers:
                server.wait_ready()
            return servers
        except RuntimeError as error:
            for server in servers:
                server.stop()
            if "in use" not in str(error):
                raise
    raise RuntimeError(f"no free ports for the soak's servers in {attempts} tries")


def soak(
    load: Load, bases: Callable[[], int] = free_base, workdir: Path | None = None
) -> dict[str, Any]:
    """Run the soak; its summary (every server's figures, the outcomes, the settings)."""
    with tempfile.TemporaryDirectory(prefix="echo-soak-") as scratch:
        where = workdir or Path(scratch)
        outcomes: Counter[str] = Counter()
        load_before = result_files.system_load()
        # The code that runs is the code of the start (the servers are started from it).
        commit = result_files.git_commit()
        servers = start_all(bases, where)
        try:
            trio.run(_run_load, servers, load, outcomes)
        finally:
            for server in servers:
                server.stop()
        summary = {
            "servers": {server.name: server_summary(server) for server in servers},
            "outcomes": dict(sorted(outcomes.items())),
            "problems": problems(servers, outcomes),
            "load": vars(load) | {"load_before": load_before},
            "load_after": result_files.system_load(),
            "commit": commit,
            "samples": {server.name: server.samples for server in servers},
        }
        if any(server.exit_code != 0 for server in servers):
            summary["logs"] = {s.name: s.tail() for s in servers if s.exit_code != 0}
    return summary


def problems(servers: Sequence[Server], outcomes: Counter[str]) -> list[str]:
    """What went wrong: any lost or failed outcome, a server that did not exit 0."""
    found = [
        f"{name}: {count}"
        for name, count in sorted(outcomes.items())
        if count and (name.endswith("_lost") or name.endswith("_failed"))
    ]
    found += [f"{s.name} exited {s.exit_code}" for s in servers if s.exit_code != 0]
    return found


def result_file(summary: dict[str, Any], command: str) -> result_files.BenchResult:
    """The soak's figures as a result file (one repeat: a soak is one long run)."""
    metrics = []
    for name, figures in summary["servers"].items():
        metrics.append(
            result_files.metric_from_repeats(
                name, "RSS slope", "MiB/h", True, [figures["rss_slope_mib_per_h"]]
            )
        )
        metrics.append(
            result_files.metric_from_repeats(
                name, "RSS at the end", "MiB", True, [figures["rss_mib_last"]]
            )
        )
        metrics.append(
            result_files.metric_from_repeats(
                name,
                "fd growth",
                "fds",
                True,
                [figures["fds_last"] - figures["fds_steady_start"]],
            )
        )
    outcomes = summary["outcomes"]
    for name in ("echo_sessions", "lobby_cycles", "chat_deliveries", "topic_messages_received"):
        metrics.append(
            result_files.metric_from_repeats(
                "clients", name.replace("_", " "), "count", False, [outcomes.get(name, 0)]
            )
        )
    lost = sum(
        count for key, count in outcomes.items() if key.endswith(("_lost", "_failed"))
    )
    metrics.append(
        result_files.metric_from_repeats(
            "clients",
            "lost or failed",
            "count",
            True,
            [lost],
            target={"op": "<=", "threshold": 0.0, "of": "value", "note": "nothing lost"},
        )
    )
    load = summary["load"]
    return result_files.BenchResult(
        id="soak",
        label="S1",
        title=f"Soak: every server under churn for {load['seconds']:g} s",
        command=command,
        date=result_files.utc_now(),
        commit=summary["commit"],
        repeats=1,
        machine=result_files.machine_info(load["load_before"], summary["load_after"]),
        metrics=tuple(metrics),
        settings={k: v for k, v in load.items() if k != "load_before"}
        | {"outcomes": outcomes, "problems": summary["problems"]},
    )


def print_summary(summary: dict[str, Any], out: Any = sys.stdout) -> None:
    print(f"{'server':<16}{'RSS MiB first/last':>20}{'slope MiB/h':>13}{'fds first/last/max':>20}"
          f"{'CPU s':>9}{'exit':>6}", file=out)  # fmt: skip
    for name, s in summary["servers"].items():
        print(
            f"{name:<16}{s['rss_mib_first']:>9.1f} /{s['rss_mib_last']:>8.1f}"
            f"{s['rss_slope_mib_per_h']:>13.2f}"
            f"{s['fds_first']:>10} /{s['fds_last']:>3} /{s['fds_max']:>3}"
            f"{s['cpu_s']:>9.1f}{s['exit_code']!s:>6}",
            file=out,
        )
    print("outcomes: " + ", ".join(f"{k}={v}" for k, v in summary["outcomes"].items()), file=out)
    print("problems: " + ("; ".join(summary["problems"]) or "none"), file=out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3600.0)
    parser.add_argument("--echo-workers", type=int, default=4)
    parser.add_argument("--lobby-groups", type=int, default=2)
    parser.add_argument("--spray-rate", type=float, default=50.0)
    parser.add_argument("--sample", type=float, default=10.0)
    parser.add_argument("--base-port", type=int, default=None)
    parser.add_argument("--results-dir", default=None, help="[default: bench/results]")
    parser.add_argument("--no-result-file", action="store_true")
    parser.add_argument("--details", default=None, help="Write every sample to this JSON file.")
    args = parser.parse_args(argv)
    load = Load(args.seconds, args.echo_workers, args.lobby_groups, args.spray_rate, args.sample)
    summary = soak(load, free_base if args.base_port is None else lambda: args.base_port)
    print_summary(summary)
    if args.details:
        Path(args.details).write_text(json.dumps(summary, indent=1))
    if not args.no_result_file:
        command = "python -m bench.soak " + " ".join(argv if argv is not None else sys.argv[1:])
        directory = Path(args.results_dir) if args.results_dir else result_files.RESULTS_DIR
        path = result_file(summary, command.strip()).write(directory)
        print(f"result file: {path}")
    return 1 if summary["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
