"""Known stalls under loss, found by the B3 loss benchmark (bench/loss.py), kept as reproductions.

Pure pair, scripted clock, exactly one datagram dropped (tests/transport/pairlink.py). Marked
xfail(strict): when the transport is fixed the test passes, pytest reports it, and the marker
goes.
"""

from __future__ import annotations

import pytest

from echo.transport.frames import DataHeader, StatusMessage, parse_datagram_untrusted
from tests.transport.pairlink import DELIVER, DROP, Direction, Fate, PairLink


@pytest.mark.xfail(
    strict=True,
    reason="a lost window-update SM is only replaced by the periodic SM 200 ms later: the "
    "blocked sender's probe heartbeats reach the receiver but do not make it resend the SM",
)
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
    probes = [
        time
        for time, frame in pair.frames("data")
        if time > start and isinstance(frame, DataHeader) and frame.frame_length == 0
    ]

    assert dropped and dropped[0] >= start
    assert probes, "the blocked sender probes with heartbeats"
    # A probe reached the receiver within the heartbeat interval; that should be enough for
    # it to tell the sender again where the window is (sender.py: "if ... the SM that would
    # open the window was [lost], the receiver learns of it in milliseconds").
    assert probes[0] - start < 0.1
    assert resumed_after < 0.1, f"the sender resumed only after {resumed_after * 1000:.0f} ms"


@pytest.mark.xfail(
    strict=True,
    reason="next_deadline() is `now` while sender_position < sender_limit, even when the limit "
    "falls inside the next frame and poll() can send nothing: the driver's timer loop spins "
    "(the B3 publisher burns 100 % of a core while waiting for the window at 5 % loss)",
)
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
