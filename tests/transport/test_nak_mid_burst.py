"""A NAK is acted on at once, whatever else the sender's socket holds.

Seen against Aeron 1.52.2's C driver with 10 % loss both ways: a current Aeron receiver re-NAKs
an open gap on every scan of its loss detector, so while echo was busy with its first burst
NAKs for one gap queued on echo's socket faster than echo read them. The driver read a busy
socket until it was empty or 256 datagrams had been read, and only then let the publication
act: the first NAK scheduled the resend, the next 255 were duplicates of a resend not yet sent
(ignored), and the resend left only after the last of them was read, 15-236 ms after the first
under that load (a receiver at 10 % loss NAKed the same gap 258 times meanwhile).

Here a hand-played receiver on the in-memory network does what that receiver did: it NAKs an
open gap once for every datagram that arrives after it. Each read of echo's sockets takes
READ_COST of virtual time, as reading does on a loaded machine (the driver's clock is the
run's MockClock), so the time a resend waits behind the reads is visible in virtual time.

The pure publication (tests/transport/pairlink.py) for the rest of "whatever the sender is
doing": a resend that meets a full socket buffer, or is longer than one scan may send, is not
taken for sent; what is left stays due.
"""

from __future__ import annotations

import socket
from typing import Any

import trio
import trio.testing

from echo.transport import TransportConfig, open_transport
from echo.transport.core.frames import parse_datagram_untrusted
from echo.transport.core.publication import WOULD_BLOCK
from echo.transport.core.scanner import MAX_DATAGRAMS_PER_SCAN
from echo.transport.core.wireformat import DataHeader, Nak, Setup, StatusMessage
from echo.transport.testing import Datagram, MemoryNetwork, MemorySocket
from tests.transport.pairlink import PairLink

PORT = 40125
STREAM = 1001
#: one message per datagram: a 1,376-byte payload makes a 1,408-byte frame (the MTU)
PAYLOAD = 1376
FRAME = 1408
#: the receiver's window (Aeron's default): about 93 datagrams
WINDOW = 128 * 1024
#: the datagram lost on its first transmission: inside the first window, after the first
#: status message (a quarter window, 24 datagrams), so the socket has just been read
LOST = 30 * FRAME
#: what one read of a socket costs (in virtual time), as on a busy 2-core machine
READ_COST = 0.00005
#: a current Aeron receiver NAKs an open unicast gap again about a millisecond later: a
#: resend that takes longer than that is answered by a second NAK for nothing
REPAIR_BOUND = 0.001


class SlowReads:
    """A memory socket whose every read takes READ_COST of the run's virtual time."""

    def __init__(self, sock: MemorySocket, clock: trio.testing.MockClock) -> None:
        self._sock = sock
        self._clock = clock

    def recvfrom_into(self, *args: Any) -> Any:
        result = self._sock.recvfrom_into(*args)  # BlockingIOError: nothing read, no cost
        self._clock.jump(READ_COST)
        return result

    def recvmsg_into(self, *args: Any) -> Any:
        result = self._sock.recvmsg_into(*args)
        self._clock.jump(READ_COST)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class GapRecorder:
    """What the network saw of the lost datagram: its loss, the first NAK for it, the resend."""

    def __init__(self) -> None:
        self.dropped = False
        self.first_nak_at: float | None = None
        self.resent_at: float | None = None
        self.resent = trio.Event()

    def intercept(self, datagram: Datagram) -> bool:
        frame = parse_datagram_untrusted(datagram.payload)
        if isinstance(frame, Nak) and self.first_nak_at is None:
            self.first_nak_at = datagram.sent_at
        if not isinstance(frame, DataHeader) or not frame.frame_length:
            return False
        if frame.term_offset != LOST:
            return False
        if not self.dropped:
            self.dropped = True
            return True  # the first transmission is lost
        if self.resent_at is None:
            self.resent_at = datagram.sent_at
            self.resent.set()
        return False


async def renaking_receiver(sock: MemorySocket) -> None:
    """A unicast receiver as a current Aeron's behaves under loss: an SM when the publication
    appears and after each quarter window consumed; while a gap is open, a NAK for it on every
    datagram that arrives after it. Like Aeron's receiver agent, each wake-up reads every
    datagram waiting (its duty cycle), so its NAKs leave in a batch."""
    setup: Setup | None = None
    rebuilt = 0  # the term offset up to which everything arrived (one term in this test)
    reported = 0
    arrived: set[int] = set()
    while True:
        await trio.lowlevel.wait_readable(sock)
        while sock.queued:
            payload, sender = sock.recvfrom(65536)
            frame = parse_datagram_untrusted(payload)
            if isinstance(frame, Setup):
                setup = frame
            elif setup is None or not isinstance(frame, DataHeader) or not frame.frame_length:
                continue
            else:
                arrived.add(frame.term_offset)
                while rebuilt in arrived:
                    rebuilt += FRAME
                if frame.term_offset > rebuilt:
                    nak = Nak(
                        setup.session_id, setup.stream_id, setup.active_term_id, rebuilt, FRAME
                    )
                    sock.sendto(nak.encode(), sender)
                if rebuilt - reported < WINDOW // 4:
                    continue
            reported = rebuilt
            status = StatusMessage(
                session_id=setup.session_id,
                stream_id=setup.stream_id,
                consumption_term_id=setup.active_term_id,
                consumption_term_offset=rebuilt,
                receiver_window=WINDOW,
                receiver_id=99,
                flags=0,
            )
            sock.sendto(status.encode(), sender)


