"""A publication and an image wired by hand with a scripted clock (docs/architecture.md, Test
layers).

Every timer of Aeron's (its driver Configuration's defaults) is checked against the times at which
frames are handed to the network; loss, duplication and reordering are decided by packet index
(tests/transport/ pairlink.py).
"""

from __future__ import annotations

import itertools
import random
import struct

import pytest

from echo.transport.core.frames import (
    BEGIN_END_AND_EOS_FLAGS,
    DATA_HEADER_LENGTH,
    SM_EOS_FLAG,
    SM_SETUP_FLAG,
    UNFRAGMENTED_FLAGS,
    DataHeader,
    FrameType,
    Nak,
    Setup,
    StatusMessage,
    parse_datagram_untrusted,
)
from echo.transport.core.logbuffer import compute_fragmented_length
from echo.transport.core.receiver import ImageState, ReceiveEndpoint, StreamInterest
from echo.transport.core.sender import (
    ADMIN_ACTION,
    BACK_PRESSURED,
    CLOSED,
    MAX_POSITION_EXCEEDED,
    NOT_CONNECTED,
    PublicationState,
)
from tests.transport.pairlink import (
    DELIVER,
    DROP,
    RECEIVER_ADDRESS,
    RECEIVER_ID,
    SENDER_ADDRESS,
    Direction,
    Fate,
    PairLink,
    by_index,
)

KIB = 1024
SESSION = 0x1EE7


def data_frames(pair: PairLink, since: float = -1.0) -> list[tuple[float, DataHeader, int]]:
    """(time, first header, datagram length) of DATA/PAD datagrams that carry frames."""
    return [
        (s.time, h, len(s.data))
        for s in pair.sent("data")
        if s.time >= since
        for h in [s.frame]
        if isinstance(h, DataHeader) and not h.is_heartbeat
    ]


def heartbeats(pair: PairLink, since: float = -1.0) -> list[tuple[float, DataHeader]]:
    return [
        (s.time, h)
        for s in pair.sent("data")
        if s.time >= since
        for h in [s.frame]
        if isinstance(h, DataHeader) and h.is_heartbeat
    ]


def status_messages(pair: PairLink, since: float = -1.0) -> list[tuple[float, StatusMessage]]:
    return [
        (t, f) for t, f in pair.frames("control") if t >= since and isinstance(f, StatusMessage)
    ]


def naks(pair: PairLink, since: float = -1.0) -> list[tuple[float, Nak]]:
    return [(t, f) for t, f in pair.frames("control") if t >= since and isinstance(f, Nak)]


def received(pair: PairLink) -> list[bytes]:
    return pair.received.get(SESSION, [])


def message(index: int, size: int) -> bytes:
    return struct.pack("<I", index) + bytes([index & 0xFF]) * (size - 4)


# --------------------------------------------------------------------------- connection


def test_setup_every_100ms_until_the_first_sm_and_no_data_before_it() -> None:
    pair = PairLink(fate=by_index(drop={0, 1, 2, 3, 4}, direction="control"))
    # Before any SM: the publication is not connected and refuses data.
    assert pair.offer(b"too early") == NOT_CONNECTED
    pair.run_until(lambda: pair.publication.is_connected(pair.now), max_time=2.0)
    setups = [(t, f) for t, f in pair.frames("data") if isinstance(f, Setup)]
    assert [round(t, 6) for t, _ in setups] == [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]
    first_sm_delivered = 0.5
    setup = setups[0][1]
    assert (setup.session_id, setup.stream_id, setup.term_length, setup.mtu) == (
        SESSION,
        1001,
        64 * KIB,
        1408,
    )
    assert setup.initial_term_id == setup.active_term_id == 0 and setup.term_offset == 0
    # Nothing but SETUPs went out before the first SM arrived.
    before = [f for t, f in pair.frames("data") if t < first_sm_delivered]
    assert all(isinstance(f, Setup) for f in before)
    # No more SETUPs once connected.
    pair.advance(1.0)
    assert len([f for _, f in pair.frames("data") if isinstance(f, Setup)]) == 6
    assert pair.publication.sender_limit == 32768


def test_first_sm_answers_the_setup_at_once_with_the_window() -> None:
    pair = PairLink(term_length=1024 * KIB)
    pair.connect()
    (image,) = pair.available_images()
    assert image.control_address == SENDER_ADDRESS
    ((t, sm),) = status_messages(pair)[:1]
    assert t == 0.0
    assert (sm.session_id, sm.stream_id, sm.receiver_id) == (SESSION, 1001, RECEIVER_ID)
    assert (sm.consumption_term_id, sm.consumption_term_offset, sm.flags) == (0, 0, 0)
    assert sm.receiver_window == 128 * KIB
    assert pair.sender_counters.setups_sent == 1


