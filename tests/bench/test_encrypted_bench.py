"""bench.encrypted_bench's result file: every row from the per-repeat figures, each encrypted
row against the same row in the clear of the same repeat, the issue's targets on them."""

from __future__ import annotations

import json

from bench import encrypted_bench
from bench.results import from_json


def repeat(scale: float) -> dict[str, float]:
    figures = {}
    for subject, metric, *_ in encrypted_bench.ROWS:
        figures[f"{subject} {metric}"] = scale * (2.0 if "required" in subject else 1.0)
    return figures


def test_the_file_pairs_each_encrypted_row_with_its_clear_row(tmp_path) -> None:
    load = {"loadavg_1m": 1.0, "loadavg_5m": 1.0, "loadavg_15m": 1.0}
    result = encrypted_bench.result_file(
        [repeat(1.0), repeat(3.0)], {"seconds": 1.0}, load, load
    )
    path = result.write(tmp_path)
    again = from_json(json.loads(path.read_text()), path)
    by_key = {(m.subject, m.name): m for m in again.metrics}
    cpu = by_key[("session_oneway_64_required", "server CPU/message")]
    assert cpu.baseline is not None and cpu.baseline.subject == "session_oneway_64_off"
    assert cpu.values == (2.0, 6.0) and cpu.baseline.values == (1.0, 3.0)
    assert cpu.ratio == 2.0 and cpu.target_met() is False  # <= 1.3 x
    echo = by_key[("session_echo_64_required", "round trips/s")]
    assert echo.target is not None and echo.target["threshold"] == 0.85
    assert echo.target_met() is True  # 2 x >= 0.85 x
    plain = by_key[("session_oneway_64_off", "messages/s")]
    assert plain.baseline is not None and plain.baseline.subject == "raw_oneway_64"
    assert by_key[("handshake_required", "server CPU/admission")].ratio == 2.0
    assert len(again.metrics) == len(encrypted_bench.ROWS)
