"""`./dev transport-demo`: a publication and a subscription over loopback, explained as it happens.

Runs the transport alone (no Echo 2.0 server): it shows the handshake, a batch of messages, a
large fragmented message, loss recovery and the end-of-stream, and prints the counters.
"""

from __future__ import annotations

import errno
import random
import socket
import time
from typing import Any

import click
import trio

from echo._cli import PORT, count_option, fail, log_options, one_line, sole_error
from echo.transport import Publication, Subscription, Transport, TransportConfig, open_transport
from echo.transport.driver.sockets import SOL_UDP, UDP_GRO, SocketFactory, open_udp_socket


class _LossySocket(socket.socket):
    """The demo's lossy network: a socket that drops `loss` of what it receives (after the
    kernel delivered it: on the wire it is there, to the transport it is lost)."""

    def __init__(self, family: int, loss: float, rng: random.Random) -> None:
        super().__init__(family, socket.SOCK_DGRAM)
        self.loss = loss
        self.rng = rng
        self.dropped = 0

    def recvfrom_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> tuple[int, Any]:
        while True:
            result = super().recvfrom_into(buffer, nbytes, flags)  # BlockingIOError ends it
            if self.rng.random() >= self.loss:
                return result
            self.dropped += 1

    def setsockopt(self, level: int, option: int, value: Any, *rest: Any) -> None:
        if (level, option) == (SOL_UDP, UDP_GRO):  # one fate per datagram: no coalescing
            raise OSError(errno.ENOPROTOOPT, "no GRO on the demo's lossy socket")
        super().setsockopt(level, option, value, *rest)


def _lossy_factory(loss: float, rng: random.Random, sockets: list[_LossySocket]) -> SocketFactory:
    """The transport's socket factory: every socket it opens drops `loss` of what it reads
    (and is kept in `sockets`, to count the drops)."""

    def lossy(bind: tuple[str, int], family: int, rcvbuf: int, sndbuf: int) -> socket.socket:
        sock = _LossySocket(family, loss, rng)
        sockets.append(sock)
        return open_udp_socket(bind, family, rcvbuf, sndbuf, sock)

    return lossy


async def _connect(
    transport: Transport, channel: str, port: int
) -> tuple[Subscription, Publication]:
    """Steps 1 and 2: a subscription, then a publication, and the handshake between them."""
    say = click.echo
    subscription = await transport.add_subscription(
        channel,
        stream_id=1001,
        on_image_available=lambda image: say(
            f"  subscription: a publisher appeared (session {image.session_id} "
            f"from {image.source_address})"
        ),
        on_image_unavailable=lambda image: say(
            f"  subscription: publisher session {image.session_id} went away "
            f"({image.close_reason})"
        ),
    )
    say(f"1. Subscription listening on {subscription.local_address}, stream 1001.")
    publication = await transport.add_publication(channel, stream_id=1001)
    say(
        f"2. Publication session {publication.session_id} sends SETUP frames to "
        f"127.0.0.1:{port} until the subscriber answers with a status message..."
    )
    started = time.perf_counter()
    await publication.wait_connected(timeout=5)
    say(f"   connected after {(time.perf_counter() - started) * 1000:.1f} ms.")
    return subscription, publication


async def _send_all(
    publication: Publication, subscription: Subscription, count: int, loss: float
) -> None:
    """Step 3: `count` messages and a big one, each checked on arrival."""
    say = click.echo
    rng = random.Random(2)
    messages = [rng.randbytes(rng.randint(1, 2000)) for _ in range(count)]
    big = rng.randbytes(100_000)
    say(
        f"3. Sending {count} messages of 1..2000 bytes and one of {len(big):,} bytes "
        f"(fragmented into {publication.max_payload_length}-byte frames)"
        + (f", with {loss:.0%} of received datagrams dropped on purpose." if loss else ".")
    )

    async def produce() -> None:
        for message in [*messages, big]:
            await publication.send(message, timeout=10)

    received = 0
    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(produce)
        for expected in [*messages, big]:
            with trio.fail_after(30):
                message = await subscription.receive()
            if message.data != expected:
                raise click.ClickException(f"message {received} arrived corrupted")
            received += 1
    elapsed = time.perf_counter() - started
    say(
        f"   all {received} arrived intact and in order in {elapsed * 1000:.0f} ms "
        f"({received / elapsed:,.0f} messages/s)."
    )


async def _demo(port: int, count: int, loss: float) -> None:
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}|term-length=1m"
    sockets: list[_LossySocket] = []
    lossy = _lossy_factory(loss, random.Random(1), sockets)
    say = click.echo
    async with open_transport(TransportConfig(seed=1), socket_factory=lossy) as transport:
        subscription, publication = await _connect(transport, channel, port)
        await _send_all(publication, subscription, count, loss)
        counters = transport.counters
        say(
            f"   on the wire: {counters.datagrams_sent:,} datagrams, "
            f"{counters.naks_sent} NAKs, {counters.retransmits_sent} retransmits, "
            f"{sum(sock.dropped for sock in sockets)} datagrams dropped by the demo."
        )
        say("4. Closing the publication: it drains, then sends end-of-stream heartbeats.")
        delivered = await publication.close()
        with trio.move_on_after(2):
            while subscription.images:
                await subscription.wait_activity()
        say(f"   every receiver confirmed everything: {delivered}.")
    say("Done.")


EPILOG = """\b
Exit status: 0 every message arrived; 1 the port is in use, or a message did not arrive
intact; 2 a bad command line.
"""


@click.command(epilog=EPILOG)
@click.option(
    "--port", default=40123, show_default=True, type=PORT, help="UDP port on 127.0.0.1 to use."
)
@count_option("--count", default=2000, help="Messages to send before the big one.")
@click.option(
    "--loss",
    default=0.1,
    show_default=True,
    type=click.FloatRange(0.0, 0.5),
    help="Fraction of received datagrams to drop, to show NAK-based recovery.",
)
@log_options(default_level="warning")
def main(port: int, count: int, loss: float, log_format: str, log_level: str) -> None:
    """Run a publication and a subscription of the echo transport over loopback, explained
    step by step: the handshake, messages, a fragmented one, recovery from loss, the end."""
    from echo.log import configure_logging

    configure_logging(log_format, log_level)  # type: ignore[arg-type]
    try:
        trio.run(_demo, port, count, loss)
    except BaseException as error:
        found = sole_error(error, (OSError, trio.TooSlowError))
        if found is None:
            raise
        why = one_line(found) if isinstance(found, OSError) else "a message did not arrive in time"
        fail("transport-demo", why)


if __name__ == "__main__":  # pragma: no cover
    main()
