"""The Echo 2.0 exchange the wire-fidelity capture records (run inside the capture's namespace).

    python -m tests.wire.exchange --out record.json [--count 150] [--loss 0.1] [--loss-mode nft]

One process runs an Echo 2.0 server and one client, each with its own transport (own sockets,
own counters), on 127.0.0.1 ports 20100.. (see `PORTS`). The settings make one short exchange
show every part of the protocol that the capture test checks:

* the all-clients handshake (dynamic MDC registration with its cookie, HELLO, CONNECT);
* a duologue of `count` echoes;
* loss, so that NAKs and retransmits happen. `--loss-mode nft` (what the capture uses; only
  inside a namespace of its own) drops `loss` of all UDP on the input hook, in the kernel,
  from the first echo on: the handshake runs clean (Echo 2.0 does not retry a lost CONNECT),
  the duologue is lossy. `--loss-mode driver` (the default, safe anywhere) makes both
  transports drop `loss` of what they receive (a seeded tests.transport.lossy network behind
  each transport's socket factory) from the start.
  Either way the datagram crossed loopback first, so the capture holds every original and
  every NAK and retransmit that repaired it;
* fragmentation: MTU 512 and ~900-byte messages, so every echo is two DATA fragments;
* term rotation: 64 KiB terms, which `count` echoes of ~1 KiB each fill more than twice,
  leaving a PAD frame at the end of each full term.

It writes what the transports themselves recorded, for the capture to be checked against:
every transport's counters, every publication's identity and final position, the server's
events and the client's session ids.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import trio

import echo.client.client as client_module
import echo.session.server as server_module  # where the Echo server opens its transport
from echo.client.client import ClientConfig, EchoClient
from echo.server.server import EchoServer
from echo.session.config import ServerConfig
from echo.session.timers import echo_timers
from echo.transport import Publication, Transport, TransportConfig
from echo.transport.api import open_transport
from tests.transport.lossy import LossyNetwork

ADDRESS = "127.0.0.1"
SERVER_PORT = 20100
CONTROL_PORT = 20101
CLIENTS_BASE_PORT = 20110
MAX_CLIENTS = 4
#: Every fixed port of the exchange; the other end of each flow is an ephemeral port (>= 32768).
PORTS = range(20100, 20200)
TERM_LENGTH = 64 * 1024
MTU = 512
MESSAGE_LENGTH = 900
NFT_TABLE = "echo_wire_loss"


def nft_loss_rules(loss: float) -> str:
    """Drop `loss` of incoming UDP on the input hook: after the loopback capture point."""
    threshold = round(loss * 10000)
    return (
        f"table inet {NFT_TABLE} {{\n"
        "  chain input {\n"
        "    type filter hook input priority filter - 10; policy accept;\n"
        f"    meta l4proto udp numgen random mod 10000 < {threshold} drop\n"
        "  }\n"
        "}\n"
    )


class Recorder:
    """Wraps `open_transport` so every transport and publication made is remembered."""

    def __init__(self, driver_loss: float = 0.0, seed: int = 0) -> None:
        self.driver_loss = driver_loss
        self.seed = seed
        self.transports: list[tuple[str, Transport]] = []
        self.publications: list[tuple[str, Publication]] = []
        self.events: list[dict[str, Any]] = []

    def factory(self, role: str) -> Any:
        recorder = self
        network = (
            LossyNetwork(self.driver_loss, seed=2 * self.seed + (role == "client"))
            if self.driver_loss
            else None
        )

        @contextlib.asynccontextmanager
        async def recording_open_transport(
            config: TransportConfig | None = None, *, socket_factory: Any = None
        ) -> AsyncIterator[Transport]:
            # (The exchange's lossy network, if any, stands in for the caller's factory; for a
            # server's held duologue ports it binds the port once the placeholder let it go.)
            held = getattr(socket_factory, "__self__", None)
            if network is not None and held is not None:
                held.inner = network
                factory = socket_factory
            else:
                factory = network if network is not None else socket_factory
            opened = (
                open_transport(config, socket_factory=factory)
                if factory is not None
                else open_transport(config)
            )
            async with opened as transport:
                recorder.transports.append((role, transport))
                add_publication = transport.add_publication

                async def recording_add_publication(channel: str, stream_id: int) -> Publication:
                    publication = await add_publication(channel, stream_id)
                    recorder.publications.append((role, publication))
                    return publication

                transport.add_publication = recording_add_publication  # type: ignore[method-assign]
                yield transport

        return recording_open_transport


class ServerEvents:
    """The server's event sink: keeps every event, with the duologue's session id added."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.server: EchoServer | None = None
        self.duologue_closed = trio.Event()

    def emit(self, event: str, **fields: Any) -> None:
        record = {"event": event, **fields}
        if event == "duologue_created" and self.server is not None:
            duologue = self.server.duologues.get(fields["duologue_id"])
            if duologue is not None:
                record["session_id"] = duologue.session_id
        self.recorder.events.append(record)
        if event == "duologue_closed":
            self.duologue_closed.set()


