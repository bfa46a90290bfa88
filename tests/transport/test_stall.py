"""A process that stalls reads what came meanwhile before its timers judge a peer silent.

After a stall (a loaded machine, a long pass of the event loop), the driver's timer loop and
its reader wake together, in either order. When the timers went first, an image whose
publisher kept sending through the stall expired on its liveness, its heartbeats unread in the
socket: under load, a lobby server closed members that were alive and the members' reconnects
made the load worse. A late timer loop now reads a due socket first.
"""

from __future__ import annotations

import socket
import threading
import time

import attrs
import trio

from echo.transport import Image, TransportConfig, open_transport
from echo.transport.core.wireformat import UNFRAGMENTED_FLAGS, DataHeader, Setup
from tests.ports import free_base

STREAM = 1001
SESSION = 4242
LIVENESS = 0.5
STALL = 1.0
STALLS = 6


def _publisher(port: int, stop: threading.Event) -> None:
    """Another process's publication: a SETUP, then a heartbeat every 50 ms, stall or not."""
    setup = Setup(0, SESSION, STREAM, 0, 0, 65536, 1408).encode()
    heartbeat = DataHeader(0, UNFRAGMENTED_FLAGS, 0, SESSION, STREAM, 0).encode()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.sendto(setup, ("127.0.0.1", port))
        while not stop.wait(0.05):
            sock.sendto(heartbeat, ("127.0.0.1", port))


async def test_an_image_whose_publisher_kept_sending_survives_our_stall() -> None:
    port = free_base(1)
    config = attrs.evolve(TransportConfig(), image_liveness_timeout=LIVENESS)
    lost: list[Image] = []
    stop = threading.Event()
    thread = threading.Thread(target=_publisher, args=(port, stop), daemon=True)
    with trio.fail_after(30):
        async with open_transport(config) as transport:
            subscription = await transport.add_subscription(
                f"aeron:udp?endpoint=127.0.0.1:{port}", STREAM, on_image_unavailable=lost.append
            )
            thread.start()
            try:
                while not subscription.images:
                    await subscription.wait_activity()
                for _ in range(STALLS):
                    # The stall: this thread (the event loop) blocks while the publisher goes
                    # on; twice the liveness passes on the clock, with heartbeats queued.
                    time.sleep(STALL)  # noqa: ASYNC251 - a deliberate stall of the event loop
                    for _ in range(20):  # the reader and the timers run, in either order
                        await trio.sleep(0.01)
                    assert not lost, "the image expired with its heartbeats unread"
                assert len(subscription.images) == 1
            finally:
                stop.set()
                thread.join()
