"""Stalls under loss that the B3 loss benchmark (bench/loss.py) found, kept as regression tests.

Pure pair, scripted clock, exactly one datagram dropped (tests/transport/pairlink.py).
"""

from __future__ import annotations

import pytest

from echo.transport.core.frames import DataHeader, Nak, StatusMessage, parse_datagram_untrusted
from tests.transport.pairlink import DELIVER, DROP, Direction, Fate, PairLink


def test_a_lost_window_update_costs_less_than_a_heartbeat_interval() -> None:
    drop_next_sm = False
    dropped: list[float] = []

    def fate(direction: Direction, index: int, data: bytes) -> Fate:
        nonlocal drop_next_sm
        if (
            drop_next_sm
            and direction == "control"
            and isinstance(parse_datagram_untrusted(data), StatusMessage)
        ):
            drop_next_sm = False
            dropped.append(pair.now)
            return DROP
        return DELIVER

    # 1 MiB terms: the receiver window is the default 128 KiB.
    pair = PairLink(term_length=1 << 20, fate=fate)
    pair.connect()
    pair.consuming = False
    for i in range(200):  # 200 x 1 KiB: more than the window
        assert pair.offer(i.to_bytes(8, "little") + bytes(1016)) > 0
    pair.advance(0.05)
    publication = pair.publication
    blocked_at = publication.sender_position
    assert blocked_at < publication.position  # the sender waits for the window to open

    # The application reads everything: the SM that opens the window is the one lost.
    drop_next_sm = True
    pair.consuming = True
    start = pair.now
    pair.run_until(lambda: publication.sender_position > blocked_at, max_time=5)
    resumed_after = pair.now - start

    assert dropped and dropped[0] >= start
    # The receiver repeats an SM that freed a blocked sender until data from beyond the old
    # edge shows it arrived: before any repair time is measured, after Aeron's 10 ms retry.
    # (It was the 200 ms periodic SM.)
    assert resumed_after < 0.012, f"the sender resumed only after {resumed_after * 1000:.1f} ms"


def test_a_sender_blocked_inside_a_frame_is_not_due_at_once() -> None:
    pair = PairLink(term_length=1 << 20)  # window 128 KiB: not a whole number of 1056 B frames
    pair.connect()
    pair.consuming = False
    for i in range(200):
        assert pair.offer(i.to_bytes(8, "little") + bytes(1016)) > 0
    pair.advance(0.05)
    publication = pair.publication
    assert 0 < publication.sender_limit - publication.sender_position < 1056
    sent = len(pair.sent("data"))
    pair.poll_sender()
    assert len(pair.sent("data")) == sent  # nothing fits: a poll now does nothing ...
    # ... so the sender should not ask to be polled again at once.
    assert pair.send_endpoint.next_deadline(pair.now) > pair.now


# ----------------------------------------------------------------- loss recovery timing


def _nak_times(pair: PairLink, offset: int) -> list[float]:
    return [
        time
        for time, frame in pair.frames("control")
        if isinstance(frame, Nak) and frame.term_offset == offset
    ]


def _data_offset(data: bytes) -> int | None:
    header = parse_datagram_untrusted(data)
    if isinstance(header, DataHeader) and header.frame_length:
        return header.term_offset
    return None