def _publication_record(role: str, publication: Publication) -> dict[str, Any]:
    # the transport's own record of the stream (no public getter)
    state = publication._channel.state
    return {
        "role": role,
        "channel": publication.channel,
        "session_id": publication.session_id,
        "stream_id": publication.stream_id,
        "initial_term_id": state.initial_term_id,
        "term_length": publication.term_length,
        "mtu": publication.mtu,
        "position": publication.position,
        "local_address": publication.local_address,
    }


async def run_exchange(count: int, loss: float, seed: int, loss_mode: str) -> dict[str, Any]:
    driver_loss = loss if loss_mode == "driver" else 0.0
    recorder = Recorder(driver_loss, seed)
    server_module.open_transport = recorder.factory("server")  # type: ignore[attr-defined]
    client_module.open_transport = recorder.factory("client")  # type: ignore[attr-defined]

    def transport_config(seed: int) -> TransportConfig:
        return echo_timers(
            term_length=TERM_LENGTH,
            mtu=MTU,
            # The seed also fixes session and term ids: only for the reproducible driver loss.
            seed=seed if loss_mode == "driver" else None,
        )

    echoing = trio.Event()
    loss_applied_at_echo: list[int] = []

    async def apply_kernel_loss() -> None:
        await echoing.wait()
        await trio.run_process(["nft", "-f", "-"], stdin=nft_loss_rules(loss).encode())
        loss_applied_at_echo.append(client.machine.received)

    events = ServerEvents(recorder)
    server = EchoServer(
        ServerConfig(
            address=ADDRESS,
            port=SERVER_PORT,
            control_port=CONTROL_PORT,
            clients_base_port=CLIENTS_BASE_PORT,
            max_clients=MAX_CLIENTS,
        ),
        transport_config=transport_config(seed),
        events=events,
    )
    events.server = server
    message = ("wire fidelity " * 100)[:MESSAGE_LENGTH]
    client = EchoClient(
        ClientConfig(
            server=ADDRESS,
            port=SERVER_PORT,
            control_port=CONTROL_PORT,
            count=count,
            interval=0,
            message=message,
            timeout=10.0,
        ),
        transport_config=transport_config(seed + 1),
        on_echo=lambda _echo: echoing.set(),
    )
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            if loss_mode == "nft" and loss > 0:
                nursery.start_soon(apply_kernel_loss)
            machine = await client.run()
            # Let the server see the client's end-of-stream and close the duologue first, so
            # the capture also holds the goodbyes (EOS heartbeats and SMs).
            with trio.move_on_after(3):
                await events.duologue_closed.wait()
            await server.stop("exchange done")
    return {
        "address": ADDRESS,
        "ports": [PORTS.start, PORTS.stop - 1],
        "server_port": SERVER_PORT,
        "control_port": CONTROL_PORT,
        "clients_base_port": CLIENTS_BASE_PORT,
        "count": count,
        "loss": loss,
        "loss_mode": loss_mode,
        "kernel_loss_from_echo": loss_applied_at_echo[0] if loss_applied_at_echo else None,
        "term_length": TERM_LENGTH,
        "mtu": MTU,
        "message_length": len(message),
        "client": {
            "state": machine.state.value,
            "failure": None if machine.failure is None else str(machine.failure),
            "sent": machine.sent,
            "received": machine.received,
            "client_session": machine.client_session,
            "duologue_session": machine.duologue_session,
        },
        "transports": [
            {"role": role, "counters": transport.counters.snapshot()}
            for role, transport in recorder.transports
        ],
        "publications": [_publication_record(role, pub) for role, pub in recorder.publications],
        "events": recorder.events,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where to write the JSON record")
    parser.add_argument("--count", type=int, default=150, help="echoes in the duologue")
    parser.add_argument("--loss", type=float, default=0.1, help="receive loss of each transport")
    parser.add_argument("--seed", type=int, default=1, help="seed of the driver's loss")
    parser.add_argument(
        "--loss-mode",
        choices=("driver", "nft"),
        default="driver",
        help="nft: kernel loss from the first echo on (only in a namespace of its own!)",
    )
    args = parser.parse_args(argv)
    record = trio.run(run_exchange, args.count, args.loss, args.seed, args.loss_mode)
    args.out.write_text(json.dumps(record, indent=1, default=str))
    client = record["client"]
    ok = client["received"] == args.count and client["failure"] is None
    print(f"exchange: {client['received']}/{args.count} echoes, state {client['state']}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
