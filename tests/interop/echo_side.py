"""Echo's side of the interop tests, as a program (`python -m tests.interop.echo_side`), so that
it runs the same way on loopback and inside a lab namespace. Prints one JSON line.

Messages are those of tests/interop/java/EchoInterop.java: an 8-byte little-endian index, then
bytes (index * 31 + j) & 0xFF.
"""

from __future__ import annotations

import argparse
import json
import struct

import trio

from echo.transport import TransportConfig, open_transport

STREAM = 1001


def payload(index: int, size: int) -> bytes:
    return struct.pack("<Q", index) + bytes((index * 31 + j) & 0xFF for j in range(8, size))


def config(args: argparse.Namespace) -> TransportConfig:
    # Aeron cannot answer echo's address-validation cookie (dynamic MDC): off, as
    # docs/transport.md says for plain Aeron peers.
    return TransportConfig(validate_addresses=False, linger=args.linger)


async def publish(args: argparse.Namespace) -> dict[str, object]:
    async with open_transport(config(args)) as transport:
        publication = await transport.add_publication(args.channel, STREAM)
        await publication.wait_connected(timeout=args.timeout)
        for index in range(args.count):
            await publication.send(payload(index, args.size), timeout=args.timeout)
        start = trio.current_time()
        delivered = await publication.close()
        return {
            "delivered": delivered,
            "close_s": round(trio.current_time() - start, 3),
            "counters": transport.counters.snapshot(),
        }


async def subscribe(args: argparse.Namespace) -> dict[str, object]:
    async with open_transport(config(args)) as transport:
        subscription = await transport.add_subscription(args.channel, STREAM)
        print(json.dumps({"ready": True}), flush=True)
        received = 0
        intact = 0
        sessions: set[int] = set()
        with trio.move_on_after(args.timeout):
            while received < args.count:
                message = await subscription.receive()
                (index,) = struct.unpack_from("<Q", message.data)
                intact += message.data == payload(index, args.size) and index == received
                sessions.add(message.session_id)
                received += 1
        return {
            "received": received,
            "intact_in_order": intact,
            "sessions": sorted(sessions),
            "counters": transport.counters.snapshot(),
        }


async def close_runs(args: argparse.Namespace) -> dict[str, object]:
    """`runs` publications one after another, each `count` messages then close()."""
    results: list[dict[str, object]] = []
    for _ in range(args.runs):
        results.append(await publish(args))
    return {
        "delivered": [r["delivered"] for r in results],
        "close_s": [r["close_s"] for r in results],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["publish", "subscribe", "close-runs"])
    parser.add_argument("--channel", required=True)
    parser.add_argument("--count", type=int, default=10)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--linger", type=float, default=5.0)
    parser.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args()
    role = {"publish": publish, "subscribe": subscribe, "close-runs": close_runs}[args.role]
    print(json.dumps(trio.run(role, args)), flush=True)


if __name__ == "__main__":
    main()
