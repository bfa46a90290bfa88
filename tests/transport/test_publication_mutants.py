"""NetworkPublication's rules that mutation testing found untested (./dev mutate publication).

Each test drives one publication by hand: `now` is a float the test picks, status messages,
NAKs, RTTMs and ERRs are handed in as frames, and `emit` is a list that records every
datagram (or refuses them: 0 when there is no destination, WOULD_BLOCK when the socket buffer
is full). Frames of 992-byte messages are 1024 bytes, one to a datagram at mtu 1408, so
positions are easy to count; the initial term id is not 0, so a term id that ignores it is
wrong.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from echo.transport.core.config import SenderTimers
from echo.transport.core.counters import Counters
from echo.transport.core.flow_control import MinMulticastFlowControl, UnicastFlowControl
from echo.transport.core.frames import (
    RTTM_REPLY_FLAG,
    SETUP_GROUP_FLAG,
    SM_EOS_FLAG,
    SM_SETUP_FLAG,
    DataHeader,
    ErrorFrame,
    Frame,
    Nak,
    Rttm,
    Setup,
    StatusMessage,
    parse_datagram_untrusted,
)
from echo.transport.core.publication import (
    ADMIN_ACTION,
    CLOSED,
    WOULD_BLOCK,
    NetworkPublication,
)

TERM = 64 * 1024
INITIAL = 5
SESSION = 77
STREAM = 1001
RECEIVER = 9
MTU = 1408
PAYLOAD = 992  # with its 32-byte header: a 1024-byte frame, one per datagram
FRAME = 1024


class Wire:
    """What `emit` handed to the network; `result` is what each send returns (1: sent to one
    destination, 0: nowhere to send, WOULD_BLOCK: the socket buffer is full)."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.result = 1

    def emit(self, datagram: bytes | memoryview, segment: int = 0) -> int:
        if self.result > 0:
            self.sent.append(bytes(datagram))
        return self.result

    def frames(self) -> list[Frame]:
        return [parse_datagram_untrusted(d) for d in self.sent]

    def data(self) -> list[DataHeader]:
        return [f for f in self.frames() if isinstance(f, DataHeader) and not f.is_heartbeat]

    def heartbeats(self) -> list[DataHeader]:
        return [f for f in self.frames() if isinstance(f, DataHeader) and f.is_heartbeat]

    def setups(self) -> list[Setup]:
        return [f for f in self.frames() if isinstance(f, Setup)]

    def rttms(self) -> list[Rttm]:
        return [f for f in self.frames() if isinstance(f, Rttm)]

    def clear(self) -> None:
        self.sent.clear()


def publication(**overrides: Any) -> NetworkPublication:
    args: dict[str, Any] = {
        "session_id": SESSION,
        "stream_id": STREAM,
        "initial_term_id": INITIAL,
        "term_length": TERM,
        "mtu": MTU,
        "flow_control": UnicastFlowControl(),
        "counters": Counters(),
        "now": 0.0,
    }
    args.update(overrides)
    return NetworkPublication(**args)


