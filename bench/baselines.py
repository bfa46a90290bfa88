"""Raw trio UDP baselines: the fastest a trio program moves datagrams on this machine.

    python -m bench.baselines echo [--size 64] [--duration 5]
    python -m bench.baselines oneway [--size 64 --size 1408 ...] [--duration 5]

Each side runs in its own spawned process. Both use the fast trio pattern of docs/architecture.md,
Performance rules: a plain non-blocking socket, `trio.lowlevel.wait_readable` and then non-blocking
`recvfrom_into` into one reused buffer until BlockingIOError; non-blocking sends that wait writable
only on EAGAIN. Anything echo's transport does is measured against these in the same run.
"""

from __future__ import annotations

import argparse
import socket
import struct
import sys
import time
from typing import Any

import trio
import trio.lowlevel

from bench import harness
from bench.harness import (
    BenchError,
    Child,
    Control,
    Result,
    RoundTrips,
    Settings,
    kernel_drops,
    round_trip_results,
    set_buffers,
    usage_extra,
)

ECHO_SIZE = 64
ONEWAY_SIZES = (64, 1408, 8192)
#: A one-way sender ends with datagrams of this length (data datagrams are never this short);
#: several are sent because UDP may drop any one of them when the receiver is behind.
END_MARKER = b"\xff"
MARKERS = 20
_SEQUENCE = struct.Struct("<Q")


def _bound_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    set_buffers(sock)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    return sock


# ------------------------------------------------------------------ echo round trips


def echo_server(ctl: Control, duration: float, slack: float) -> dict[str, Any]:
    """Reflect every datagram to its sender; an empty datagram is the client's goodbye."""
    sock = _bound_socket()
    ctl.ready(sock.getsockname()[1])
    return trio.run(_echo_server, ctl, sock, duration + slack)


async def _echo_server(ctl: Control, sock: socket.socket, limit: float) -> dict[str, Any]:
    buffer = bytearray(65536)
    view = memoryview(buffer)
    recvfrom_into = sock.recvfrom_into
    sendto = sock.sendto
    echoed = 0
    with trio.move_on_after(limit), sock:
        while True:
            await trio.lowlevel.wait_readable(sock)
            while True:
                try:
                    size, source = recvfrom_into(buffer)
                except BlockingIOError:
                    break
                try:
                    sendto(view[:size], source)
                except BlockingIOError:
                    await trio.lowlevel.wait_writable(sock)
                    sendto(view[:size], source)
                if size == 0:
                    ctl.end()
                    return {"echoed": echoed}
                if not echoed:
                    ctl.begin()
                echoed += 1
    raise BenchError("echo server: the client never said goodbye")


def echo_client(ctl: Control, port: int, size: int, duration: float) -> dict[str, Any]:
    sock = _bound_socket()
    sock.connect(("127.0.0.1", port))
    ctl.ready()
    return trio.run(_echo_client, ctl, sock, size, duration)


async def _echo_client(
    ctl: Control, sock: socket.socket, size: int, duration: float
) -> dict[str, Any]:
    payload = bytearray(size)
    buffer = bytearray(65536)
    send = sock.send
    recv_into = sock.recv_into
    pack_into = _SEQUENCE.pack_into
    unpack_from = _SEQUENCE.unpack_from
    rounds = RoundTrips(ctl, duration)
    # Nothing on loopback loses a lone datagram in practice; if one is, fail rather than hang.
    with trio.fail_after(duration + 30), sock:
        for sequence in rounds:
            pack_into(payload, 0, sequence)
            send(payload)
            while True:
                try:
                    received = recv_into(buffer)
                except BlockingIOError:
                    await trio.lowlevel.wait_readable(sock)
                    continue
                if received == size and unpack_from(buffer)[0] == sequence:
                    break
        ctl.end()
        send(b"")
    return rounds.summary()


def raw_echo(settings: Settings, size: int = ECHO_SIZE) -> list[Result]:
    """Round trips of one `size`-byte datagram between two processes."""
    with Child("raw echo server", echo_server, settings.duration, settings.slack) as server:
        port = server.wait_ready()
        with Child("raw echo client", echo_client, port, size, settings.duration) as client:
            summary = client.result(settings.duration + settings.slack)
            server.result(settings.slack)
    extra = {"size": size, "round_trips": summary["round_trips"]}
    extra.update(usage_extra(client=client, server=server))
    return round_trip_results(f"raw_echo_{size}", summary, None, extra)


# ------------------------------------------------------------------ one-way blast


def sink(ctl: Control, duration: float, slack: float) -> dict[str, Any]:
    """Count datagrams until the end marker; the clock runs from the first to the last. Also
    what the kernel dropped on arrival (the sink fell behind) and how many datagrams each
    wake-up read (see docs/benchmarking.md, "B2's raw baseline")."""
    sock = _bound_socket()
    buffers = {"rcvbuf": sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)}
    ctl.ready(sock.getsockname()[1])
    result = trio.run(_sink, ctl, sock, duration + slack)
    result.update(buffers)
    return result


