"""The receiver's image (PublicationImage) rule by rule, driven by hand: what mutation testing
(./dev mutate image) showed the pure pair's tests did not hold.

Each test builds one image, hands it DATA frames and heartbeats as the receive endpoint would,
with a scripted `now`, and reads what it sends (SMs, NAKs, RSP_SETUPs) off a recording wire.
The rules are Aeron's PublicationImage's (term rebuild, the window, the NAK timing, the
end-of-stream) plus this transport's own: the anti-amplification budget and the heartbeat
window-edge rule.
"""

from __future__ import annotations

import math
import random

from echo.transport.core.config import ReceiverTimers
from echo.transport.core.counters import Counters
from echo.transport.core.frames import (
    BEGIN_END_AND_EOS_FLAGS,
    DATA_HEADER_LENGTH,
    DATA_HEADER_STRUCT,
    SETUP_LENGTH,
    SM_EOS_FLAG,
    SM_GTAG_LENGTH,
    SM_LENGTH,
    UNFRAGMENTED_FLAGS,
    FrameType,
    Nak,
    ResponseSetup,
    StatusMessage,
    parse_datagram_untrusted,
)
from echo.transport.core.image import AMPLIFICATION_FACTOR, ImageState, PublicationImage
from echo.transport.core.loss import group_nak_delay
from echo.transport.core.message import Message
from echo.transport.core.status import PROBE_REPEAT

TERM = 64 * 1024
HALF_TERM = TERM // 2
MTU = 1408
SESSION, STREAM, INITIAL = 77, 1001, 5
FRAME = 1024  # every DATA datagram here: one unfragmented frame, 992 bytes of payload
SOURCE = ("198.18.0.9", 40123)
NAK_DELAY = ReceiverTimers().nak_delay
SM_INTERVAL = ReceiverTimers().status_message_interval


class Wire:
    """A `send` that records what the image sends and returns `result` (1: it left)."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, object]] = []
        self.result = 1

    def __call__(self, datagram: bytes | memoryview, address: object) -> int:
        if self.result > 0:
            self.sent.append((bytes(datagram), address))
        return self.result

    def frames(self) -> list[object]:
        return [parse_datagram_untrusted(data) for data, _ in self.sent]

    def sms(self) -> list[StatusMessage]:
        return [f for f in self.frames() if isinstance(f, StatusMessage)]

    def naks(self) -> list[Nak]:
        return [f for f in self.frames() if isinstance(f, Nak)]

    def rsp_setups(self) -> list[ResponseSetup]:
        return [f for f in self.frames() if isinstance(f, ResponseSetup)]

    def clear(self) -> None:
        self.sent.clear()


def make_image(
    *, now: float = 0.0, active_term_id: int = INITIAL, **kwargs: object
) -> PublicationImage:
    options: dict[str, object] = {
        "session_id": SESSION,
        "stream_id": STREAM,
        "initial_term_id": INITIAL,
        "active_term_id": active_term_id,
        "term_offset": 0,
        "term_length": TERM,
        "mtu": MTU,
        "control_address": SOURCE,
        "receiver_id": 0xABC,
        "counters": Counters(),
        "now": now,
    }
    options.update(kwargs)
    return PublicationImage(**options)  # type: ignore[arg-type]


def payload(position: int, size: int = FRAME - DATA_HEADER_LENGTH) -> bytes:
    """Distinct per position: a message delivered from the wrong place cannot pass."""
    return position.to_bytes(8, "little") * (size // 8)


def datagram(position: int, size: int = FRAME) -> bytes:
    term_id, offset = INITIAL + position // TERM, position % TERM
    header = DATA_HEADER_STRUCT.pack(
        size, 0, UNFRAGMENTED_FLAGS, FrameType.DATA, offset, SESSION, STREAM, term_id, 0
    )
    return header + payload(position, size - DATA_HEADER_LENGTH)


def receive(
    image: PublicationImage, position: int, now: float, *, size: int = FRAME, whole: bool = False
) -> bool:
    term_id, offset = INITIAL + position // TERM, position % TERM
    return image.on_data(
        False, UNFRAGMENTED_FLAGS, offset, term_id, datagram(position, size), now, whole
    )


def receive_run(image: PublicationImage, position: int, count: int, now: float) -> bool:
    """`count` whole frames from `position` read together (UDP GRO): the receiver's fast path."""
    run = b"".join(datagram(position + i * FRAME) for i in range(count))
    term_id, offset = INITIAL + position // TERM, position % TERM
    return image.on_data(False, UNFRAGMENTED_FLAGS, offset, term_id, run, now, whole_data=True)


