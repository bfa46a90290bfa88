"""The term log: position arithmetic, appender, scanner, rebuilder and gap scanner (as in Aeron).

Where a capture of the Aeron C driver shows the layout (fragmented, unicast, loss-nak), the
term bytes written here are compared with the captured datagrams byte for byte.
"""

from __future__ import annotations

import struct
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echo.transport.core.frames import (
    BEGIN_FLAG,
    DATA_HEADER_LENGTH,
    DATA_HEADER_STRUCT,
    END_FLAG,
    UNFRAGMENTED_FLAGS,
    DataHeader,
    FrameType,
    align,
    parse_datagram_untrusted,
)
from echo.transport.core.logbuffer import (
    FLAGS_SHIFT,
    FRAME_LENGTH_MASK,
    TYPE_SHIFT,
    TermBuffers,
    append_message,
    check_term_length,
    compute_fragmented_length,
    compute_max_message_length,
    compute_position,
    compute_term_begin_position,
    compute_term_id,
    i32,
    insert_packet,
    int_view,
    max_possible_position,
    partition_index,
    position_bits_to_shift,
    rebuild_offset,
    scan_for_availability,
    scan_for_gap,
    write_frame,
    write_pad,
)
from tests.transport.pcapng import read_capture

_LITTLE_ENDIAN_HOST = sys.byteorder == "little"
DROPPED_COMMENT = "DROPPED_BY_NFTABLES_INPUT_HOOK_never_delivered_to_the_socket"
KIB = 1024
MIB = 1024 * 1024


def _scan(term: memoryview, offset: int, max_length: int) -> tuple[int, int]:
    return scan_for_availability(int_view(term, "i"), offset, max_length, len(term))


def headers(term: memoryview, start: int, end: int) -> list[tuple[int, int, int, int]]:
    """(frame_length, flags, type, term_offset) of each frame in [start, end)."""
    out = []
    offset = start
    while offset < end:
        length, _, flags, ftype, toff, *_ = DATA_HEADER_STRUCT.unpack_from(term, offset)
        if length <= 0:
            break
        out.append((length, flags, ftype, toff))
        offset += align(length)
    return out


# --------------------------------------------------------------------------- position arithmetic


def test_i32_wraps_like_java_int() -> None:
    assert i32(0) == 0
    assert i32(2**31 - 1) == 2**31 - 1
    assert i32(2**31) == -(2**31)
    assert i32(2**32) == 0
    assert i32(-(2**31) - 1) == 2**31 - 1
    assert i32(2**31 - 1 + 1) == -(2**31)
    assert i32(-1) == -1


def test_positions_across_the_term_id_wrap() -> None:
    initial = 2**31 - 2
    bits = position_bits_to_shift(64 * KIB)
    assert bits == 16
    term_ids = [2**31 - 2, 2**31 - 1, -(2**31), -(2**31) + 1]
    for count, term_id in enumerate(term_ids):
        begin = count << bits
        assert compute_term_id(begin, bits, initial) == term_id
        assert compute_term_id(begin + 65535, bits, initial) == term_id
        assert compute_term_begin_position(term_id, bits, initial) == begin
        assert compute_position(term_id, 4096, bits, initial) == begin + 4096
        assert partition_index(begin + 100, bits) == count % 3
    # The wrap itself: from 2^31 - 1 to -2^31 is one term, not -2^32 terms.
    assert compute_position(-(2**31), 0, bits, initial) == 2 * 65536
    assert compute_position(-(2**31) + 1, 32, bits, initial) == 3 * 65536 + 32


def test_position_of_a_term_id_that_wrapped_past_the_initial_one() -> None:
    # initial term id negative, active positive: the subtraction must wrap to a small count.
    bits = position_bits_to_shift(16 * MIB)
    assert compute_position(-(2**31) + 5, 64, bits, 2**31 - 1) == (6 << bits) + 64


@settings(max_examples=300)
@given(
    initial=st.integers(-(2**31), 2**31 - 1),
    term_count=st.integers(0, 2**31 - 1),
    bits=st.integers(16, 30),
    data=st.data(),
)
def test_position_round_trip(initial: int, term_count: int, bits: int, data: st.DataObject) -> None:
    offset = data.draw(st.integers(0, (1 << bits) - 1))
    position = (term_count << bits) + offset
    term_id = compute_term_id(position, bits, initial)
    assert -(2**31) <= term_id < 2**31
    assert term_id == i32(initial + term_count)
    assert compute_position(term_id, position & ((1 << bits) - 1), bits, initial) == position
    assert compute_term_begin_position(term_id, bits, initial) == term_count << bits