@pytest.mark.parametrize(
    ("term_length", "rcv_wnd", "window"),
    [
        (64 * KIB, 128 * KIB, 32 * KIB),
        (1024 * KIB, 128 * KIB, 128 * KIB),
        (1024 * KIB, 8 * KIB, 8 * KIB),
        (256 * KIB, 1024 * KIB, 128 * KIB),
    ],
)
def test_receiver_window_is_min_of_rcv_wnd_and_half_a_term(
    term_length: int, rcv_wnd: int, window: int
) -> None:
    pair = PairLink(term_length=term_length, rcv_wnd=rcv_wnd)
    pair.connect()
    pair.advance(0.5)
    assert {sm.receiver_window for _, sm in status_messages(pair)} == {window}
    assert pair.publication.sender_limit == window


def test_heartbeat_after_100ms_idle() -> None:
    pair = PairLink()
    pair.connect()
    pair.advance(0.05)
    start = pair.now
    assert pair.offer(b"x" * 100) > 0
    pair.pump()
    ((t, _, _),) = data_frames(pair)
    assert t == start
    pair.advance(0.55)
    beats = heartbeats(pair, since=start)
    times = [round(t - start, 6) for t, _ in beats]
    assert times == [0.1, 0.2, 0.3, 0.4, 0.5]
    for _, beat in beats:
        assert beat.frame_length == 0
        assert beat.flags == UNFRAGMENTED_FLAGS == 0xC0
        assert beat.type == FrameType.DATA
        assert beat.term_offset == 160 and beat.term_id == 0
        assert (beat.session_id, beat.stream_id) == (SESSION, 1001)
    raw = [s.data for s in pair.sent("data") if s.time > start]
    assert all(len(d) == DATA_HEADER_LENGTH for d in raw)


def test_no_heartbeat_before_the_first_sm() -> None:
    pair = PairLink(fate=lambda which, i, d: DROP if which == "control" else DELIVER)
    pair.advance(1.0)
    assert heartbeats(pair) == []
    assert not pair.publication.is_connected(pair.now)


# --------------------------------------------------------------------------- flow control


def test_sender_limit_is_sm_position_plus_window() -> None:
    pair = PairLink(term_length=1024 * KIB, rcv_wnd=4096)
    pair.connect()
    pair.consuming = False
    for i in range(40):
        assert pair.offer(message(i, 480)) > 0  # 512-byte frames
    pair.pump()
    sent = data_frames(pair)
    assert max(h.term_offset + n for _, h, n in sent) == 4096
    assert pair.publication.sender_position == pair.publication.sender_limit == 4096
    # The receiver consumes 8 messages: its SM moves the limit to position + window.
    pair.consuming = True
    pair.fragment_limit = 8
    pair.drain()
    pair.consuming = False
    pair.pump()
    ((_, sm),) = [x for x in status_messages(pair) if x[1].consumption_term_offset > 0]
    assert sm.consumption_term_offset == 4096
    assert pair.publication.sender_limit == 4096 + 4096
    assert max(h.term_offset + n for _, h, n in data_frames(pair)) == 8192


def test_back_pressured_when_the_receiver_stops_consuming() -> None:
    pair = PairLink()  # 64 KiB term: window 32 KiB, publication term window 32 KiB
    pair.connect()
    pair.consuming = False
    results = []
    for i in range(200):
        results.append(pair.offer(message(i, 992)))  # 1024-byte frames
        pair.pump()
    accepted = [r for r in results if r > 0]
    assert len(accepted) == 64  # sender at 32 KiB (the window) + 32 KiB term window
    assert set(results[64:]) == {BACK_PRESSURED}
    pair.consuming = True
    pair.offer_all([message(i, 992) for i in range(64, 200)])
    pair.run_until(lambda: len(received(pair)) == 200)
    assert received(pair) == [message(i, 992) for i in range(200)]


def test_small_offers_are_batched_into_few_datagrams() -> None:
    pair = PairLink(term_length=1024 * KIB)
    pair.connect()
    before = len(data_frames(pair))
    for i in range(100):
        assert pair.offer(message(i, 100)) > 0  # 132 -> 160-byte frames
    pair.pump()
    sent = data_frames(pair)[before:]
    assert [n for _, _, n in sent] == [1280] * 12 + [640]  # 8 frames of 160 fit in 1408
    assert all(n <= 1408 for _, _, n in sent)
    assert received(pair) == [message(i, 100) for i in range(100)]


def test_offer_many_puts_the_same_frames_on_the_wire_as_one_offer_each() -> None:
    messages = [message(i, 100) for i in range(100)]
    one_by_one = PairLink(term_length=1024 * KIB)
    one_by_one.connect()
    for data in messages:
        assert one_by_one.offer(data) > 0
    one_by_one.pump()
    batched = PairLink(term_length=1024 * KIB)
    batched.connect()
    assert batched.publication.offer_many(messages, batched.now) == 100
    assert batched.publication.position == one_by_one.publication.position
    batched.pump()
    assert [s.data for s in batched.sent("data")] == [s.data for s in one_by_one.sent("data")]
    assert received(batched) == messages


def test_offer_many_stops_at_the_first_refusal_and_offer_says_why() -> None:
    pair = PairLink()  # 64 KiB term: 64 frames of 1 KiB fill window and term window
    pair.connect()
    pair.consuming = False
    pair.pump()
    messages = [message(i, 992) for i in range(100)]
    taken = pair.publication.offer_many(messages, pair.now)
    assert taken == 32  # the publication's term window (32 KiB) ahead of the sender position
    assert pair.publication.offer(messages[taken], pair.now) == BACK_PRESSURED
    assert pair.publication.offer_many([], pair.now) == 0