def heartbeat(
    image: PublicationImage, position: int, now: float, flags: int = UNFRAGMENTED_FLAGS
) -> bool:
    term_id, offset = INITIAL + position // TERM, position % TERM
    header = DATA_HEADER_STRUCT.pack(
        0, 0, flags, FrameType.DATA, offset, SESSION, STREAM, term_id, 0
    )
    return image.on_data(True, flags, offset, term_id, header, now)


def consume(image: PublicationImage, fragment_limit: int = 64) -> list[bytes]:
    got: list[bytes] = []
    while image.poll_messages(got.append, fragment_limit) or image.rebuild_position > (
        image.subscriber_position
    ):
        pass
    return got


def stream_to(image: PublicationImage, wire: Wire, end: int, now: float) -> list[bytes]:
    """Receive every frame from the rebuild position up to `end` in order, consuming and
    sending SMs whenever the sender would be at the window's edge; returns what was read."""
    got: list[bytes] = []
    position = image.rebuild_position
    while position < end:
        if position + FRAME > image.last_sm_position + HALF_TERM:
            got += consume(image)
            before = image.last_sm_position
            image.poll(now, wire)
            assert image.last_sm_position > before, "the SM did not open the window"
            continue
        receive(image, position, now)
        position += FRAME
    return got


def expected(start: int, end: int) -> list[bytes]:
    return [payload(p) for p in range(start, end, FRAME)]


# ----------------------------------------------------------------------- a new image


def test_a_new_image_is_active_at_its_join_position_with_no_request_and_no_response() -> None:
    image = make_image(active_term_id=INITIAL + 2)
    assert image.join_position == 2 * TERM
    assert image.subscriber_position == image.rebuild_position == image.hwm == 2 * TERM
    assert image.state is ImageState.ACTIVE
    assert image.is_group is False
    assert image.starved is False
    # A request image only once its SETUP says so (ReceiveEndpoint sets it), and no
    # response publication answers it until one is made for it (response.py).
    assert image.requested_response is False
    assert image.response_session_id is None
    assert image.next_response_setup == math.inf


def test_a_new_image_naks_a_gap_after_the_unicast_delay_and_pads_nothing() -> None:
    image, wire = make_image(rng=random.Random(1)), Wire()
    image.poll(0.0, wire)
    receive(image, 0, 0.0)
    receive(image, 2 * FRAME, 0.0)  # the frame at FRAME is lost
    image.poll(0.0, wire)
    assert wire.naks() == []
    image.poll(NAK_DELAY, wire)  # unicast (not a group): Aeron's fixed first NAK delay
    assert [(n.term_id, n.term_offset, n.length) for n in wire.naks()] == [(INITIAL, FRAME, FRAME)]
    # reliable unless told: the gap is not padded over, nothing past it is delivered
    assert consume(image) == expected(0, FRAME)


def test_a_group_image_draws_its_nak_delay_from_the_rng_it_was_given() -> None:
    seed = 7
    delay = group_nak_delay(random.Random(seed), 0.01, 10)
    assert delay > 2 * NAK_DELAY
    image, wire = make_image(is_group=True, rng=random.Random(seed)), Wire()
    image.poll(0.0, wire)
    receive(image, 0, 0.0)
    receive(image, 2 * FRAME, 0.0)
    image.poll(0.0, wire)  # the gap is found now and waits its random delay
    image.poll(delay * 0.999, wire)
    assert wire.naks() == []
    image.poll(delay, wire)
    assert [n.term_offset for n in wire.naks()] == [FRAME]


