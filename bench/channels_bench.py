"""C1 / C2: logical channels (echo.channels) over a real echo.transport pair on loopback.

    python -m bench.channels_bench [--duration S] [--repeat N] [--loss 0,0.05]

C1: round-trip latency of a 16-byte control-channel message (priority 0) while a bulk channel
    (priority 1, 64 KiB buffer) is saturated: its sender offers 1 KiB messages at 2,000/s,
    its consumer takes 200/s (10x slower). Baseline: the same pings with the bulk channel idle,
    in the same run, at the same loss. Target: p99 saturated <= 2 x p99 idle.
C2: one-way throughput of 1 KiB messages on one channel (optimistic sends, a consumer as fast
    as it can) against the bare session (one session message per 1 KiB message) in the same
    run: a real echo.session session once that package exists, else the transport pair.
    Target: >= 0.8 x.

Both ends run in one process (one trio run), each with its own transport and sockets; loss is
a test-side receive drop (tests/transport/lossy.py's LossyNetwork socket factory), which
Aeron's NAKs repair. Each figure is repeated (--repeat) and reported as the median with the
min..max spread.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import statistics
import time
from collections.abc import AsyncIterator
from typing import Any

import trio

from bench.harness import Result, Settings, percentile
from echo.channels import ChannelSpec, open_channels
from tests.channels.sessions import transport_pair

CONTROL, BULK = 0, 1
SPECS = [
    ChannelSpec(CONTROL, capacity=4096, priority=0),
    ChannelSpec(BULK, capacity=64 * 1024, priority=1),
]
#: the same, with the control channel on an Aeron stream of its own (head-of-line isolation)
ISOLATED_SPECS = [
    ChannelSpec(CONTROL, capacity=4096, priority=0, own_stream=True),
    ChannelSpec(BULK, capacity=64 * 1024, priority=1),
]
BULK_SIZE = 1024
BULK_SEND_INTERVAL = 1 / 2000
BULK_CONSUME_INTERVAL = 1 / 200


async def _c1_phase(
    duration: float, loss: float, saturated: bool, seed: int, *, streaming: bool = False,
    isolated: bool = False,
) -> list[float]:
    """Control round trips (seconds) over `duration`, the bulk channel saturated or idle.

    streaming=True (with saturated=False): bulk flows at its sender's pace to a consumer as
    fast as it can, so its buffer never fills: what a loss then adds to control latency is
    head-of-line blocking on the shared stream alone (the H figure). isolated=True puts the
    control channel on its own stream (ChannelSpec.own_stream).
    """
    specs = ISOLATED_SPECS if isolated else SPECS
    samples: list[float] = []
    bulk_sent = 0
    async with transport_pair(loss=loss, seed=seed) as (a, b):
        async with open_channels(a, specs) as ca, open_channels(b, specs) as cb:

            async def bulk_sender() -> None:
                nonlocal bulk_sent
                payload = b"b" * BULK_SIZE
                while True:
                    await ca[BULK].send(payload)
                    bulk_sent += 1
                    await trio.sleep(BULK_SEND_INTERVAL)

            async def bulk_consumer() -> None:
                async for _ in cb[BULK]:
                    if not streaming:
                        await trio.sleep(BULK_CONSUME_INTERVAL)

            async def control_echo() -> None:
                async for message in cb[CONTROL]:
                    await cb[CONTROL].send(message.data)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(control_echo)
                if saturated or streaming:
                    nursery.start_soon(bulk_sender)
                    nursery.start_soon(bulk_consumer)
                    await trio.sleep(0.5)  # fill the bulk buffer first
                warm_end = trio.current_time() + min(0.5, duration / 4)
                sent_at_start = bulk_sent
                end = warm_end + duration
                i = 0
                while trio.current_time() < end:
                    i += 1
                    ping = i.to_bytes(16, "big")
                    start = trio.current_time()
                    await ca[CONTROL].send(ping)
                    reply = await ca[CONTROL].receive()
                    if reply.data != ping:
                        raise RuntimeError("control echo out of order")
                    if start >= warm_end:
                        samples.append(trio.current_time() - start)
                    await trio.sleep(0.002)  # a game's control traffic, not a flood
                rate = (bulk_sent - sent_at_start) / (trio.current_time() - warm_end + 0.5)
                if saturated and rate > 0.5 / BULK_SEND_INTERVAL:
                    # Held to its consumer's pace, or the phase measured nothing.
                    raise RuntimeError(f"bulk channel was not saturated ({rate:.0f} msg/s)")

                nursery.cancel_scope.cancel()
    return samples


@contextlib.asynccontextmanager
async def session_pair() -> AsyncIterator[tuple[Any, Any]]:
    """(client, server) ends of a real echo.session session on loopback, once that package
    exists; until then the transport pair the tests use (same send/receive/close shape)."""
    try:
        import echo.session as es
    except ImportError:
        async with transport_pair() as pair:
            yield pair
        return
    from tests.server.test_server import free_base, server_config

    config = server_config(free_base(12))
    handed_over, taken = trio.open_memory_channel[Any](1)
    finished = trio.Event()

    async def app(session: Any) -> None:
        await handed_over.send(session)
        await finished.wait()

    async with trio.open_nursery() as nursery:
        await nursery.start(es.serve, config, app)
        async with es.connect(config.address, config.port, config.control_port,
                              timeout=10) as client:
            server_side = await taken.receive()
            try:
                yield client, server_side
            finally:
                finished.set()
        nursery.cancel_scope.cancel()


def baseline_kind() -> str:
    try:
        import echo.session  # noqa: F401
    except ImportError:
        return "transport publication/subscription pair"
    return "echo.session"


async def _c2_phase(duration: float, through_channels: bool) -> tuple[float, float]:
    """1 KiB messages per second, one way, over one channel or the bare session, and the
    process's CPU time per message (both ends run in this process): on a shared machine the
    rate moves with what else runs, the CPU per message much less."""
    payload = b"t" * BULK_SIZE
    count = 0
    async with session_pair() as (a, b):
        if through_channels:
            specs = [ChannelSpec(BULK, capacity=1 << 20)]
            async with open_channels(a, specs) as ca, open_channels(b, specs) as cb:

                async def consume() -> None:
                    nonlocal count
                    async for _ in cb[BULK]:
                        count += 1

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(consume)
                    # Warm up until messages flow end to end (not a fixed sleep: on a busy
                    # machine the first ones can take long).
                    while count < 64:
                        await ca[BULK].send(payload, optimistic=True)
                        await trio.sleep(0.001)
                    start, first, cpu = trio.current_time(), count, time.process_time()
                    end = start + duration
                    while trio.current_time() < end:
                        for _ in range(64):
                            await ca[BULK].send(payload, optimistic=True)
                    elapsed = trio.current_time() - start
                    received = count - first
                    cpu = time.process_time() - cpu
                    nursery.cancel_scope.cancel()
        else:

            async def consume_bare() -> None:
                nonlocal count
                while True:
                    await b.receive()
                    count += 1

            async with trio.open_nursery() as nursery:
                nursery.start_soon(consume_bare)
                while count < 64:
                    await a.send(payload)
                    await trio.sleep(0.001)
                start, first, cpu = trio.current_time(), count, time.process_time()
                end = start + duration
                while trio.current_time() < end:
                    for _ in range(64):
                        await a.send(payload)
                elapsed = trio.current_time() - start
                received = count - first
                cpu = time.process_time() - cpu
                nursery.cancel_scope.cancel()
    return received / elapsed, cpu / max(received, 1) * 1e6


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def run_c1(duration: float, repeat: int, losses: list[float]) -> list[dict[str, Any]]:
    rows = []
    for loss in losses:
        idle_p99, busy_p99, ratios = [], [], []
        for r in range(repeat):
            idle = sorted(trio.run(_c1_phase, duration, loss, False, 100 + r))
            busy = sorted(trio.run(_c1_phase, duration, loss, True, 200 + r))
            i99, b99 = percentile(idle, 99), percentile(busy, 99)
            idle_p99.append(i99 * 1e6)
            busy_p99.append(b99 * 1e6)
            ratios.append(b99 / i99)
        rows.append({
            "loss": loss,
            "idle_p99_us": _spread(idle_p99),
            "saturated_p99_us": _spread(busy_p99),
            "ratio": _spread(ratios),
        })
    return rows


def run_hol(duration: float, repeat: int, losses: list[float]) -> list[dict[str, Any]]:
    """H: control round trips with bulk idle and with bulk streaming (never saturated), at each
    loss rate. At 0 % loss the difference is bulk's CPU and queueing cost; at 5 % it adds what
    lost bulk datagrams cost control messages behind them on the one stream (head of line)."""
    rows = []
    for loss in losses:
        figures: dict[str, list[float]] = collections.defaultdict(list)
        for r in range(repeat):
            idle = sorted(trio.run(_c1_phase, duration, loss, False, 300 + r))
            shared = sorted(trio.run(
                functools.partial(_c1_phase, duration, loss, False, 400 + r, streaming=True)))
            isolated = sorted(trio.run(functools.partial(
                _c1_phase, duration, loss, False, 500 + r, streaming=True, isolated=True)))
            for name, samples in (("idle", idle), ("shared", shared), ("isolated", isolated)):
                figures[f"{name}_p50_us"].append(percentile(samples, 50) * 1e6)
                figures[f"{name}_p99_us"].append(percentile(samples, 99) * 1e6)
            figures["shared_ratio"].append(
                figures["shared_p99_us"][-1] / figures["idle_p99_us"][-1])
            figures["isolated_ratio"].append(
                figures["isolated_p99_us"][-1] / figures["idle_p99_us"][-1])
        rows.append({"loss": loss, **{k: _spread(v) for k, v in figures.items()}})
    return rows


def run_c2(duration: float, repeat: int) -> dict[str, Any]:
    bare, chan, ratios, bare_cpu, chan_cpu, cpu_ratios = [], [], [], [], [], []
    for _ in range(repeat):
        b, b_cpu = trio.run(_c2_phase, duration, False)
        c, c_cpu = trio.run(_c2_phase, duration, True)
        bare.append(b)
        chan.append(c)
        ratios.append(c / b)
        bare_cpu.append(b_cpu)
        chan_cpu.append(c_cpu)
        cpu_ratios.append(b_cpu / c_cpu)
    return {"bare_msg_s": _spread(bare), "channel_msg_s": _spread(chan), "ratio": _spread(ratios),
            "bare_cpu_us": _spread(bare_cpu), "channel_cpu_us": _spread(chan_cpu),
            "cpu_ratio": _spread(cpu_ratios), "session": baseline_kind()}


def channels(settings: Settings) -> list[Result]:
    """The suite's entry: C1 at 0 and 5 % loss, C2; each figure the median of 3 runs."""
    duration = 1.0 if settings.quick else max(2.0, settings.duration)
    repeat = 1 if settings.quick else 3
    results = []
    for row in run_c1(duration, repeat, [0.0, 0.05]):
        pct = int(row["loss"] * 100)
        results.append(Result(
            "channels_c1", f"idle_p99_{pct}pct", row["idle_p99_us"]["median"], "us",
            extra=row, lower_is_better=True, raw=True,
        ))
        results.append(Result(
            "channels_c1", f"saturated_p99_{pct}pct", row["saturated_p99_us"]["median"], "us",
            extra=row, lower_is_better=True, baseline=("channels_c1", f"idle_p99_{pct}pct"),
            target=("<=", 2.0, "ratio"),
        ))
    c2 = run_c2(duration, repeat)
    results.append(Result("channels_c2", "bare_session", c2["bare_msg_s"]["median"], "msg/s",
                          extra=c2, raw=True))
    results.append(Result(
        "channels_c2", "one_channel", c2["channel_msg_s"]["median"], "msg/s", extra=c2,
        baseline=("channels_c2", "bare_session"), target=(">=", 0.8, "ratio"),
    ))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per phase")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure")
    parser.add_argument("--loss", default="0,0.05", help="C1 loss rates, comma-separated")
    parser.add_argument("--only", choices=["c1", "c2", "hol"], default=None)
    args = parser.parse_args()
    from echo.log import configure_logging

    configure_logging("console", "warning")  # the server's per-session lines are not results
    losses = [float(x) for x in args.loss.split(",")]
    if args.only in (None, "c1"):
        for row in run_c1(args.duration, args.repeat, losses):
            print(f"C1 loss {row['loss']:.0%}: control p99 idle "
                  f"{row['idle_p99_us']['median']:.0f} us "
                  f"({row['idle_p99_us']['min']:.0f}..{row['idle_p99_us']['max']:.0f}), "
                  f"bulk saturated {row['saturated_p99_us']['median']:.0f} us "
                  f"({row['saturated_p99_us']['min']:.0f}..{row['saturated_p99_us']['max']:.0f})"
                  f"; ratio {row['ratio']['median']:.2f} x "
                  f"({row['ratio']['min']:.2f}..{row['ratio']['max']:.2f}), target <= 2")
    if args.only in (None, "hol"):
        for row in run_hol(args.duration, args.repeat, losses):

            def fig(name: str, row: dict[str, Any] = row) -> str:
                p99 = row[f"{name}_p99_us"]
                return (f"{row[f'{name}_p50_us']['median']:.0f}/{p99['median']:.0f} us "
                        f"(p99 {p99['min']:.0f}..{p99['max']:.0f})")

            def ratio(name: str, row: dict[str, Any] = row) -> str:
                r = row[f"{name}_ratio"]
                return f"{r['median']:.2f} x ({r['min']:.2f}..{r['max']:.2f})"

            print(f"H loss {row['loss']:.0%}: control p50/p99 with bulk idle {fig('idle')}; "
                  f"bulk streaming, one stream {fig('shared')}, p99 {ratio('shared')}; "
                  f"control on its own stream {fig('isolated')}, p99 {ratio('isolated')}")
    if args.only in (None, "c2"):
        c2 = run_c2(args.duration, args.repeat)
        print(f"C2 over {c2['session']}: bare {c2['bare_msg_s']['median']:,.0f} msg/s "
              f"({c2['bare_msg_s']['min']:,.0f}..{c2['bare_msg_s']['max']:,.0f}), one channel "
              f"{c2['channel_msg_s']['median']:,.0f} msg/s "
              f"({c2['channel_msg_s']['min']:,.0f}..{c2['channel_msg_s']['max']:,.0f}); ratio "
              f"{c2['ratio']['median']:.2f} x ({c2['ratio']['min']:.2f}..{c2['ratio']['max']:.2f})"
              ", target >= 0.8")
        print(f"C2 CPU per message (both ends): bare {c2['bare_cpu_us']['median']:.1f} us "
              f"({c2['bare_cpu_us']['min']:.1f}..{c2['bare_cpu_us']['max']:.1f}), one channel "
              f"{c2['channel_cpu_us']['median']:.1f} us "
              f"({c2['channel_cpu_us']['min']:.1f}..{c2['channel_cpu_us']['max']:.1f}); "
              f"bare/channel {c2['cpu_ratio']['median']:.2f} x "
              f"({c2['cpu_ratio']['min']:.2f}..{c2['cpu_ratio']['max']:.2f})")


if __name__ == "__main__":
    main()
