"""echo's own transport, measured the way the raw baselines are: two processes on loopback.

- one-way: a publisher offers messages of 64 B, 1 KiB and 16 KiB as fast as the transport takes
  them; a subscriber in another process counts them, checking that every sequence number
  arrives once and in order. msgs/s and MB/s as received. 16 KiB is measured again with
  `|mtu=8192` on the channel (`transport_oneway_16384_mtu8192`), against raw 8192-byte
  datagrams. 64 B is measured twice: with `offer`, one call per message (the plain row), and
  with `offer_many`, 64 messages a call (`transport_oneway_64_offer_many`): the same messages
  on the wire, the transport's batch API for a game loop's tick of updates.
- echo: each process has a publication and a subscription (A pub -> B sub on one port,
  B pub -> A sub on another); round trips/s and p50/p99/p99.9 of 64-byte messages.

Uses only the public surface (docs/architecture.md, Public names): `open_transport`, `offer`,
`offer_many`, `send`, `poll`, `receive`, `wait_connected`.
"""

from __future__ import annotations

import importlib
import struct
import time
from typing import Any

import trio
import trio.lowlevel

from bench.harness import (
    BenchError,
    Child,
    Control,
    Result,
    RoundTrips,
    Settings,
    Skip,
    Target,
    free_udp_port,
    round_trip_results,
    usage_extra,
)

ONEWAY_SIZES = (64, 1024, 16384)
ECHO_SIZE = 64
STREAM_ID = 1001
REPLY_STREAM_ID = 1002
_SEQUENCE = struct.Struct("<Q")
#: The last message of a one-way run carries this sequence number: "that was all".
END = (1 << 64) - 1
#: The echo client's goodbye; data messages are ECHO_SIZE long, so length tells them apart.
BYE = b"!"


def require_transport() -> None:
    """Skip, with a note, until `echo.transport.open_transport` exists."""
    try:
        module = importlib.import_module("echo.transport")
    except ImportError as error:
        raise Skip(f"echo.transport does not import: {error}") from None
    if not hasattr(module, "open_transport") or not hasattr(module, "TransportConfig"):
        raise Skip("echo.transport.open_transport / TransportConfig are not there yet")


#: Aeron's default MTU (the transport's too): the MB/s baseline is raw datagrams of this size.
DEFAULT_MTU = 1408
#: The larger MTU 16 KiB messages are also measured with (the raw baseline has 8192 B too).
LARGE_MTU = 8192

#: The goals for the one-way figures (B2: 64 B at >= 1,000,000 msg/s and
#: >= 3 x raw datagrams/s, the ratio shown beside it; and a goal for 16 KiB).
ONEWAY_TARGETS: dict[tuple[int, str], Target] = {
    (64, "msgs/s"): Target(">=", 1_000_000, "value", note="and >= 3 x raw datagrams/s"),
    (16384, "MB/s"): Target(">=", 0.8, "ratio"),
}
#: Messages per `offer_many` call in the batch row (a tick's worth of small updates).
OFFER_MANY_BATCH = 64
#: The sizes measured again with `offer_many`.
OFFER_MANY_SIZES = (64,)


def _channel(port: int, mtu: int | None = None) -> str:
    return f"aeron:udp?endpoint=127.0.0.1:{port}" + (f"|mtu={mtu}" if mtu else "")


# ------------------------------------------------------------------ one-way


def subscriber(ctl: Control, port: int, limit: float) -> dict[str, Any]:
    return trio.run(_subscriber, ctl, port, limit)


async def _subscriber(ctl: Control, port: int, limit: float) -> dict[str, Any]:
    from echo.transport import TransportConfig, open_transport

    clock = time.perf_counter
    unpack_from = _SEQUENCE.unpack_from
    state = {"first": 0.0, "done": False}
    expected = 0
    count = 0
    total = 0
    out_of_order = 0

    def handler(message: Any) -> None:
        # Every message checked (its sequence number in order) and counted; plain locals, as
        # an application's handler would keep them, rather than a dict update per message.
        nonlocal expected, count, total, out_of_order
        data = message.data
        (sequence,) = unpack_from(data)
        if sequence == END:
            state["done"] = True
            return
        if sequence != expected:
            out_of_order += 1
        expected = sequence + 1
        count += 1
        total += len(data)

    async with open_transport(TransportConfig()) as transport:
        sub = await transport.add_subscription(_channel(port), stream_id=STREAM_ID)
        ctl.ready()
        last = 0.0
        with trio.move_on_after(limit) as scope:
            while not state["done"]:
                if sub.poll(handler, fragment_limit=1024):
                    # Per poll, not per message: the clock read would cost as much as a message.
                    last = clock()
                    if not state["first"]:
                        ctl.begin()
                        state["first"] = last
                else:
                    await sub.wait_activity()
            ctl.end()
            # Stay a moment so the status messages that let the publisher's close() see
            # everything consumed still go out.
            await trio.sleep(0.2)
        if scope.cancelled_caught:
            raise BenchError(f"transport subscriber: no end message within {limit:.0f} s")
        counters = transport.counters
    return {
        "count": count,
        "bytes": total,
        "elapsed": last - float(state["first"]),
        "out_of_order": out_of_order,
        "counters": _counter_dict(counters),
    }


