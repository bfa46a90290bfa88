"""bench/churn.py: the slope it reports, and a short soak against the real echo-server."""

from __future__ import annotations

import pytest

from bench.churn import churn, slope_mib_per_minute


def test_slope_is_mib_per_minute() -> None:
    assert slope_mib_per_minute([(0.0, 40.0), (60.0, 41.0), (120.0, 42.0)]) == pytest.approx(1.0)
    assert slope_mib_per_minute([(0.0, 40.0), (30.0, 40.0)]) == 0.0
    assert slope_mib_per_minute([(0.0, 40.0)]) == 0.0
    assert slope_mib_per_minute([(5.0, 40.0), (5.0, 41.0)]) == 0.0


def test_a_short_churn_serves_sessions_and_samples_the_server() -> None:
    row = churn(seconds=4.0, concurrency=4, spray_rate=100.0, sample=0.5)
    assert row["sessions"] > 0 and row["errors"] == 0
    assert row["sprayed"] > 100
    assert len(row["samples"]) >= 4 and all(m > 10 for _, m in row["samples"])