def test_unicast_naks_are_retried_after_the_measured_repair_time_not_10_ms() -> None:
    # Two losses: the first is repaired by its first NAK (a repair-time sample, ~0 on the
    # scripted clock); the second loses its first resend too. Its retry then comes after the
    # 0.5 ms floor, not Aeron's fixed 10 ms.
    drops = {"first": 0, "second": 0}

    def fate(direction: Direction, index: int, data: bytes) -> Fate:
        if direction != "data":
            return DELIVER
        offset = _data_offset(data)
        if offset == 1088 and drops["first"] < 1:
            drops["first"] += 1
            return DROP
        if offset == 4352 and drops["second"] < 2:  # the original and the first resend
            drops["second"] += 1
            return DROP
        return DELIVER

    pair = PairLink(fate=fate, max_retransmits=16)
    pair.connect()
    for i in range(6):
        pair.offer(bytes(500) + i.to_bytes(4, "little"))  # 2 per datagram: 0, 1088, 2176
    pair.run_until(lambda: len(pair.received.get(0x1EE7, [])) == 6, max_time=1.0)
    assert len(_nak_times(pair, 1088)) == 1
    for i in range(6, 12):
        pair.offer(bytes(500) + i.to_bytes(4, "little"))  # 3264, 4352, 5440
    pair.run_until(lambda: len(pair.received.get(0x1EE7, [])) == 12, max_time=1.0)
    first, retry = _nak_times(pair, 4352)
    assert retry - first == pytest.approx(0.0005, abs=1e-4)


def test_what_is_left_of_a_gap_under_repair_is_not_naked_again_at_once() -> None:
    # Three datagrams in a row are lost; of their resend (one NAK, three datagrams) the middle
    # one is lost again. The rest of the gap is the tail of a gap being repaired: it waits for
    # the gap's retry time instead of being NAKed 100 µs after the partial repair.
    # Originals of 1088, 2176, 3264; and the first resend of the middle one.
    lost = {1088: 1, 2176: 2, 3264: 1}

    def fate(direction: Direction, index: int, data: bytes) -> Fate:
        if direction != "data":
            return DELIVER
        offset = _data_offset(data)
        if offset is not None and lost.get(offset):
            lost[offset] -= 1
            return DROP
        return DELIVER

    pair = PairLink(fate=fate, max_retransmits=16)
    pair.connect()
    for i in range(10):
        pair.offer(bytes(500) + i.to_bytes(4, "little"))  # 5 datagrams: 0 .. 4352
    pair.run_until(lambda: len(pair.received.get(0x1EE7, [])) == 10, max_time=1.0)
    first_nak = _nak_times(pair, 1088)
    assert len(first_nak) == 1  # one NAK for the whole gap [1088, 4352)
    retry = _nak_times(pair, 2176)
    assert len(retry) == 1
    # Before repair-time samples exist (the resent middle was lost, the others gave samples
    # of ~0 on the scripted clock): the retry comes after the 0.5 ms floor, not at 100 µs.
    assert retry[0] - first_nak[0] >= 0.0005 - 1e-9


def test_a_probe_at_the_edge_of_the_previous_window_gets_an_sm_at_once() -> None:
    # Image level: the receiver sent an SM moving the window; the sender then probes at the
    # edge of the window before it, i.e. it never got that SM: the image answers at once.
    pair = PairLink(term_length=1 << 20)
    pair.connect()
    image = pair.image
    window = image.window
    old_edge = image.last_sm_position + window
    # Consume half a window and let the SM that reports it go (the window update).
    for _ in range(64):
        assert pair.offer(bytes(1024)) > 0
    pair.pump()
    assert image.last_sm_position > 0
    heartbeat = DataHeader(
        frame_length=0,
        flags=0xC0,
        term_offset=old_edge - 1408,
        session_id=image.session_id,
        stream_id=image.stream_id,
        term_id=0,
    ).encode()
    sms_before = pair.receiver_counters.status_messages_sent
    pair.now += 0.01  # well before the next periodic SM
    pair.inject_to_receiver(heartbeat)
    pair.poll_receiver()
    assert pair.receiver_counters.status_messages_sent == sms_before + 1