def publisher(
    ctl: Control,
    port: int,
    size: int,
    duration: float,
    mtu: int | None = None,
    api: str = "offer",
) -> dict[str, Any]:
    return trio.run(_publisher, ctl, port, size, duration, mtu, api)


async def _publisher(
    ctl: Control, port: int, size: int, duration: float, mtu: int | None, api: str
) -> dict[str, Any]:
    from echo.transport import TransportConfig, open_transport

    clock = time.perf_counter
    pack_into = _SEQUENCE.pack_into
    payload = bytearray(size)
    sequence = 0
    waits = 0
    async with open_transport(TransportConfig()) as transport:
        # The MTU is the publication's (Aeron: the sender sizes the frames); the receiver takes
        # whatever fits its socket.
        pub = await transport.add_publication(_channel(port, mtu), stream_id=STREAM_ID)
        await pub.wait_connected(timeout=10)
        ctl.ready()
        offer = pub.offer
        offer_many = pub.offer_many
        batch = [bytearray(size) for _ in range(OFFER_MANY_BATCH)]
        ctl.begin()
        start = clock()
        end = start + duration
        while api == "offer_many" and clock() < end:
            for i, buffer in enumerate(batch):
                pack_into(buffer, 0, sequence + i)
            # One call for the batch (flush=False as below); messages go out in order, and
            # those refused (window full) are sent one by one, waiting as `send` does.
            taken = offer_many(batch, flush=False)
            sequence += taken
            if taken < OFFER_MANY_BATCH:
                waits += 1
                for buffer in batch[taken:]:
                    await pub.send(buffer, timeout=10)
                    sequence += 1
            await trio.lowlevel.checkpoint()
        while api == "offer" and clock() < end:
            for _ in range(64):
                pack_into(payload, 0, sequence)
                # flush=False: offers made together share datagrams (the transport batches
                # frames up to the MTU); the checkpoint below lets the driver send them.
                result = offer(payload, flush=False)
                if result < 0:
                    # BACK_PRESSURED (the receiver's window is full) or ADMIN_ACTION (term
                    # rotated: offer again). `send` offers again and, while refused, parks
                    # until the driver reports progress (a status message opened the
                    # window): no spinning. NOT_CONNECTED ends in SendError, as it should.
                    waits += 1
                    await pub.send(payload, timeout=10)
                sequence += 1
            await trio.lowlevel.checkpoint()
        elapsed = clock() - start
        ctl.end()
        pack_into(payload, 0, END)
        await pub.send(payload[:8], timeout=10)
        await pub.close(timeout=3)
        counters = transport.counters
    return {
        "sent": sequence,
        "elapsed": elapsed,
        "back_pressure_waits": waits,
        "counters": _counter_dict(counters),
    }


def _counter_dict(counters: Any) -> dict[str, int]:
    # The transport's own counters (datagrams, NAKs, retransmits...), non-zero ones, for the
    # record: they explain a figure (e.g. datagrams per message shows the batching).
    snapshot = getattr(counters, "snapshot", None)
    fields: dict[str, Any] = snapshot() if callable(snapshot) else {}
    return {key: value for key, value in fields.items() if isinstance(value, int) and value}


def transport_oneway(
    settings: Settings,
    sizes: tuple[int, ...] = ONEWAY_SIZES,
    large_mtu_sizes: tuple[int, ...] = (16384,),
    offer_many_sizes: tuple[int, ...] = OFFER_MANY_SIZES,
) -> list[Result]:
    """Each size at the default MTU with `offer`, each of `offer_many_sizes` again with
    `offer_many`, then each of `large_mtu_sizes` again at LARGE_MTU."""
    require_transport()
    runs = (
        [(size, None, "offer") for size in sizes]
        + [(size, None, "offer_many") for size in offer_many_sizes if size in sizes]
        + [(size, LARGE_MTU, "offer") for size in large_mtu_sizes]
    )
    return [result for size, mtu, api in runs for result in _oneway(settings, size, mtu, api)]


