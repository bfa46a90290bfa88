"""Sender and receiver state machines, pure, with a scripted clock (DESIGN.md §6 layers 1-3)."""

from __future__ import annotations

import random
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from echo.transport.frames import (
    DataHeader,
    FrameType,
    Nak,
    Setup,
    StatusMessage,
    parse_datagram_untrusted,
)
from echo.transport.logbuffer import compute_position
from echo.transport.receiver import ImageAvailable, ImageUnavailable, ReceiveEndpoint
from echo.transport.sender import ADMIN_ACTION, NOT_CONNECTED
from tests.transport.pair import RECEIVER, SENDER, STREAM, Pair
from tests.transport.pcapng import read_capture


def frames_of(pair: Pair, direction: str) -> list[object]:
    return [parse_datagram_untrusted(d) for who, d in pair.wire if who == direction]


def data_frames(pair: Pair) -> list[DataHeader]:
    return [f for f in frames_of(pair, "tx") if isinstance(f, DataHeader)]


def connect(pair: Pair) -> None:
    pair.run_until(lambda: pair.publication.is_connected(pair.now), max_time=2)


# ---------------------------------------------------------------- handshake and timers


def test_setup_every_100_ms_until_the_first_sm_and_no_data_before_it() -> None:
    pair = Pair(fate=lambda direction, i, d: 0 if direction == "rx" else 1)  # SMs all lost
    assert pair.publication.offer(b"too early", pair.now) == NOT_CONNECTED
    for _ in range(35):
        pair.advance(0.01)
    setups = [f for f in frames_of(pair, "tx") if isinstance(f, Setup)]
    assert len(setups) == 4  # t = 0, 0.1, 0.2, 0.3
    assert not data_frames(pair)
    # Once an SM gets through, the setups stop and the publication is connected.
    pair.fate = lambda direction, i, d: 1
    pair.run_until(lambda: pair.publication.is_connected(pair.now), max_time=1)
    count = len([f for f in frames_of(pair, "tx") if isinstance(f, Setup)])
    for _ in range(50):
        pair.advance(0.01)
    assert len([f for f in frames_of(pair, "tx") if isinstance(f, Setup)]) == count


def test_heartbeat_after_100_ms_idle_at_the_sender_position() -> None:
    pair = Pair()
    connect(pair)
    pair.offer_all([b"x" * 100])
    pair.run_until(lambda: len(pair.delivered) == 1)
    start = len(pair.wire)
    for _ in range(25):
        pair.advance(0.01)
    heartbeats = [parse_datagram_untrusted(d) for who, d in pair.wire[start:] if who == "tx"]
    heartbeats = [f for f in heartbeats if isinstance(f, DataHeader) and f.is_heartbeat]
    assert 2 <= len(heartbeats) <= 3
    assert all(h.flags == 0xC0 and h.term_offset == 160 for h in heartbeats)  # align(32+100)


def test_batching_packs_many_small_messages_into_few_datagrams() -> None:
    pair = Pair()
    connect(pair)
    for i in range(200):
        assert pair.publication.offer(struct.pack("<Q", i) + bytes(56), pair.now) > 0
    pair.step()
    data = [d for who, d in pair.wire if who == "tx" and d[6] == FrameType.DATA and len(d) > 32]
    assert len(data) <= 200 * 96 // 1408 + 2
    assert all(len(d) <= 1408 for d in data)
    pair.run_until(lambda: len(pair.delivered) == 200)


def test_sender_limit_is_sm_position_plus_window() -> None:
    pair = Pair(rcv_wnd=16 * 1024)
    connect(pair)
    image = next(iter(pair.receiver.images.values()))
    assert image.window == 16 * 1024
    # The application reads nothing: consumption stays at 0, so the sender stops at the window.
    pair.step = _step_without_consuming.__get__(pair)  # type: ignore[method-assign]
    for _ in range(100):
        pair.publication.offer(bytes(1000), pair.now)
        pair.advance(0.005)
    sent = max(f.term_offset + f.frame_length for f in data_frames(pair) if f.frame_length)
    assert 16 * 1024 - 1408 <= sent <= 16 * 1024 + 1408