# ----------------------------------------------------------------------- data and the window


def test_a_datagram_that_runs_past_the_end_of_its_term_is_dropped_as_invalid() -> None:
    image, wire = make_image(), Wire()
    stream_to(image, wire, TERM - 2 * FRAME, 0.0)
    consume(image)
    image.poll(0.01, wire)  # the window now reaches well into the next term
    before = image.hwm
    assert receive(image, TERM - FRAME, 0.02, size=2 * FRAME)  # 1 KiB beyond the term's end
    assert image.counters.invalid_by_reason["beyond_term"] == 1
    assert image.counters.invalid_frames == 1
    assert image.hwm == before


def test_duplicates_are_counted_one_each() -> None:
    image, wire = make_image(), Wire()
    image.poll(0.0, wire)
    receive(image, 0, 0.0)
    receive(image, 0, 0.0)
    receive(image, 0, 0.0)
    assert image.counters.duplicate_data == 2
    assert consume(image) == expected(0, FRAME)


def test_in_order_data_needs_no_poll_but_a_gap_a_due_sm_and_end_of_stream_do() -> None:
    image, wire = make_image(), Wire()
    image.poll(0.0, wire)  # the first SM; the next is due at SM_INTERVAL
    assert receive(image, 0, 0.01) is False
    assert receive(image, 2 * FRAME, 0.01) is True  # a gap: loss detection must look
    image.poll(0.01, wire)
    assert image.loss.gaps
    assert receive(image, FRAME, 0.01) is True  # fills it: its NAK timer must be dropped
    image.poll(0.02, wire)
    assert receive(image, 3 * FRAME, 0.03) is False
    assert receive(image, 4 * FRAME, SM_INTERVAL) is True  # the periodic SM falls due now
    image.poll(SM_INTERVAL, wire)
    heartbeat(image, 6 * FRAME, 0.21, BEGIN_END_AND_EOS_FLAGS)
    assert receive(image, 5 * FRAME, 0.22) is True  # end of stream known: poll to finish


def test_a_run_that_fills_a_gap_carries_the_rebuild_over_the_data_beyond_it() -> None:
    image, wire = make_image(), Wire()
    image.poll(0.0, wire)
    receive(image, 0, 0.0)
    receive(image, 4 * FRAME, 0.0)
    receive(image, 5 * FRAME, 0.0)
    receive_run(image, FRAME, 3, 0.001)  # the retransmit of [FRAME, 4 * FRAME) in one read
    assert image.rebuild_position == 6 * FRAME
    assert consume(image) == expected(0, 6 * FRAME)


# ----------------------------------------------------------------------- heartbeats


def test_heartbeats_are_counted_one_each() -> None:
    image, wire = make_image(), Wire()
    image.poll(0.0, wire)
    heartbeat(image, 0, 0.1)
    heartbeat(image, 0, 0.2)
    assert image.counters.heartbeats_received == 2


def test_a_heartbeat_exactly_at_the_window_edge_reveals_the_lost_tail_before_it() -> None:
    image, wire = make_image(), Wire()
    image.poll(0.0, wire)  # SM at 0: the sender may send up to half a term
    for position in range(0, 4 * FRAME, FRAME):
        receive(image, position, 0.0)
    heartbeat(image, HALF_TERM, 0.01)  # Aeron: over-run only beyond last SM + window
    assert image.hwm == HALF_TERM
    image.poll(0.01, wire)
    image.poll(0.01 + NAK_DELAY, wire)
    assert [(n.term_offset, n.length) for n in wire.naks()] == [(4 * FRAME, HALF_TERM - 4 * FRAME)]


def test_a_heartbeat_past_the_window_edge_inside_a_term_is_ignored() -> None:
    image, wire = make_image(), Wire()
    image.poll(0.0, wire)
    receive(image, 0, 0.0)
    heartbeat(image, HALF_TERM + 32, 0.01)  # no sender stops there: forged or stale
    assert image.hwm == FRAME
    image.poll(0.01, wire)
    image.poll(0.1, wire)
    assert wire.naks() == []


