from __future__ import annotations

import datetime
import hashlib
import json
from collections import Counter
from pathlib import Path

import attrs
import pytest

from echo.telemetry.bins import LIFETIME_EDGES_S, MESSAGE_EDGES, bin_index
from echo.telemetry.generate import UNKNOWN_EVENT, generate
from echo.telemetry.schema import validate_event

START = datetime.datetime(2026, 11, 20, tzinfo=datetime.UTC)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_same_seed_same_file_other_seed_other_file(tmp_path: Path) -> None:
    a = generate(tmp_path / "a", events=3000, seed=5, start=START, days=1)
    b = generate(tmp_path / "b", events=3000, seed=5, start=START, days=1)
    c = generate(tmp_path / "c", events=3000, seed=6, start=START, days=1)
    assert digest(tmp_path / "a") == digest(tmp_path / "b")
    assert digest(tmp_path / "a") != digest(tmp_path / "c")
    assert attrs.evolve(a, path=b.path) == b
    assert a.lines_total != c.lines_total or a.hello_received != c.hello_received


def test_truth_matches_an_independent_python_count(tmp_path: Path) -> None:
    """Recount the file with json + validate_event: the truth is what is in the file."""
    path = tmp_path / "e.jsonl"
    truth = generate(path, events=30_000, seed=11, servers=2, start=START, days=2)
    lines = path.read_text().splitlines()
    assert len(lines) == truth.lines_total
    # about `events`: bad lines are extra copies, and the last burst or close may overshoot
    assert 30_000 <= truth.lines_total <= 30_000 + 400
    bad = unknown = 0
    events: list[dict] = []
    for line in lines:
        try:
            obj = json.loads(line)
        except ValueError:
            bad += 1
            continue
        error = validate_event(obj)
        if error is None:
            events.append(obj)
        elif error.startswith("unknown event"):
            unknown += 1
            events.append(obj)
        else:
            bad += 1
    assert bad == truth.bad_lines and bad > 20
    assert unknown == truth.unknown_events
    assert len(events) == truth.events_total
    assert Counter(e["event"] for e in events) == truth.events_by_type
    assert Counter(e["ts"][:10] for e in events) == truth.events_by_day
    assert [e["ts"] for e in events] == sorted(e["ts"] for e in events)  # time order
    assert sorted({e["server_id"] for e in events if e["event"] != "client_summary"}) == [
        "echo-1",
        "echo-2",
    ]
    rejected = Counter(e["reason"] for e in events if e["event"] == "hello_rejected")
    assert rejected == truth.hello_rejected
    assert set(rejected) == {
        "bad message",
        "server full",
        "too many connections for IP address",
        "rate limited",
    }
    created = {
        (e["server_id"], e["duologue_id"]) for e in events if e["event"] == "duologue_created"
    }
    joined = {
        (e["server_id"], e["duologue_id"]) for e in events if e["event"] == "duologue_connected"
    }
    assert len(created) == truth.duologues_created
    assert len(created - joined) == truth.duologues_expired > 0
    used = [e for e in events if e["event"] == "duologue_closed" and e["reason"] != "expired"]
    life = [0] * len(LIFETIME_EDGES_S)
    msgs = [0] * len(MESSAGE_EDGES)
    for e in used:
        life[bin_index(e["lifetime_s"], LIFETIME_EDGES_S)] += 1
        msgs[bin_index(e["messages"], MESSAGE_EDGES)] += 1
    assert life == truth.lifetime_histogram
    assert msgs == truth.message_histogram
    # Abuse shows up: the top rejecting source has far more rejections than a player.
    top = truth.top_sources(3)
    assert top["by_rejections"][0]["rejections"] > 20
    assert top["prefixes_by_rejections"][0]["source"] == "2001:db8:bad:1::/64"


def test_salted_generation_has_no_raw_addresses(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    truth = generate(path, events=5000, seed=3, start=START, days=1, ip_salt=b"s")
    text = path.read_text()
    assert "2001:db8" not in text
    assert all(r["source"].startswith("h:") for r in truth.top_sources()["by_duologues"])
    assert truth.top_sources()["prefixes_by_rejections"][0]["source"].endswith("/64")


def test_unknown_events_and_arguments(tmp_path: Path) -> None:
    truth = generate(tmp_path / "e", events=20_000, seed=1, start=START, days=1)
    assert truth.unknown_events == truth.events_by_type.get(UNKNOWN_EVENT, 0)
    with pytest.raises(ValueError):
        generate(tmp_path / "x", events=0, seed=1, start=START, days=1)
    with pytest.raises(ValueError):
        generate(tmp_path / "x", events=10, seed=1, start=START.replace(tzinfo=None), days=1)
