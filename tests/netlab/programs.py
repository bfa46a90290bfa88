"""Transport programs that tests run inside lab namespaces (`python -m tests.netlab.programs`).

Each prints one JSON line with what happened, so the test asserts on facts, not on timing.
"""

from __future__ import annotations

import argparse
import json
import struct

import trio

from echo.transport import SendError, TransportConfig, open_transport

STREAM = 1001


async def publish(channel: str, count: int, size: int, connect_timeout: float) -> dict[str, object]:
    async with open_transport(TransportConfig()) as transport:
        publication = await transport.add_publication(channel, STREAM)
        try:
            await publication.wait_connected(timeout=connect_timeout)
        except TimeoutError:
            return {"connected": False, "sent": 0, "counters": transport.counters.snapshot()}
        sent = 0
        try:
            for index in range(count):
                payload = struct.pack("<Q", index) + bytes(max(0, size - 8))
                await publication.send(payload, timeout=30)
                sent += 1
        except SendError as error:
            return {"connected": True, "sent": sent, "error": error.name}
        delivered = await publication.close(timeout=60)
        return {
            "connected": True,
            "sent": sent,
            "delivered": delivered,
            "destinations": publication.destinations,
            "counters": transport.counters.snapshot(),
        }


async def subscribe(channel: str, count: int, timeout: float) -> dict[str, object]:
    async with open_transport(TransportConfig()) as transport:
        subscription = await transport.add_subscription(channel, STREAM)
        received = 0
        in_order = True
        source = None
        with trio.move_on_after(timeout):
            while received < count:
                message = await subscription.receive()
                (index,) = struct.unpack_from("<Q", message.data)
                in_order = in_order and index == received
                source = message.source
                received += 1
        return {
            "received": received,
            "in_order": in_order,
            "source": source,
            "counters": transport.counters.snapshot(),
        }


async def eperm(port: int) -> dict[str, object]:
    """Sends fail with EPERM (an output-hook firewall drop) for a while, then work again."""

    rule = (
        "table inet eperm {\n  chain out {\n    type filter hook output priority 0;\n"
        f"    udp dport {port} drop\n  }}\n}}\n"
    )
    await trio.run_process(["nft", "-f", "-"], stdin=rule.encode())
    async with open_transport(TransportConfig()) as transport:
        subscription = await transport.add_subscription(
            f"aeron:udp?endpoint=127.0.0.1:{port}", STREAM
        )
        publication = await transport.add_publication(
            f"aeron:udp?endpoint=127.0.0.1:{port}", STREAM
        )
        with trio.move_on_after(1.0):
            await publication.wait_connected()
        blocked_errors = transport.counters.send_errors
        connected_while_blocked = publication.is_connected
        await trio.run_process(["nft", "delete", "table", "inet", "eperm"])
        await publication.wait_connected(timeout=5)
        await publication.send(b"after the firewall", timeout=5)
        with trio.fail_after(5):
            message = await subscription.receive()
        return {
            "send_errors_while_blocked": blocked_errors,
            "connected_while_blocked": connected_while_blocked,
            "received_after": message.data.decode(),
        }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["publish", "subscribe", "eperm"])
    parser.add_argument("--port", type=int, default=24050)
    parser.add_argument("--channel", required=True)
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args()
    if args.role == "eperm":
        result = trio.run(eperm, args.port)
    elif args.role == "publish":
        result = trio.run(publish, args.channel, args.count, args.size, args.timeout)
    else:
        result = trio.run(subscribe, args.channel, args.count, args.timeout)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
