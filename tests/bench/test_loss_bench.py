"""B3 (loss benchmark) end to end: the quick run as users start it, and its cleanup on Ctrl-C.

Needs root and network namespaces; like tests/netlab it fails (never skips) without them
(docs/architecture.md, Test layers).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.netlab.lab import REGISTRY_DIR, LineReader, list_namespaces, require_netns_support

pytestmark = pytest.mark.netns

ROOT = Path(__file__).resolve().parents[2]
LEVELS = (0, 5, 20)


def _bench(*args: str) -> list[str]:
    return [sys.executable, "-m", *args]


def test_quick_loss_run_delivers_everything_in_order_under_real_kernel_loss(
    tmp_path: Path,
) -> None:
    require_netns_support()
    completed = subprocess.run(
        _bench("bench.run", "--quick", "--only", "loss", "--results-dir", str(tmp_path)),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output

    (json_path,) = (tmp_path / "runs").glob("*.json")
    document = json.loads(json_path.read_text())
    assert not document["failed"], output
    assert "loss" not in document["skipped"], output
    by_key = {(r["name"], r["metric"]): r for r in document["results"]}
    for percent in LEVELS:
        name = f"loss_{percent}pct"
        rate, megabytes = by_key[name, "msgs/s"], by_key[name, "MB/s"]
        extra = rate["extra"]
        # Every message offered arrived, once and in order (the benchmark fails otherwise).
        assert extra["violations"] == 0
        assert extra["messages"] == extra["offered"] > 0
        assert rate["value"] > 0 and megabytes["value"] > 0
        assert megabytes["value"] == pytest.approx(rate["value"] * 1024 / 1e6)
        if percent == 0:
            assert rate["baseline"] is None
            # No rules, so nothing dropped, and nothing to repair.
            assert extra["nft_dropped_data"] == extra["nft_dropped_control"] == 0
            assert extra["naks_sent"] == extra["retransmits"] == 0
            continue
        assert rate["baseline"] == ["loss_0pct", "msgs/s"]
        assert megabytes["baseline"] == ["loss_0pct", "MB/s"]
        assert rate["ratio_to_raw"] == pytest.approx(
            rate["value"] / by_key["loss_0pct", "msgs/s"]["value"]
        )
        # nft really dropped datagrams both ways, at about the rate asked for ...
        assert extra["nft_dropped_data"] > 0 and extra["nft_dropped_control"] > 0
        assert extra["nft_seen_data"] >= 1000 and extra["nft_seen_control"] >= 100
        for measured in ("measured_loss_data_pct", "measured_loss_control_pct"):
            assert percent / 2 <= extra[measured] <= percent * 1.5, (measured, extra)
        # ... the transport saw its datagrams go missing ...
        assert percent / 2 <= extra["datagram_loss_data_pct"] <= percent * 1.5, extra
        # ... and repaired the gaps.
        assert extra["naks_sent"] > 0 and extra["naks_received"] > 0
        assert extra["retransmits"] > 0

    table = (tmp_path / "latest.md").read_text()
    for percent in LEVELS[1:]:
        assert re.search(rf"\| loss_{percent}pct \| msgs/s \| .* \| [0-9.]+ x loss_0pct \|", table)
    assert "| loss_0pct | msgs/s |" in table


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_interrupted_run_removes_its_namespaces(signum: int, tmp_path: Path) -> None:
    require_netns_support()
    proc = subprocess.Popen(
        _bench("bench.loss", "--quick", "--results-dir", str(tmp_path)),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        # As a terminal starts it: Ctrl-C not ignored, even when this suite runs as a
        # background job (which a shell starts with SIGINT ignored, inherited by its children).
        preexec_fn=_default_sigint,
    )
    try:
        reader = LineReader(proc.stderr)
        while True:
            line = reader.readline(timeout=30)
            match = re.match(r"\s+lab (\S+): (\S+) \S+ \(publisher\) <-veth-> (\S+) ", line)
            if match:
                break
        lab_id, *names = match.groups()
        assert set(names) <= set(list_namespaces())
        proc.send_signal(signum)
        returncode = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert returncode != 0
    assert not set(names) & set(list_namespaces())
    assert not (REGISTRY_DIR / f"{lab_id}.json").exists()