def test_a_heartbeat_at_a_term_start_a_whole_term_past_the_edge_is_ignored() -> None:
    image, wire = make_image(), Wire()
    stream_to(image, wire, HALF_TERM, 0.0)
    consume(image)
    image.poll(0.01, wire)
    assert image.last_sm_position == HALF_TERM  # the window ends at the next term's start
    # The edge rule covers a sender that skipped the term's tail with a PAD and waits at the
    # next term's start (< one term past the edge); two terms on is no such sender.
    heartbeat(image, HALF_TERM + HALF_TERM + TERM, 0.02)
    assert image.hwm == HALF_TERM
    image.poll(0.02, wire)
    image.poll(0.1, wire)
    assert wire.naks() == []


def test_a_probe_repeated_where_everything_was_consumed_gets_an_sm_at_once() -> None:
    # A closing publication waits, at its last position, for an SM that proves delivery, and
    # probes from there until it gets one (publication.py): the receiver read everything, so
    # the repeat is answered now, not at the periodic SM. The single probe that follows each
    # burst of data is not answered: that SM was a third datagram for every message.
    image, wire = make_image(), Wire()
    image.poll(0.0, wire)
    for position in range(0, 4 * FRAME, FRAME):
        receive(image, position, 0.0)
    consume(image)
    image.poll(0.005, wire)
    assert len(wire.sms()) == 1  # a quarter window not yet consumed: no SM for it alone
    heartbeat(image, 4 * FRAME, 0.01)
    image.poll(0.01, wire)
    assert len(wire.sms()) == 1  # one heartbeat at the tail: the probe after data
    heartbeat(image, 4 * FRAME, 0.012)
    image.poll(0.012, wire)
    sms = wire.sms()
    assert len(sms) == 2 and sms[-1].consumption_term_offset == 4 * FRAME
    # Idle heartbeats from the same position, further apart than a probe's repeat, are not
    # answered either.
    heartbeat(image, 4 * FRAME, 0.012 + 2 * PROBE_REPEAT)
    image.poll(0.012 + 2 * PROBE_REPEAT, wire)
    assert len(wire.sms()) == 2


# ----------------------------------------------------------------------- loss


def test_a_gap_in_a_later_term_is_naked_with_that_terms_id() -> None:
    image, wire = make_image(), Wire()
    stream_to(image, wire, TERM + 2 * FRAME, 0.0)
    receive(image, TERM + 3 * FRAME, 0.0)
    image.poll(0.001, wire)
    image.poll(0.001 + NAK_DELAY, wire)
    assert [(n.term_id, n.term_offset) for n in wire.naks()] == [(INITIAL + 1, 2 * FRAME)]


def test_naks_are_counted_one_each() -> None:
    image, wire = make_image(), Wire()
    image.poll(0.0, wire)
    receive(image, 0, 0.0)
    receive(image, 2 * FRAME, 0.0)
    receive(image, 4 * FRAME, 0.0)  # two gaps, each NAKed
    image.poll(0.0, wire)
    image.poll(NAK_DELAY, wire)
    assert len(wire.naks()) == 2
    assert image.counters.naks_sent == 2


def test_a_nak_lost_on_the_way_out_is_timed_as_sent_and_a_retry_spoils_the_sample() -> None:
    # A send error (0) is a loss on the way, not a refusal (-1): the gap's first NAK went as far
    # as it could. Its retry makes the repair ambiguous, so Karn's rule times nothing.
    image, wire = make_image(), Wire()
    image.poll(0.0, wire)
    receive(image, 0, 0.0)
    receive(image, 2 * FRAME, 0.0)
    image.poll(0.0, wire)
    wire.result = 0
    image.poll(NAK_DELAY, wire)
    wire.result = 1
    retry = ReceiverTimers().nak_delay * ReceiverTimers().nak_retry_ratio
    image.poll(NAK_DELAY + retry, wire)
    assert len(wire.naks()) == 1
    receive(image, FRAME, NAK_DELAY + retry + 0.0002)
    assert image.repair.srtt is None


