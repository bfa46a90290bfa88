"""Programs the topics namespace tests run inside lab hosts (``python -m tests.topics.programs``).

Each prints ``ready`` when set up and one JSON line with what happened, so the tests assert on
facts, not on timing.

- ``subscriber``: subscribes with the library, prints ``ready`` once every server of every
  topic confirmed, then collects ``--expect`` messages and prints them with its counters.
- ``publisher``: publishes ``--per-phase`` messages on every topic, prints ``half``, waits for
  a line on stdin, publishes as many again, prints what it published.
- ``victim``: a plain UDP socket that counts what arrives until stdin closes.
- ``forge``: sends datagrams with a forged IPv4 source from a raw socket (needs root).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time

import trio

from echo.topics import ClientConfig, open_topic_client, parse_servers


async def subscriber(args: argparse.Namespace) -> dict[str, object]:
    topics = args.topics.split(",")
    config = ClientConfig(k=args.k, lifetime=args.lifetime, refresh_factor=args.refresh_factor)
    async with open_topic_client(parse_servers(args.servers), config) as client:
        client.subscribe(*topics)
        with trio.fail_after(args.timeout):
            await client.wait_subscribed(*topics)
        print("ready", flush=True)
        if args.hold:
            # Stay subscribed (refreshing) until told to stop, then stop refreshing and say when.
            await trio.to_thread.run_sync(sys.stdin.readline)
            client.unsubscribe(*topics)
            return {"stopped_at": time.time(), "counters": client.counters}
        messages: list[list[str]] = []
        with trio.move_on_after(args.timeout):
            while len(messages) < args.expect:
                message = await client.receive()
                messages.append([message.topic.decode(), message.data.decode()])
        # Copies still in flight are counted as duplicates if they come within a moment: an
        # observation window on purpose (what is measured is what arrives in it).
        await trio.sleep(0.5)
        return {"messages": messages, "counters": client.counters}


async def publisher(args: argparse.Namespace) -> dict[str, object]:
    topics = args.topics.split(",")
    config = ClientConfig(k=args.k, copies=args.copies, resend_interval=0.01)
    published: list[list[str]] = []
    async with open_topic_client(parse_servers(args.servers), config) as client:
        print("ready", flush=True)
        for phase in range(2):
            for i in range(args.per_phase):
                for topic in topics:
                    text = f"{phase}-{i}"
                    client.publish(topic, text)
                    published.append([topic, text])
                await client.wait_sent()
                await trio.sleep(args.interval)
            if phase == 0:
                print("half", flush=True)
                await trio.to_thread.run_sync(sys.stdin.readline)
        await client.wait_sent()
        return {"published": published, "counters": client.counters}


def victim(args: argparse.Namespace) -> dict[str, object]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((args.ip, args.port))
    sock.setblocking(False)
    print("ready", flush=True)
    sizes: list[int] = []
    import selectors

    with selectors.DefaultSelector() as selector:
        selector.register(sock, selectors.EVENT_READ)
        selector.register(sys.stdin, selectors.EVENT_READ)
        while True:
            ready = [key.fileobj for key, _ in selector.select(timeout=60)]
            if not ready or sys.stdin in ready:
                break
            while True:
                try:
                    data = sock.recv(65536)
                except BlockingIOError:
                    break
                sizes.append(len(data))
    return {"datagrams": len(sizes), "bytes": sum(sizes), "sizes": sizes}


def forge(args: argparse.Namespace) -> dict[str, object]:
    from tests.netlab.spoof import udp_packet

    source, sport = args.source.rsplit(":", 1)
    server, dport = args.server.rsplit(":", 1)
    raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    sent = []
    for payload_hex in args.payloads:
        payload = bytes.fromhex(payload_hex)
        for _ in range(args.repeat):
            raw.sendto(udp_packet(source, int(sport), server, int(dport), payload), (server, 0))
            sent.append(len(payload))
            time.sleep(0.001)
    return {"datagrams": len(sent), "bytes": sum(sent), "sizes": sent}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["subscriber", "publisher", "victim", "forge"])
    parser.add_argument("--servers", default="")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--topics", default="t")
    parser.add_argument("--expect", type=int, default=0)
    parser.add_argument("--per-phase", type=int, default=10)
    parser.add_argument("--copies", type=int, default=1)
    parser.add_argument("--interval", type=float, default=0.02)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--ip", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=9999)
    parser.add_argument("--source", default="")
    parser.add_argument("--server", default="")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--hold", action="store_true")
    parser.add_argument("--lifetime", type=float, default=30.0)
    parser.add_argument("--refresh-factor", type=float, default=3.0)
    parser.add_argument("--payload", dest="payloads", action="append", default=[])
    args = parser.parse_args()
    if args.role == "subscriber":
        result = trio.run(subscriber, args)
    elif args.role == "publisher":
        result = trio.run(publisher, args)
    elif args.role == "victim":
        result = victim(args)
    else:
        result = forge(args)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
