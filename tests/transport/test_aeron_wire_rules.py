"""Wire rules that current Aeron drivers (1.48 to 1.53) apply to what they receive, each tested
from its own text (Aeron's C driver sources are quoted by function name).

Most were already echo's: frame version 0 (`parse_datagram_untrusted`), DATA/PAD chains of
whole 32-byte-aligned frames no longer than the datagram, unknown frame types dropped, ERR frames
with a group tag and up to 1023 bytes of text (tests/transport/test_frames*.py), SETUP term
lengths a power of two, offsets aligned and MTUs 32-aligned (tests/transport/test_receiver*.py),
retransmits capped at a multiple of the receiver window (tests/transport/test_retransmit*.py).
Here are the two the sender side lacked.
"""

from __future__ import annotations

from echo.transport.frames import Nak, StatusMessage
from tests.transport.pairlink import RECEIVER_ID, PairLink

SESSION = 0x1EE7
STREAM = 1001
TERM = 64 * 1024


def _nak(offset: int, length: int) -> bytes:
    return Nak(
        session_id=SESSION, stream_id=STREAM, term_id=0, term_offset=offset, length=length
    ).encode()


def _sm(position: int, flags: int = 0) -> bytes:
    return StatusMessage(
        session_id=SESSION,
        stream_id=STREAM,
        consumption_term_id=position // TERM,
        consumption_term_offset=position % TERM,
        receiver_window=TERM // 2,
        receiver_id=RECEIVER_ID,
        flags=flags,
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


def test_a_status_message_more_than_half_a_term_from_the_sender_position_is_rejected() -> None:
    # aeron_network_publication_is_valid_status_message (Aeron 1.51): valid when "sm_position
    # >= snd_pos - max_transmission_window && sm_position <= snd_pos + max_transmission_window",
    # the window being term_buffer_length >> 1; the send endpoint counts the rest in
    # status_messages_rejected and never hands them to the publication.
    pair = _connected_with_data()
    publication = pair.publication
    counters = pair.sender_counters
    sent = publication.sender_position
    limit = publication.sender_limit
    far_ahead = sent + TERM // 2 + 32
    pair.inject_to_sender(_sm(far_ahead))
    assert counters.invalid_by_reason["sm_out_of_window"] == 1
    assert publication.sender_limit == limit  # it moved nothing
    # At exactly half a term it is valid (and clamped to what was sent).
    pair.inject_to_sender(_sm(sent + TERM // 2))
    assert counters.invalid_by_reason["sm_out_of_window"] == 1
    assert publication.sender_limit >= limit