def test_offer_many_rotates_the_term_itself() -> None:
    pair = PairLink(term_length=64 * KIB)
    pair.connect()
    # 1 KiB frames: the 64th would end exactly at the term's end, so 63 + 48 B of filler
    # leave a gap too small for the next frame: ADMIN_ACTION inside, handled there.
    taken = 0
    sent = [message(i, 992) for i in range(60)] + [message(60, 900)]
    for start in range(0, len(sent), 20):
        batch = sent[start : start + 20]
        got = pair.publication.offer_many(batch, pair.now)
        assert got == len(batch)
        taken += got
        pair.run_until(lambda count=taken: len(received(pair)) == count)
    tail = [message(i, 992) for i in range(61, 80)]
    assert pair.publication.offer_many(tail, pair.now) == len(tail)
    assert pair.publication.active_term_id == 1
    pair.run_until(lambda: len(received(pair)) == 80)
    assert received(pair) == sent + tail


def test_offer_many_refuses_a_message_too_long_after_taking_those_before() -> None:
    pair = PairLink()
    pair.connect()
    too_long = bytes(pair.publication.max_message_length + 1)
    with pytest.raises(ValueError):
        pair.publication.offer_many([b"first", too_long, b"never"], pair.now)
    pair.run_until(lambda: len(received(pair)) == 1)
    assert received(pair) == [b"first"]


# --------------------------------------------------------------------------- loss


def test_nak_gets_an_immediate_retransmit_and_overlapping_naks_linger() -> None:
    pair = PairLink()
    pair.connect()
    for i in range(4):
        pair.offer(message(i, 500))  # 544-byte frames, 2 per datagram
    pair.pump()
    publication = pair.publication
    count = len(pair.sent("data"))

    def nak(offset: int, length: int) -> bytes:
        return Nak(
            session_id=SESSION, stream_id=1001, term_id=0, term_offset=offset, length=length
        ).encode()

    t0 = pair.now
    pair.inject_to_sender(nak(0, 1088))
    publication.poll(pair.now, lambda d: pair.sender_send(d, RECEIVER_ADDRESS))
    resent = pair.sent("data")[count:]
    assert [(s.time, s.data) for s in resent] == [(t0, resent[0].data)]
    header = parse_datagram_untrusted(resent[0].data)
    assert isinstance(header, DataHeader) and header.term_offset == 0
    assert resent[0].data == bytes(publication.log.terms[0][0:1088])
    assert pair.sender_counters.retransmits_sent == 1
    # A NAK overlapping the range within the linger is a duplicate: ignored. (Unicast lingers
    # 0.25 ms, not Aeron's 10 ms: a receiver NAKs a gap again only after its repair time, at
    # least 0.5 ms, so a later NAK means the resend was lost.)
    pair.now = t0 + 0.0002
    pair.inject_to_sender(nak(544, 1088))
    publication.poll(pair.now, lambda d: pair.sender_send(d, RECEIVER_ADDRESS))
    assert len(pair.sent("data")) == count + 1
    assert pair.sender_counters.retransmits_sent == 1
    # After the linger the same range is resent again, even before a poll has pruned it.
    pair.now = t0 + 0.0003
    pair.inject_to_sender(nak(0, 1088))
    publication.poll(pair.now, lambda d: pair.sender_send(d, RECEIVER_ADDRESS))
    assert len(pair.sent("data")) == count + 2
    assert pair.sender_counters.retransmits_sent == 2
    # NAKs for what was never sent, or with nonsense fields, are ignored (a zero length is
    # valid and asks for nothing: not counted as invalid, as in Aeron's RetransmitHandler).
    for bogus in (nak(2176, 544), nak(-32, 64), nak(0, 0), nak(65536, 32), nak(0, -1)):
        pair.now += 0.02
        pair.inject_to_sender(bogus)
        publication.poll(pair.now, lambda d: pair.sender_send(d, RECEIVER_ADDRESS))
    assert pair.sender_counters.retransmits_sent == 2
    assert pair.sender_counters.invalid_by_reason["bad_nak"] == 3


class DropOffsetUntil:
    """Drop every data datagram that starts at `offset` until `until` (originals and resends)."""

    def __init__(self, offset: int, until: float, pair_clock: list[PairLink]) -> None:
        self.offset = offset
        self.until = until
        self.pair = pair_clock

    def __call__(self, which: Direction, index: int, datagram: bytes) -> Fate:
        if which == "data" and self.pair and self.pair[0].now < self.until:
            header = parse_datagram_untrusted(datagram)
            if (
                isinstance(header, DataHeader)
                and header.frame_length
                and header.term_offset == (self.offset)
            ):
                return DROP
        return DELIVER