def test_an_unreliable_image_pads_over_every_gap_due_at_once() -> None:
    image, wire = make_image(reliable=False), Wire()
    image.poll(0.0, wire)
    receive(image, 0, 0.0)
    receive(image, 2 * FRAME, 0.0)
    receive(image, 4 * FRAME, 0.0)
    image.poll(0.0, wire)
    image.poll(NAK_DELAY, wire)  # both gaps are due: both are given up
    assert wire.naks() == []
    assert image.rebuild_position == 5 * FRAME
    assert consume(image) == [payload(0), payload(2 * FRAME), payload(4 * FRAME)]


def test_the_padding_over_a_gap_is_the_pad_frame_aerons_try_fill_gap_writes() -> None:
    image, wire = make_image(reliable=False), Wire()
    stream_to(image, wire, TERM + FRAME, 0.0)
    receive(image, TERM + 3 * FRAME, 0.0)
    image.poll(0.001, wire)
    image.poll(0.001 + NAK_DELAY, wire)
    term = image.terms[(INITIAL + 1 - INITIAL) % 3]
    # version 0, flags BEGIN|END, type PAD, its own offset, session, stream, term id,
    # reserved value 0: the default header (DataHeaderFlyweight.createDefaultHeader)
    assert DATA_HEADER_STRUCT.unpack_from(term, FRAME) == (
        2 * FRAME,
        0,
        UNFRAGMENTED_FLAGS,
        FrameType.PAD,
        FRAME,
        SESSION,
        STREAM,
        INITIAL + 1,
        0,
    )


# ----------------------------------------------------------------------- term cleaning


def test_a_lost_frame_three_terms_on_is_naked_not_filled_with_the_old_terms_data() -> None:
    # Three partitions: term J + 3 reuses term J's. Joined at a later term (J = initial + 2),
    # the image must still clean it before J + 3's data lands there.
    image, wire = make_image(active_term_id=INITIAL + 2), Wire()
    join = 2 * TERM
    assert stream_to(image, wire, join + 3 * TERM, 0.0) + consume(image) == expected(
        join, join + 3 * TERM
    )
    image.poll(0.001, wire)
    receive(image, join + 3 * TERM + FRAME, 0.002)  # its first frame is lost
    assert consume(image) == []
    image.poll(0.003, wire)
    image.poll(0.003 + NAK_DELAY, wire)
    assert [(n.term_id, n.term_offset) for n in wire.naks()] == [(INITIAL + 5, 0)]


def test_data_of_the_next_term_survives_reading_the_rest_of_this_one_frame_by_frame() -> None:
    image, wire = make_image(), Wire()
    # Two terms on, the partition the next term uses must be cleaned once, as the reader
    # enters this term: not again while data of the next term is already in it.
    start = 2 * TERM + HALF_TERM + 8 * FRAME
    got = stream_to(image, wire, start, 0.0) + consume(image)
    image.poll(0.001, wire)
    for position in range(start, 3 * TERM + 4 * FRAME, FRAME):
        receive(image, position, 0.002)
    got += consume(image, fragment_limit=1)
    assert got == expected(0, 3 * TERM + 4 * FRAME)


# ----------------------------------------------------------------------- reading


def test_poll_into_an_image_with_nothing_rebuilt_reads_nothing() -> None:
    image = make_image()
    got: list[Message] = []
    origin = (SESSION, STREAM, "198.18.0.9:40123", SOURCE[0], SOURCE[1])
    assert image.poll_into(got.append, origin, 10) == 0
    assert image.poll_messages(lambda data: None, 10) == 0
    assert got == []


# ----------------------------------------------------------------------- status messages


def test_sms_carry_the_subscriptions_group_tag() -> None:
    image, wire = make_image(group_tag=0x7A6), Wire()
    image.poll(0.0, wire)
    image.close(wire)
    assert [sm.group_tag for sm in wire.sms()] == [0x7A6, 0x7A6]
    assert len(wire.sent[0][0]) == SM_LENGTH + 8