def test_lengths_and_limits() -> None:
    assert compute_max_message_length(64 * KIB) == 8 * KIB
    assert compute_max_message_length(16 * MIB) == 2 * MIB
    assert compute_max_message_length(1024 * MIB) == 16 * MIB
    assert max_possible_position(64 * KIB) == 64 * KIB * 2**31
    for good in (64 * KIB, 1 * MIB, 1024 * MIB):
        check_term_length(good)
    for bad in (32 * KIB, 64 * KIB + 32, 3 * 64 * KIB, 2048 * MIB):
        with pytest.raises(ValueError):
            check_term_length(bad)


# --------------------------------------------------------------------------- the appender


def test_fragmented_capture_layout() -> None:
    """4000 bytes at mtu 1408: 1408/1408/1280 at 0/1408/2816 (B, -, E); next message at 4096."""
    log = TermBuffers(16 * MIB)
    term = log.terms[0]
    max_payload = 1408 - DATA_HEADER_LENGTH
    assert compute_fragmented_length(4000, max_payload) == 4096
    tail = 0
    for index in range(3):
        data = struct.pack("<Q", index) + bytes(3992)
        start = tail
        tail = append_message(
            term, tail, data, max_payload, session_id=-1, stream_id=1001, term_id=7
        )
        assert tail - start == 4096
        assert headers(term, start, tail) == [
            (1408, BEGIN_FLAG, FrameType.DATA, start),
            (1408, 0x00, FrameType.DATA, start + 1408),
            (1280, END_FLAG, FrameType.DATA, start + 2816),
        ]
    assert tail == 12288
    log.close()


def _payload_of(record_payload: bytes) -> DataHeader:
    frame = parse_datagram_untrusted(record_payload)
    assert isinstance(frame, DataHeader)
    return frame


def test_appender_writes_the_fragmented_capture_byte_for_byte() -> None:
    records = [r for r in read_capture("fragmented") if r.payload[6:8] == b"\x01\x00"]
    data_records = [r for r in records if _payload_of(r.payload).frame_length > 0]
    assert len(data_records) == 9
    first = _payload_of(data_records[0].payload)
    log = TermBuffers(16 * MIB)
    term = log.terms[0]
    tail = 0
    for index in range(3):
        tail = append_message(
            term,
            tail,
            struct.pack("<Q", index) + bytes(3992),
            1376,
            session_id=first.session_id,
            stream_id=first.stream_id,
            term_id=first.term_id,
        )
    for record in data_records:
        offset = _payload_of(record.payload).term_offset
        assert bytes(term[offset : offset + len(record.payload)]) == record.payload
    log.close()


def test_appender_writes_the_unicast_capture_byte_for_byte() -> None:
    data_records = [
        r
        for r in read_capture("unicast")
        if r.payload[6:8] == b"\x01\x00" and _payload_of(r.payload).frame_length > 0
    ]
    assert len(data_records) == 7
    first = _payload_of(data_records[0].payload)
    log = TermBuffers(16 * MIB)
    term = log.terms[0]
    tail = 0
    for n in range(1, 8):
        tail = append_message(
            term,
            tail,
            f"Hello World! {n}".encode(),
            1376,
            session_id=first.session_id,
            stream_id=first.stream_id,
            term_id=first.term_id,
        )
    assert tail == 448  # the EOS heartbeats' offset in the capture
    for record in data_records:
        offset = _payload_of(record.payload).term_offset
        assert bytes(term[offset : offset + len(record.payload)]) == record.payload
    log.close()


