"""Peers: other reliable transports measured in the same run as the raw baseline.

- aioquic (pure-Python QUIC on asyncio): echo round trips over one bidirectional stream, and
  one-way 64-byte stream writes. The server's certificate is self-signed, made in-process with
  `cryptography`; the client does not verify it (loopback, no trust question).
- pyenet (the C ENet library): reliable echo round trips and one-way reliable 64-byte packets.

Each benchmark raises `Skip` with a note when its package is not installed. Both peers use
their own event loops (asyncio, ENet's `service`), as their users would: the point is how fast
the alternatives a game developer might pick are, not how they run under trio.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import importlib.util
import socket
import struct
import time
from typing import Any

from bench.harness import (
    BenchError,
    Child,
    Control,
    Result,
    RoundTrips,
    Settings,
    round_trip_results,
    set_buffers,
    usage_extra,
)

ECHO_SIZE = 64
ONEWAY_SIZE = 64
_SEQUENCE = struct.Struct("<Q")


def _require(module: str, pip_name: str) -> None:
    if importlib.util.find_spec(module) is None:
        from bench.harness import Skip

        raise Skip(f"{pip_name} is not installed (pip install -e '.[bench]')")


def _grow_buffers(fileno: int) -> None:
    # The raw baseline gets 4 MiB socket buffers; give the peers the same, through a borrowed
    # socket object that must not close the peer's descriptor.
    borrowed = socket.socket(fileno=fileno)
    try:
        set_buffers(borrowed)
    finally:
        borrowed.detach()


# ------------------------------------------------------------------ aioquic

ALPN = ["echo-bench"]


def _self_signed() -> tuple[Any, Any]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    return certificate, key


def quic_server(ctl: Control, mode: str, limit: float) -> dict[str, Any]:
    return asyncio.run(_quic_server(ctl, mode, limit))


async def _quic_server(ctl: Control, mode: str, limit: float) -> dict[str, Any]:
    from aioquic.asyncio.protocol import QuicConnectionProtocol
    from aioquic.asyncio.server import serve
    from aioquic.quic.configuration import QuicConfiguration
    from aioquic.quic.events import QuicEvent, StreamDataReceived

    loop = asyncio.get_running_loop()
    finished: asyncio.Future[dict[str, Any]] = loop.create_future()

    class Server(QuicConnectionProtocol):
        received = 0
        first = 0.0
        last = 0.0

        def quic_event_received(self, event: QuicEvent) -> None:
            if not isinstance(event, StreamDataReceived):
                return
            if mode == "echo":
                # Echo the bytes as they come; the FIN too, which tells the client we are done.
                self._quic.send_stream_data(event.stream_id, event.data, event.end_stream)
                self.transmit()
            else:
                now = time.perf_counter()
                if event.data:
                    if not self.received:
                        ctl.begin()
                        self.first = now
                    self.last = now
                    self.received += len(event.data)
                if event.end_stream:
                    self._quic.send_stream_data(event.stream_id, b"", end_stream=True)
                    self.transmit()
            if mode == "echo" and event.data:
                ctl.begin()
            if event.end_stream and not finished.done():
                ctl.end()
                finished.set_result({"bytes": self.received, "elapsed": self.last - self.first})

    configuration = QuicConfiguration(is_client=False, alpn_protocols=ALPN)
    configuration.certificate, configuration.private_key = _self_signed()
    server = await serve("127.0.0.1", 0, configuration=configuration, create_protocol=Server)
    transport = server._transport
    assert transport is not None
    _grow_buffers(transport.get_extra_info("socket").fileno())
    ctl.ready(transport.get_extra_info("sockname")[1])
    try:
        result = await asyncio.wait_for(finished, limit)
        # Let the FIN (and its ACKs) go out before the loop, and the connection, stop.
        await asyncio.sleep(0.2)
        return result
    finally:
        server.close()


def quic_client(ctl: Control, port: int, mode: str, duration: float) -> dict[str, Any]:
    ctl.ready()
    return asyncio.run(_quic_client(ctl, port, mode, duration))


async def _quic_client(ctl: Control, port: int, mode: str, duration: float) -> dict[str, Any]:
    from aioquic.asyncio.client import connect
    from aioquic.asyncio.protocol import QuicConnectionProtocol
    from aioquic.quic.configuration import QuicConfiguration
    from aioquic.quic.events import QuicEvent, StreamDataReceived

    loop = asyncio.get_running_loop()

    class Client(QuicConnectionProtocol):
        """Counts stream bytes and wakes whoever waits for `want` of them, or for the FIN."""

        received = 0
        want = 0
        waiter: asyncio.Future[None] | None = None
        fin: asyncio.Future[None] = loop.create_future()

        def quic_event_received(self, event: QuicEvent) -> None:
            if not isinstance(event, StreamDataReceived):
                return
            self.received += len(event.data)
            if self.waiter is not None and self.received >= self.want:
                if not self.waiter.done():
                    self.waiter.set_result(None)
            if event.end_stream and not self.fin.done():
                self.fin.set_result(None)

    configuration = QuicConfiguration(is_client=True, alpn_protocols=ALPN)
    configuration.verify_mode = 0  # ssl.CERT_NONE: a self-signed loopback server
    async with connect(
        "127.0.0.1", port, configuration=configuration, create_protocol=Client
    ) as client:
        assert isinstance(client, Client)
        transport = client._transport
        assert transport is not None
        _grow_buffers(transport.get_extra_info("socket").fileno())
        quic = client._quic
        stream_id = quic.get_next_available_stream_id()
        if mode == "echo":
            result = await _quic_echo(ctl, client, stream_id, duration, loop)
        else:
            ctl.begin()
            result = await _quic_blast(client, stream_id, duration)
        ctl.end()
        quic.send_stream_data(stream_id, b"", end_stream=True)
        client.transmit()
        await asyncio.wait_for(client.fin, 30)
        return result


async def _quic_echo(
    ctl: Control, client: Any, stream_id: int, duration: float, loop: asyncio.AbstractEventLoop
) -> dict[str, Any]:
    payload = bytearray(ECHO_SIZE)
    quic = client._quic
    rounds = RoundTrips(ctl, duration)
    for _ in rounds:
        client.want = client.received + ECHO_SIZE
        client.waiter = loop.create_future()
        quic.send_stream_data(stream_id, bytes(payload))
        client.transmit()
        await asyncio.wait_for(client.waiter, 10)
    return rounds.summary()


#: Unacknowledged stream bytes the one-way writer lets aioquic buffer. aioquic's
#: send_stream_data never refuses, so without a bound the writer would only fill memory; this
#: is about the stream's flow-control window (1 MiB by default), i.e. the most QUIC lets fly.
QUIC_BACKLOG = 1 << 20


async def _quic_blast(client: Any, stream_id: int, duration: float) -> dict[str, Any]:
    quic = client._quic
    payload = bytes(ONEWAY_SIZE)
    quic.send_stream_data(stream_id, payload)  # creates the stream, whose sender we watch
    sender = quic._streams[stream_id].sender
    clock = time.perf_counter
    written = 1
    start = clock()
    end = start + duration
    while clock() < end:
        for _ in range(64):
            quic.send_stream_data(stream_id, payload)
        written += 64
        client.transmit()
        # `_buffer` holds what the peer has not acknowledged yet (aioquic drops acked bytes).
        # aioquic has no "acknowledged" event to wait on, hence the short sleeps.
        while len(sender._buffer) > QUIC_BACKLOG:  # noqa: ASYNC110
            await asyncio.sleep(0.0005)
        await asyncio.sleep(0)
    return {"written": written, "elapsed": clock() - start}


def _quic_pair(settings: Settings, mode: str) -> tuple[Any, Any, Child, Child]:
    limit = settings.duration + settings.slack
    with Child("aioquic server", quic_server, mode, limit) as server:
        port = server.wait_ready()
        with Child("aioquic client", quic_client, port, mode, settings.duration) as client:
            client_result = client.result(limit)
            server_result = server.result(limit)
    return client_result, server_result, client, server


def quic_echo(settings: Settings) -> list[Result]:
    _require("aioquic", "aioquic")
    summary, _, client, server = _quic_pair(settings, "echo")
    extra = {"size": ECHO_SIZE, "round_trips": summary["round_trips"]}
    extra.update(usage_extra(client=client, server=server))
    return round_trip_results("aioquic_echo_64", summary, f"raw_echo_{ECHO_SIZE}", extra)


def quic_oneway(settings: Settings) -> list[Result]:
    _require("aioquic", "aioquic")
    sent, got, client, server = _quic_pair(settings, "oneway")
    if got["bytes"] != sent["written"] * ONEWAY_SIZE:
        raise BenchError(f"aioquic one-way: wrote {sent['written']} messages, got {got['bytes']} B")
    if got["elapsed"] <= 0:
        raise BenchError("aioquic one-way: nothing received")
    messages = got["bytes"] // ONEWAY_SIZE
    extra = {"size": ONEWAY_SIZE, "messages": messages}
    extra.update(usage_extra(sender=client, receiver=server))
    name = "aioquic_oneway_64"
    return [
        Result(
            name,
            "msgs/s",
            messages / got["elapsed"],
            "msg/s",
            extra,
            ("raw_oneway_64", "datagrams/s"),
        ),
        Result(
            name,
            "MB/s",
            got["bytes"] / got["elapsed"] / 1e6,
            "MB/s",
            {},
            ("raw_oneway_1408", "MB/s"),
        ),
    ]


# ------------------------------------------------------------------ pyenet

#: Messages the one-way sender may have queued beyond the receiver's last credit. ENet's
#: `send` queues without bound; the receiver's credits (one reliable packet every
#: ENET_CREDIT_EVERY messages) keep the queue to a few MiB, as an application would have to.
ENET_WINDOW = 65536
ENET_CREDIT_EVERY = 4096
_BYE = b"bye"


def enet_server(ctl: Control, mode: str, limit: float) -> dict[str, Any]:
    import enet

    host = enet.Host(enet.Address(b"127.0.0.1", 0), 1, 1, 0, 0)
    _grow_buffers(host.socket.fileno())
    ctl.ready(host.address.port)
    received = 0
    received_bytes = 0
    first = last = 0.0
    clock = time.perf_counter
    reliable = enet.PACKET_FLAG_RELIABLE
    deadline = clock() + limit
    while clock() < deadline:
        event = host.service(100)
        if event.type != enet.EVENT_TYPE_RECEIVE:
            continue
        data = event.packet.data
        if data == _BYE:
            ctl.end()
            # Answer, and let ENet deliver it before the process goes.
            event.peer.send(0, enet.Packet(_BYE, reliable))
            end = clock() + 1.0
            while clock() < end and host.service(10).type != enet.EVENT_TYPE_DISCONNECT:
                pass
            return {"count": received, "bytes": received_bytes, "elapsed": last - first}
        ctl.begin()
        if mode == "echo":
            event.peer.send(0, enet.Packet(data, reliable))
        else:
            now = clock()
            if not received:
                first = now
            last = now
            received += 1
            received_bytes += len(data)
            if received % ENET_CREDIT_EVERY == 0:
                event.peer.send(0, enet.Packet(_SEQUENCE.pack(received), reliable))
    raise BenchError("enet server: the client never said goodbye")


def enet_client(ctl: Control, port: int, mode: str, duration: float) -> dict[str, Any]:
    import enet

    host = enet.Host(None, 1, 1, 0, 0)
    _grow_buffers(host.socket.fileno())
    peer = host.connect(enet.Address(b"127.0.0.1", port), 1)
    deadline = time.perf_counter() + 10
    while host.service(100).type != enet.EVENT_TYPE_CONNECT:
        if time.perf_counter() > deadline:
            raise BenchError("enet client: no connection")
    ctl.ready()
    if mode == "echo":
        result = _enet_echo(ctl, host, peer, duration)
    else:
        ctl.begin()
        result = _enet_blast(host, peer, duration)
    ctl.end()
    peer.send(0, enet.Packet(_BYE, enet.PACKET_FLAG_RELIABLE))
    deadline = time.perf_counter() + 10
    while True:
        event = host.service(100)
        if event.type == enet.EVENT_TYPE_RECEIVE and event.packet.data == _BYE:
            break
        if time.perf_counter() > deadline:
            raise BenchError("enet client: no goodbye from the server")
    peer.disconnect()
    host.service(50)
    return result


def _enet_echo(ctl: Control, host: Any, peer: Any, duration: float) -> dict[str, Any]:
    import enet

    payload = bytearray(ECHO_SIZE)
    reliable = enet.PACKET_FLAG_RELIABLE
    receive = enet.EVENT_TYPE_RECEIVE
    clock = time.perf_counter_ns
    rounds = RoundTrips(ctl, duration)
    for sequence in rounds:
        _SEQUENCE.pack_into(payload, 0, sequence)
        peer.send(0, enet.Packet(bytes(payload), reliable))
        start = clock()
        while True:
            event = host.service(1000)
            if event.type == receive:
                if _SEQUENCE.unpack_from(event.packet.data)[0] != sequence:
                    raise BenchError("enet echo: reply out of order")
                break
            if clock() - start > 10_000_000_000:
                raise BenchError("enet echo: no reply within 10 s")
    return rounds.summary()


def _enet_blast(host: Any, peer: Any, duration: float) -> dict[str, Any]:
    import enet

    payload = bytes(ONEWAY_SIZE)
    reliable = enet.PACKET_FLAG_RELIABLE
    receive = enet.EVENT_TYPE_RECEIVE
    none = enet.EVENT_TYPE_NONE
    clock = time.perf_counter
    sent = 0
    credited = 0
    start = clock()
    end = start + duration
    while clock() < end:
        if sent - credited < ENET_WINDOW:
            for _ in range(256):
                peer.send(0, enet.Packet(payload, reliable))
            sent += 256
            timeout = 0
        else:
            timeout = 1  # ms: wait for a credit rather than spin
        # service() sends what is queued and returns one event per call: drain them all.
        event = host.service(timeout)
        while event.type != none:
            if event.type == receive:
                credited = max(credited, _SEQUENCE.unpack(event.packet.data)[0])
            event = host.service(0)
    return {"sent": sent, "elapsed": clock() - start}


def _enet_pair(settings: Settings, mode: str) -> tuple[Any, Any, Child, Child]:
    limit = settings.duration + settings.slack
    with Child("enet server", enet_server, mode, limit) as server:
        port = server.wait_ready()
        with Child("enet client", enet_client, port, mode, settings.duration) as client:
            client_result = client.result(limit)
            server_result = server.result(limit)
    return client_result, server_result, client, server


def enet_echo(settings: Settings) -> list[Result]:
    _require("enet", "pyenet")
    summary, _, client, server = _enet_pair(settings, "echo")
    extra = {"size": ECHO_SIZE, "round_trips": summary["round_trips"]}
    extra.update(usage_extra(client=client, server=server))
    return round_trip_results("enet_echo_64", summary, f"raw_echo_{ECHO_SIZE}", extra)


def enet_oneway(settings: Settings) -> list[Result]:
    _require("enet", "pyenet")
    sent, got, client, server = _enet_pair(settings, "oneway")
    if got["count"] != sent["sent"]:
        raise BenchError(f"enet one-way: sent {sent['sent']} reliable messages, got {got['count']}")
    if got["elapsed"] <= 0:
        raise BenchError("enet one-way: nothing received")
    extra = {"size": ONEWAY_SIZE, "messages": got["count"]}
    extra.update(usage_extra(sender=client, receiver=server))
    name = "enet_oneway_64"
    return [
        Result(
            name,
            "msgs/s",
            got["count"] / got["elapsed"],
            "msg/s",
            extra,
            ("raw_oneway_64", "datagrams/s"),
        ),
        Result(
            name,
            "MB/s",
            got["bytes"] / got["elapsed"] / 1e6,
            "MB/s",
            {},
            ("raw_oneway_1408", "MB/s"),
        ),
    ]