def _step_without_consuming(self: Pair) -> None:
    self.sender.poll(self.now, self._send_tx)
    batch, self.to_rx = self.to_rx, []
    for data in batch:
        self.receiver.on_datagram(data, SENDER, self.now)
    self.receiver.poll(self.now, self._send_rx)
    batch, self.to_tx = self.to_tx, []
    for data in batch:
        self.sender.on_datagram(data, RECEIVER, self.now)


def test_receiver_window_is_min_of_rcv_wnd_and_half_the_term() -> None:
    pair = Pair(term_length=64 * 1024)
    connect(pair)
    sms = [f for f in frames_of(pair, "rx") if isinstance(f, StatusMessage)]
    assert sms[0].receiver_window == 32 * 1024


def test_status_messages_every_200_ms_when_idle() -> None:
    pair = Pair()
    connect(pair)
    start = len([f for f in frames_of(pair, "rx") if isinstance(f, StatusMessage)])
    for _ in range(100):
        pair.advance(0.01)
    sms = len([f for f in frames_of(pair, "rx") if isinstance(f, StatusMessage)]) - start
    assert 4 <= sms <= 6


# ---------------------------------------------------------------- loss, NAK, retransmit


def test_a_lost_datagram_is_naked_after_the_delay_and_retransmitted() -> None:
    lost: set[int] = set()

    def fate(direction: str, index: int, data: bytes) -> int:
        frame_type = struct.unpack_from("<H", data, 6)[0]
        if direction == "tx" and frame_type == FrameType.DATA and len(data) > 32 and not lost:
            if struct.unpack_from("<i", data, 8)[0] > 0:  # the second data datagram
                lost.add(index)
                return 0
        return 1

    pair = Pair(fate=fate)
    connect(pair)
    messages = [bytes([i]) * 1000 for i in range(10)]
    pair.offer_all(messages)
    pair.run_until(lambda: len(pair.delivered) == 10, max_time=2)
    assert pair.delivered == messages
    assert pair.counters_rx.naks_sent >= 1
    assert pair.counters_tx.retransmits_sent >= 1


def test_an_overlapping_nak_is_ignored_while_the_retransmit_lingers() -> None:
    pair = Pair()
    connect(pair)
    pair.offer_all([bytes(500) for _ in range(4)])
    pair.run_until(lambda: len(pair.delivered) == 4)
    publication = pair.publication
    nak = Nak(session_id=42, stream_id=STREAM, term_id=7, term_offset=0, length=544)
    before = pair.counters_tx.retransmits_sent
    publication.on_nak(nak, pair.now)
    publication.on_nak(nak, pair.now)
    pair.step()
    assert pair.counters_tx.retransmits_sent == before + 1
    pair.advance(0.005)
    publication.on_nak(nak, pair.now)  # still lingering (10 ms)
    pair.step()
    assert pair.counters_tx.retransmits_sent == before + 1
    pair.advance(0.011)
    publication.on_nak(nak, pair.now)
    pair.step()
    assert pair.counters_tx.retransmits_sent == before + 2


def test_a_gap_is_renaked_until_filled() -> None:
    dropped: list[int] = []

    def fate(direction: str, index: int, data: bytes) -> int:
        # Lose the first data datagram and its first two retransmissions.
        if direction == "tx" and len(data) > 32 and data[6] == FrameType.DATA:
            if struct.unpack_from("<i", data, 8)[0] == 0 and len(dropped) < 3:
                dropped.append(index)
                return 0
        return 1

    pair = Pair(fate=fate)
    connect(pair)
    pair.offer_all([b"first" * 50, b"second" * 50])
    pair.run_until(lambda: len(pair.delivered) == 2, max_time=2)
    assert pair.counters_rx.naks_sent >= 3
    assert pair.delivered == [b"first" * 50, b"second" * 50]


