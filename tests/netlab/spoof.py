"""Forge Echo 2.0 HELLOs from many source addresses with a raw socket (run inside a namespace).

    python -m tests.netlab.spoof --server 198.18.0.1 --port 9000 --sources 198.18.0.100-150

Each forged client is a SETUP for a fresh session followed by a DATA frame carrying
`HELLO <key>`, both with the forged IPv4 source: all a blind spoofer can do, since it never
sees the server's replies.
"""

from __future__ import annotations

import argparse
import ipaddress
import random
import socket
import struct
import time

from echo.protocol import ECHO_STREAM_ID, Hello, format_message
from echo.transport.core.frames import DataHeader, Setup, align


def udp_packet(source: str, sport: int, dest: str, dport: int, payload: bytes) -> bytes:
    # IP_HDRINCL: the kernel fills in the total length and the header checksum; a zero UDP
    # checksum means "none" in IPv4.
    ip = struct.pack(
        "!BBHHHBBH4s4s",
        0x45,
        0,
        0,
        0,
        0,
        64,
        socket.IPPROTO_UDP,
        0,
        socket.inet_aton(source),
        socket.inet_aton(dest),
    )
    udp = struct.pack("!HHHH", sport, dport, 8 + len(payload), 0)
    return ip + udp + payload


def forged_hello(rng: random.Random) -> tuple[bytes, bytes]:
    session = rng.randrange(-(2**31), 0)
    term = rng.randrange(-(2**31), 2**31)
    setup = Setup(
        term_offset=0,
        session_id=session,
        stream_id=ECHO_STREAM_ID,
        initial_term_id=term,
        active_term_id=term,
        term_length=65536,
        mtu=1408,
    ).encode()
    payload = format_message(Hello(rng.getrandbits(32)))
    header = DataHeader(
        frame_length=32 + len(payload),
        flags=0xC0,
        term_offset=0,
        session_id=session,
        stream_id=ECHO_STREAM_ID,
        term_id=term,
    ).encode()
    data = header + payload + bytes(align(32 + len(payload)) - 32 - len(payload))
    return setup, data


def parse_sources(text: str) -> list[str]:
    sources: list[str] = []
    for part in text.split(","):
        if "-" in part:
            first, last = part.split("-")
            start = ipaddress.IPv4Address(first)
            end = (
                ipaddress.IPv4Address(last)
                if "." in last
                else ipaddress.IPv4Address(first.rsplit(".", 1)[0] + "." + last)
            )
            sources += [str(ipaddress.IPv4Address(i)) for i in range(int(start), int(end) + 1)]
        else:
            sources.append(part)
    return sources


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", required=True)
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--sources", required=True, help="a,b,c or 198.18.0.100-150")
    parser.add_argument("--rounds", type=int, default=1, help="HELLOs per source")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    sent = 0
    for _ in range(args.rounds):
        for source in parse_sources(args.sources):
            setup, data = forged_hello(rng)
            sport = rng.randrange(1024, 65535)
            for frame in (setup, setup, data, data):
                raw.sendto(
                    udp_packet(source, sport, args.server, args.port, frame), (args.server, 0)
                )
                sent += 1
            time.sleep(0.001)
    print(sent, flush=True)


if __name__ == "__main__":
    main()
