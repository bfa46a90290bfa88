"""A long-lived publication gives back the pages of its log that nothing can read again.

Without it every page a publication writes stays resident until its partition is cleaned three
terms on: a server's all-clients channel (a few hundred bytes of replies per session) grew in
memory for hours under churn. The pages' residency is read with mincore(2), so these tests
see what the kernel holds, not what the code believes it gave back.
"""

from __future__ import annotations

import ctypes
import random
import sys

import pytest

from echo.transport.core.logbuffer import PAGE_SIZE, TermBuffers
from echo.transport.core.logrelease import RELEASE_INTERVAL
from echo.transport.core.publication import NetworkPublication
from tests.transport.pairlink import PairLink, seeded
from tests.transport.test_publication_mutants import (
    FRAME,
    TERM,
    Wire,
    nak,
    offer,
    publication,
    sm,
)

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="mincore(2) and MADV_DONTNEED")

_libc = ctypes.CDLL(None, use_errno=True)


def resident_bytes(log: TermBuffers) -> int:
    """Bytes of the log's three terms that are in memory now (mincore)."""
    total = 0
    for term in log.maps:
        view = (ctypes.c_char * len(term)).from_buffer(term)
        try:
            pages = len(term) // PAGE_SIZE
            vector = (ctypes.c_ubyte * pages)()
            if _libc.mincore(ctypes.c_void_p(ctypes.addressof(view)), len(term), vector):
                raise OSError(ctypes.get_errno(), "mincore")
            total += sum(v & 1 for v in vector) * PAGE_SIZE
        finally:
            del view  # the mmap cannot close while a ctypes view exports it
    return total


def test_term_buffers_release_whole_pages_only_and_they_read_as_zeros() -> None:
    log = TermBuffers(TERM)
    try:
        log.terms[1][:] = b"\x07" * TERM
        assert resident_bytes(log) == TERM
        given = log.release(1, 100, 3 * PAGE_SIZE + 5)
        # [100, 3 pages + 5): the whole pages inside are pages 1 and 2
        assert given == 2 * PAGE_SIZE
        assert resident_bytes(log) == TERM - 2 * PAGE_SIZE
        assert bytes(log.maps[1][PAGE_SIZE : 3 * PAGE_SIZE]) == bytes(2 * PAGE_SIZE)
        assert bytes(log.maps[1][:PAGE_SIZE]) == b"\x07" * PAGE_SIZE
        assert bytes(log.maps[1][3 * PAGE_SIZE : 4 * PAGE_SIZE]) == b"\x07" * PAGE_SIZE
        assert log.release(1, 10, PAGE_SIZE - 1) == 0  # no whole page inside
        assert log.release(1, 0, 10 * TERM) == TERM  # clipped to the term
        assert resident_bytes(log) == 0
    finally:
        log.close()


def _acknowledged(frames: int) -> tuple[NetworkPublication, Wire, float]:
    pub = publication()
    wire = Wire()
    now = 0.0
    pub.on_status_message(sm(0), now)
    offer(pub, frames, now)
    pub.send_pending(now, wire.emit)
    assert pub.sender_position == frames * FRAME
    return pub, wire, now


def test_what_the_receiver_consumed_is_given_back_and_no_longer_resent() -> None:
    pub, wire, now = _acknowledged(24)
    assert resident_bytes(pub.log) >= 24 * FRAME
    pub.on_status_message(sm(16 * FRAME), now)  # the receiver consumed 16 frames
    assert pub.log_release.poll(pub.sender_position, pub.liveness, now) == 0  # not yet due
    now += RELEASE_INTERVAL
    assert pub.log_release.poll(pub.sender_position, pub.liveness, now) == 16 * FRAME
    assert pub.log_release.released == 16 * FRAME
    assert resident_bytes(pub.log) == 8 * FRAME
    # What it has not consumed is still there, byte for byte, and still resent on a NAK.
    assert bytes(pub.log.maps[0][16 * FRAME + 32 : 16 * FRAME + 64]) == b"m" * 32
    wire.clear()
    assert pub.on_nak(nak(20 * FRAME, FRAME), now)
    pub.poll(now, wire.emit)
    assert [(d.term_offset, d.frame_length) for d in wire.data()] == [(20 * FRAME, FRAME)]
    assert [d[32:] for d in wire.sent if len(d) > 32] == [b"m" * 992]
    # A NAK for what is gone is refused (a forged one, or a receiver that left): never zeros.
    wire.clear()
    assert not pub.on_nak(nak(5 * FRAME, FRAME), now)
    pub.poll(now, wire.emit)
    assert wire.data() == []


