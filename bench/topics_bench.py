"""Topics benchmarks: T1 fan-out against raw trio UDP, T2 publish-to-receive p99.

    python -m bench.topics_bench [--duration 5] [--repeat 3] [--subscribers 1000]

T1: one publisher, 1,000 subscribers (1,000 UDP sockets in one receiving process, each
subscribed through the real handshake) on one ``echo-topics`` server process. The figure is
the datagrams the subscribers received per second. Its baseline, measured in the same run
against the same receiving process, is a raw trio program that sends datagrams of exactly the
same size to the same 1,000 sockets, round robin, as fast as its non-blocking ``sendto`` goes
(the pattern of bench/baselines.py). The server's CPU (% of one core over the measured part)
and RSS are read from /proc.

T2: 100 subscribers, a publisher at a modest rate (far below the server's capacity); every
message carries its send time (CLOCK_MONOTONIC, shared by the processes of one machine) and
each of the 100 copies' arrival is a sample.

``--repeat R`` runs T1 R times (raw and topics alternating, so drift hits both) and T2 R times
and prints every run and the spread; the suite (``python -m bench.run --only topics``) runs
each once.
"""

from __future__ import annotations

import argparse
import datetime
import json
import select
import socket
import statistics
import sys
import time
from typing import Any

import trio
import trio.lowlevel

from bench import harness
from bench.harness import (
    BenchError,
    Child,
    CliProcess,
    Control,
    Result,
    Settings,
    latency_summary,
    usage_extra,
)
from echo.topics.codec import (
    Cookie,
    format_confirm,
    format_pad,
    format_publish,
    parse_datagram,
    solve_work,
)

TOPIC = b"bench/fanout"
#: The payload of a T1 message; the id makes each line unique, as a real client's would.
PAYLOAD = b"x" * 64
T1_SUBSCRIBERS = 1000
T2_SUBSCRIBERS = 100
#: Publishes per second in T1: enough to keep the server saturated (it can forward a few
#: hundred thousand datagrams a second, i.e. a few hundred publishes to 1,000 subscribers);
#: what the server's socket cannot hold is dropped before it costs the server anything.
T1_PUBLISH_RATE = 1000