def test_repeated_probes_from_one_position_get_an_sm_even_after_several_were_lost() -> None:
    # Two window updates lost in a row: the sender waits at an edge older than the one the
    # image remembers as "previous". Its probes, from one position a few ms apart (an idle
    # sender beats every 100 ms or more), make the image answer at once all the same.
    pair = PairLink(term_length=1 << 20)
    pair.connect()
    image = pair.image
    pair.now += 0.3  # past any recent window update
    pair.pump()

    def probe(at: float) -> int:
        pair.now = at
        heartbeat = DataHeader(
            frame_length=0,
            flags=0xC0,
            term_offset=64 * 1024,  # far from any edge the image knows of
            session_id=image.session_id,
            stream_id=image.stream_id,
            term_id=0,
        ).encode()
        before = pair.receiver_counters.status_messages_sent
        pair.inject_to_receiver(heartbeat)
        pair.poll_receiver()
        return pair.receiver_counters.status_messages_sent - before

    start = pair.now
    assert probe(start) == 0  # one heartbeat: an idle sender, nothing to answer
    assert probe(start + 0.004) == 1  # again from there 4 ms later: a blocked sender's probe
    assert probe(start + 0.07) == 0  # 66 ms later: an idle heartbeat again, not a probe


def test_a_sender_that_fills_the_window_sends_a_heartbeat_right_behind_its_data() -> None:
    # A lost tail (the last datagrams before the window shut) is only found when something
    # from beyond it arrives: the blocked sender tells the receiver where it stopped at once.
    pair = PairLink(term_length=1 << 20)
    pair.connect()
    pair.consuming = False
    for _ in range(200):
        assert pair.offer(bytes(1024)) > 0
    pair.pump()
    sent = pair.data_headers()
    last = max(i for i, (_, header) in enumerate(sent) if header.frame_length)
    assert pair.publication.sender_position < pair.publication.position  # blocked
    # Next on the wire, at the same moment: a heartbeat at the position where the data ended.
    (time, header), (then, heartbeat) = sent[last], sent[last + 1]
    assert heartbeat.frame_length == 0 and then == time
    assert heartbeat.term_offset == header.term_offset + 1056


def test_a_lost_term_tail_whose_pad_took_the_sender_past_the_window_is_naked() -> None:
    # 300 B messages are 352 B frames: a 64 KiB term holds 186 of them and ends in a 64 B PAD
    # at 65472. The receiver's SM reports 93 frames (32736): the window (32 KiB) ends at 65504,
    # inside that PAD. The sender sends the rest of the term and the PAD's header (it fits),
    # which takes its position to the next term, 32 B past the window's edge. All of that is
    # lost (one GSO batch); the sender waits at 65536 and says so in heartbeats. Those are
    # past the window the receiver gave: ignored, the receiver saw no gap, never NAKed, and
    # both sides waited for ever (the netlab MDC loss test: 465 = 2 x 186 + 93 received).
    term_length = 64 * 1024
    lost: dict[int, int] = {}  # term offset -> where the lost datagram ended

    def fate(direction: Direction, index: int, data: bytes) -> Fate:
        header = parse_datagram_untrusted(data) if direction == "data" else None
        if (
            isinstance(header, DataHeader)
            and header.frame_length
            and header.term_id == 0
            and header.term_offset >= 93 * 352
            and header.term_offset not in lost
        ):
            lost[header.term_offset] = header.term_offset + len(data)  # resends get through
            return DROP
        return DELIVER

    pair = PairLink(term_length=term_length, fate=fate)
    pair.connect()
    assert pair.image.window == term_length // 2
    messages = [i.to_bytes(4, "little") + bytes(296) for i in range(2 * 186)]
    for message in messages[:93]:
        assert pair.offer(message) > 0
    pair.run_until(lambda: pair.publication.sender_limit == 93 * 352 + term_length // 2)

    pair.offer_all(messages[93:], max_time=5.0)
    pair.run_until(lambda: len(pair.received.get(0x1EE7, [])) == len(messages), max_time=5.0)
    assert pair.received[0x1EE7] == messages
    assert max(lost.values()) == 65472 + 32  # the PAD's header was among the lost
    assert pair.receiver_counters.naks_sent > 0