@settings(max_examples=200)
@given(
    length=st.one_of(
        st.integers(0, 9000), st.sampled_from([0, 1, 1375, 1376, 1377, 2752, 2753, 8192])
    ),
    mtu=st.sampled_from([64, 96, 1408, 4096, 8192]),
    start=st.integers(0, 64).map(lambda n: n * 32),
)
def test_fragmented_length_is_what_append_writes(length: int, mtu: int, start: int) -> None:
    term_length = 64 * KIB
    max_payload = mtu - DATA_HEADER_LENGTH
    log = TermBuffers(term_length)
    term = log.terms[1]
    data = bytes((i * 7 + 3) & 0xFF for i in range(length))
    tail = append_message(term, start, data, max_payload, session_id=5, stream_id=6, term_id=-9)
    assert tail - start == compute_fragmented_length(length, max_payload)
    frames = headers(term, start, tail)
    # Every frame but the last is full; B on the first, E on the last, none in between.
    assert sum(f[0] - DATA_HEADER_LENGTH for f in frames) == length
    assert len(frames) == max(1, -(-length // max_payload))
    if len(frames) == 1:
        assert frames[0][1] == UNFRAGMENTED_FLAGS
    else:
        assert frames[0][1] == BEGIN_FLAG
        assert frames[-1][1] == END_FLAG
        assert all(f[1] == 0 for f in frames[1:-1])
        assert all(f[0] == mtu for f in frames[:-1])
    offset = start
    rebuilt = b""
    for frame_length, _, ftype, toff in frames:
        assert ftype == FrameType.DATA and toff == offset
        rebuilt += bytes(term[offset + DATA_HEADER_LENGTH : offset + frame_length])
        offset += align(frame_length)
    assert rebuilt == data
    log.close()


def test_pad_at_term_end_writes_only_its_header() -> None:
    log = TermBuffers(64 * KIB)
    term = log.terms[0]
    term[65280 + 32 : 65536] = b"\xaa" * (256 - 32)  # marks: PAD must not write its body
    write_pad(term, 65280, session_id=11, stream_id=12, term_id=13)
    assert DATA_HEADER_STRUCT.unpack_from(term, 65280) == (
        256,
        0,
        UNFRAGMENTED_FLAGS,
        FrameType.PAD,
        65280,
        11,
        12,
        13,
        0,
    )
    assert bytes(term[65280 + 32 :]) == b"\xaa" * 224
    log.close()


# --------------------------------------------------------------------------- the scanner


def _loss_nak_term(term: memoryview, *, session_id: int, term_id: int, first: int = 0) -> None:
    """One term of the loss-nak capture: 120 messages of 500 bytes, then a 256-byte PAD."""
    tail = 0
    for index in range(first, first + 120):
        data = struct.pack("<Q", index) + bytes(492)
        tail = append_message(
            term, tail, data, 1376, session_id=session_id, stream_id=1001, term_id=term_id
        )
    assert tail == 65280
    write_pad(term, tail, session_id=session_id, stream_id=1001, term_id=term_id)


def test_scan_batches_frames_up_to_the_mtu() -> None:
    log = TermBuffers(64 * KIB)
    term = log.terms[0]
    _loss_nak_term(term, session_id=1, term_id=2)
    assert _scan(term, 0, 1408) == (1088, 0)  # 2 x 544; a third would be 1632
    assert _scan(term, 0, 1088) == (1088, 0)
    assert _scan(term, 0, 1087) == (544, 0)
    assert _scan(term, 0, 543) == (0, 0)  # a frame is never split
    assert _scan(term, 0, 65536) == (65280 + 32, 224)
    # The end of the term: 544 + 544 + the PAD's 32-byte header, and 224 bytes skipped.
    assert _scan(term, 65280 - 1088, 1408) == (1120, 224)
    assert _scan(term, 65280 - 544, 1408) == (576, 224)
    assert _scan(term, 65280, 1408) == (32, 224)
    # A PAD that does not fit behind the data is left for the next datagram, padding and all.
    assert _scan(term, 65280 - 544, 560) == (544, 0)
    log.close()


def test_scan_stops_at_the_first_empty_slot_and_at_the_term_end() -> None:
    log = TermBuffers(64 * KIB)
    term = log.terms[0]
    assert _scan(term, 0, 1408) == (0, 0)
    end = append_message(term, 0, b"x" * 10, 1376, session_id=1, stream_id=1, term_id=1)
    append_message(term, end + 32, b"y", 1376, session_id=1, stream_id=1, term_id=1)
    assert _scan(term, 0, 1408) == (64, 0)
    last = 65536 - 64
    append_message(term, last, b"z" * 32, 1376, session_id=1, stream_id=1, term_id=1)
    assert _scan(term, last, 1408) == (64, 0)
    log.close()


def test_loss_nak_capture_datagrams_are_term_slices() -> None:
    """Every original DATA/PAD datagram of the loss-nak capture is the bytes our appender and
    PAD writer put at its offset, and its length is what the scanner can batch there."""
    records = read_capture("loss-nak")
    data = []
    for record in records:
        frame = parse_datagram_untrusted(record.payload)
        if isinstance(frame, DataHeader) and not frame.is_heartbeat:
            data.append((record, frame))
    initial = data[0][1].term_id
    session_id = data[0][1].session_id
    built: dict[int, memoryview] = {}
    seen = set()
    for record, frame in data:
        count = i32(frame.term_id - initial)
        if count not in built:
            term = memoryview(bytearray(64 * KIB))
            _loss_nak_term(term, session_id=session_id, term_id=frame.term_id, first=120 * count)
            built[count] = term
        term = built[count]
        offset = frame.term_offset
        assert bytes(term[offset : offset + len(record.payload)]) == record.payload
        available, padding = _scan(term, offset, len(record.payload))
        assert available == len(record.payload)
        assert padding == (224 if frame.is_pad or len(record.payload) % 544 == 32 else 0)
        seen.add(len(record.payload))
    assert {1088, 1120, 576} <= seen
    assert sorted(built) == [0, 1, 2, 3]


# --------------------------------------------------------------------------- the rebuilder


def test_insert_packet_never_overwrites() -> None:
    log = TermBuffers(64 * KIB)
    term = log.terms[0]
    first = DataHeader(46, UNFRAGMENTED_FLAGS, 64, 1, 2, 3).encode() + b"A" * 14 + bytes(18)
    other = DataHeader(46, UNFRAGMENTED_FLAGS, 64, 1, 2, 3).encode() + b"B" * 14 + bytes(18)
    assert insert_packet(term, int_view(term, "i"), 64, first) is True
    assert insert_packet(term, int_view(term, "i"), 64, other) is False
    assert bytes(term[64:128]) == first
    assert bytes(term[0:64]) == bytes(64)
    log.close()


def _frame(term: memoryview, offset: int, payload_length: int) -> int:
    return write_frame(
        term,
        offset,
        flags=UNFRAGMENTED_FLAGS,
        frame_type=FrameType.DATA,
        session_id=1,
        stream_id=2,
        term_id=3,
        payload=bytes([0x5A]) * payload_length,
    )


def test_rebuild_and_gap_scan() -> None:
    log = TermBuffers(64 * KIB)
    term = log.terms[0]
    _frame(term, 0, 14)  # [0, 64)
    _frame(term, 64, 20)  # [64, 128)
    # gap [128, 384), then a frame whose frame_length is 256: its first byte is zero
    _frame(term, 384, 256 - 32)
    assert term[384] == 0 and DATA_HEADER_STRUCT.unpack_from(term, 384)[0] == 256
    assert rebuild_offset(int_view(term, "i"), 0, 65536) == 128
    assert rebuild_offset(int_view(term, "i"), 0, 64) == 64
    assert rebuild_offset(int_view(term, "i"), 384, 65536) == 640
    assert scan_for_gap(term, int_view(term, "i"), 0, 640) == (128, 256)
    assert scan_for_gap(term, int_view(term, "i"), 0, 200) == (128, 72)  # a gap ends at the limit
    assert scan_for_gap(term, int_view(term, "i"), 0, 128) is None
    assert scan_for_gap(term, int_view(term, "i"), 384, 640) is None
    # frame_length 65536 - x: two leading zero bytes
    _frame(term, 1024, 512 - 32)
    assert scan_for_gap(term, int_view(term, "i"), 384, 2048) == (640, 384)
    assert scan_for_gap(term, int_view(term, "i"), 1024, 4096) == (1536, 4096 - 1536)
    log.close()


def _naive_gap(slots: list[int], start: int, limit: int) -> tuple[int, int] | None:
    """Slot-by-slot reference: slots[i] = frame length starting at slot i (0 = empty)."""
    offset = start
    while offset < limit and slots[offset // 32]:
        offset += align(slots[offset // 32])
    if offset >= limit:
        return None
    end = offset
    while end < limit and not slots[end // 32]:
        end += 32
    return offset, end - offset


@settings(max_examples=200)
@given(st.data())
def test_gap_scan_matches_a_slot_by_slot_scan(data: st.DataObject) -> None:
    term_length = 64 * KIB
    log = TermBuffers(term_length)
    term = log.terms[2]
    slots = [0] * (term_length // 32)
    offset = data.draw(st.integers(0, 8).map(lambda n: n * 32))
    start = offset
    for _ in range(data.draw(st.integers(0, 12))):
        payload = data.draw(st.sampled_from([0, 1, 14, 224, 480, 500, 992, 1376, 4064]))
        present = data.draw(st.booleans())
        if offset + align(payload + 32) > term_length:
            break
        if present:
            _frame(term, offset, payload)
            slots[offset // 32] = payload + 32
        offset += align(payload + 32)
    limit = data.draw(st.integers(start // 32, term_length // 32).map(lambda n: n * 32))
    limit = max(limit, start)
    assert scan_for_gap(term, int_view(term, "i"), start, limit) == _naive_gap(slots, start, limit)
    log.close()


# --------------------------------------------------------------------------- term buffers


def test_clean_zeroes_one_term_and_leaves_the_others() -> None:
    log = TermBuffers(64 * KIB)
    for index in range(3):
        log.terms[index][:] = bytes([index + 1]) * (64 * KIB)
    log.clean(1)
    assert bytes(log.terms[1]) == bytes(64 * KIB)
    assert bytes(log.terms[0]) == b"\x01" * (64 * KIB)
    assert bytes(log.terms[2]) == b"\x03" * (64 * KIB)
    # Still usable after cleaning.
    _frame(log.terms[1], 32, 10)
    assert rebuild_offset(log.lengths[1], 32, 64 * KIB) == 96
    log.close()


@pytest.mark.parametrize("little_endian", [True, False], ids=["native", "portable"])
def test_int_views_read_the_wire_byte_order_on_any_host(little_endian: bool) -> None:
    # Native int views are used where the host is little-endian, as the wire is; elsewhere
    # struct-backed views. Both must read a header's length, flags and type as the wire has
    # them, and every reader built on them must agree.
    if little_endian and not _LITTLE_ENDIAN_HOST:
        pytest.skip("a native int view reads the wire's order only on a little-endian host")
    log = TermBuffers(64 * KIB)
    term = log.terms[0]
    write_frame(
        term, 64, flags=UNFRAGMENTED_FLAGS, frame_type=FrameType.DATA, session_id=-7,
        stream_id=1001, term_id=0x12345678, payload=b"x" * 40,
    )
    write_pad(term, 160, session_id=-7, stream_id=1001, term_id=0x12345678)  # 64 + 96
    lengths = int_view(term, "i", little_endian)
    words = int_view(term, "q", little_endian)
    assert [lengths[i] for i in (16, 18, 19, 20, 40)] == [72, 64, -7, 1001, 64 * KIB - 160]
    word = words[64 >> 3]
    assert word & FRAME_LENGTH_MASK == 72
    assert (word >> FLAGS_SHIFT) & 0xFF == UNFRAGMENTED_FLAGS
    assert word >> TYPE_SHIFT == FrameType.DATA
    assert words[160 >> 3] >> TYPE_SHIFT == FrameType.PAD
    assert words[160 >> 3] & FRAME_LENGTH_MASK == lengths[160 >> 2] == 64 * KIB - 160
    assert words[0] == lengths[0] == 0
    assert rebuild_offset(lengths, 64, 64 * KIB) == 64 * KIB  # the PAD stands for the rest
    assert scan_for_availability(lengths, 64, 1408, 64 * KIB) == (128, 64 * KIB - 192)
    assert insert_packet(term, lengths, 64, bytes(96)) is False
    assert insert_packet(term, lengths, 0, b"\x01" + bytes(63)) is True
    # A negative length (a corrupt header) reads as negative, not as 4 GiB: no frame there.
    DATA_HEADER_STRUCT.pack_into(term, 0, -32, 0, 0, 1, 0, 0, 0, 0, 0)
    assert lengths[0] == -32
    assert rebuild_offset(lengths, 0, 64 * KIB) == 0
    lengths.release()
    words.release()
    log.close()


def test_a_data_frame_that_ends_the_term_is_not_taken_for_a_pad() -> None:
    # The scanner reads a frame's type only when it reaches the end of the term (a PAD always
    # does): a DATA frame there must still go out whole, with nothing skipped.
    log = TermBuffers(64 * KIB)
    term = log.terms[0]
    last = 64 * KIB - 96
    append_message(term, last, b"z" * 64, 1376, session_id=1, stream_id=1, term_id=1)
    assert scan_for_availability(log.lengths[0], last, 1408, 64 * KIB) == (96, 0)
    log.close()