async def test_a_nak_queued_behind_more_naks_is_resent_before_they_are_read(
    autojump_clock: trio.testing.MockClock,
) -> None:
    net = MemoryNetwork()
    gap = GapRecorder()
    net.intercept = gap.intercept

    def slow_sockets(bind: tuple[str, int], family: int, rcvbuf: int, sndbuf: int) -> Any:
        return SlowReads(net.open_socket(bind, family, rcvbuf), autojump_clock)

    config = TransportConfig(validate_addresses=False, linger=0.5)
    async with open_transport(config, socket_factory=slow_sockets) as transport:
        with net.open_socket(("127.0.0.1", PORT), socket.AF_INET) as receiver:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(renaking_receiver, receiver)
                publication = await transport.add_publication(
                    f"aeron:udp?endpoint=127.0.0.1:{PORT}", STREAM
                )
                await publication.wait_connected(timeout=5)
                with trio.fail_after(5):
                    for index in range(200):  # more than a window: a burst, then more
                        await publication.send(index.to_bytes(8, "little") + bytes(PAYLOAD - 8))
                    await gap.resent.wait()
                nursery.cancel_scope.cancel()
        naks = transport.counters.naks_received

    assert gap.dropped and gap.first_nak_at is not None and gap.resent_at is not None
    assert naks > 20  # the receiver re-NAKed the gap for each datagram after it
    waited = gap.resent_at - gap.first_nak_at
    assert waited <= REPAIR_BOUND, (
        f"resent {waited * 1000:.2f} ms after the first NAK, behind {naks} NAKs read"
    )


# ----------------------------------------------------------------- the pure publication


def _resent(pair: PairLink, since: int) -> list[int]:
    """The term offsets of the data datagrams the sender sent after the first `since`."""
    return [
        frame.term_offset
        for sent in pair.sent("data")[since:]
        if isinstance(frame := sent.frame, DataHeader) and frame.frame_length
    ]


def _nak(pair: PairLink, offset: int, length: int) -> bytes:
    publication = pair.publication
    return Nak(
        publication.session_id,
        publication.stream_id,
        publication.initial_term_id,
        offset,
        length,
    ).encode()


def test_a_resend_that_meets_a_full_socket_is_sent_when_it_drains() -> None:
    pair = PairLink()
    pair.connect()
    for index in range(4):
        pair.offer(index.to_bytes(8, "little") + bytes(PAYLOAD - 8))
    pair.pump()
    sent = len(pair.sent("data"))
    pair.inject_to_sender(_nak(pair, FRAME, 2 * FRAME))

    def full(datagram: bytes | memoryview, address: object, segment: int = 0) -> int:
        return WOULD_BLOCK

    pair.send_endpoint.poll(pair.now, full)  # the resend meets a full socket buffer
    assert pair.send_endpoint.next_deadline(pair.now) == pair.now  # still due
    pair.inject_to_sender(_nak(pair, FRAME, 2 * FRAME))  # the receiver's NAK again
    pair.poll_sender()  # the socket has room again
    assert _resent(pair, sent) == [FRAME, 2 * FRAME]  # resent once, whole


def test_a_resend_longer_than_one_scan_goes_out_whole_over_the_next_polls() -> None:
    pair = PairLink(term_length=4 << 20, rcv_wnd=2 << 20)
    pair.connect()
    count = MAX_DATAGRAMS_PER_SCAN + 100
    for index in range(count):
        pair.offer(index.to_bytes(8, "little") + bytes(PAYLOAD - 8))
    pair.pump()
    sent = len(pair.sent("data"))
    pair.inject_to_sender(_nak(pair, 0, count * FRAME))  # one NAK for all of it
    pair.poll_sender()
    assert len(_resent(pair, sent)) == MAX_DATAGRAMS_PER_SCAN  # one scan's worth ...
    assert pair.send_endpoint.next_deadline(pair.now) == pair.now  # ... and the rest is due
    pair.poll_sender()
    assert _resent(pair, sent) == [index * FRAME for index in range(count)]