def test_an_sm_lost_on_the_way_out_is_not_retried_at_once() -> None:
    # 0: the send failed (a loss), unlike -1 (would block: try again): the SM waits its
    # interval like one lost on the network, rather than being sent in a loop.
    image, wire = make_image(), Wire()
    wire.result = 0
    image.poll(0.0, wire)
    assert image.next_deadline(0.0) == SM_INTERVAL
    wire.result = 1
    image.poll(0.001, wire)
    assert wire.sms() == []


def test_a_window_update_for_a_sender_at_the_edge_is_due_at_once() -> None:
    image, wire = make_image(), Wire()
    image.poll(0.0, wire)
    for position in range(0, HALF_TERM - FRAME, FRAME):  # the sender is at the edge
        receive(image, position, 0.0)
    image.poll(0.0, wire)
    assert image.poll_messages(lambda data: None, 1) == 1  # read a little
    assert image.next_deadline(0.01) == 0.01
    image.poll(0.01, wire)
    assert wire.sms()[-1].consumption_term_offset == FRAME


# ----------------------------------------------------------------------- the budget


def test_a_budgeted_image_sends_no_byte_more_than_three_times_what_it_received() -> None:
    assert AMPLIFICATION_FACTOR == 3  # RFC 9000 §8.1's bound for an unvalidated address
    image, wire = make_image(budgeted=True), Wire()
    image.credit(SM_LENGTH // 3 - 1)  # 11 bytes received: 33 may be sent, not an SM's 36
    assert image.budget == 33
    image.poll(0.0, wire)
    assert wire.sent == []
    assert image.starved
    assert image.counters.amplification_limited == 1
    # only the source can unblock it: it waits for nothing but its liveness
    assert image.next_deadline(0.0) == ReceiverTimers().liveness_timeout
    image.credit(1)  # now exactly one SM's worth
    assert not image.starved
    image.poll(0.001, wire)
    assert len(wire.sms()) == 1
    assert image.budget == 0
    assert image.counters.status_messages_sent == 1


def test_credits_add_up_and_each_refusal_is_counted() -> None:
    image, wire = make_image(budgeted=True), Wire()
    image.credit(5)
    image.poll(0.0, wire)
    image.credit(5)
    image.poll(0.001, wire)
    assert image.counters.amplification_limited == 2
    assert image.counters.status_messages_sent == 0
    image.credit(2)  # 12 bytes in all: 36 may go out
    image.poll(0.002, wire)
    assert len(wire.sms()) == 1


def test_a_group_tagged_image_answers_its_first_setup_at_once() -> None:
    # A 44-byte tagged SM for a 40-byte SETUP: at factor 1 it waited for the next SETUP.
    image, wire = make_image(budgeted=True, group_tag=0x1234), Wire()
    image.credit(SETUP_LENGTH)
    image.poll(0.0, wire)
    assert [len(data) for data, _ in wire.sent] == [SM_GTAG_LENGTH] == [44]
    assert wire.sms()[0].group_tag == 0x1234
    assert image.counters.amplification_limited == 0
    assert image.budget == 3 * SETUP_LENGTH - SM_GTAG_LENGTH


def test_an_image_closed_right_after_its_setup_still_says_goodbye() -> None:
    # The first SM and the end-of-stream SM (72 bytes) both come out of one SETUP's credit.
    image, wire = make_image(budgeted=True), Wire()
    image.credit(SETUP_LENGTH)
    image.poll(0.0, wire)
    image.close(wire)
    assert [sm.flags for sm in wire.sms()] == [0, SM_EOS_FLAG]
    assert image.state is ImageState.CLOSED
    assert image.counters.amplification_limited == 0
    assert image.counters.status_messages_sent == 2


def test_a_budgeted_image_never_sends_more_than_three_times_one_setup() -> None:
    # One SETUP and then silence (a forged source never sends more): however often the image
    # is polled, until its liveness runs out, it sends at most 120 bytes, then waits starved.
    image, wire = make_image(budgeted=True), Wire()
    image.credit(SETUP_LENGTH)
    now = 0.0
    while image.state is ImageState.ACTIVE:
        image.poll(now, wire)
        now += 0.01
    sent = sum(len(data) for data, _ in wire.sent)
    assert sent <= 3 * SETUP_LENGTH
    assert len(wire.sms()) == 3  # 108 of the 120 bytes: a fourth SM would be 144
    assert image.starved and image.counters.amplification_limited >= 1
    assert image.state is ImageState.TIMED_OUT


# ----------------------------------------------------------------------- RSP_SETUP


def _answering(now: float = 0.0) -> tuple[PublicationImage, Wire]:
    image, wire = make_image(), Wire()
    image.poll(now, wire)  # the first SM
    image.response_session_id = 0x5E5  # as ResponsePublication.answer does
    image.next_response_setup = now + 0.05
    return image, wire


def test_rsp_setups_are_counted_and_repeat_every_sm_interval() -> None:
    image, wire = _answering()
    assert image.next_deadline(0.0) == 0.05  # before the periodic SM
    image.poll(0.05, wire)
    image.poll(SM_INTERVAL, wire)
    image.poll(0.25, wire)
    assert len(wire.rsp_setups()) == 2
    assert image.counters.response_setups_sent == 2
    assert image.next_deadline(0.25) == 0.4  # the periodic SM (0.2 + 0.2) comes first now
    image.poll(0.4, wire)
    assert image.next_deadline(0.4) == 0.45


def test_an_rsp_setup_lost_on_the_way_out_waits_its_interval() -> None:
    image, wire = _answering()
    wire.result = 0
    image.poll(0.05, wire)
    assert image.next_response_setup == 0.05 + SM_INTERVAL


def test_rsp_setups_stop_when_the_image_no_longer_answers() -> None:
    image, wire = _answering()
    image.response_session_id = None  # the response publication connected
    image.poll(0.05, wire)
    assert wire.rsp_setups() == []
    assert image.next_response_setup == math.inf


# ----------------------------------------------------------------------- liveness and the end


def test_an_image_wakes_for_its_liveness_deadline_and_times_out_exactly_there() -> None:
    image, wire = make_image(timers=ReceiverTimers(liveness_timeout=0.05)), Wire()
    image.poll(0.0, wire)
    assert image.next_deadline(0.0) == 0.05  # before the periodic SM
    image.poll(0.05, wire)
    assert image.state is ImageState.TIMED_OUT


def test_end_of_stream_sends_one_eos_sm_counted_and_finishes() -> None:
    image, wire = make_image(), Wire()
    image.poll(0.0, wire)
    receive(image, 0, 0.0)
    heartbeat(image, FRAME, 0.01, BEGIN_END_AND_EOS_FLAGS)
    consume(image)
    image.poll(0.01, wire)
    assert image.state is ImageState.END_OF_STREAM
    assert [sm.flags for sm in wire.sms()] == [0, SM_EOS_FLAG]
    assert image.counters.status_messages_sent == 2
    image.say_goodbye(wire)  # the publisher lingers: say it again
    image.say_goodbye(wire)
    assert [sm.flags for sm in wire.sms()][1:] == [SM_EOS_FLAG] * 3
    assert image.counters.status_messages_sent == 4


def test_closing_an_active_image_sends_an_eos_sm_and_closes_it_once() -> None:
    image, wire = make_image(), Wire()
    image.poll(0.0, wire)
    image.close(wire)
    assert image.state is ImageState.CLOSED
    assert [sm.flags for sm in wire.sms()] == [0, SM_EOS_FLAG]
    assert image.counters.status_messages_sent == 2
    image.close(wire)  # already closed: nothing more
    assert len(wire.sent) == 2


def test_closing_a_timed_out_image_sends_nothing() -> None:
    image, wire = make_image(), Wire()
    image.poll(100.0, wire)
    assert image.state is ImageState.TIMED_OUT
    image.close(wire)
    assert wire.sent == []
    assert image.state is ImageState.TIMED_OUT