def sm(
    position: int, window: int = TERM // 2, flags: int = 0, receiver_id: int = RECEIVER
) -> StatusMessage:
    return StatusMessage(
        session_id=SESSION,
        stream_id=STREAM,
        consumption_term_id=INITIAL + (position // TERM),
        consumption_term_offset=position % TERM,
        receiver_window=window,
        receiver_id=receiver_id,
        flags=flags,
    )


def nak(position: int, length: int) -> Nak:
    return Nak(SESSION, STREAM, INITIAL + position // TERM, position % TERM, length)


def offer(pub: NetworkPublication, count: int, now: float) -> None:
    for _ in range(count):
        result = pub.offer(b"m" * PAYLOAD, now)
        if result == ADMIN_ACTION:  # the term is full: the log rotated, offer again
            result = pub.offer(b"m" * PAYLOAD, now)
        assert result > 0


def send_acknowledged(pub: NetworkPublication, frames: int, wire: Wire, window: int) -> float:
    """Offer and send `frames` frames, each SM acknowledging everything sent so far (so the
    log moves on past the term window); returns the time reached."""
    now = 0.0
    for _ in range(frames):
        pub.on_status_message(sm(pub.sender_position, window), now)
        offer(pub, 1, now)
        pub.send_pending(now, wire.emit)
        now += 0.001
    pub.on_status_message(sm(pub.sender_position, window), now)
    return now


# ---------------------------------------------------------------- connection and limits


def test_a_closed_publication_is_not_connected_even_with_a_live_receiver() -> None:
    pub = publication()
    pub.on_status_message(sm(0), 0.0)
    assert pub.is_connected(0.1)
    pub.abort()
    assert pub.is_done
    assert not pub.is_connected(0.1)


def test_the_publisher_limit_is_a_term_window_ahead_of_the_sender_only_while_connected() -> None:
    pub = publication()
    assert pub.publisher_limit(0.0) == 0  # nobody heard from: nothing may be offered
    pub.on_status_message(sm(0, window=2 * FRAME), 0.0)
    assert pub.publisher_limit(0.0) == TERM // 2
    assert type(pub.publisher_limit(0.0)) is int  # a position, never a float
    offer(pub, 3, 0.0)
    pub.send_pending(0.0, Wire().emit)
    assert pub.sender_position == 2 * FRAME
    assert pub.publisher_limit(0.0) == 2 * FRAME + TERM // 2
    # The receiver falls silent: after the connection timeout the limit is the sender's.
    assert pub.publisher_limit(6.0) == 2 * FRAME


def test_an_error_frame_from_the_only_receiver_disconnects_the_publication() -> None:
    pub = publication()
    pub.on_status_message(sm(0), 0.0)
    assert pub.is_connected(0.0)
    pub.on_error_frame(ErrorFrame(SESSION, STREAM, RECEIVER, 1, "refused"), 0.0)
    assert not pub.is_connected(0.0)


def test_an_end_of_stream_sm_marks_the_receiver_left_and_a_later_sm_clears_it() -> None:
    pub = publication()
    assert pub.receiver_left is False  # nobody heard from is nobody who left
    pub.on_status_message(sm(0), 0.0)
    assert pub.receiver_left is False
    pub.on_status_message(sm(0, flags=SM_EOS_FLAG), 0.1)
    assert pub.receiver_left is True
    assert not pub.is_connected(0.1)
    pub.on_status_message(sm(0), 0.2)  # a new subscription on the same channel
    assert pub.receiver_left is False
    assert pub.is_connected(0.2)


def test_min_flow_control_drops_a_silent_receiver_from_the_limit_after_its_timeout() -> None:
    # Aeron's min multicast flow control: the slowest live receiver holds the limit, and one
    # silent for its receiver timeout stops holding it (checked on the sender's idle poll).
    pub = publication(flow_control=MinMulticastFlowControl(receiver_timeout=2.0))
    wire = Wire()
    pub.on_status_message(sm(0, window=8 * FRAME, receiver_id=1), 0.0)
    pub.on_status_message(sm(0, window=2 * FRAME, receiver_id=2), 0.0)
    offer(pub, 8, 0.0)
    pub.poll(0.0, wire.emit)
    assert pub.sender_position == 2 * FRAME  # receiver 2's window
    now = 0.5
    while now <= 1.5:
        pub.on_status_message(sm(pub.sender_position, window=8 * FRAME, receiver_id=1), now)
        pub.poll(now, wire.emit)
        now += 0.5
    assert pub.sender_position == 2 * FRAME  # receiver 2 is still within its timeout
    pub.on_status_message(sm(pub.sender_position, window=8 * FRAME, receiver_id=1), 2.5)
    pub.poll(2.5, wire.emit)  # receiver 2 timed out: receiver 1 alone sets the limit
    pub.poll(2.5, wire.emit)
    assert pub.sender_position == 8 * FRAME


# ---------------------------------------------------------------- SETUP


def test_setup_eliciting_sms_do_not_hurry_a_setup_already_pending() -> None:
    # A flood of setup-eliciting SMs gets at most one SETUP per setup interval.
    pub = publication()
    wire = Wire()
    pub.poll(0.0, wire.emit)
    assert len(wire.setups()) == 1
    eliciting = StatusMessage(SESSION, STREAM, 0, 0, 0, RECEIVER, flags=SM_SETUP_FLAG)
    pub.on_status_message(eliciting, 0.05)
    pub.poll(0.05, wire.emit)
    assert len(wire.setups()) == 1
    pub.poll(0.1, wire.emit)
    assert len(wire.setups()) == 2


def test_a_setup_eliciting_sm_after_connection_gets_a_setup_at_once() -> None:
    pub = publication()
    wire = Wire()
    pub.poll(0.0, wire.emit)
    pub.on_status_message(sm(0), 0.01)  # connected: SETUPs stop
    pub.poll(0.5, wire.emit)
    assert len(wire.setups()) == 1
    eliciting = StatusMessage(SESSION, STREAM, 0, 0, 0, RECEIVER, flags=SM_SETUP_FLAG)
    pub.on_status_message(eliciting, 0.51)
    pub.poll(0.51, wire.emit)
    assert len(wire.setups()) == 2


def test_the_setup_names_the_term_of_the_sender_position_and_carries_ttl_and_group_flag() -> None:
    pub = publication(is_group=True, ttl=7)
    wire = Wire()
    send_acknowledged(pub, 66, wire, TERM // 2)  # 64 frames fill term 0: two are in term 1
    assert pub.sender_position == TERM + 2 * FRAME
    setup = parse_datagram_untrusted(pub.setup_frame())
    assert isinstance(setup, Setup)
    assert setup.initial_term_id == INITIAL
    assert setup.active_term_id == INITIAL + 1
    assert setup.term_offset == 2 * FRAME
    assert setup.ttl == 7
    assert setup.flags & SETUP_GROUP_FLAG
    unicast = parse_datagram_untrusted(publication().setup_frame())
    assert isinstance(unicast, Setup)
    assert not unicast.flags & SETUP_GROUP_FLAG


# ---------------------------------------------------------------- NAKs and retransmits


def test_a_nak_for_the_last_header_of_a_term_or_for_one_byte_is_valid() -> None:
    # Aeron's bounds: term_offset <= term_length - header, length >= 0 (0: valid, no resend).
    pub = publication()
    pub.on_nak(nak(TERM - 32, 1), 0.0)
    pub.on_nak(nak(0, 1), 0.0)
    assert pub.on_nak(nak(0, 0), 0.0) is False
    assert pub.counters.invalid_frames == 0
    pub.on_nak(nak(TERM - 31, 1), 0.0)
    pub.on_nak(nak(0, -1), 0.0)
    assert pub.counters.invalid_by_reason["bad_nak"] == 2


def test_a_nak_below_the_window_floor_resends_nothing() -> None:
    # The floor: sender position - term/2 - a max-size message; older data is not resent.
    pub = publication()
    wire = Wire()
    now = send_acknowledged(pub, 48, wire, TERM // 2)
    assert pub.sender_position == 48 * FRAME
    pub.on_nak(nak(0, FRAME), now)
    pub.poll(now, wire.emit)
    assert pub.counters.retransmits_sent == 0
    pub.on_nak(nak(40 * FRAME, FRAME), now)  # within the floor: resent
    pub.poll(now, wire.emit)
    assert pub.counters.retransmits_sent == 1


def test_a_nak_for_data_not_yet_sent_takes_no_retransmit_slot() -> None:
    # Unicast has one retransmit in flight: a NAK at the sender position (nothing there was
    # sent) must not take it from a real gap NAKed next.
    pub = publication()
    wire = Wire()
    pub.on_status_message(sm(0, window=2 * FRAME), 0.0)
    offer(pub, 4, 0.0)
    pub.poll(0.0, wire.emit)
    assert pub.sender_position == 2 * FRAME
    pub.on_nak(nak(2 * FRAME, FRAME), 0.01)
    pub.on_nak(nak(FRAME, FRAME), 0.01)
    assert pub.next_deadline(0.01) == 0.01  # a resend waits
    wire.clear()
    pub.poll(0.01, wire.emit)
    assert [f.term_offset for f in wire.data()] == [FRAME]
    assert pub.counters.retransmitted_bytes == FRAME


def test_a_retransmit_never_sends_beyond_the_sender_position() -> None:
    pub = publication()
    wire = Wire()
    pub.on_status_message(sm(0, window=2 * FRAME), 0.0)
    offer(pub, 4, 0.0)
    pub.poll(0.0, wire.emit)
    wire.clear()
    pub.on_nak(nak(FRAME, 3 * FRAME), 0.01)
    pub.poll(0.01, wire.emit)
    assert [f.term_offset for f in wire.data()] == [FRAME]  # the rest is flow control's
    assert pub.counters.retransmitted_bytes == FRAME


def test_a_retransmit_stops_at_the_end_of_the_naked_term() -> None:
    pub = publication()
    wire = Wire()
    now = send_acknowledged(pub, 72, wire, TERM // 2)
    assert pub.sender_position == TERM + 8 * FRAME
    wire.clear()
    pub.on_nak(nak(TERM - 2 * FRAME, 8 * FRAME), now)
    pub.poll(now, wire.emit)
    assert [f.term_offset for f in wire.data()] == [TERM - 2 * FRAME, TERM - FRAME]
    assert pub.counters.retransmitted_bytes == 2 * FRAME


def test_a_retransmit_is_capped_at_a_multiple_of_the_receiver_window() -> None:
    # Unicast: at most 16 x max(receiver window, mtu) per NAK (Aeron's retransmit window).
    pub = publication()
    wire = Wire()
    now = send_acknowledged(pub, 24, wire, MTU)
    assert pub.sender_position == 24 * FRAME
    pub.on_nak(nak(0, 24 * FRAME), now)
    pub.poll(now, wire.emit)
    assert pub.counters.retransmitted_bytes == 16 * MTU // FRAME * FRAME  # whole frames


def test_unicast_has_one_retransmit_in_flight_and_a_group_sixteen() -> None:
    # Aeron's defaults: one for unicast (its one receiver retries), sixteen for a group
    # (receivers NAK different gaps at once).
    for is_group, resent in ((False, [FRAME]), (True, [FRAME, 4 * FRAME])):
        pub = publication(is_group=is_group)
        wire = Wire()
        now = send_acknowledged(pub, 8, wire, TERM // 2)
        wire.clear()
        pub.on_nak(nak(FRAME, FRAME), now)
        pub.on_nak(nak(4 * FRAME, FRAME), now)
        pub.poll(now, wire.emit)
        assert [f.term_offset for f in wire.data()] == resent


def test_a_group_ignores_naks_for_a_resent_range_for_longer_than_unicast() -> None:
    # After a resend, NAKs for the same range are duplicates for the retransmit linger: long
    # for a group (other receivers had not seen the resend yet), brief for unicast.
    timers = SenderTimers()
    assert timers.unicast_retransmit_linger < 0.001 < timers.retransmit_linger
    for is_group, again in ((False, 1), (True, 0)):
        pub = publication(is_group=is_group, timers=timers)
        wire = Wire()
        now = send_acknowledged(pub, 4, wire, TERM // 2)
        pub.on_nak(nak(FRAME, FRAME), now)
        pub.poll(now, wire.emit)
        pub.on_nak(nak(FRAME, FRAME), now + 0.001)
        pub.poll(now + 0.001, wire.emit)
        assert pub.counters.retransmits_sent == 1 + again


def test_retransmitted_bytes_add_up_over_resends() -> None:
    pub = publication()
    wire = Wire()
    now = send_acknowledged(pub, 8, wire, TERM // 2)
    pub.on_nak(nak(FRAME, FRAME), now)
    pub.poll(now, wire.emit)
    pub.on_nak(nak(4 * FRAME, 2 * FRAME), now + 0.1)
    pub.poll(now + 0.1, wire.emit)
    assert pub.counters.retransmits_sent == 2
    assert pub.counters.retransmitted_bytes == 3 * FRAME


def test_every_send_that_would_block_is_counted() -> None:
    pub = publication()
    wire = Wire()
    pub.on_status_message(sm(0), 0.0)
    offer(pub, 2, 0.0)
    wire.result = WOULD_BLOCK
    assert not pub.send_pending(0.0, wire.emit)
    assert not pub.send_pending(0.001, wire.emit)
    assert pub.counters.send_would_block == 2
    assert pub.sender_position == 0  # nothing lost: sent on the retry
    wire.result = 1
    assert pub.send_pending(0.002, wire.emit)
    assert pub.sender_position == 2 * FRAME


def test_next_deadline_is_now_while_a_nak_waits_and_then_the_end_of_its_linger() -> None:
    pub = publication()
    wire = Wire()
    now = send_acknowledged(pub, 4, wire, TERM // 2)
    pub.poll(now, wire.emit)
    pub.on_nak(nak(FRAME, FRAME), now)
    assert pub.next_deadline(now) == now
    pub.poll(now, wire.emit)
    linger = pub.timers.unicast_retransmit_linger
    assert pub.next_deadline(now) == pytest.approx(now + linger)


# ---------------------------------------------------------------- RTTM


def rttm_request(timestamp: int) -> Rttm:
    return Rttm(SESSION, STREAM, timestamp, 0, RECEIVER, flags=RTTM_REPLY_FLAG)


def test_an_rttm_request_is_answered_with_a_reply_that_echoes_its_timestamp() -> None:
    pub = publication()
    wire = Wire()
    pub.on_rttm(rttm_request(123_456_789), 0.0)
    assert pub.next_deadline(0.0) == 0.0
    pub.poll(0.0, wire.emit)
    assert wire.rttms() == [Rttm(SESSION, STREAM, 123_456_789, 0, RECEIVER, flags=0)]
    assert pub.counters.rttm_replies_sent == 1


def test_an_rttm_without_the_reply_flag_is_a_reply_and_gets_no_answer() -> None:
    pub = publication()
    wire = Wire()
    pub.on_rttm(Rttm(SESSION, STREAM, 5, 0, RECEIVER, flags=0), 0.0)
    pub.poll(0.0, wire.emit)
    assert wire.rttms() == []
    assert pub.counters.rttm_replies_sent == 0


def test_rttm_replies_go_in_order_and_wait_out_a_full_socket_without_holding_up_the_rest() -> None:
    pub = publication()
    sent: list[bytes] = []
    blocked = True

    def emit(datagram: bytes | memoryview, segment: int = 0) -> int:
        if blocked and isinstance(parse_datagram_untrusted(datagram), Rttm):
            return WOULD_BLOCK
        sent.append(bytes(datagram))
        return 1

    pub.on_rttm(rttm_request(1), 0.0)
    pub.on_rttm(rttm_request(2), 0.0)
    pub.poll(0.0, emit)
    frames = [parse_datagram_untrusted(d) for d in sent]
    assert [type(f) for f in frames] == [Setup]  # the SETUP still went
    assert pub.next_deadline(0.0) == 0.0  # the replies wait
    blocked = False
    pub.poll(0.01, emit)
    replies = [f for f in map(parse_datagram_untrusted, sent) if isinstance(f, Rttm)]
    assert [r.echo_timestamp_ns for r in replies] == [1, 2]
    assert pub.counters.rttm_replies_sent == 2
    pub.on_rttm(rttm_request(3), 0.02)
    pub.poll(0.02, emit)
    assert pub.counters.rttm_replies_sent == 3


def test_an_rttm_reply_with_nowhere_to_go_is_dropped_not_retried() -> None:
    pub = publication()
    wire = Wire()
    wire.result = 0  # no destination
    pub.on_rttm(rttm_request(1), 0.0)
    pub.poll(0.0, wire.emit)
    assert pub.counters.rttm_replies_sent == 0
    assert pub.next_deadline(0.0) > 0.0


# ---------------------------------------------------------------- heartbeats and probes


def test_a_sender_blocked_by_flow_control_probes_at_once_then_backs_off() -> None:
    pub = publication()
    wire = Wire()
    pub.on_status_message(sm(0, window=2 * FRAME), 0.0)
    offer(pub, 4, 0.0)
    pub.poll(0.0, wire.emit)
    assert len(wire.heartbeats()) == 1  # right behind the data: where it stopped
    delay = pub.timers.tail_probe_delay
    assert pub.next_deadline(0.0) == pytest.approx(2 * delay)
    pub.poll(2 * delay, wire.emit)
    assert len(wire.heartbeats()) == 2
    assert pub.next_deadline(2 * delay) == pytest.approx(2 * delay + 4 * delay)


def test_probe_after_data_sends_one_probe_then_only_idle_heartbeats() -> None:
    pub = publication(timers=SenderTimers(probe_after_data=True))
    wire = Wire()
    pub.on_status_message(sm(0), 0.0)
    offer(pub, 1, 0.0)
    pub.poll(0.0, wire.emit)
    delay = pub.timers.tail_probe_delay
    assert pub.next_deadline(0.0) == pytest.approx(delay)
    pub.poll(delay, wire.emit)
    assert len(wire.heartbeats()) == 1
    # Everything was sent: no probe again, the next heartbeat is the idle one.
    assert pub.next_deadline(delay) == pytest.approx(delay + pub.timers.heartbeat_interval)


def test_data_is_followed_by_a_probe_for_a_second_after_a_nak_and_no_longer() -> None:
    # Receivers that NAKed lately are losing data: a lost tail must be found in milliseconds.
    pub = publication()
    wire = Wire()
    pub.on_status_message(sm(0), 0.0)
    pub.on_nak(nak(0, 1), 0.5)
    offer(pub, 1, 1.25)
    pub.poll(1.25, wire.emit)
    delay = pub.timers.tail_probe_delay
    assert pub.next_deadline(1.25) == pytest.approx(1.25 + delay)
    pub.poll(1.25 + delay, wire.emit)
    offer(pub, 1, 1.5)
    pub.poll(1.5, wire.emit)  # exactly RECENT_NAK_WINDOW after the NAK: no probe
    assert pub.next_deadline(1.5) == pytest.approx(1.5 + pub.timers.heartbeat_interval)


def test_a_probe_is_not_put_off_by_the_receivers_timeout_check() -> None:
    # The receiver's timeout falls due with the next probe; `poll` looks at timeouts at
    # most every 0.1 s, but the probe must still go at its time.
    pub = publication()
    wire = Wire()
    pub.on_status_message(sm(0, window=2 * FRAME), 0.004)
    offer(pub, 4, 5.0)
    pub.poll(5.0, wire.emit)  # blocked: a probe now, the next one 4 ms later
    assert pub.liveness.expiry == 5.004
    assert pub.next_deadline(5.0) == 5.004


def test_a_heartbeat_with_nowhere_to_go_still_waits_its_interval() -> None:
    # emit returns 0 with no destination: the heartbeat is not counted, but its interval
    # starts again, or every poll would try to send another.
    pub = publication()
    wire = Wire()
    pub.on_status_message(sm(0), 0.0)
    wire.result = 0
    pub.poll(0.0, wire.emit)
    assert pub.counters.heartbeats_sent == 0
    assert pub.next_deadline(0.0) == pytest.approx(pub.timers.heartbeat_interval)


# ---------------------------------------------------------------- close, linger, end-of-stream


def test_announce_end_sends_one_end_of_stream_heartbeat_and_closes() -> None:
    pub = publication()
    wire = Wire()
    now = send_acknowledged(pub, 3, wire, TERM // 2)
    pub.poll(now + 0.1, wire.emit)  # an idle heartbeat
    before = pub.counters.heartbeats_sent
    assert before >= 1
    wire.clear()
    pub.announce_end(wire.emit)
    [eos] = wire.heartbeats()
    assert eos.is_end_of_stream
    assert eos.term_offset == 3 * FRAME
    assert pub.counters.heartbeats_sent == before + 1
    assert pub.is_done
    pub.announce_end(wire.emit)  # once only
    assert len(wire.sent) == 1


def test_a_closed_publication_probes_from_its_tail_until_an_sm_shows_it() -> None:
    # Close right after data its receiver has not acknowledged: two heartbeats at the tail at
    # once (an echo receiver answers the repeat with the SM that proves delivery), then
    # probes backing off from the tail probe delay; the SM at the tail ends them and the
    # next heartbeat says end-of-stream.
    pub = publication()
    wire = Wire()
    pub.on_status_message(sm(0), 0.0)
    offer(pub, 2, 0.0)
    pub.poll(0.0, wire.emit)
    assert len(wire.data()) == 2
    wire.clear()
    pub.close(0.001)
    pub.poll(0.001, wire.emit)
    first = wire.heartbeats()
    assert [(h.term_offset, h.is_end_of_stream) for h in first] == [(2 * FRAME, False)] * 2
    assert pub.counters.heartbeats_sent == 2
    delay = pub.timers.tail_probe_delay
    probes = []
    now = 0.001
    for _ in range(4):
        now = pub.next_deadline(now)
        wire.clear()
        pub.poll(now, wire.emit)
        [probe] = wire.heartbeats()
        assert not probe.is_end_of_stream and probe.term_offset == 2 * FRAME
        probes.append(round(now - 0.001, 6))
    assert probes == [delay, 3 * delay, 7 * delay, 15 * delay]
    pub.on_status_message(sm(2 * FRAME), now)
    wire.clear()
    pub.poll(now, wire.emit)
    [eos] = wire.heartbeats()
    assert eos.is_end_of_stream and eos.term_offset == 2 * FRAME


def test_a_publication_whose_receiver_already_has_the_tail_ends_at_once_on_close() -> None:
    # Everything acknowledged before the close: nothing to prove, no probes.
    pub = publication()
    wire = Wire()
    now = send_acknowledged(pub, 2, wire, TERM // 2)
    wire.clear()
    pub.close(now)
    pub.poll(now, wire.emit)
    heartbeats = wire.heartbeats()
    assert heartbeats and all(h.term_offset == 2 * FRAME for h in heartbeats)
    assert heartbeats[-1].is_end_of_stream
    assert not any(h.is_end_of_stream for h in heartbeats[:-1]) and len(heartbeats) <= 2


def test_announce_end_on_a_full_socket_counts_nothing_but_still_closes() -> None:
    pub = publication()
    wire = Wire()
    wire.result = WOULD_BLOCK
    pub.announce_end(wire.emit)
    assert pub.counters.heartbeats_sent == 0
    assert pub.is_done


def test_a_closed_publication_sends_nothing_more_on_a_flush() -> None:
    pub = publication()
    wire = Wire()
    pub.on_status_message(sm(0), 0.0)
    offer(pub, 2, 0.0)
    pub.abort()
    assert not pub.send_pending(0.0, wire.emit)
    assert wire.sent == []
    assert pub.offer(b"x", 0.0) == CLOSED


def test_closing_a_disconnected_publication_with_unsent_data_closes_it() -> None:
    pub = publication()
    wire = Wire()
    pub.on_status_message(sm(0, window=FRAME), 0.0)
    offer(pub, 3, 0.0)
    pub.poll(0.0, wire.emit)
    assert pub.sender_position == FRAME
    pub.close(6.0)  # the receiver has been silent past the connection timeout
    pub.poll(6.0, wire.emit)
    assert pub.is_done
    assert pub.next_deadline(6.0) == math.inf


def lingering(linger: float, close_at: float) -> tuple[NetworkPublication, Wire]:
    """A publication whose receiver got one message but never reported it, closed at
    `close_at` and polled then (so it lingers from `close_at`)."""
    pub = publication(timers=SenderTimers(linger=linger))
    wire = Wire()
    pub.on_status_message(sm(0), 0.0)
    offer(pub, 1, 0.0)
    pub.poll(0.0, wire.emit)
    pub.on_status_message(sm(0), close_at - 0.5)  # alive, but not at the end
    pub.close(close_at)
    pub.poll(close_at, wire.emit)
    assert pub.is_lingering
    wire.clear()
    return pub, wire


def test_end_of_stream_is_announced_half_the_linger_after_lingering_began_without_proof() -> None:
    pub, wire = lingering(linger=4.0, close_at=1.0)
    pub.poll(2.9, wire.emit)
    assert [h.is_end_of_stream for h in wire.heartbeats()] == [False]
    pub.poll(3.0, wire.emit)  # 1.0 + 4.0 / 2
    assert [h.is_end_of_stream for h in wire.heartbeats()] == [False, True]


def test_lingering_ends_exactly_at_the_linger_time() -> None:
    pub, wire = lingering(linger=4.0, close_at=1.0)
    pub.on_status_message(sm(0), 4.5)  # the receiver is still there, never at the end
    pub.poll(4.9, wire.emit)
    assert not pub.is_done
    pub.poll(5.0, wire.emit)
    assert pub.is_done