def test_gap_is_naked_after_the_delay_and_renaked_until_filled() -> None:
    holder: list[PairLink] = []
    fate = DropOffsetUntil(1088, until=0.045, pair_clock=holder)
    pair = PairLink(fate=fate)
    holder.append(pair)
    pair.connect()
    start = pair.now
    for i in range(6):
        pair.offer(message(i, 500))
    pair.run_until(lambda: len(received(pair)) == 6, max_time=1.0)
    sent = naks(pair)
    assert sent, "no NAK"
    first = sent[0][0]
    assert first - start == pytest.approx(0.0001, abs=1e-9)  # nak_delay: 100 µs
    for _, nak in sent:
        assert (nak.session_id, nak.stream_id, nak.term_id) == (SESSION, 1001, 0)
        assert (nak.term_offset, nak.length) == (1088, 1088)
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(sent)]
    assert len(gaps) >= 3 and all(g == pytest.approx(0.01, abs=1e-6) for g in gaps)
    # Re-NAKed while the resends were lost; the first NAK after that brought the repair.
    assert sent[-2][0] < 0.045 <= sent[-1][0]
    assert len(sent) == 1 + round((sent[-1][0] - first) / 0.01)
    assert received(pair) == [message(i, 500) for i in range(6)]
    pair.advance(0.5)
    assert len(naks(pair)) == len(sent)  # filled: no more NAKs


def test_lost_tail_is_found_by_the_heartbeat() -> None:
    # The last datagram is lost and nothing follows: the heartbeat's position reveals the gap.
    pair = PairLink(fate=by_index(drop={3}))  # 0 SETUP, 1 heartbeat, 2 and 3 data
    pair.connect()
    for i in range(4):
        pair.offer(message(i, 500))
    pair.run_until(lambda: len(received(pair)) == 4, max_time=1.0)
    ((t, nak),) = naks(pair)
    assert (nak.term_offset, nak.length) == (1088, 1088)
    assert t <= 0.1 + 0.001


def test_packets_outside_the_window_are_dropped_and_counted() -> None:
    pair = PairLink()  # 64 KiB: data accepted up to last SM position + 32 KiB
    pair.connect()
    image = pair.image

    def data_at(offset: int, term_id: int = 0, payload: bytes = b"z" * 32) -> bytes:
        return (
            DataHeader(
                32 + len(payload), UNFRAGMENTED_FLAGS, offset, SESSION, 1001, term_id
            ).encode()
            + payload
        )

    pair.inject_to_receiver(data_at(32768 - 128))  # [32640, 32704): inside, accepted
    pair.inject_to_receiver(data_at(32768 - 64))  # [32704, 32768): ends at the edge, accepted
    assert pair.receiver_counters.flow_control_overruns == 0
    assert image.hwm == 32768
    image.terms[0][32704:32768] = bytes(64)  # forget it again, to try a longer frame there
    pair.inject_to_receiver(data_at(32768 - 64, payload=b"z" * 64))  # ends 32 bytes beyond
    pair.inject_to_receiver(data_at(0, term_id=1))  # a whole term ahead
    assert pair.receiver_counters.flow_control_overruns == 2
    assert bytes(image.terms[0][32704:32800]) == bytes(96)
    assert bytes(image.terms[1][0:64]) == bytes(64)
    # Behind the last SM position: an underrun.
    pair.inject_to_receiver(data_at(0, term_id=-1))
    assert pair.receiver_counters.flow_control_underruns == 1


def test_duplicates_and_reordering_by_index() -> None:
    pair = PairLink(fate=by_index(duplicate={2, 4}, hold={3, 5}))
    pair.connect()
    pair.offer_all([message(i, 700) for i in range(12)])  # one frame per datagram
    pair.run_until(lambda: len(received(pair)) == 12, max_time=1.0)
    assert received(pair) == [message(i, 700) for i in range(12)]
    assert pair.receiver_counters.duplicate_data >= 2


# --------------------------------------------------------------------------- status messages


def test_sm_every_200ms_when_idle() -> None:
    pair = PairLink()
    pair.connect()
    pair.advance(1.05)
    times = [round(t, 6) for t, _ in status_messages(pair)]
    assert times == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]


def test_sm_at_once_after_a_quarter_window_is_consumed() -> None:
    pair = PairLink(term_length=1024 * KIB)  # window 128 KiB: threshold 32 KiB
    pair.connect()
    pair.advance(0.05)
    t = pair.now
    for i in range(10):
        pair.offer(message(i, 1000))  # 10 x 1056 bytes: well under window/4
    pair.pump()
    assert status_messages(pair, since=t) == []
    for i in range(10, 40):
        pair.offer(message(i, 1000))
    pair.pump()
    ((when, sm),) = status_messages(pair, since=t)
    assert when == t
    assert sm.consumption_term_offset == 40 * 1056 >= 32 * KIB
    # The periodic SM still comes 200 ms after the previous one.
    pair.advance(0.21)
    assert [round(w - t, 6) for w, _ in status_messages(pair, since=t)] == [0.0, 0.2]


# --------------------------------------------------------------------------- liveness


