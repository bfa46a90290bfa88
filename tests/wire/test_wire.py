"""Wire fidelity: Wireshark's Aeron dissector reads a whole Echo 2.0 exchange the way echo sent it.

The capture (tests/wire/capture.py) needs root, `ip` and `tshark`; like the netlab tests it fails
loudly, never skips, when they are missing (`./dev test` installs tshark).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest

from tests.wire.capture import (
    REQUIRED_KINDS,
    Datagram,
    Report,
    capture_exchange,
    check,
    tshark_decode,
    tshark_heuristic_protocols,
)

COUNT = 150


@attrs.frozen
class Captured:
    datagrams: list[Datagram]
    record: dict[str, Any]
    heuristic: list[str]
    report: Report
    directory: Path


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> Captured:
    directory = tmp_path_factory.mktemp("wire")
    pcap, record = capture_exchange(directory, count=COUNT, loss=0.1, seed=1)
    ports = (record["ports"][0], record["ports"][1])
    datagrams = tshark_decode(pcap, ports, directory / "exchange.pdml")
    heuristic = tshark_heuristic_protocols(pcap)
    report = check(datagrams, record, heuristic)
    print(report.summary())
    return Captured(datagrams, record, heuristic, report, directory)


def test_the_dissector_agrees_with_the_transport(captured: Captured) -> None:
    problems = captured.report.problems
    assert not problems, "\n".join(problems[:40]) + f"\n(capture in {captured.directory})"


def test_every_datagram_is_aeron_and_none_is_malformed(captured: Captured) -> None:
    assert len(captured.datagrams) == len(captured.heuristic) > 0
    for datagram in captured.datagrams:
        assert "aeron" in datagram.protocols and datagram.frames, datagram
        assert not datagram.malformed, datagram
    assert all(":aeron" in protocols for protocols in captured.heuristic)


def test_the_exchange_sent_runs_of_datagrams_and_the_capture_shows_each(
    captured: Captured,
) -> None:
    # Runs (UDP GSO) are the transport's default: the capture above, which matched the
    # transports' datagram counts one for one, was of datagrams sent in runs.
    runs = sum(t["counters"].get("gso_runs_sent", 0) for t in captured.record["transports"])
    assert runs > 0


def test_every_required_frame_type_is_on_the_wire(captured: Captured) -> None:
    counts = captured.report.counts
    assert all(counts[kind] > 0 for kind in REQUIRED_KINDS), counts
    # Loss was repaired: NAKs, and the DATA they asked for sent again.
    assert captured.report.retransmitted_frames > 0
    # Each echo went both ways as two fragments.
    assert counts["DATA(fragment)"] >= 4 * COUNT


# The checks themselves must be able to fail: feed them a capture or record that is wrong.


def _problems(captured: Captured, datagrams: list[Datagram], record: dict[str, Any]) -> list[str]:
    return check(datagrams, record, captured.heuristic).problems


def test_check_notices_a_missing_datagram(captured: Captured) -> None:
    nak_index = next(
        i for i, d in enumerate(captured.datagrams) if any(f.kind == "NAK" for f in d.frames)
    )
    datagrams = captured.datagrams[:nak_index] + captured.datagrams[nak_index + 1 :]
    problems = _problems(captured, datagrams, captured.record)
    assert any(p.startswith("datagrams:") for p in problems)
    assert any(p.startswith("NAK frames:") for p in problems)


def test_check_notices_a_wrong_session_or_term(captured: Captured) -> None:
    record = json.loads(json.dumps(captured.record))
    duologue = next(
        p for p in record["publications"] if p["role"] == "server" and "session-id" in p["channel"]
    )
    duologue["initial_term_id"] += 1
    problems = _problems(captured, captured.datagrams, record)
    assert any("initial_term_id" in p for p in problems)

    record = json.loads(json.dumps(captured.record))
    record["client"]["duologue_session"] += 1
    problems = _problems(captured, captured.datagrams, record)
    assert any(p.startswith("duologue session") for p in problems)


def test_check_notices_malformed_and_expert_errors(captured: Captured) -> None:
    first = captured.datagrams[0]
    bad = attrs.evolve(first, malformed=True, experts=((0x00800000, "boom"),))
    problems = _problems(captured, [bad, *captured.datagrams[1:]], captured.record)
    assert any("marked malformed" in p for p in problems)
    assert any("expert error: boom" in p for p in problems)
