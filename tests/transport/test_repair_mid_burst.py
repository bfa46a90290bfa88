"""A NAK is acted on at once, whatever else the sender's socket holds and whatever it is doing.

Seen against a current Aeron C receiver (1.52) with 10 % loss: a lost range of the first window,
NAKed while echo was still sending its first burst, was resent tens of milliseconds after that
NAK while the receiver re-NAKed it about once a millisecond. The NAK had been taken on, but the
driver read on (up to its read budget of datagrams: the re-NAKs and status messages queued
behind it) before it polled the publication, and under a busy burst the poll came with a later
timer. Aeron's unicast retransmit delay is 0: the repair must go out before the socket is read
further. Here a hand-played receiver on the in-memory network queues a NAK and a run of status
messages behind it on the sender's socket while the application keeps offering (a burst), and
the test looks at what the sender had read when the resend left.
"""

from __future__ import annotations

import trio
import trio.testing

from echo.transport import TransportConfig, open_transport
from echo.transport.frames import Nak, StatusMessage, parse_datagram_untrusted
from echo.transport.testing import Datagram, MemoryNetwork
from echo.transport.wireformat import DataHeader, Setup

PORT = 40123
STREAM = 1001
RECEIVER = ("127.0.0.1", PORT)
BEHIND = 100  # datagrams queued behind the NAK: fewer than the driver's read budget


def status(setup: Setup, offset: int) -> bytes:
    return StatusMessage(
        session_id=setup.session_id,
        stream_id=setup.stream_id,
        consumption_term_id=setup.initial_term_id,
        consumption_term_offset=offset,
        receiver_window=setup.term_length // 2,
        receiver_id=77,
    ).encode()


async def test_a_nak_mid_burst_is_repaired_before_the_datagrams_behind_it_are_read(
    autojump_clock: trio.testing.MockClock,
) -> None:
    net = MemoryNetwork()
    resent = trio.Event()
    seen: dict[str, object] = {}
    data_at_zero = 0

    async with open_transport(TransportConfig(validate_addresses=False), socket_factory=net) as t:
        counters = t.counters

        def intercept(datagram: Datagram) -> bool:
            # Every datagram the sender puts on the wire passes here as it is sent.
            nonlocal data_at_zero
            if datagram.destination != RECEIVER:
                return False
            frame = parse_datagram_untrusted(datagram.payload)
            if isinstance(frame, DataHeader) and frame.frame_length and frame.term_offset == 0:
                data_at_zero += 1
                seen["length"] = (frame.frame_length + 31) // 32 * 32
                if data_at_zero == 2:  # the first frame again: the resend
                    seen["sms_read"] = counters.status_messages_received - seen["sms_before"]
                    seen["at"] = trio.current_time()
                    resent.set()
            return False

        with net.open_socket(RECEIVER) as receiver:
            publication = await t.add_publication(f"aeron:udp?endpoint=127.0.0.1:{PORT}", STREAM)
            await trio.lowlevel.wait_readable(receiver)
            payload, sender = receiver.recvfrom(65536)
            setup = parse_datagram_untrusted(payload)
            assert isinstance(setup, Setup)
            receiver.sendto(status(setup, 0), sender)
            await publication.wait_connected(timeout=5)
            net.intercept = intercept

            async def burst() -> None:
                # The application offers without pause, yielding as an offer loop does (the
                # window is half a term: the burst is still on when the resend leaves).
                while not resent.is_set():
                    if publication.offer(b"m" * 1000) < 0:
                        await resent.wait()  # back-pressured: the test has failed by then
                    await trio.lowlevel.checkpoint()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(burst)
                while data_at_zero == 0:  # the first data frame is on the wire
                    await trio.lowlevel.checkpoint()
                # The receiver lost it: one NAK, then a run of status messages (and, from a real
                # receiver, its re-NAKs) that reach the sender's socket before it reads again.
                nak = Nak(
                    session_id=setup.session_id,
                    stream_id=setup.stream_id,
                    term_id=setup.initial_term_id,
                    term_offset=0,
                    length=seen["length"],
                ).encode()
                seen["sms_before"] = counters.status_messages_received
                nak_at = trio.current_time()
                receiver.sendto(nak, sender)
                for _ in range(BEHIND):
                    receiver.sendto(status(setup, 0), sender)
                with trio.fail_after(1):
                    await resent.wait()
                nursery.cancel_scope.cancel()

    assert counters.naks_received >= 1
    assert counters.retransmits_sent >= 1
    # The repair left before the sender read what came behind the NAK (the old driver read all
    # of it first, then polled), and at once in the transport's time.
    assert seen["sms_read"] < BEHIND
    assert seen["at"] == nak_at