def test_packets_outside_the_window_are_dropped_and_counted() -> None:
    pair = Pair()
    connect(pair)
    far = DataHeader(
        frame_length=32 + 32,
        flags=0xC0,
        term_offset=40000,
        session_id=42,
        stream_id=STREAM,
        term_id=7,
    ).encode() + bytes(32)
    pair.receiver.on_datagram(far, SENDER, pair.now)
    assert pair.counters_rx.flow_control_overruns == 1


# ---------------------------------------------------------------- liveness and close


def test_image_times_out_after_10_s_and_publication_after_5_s() -> None:
    pair = Pair()
    connect(pair)
    pair.receiver.events.clear()
    pair.fate = lambda direction, i, d: 0  # the cable is cut both ways
    pair.advance(4.9)
    assert pair.publication.is_connected(pair.now)
    pair.advance(0.2)
    assert not pair.publication.is_connected(pair.now)
    pair.advance(4.5)
    assert pair.receiver.images
    pair.advance(0.5)
    assert not pair.receiver.images
    assert any(isinstance(e, ImageUnavailable) for e in pair.receiver.events)


def test_close_sends_end_of_stream_and_both_sides_finish() -> None:
    pair = Pair()
    connect(pair)
    pair.offer_all([b"last words"])
    pair.publication.close(pair.now)
    pair.run_until(lambda: pair.publication.is_done, max_time=2)
    eos = [f for f in data_frames(pair) if f.is_heartbeat and f.flags == 0xE0]
    assert eos
    unavailable = [e for e in pair.receiver.events if isinstance(e, ImageUnavailable)]
    assert unavailable and unavailable[0].reason.value == "end_of_stream"
    assert pair.delivered == [b"last words"]
    assert pair.publication.delivered


# ---------------------------------------------------------------- sessions and odd input


def test_a_session_filter_ignores_other_sessions_silently() -> None:
    pair = Pair(session_filter=43)
    for _ in range(5):
        pair.advance(0.1)
    assert not pair.receiver.images
    assert pair.counters_rx.session_filter_drops >= 5
    assert not [d for who, d in pair.wire if who == "rx"]


def test_data_of_an_unknown_session_elicits_a_setup() -> None:
    pair = Pair(fate=lambda direction, i, d: 0 if (direction == "tx" and i == 0) else 1)
    # The first SETUP is lost; the publication's next datagram that reaches the receiver...
    data = DataHeader(
        frame_length=64, flags=0xC0, term_offset=0, session_id=42, stream_id=STREAM, term_id=7
    ).encode() + bytes(32)
    pair.receiver.on_datagram(data, SENDER, pair.now)
    pair.receiver.poll(pair.now, pair._send_rx)
    sms = [f for f in frames_of(pair, "rx") if isinstance(f, StatusMessage)]
    assert sms and sms[0].flags & 0x80 and sms[0].session_id == 42


def test_term_rotation_returns_admin_action_and_pads_the_term() -> None:
    pair = Pair(term_length=64 * 1024)
    connect(pair)
    publication = pair.publication
    results = []
    message = bytes(8000)
    while len(results) < 20:
        result = publication.offer(message, pair.now)
        results.append(result)
        if result == ADMIN_ACTION:
            break
        pair.run_until(lambda: publication.sender_position == publication.position)
    assert results[-1] == ADMIN_ACTION
    assert publication.offer(message, pair.now) > 64 * 1024


def test_a_message_longer_than_the_maximum_is_refused() -> None:
    pair = Pair(term_length=64 * 1024)
    with pytest.raises(ValueError, match="exceeds the maximum message length 8192"):
        pair.publication.offer(bytes(8193), pair.now)


def test_malformed_datagrams_are_counted_never_raised() -> None:
    pair = Pair()
    rng = random.Random(5)
    for _ in range(2000):
        junk = rng.randbytes(rng.randrange(0, 200))
        pair.receiver.on_datagram(junk, SENDER, pair.now)
        pair.sender.on_datagram(junk, RECEIVER, pair.now)
    assert pair.counters_rx.invalid_frames + pair.counters_tx.invalid_frames >= 3000


