"""The sessions' idle cadence (echo.session.timers): what it sends, and what it still does.

Two transports with `echo_timers()` on the memory network in virtual time: an idle stream
sends a heartbeat every 0.5 s and a status message every second, and the heartbeats pay the
anti-amplification budget for those status messages (none is held back); a lost last message
is still repaired in milliseconds (the probe after data); a peer that goes silent is still
found out within the documented times (image liveness 10 s, publication connection 5 s).
"""

from __future__ import annotations

import trio
import trio.testing

from echo.session.timers import (
    ECHO_HEARTBEAT_INTERVAL,
    ECHO_STATUS_MESSAGE_INTERVAL,
    MAX_BUDGETED_HEARTBEAT_RATIO,
    echo_timers,
)
from echo.transport import TransportConfig, open_transport
from echo.transport.core.frames import DATA_HEADER_LENGTH, SM_LENGTH
from echo.transport.core.timerheap import IDLE_SLACK
from echo.transport.testing import Datagram, MemoryNetwork

STREAM = 1001
CHANNEL = "aeron:udp?endpoint=127.0.0.1:40200"


def test_the_heartbeat_pays_for_the_status_messages_and_follows_liveness() -> None:
    config = echo_timers()
    assert config.heartbeat_interval == ECHO_HEARTBEAT_INTERVAL == 0.5
    assert config.status_message_interval == ECHO_STATUS_MESSAGE_INTERVAL == 1.0
    assert config.probe_after_data
    # 32 bytes of heartbeat per heartbeat interval cover 36 bytes of SM per SM interval
    assert DATA_HEADER_LENGTH / config.heartbeat_interval >= SM_LENGTH / (
        config.status_message_interval
    )
    assert config.heartbeat_interval <= MAX_BUDGETED_HEARTBEAT_RATIO * (
        config.status_message_interval
    )
    # A shorter liveness (the lobby client's 1.5 s) keeps three heartbeats within it.
    assert echo_timers(image_liveness_timeout=1.5).heartbeat_interval == 0.5
    assert echo_timers(image_liveness_timeout=1.0).heartbeat_interval < 0.34
    # An explicit setting wins; a slower SM takes the heartbeat along.
    assert echo_timers(heartbeat_interval=0.2).heartbeat_interval == 0.2
    assert echo_timers(status_message_interval=2.0).heartbeat_interval == 1.0
    # The plain transport keeps Aeron's cadence.
    assert TransportConfig().heartbeat_interval == 0.1
    assert TransportConfig().status_message_interval == 0.2


async def test_an_idle_stream_sends_the_calm_cadence_and_stays_connected(
    autojump_clock: trio.testing.MockClock,
) -> None:
    net = MemoryNetwork()
    async with (
        open_transport(echo_timers(), socket_factory=net) as sender,
        open_transport(echo_timers(), socket_factory=net) as receiver,
    ):
        sub = await receiver.add_subscription(CHANNEL, STREAM)
        pub = await sender.add_publication(CHANNEL, STREAM)
        await pub.wait_connected(timeout=5)
        assert pub.offer(b"hello") > 0
        with trio.fail_after(1):
            assert (await sub.receive()).data == b"hello"
        await trio.sleep(1.0)  # past the probe after that message
        heartbeats = sender.counters.heartbeats_sent
        sms = receiver.counters.status_messages_sent
        await trio.sleep(20.0)
        # 20 s / 0.5 s = 40 heartbeats, 20 s / 1 s = 20 status messages (+-1 for the phase),
        # each timer met up to IDLE_SLACK late (the timer heap's idle tier: in virtual time,
        # with nothing else due, always that late)
        heartbeats_sent = sender.counters.heartbeats_sent - heartbeats
        assert 20.0 / (ECHO_HEARTBEAT_INTERVAL + IDLE_SLACK) - 1 <= heartbeats_sent <= 41
        sms_sent = receiver.counters.status_messages_sent - sms
        assert 20.0 / (ECHO_STATUS_MESSAGE_INTERVAL + IDLE_SLACK) - 1 <= sms_sent <= 21
        # The heartbeats paid for every SM: none was held back by the budget.
        assert receiver.counters.amplification_limited == 0
        assert pub.is_connected
        assert len(sub.images) == 1


async def test_a_lost_last_message_is_repaired_by_the_probe_not_the_idle_heartbeat(
    autojump_clock: trio.testing.MockClock,
) -> None:
    net = MemoryNetwork()
    async with (
        open_transport(echo_timers(), socket_factory=net) as sender,
        open_transport(echo_timers(), socket_factory=net) as receiver,
    ):
        sub = await receiver.add_subscription(CHANNEL, STREAM)
        pub = await sender.add_publication(CHANNEL, STREAM)
        await pub.wait_connected(timeout=5)
        await trio.sleep(2.0)
        lost: list[Datagram] = []

        def drop_the_message(datagram: Datagram) -> bool:
            if b"the echo" in datagram.payload and not lost:
                lost.append(datagram)
                return True
            return False

        net.intercept = drop_the_message
        sent_at = trio.current_time()
        assert pub.offer(b"the echo") > 0
        with trio.fail_after(5):
            message = await sub.receive()
        assert message.data == b"the echo"
        assert len(lost) == 1  # the first copy was lost: this is the retransmit
        # The probe 2 ms after the data made the receiver NAK at once: milliseconds, not the
        # 0.5 s idle heartbeat.
        assert trio.current_time() - sent_at < 0.05
        assert receiver.counters.naks_sent >= 1


async def test_a_silent_peer_is_found_out_within_the_documented_times(
    autojump_clock: trio.testing.MockClock,
) -> None:
    net = MemoryNetwork()
    async with (
        open_transport(echo_timers(), socket_factory=net) as sender,
        open_transport(echo_timers(), socket_factory=net) as receiver,
    ):
        gone = trio.Event()
        sub = await receiver.add_subscription(
            CHANNEL, STREAM, on_image_unavailable=lambda image: gone.set()
        )
        pub = await sender.add_publication(CHANNEL, STREAM)
        await pub.wait_connected(timeout=5)
        assert pub.offer(b"hello") > 0
        with trio.fail_after(1):
            await sub.receive()
        # From now on nothing gets through either way: each side must notice the other gone.
        net.intercept = lambda datagram: True
        silent_at = trio.current_time()
        config = echo_timers()
        with trio.fail_after(config.publication_connection_timeout + 1.5):
            await pub.wait_disconnected()
        # (not before the last SM that came was connection_timeout old)
        disconnected = trio.current_time() - silent_at
        assert config.publication_connection_timeout - 1.0 <= disconnected
        with trio.fail_after(config.image_liveness_timeout + 1.5):
            await gone.wait()
        expired = trio.current_time() - silent_at
        assert config.image_liveness_timeout - config.heartbeat_interval <= expired
        assert sub.images == []
