"""B3 loss: goodput of echo's transport over a link that loses 0 / 5 / 20 % of UDP datagrams.

    python -m bench.run --only loss [--quick] [--duration S]
    python -m bench.loss [--levels 0,5,20] [--duration S] [--quick]    (other loss levels)

Two network namespaces joined by one veth pair (`pair_lab` of tests/netlab/lab.py); the
publisher runs in one and the subscriber in the other, each in its own process (a harness
`Child` that moves itself into its namespace before opening a socket). The loss is nftables on
the *input* hook of BOTH namespaces (`Host.set_loss`): that share of UDP datagrams is dropped at
random whichever way it goes, so data, heartbeats, status messages and NAKs are all lost, as on
a real path. An output-hook drop would be wrong: sendto fails with EPERM, which is not loss
(docs/architecture.md, Test layers). The veths have `gso_max_segs 1`, so should the transport batch
datagrams with UDP GSO, each datagram still crosses as its own packet and is dropped on its own.

Per level, the publisher offers 1 KiB messages as fast as flow control allows for `duration`
seconds, each carrying its sequence number in its first and last 8 bytes; the subscriber fails
the run unless every message arrives exactly once, in order and whole. Goodput is what was
delivered per second between the first and the last delivery (so the recovery of the tail
counts), in messages and MB of payload, compared to the 0 % level of the same run. Extras: NAKs
sent, retransmits, datagrams dropped by the nft rules (their counters) and the loss measured
from them, per direction.

Uses only the public surface (docs/architecture.md, Public names).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import struct
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import trio
import trio.lowlevel

from bench import harness
from bench.harness import (
    RESULTS_DIR,
    BenchError,
    Child,
    Control,
    Result,
    Settings,
    Skip,
    system_load,
    usage_extra,
    write_reports,
)
from bench.transport_bench import END, require_transport
from tests.netlab.lab import (
    Host,
    NetLabCommandError,
    NetLabError,
    NetLabUnavailable,
    PairLab,
    enter_namespace,
    pair_lab,
    require_netns_support,
)

DEFAULT_LEVELS = (0.0, 5.0, 20.0)
SIZE = 1024
STREAM_ID = 1003
#: The subscriber's port inside its own namespace: nothing else lives there, no race for it.
PORT = 20121
_SEQUENCE = struct.Struct("<Q")
_TAIL = SIZE - _SEQUENCE.size
#: Prefix of the lab's namespaces (tests/netlab/lab.py naming: <prefix><4 chars>-a|b).
LAB_PREFIX = "eloss"
#: No delivery for this long in the middle of a run is a stall: fail with what is known.
STALL = 5.0
#: A pause in delivery at least this long is counted (recovery that waited for a timer).
LONG_PAUSE = 0.05
CONNECT_TIMEOUT = 10.0
#: Bound on one refused offer's wait for the window to open (send retries until then).
SEND_TIMEOUT = 10.0
#: Bound on the subscriber's wait for the end-of-stream after the last message.
CLOSE_TIMEOUT = 5.0


def level_name(percent: float) -> str:
    return f"loss_{percent:g}pct"


BASELINE = level_name(0)


# ------------------------------------------------------------------ the two sides


def subscriber(ctl: Control, netns: str, channel: str, limit: float) -> dict[str, Any]:
    enter_namespace(netns)
    return trio.run(_subscriber, ctl, channel, limit)


async def _subscriber(ctl: Control, channel: str, limit: float) -> dict[str, Any]:
    from echo.transport import TransportConfig, open_transport

    clock = time.perf_counter
    unpack_from = _SEQUENCE.unpack_from
    expected = 0
    count = 0
    payload_bytes = 0
    done = False
    violations = 0
    first_violation: dict[str, int] | None = None

    def handler(message: Any) -> None:
        nonlocal expected, count, payload_bytes, done, violations, first_violation
        data = message.data
        (sequence,) = unpack_from(data)
        if sequence == END and len(data) == _SEQUENCE.size:
            done = True
            return
        # Exactly once and in order means: 0, 1, 2... with nothing missing, repeated or moved;
        # the tail copy catches a message rebuilt from the wrong bytes.
        if sequence != expected or len(data) != SIZE or unpack_from(data, _TAIL)[0] != sequence:
            violations += 1
            if first_violation is None:
                first_violation = {
                    "expected": expected,
                    "got": sequence,
                    "length": len(data),
                    "tail": unpack_from(data, len(data) - _SEQUENCE.size)[0],
                }
        expected = sequence + 1
        count += 1
        payload_bytes += len(data)

    first = last = 0.0
    # Pauses in delivery: under loss they show how long recovery waits (a NAK retry, a lost
    # status message), which is what goodput loses to.
    max_pause = long_pause_s = 0.0
    long_pauses = 0
    async with open_transport(TransportConfig()) as transport:
        sub = await transport.add_subscription(channel, stream_id=STREAM_ID)
        ctl.ready()
        with trio.move_on_after(limit) as scope:
            while not done:
                if sub.poll(handler, fragment_limit=1024):
                    # Per poll, not per message: the clock read would cost as much as a message.
                    now = clock()
                    if not first:
                        ctl.begin()
                        first = now
                    pause = now - last
                    if last and pause >= LONG_PAUSE:
                        long_pauses += 1
                        long_pause_s += pause
                    if last and pause > max_pause:
                        max_pause = pause
                    last = now
                    continue
                if first and clock() - last > STALL:
                    raise BenchError(
                        f"loss subscriber: nothing delivered for {STALL:g} s after {count} "
                        f"messages (next expected {expected}); counters "
                        f"{_counter_dict(transport.counters)}"
                    )
                with trio.move_on_after(STALL):
                    await sub.wait_activity()
            ctl.end()
            # Stay until the publisher's end-of-stream closes the image: its close() then sees
            # everything consumed (our status messages are lost too, and repeated).
            with trio.move_on_after(CLOSE_TIMEOUT):
                while sub.is_connected:
                    await sub.wait_activity()
        if scope.cancelled_caught:
            raise BenchError(
                f"loss subscriber: no end message within {limit:.0f} s ({count} messages, next "
                f"expected {expected}); counters {_counter_dict(transport.counters)}"
            )
        image_closed = not sub.is_connected
        counters = _counter_dict(transport.counters)
    return {
        "count": count,
        "bytes": payload_bytes,
        "elapsed": last - first,
        "violations": violations,
        "first_violation": first_violation,
        "image_closed": image_closed,
        "max_pause_s": max_pause,
        "long_pauses": long_pauses,
        "long_pause_s": long_pause_s,
        "counters": counters,
    }


def publisher(
    ctl: Control, netns: str, channel: str, duration: float, limit: float
) -> dict[str, Any]:
    enter_namespace(netns)
    return trio.run(_publisher, ctl, channel, duration, limit)


async def _publisher(ctl: Control, channel: str, duration: float, limit: float) -> dict[str, Any]:
    from echo.transport import TransportConfig, open_transport

    clock = time.perf_counter
    pack_into = _SEQUENCE.pack_into
    payload = bytearray(SIZE)
    sequence = 0
    waits = 0
    deadline = trio.current_time() + limit
    async with open_transport(TransportConfig()) as transport:
        pub = await transport.add_publication(channel, stream_id=STREAM_ID)
        await pub.wait_connected(timeout=CONNECT_TIMEOUT)
        ctl.ready()
        offer = pub.offer
        ctl.begin()
        start = clock()
        end = start + duration
        while clock() < end:
            for _ in range(64):
                pack_into(payload, 0, sequence)
                pack_into(payload, _TAIL, sequence)
                # flush=False: offers made together share datagrams; the checkpoint below
                # lets the driver send them (as in transport_bench).
                if offer(payload, flush=False) < 0:
                    # BACK_PRESSURED (window full: under loss, until a gap is repaired) or
                    # ADMIN_ACTION; `send` parks until the driver reports progress.
                    waits += 1
                    await pub.send(payload, timeout=SEND_TIMEOUT)
                sequence += 1
            await trio.lowlevel.checkpoint()
        elapsed = clock() - start
        ctl.end()
        pack_into(payload, 0, END)
        await pub.send(payload[: _SEQUENCE.size], timeout=SEND_TIMEOUT)
        # close() drains what is still in the term (offers run up to half a term, 8 MiB, ahead
        # of what the receiver's window lets out: at 20 % loss seconds of sending) and then
        # hands over the end-of-stream; giving up earlier would cut the stream short. A real
        # stall ends it sooner: the subscriber fails and leaves, and its SMs stop.
        delivered = await pub.close(timeout=max(CLOSE_TIMEOUT, deadline - trio.current_time()))
        counters = _counter_dict(transport.counters)
    return {
        "sent": sequence,
        "elapsed": elapsed,
        "back_pressure_waits": waits,
        "close_delivered": delivered,
        "counters": counters,
    }


def _counter_dict(counters: Any) -> dict[str, int]:
    return {key: value for key, value in counters.snapshot().items() if value}


# ------------------------------------------------------------------ the parent


def _levels(levels: Sequence[float]) -> list[float]:
    """Sorted, without repeats, with 0 % first: the baseline is always measured in the run."""
    wanted = {float(level) for level in levels} | {0.0}
    bad = [level for level in wanted if not 0 <= level < 100]
    if bad:
        raise ValueError(f"loss levels must be within [0, 100), got {sorted(bad)}")
    return sorted(wanted)


@contextlib.contextmanager
def _exit_on_sigterm() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C does, so the lab's namespaces are removed then too."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _results_of(what: str, child: Child, limit: float, errors: list[str]) -> Any:
    try:
        return child.result(limit)
    except BenchError as error:
        errors.append(f"{what}: {error}")
        return None


def _measure(lab: PairLab, percent: float, settings: Settings) -> dict[str, Any]:
    # Both ends lossy: data and heartbeats are dropped entering b, SMs and NAKs entering a.
    for host in (lab.a, lab.b):
        host.set_loss(percent)
    limit = settings.duration + settings.slack
    channel = f"aeron:udp?endpoint={lab.b.ip}:{PORT}"
    name = level_name(percent)
    errors: list[str] = []
    with Child(f"{name} subscriber", subscriber, lab.b.name, channel, limit) as receiver:
        receiver.wait_ready()
        with Child(
            f"{name} publisher", publisher, lab.a.name, channel, settings.duration, limit
        ) as sender:
            sent = _results_of("publisher", sender, limit, errors)
            # If the publisher gave up, the subscriber's own verdict (e.g. a stall) is the
            # better diagnosis: still wait for it, not as long.
            got = _results_of("subscriber", receiver, STALL + 5 if errors else limit, errors)
    if errors:
        raise BenchError(f"{name}: " + "\n".join(errors))
    assert sent is not None and got is not None
    if got["violations"]:
        raise BenchError(
            f"{name}: {got['violations']} messages out of order, repeated or damaged; "
            f"first: {got['first_violation']}"
        )
    if got["count"] != sent["sent"]:
        raise BenchError(f"{name}: offered {sent['sent']} messages, delivered {got['count']}")
    if got["elapsed"] <= 0:
        raise BenchError(f"{name}: too few messages to time")
    return {
        "sent": sent,
        "got": got,
        "nft": {"data": _nft(lab.b), "control": _nft(lab.a)},
        "usage": usage_extra(sender=sender, receiver=receiver),
    }


def _nft(host: Host) -> dict[str, int]:
    return host.loss_counters()


def _pct(part: int, whole: int) -> float:
    return round(100 * part / whole, 2) if whole else 0.0


def _results(percent: float, run: dict[str, Any]) -> list[Result]:
    sent, got, nft = run["sent"], run["got"], run["nft"]
    pub, sub = sent["counters"], got["counters"]
    data, control = nft["data"], nft["control"]
    dropped = data["dropped"] + control["dropped"]
    seen = data["seen"] + control["seen"]
    extra: dict[str, Any] = {
        "loss_percent": percent,
        "size": SIZE,
        "messages": got["count"],
        "offered": sent["sent"],
        # Always 0 here: a run with any message missing, repeated or out of order fails.
        "violations": got["violations"],
        "offered_per_s": round(sent["sent"] / sent["elapsed"]),
        "delivery_s": round(got["elapsed"], 3),
        "back_pressure_waits": sent["back_pressure_waits"],
        "naks_sent": sub.get("naks_sent", 0),
        "naks_received": pub.get("naks_received", 0),
        "retransmits": pub.get("retransmits_sent", 0),
        "retransmitted_bytes": pub.get("retransmitted_bytes", 0),
        "duplicate_data": sub.get("duplicate_data", 0),
        "max_pause_ms": round(1000 * got["max_pause_s"], 1),
        f"pauses_over_{LONG_PAUSE * 1000:g}ms": got["long_pauses"],
        f"time_in_pauses_over_{LONG_PAUSE * 1000:g}ms_s": round(got["long_pause_s"], 3),
        "nft_dropped_data": data["dropped"],
        "nft_seen_data": data["seen"],
        "nft_dropped_control": control["dropped"],
        "nft_seen_control": control["seen"],
        # What the rules really dropped, per direction (publisher -> subscriber carries data,
        # the other way SMs and NAKs); 0 at 0 %, where there are no rules.
        "measured_loss_data_pct": _pct(data["dropped"], data["seen"]),
        "measured_loss_control_pct": _pct(control["dropped"], control["seen"]),
        "measured_loss_pct": _pct(dropped, seen),
        # The same seen by the transport: datagrams sent by one side and not received by the
        # other.
        "datagram_loss_data_pct": _pct(
            pub.get("datagrams_sent", 0) - sub.get("datagrams_received", 0),
            pub.get("datagrams_sent", 0),
        ),
        "close_delivered": sent["close_delivered"],
        "image_closed": got["image_closed"],
        "sender_counters": pub,
        "receiver_counters": sub,
        "summary": (
            f"veth; measured loss {_pct(data['dropped'], data['seen']):.1f}% data / "
            f"{_pct(control['dropped'], control['seen']):.1f}% control "
            f"(nft dropped {dropped:,}); {sub.get('naks_sent', 0):,} NAKs sent, "
            f"{pub.get('retransmits_sent', 0):,} retransmits; {got['long_pauses']} delivery "
            f"pauses >= {LONG_PAUSE * 1000:g} ms ({got['long_pause_s']:.2f} s in all)"
        ),
    }
    extra.update(run["usage"])
    name = level_name(percent)
    base = percent != 0
    # The targets: goodput at 5 % loss >= 70 % of lossless, at 20 % >= 40 %.
    target = {5: (">=", 0.7, "ratio"), 20: (">=", 0.4, "ratio")}
    return [
        Result(
            name,
            "msgs/s",
            got["count"] / got["elapsed"],
            "msg/s",
            extra,
            (BASELINE, "msgs/s") if base else None,
            raw=not base,
        ),
        Result(
            name,
            "MB/s",
            got["bytes"] / got["elapsed"] / 1e6,
            "MB/s",
            {},
            (BASELINE, "MB/s") if base else None,
            target=target.get(percent),
            raw=not base,
        ),
    ]


@contextlib.contextmanager
def _lab() -> Iterator[PairLab]:
    try:
        require_netns_support()
    except NetLabUnavailable as reason:
        raise Skip(str(reason)) from None
    try:
        with pair_lab(prefix=LAB_PREFIX) as lab:
            yield lab
    except NetLabCommandError as error:
        if list(error.cmd[:3]) == ["ip", "netns", "add"]:
            raise Skip(f"cannot create network namespaces here: {error}") from None
        raise BenchError(f"loss lab: {error}") from None
    except NetLabError as error:
        raise BenchError(f"loss lab: {error}") from None


def loss(settings: Settings, levels: Sequence[float] = DEFAULT_LEVELS) -> list[Result]:
    """Goodput at each loss level (0 % always first), each compared to 0 % of this run."""
    require_transport()
    results: list[Result] = []
    with _exit_on_sigterm(), _lab() as lab:
        print(
            f"   lab {lab.lab_id}: {lab.a.name} {lab.a.ip} (publisher) <-veth-> "
            f"{lab.b.name} {lab.b.ip} (subscriber)",
            file=sys.stderr,
            flush=True,
        )
        for percent in _levels(levels):
            # Every level starts its subscriber on the first CPU, its publisher on the second.
            harness.pin(settings.pin)
            results += _results(percent, _measure(lab, percent, settings))
    return results


# ------------------------------------------------------------------ other levels


def main(argv: list[str] | None = None) -> int:
    from bench.run import DEFAULT_DURATION, QUICK_DURATION, pin_cpus

    parser = argparse.ArgumentParser(
        prog="python -m bench.loss", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--levels",
        default=",".join(f"{level:g}" for level in DEFAULT_LEVELS),
        help="loss percentages, comma-separated (0 is always added: it is the baseline)",
    )
    parser.add_argument("--duration", type=float, help="seconds per level (default 5)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 0.5 s per level")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--pin", default=None, help="as for python -m bench.run")
    args = parser.parse_args(argv)
    levels = [float(level) for level in args.levels.split(",") if level.strip()]
    duration = args.duration or (QUICK_DURATION if args.quick else DEFAULT_DURATION)
    settings = Settings(duration=duration, quick=args.quick, pin=pin_cpus(args.pin))
    load_before = system_load()
    results: list[Result] = []
    skipped: dict[str, str] = {}
    failed: dict[str, str] = {}
    try:
        results = loss(settings, levels)
    except Skip as note:
        skipped["loss"] = str(note)
    except BenchError as error:
        failed["loss"] = str(error)
        print(f"FAILED: {error}", file=sys.stderr)
    json_path, md_path, table = write_reports(
        results, skipped, failed, settings, args.results_dir, load_before
    )
    print(table)
    print(f"wrote {json_path} and {md_path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
