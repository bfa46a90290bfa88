"""50 clients behind 3 NATs on one echo-server in --duologue-ports shared, with a capture.

Every duologue lives on the server's two duologue ports. A raw packet socket in the server's
namespace records every datagram the server sends from those two ports; the test then checks
that each destination (a client's NAT mapping) received exactly one session's frames, that this
session belongs to a client behind that NAT, and that every client's own echoes came back to it
(no client ever receives another client's data: aeron-io/aeron#2061 must not happen here).

Run as a module, this file is also the two programs the test starts inside the namespaces:
``capture`` (in the server's) and ``clients`` (one process per NAT host, many connect()s).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import struct
import subprocess
import threading
from collections import defaultdict
from pathlib import Path

import pytest

from tests.netlab.fixtures import nat_lab_factory  # noqa: F401  (fixture)
from tests.netlab.lab import SERVER_PUBLIC_IP, LineReader, NatLabFactory

pytestmark = pytest.mark.netns
REPO = Path(__file__).resolve().parents[2]
CLIENTS = 50
NATS = 3
DATA_PORT = 9010
CONTROL_PORT = 9011
ROUNDS = 5

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4


# ------------------------------------------------------------------------------ the programs


def capture(interface: str, ports: set[int], out: Path) -> None:
    """Record every outgoing IPv4/UDP datagram from `ports` until SIGTERM: one JSON line each
    (destination address and port, source port, payload in hex)."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.bind((interface, 0))
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    sock.settimeout(0.2)
    print("capturing", flush=True)
    with out.open("w") as sink:
        while not stopping:
            try:
                frame, address = sock.recvfrom(65535)
            except TimeoutError:
                continue
            if address[2] != PACKET_OUTGOING or len(frame) < 42:
                continue
            if struct.unpack_from(">H", frame, 12)[0] != 0x0800 or frame[23] != 17:
                continue
            ihl = (frame[14] & 0x0F) * 4
            udp = 14 + ihl
            src_port, dst_port, length = struct.unpack_from(">HHH", frame, udp)
            if src_port not in ports:
                continue
            destination = socket.inet_ntoa(frame[30:34])
            payload = frame[udp + 8 : udp + length]
            sink.write(json.dumps([destination, dst_port, src_port, payload.hex()]) + "\n")
    print("stopped", flush=True)


async def clients(server: str, count: int, rounds: int) -> None:
    """`count` sessions at once, each echoing `rounds` messages of its own; prints one JSON
    line: the session ids and how many echoes came back right."""
    import trio

    import echo.session as es

    sessions: list[int] = []
    good = 0

    async def one(index: int) -> None:
        nonlocal good
        async with es.connect(server, 9000, 9001, duologue_ports="shared", timeout=30.0) as s:
            sessions.append(s.session_id)
            for round_ in range(rounds):
                text = b"ECHO %d-%d-%d" % (os.getpid(), index, round_)
                await s.send(text)
                with trio.fail_after(30):
                    reply = await s.receive()
                if reply == text:
                    good += 1
            # Stay until everyone is done, so the capture sees all duologues live together.
            await everyone_done.wait()

    everyone_done = trio.Event()
    async with trio.open_nursery() as nursery:
        for index in range(count):
            nursery.start_soon(one, index)
        with trio.fail_after(120):
            while good < count * rounds:  # noqa: ASYNC110 (the sessions' own deadlines bound it)
                await trio.sleep(0.05)
        everyone_done.set()
    print(json.dumps({"sessions": sessions, "good": good}), flush=True)


# ------------------------------------------------------------------------------ the test


def _sessions_in(payload: bytes) -> set[int]:
    """The session id of every frame in a datagram the server sent (untrusted parse): a DATA
    datagram may carry several frames, each with its session."""
    from echo.transport.core.frames import (
        DataHeader,
        iter_data_frames_untrusted,
        parse_datagram_untrusted,
    )

    first = parse_datagram_untrusted(payload)  # raises on anything not a valid Aeron frame
    if isinstance(first, DataHeader):
        return {frame.session_id for frame in iter_data_frames_untrusted(payload)}
    return {first.session_id}


class _Log:
    def __init__(self) -> None:
        self.lines: list[bytes] = []
        self.listening = threading.Event()