def test_image_unavailable_after_10s_of_silence() -> None:
    holder: list[PairLink] = []

    def fate(which: Direction, index: int, datagram: bytes) -> Fate:
        return DROP if which == "data" and holder[0].now >= 1.0 else DELIVER

    pair = PairLink(fate=fate)
    holder.append(pair)
    pair.connect()
    pair.advance(1.0)
    last = max(s.time for s in pair.sent("data") if s.fate.copies)
    pair.run_until(lambda: bool(pair.unavailable_images()), max_time=12.0)
    ((event),) = pair.unavailable_images()
    assert event.reason is ImageState.TIMED_OUT
    # At the liveness deadline itself (the deadline the timer wakes at), not a tick later.
    assert 10.0 <= pair.now - last <= 10.2
    assert pair.receive_endpoint.images == {}
    assert pair.receiver_counters.images_closed == 1


def test_publication_not_connected_after_5s_without_sms() -> None:
    holder: list[PairLink] = []

    def fate(which: Direction, index: int, datagram: bytes) -> Fate:
        return DROP if which == "control" and holder[0].now >= 0.3 else DELIVER

    pair = PairLink(fate=fate)
    holder.append(pair)
    pair.connect()
    pair.advance(0.3)
    last_sm = max(s.time for s in pair.sent("control") if s.fate.copies)
    pair.advance(last_sm + 4.99 - pair.now)
    assert pair.publication.is_connected(pair.now)
    pair.run_until(lambda: not pair.publication.is_connected(pair.now), max_time=6.0)
    # (5 s to the float: last_sm + 5 - 5 need not equal last_sm)
    assert 5.0 - 1e-9 <= pair.now - last_sm <= 5.01
    assert pair.offer(b"late") == NOT_CONNECTED


# --------------------------------------------------------------------------- close


def test_close_sends_eos_and_both_sides_finish() -> None:
    pair = PairLink()
    pair.connect()
    messages = [message(i, 300) for i in range(20)]
    pair.offer_all(messages)
    pair.publication.close(pair.now)
    assert pair.offer(b"after close") == CLOSED
    closed_at = pair.now
    pair.run_until(lambda: pair.publication.is_done, max_time=6.0)
    assert received(pair) == messages
    eos = [(t, h) for t, h in heartbeats(pair, since=closed_at) if h.flags == 0xE0]
    assert eos and eos[0][1].flags == BEGIN_END_AND_EOS_FLAGS
    assert eos[0][1].term_offset == pair.publication.position == 20 * 352
    (event,) = pair.unavailable_images()
    assert event.reason is ImageState.END_OF_STREAM
    eos_sms = [sm for _, sm in status_messages(pair) if sm.flags & SM_EOS_FLAG]
    assert eos_sms and eos_sms[0].consumption_term_offset == 20 * 352
    # The EOS SM ends the linger early: long before the 5 s linger.
    assert pair.now - closed_at < 0.5
    assert pair.publication.delivered
    assert pair.publication.state is PublicationState.CLOSED
    assert pair.publication.next_deadline(pair.now) == float("inf")


def test_linger_repeats_eos_until_the_receiver_says_goodbye() -> None:
    # The receiver's EOS SMs are all lost: the publication lingers 5 s, EOS every 100 ms.
    holder: list[PairLink] = []

    def fate(which: Direction, index: int, datagram: bytes) -> Fate:
        frame = parse_datagram_untrusted(datagram)
        if isinstance(frame, StatusMessage) and frame.flags & SM_EOS_FLAG:
            return DROP
        return DELIVER

    pair = PairLink(fate=fate)
    holder.append(pair)
    pair.connect()
    pair.offer_all([b"one", b"two"])
    pair.publication.close(pair.now)
    closed_at = pair.now
    pair.run_until(lambda: pair.publication.is_done, max_time=7.0)
    assert 5.0 <= pair.now - closed_at <= 5.01
    eos = [t for t, h in heartbeats(pair, since=closed_at) if h.flags == 0xE0]
    assert 45 <= len(eos) <= 52
    assert received(pair) == [b"one", b"two"]


# --------------------------------------------------------------------------- sessions


def test_session_filter_ignores_other_sessions_silently() -> None:
    pair = PairLink(session_filter=SESSION + 1)
    pair.advance(1.0)
    assert pair.receive_endpoint.images == {}
    assert pair.sent("control") == []
    assert pair.receiver_counters.session_filter_drops >= 10
    assert not pair.publication.is_connected(pair.now)


def test_session_filter_accepts_its_session() -> None:
    pair = PairLink(session_filter=SESSION)
    pair.connect()
    assert pair.offer(b"hi") > 0
    pair.run_until(lambda: received(pair) == [b"hi"], max_time=0.1)
    assert pair.receiver_counters.session_filter_drops == 0


