"""What an idle stream costs the driver, and what it must still do (docs/transport.md, "The
idle cadence").

An idle stream's heartbeats and status messages each carry one fact, "I am still here": a
heartbeat from where the stream already stood moves the image's liveness on, a status message
that repeats the last one moves the publication's. Neither leaves anything for a poll of the
endpoint to do, so the driver reads them and does not service the socket (a poll, its
channels told, its deadline recomputed); the timers serve the socket when they fall due. What
must still hold: a heartbeat or SM that does carry news (a lost tail, a window that moved, a
sender probing at the window's edge) is acted on at once, and a peer that goes silent is still
found within its liveness bound. Virtual time on the memory network, Aeron's default cadence.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import trio
import trio.testing

from echo.transport import open_transport
from echo.transport.core.image import ImageState
from echo.transport.core.wireformat import (
    DATA_HEADER_LENGTH,
    EOS_FLAG,
    SM_EOS_FLAG,
    UNFRAGMENTED_FLAGS,
)
from echo.transport.driver.sockets import ReceiveSocket, SendSocket
from echo.transport.testing import Link, MemoryNetwork
from tests.transport.test_image_mutants import INITIAL, make_image
from tests.transport.test_lending import pair
from tests.transport.test_publication_mutants import RECEIVER, TERM, publication, sm

PORT = 40125


def count_services(transport: Any) -> Counter[str]:
    """Count the driver's services of `transport`'s sockets, by kind of socket."""
    driver = transport._driver
    counts: Counter[str] = Counter()
    service = driver.service

    def counting(udp: Any, now: float) -> None:
        if isinstance(udp, SendSocket):
            counts["send"] += 1
        elif isinstance(udp, ReceiveSocket):
            counts["receive"] += 1
        service(udp, now)

    driver.service = counting
    return counts


async def test_an_idle_streams_heartbeats_and_status_messages_are_not_serviced(
    autojump_clock: trio.testing.MockClock,
) -> None:
    net = MemoryNetwork()
    async with (
        open_transport(socket_factory=net) as sender,
        open_transport(socket_factory=net) as receiver,
    ):
        pub, sub = await pair(sender, receiver, port=PORT)
        await pub.send(b"settle")
        assert (await sub.receive()).data == b"settle"
        await trio.sleep(1.0)  # virtual time: the stream settles into its idle cadence
        sent = sender.counters.heartbeats_sent
        heard = receiver.counters.heartbeats_received
        sms = receiver.counters.status_messages_sent
        on_sender = count_services(sender)
        on_receiver = count_services(receiver)
        await trio.sleep(10.0)  # virtual time: ten idle seconds, counted
        heartbeats = receiver.counters.heartbeats_received - heard
        status_messages = receiver.counters.status_messages_sent - sms
        assert heartbeats >= 90  # every 100 ms
        assert status_messages >= 45  # every 200 ms
        # The receiver's socket is serviced for its SM timer, not for each heartbeat too.
        assert on_receiver["receive"] <= status_messages + 2
        # The sender's for its heartbeat timer and housekeeping, not for each SM too.
        assert on_sender["send"] <= sender.counters.heartbeats_sent - sent + 12
        assert pub.is_connected and sub.is_connected
        # Data still goes through and is read at once.
        assert pub.offer(b"after the quiet") > 0
        with trio.fail_after(0.1):
            assert (await sub.receive()).data == b"after the quiet"


async def test_a_silent_peer_is_still_found_within_its_liveness_bounds(
    autojump_clock: trio.testing.MockClock,
) -> None:
    net = MemoryNetwork()
    async with (
        open_transport(socket_factory=net) as sender,
        open_transport(socket_factory=net) as receiver,
    ):
        pub, sub = await pair(sender, receiver, port=PORT)
        await trio.sleep(3.0)  # virtual time, idle: nothing but heartbeats and SMs is serviced
        assert pub.is_connected and sub.is_connected
        net.set_link(Link(loss=1.0))  # both directions go silent
        silent_at = trio.current_time()
        with trio.fail_after(receiver.config.image_liveness_timeout + 0.5):
            while sub.is_connected:  # noqa: ASYNC110 (virtual time)
                await trio.sleep(0.01)
        assert trio.current_time() - silent_at >= receiver.config.image_liveness_timeout - 0.3
        with trio.fail_after(sender.config.publication_connection_timeout + 1.5):
            while pub.is_connected:  # noqa: ASYNC110 (virtual time)
                await trio.sleep(0.01)


# ------------------------------------------------------------------ the pure cores' answers


def _sent(datagram: Any, address: Any) -> int:
    return 1


def test_a_heartbeat_where_the_stream_stood_needs_no_poll() -> None:
    image = make_image()
    heartbeat = bytes(DATA_HEADER_LENGTH)
    image.poll(0.0, _sent)  # the first SM (it connects the sender)
    assert not image.on_data(True, UNFRAGMENTED_FLAGS, 0, INITIAL, heartbeat, 0.1)
    assert image.next_deadline(0.1) > 0.15  # nothing due: the next SM's interval
    # its liveness moved on all the same: alive until 0.1 + the timeout
    image.poll(image.timers.liveness_timeout + 0.05, _sent)
    assert image.state is ImageState.ACTIVE
    # A heartbeat beyond what came is a lost tail, to be NAKed.
    assert image.on_data(True, UNFRAGMENTED_FLAGS, 1024, INITIAL, heartbeat, 0.2)
    assert image.loss.dirty and image.hwm == 1024


def test_a_heartbeat_with_news_needs_a_poll() -> None:
    heartbeat = bytes(DATA_HEADER_LENGTH)
    image = make_image()
    image.poll(0.0, _sent)
    assert image.on_data(True, UNFRAGMENTED_FLAGS | EOS_FLAG, 0, INITIAL, heartbeat, 0.1)
    # A sender probing from one position waits for an SM: it is brought forward.
    image = make_image()
    image.poll(0.0, _sent)
    assert not image.on_data(True, UNFRAGMENTED_FLAGS, 0, INITIAL, heartbeat, 0.1)
    assert image.on_data(True, UNFRAGMENTED_FLAGS, 0, INITIAL, heartbeat, 0.12)
    assert image.next_deadline(0.12) == 0.12


def test_a_repeated_status_message_is_no_news_and_a_moved_window_is() -> None:
    pub = publication()
    assert pub.on_status_message(sm(0), 0.0)  # it connects
    assert not pub.on_status_message(sm(0), 0.2)  # the same again
    assert pub.liveness.receivers[RECEIVER].last_sm == 0.2  # its liveness moved on
    assert pub.on_status_message(sm(0, window=TERM), 0.4)  # the window grew
    assert not pub.on_status_message(sm(0, window=TERM), 0.6)
    assert pub.on_status_message(sm(0, receiver_id=RECEIVER + 1), 0.8)  # a new receiver
    # silent for the connection timeout: the next SM connects it again, news for its waiters
    assert not pub.is_connected(0.8 + pub.timers.connection_timeout + 0.01)  # (not expired yet)
    later = 0.8 + pub.timers.connection_timeout + 0.01
    assert pub.on_status_message(sm(0, receiver_id=RECEIVER + 1), later)
    assert pub.on_status_message(sm(0, flags=SM_EOS_FLAG), 1.0)  # end-of-stream: it left