async def _sink(ctl: Control, sock: socket.socket, limit: float) -> dict[str, Any]:
    buffer = bytearray(65536)
    recv_into = sock.recv_into
    clock = time.perf_counter
    count = 0
    received_bytes = 0
    wakeups = 0
    first = last = 0.0
    marker = len(END_MARKER)
    with trio.move_on_after(limit), sock:
        while True:
            await trio.lowlevel.wait_readable(sock)
            wakeups += 1
            while True:
                try:
                    size = recv_into(buffer)
                except BlockingIOError:
                    break
                if size == marker:
                    ctl.end()
                    return {
                        "count": count,
                        "bytes": received_bytes,
                        "elapsed": last - first,
                        "wakeups": wakeups,
                        # (markers the kernel dropped are in it too: at most MARKERS)
                        "kernel_drops": kernel_drops(sock),
                    }
                if not count:
                    ctl.begin()
                    first = clock()
                count += 1
                received_bytes += size
            # Per wakeup, not per datagram: the clock read is what the drain saves.
            last = clock()
    raise BenchError("raw sink: no end marker arrived")


def blast(ctl: Control, port: int, size: int, duration: float) -> dict[str, Any]:
    sock = _bound_socket()
    sock.connect(("127.0.0.1", port))
    ctl.ready()
    return trio.run(_blast, ctl, sock, size, duration)


async def _blast(ctl: Control, sock: socket.socket, size: int, duration: float) -> dict[str, Any]:
    payload = bytes(size)
    send = sock.send
    clock = time.perf_counter
    sent = 0
    blocked = 0
    with sock:
        ctl.begin()
        start = clock()
        end = start + duration
        while clock() < end:
            # Check the clock every 64 datagrams: reading it costs as much as a send.
            for _ in range(64):
                try:
                    send(payload)
                    sent += 1
                except BlockingIOError:
                    blocked += 1
                    await trio.lowlevel.wait_writable(sock)
            await trio.lowlevel.checkpoint()
        elapsed = clock() - start
        ctl.end()
        for _ in range(MARKERS):
            try:
                send(END_MARKER)
            except BlockingIOError:
                pass
            except ConnectionRefusedError:
                break  # the receiver saw an earlier marker and closed: ICMP unreachable
            await trio.sleep(0.01)
    return {"sent": sent, "elapsed": elapsed, "blocked": blocked}


def oneway_accounting(sent: int, elapsed: float, got: dict[str, Any]) -> dict[str, Any]:
    """What became of a one-way pass's datagrams: sent, received, dropped by the kernel at the
    sink (its queue was full: the sink was the slower side), and the datagrams each of the
    sink's wake-ups read (about 1: it kept up and slept between datagrams; hundreds: it never
    caught up). `bound` says which side the received rate measures: the sink's own pace when
    the kernel dropped more than 1 % of what was sent, else the sender's."""
    received = int(got["count"])
    drops = got.get("kernel_drops")
    extra: dict[str, Any] = {
        "sent": sent,
        "received": received,
        "loss_pct": round(100 * (1 - received / sent), 2) if sent else 0,
        "sent_per_s": round(sent / elapsed) if elapsed > 0 else 0,
        "kernel_drops": drops,
        "per_wakeup": round(received / got["wakeups"], 1) if got.get("wakeups") else None,
    }
    if drops is not None and sent:
        extra["bound"] = "sink" if drops > 0.01 * sent else "sender"
    return extra


def raw_oneway(settings: Settings, sizes: tuple[int, ...] = ONEWAY_SIZES) -> list[Result]:
    """For each size: datagrams/s and MB/s as received while a sender blasts."""
    results: list[Result] = []
    for size in sizes:
        limit = settings.duration + settings.slack
        with Child("raw sink", sink, settings.duration, settings.slack) as receiver:
            port = receiver.wait_ready()
            with Child("raw blast", blast, port, size, settings.duration) as sender:
                sent = sender.result(limit)
                got = receiver.result(limit)
        if not got["count"] or got["elapsed"] <= 0:
            raise BenchError(f"raw one-way {size} B: nothing received")
        rate = got["count"] / got["elapsed"]
        extra = {
            "size": size,
            **oneway_accounting(sent["sent"], sent["elapsed"], got),
            "sender_blocked": sent["blocked"],
            "rcvbuf": got["rcvbuf"],
            # the CPUs the sink and the sender were pinned to ([]: placed by the scheduler)
            "cpus": [cpu for cpu in (receiver.cpu, sender.cpu) if cpu is not None],
        }
        extra.update(usage_extra(sender=sender, receiver=receiver))
        name = f"raw_oneway_{size}"
        if extra.get("bound") == "sink":
            print(
                f"{name}: the sink fell behind (the kernel dropped {extra['kernel_drops']:,} of "
                f"{extra['sent']:,}): this pass measured the sink's pace, not the sender's",
                file=sys.stderr,
                flush=True,
            )
        results.append(Result(name, "datagrams/s", rate, "dgram/s", extra, raw=True))
        mb_per_s = got["bytes"] / got["elapsed"] / 1e6
        results.append(Result(name, "MB/s", mb_per_s, "MB/s", raw=True))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description="raw trio UDP baselines")
    parser.add_argument("kind", choices=("echo", "oneway"))
    parser.add_argument("--size", type=int, action="append", help="bytes (repeatable)")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    parser.add_argument("--pin", help="comma-separated CPUs to pin the sides to, round robin")
    args = parser.parse_args()
    if args.pin:
        harness.pin([int(cpu) for cpu in args.pin.split(",")])
    settings = Settings(duration=args.duration, quick=False)
    if args.kind == "echo":
        results = [r for s in args.size or [ECHO_SIZE] for r in raw_echo(settings, s)]
    else:
        results = raw_oneway(settings, tuple(args.size or ONEWAY_SIZES))
    for result in results:
        print(f"{result.name:22} {result.metric:14} {result.value:14,.1f} {result.unit}")
        for key, value in result.extra.items():
            print(f"{'':38}{key} = {value}")


if __name__ == "__main__":
    main()