def test_data_of_an_unknown_session_elicits_a_setup() -> None:
    pair = PairLink()
    pair.connect()
    pair.offer_all([message(i, 200) for i in range(3)])
    pair.run_until(lambda: len(received(pair)) == 3, max_time=0.1)
    # The receiver restarts and knows nothing of the session; the sender goes on sending.
    pair.receive_endpoint = ReceiveEndpoint(
        counters=pair.receiver_counters, receiver_id=RECEIVER_ID + 1, now=pair.now
    )
    pair.receive_endpoint.add_interest(StreamInterest(stream_id=1001), pair.now)
    pair.received.clear()
    t = pair.now
    setups_before = pair.sender_counters.setups_sent
    pair.offer_all([message(i, 200) for i in range(3, 6)])
    pair.run_until(lambda: len(pair.receive_endpoint.images) == 1, max_time=0.5)
    elicit = [sm for _, sm in status_messages(pair, since=t) if sm.flags & SM_SETUP_FLAG]
    assert elicit
    sm = elicit[0]
    assert sm.flags == SM_SETUP_FLAG == 0x80
    assert (sm.session_id, sm.stream_id, sm.receiver_window) == (SESSION, 1001, 0)
    assert pair.sender_counters.setups_sent == setups_before + 1
    # The new image joins at the sender's position and gets what is offered from then on.
    pair.offer_all([b"after rejoin"])
    pair.run_until(lambda: received(pair)[-1:] == [b"after rejoin"], max_time=0.5)


def test_unknown_session_elicitation_is_rate_limited_and_not_amplified() -> None:
    pair = PairLink()
    data = DataHeader(64, UNFRAGMENTED_FLAGS, 0, 99, 1001, 5).encode() + bytes(32)
    heartbeat = DataHeader(0, UNFRAGMENTED_FLAGS, 0, 98, 1001, 5).encode()
    pair.receive_endpoint = ReceiveEndpoint(
        counters=pair.receiver_counters, receiver_id=RECEIVER_ID, now=0.0
    )
    pair.receive_endpoint.add_interest(StreamInterest(stream_id=1001), 0.0)
    sent: list[tuple[bytes, object]] = []

    def send(d: bytes | memoryview, a: object) -> bool:
        sent.append((bytes(d), a))
        return True

    source = ("10.0.0.9", 4000)
    for i in range(5):
        pair.receive_endpoint.on_datagram(data, source, 0.01 * i)
        pair.receive_endpoint.on_datagram(heartbeat, source, 0.01 * i)
        pair.receive_endpoint.poll(0.01 * i, send)
    assert len(sent) == 1  # one per 200 ms, and never for a 32-byte heartbeat
    frame = parse_datagram_untrusted(sent[0][0])
    assert isinstance(frame, StatusMessage) and frame.is_setup_eliciting
    assert (frame.session_id, frame.stream_id) == (99, 1001)
    assert sent[0][1] == source
    assert pair.receiver_counters.amplification_limited == 5
    pair.receive_endpoint.on_datagram(data, source, 0.21)
    pair.receive_endpoint.poll(0.21, send)
    assert len(sent) == 2


# --------------------------------------------------------------------------- offer results


def test_admin_action_on_term_rotation() -> None:
    pair = PairLink()  # 64 KiB terms, max message 8 KiB
    pair.connect()
    publication = pair.publication
    big = bytes(range(256)) * 32  # 8192 bytes: 6 fragments, 8384 bytes in the term
    required = compute_fragmented_length(8192, 1376)
    assert required == 8192 + 6 * 32
    positions = []
    while True:
        result = publication.offer(big, pair.now)
        if result == ADMIN_ACTION:
            break
        assert result > 0
        positions.append(result)
        pair.run_until(lambda: len(received(pair)) == len(positions), max_time=1.0)
    assert positions == [required * (i + 1) for i in range(7)]
    # The rest of the term is one PAD frame and the publication moved to the next term.
    pad_offset = 7 * required
    term = publication.log.terms[0]
    header = DataHeader(65536 - pad_offset, UNFRAGMENTED_FLAGS, pad_offset, SESSION, 1001, 0)
    header = DataHeader(
        header.frame_length, UNFRAGMENTED_FLAGS, pad_offset, SESSION, 1001, 0, type=FrameType.PAD
    )
    assert bytes(term[pad_offset : pad_offset + 32]) == header.encode()
    assert publication.position == 65536 and publication.active_term_id == 1
    assert publication.offer(big, pair.now) == 65536 + required
    pair.run_until(lambda: len(received(pair)) == 8, max_time=1.0)
    assert received(pair) == [big] * 8


def test_message_longer_than_the_maximum_raises() -> None:
    pair = PairLink()
    pair.connect()
    assert pair.publication.max_message_length == 8192
    with pytest.raises(ValueError, match=r"8193 bytes exceeds the maximum message length 8192"):
        pair.publication.offer(bytes(8193), pair.now)
    assert pair.publication.offer(bytes(8192), pair.now) > 0


def test_max_position_exceeded() -> None:
    pair = PairLink()
    pair.connect()
    publication = pair.publication
    # Jump to the last term a position can name (term count 2^31 - 1), near its end.
    publication.appender.set_tail(2**31 - 1, 65536 - 128)
    publication.sender_position = publication.position
    assert publication.offer(b"x" * 200, pair.now) == MAX_POSITION_EXCEEDED
    # Ending exactly at the maximum position is refused too (Aeron: position + length >= max).
    assert publication.offer(b"x" * 96, pair.now) == MAX_POSITION_EXCEEDED
    assert publication.offer(b"x" * 60, pair.now) == publication.max_position - 32


# --------------------------------------------------------------------------- hostile input


