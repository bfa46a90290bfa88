"""Transport counters: every field starts at zero, and invalid frames are counted by reason."""

from __future__ import annotations

from echo.transport.core.counters import FIELDS, Counters


def test_every_counter_starts_at_zero_and_is_in_the_snapshot() -> None:
    counters = Counters()
    assert counters.snapshot() == dict.fromkeys(FIELDS, 0)
    assert len(set(FIELDS)) == len(FIELDS)


def test_fields_are_plain_ints_that_the_state_machines_bump() -> None:
    counters = Counters()
    counters.naks_sent += 3
    counters.bytes_received += 1408
    snapshot = counters.snapshot()
    assert snapshot["naks_sent"] == 3
    assert snapshot["bytes_received"] == 1408
    assert sum(snapshot.values()) == 1411


def test_invalid_frames_are_counted_in_total_and_by_reason_sorted() -> None:
    counters = Counters()
    counters.invalid("too_short")
    counters.invalid("bad_version")
    counters.invalid("too_short")
    assert counters.invalid_frames == 3
    assert counters.invalid_by_reason == {"too_short": 2, "bad_version": 1}
    snapshot = counters.snapshot()
    assert snapshot["invalid_frames"] == 3
    reasons = [key for key in snapshot if key.startswith("invalid_frames.")]
    assert reasons == ["invalid_frames.bad_version", "invalid_frames.too_short"]
    assert snapshot["invalid_frames.too_short"] == 2
    assert snapshot["invalid_frames.bad_version"] == 1
