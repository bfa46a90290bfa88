"""close() reports delivery only on proof, and finds that proof with a real Aeron receiver.

Aeron's receivers (PublicationImage) report a new SM position only after their subscriber has
consumed a quarter of the window, or (1.15) on their SM timer (200 ms); 1.4x repeats the last
scheduled position on its timer. Once an image has seen the end-of-stream heartbeat with
nothing missing, Aeron 1.15 drops the image and sends no more SMs; Aeron 1.4x sends
end-of-stream SMs that carry that stale position, often short of the end. A publication that
announced end-of-stream as soon as it had sent everything therefore heard no SM at its end in
about a third of runs against real Aeron receivers, and close() said "not delivered" although
every message had arrived.

The model receiver below behaves like that, driven by hand with a scripted clock.
"""

from __future__ import annotations

from typing import Literal

import pytest

from echo.transport.core.counters import Counters
from echo.transport.core.flow_control import UnicastFlowControl
from echo.transport.core.frames import (
    SM_EOS_FLAG,
    DataHeader,
    StatusMessage,
    parse_datagram_untrusted,
)
from echo.transport.core.sender import NetworkPublication, SenderTimers

STREAM = 1001
SESSION = 77
TERM_LENGTH = 1 << 16
SM_TIMER = 0.2  # Aeron's default receiver status message timeout


class AeronLikeReceiver:
    """Consumes everything at once but reports it only on its SM timer (as Aeron does)."""

    def __init__(self, version: Literal["1.15", "1.47"], consumes: bool = True) -> None:
        self.version = version
        self.consumes = consumes
        self.received_end = 0  # the end of the data rebuilt so far
        self.reported = 0  # the subscriber position of the last SM
        self.next_sm = 0.0
        self.saw_eos = False
        self.gone = False
        self.eos_heartbeats_at: list[float] = []
        #: when an SM first reported a position at the end of what had arrived
        self.reported_all_at: float | None = None

    def on_datagram(self, datagram: bytes, now: float) -> None:
        frame = parse_datagram_untrusted(datagram)
        if not isinstance(frame, DataHeader):
            return
        if frame.is_heartbeat:
            if frame.is_end_of_stream:
                self.eos_heartbeats_at.append(now)
                self.saw_eos = True
            return
        self.received_end = max(self.received_end, frame.term_offset + len(datagram))

    def status_messages(self, now: float) -> list[StatusMessage]:
        if self.gone:
            return []
        eos = self.saw_eos and self.version == "1.47"
        if now < self.next_sm and not eos:
            return []  # (1.47 answers end-of-stream at once: nextSmDeadlineNs = nowNs - 1)
        self.next_sm = now + SM_TIMER
        # 1.15 reports its subscriber position on every timer SM; 1.47 only once it moved by
        # a quarter of the window (TERM_LENGTH // 8 here), else it repeats the old one.
        quarter = TERM_LENGTH // 8
        moved = self.version == "1.15" or self.received_end > self.reported + quarter
        if self.consumes and moved:
            self.reported = self.received_end
            if self.reported_all_at is None and self.reported:
                self.reported_all_at = now
        if self.saw_eos and self.version == "1.15":
            self.gone = True  # the image is complete: removed, no SM ever again
            return []
        if eos:
            self.gone = True
        return [
            StatusMessage(
                session_id=SESSION,
                stream_id=STREAM,
                consumption_term_id=0,
                consumption_term_offset=self.reported,
                receiver_window=TERM_LENGTH // 2,
                receiver_id=5,
                flags=SM_EOS_FLAG if eos else 0,
            )
        ]


