"""Wire rules that current Aeron drivers (1.48 to 1.53) apply to what they receive, each tested
from its own text (Aeron's C driver sources are quoted by function name).

Most were already echo's: frame version 0 (`parse_datagram_untrusted`), DATA/PAD chains of
whole 32-byte-aligned frames no longer than the datagram, unknown frame types dropped, ERR frames
with a group tag and up to 1023 bytes of text (tests/transport/test_frames*.py), SETUP term
lengths a power of two, offsets aligned and MTUs 32-aligned (tests/transport/test_receiver*.py),
retransmits capped at a multiple of the receiver window (tests/transport/test_retransmit*.py).
Here are the ones echo lacked. (One rule echo does not follow, the status-message window
of Aeron 1.51, is explained in docs/transport.md.)
"""

from __future__ import annotations

from echo.transport.core.frames import (
    BEGIN_END_AND_EOS_FLAGS,
    EOS_FLAG,
    REVOKED_FLAG,
    DataHeader,
    Nak,
    parse_datagram_untrusted,
)
from echo.transport.core.image import ImageState
from echo.transport.core.receiver import ImageUnavailable
from tests.transport.pairlink import (
    DELIVER,
    DROP,
    Direction,
    Fate,
    FateFn,
    PairLink,
)

SESSION = 0x1EE7
STREAM = 1001
TERM = 64 * 1024


def _nak(offset: int, length: int) -> bytes:
    return Nak(
        session_id=SESSION, stream_id=STREAM, term_id=0, term_offset=offset, length=length
    ).encode()


def _connected_with_data() -> PairLink:
    pair = PairLink(term_length=TERM)
    pair.connect()
    for index in range(4):
        pair.offer(bytes([index]) * 500)
    pair.pump()
    return pair


def test_a_zero_length_nak_is_valid_and_asks_for_nothing_a_negative_one_is_invalid() -> None:
    # aeron_retransmit_handler_is_invalid: "term_offset > term_length - header || term_offset
    # < 0 || length < 0" counts an invalid packet; aeron_retransmit_handler_on_nak acts only on
    # a valid NAK "&& 0 != length".
    pair = _connected_with_data()
    counters = pair.sender_counters
    pair.inject_to_sender(_nak(0, 0))
    pair.poll_sender()
    assert counters.retransmits_sent == 0
    assert counters.invalid_by_reason["bad_nak"] == 0
    pair.inject_to_sender(_nak(0, -32))
    pair.poll_sender()
    assert counters.retransmits_sent == 0
    assert counters.invalid_by_reason["bad_nak"] == 1
    pair.inject_to_sender(_nak(0, 544))  # and a real one is still answered
    pair.poll_sender()
    assert counters.retransmits_sent == 1


def _lose_forever(offset: int) -> FateFn:
    """The data frame at `offset` never arrives (its original and every resend)."""

    def fate(which: Direction, index: int, datagram: bytes) -> Fate:
        if which == "data":
            frame = parse_datagram_untrusted(datagram)
            if isinstance(frame, DataHeader) and frame.frame_length and frame.term_offset == offset:
                return DROP
        return DELIVER

    return fate


def _heartbeat(pair: PairLink, flags: int) -> bytes:
    position = pair.publication.sender_position
    return DataHeader(
        frame_length=0,
        flags=flags,
        term_offset=position % TERM,
        session_id=SESSION,
        stream_id=STREAM,
        term_id=position // TERM,
    ).encode()


def _ended(pair: PairLink) -> list[ImageState]:
    return [event.reason for event in pair.events if isinstance(event, ImageUnavailable)]


def test_a_revoked_stream_ends_at_once_where_its_data_is_whole() -> None:
    # Aeron 1.48 (aeron_publication_image_insert_packet): a heartbeat with the EOS flag and
    # "aeron_publication_image_is_revoked(buffer, length)" (flags & REVOKED, 0x10) marks the
    # publication revoked, counts publication_images_revoked, and the image goes to DRAINING at
    # once, not when it is complete: what the publisher had not sent is gone.
    frame = 1056  # a 1,000-byte message with its header, aligned
    pair = PairLink(term_length=TERM, fate=_lose_forever(2 * frame))
    pair.connect()
    for index in range(5):
        pair.offer(bytes([index]) * 1000)
    pair.pump()
    assert pair.received[SESSION] == [bytes([0]) * 1000, bytes([1]) * 1000]  # stuck at the gap
    start = pair.now
    pair.inject_to_receiver(_heartbeat(pair, BEGIN_END_AND_EOS_FLAGS | REVOKED_FLAG))
    pair.pump()
    assert _ended(pair) == [ImageState.END_OF_STREAM]
    assert pair.now == start  # at once, not after the image's liveness timeout
    assert pair.receiver_counters.images_revoked == 1
    assert pair.received[SESSION] == [bytes([0]) * 1000, bytes([1]) * 1000]


def test_the_eos_bit_alone_ends_a_stream() -> None:
    # aeron_publication_image_is_end_of_stream: "flags & AERON_DATA_HEADER_EOS_FLAG" (not the
    # whole BEGIN | END | EOS byte that Aeron's own publications happen to send).
    pair = PairLink(term_length=TERM)
    pair.connect()
    for index in range(3):
        pair.offer(bytes([index]) * 100)
    pair.pump()
    pair.inject_to_receiver(_heartbeat(pair, EOS_FLAG))
    pair.pump()
    assert _ended(pair) == [ImageState.END_OF_STREAM]
    assert len(pair.received[SESSION]) == 3
    assert pair.receiver_counters.images_revoked == 0