def t1_publish_rate(subscribers: int) -> int:
    """Publishes/s that ask for at least 300,000 deliveries/s: more than the server can do."""
    return max(T1_PUBLISH_RATE, 300_000 // max(1, subscribers))


T2_PUBLISH_RATE = 100
RECEIVE_BUFFER = 256 * 1024


def _line(sequence: int) -> bytes:
    # A fixed-width id and timestamp: every T1 datagram has exactly the same size.
    stamp = b"%020d" % time.monotonic_ns()
    return format_publish(TOPIC, stamp + PAYLOAD, b"%012d" % sequence)


def datagram_size() -> int:
    return len(_line(0))


# ------------------------------------------------------------------ the subscribers' side


def _subscribe(sock: socket.socket, server: tuple[str, int]) -> None:
    """The real three-way handshake, as a client library does it (blocking, one socket)."""
    request = TOPIC + b"\n"
    sock.sendto(request + format_pad(64), server)
    for line in parse_datagram(sock.recv(65536)):
        if isinstance(line, Cookie):
            confirm = format_confirm(line.cookie, solve_work(line.cookie, line.difficulty))
            sock.sendto(confirm + request, server)
            if not sock.recv(65536).startswith(b"!life"):
                raise BenchError("the server did not confirm a subscription")
            return
    raise BenchError("the server sent no cookie")


def subscribers(
    ctl: Control,
    count: int,
    server_port: int | None,
    idle: float,
    limit: float,
    latency: bool,
) -> dict[str, Any]:
    """``count`` subscriber sockets; counts (and times) what arrives until ``idle`` s quiet."""
    socks = []
    for _ in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
        sock.bind(("127.0.0.1", 0))
        socks.append(sock)
    if server_port is not None:
        for sock in socks:
            sock.settimeout(10)
            _subscribe(sock, ("127.0.0.1", server_port))
    for sock in socks:
        sock.setblocking(False)
    ctl.ready([sock.getsockname()[1] for sock in socks])
    poller = select.epoll()
    by_fd = {sock.fileno(): sock.recv_into for sock in socks}
    for fd in by_fd:
        poller.register(fd, select.EPOLLIN)
    buffer = bytearray(65536)
    received = 0
    received_bytes = 0
    lines = 0
    first = last = 0.0
    samples: list[int] = []
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        events = poller.poll(idle if received else 1.0)
        if not events:
            if received:
                break
            continue
        if not received:
            ctl.begin()
            first = time.monotonic()
        for fd, _ in events:
            recv_into = by_fd[fd]
            while True:
                try:
                    size = recv_into(buffer)
                except BlockingIOError:
                    break
                received += 1
                received_bytes += size
                lines += buffer.count(b"\n", 0, size)
                if latency:
                    now = time.monotonic_ns()
                    # "bench/fanout <20-digit stamp>x... id\n"
                    start = len(TOPIC) + 1
                    samples.append(now - int(buffer[start : start + 20]))
        last = time.monotonic()
    ctl.end()
    for sock in socks:
        sock.close()
    return {
        "received": received,
        "bytes": received_bytes,
        "lines": lines,
        "seconds": last - first,
        "samples_ns": samples,
    }


# ------------------------------------------------------------------ the sending sides


def raw_fanout(ctl: Control, ports: list[int], size: int, duration: float) -> dict[str, Any]:
    """The baseline: the same datagrams to the same sockets, straight from a trio program."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    harness.set_buffers(sock)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    ctl.ready()
    return trio.run(_raw_fanout, ctl, sock, ports, size, duration)


async def _raw_fanout(
    ctl: Control, sock: socket.socket, ports: list[int], size: int, duration: float
) -> dict[str, Any]:
    addresses = [("127.0.0.1", port) for port in ports]
    datagram = _line(0)
    assert len(datagram) == size
    sendto = sock.sendto
    sent = 0
    ctl.begin()
    end = trio.current_time() + duration
    while trio.current_time() < end:
        for address in addresses:
            while True:
                try:
                    sendto(datagram, address)
                except BlockingIOError:
                    await trio.lowlevel.wait_writable(sock)
                    continue
                break
        sent += len(addresses)
        await trio.lowlevel.checkpoint()
    ctl.end()
    sock.close()
    return {"sent": sent}


def publisher(ctl: Control, server_port: int, rate: int, duration: float) -> dict[str, Any]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    ctl.ready()
    return trio.run(_publish, ctl, sock, server_port, rate, duration)


async def _publish(
    ctl: Control, sock: socket.socket, port: int, rate: int, duration: float
) -> dict[str, Any]:
    address = ("127.0.0.1", port)
    sent = 0
    ctl.begin()
    start = trio.current_time()
    tick = 0.01
    while trio.current_time() - start < duration:
        # Paced in 10 ms slices: `rate` publishes a second, one datagram each.
        due = int((trio.current_time() - start + tick) * rate)
        while sent < due:
            sock.sendto(_line(sent), address)
            sent += 1
        await trio.sleep(tick)
    ctl.end()
    sock.close()
    return {"published": sent}


# ------------------------------------------------------------------ running them


def _server(max_datagram: int | None) -> CliProcess:
    # max_datagram = one publish line: every forwarded datagram carries one message, exactly
    # the datagram the raw baseline sends. Without it the server packs the lines queued for a
    # subscriber into one datagram (its normal behaviour), and moves more messages than
    # datagrams: that is reported separately (messages/s), not against raw datagrams/s.
    limit = ["--max-datagram", str(max_datagram)] if max_datagram else []
    return CliProcess(
        "echo-topics",
        [
            sys.executable,
            "-m",
            "echo.topics.serve",
            "--port",
            "0",
            "--log-format",
            "json",
            "--rate-limit",
            "0",
            "--lifetime",
            "600",
            "--stats-interval",
            "0.25",
            *limit,
        ],
    )


def _settle(duration: float) -> float:
    return max(1.0, min(3.0, duration))


def run_raw_t1(settings: Settings, count: int) -> dict[str, Any]:
    size = datagram_size()
    idle = _settle(settings.duration)
    with Child(
        "subscribers", subscribers, count, None, idle, settings.duration + settings.slack, False
    ) as subs:
        ports = subs.wait_ready(60)
        with Child("raw sender", raw_fanout, ports, size, settings.duration) as sender:
            sender.wait_ready()
            sent = sender.result(settings.duration + settings.slack)["sent"]
        got = subs.result(settings.duration + settings.slack)
    usage = usage_extra(sender=sender, subscribers=subs)
    return {
        # Per CPU-second of the sending process: what one datagram costs, which on a shared
        # machine varies less than the share of a core each process happens to get.
        "per_cpu": sent / usage["sender_cpu_s"] if usage.get("sender_cpu_s") else 0.0,
        # What the sender handed to the kernel: on loopback the datagram is then in the
        # subscriber's socket (or dropped there, which "loss" counts), as for the server.
        "rate": sent / settings.duration,
        "received_rate": got["received"] / got["seconds"] if got["seconds"] > 0 else 0.0,
        "sent": sent,
        "received": got["received"],
        "loss": 1 - got["received"] / sent if sent else 0.0,
        "size": size,
        **usage,
    }


def _send_rate(records: list[dict[str, Any]], start: float, end: float) -> float:
    """Datagrams/s the server sent while the publisher ran, from its periodic counters."""
    inside = [
        (datetime.datetime.fromisoformat(r["timestamp"]).timestamp(), r["datagrams_sent"])
        for r in records
    ]
    inside = [(t, n) for t, n in inside if start <= t <= end]
    if len(inside) < 2:
        raise BenchError("too few counter records from echo-topics to measure its send rate")
    (t0, n0), (t1, n1) = inside[0], inside[-1]
    return (n1 - n0) / (t1 - t0)


def run_topics(
    settings: Settings, count: int, rate: int, latency: bool, packed: bool = False
) -> dict[str, Any]:
    idle = _settle(settings.duration)
    server = _server(None if packed else max(64, datagram_size()))
    with server:
        server.wait_ready(60)
        port = int(server.records("listening")[0]["port"])
        with Child(
            "subscribers",
            subscribers,
            count,
            port,
            idle,
            settings.duration + settings.slack,
            latency,
        ) as subs:
            subs.wait_ready(120)
            with Child("publisher", publisher, port, rate, settings.duration) as pub:
                pub.wait_ready()
                # From here the publisher publishes: the process start is not measured.
                cpu_before, wall_before = server.cpu_seconds(), time.monotonic()
                epoch_before = time.time()
                published = pub.result(settings.duration + settings.slack)["published"]
            cpu_after, wall_after = server.cpu_seconds(), time.monotonic()
            epoch_after = time.time()
            rss, peak = server.rss_mib(), server.peak_rss_mib()
            got = subs.result(settings.duration + settings.slack)
        if server.stop() != 0:
            raise BenchError(f"echo-topics did not stop cleanly:\n{server.tail()}")
    cpu_pct = 100 * (cpu_after - cpu_before) / (wall_after - wall_before)
    send_rate = _send_rate(server.records("topics_counters"), epoch_before, epoch_after)
    stopped = server.records("topics_stopped")
    counters = stopped[-1] if stopped else {}
    forwarded = int(counters.get("datagrams_sent", 0))
    seconds = got["seconds"]
    result = {
        "rate": send_rate,
        "received_rate": got["received"] / seconds if seconds > 0 else 0.0,
        "messages_rate": got["lines"] / seconds if seconds > 0 else 0.0,
        "received": got["received"],
        "published": published,
        "publishes_handled": counters.get("publishes"),
        "server_sent": forwarded,
        "loss": 1 - got["received"] / forwarded if forwarded else 0.0,
        "server_cpu_pct": round(cpu_pct, 1),
        "per_cpu": send_rate / (cpu_pct / 100) if cpu_pct > 0 else 0.0,
        "server_rss_mib": round(rss, 1),
        "server_peak_rss_mib": round(peak, 1),
        "size": datagram_size(),
        **usage_extra(subscribers=subs),
    }
    if latency:
        result["latency"] = latency_summary(got["samples_ns"])
        result["samples"] = len(got["samples_ns"])
    return result


def topics(settings: Settings) -> list[Result]:
    """T1 and T2 once each (the suite's entry)."""
    count = 100 if settings.quick else T1_SUBSCRIBERS
    raw = run_raw_t1(settings, count)
    t1 = run_topics(settings, count, t1_publish_rate(count), latency=False)
    packed = run_topics(settings, count, t1_publish_rate(count), latency=False, packed=True)
    t2 = run_topics(settings, T2_SUBSCRIBERS, T2_PUBLISH_RATE, latency=True)
    return results(raw, t1, packed, t2, count)


def results(
    raw: dict[str, Any],
    t1: dict[str, Any],
    packed: dict[str, Any],
    t2: dict[str, Any],
    count: int,
) -> list[Result]:
    size = raw["size"]
    return [
        Result(
            "topics_raw_fanout",
            f"{size} B datagrams/s to {count} sockets",
            raw["rate"],
            "datagrams/s",
            extra={k: v for k, v in raw.items() if k != "rate"},
            raw=True,
        ),
        Result(
            "topics_fanout",
            f"{size} B datagrams/s to {count} sockets",
            t1["rate"],
            "datagrams/s",
            extra={
                **{k: v for k, v in t1.items() if k != "rate"},
                "summary": f"server {t1['server_cpu_pct']:.0f} % CPU, {t1['server_rss_mib']:.0f} "
                f"MiB RSS, loss {100 * t1['loss']:.1f} %",
            },
            baseline=("topics_raw_fanout", f"{size} B datagrams/s to {count} sockets"),
            target=(">=", 0.7, "ratio"),
        ),
        Result(
            "topics_raw_fanout",
            "datagrams per CPU-second of the sender",
            raw["per_cpu"],
            "datagrams/s",
            raw=True,
        ),
        Result(
            "topics_fanout",
            "datagrams per CPU-second of the sender",
            t1["per_cpu"],
            "datagrams/s",
            baseline=("topics_raw_fanout", "datagrams per CPU-second of the sender"),
        ),
        Result(
            "topics_fanout_packed",
            f"{size} B messages/s to {count} subscribers",
            packed["messages_rate"],
            "msg/s",
            extra={
                **{k: v for k, v in packed.items() if k != "messages_rate"},
                "summary": f"lines packed up to 1400 B; server {packed['server_cpu_pct']:.0f} % "
                f"CPU, {packed['server_rss_mib']:.0f} MiB RSS",
            },
            baseline=("topics_raw_fanout", f"{size} B datagrams/s to {count} sockets"),
        ),
        Result(
            "topics_latency",
            f"publish-to-receive p99, {T2_SUBSCRIBERS} subscribers",
            t2["latency"]["p99_us"] / 1000,
            "ms",
            extra={
                **{k: v for k, v in t2.items() if k not in ("rate",)},
                "summary": f"p50 {t2['latency']['p50_us'] / 1000:.2f} ms over "
                f"{t2['samples']} samples, {T2_PUBLISH_RATE} publishes/s",
            },
            lower_is_better=True,
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.topics_bench", description=__doc__)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each (spread reported)")
    parser.add_argument("--subscribers", type=int, default=T1_SUBSCRIBERS)
    parser.add_argument("--pin", default=None, help="CPUs, e.g. 0,1 (default: first two)")
    parser.add_argument("--json", type=str, default=None, help="also write the runs here")
    args = parser.parse_args(argv)
    from bench.run import pin_cpus

    cpus = pin_cpus(args.pin)
    settings = Settings(duration=args.duration, quick=False, pin=cpus)
    runs: list[dict[str, Any]] = []
    for i in range(args.repeat):
        harness.pin(cpus)
        raw = run_raw_t1(settings, args.subscribers)
        harness.pin(cpus)
        t1 = run_topics(
            settings, args.subscribers, t1_publish_rate(args.subscribers), latency=False
        )
        harness.pin(cpus)
        packed = run_topics(
            settings, args.subscribers, t1_publish_rate(args.subscribers), False, packed=True
        )
        harness.pin(cpus)
        t2 = run_topics(settings, T2_SUBSCRIBERS, T2_PUBLISH_RATE, latency=True)
        run = {
            "raw_rate": raw["rate"],
            "t1_rate": t1["rate"],
            "ratio": t1["rate"] / raw["rate"] if raw["rate"] else float("nan"),
            "ratio_per_cpu": t1["per_cpu"] / raw["per_cpu"] if raw["per_cpu"] else float("nan"),
            "packed_messages_rate": packed["messages_rate"],
            "t1_server_cpu_pct": t1["server_cpu_pct"],
            "t1_server_rss_mib": t1["server_rss_mib"],
            "t1_loss": t1["loss"],
            "raw_loss": raw["loss"],
            "t2_p50_ms": t2["latency"]["p50_us"] / 1000,
            "t2_p99_ms": t2["latency"]["p99_us"] / 1000,
            "raw": raw,
            "t1": t1,
            "packed": packed,
            "t2": {k: v for k, v in t2.items() if k != "samples_ns"},
        }
        runs.append(run)
        print(
            f"run {i + 1}: raw {raw['rate']:,.0f}/s (loss {100 * raw['loss']:.1f} %), "
            f"topics {t1['rate']:,.0f}/s (loss {100 * t1['loss']:.1f} %) "
            f"= {run['ratio']:.2f} x raw ({run['ratio_per_cpu']:.2f} x per CPU-second); "
            f"server {t1['server_cpu_pct']:.0f} % CPU, "
            f"{t1['server_rss_mib']:.0f} MiB; packed {packed['messages_rate']:,.0f} msg/s; "
            f"T2 p50 {run['t2_p50_ms']:.2f} ms p99 {run['t2_p99_ms']:.2f} ms",
            flush=True,
        )
    keys = ("raw_rate", "t1_rate", "ratio", "ratio_per_cpu", "t1_server_cpu_pct")
    keys += ("packed_messages_rate",)
    for key in (*keys, "t2_p99_ms"):
        values = [run[key] for run in runs]
        print(
            f"{key}: median {statistics.median(values):,.3f}, "
            f"min {min(values):,.3f}, max {max(values):,.3f}"
        )
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"machine": harness.machine_info(), "runs": runs}, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