def test_the_slowest_receiver_holds_the_floor() -> None:
    pub, _, now = _acknowledged(24)
    pub.on_status_message(sm(20 * FRAME), now)
    pub.on_status_message(sm(8 * FRAME, receiver_id=2), now)
    pub.poll(now + RELEASE_INTERVAL, Wire().emit)
    assert pub.log_release.released == 8 * FRAME
    assert resident_bytes(pub.log) == 16 * FRAME


def test_a_recent_setup_holds_the_floor_at_what_it_announced() -> None:
    """A receiver that makes its image from a SETUP may NAK from there before its first SM."""
    pub, wire, now = _acknowledged(24)
    pub.on_status_message(sm(24 * FRAME), now)
    pub.trigger_setup()
    pub.poll(now, wire.emit)
    (setup,) = wire.setups()
    assert setup.term_offset == 24 * FRAME
    offer(pub, 6, now)
    pub.send_pending(now, wire.emit)
    pub.on_status_message(sm(30 * FRAME), now)
    timeout = pub.timers.connection_timeout
    release = pub.log_release
    assert release.floor(pub.sender_position, pub.liveness, now + timeout - 0.01) == 24 * FRAME
    assert release.floor(pub.sender_position, pub.liveness, now + timeout) == 30 * FRAME
    pub.poll(now + 1.0, wire.emit)
    assert release.released == 24 * FRAME
    pub.poll(now + timeout, wire.emit)
    assert release.released == 30 * FRAME


def test_a_long_stream_keeps_a_bounded_log_in_memory_and_arrives_intact() -> None:
    """Ten terms through a pure pair with 5 % loss each way: every message arrives whole and
    in order, and once its receiver has consumed them the publication and the image each hold
    at most the page the stream's end is in, where without the release each held every page
    it had written (all three terms once the stream had gone round)."""
    pair = PairLink(fate=seeded(random.Random(34), loss=0.05))
    pair.connect()
    publication = pair.publication
    # The first SETUP holds the floor at 0 for the connection timeout (see the test above).
    settled = pair.now + publication.timers.connection_timeout
    rng = random.Random(34)
    sent: list[bytes] = []
    resident: list[int] = []
    image_resident: list[int] = []
    while publication.position < 10 * TERM:
        batch = [bytes([len(sent) % 251]) * rng.randrange(1, 3000) for _ in range(20)]
        pair.offer_all(batch)
        sent += batch
        due = len(sent)
        pair.run_until(lambda: len(pair.received.get(publication.session_id, [])) == due)  # noqa: B023
        # (a release interval and the receiver's SM interval: its last position has reached us)
        pair.advance(RELEASE_INTERVAL + 0.2)
        if pair.now > settled:
            resident.append(resident_bytes(publication.log))
            image_resident.append(resident_bytes(pair.image.log))
    assert pair.received[publication.session_id] == sent
    assert publication.log_release.released == publication.position
    assert pair.image.released == pair.image.subscriber_position == publication.position
    assert len(resident) > 10
    assert max(resident) <= PAGE_SIZE
    assert max(image_resident) <= PAGE_SIZE


def test_an_image_keeps_the_term_of_a_message_part_way_assembled() -> None:
    """Its fragments are views of the term until the END arrives: giving their pages back
    would join zeros into the message."""
    pair = PairLink()
    pair.connect()
    pair.consuming = False
    first = b"a" * 8000  # six fragments
    pair.offer_all([first])
    pair.pump()
    image = pair.image
    got: list[bytes] = []
    image.poll_messages(got.append, 4)  # four of its six fragments: past the first page
    assert image.assembler.in_progress and got == []
    assert image.subscriber_position > PAGE_SIZE
    assert image.release_consumed(pair.now) == 0
    while not got:
        image.poll_messages(got.append, 1)
    assert got == [first]
    # Complete: what it consumed goes back (all but the page its position is in).
    given = image.release_consumed(pair.now)
    assert given == image.subscriber_position - image.subscriber_position % PAGE_SIZE
    assert resident_bytes(image.log) <= PAGE_SIZE
