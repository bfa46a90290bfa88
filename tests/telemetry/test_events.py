from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import structlog

from echo.telemetry.events import EventLog
from echo.telemetry.schema import pseudonymise_ip, validate_event

T0 = 1_795_377_389.123456  # 2026-11-22T19:56:29.123456Z


def clock() -> float:
    return T0


def test_emits_schema_v1_json_lines(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    with (
        structlog.testing.capture_logs() as logs,
        EventLog(path, server_id="s1", wall_clock=clock) as log,
    ):
        log.emit(
            "hello_received", client_session=-7, source_ip="192.0.2.1", source_prefix="192.0.2.1"
        )
        log.emit("server_stopped", reason="signal", duologues_open=0)
    lines = path.read_text().splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])
    assert first == {
        "ts": "2026-11-22T19:56:29.123456Z",
        "server_id": "s1",
        "event": "hello_received",
        "schema_version": 1,
        "client_session": -7,
        "source_ip": "192.0.2.1",
        "source_prefix": "192.0.2.1",
    }
    assert all(validate_event(json.loads(line)) is None for line in lines)
    assert [e["event"] for e in logs] == ["hello_received", "server_stopped"]
    assert logs[0]["source_ip"] == "192.0.2.1"


def test_appends_and_flushes_each_line(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text('{"earlier":"run"}\n')
    log = EventLog(path, server_id="s1", wall_clock=clock)
    log.emit("server_stopped", reason="x", duologues_open=1)
    # Readable before close(): a crash right now would lose nothing.
    assert len(path.read_text().splitlines()) == 2
    log.close()
    log.close()  # idempotent


def test_salt_pseudonymises_addresses_everywhere(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    salt = b"k3y"
    with (
        structlog.testing.capture_logs() as logs,
        EventLog(path, server_id="s", ip_salt=salt, wall_clock=clock) as log,
    ):
        log.emit(
            "hello_rejected",
            client_session=1,
            source_ip="2001:db8:1:2::9",
            source_prefix="2001:db8:1:2::/64",
            reason="rate limited",
        )
    record = json.loads(path.read_text())
    assert record["source_ip"] == pseudonymise_ip("2001:db8:1:2::9", salt)
    assert record["source_prefix"] == pseudonymise_ip("2001:db8:1:2::/64", salt)
    assert record["source_prefix"].endswith("/64")
    assert "2001" not in path.read_text()
    assert logs[0]["source_ip"] == record["source_ip"]


@pytest.mark.parametrize(
    ("event", "fields", "message"),
    [
        ("no_such_event", {}, "unknown event"),
        ("server_stopped", {"reason": "x"}, "missing field duologues_open"),
        ("server_stopped", {"reason": "x", "duologues_open": "1"}, "must be int"),
        ("server_stopped", {"reason": "x", "duologues_open": 1, "ts": "now"}, "set by EventLog"),
        (
            "duologue_closed",
            {
                "duologue_id": 1,
                "source_ip": "a",
                "source_prefix": "a",
                "reason": "x",
                "lifetime_s": float("nan"),
                "messages": 0,
            },
            "NaN",
        ),
    ],
)
def test_programming_errors_raise(
    tmp_path: Path, event: str, fields: dict[str, object], message: str
) -> None:
    path = tmp_path / "e.jsonl"
    with (
        EventLog(path, server_id="s", wall_clock=clock) as log,
        pytest.raises(ValueError, match=message),
    ):
        log.emit(event, **fields)
    assert path.read_text() == ""


def test_write_errors_are_counted_and_logged_once() -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full")
    with structlog.testing.capture_logs() as logs:
        log = EventLog("/dev/full", server_id="s", wall_clock=clock)
        for _ in range(3):
            log.emit("server_stopped", reason="x", duologues_open=0)  # must not raise
        log.close()
    assert log.write_errors == 3
    assert log.events_written == 0
    assert [e["event"] for e in logs].count("event_write_failed") == 1
    assert [e["event"] for e in logs].count("server_stopped") == 3


def test_no_path_only_logs() -> None:
    with structlog.testing.capture_logs() as logs:
        log = EventLog(None, server_id="s", wall_clock=clock)
        log.emit("server_stopped", reason="x", duologues_open=0)
    assert log.events_written == 0 and logs[0]["event"] == "server_stopped"


def test_unopenable_path_raises_at_open(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        EventLog(tmp_path / "missing" / "e.jsonl", server_id="s")