def run_close(
    receiver: AeronLikeReceiver, close_at: float
) -> tuple[bool, NetworkPublication, float]:
    """Offer ten messages, close at `close_at`; returns (close()'s verdict, publication, end)."""
    publication = NetworkPublication(
        session_id=SESSION,
        stream_id=STREAM,
        initial_term_id=0,
        term_length=TERM_LENGTH,
        mtu=1408,
        flow_control=UnicastFlowControl(),
        counters=Counters(),
        now=0.0,
        timers=SenderTimers(linger=5.0),
    )

    def emit(datagram: bytes | memoryview, segment: int = 0) -> int:
        receiver.on_datagram(bytes(datagram), now)
        return 1

    now = 0.0
    offered = 0
    delivered = False
    closed = False
    while now < 10.0 and not publication.is_done:
        for sm in receiver.status_messages(now):
            publication.on_status_message(sm, now)
        if offered < 10 and publication.is_connected(now):
            assert publication.offer(bytes([offered]) * 300, now) > 0
            offered += 1
        if not closed and now >= close_at:
            assert offered == 10
            publication.close(now)
            closed = True
        publication.poll(now, emit)
        # Exactly what Publication.close() in api.py latches on every wake-up.
        delivered = delivered or (closed and publication.delivered)
        now = round(now + 0.001, 6)
    return delivered, publication, now


@pytest.mark.parametrize("version", ["1.15", "1.47"])
@pytest.mark.parametrize("close_at", [0.05, 0.15, 0.21, 0.39])
def test_close_is_true_when_an_aeron_receiver_got_everything(
    version: Literal["1.15", "1.47"], close_at: float
) -> None:
    receiver = AeronLikeReceiver(version)
    delivered, publication, end = run_close(receiver, close_at)
    assert receiver.received_end == publication.position  # every byte arrived
    assert delivered is True
    assert receiver.eos_heartbeats_at
    if version == "1.15":
        # End-of-stream was announced only once the receiver's SM showed it had everything
        # (closing before its next SM timer: at that timer, not at the close).
        assert receiver.reported_all_at is not None
        assert receiver.eos_heartbeats_at[0] >= max(close_at, receiver.reported_all_at)
    else:
        # Its SMs never show the end (below a quarter window): after two of them the end is
        # announced and its end-of-stream SM is the proof, which also ends the linger.
        assert receiver.reported_all_at is None
        assert receiver.eos_heartbeats_at[0] < close_at + 3 * SM_TIMER + 0.01
        assert end < close_at + 1.0


def test_close_is_false_when_the_receiver_never_consumes() -> None:
    receiver = AeronLikeReceiver("1.15", consumes=False)
    delivered, _, _ = run_close(receiver, 0.05)
    assert delivered is False
    # The wait for proof is bounded: two SMs without the end, then end-of-stream.
    assert receiver.eos_heartbeats_at
    assert receiver.eos_heartbeats_at[0] - 0.05 <= 2 * SM_TIMER + 0.01


def test_an_end_of_stream_sm_before_the_end_was_announced_proves_nothing() -> None:
    # A receiver whose subscription closes says goodbye with an EOS SM whatever it has: only
    # an answer to our end-of-stream counts.
    publication = NetworkPublication(
        session_id=SESSION,
        stream_id=STREAM,
        initial_term_id=0,
        term_length=TERM_LENGTH,
        mtu=1408,
        flow_control=UnicastFlowControl(),
        counters=Counters(),
        now=0.0,
    )

    def sm(flags: int) -> StatusMessage:
        return StatusMessage(SESSION, STREAM, 0, 0, TERM_LENGTH // 2, 5, flags=flags)

    sent: list[bytes] = []

    def emit(datagram: bytes | memoryview, segment: int = 0) -> int:
        sent.append(bytes(datagram))
        return 1

    publication.on_status_message(sm(0), 0.0)
    assert publication.offer(b"m" * 100, 0.0) > 0
    publication.poll(0.0, emit)
    publication.close(0.01)
    publication.poll(0.01, emit)
    assert publication.is_lingering
    publication.on_status_message(sm(SM_EOS_FLAG), 0.02)
    assert not publication.delivered