def garbage(rng: random.Random) -> list[bytes]:
    sm = StatusMessage(SESSION, 1001, 0, 0, 4096, 7).encode()
    setup = Setup(0, SESSION + 5, 1001, 0, 0, 64 * KIB, 1408).encode()
    data = DataHeader(64, UNFRAGMENTED_FLAGS, 0, SESSION, 1001, 0).encode() + bytes(32)
    out = [
        b"",
        b"\x00",
        bytes(7),
        sm[:20],
        setup[:39],
        data[:40],
        struct.pack("<i", 2**31 - 1) + data[4:],
        struct.pack("<i", 2**31 - 1) + sm[4:],
        struct.pack("<i", -5) + data[4:],
        data[:5] + b"\x07" + data[6:],  # version 7
        data[:6] + b"\xff\x7f" + data[8:],  # unknown type
        Setup(0, SESSION + 5, 1001, 0, 0, 12345, 1408).encode(),  # bad term length
        Setup(0, SESSION + 6, 1001, 0, 0, 64 * KIB, 100).encode(),  # bad mtu
        DataHeader(64, UNFRAGMENTED_FLAGS, 65536 - 32, SESSION, 1001, 0).encode() + bytes(32),
    ]
    out += [rng.randbytes(rng.randint(0, 100)) for _ in range(200)]
    return out


def test_malformed_datagrams_are_counted_and_never_raise() -> None:
    pair = PairLink()
    pair.connect()
    pair.offer_all([b"before"])
    pair.run_until(lambda: received(pair) == [b"before"], max_time=0.1)
    rng = random.Random(1234)
    before_receiver = pair.receiver_counters.invalid_frames
    before_sender = pair.sender_counters.invalid_frames
    junk = garbage(rng)
    for datagram in junk:
        pair.inject_to_receiver(datagram)
        pair.inject_to_sender(datagram)
    assert pair.receiver_counters.invalid_frames - before_receiver >= 13
    assert pair.sender_counters.invalid_frames - before_sender >= len(junk) - 10
    reasons = set(pair.receiver_counters.invalid_by_reason)
    assert {"too_short", "bad_version", "unknown_type", "length_mismatch"} <= reasons
    assert {"bad_setup_term_length", "bad_setup_mtu"} <= reasons
    # Nothing was hurt: the stream goes on.
    pair.offer_all([b"after"])
    pair.run_until(lambda: received(pair) == [b"before", b"after"], max_time=1.0)
    assert len(pair.receive_endpoint.images) == 1


def test_random_mutations_of_real_traffic_never_raise() -> None:
    pair = PairLink()
    pair.connect()
    pair.offer_all([message(i, 900) for i in range(30)])
    pair.run_until(lambda: len(received(pair)) == 30, max_time=1.0)
    rng = random.Random(99)
    samples = [s.data for s in pair.trace]
    for _ in range(3000):
        data = bytearray(rng.choice(samples))
        for _ in range(rng.randint(1, 4)):
            if data:
                data[rng.randrange(len(data))] = rng.randrange(256)
        if rng.random() < 0.3:
            data = data[: rng.randrange(len(data) + 1)]
        pair.inject_to_receiver(bytes(data), source=("evil", 6))
        pair.inject_to_sender(bytes(data), source=("evil", 6))
        pair.poll_receiver()
        pair.poll_sender()
        pair.deliver()
    # Forged data can fill slots ahead of the stream (Aeron has no authentication), so only
    # check that both sides are alive and no exception escaped.
    pair.advance(0.5)
    assert pair.publication.is_connected(pair.now)
    assert pair.receiver_counters.invalid_frames > 0


def test_gap_at_the_sm_position_is_resent_after_a_large_pad_skip() -> None:
    """Regression (found by test_properties): the PAD that ends a term is skipped whole, so the
    sender position can run past the sender limit by up to a max-size fragmented message. The
    oldest gap (at the receiver's SM position) must still be inside the resend window, else
    its NAKs are ignored forever and the stream stalls."""
    holder: list[PairLink] = []

    def fate(which: Direction, index: int, datagram: bytes) -> Fate:
        # The datagram at term 0 offset 24448 is lost, originals and resends, until t = 0.5.
        if which == "data" and holder[0].now < 0.5:
            header = parse_datagram_untrusted(datagram)
            if isinstance(header, DataHeader) and header.frame_length and header.term_id == 0:
                if header.term_offset == 24448:
                    return DROP
        return DELIVER

    pair = PairLink(fate=fate)  # 64 KiB terms: window 32 KiB = term/2, max message 8 KiB
    holder.append(pair)
    pair.connect()
    sizes = [992] * 23 + [864] + [992] * 31 + [960]  # 1024-byte frames; tail at 57184
    messages = [message(i, n) for i, n in enumerate(sizes)]
    messages.append(message(len(sizes), 8192))  # needs 8384 bytes: PAD of 8352 at 57184
    pair.offer_all(messages, max_time=0.4)
    pair.advance(0.45 - pair.now)
    image = pair.image
    publication = pair.publication
    assert image.rebuild_position == image.last_sm_position == 24448
    assert publication.sender_limit == 24448 + 32768
    assert publication.sender_position == 65536  # PAD header at 57184 sent, padding skipped
    assert pair.receiver_counters.naks_sent > 0
    pair.run_until(lambda: len(received(pair)) == len(messages), max_time=2.0)
    assert received(pair) == messages