# ---------------------------------------------------------------- properties (layer 3)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    loss=st.floats(0.2, 0.35),
    duplicate=st.floats(0.0, 0.1),
    reorder=st.booleans(),
    initial_term_id=st.sampled_from([7, 2**31 - 1, 2**31 - 2, -(2**31)]),
    sizes=st.lists(st.integers(0, 8192), min_size=10, max_size=60),
)
def test_every_message_arrives_once_in_order_intact_despite_loss_duplication_reordering(
    seed: int,
    loss: float,
    duplicate: float,
    reorder: bool,
    initial_term_id: int,
    sizes: list[int],
) -> None:
    rng = random.Random(seed)

    def fate(direction: str, index: int, data: bytes) -> int:
        roll = rng.random()
        if roll < loss:
            return 0
        return 2 if roll < loss + duplicate else 1

    pair = Pair(
        fate=fate,
        reorder=random.Random(seed + 1) if reorder else None,
        initial_term_id=initial_term_id,
        term_length=64 * 1024,
    )
    pair.run_until(lambda: pair.publication.is_connected(pair.now), max_time=30)
    # Enough volume for term rotations (and term-id wraps near 2^31 - 1).
    messages = [rng.randbytes(size) for size in sizes * 4]
    pair.offer_all(messages, max_time=600)
    pair.run_until(lambda: len(pair.delivered) >= len(messages), max_time=600)
    assert pair.delivered == messages


# ---------------------------------------------------------------- the captures (layer 1)


def _rebuild(name: str, port: int) -> tuple[list[bytes], ReceiveEndpoint]:
    from echo.transport.counters import Counters
    from echo.transport.receiver import StreamInterest

    records = read_capture(name)
    endpoint = ReceiveEndpoint(
        counters=Counters(), receiver_id=1, now=records[0].timestamp, limit_amplification=False
    )
    endpoint.add_interest(StreamInterest(stream_id=1001), records[0].timestamp)
    delivered: list[bytes] = []
    for record in records:
        if record.dst_port != port or (record.comment and "DROPPED" in record.comment):
            continue
        endpoint.on_datagram(record.payload, ("127.0.0.1", record.src_port), record.timestamp)
        for image in endpoint.images.values():
            image.poll_messages(delivered.append, 10_000)
        # Our SMs go nowhere (the capture has the C driver's), but sending them moves our
        # window along exactly as it moved the capture's receiver.
        endpoint.poll(record.timestamp, lambda data, address: True)
    return delivered, endpoint


def test_the_receiver_rebuilds_the_captured_unicast_stream() -> None:
    delivered, _ = _rebuild("unicast", 20121)
    assert delivered == [f"Hello World! {i}".encode() for i in range(1, 8)]


def test_the_receiver_rebuilds_the_captured_lossy_stream_across_term_rotations() -> None:
    delivered, endpoint = _rebuild("loss-nak", 20121)
    assert [struct.unpack_from("<Q", m)[0] for m in delivered] == list(range(400))
    assert all(len(m) == 500 for m in delivered)
    events = [e for e in endpoint.events if isinstance(e, ImageAvailable)]
    image = events[0].image
    assert image.window == 32 * 1024
    assert image.subscriber_position == 218368  # as the C driver's rcv-pos


def test_the_receiver_reassembles_the_captured_fragmented_messages() -> None:
    delivered, _ = _rebuild("fragmented", 20121)
    assert [len(m) for m in delivered] == [4000, 4000, 4000]
    assert [struct.unpack_from("<Q", m)[0] for m in delivered] == [0, 1, 2]


def test_position_arithmetic_wraps_term_ids_like_java() -> None:
    bits = 16
    assert compute_position(-(2**31), 0, bits, 2**31 - 1) == 1 << bits
    assert compute_position(2**31 - 1, 32, bits, 2**31 - 1) == 32