def _oneway(
    settings: Settings, size: int, mtu: int | None, api: str = "offer"
) -> list[Result]:
    """msgs/s and MB/s of `size`-byte messages; `mtu=None` is the transport's default; `api`
    is how the publisher hands them over ("offer", or "offer_many" in batches)."""
    limit = settings.duration + settings.slack
    # A run at a non-default MTU or with offer_many says so in its name; the default keeps
    # the plain name.
    name = (
        f"transport_oneway_{size}"
        + (f"_mtu{mtu}" if mtu else "")
        + ("_offer_many" if api == "offer_many" else "")
    )
    what = f"transport one-way {size} B" + (f" at mtu={mtu}" if mtu else "") + f" ({api})"
    port = free_udp_port()
    with Child("transport subscriber", subscriber, port, limit) as receiver:
        receiver.wait_ready()
        with Child(
            "transport publisher", publisher, port, size, settings.duration, mtu, api
        ) as sender:
            sent = sender.result(limit)
            got = receiver.result(limit)
    if got["out_of_order"]:
        raise BenchError(f"{what}: {got['out_of_order']} out of order")
    if got["count"] != sent["sent"]:
        raise BenchError(f"{what}: offered {sent['sent']}, received {got['count']}")
    if got["elapsed"] <= 0:
        raise BenchError(f"{what}: too few messages to time")
    extra: dict[str, Any] = {
        "size": size,
        "mtu": mtu or DEFAULT_MTU,
        "api": api,
        "messages": got["count"],
        "back_pressure_waits": sent["back_pressure_waits"],
        "offered_per_s": round(sent["sent"] / sent["elapsed"]),
        "sender_counters": sent["counters"],
        "receiver_counters": got["counters"],
    }
    extra.update(usage_extra(sender=sender, receiver=receiver))
    # The targets are for the default MTU; the mtu=8192 run is reported beside it.
    targets = ONEWAY_TARGETS if mtu is None else {}
    return [
        Result(
            name,
            "msgs/s",
            got["count"] / got["elapsed"],
            "msg/s",
            extra,
            ("raw_oneway_64", "datagrams/s"),
            target=targets.get((size, "msgs/s")),
        ),
        Result(
            name,
            "MB/s",
            got["bytes"] / got["elapsed"] / 1e6,
            "MB/s",
            {},
            # Bytes per second against raw datagrams of the MTU the transport filled.
            (f"raw_oneway_{mtu or DEFAULT_MTU}", "MB/s"),
            target=targets.get((size, "MB/s")),
        ),
    ]


# ------------------------------------------------------------------ echo


def echo_responder(ctl: Control, in_port: int, out_port: int, limit: float) -> dict[str, Any]:
    return trio.run(_echo_responder, ctl, in_port, out_port, limit)


async def _echo_responder(
    ctl: Control, in_port: int, out_port: int, limit: float
) -> dict[str, Any]:
    from echo.transport import TransportConfig, open_transport

    echoed = 0
    async with open_transport(TransportConfig()) as transport:
        sub = await transport.add_subscription(_channel(in_port), stream_id=STREAM_ID)
        pub = await transport.add_publication(_channel(out_port), stream_id=REPLY_STREAM_ID)
        ctl.ready()
        with trio.move_on_after(limit):
            async for message in sub:
                ctl.begin()
                await pub.send(message.data, timeout=10)
                if message.data == BYE:
                    ctl.end()
                    await pub.close(timeout=3)
                    return {"echoed": echoed}
                echoed += 1
    raise BenchError("transport echo responder: the client never said goodbye")


def echo_initiator(ctl: Control, out_port: int, in_port: int, duration: float) -> dict[str, Any]:
    return trio.run(_echo_initiator, ctl, out_port, in_port, duration)


async def _echo_initiator(
    ctl: Control, out_port: int, in_port: int, duration: float
) -> dict[str, Any]:
    from echo.transport import TransportConfig, open_transport

    payload = bytearray(ECHO_SIZE)
    pack_into = _SEQUENCE.pack_into
    unpack_from = _SEQUENCE.unpack_from
    rounds = RoundTrips(ctl, duration)
    async with open_transport(TransportConfig()) as transport:
        sub = await transport.add_subscription(_channel(in_port), stream_id=REPLY_STREAM_ID)
        pub = await transport.add_publication(_channel(out_port), stream_id=STREAM_ID)
        with trio.fail_after(10):
            await pub.wait_connected()
            # The reply stream is up once the responder's publication has an image here.
            while not sub.is_connected:
                await sub.wait_activity()
        ctl.ready()
        with trio.fail_after(duration + 30):
            for sequence in rounds:
                pack_into(payload, 0, sequence)
                if pub.offer(payload) < 0:
                    await pub.send(payload, timeout=10)
                reply = await sub.receive()
                if len(reply.data) != ECHO_SIZE or unpack_from(reply.data)[0] != sequence:
                    raise BenchError(f"transport echo: wrong reply to {sequence}")
            ctl.end()
            await pub.send(BYE, timeout=10)
            while (await sub.receive()).data != BYE:
                pass
        await pub.close(timeout=3)
    return rounds.summary()


def transport_echo(settings: Settings) -> list[Result]:
    require_transport()
    limit = settings.duration + settings.slack
    port_a, port_b = free_udp_port(), free_udp_port()
    # B listens on port_a and answers to port_b, where A listens.
    with Child("transport echo responder", echo_responder, port_a, port_b, limit) as server:
        server.wait_ready()
        with Child(
            "transport echo initiator", echo_initiator, port_a, port_b, settings.duration
        ) as client:
            summary = client.result(limit)
            server.result(limit)
    extra = {"size": ECHO_SIZE, "round_trips": summary["round_trips"]}
    extra.update(usage_extra(client=client, server=server))
    return round_trip_results(f"transport_echo_{ECHO_SIZE}", summary, "raw_echo_64", extra)