def test_with_many_retransmits_only_overlapping_naks_are_ignored_while_lingering() -> None:
    pair = PairLink(max_retransmits=16)  # what the driver configures
    pair.connect()
    for i in range(8):
        pair.offer(message(i, 500))  # 544-byte frames, 2 per datagram
    pair.pump()
    publication = pair.publication
    count = len(pair.sent("data"))

    def nak(offset: int, length: int) -> None:
        pair.inject_to_sender(
            Nak(
                session_id=SESSION, stream_id=1001, term_id=0, term_offset=offset, length=length
            ).encode()
        )
        publication.poll(pair.now, lambda d: pair.sender_send(d, RECEIVER_ADDRESS))

    nak(0, 1088)
    assert len(pair.sent("data")) == count + 1
    pair.now += 0.0002  # within the unicast linger (0.25 ms)
    nak(544, 1088)  # overlaps [0, 1088): a duplicate, ignored
    nak(1088, 544)  # starts where the first ends: served
    nak(3264, 1088)  # elsewhere: served
    resent = pair.sent("data")[count:]
    offsets = [parse_datagram_untrusted(s.data).term_offset for s in resent]  # type: ignore[union-attr]
    assert offsets == [0, 1088, 3264]
    assert [len(s.data) for s in resent] == [1088, 544, 1088]


def test_forged_sm_cannot_open_the_limit_beyond_what_was_sent() -> None:
    pair = PairLink(rcv_wnd=4096, term_length=1024 * KIB)
    pair.connect()
    pair.consuming = False
    for i in range(20):
        pair.offer(message(i, 480))
    pair.pump()
    publication = pair.publication
    assert publication.sender_position == publication.sender_limit == 4096

    def forged(offset: int) -> bytes:
        return StatusMessage(
            session_id=SESSION,
            stream_id=1001,
            consumption_term_id=0,
            consumption_term_offset=offset,  # "consumed" what was never sent
            receiver_window=4096,
            receiver_id=RECEIVER_ID,
        ).encode()

    for offset in (900 * KIB, 300 * KIB):  # both clamped to the sender position
        pair.inject_to_sender(forged(offset))
        assert publication.sender_limit == 4096 + 4096


def test_unreliable_subscription_pads_over_a_lost_fragment() -> None:
    # reliable=false: the gap is not NAKed but filled with padding (Aeron's tryFillGap); the
    # message that lost a fragment is dropped whole and the next one arrives intact.
    big = [message(i, 4000) for i in range(3)]  # 3 fragments each, one per datagram
    pair = PairLink(reliable=False, fate=by_index(drop={3}))  # 0 SETUP, 1 heartbeat, 2.. data
    pair.connect()
    pair.offer_all(big)
    pair.run_until(lambda: len(received(pair)) == 2, max_time=1.0)
    pair.advance(0.3)
    assert received(pair) == [big[1], big[2]]
    assert naks(pair) == []
    assert pair.image.subscriber_position == 3 * 4096


def test_many_images_each_time_out_at_its_own_liveness_deadline() -> None:
    # The endpoint keeps its images' deadlines in a heap and polls only those due: every one of
    # 60 images, created 0.1 s apart and then silent, must still be dropped exactly at its own
    # 10 s liveness timeout (as the earliest deadline first, then the next, ...).
    from echo.transport.core.counters import Counters
    from echo.transport.core.frames import Setup

    counters = Counters()
    endpoint = ReceiveEndpoint(counters=counters, receiver_id=7, now=0.0)
    endpoint.add_interest(StreamInterest(stream_id=1001), now=0.0)
    sent: list[tuple[float, int]] = []
    created: dict[int, float] = {}
    gone: dict[int, float] = {}

    def send(datagram: bytes | memoryview, address: object) -> bool:
        sent.append((now, len(datagram)))
        return True

    now = 0.0
    for session in range(60):
        now = session * 0.1
        setup = Setup(
            term_offset=0,
            session_id=session,
            stream_id=1001,
            initial_term_id=0,
            active_term_id=0,
            term_length=64 * 1024,
            mtu=1408,
        ).encode()
        endpoint.on_datagram(setup, ("10.0.0.1", 5000 + session), now)
        created[session] = now
        endpoint.poll(now, send)
    while len(gone) < 60 and now < 30.0:
        now = max(endpoint.next_deadline(now), now + 1e-6)
        endpoint.poll(now, send)
        while (event := endpoint.next_event()) is not None:
            if event.image.state is ImageState.TIMED_OUT:
                gone[event.image.session_id] = now
    assert sorted(gone) == list(range(60))
    for session, when in gone.items():
        assert 10.0 <= when - created[session] <= 10.0 + 1e-3, (session, when, created[session])
    assert endpoint.images == {}
    # Each image's SETUP (40 bytes) paid for three times its size (120 bytes): three SMs (36
    # bytes each) and then, its amplification budget spent, it stayed silent: its deadline
    # stopped moving, and it was still polled when its liveness ran out.
    assert len(sent) == 60 * 3
    assert all(size == 36 for _, size in sent)