def _drain(process: subprocess.Popen[bytes]) -> _Log:
    """Read the server's log as it comes (a full pipe would stall the server)."""
    log = _Log()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            log.lines.append(line)
            if b'"event": "listening"' in line:
                log.listening.set()

    threading.Thread(target=read, daemon=True).start()
    return log


def test_fifty_clients_behind_three_nats_each_receive_only_their_own_session(
    nat_lab_factory: NatLabFactory,  # noqa: F811
    tmp_path: Path,
) -> None:
    lab = nat_lab_factory(sites=NATS, clients_per_site=1)
    captured = tmp_path / "server.jsonl"
    recorder = lab.server.python(
        "-m",
        "tests.netlab.test_shared_ports",
        "capture",
        "--interface",
        lab.server.interface,
        "--out",
        str(captured),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert LineReader(recorder.stdout).readline(timeout=30).strip() == "capturing"
    server = lab.server.python(
        "-m",
        "echo.server.cli",
        "--address",
        SERVER_PUBLIC_IP,
        "--duologue-ports",
        "shared",
        "--clients-base-port",
        str(DATA_PORT),
        "--max-clients",
        str(CLIENTS + 10),
        "--max-per-ip",
        str(CLIENTS),
        "--duologue-expiry",
        "30",
        "--log-format",
        "json",
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    log = _drain(server)
    reports: dict[str, dict[str, list[int] | int]] = {}
    try:
        assert log.listening.wait(timeout=60), f"server did not start: {log.lines[-5:]}"
        shares = [CLIENTS // NATS + (1 if i < CLIENTS % NATS else 0) for i in range(NATS)]
        programs = [
            (
                site,
                site.clients[0].python(
                    "-m",
                    "tests.netlab.test_shared_ports",
                    "clients",
                    "--server",
                    SERVER_PUBLIC_IP,
                    "--count",
                    str(share),
                    "--rounds",
                    str(ROUNDS),
                    cwd=REPO,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                ),
            )
            for site, share in zip(lab.sites, shares, strict=True)
        ]
        for (site, program), share in zip(programs, shares, strict=True):
            out, err = program.communicate(timeout=240)
            assert program.returncode == 0, err.decode()[-3000:]
            report = json.loads(out.decode().strip().splitlines()[-1])
            assert report["good"] == share * ROUNDS, report
            assert len(report["sessions"]) == share
            reports[site.router.public_ip] = report
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
        recorder.send_signal(signal.SIGTERM)
        recorder.wait(timeout=30)

    # A NAT mapping is the whole tuple: the router may give two clients' sockets the same
    # public port when they talk to different server ports (Linux's masquerade only keeps
    # each connection's tuple unique), so a mapping is keyed by the server's port too.
    by_destination: dict[tuple[str, int, int], set[int]] = defaultdict(set)
    datagrams = 0
    for line in captured.read_text().splitlines():
        destination, port, source_port, payload = json.loads(line)
        by_destination[(destination, port, source_port)] |= _sessions_in(bytes.fromhex(payload))
        datagrams += 1
    assert datagrams > CLIENTS * ROUNDS  # echoes, SETUPs, SMs, heartbeats...
    every_session = set()
    for (destination, port, source_port), sessions in by_destination.items():
        # One session per mapping: no client's mapping ever carried another's frames.
        assert len(sessions) == 1, (destination, port, source_port, sessions)
        report = reports[destination]
        assert sessions <= set(report["sessions"])  # type: ignore[arg-type]
        every_session |= sessions
    # Every client was sent its own stream (responses, and SMs for its requests).
    assert every_session == {s for r in reports.values() for s in r["sessions"]}  # type: ignore[union-attr]
    # Two destinations per client (its request publication's and its response subscription's
    # mappings): nobody was sent to anywhere else.
    assert len(by_destination) == 2 * CLIENTS


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="role", required=True)
    rec = sub.add_parser("capture")
    rec.add_argument("--interface", required=True)
    rec.add_argument("--out", type=Path, required=True)
    many = sub.add_parser("clients")
    many.add_argument("--server", required=True)
    many.add_argument("--count", type=int, required=True)
    many.add_argument("--rounds", type=int, required=True)
    args = parser.parse_args()
    if args.role == "capture":
        capture(args.interface, {DATA_PORT, CONTROL_PORT}, args.out)
    else:
        import trio

        trio.run(clients, args.server, args.count, args.rounds)


if __name__ == "__main__":
    main()
