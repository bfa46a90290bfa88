"""The Spark job's lobby report: exact counts on a hand-written and a generated log.

Runs a real local Spark (the session fixture of conftest.py).
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pytest

from echo.telemetry.cli import print_table
from echo.telemetry.generate import GroundTruth, LobbyTruth, generate

pytestmark = pytest.mark.spark
START = datetime.datetime(2026, 11, 20, tzinfo=datetime.UTC)
WAIT_EDGES = [0.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0]
# Keys of the summary that only echo-server events determine.
ECHO_KEYS = (
    "hello_received",
    "hello_rejected",
    "duologues_created",
    "duologues_connected",
    "duologues_expired",
    "duologues_closed",
    "image_refused",
    "client_summaries",
    "distinct_sources",
    "top_sources",
    "lifetime_s",
    "messages",
    "connections_over_time",
    "client_rtt",
)


def _ts(seconds: float) -> str:
    whole = int(seconds)
    return f"2026-11-22T10:{whole // 60:02d}:{whole % 60:02d}.{round((seconds % 1) * 1e6):06d}Z"


def test_hand_written_lobby_log(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Four lobbies whose every number is worked out by hand below."""
    from echo.telemetry.pipeline import run_analysis

    rows: list[tuple[float, str, str, dict[str, Any]]] = [
        (0, "lobby-1", "lobby_server_started", {"address": "::", "port": 1, "control_port": 2}),
        # A: full at 11 s (fill 10 s), started at 26 s (start 25 s) with 2 members.
        (1, "lobby-1", "lobby_created", {"lobby_id": 11, "member_id": "ann", "max_members": 2}),
        (1.5, "lobby-1", "lobby_joined", {"lobby_id": 11, "member_id": "ann", "members": 1}),
        (11, "lobby-1", "lobby_joined", {"lobby_id": 11, "member_id": "bob", "members": 2}),
        (12, "lobby-1", "lobby_chat", {"lobby_id": 11, "member_id": "ann", "bytes": 10}),
        (13, "lobby-1", "lobby_chat", {"lobby_id": 11, "member_id": "bob", "bytes": 20}),
        (26, "lobby-1", "lobby_started", {"lobby_id": 11, "members": 2, "game_server": "g:1"}),
        (27, "lobby-1", "lobby_left", {"lobby_id": 11, "member_id": "bob", "members": 1}),
        (28, "lobby-1", "lobby_left", {"lobby_id": 11, "member_id": "ann", "members": 0}),
        (28.5, "lobby-1", "lobby_deleted", {"lobby_id": 11, "reason": "empty"}),
        # B: peak 3 of 4, never full; started at 65 s with 2: fill = start = 60 s.
        (5, "lobby-1", "lobby_created", {"lobby_id": 22, "member_id": "cat", "max_members": 4}),
        (5.5, "lobby-1", "lobby_joined", {"lobby_id": 22, "member_id": "cat", "members": 1}),
        (6, "lobby-1", "lobby_joined", {"lobby_id": 22, "member_id": "dan", "members": 2}),
        (7, "lobby-1", "lobby_joined", {"lobby_id": 22, "member_id": "eve", "members": 3}),
        (8, "lobby-1", "lobby_left", {"lobby_id": 22, "member_id": "dan", "members": 2}),
        (
            9,
            "lobby-1",
            "lobby_refused",
            {"member_id": "fay", "request": "JoinLobby", "code": "BANNED"},
        ),
        (20, "lobby-1", "lobby_chat", {"lobby_id": 22, "member_id": "cat", "bytes": 30}),
        (65, "lobby-1", "lobby_started", {"lobby_id": 22, "members": 2, "game_server": "g:1"}),
        # C: its home died; its members re-created it on lobby-2 (one lobby, re-homed once);
        # never filled.
        (2, "lobby-1", "lobby_created", {"lobby_id": 33, "member_id": "gil", "max_members": 4}),
        (2.5, "lobby-1", "lobby_joined", {"lobby_id": 33, "member_id": "gil", "members": 1}),
        (3, "lobby-1", "lobby_joined", {"lobby_id": 33, "member_id": "hal", "members": 2}),
        (4, "lobby-2", "lobby_joined", {"lobby_id": 33, "member_id": "gil", "members": 1}),
        (4.5, "lobby-2", "lobby_joined", {"lobby_id": 33, "member_id": "hal", "members": 2}),
        # D: created before the log began: a join and a chat line, no per-lobby numbers.
        (30, "lobby-2", "lobby_joined", {"lobby_id": 44, "member_id": "ivy", "members": 3}),
        (31, "lobby-2", "lobby_chat", {"lobby_id": 44, "member_id": "ivy", "bytes": 5}),
        (
            40,
            "lobby-2",
            "lobby_refused",
            {"member_id": "joe", "request": "JoinLobby", "code": "LOBBY_FULL"},
        ),
        (
            41,
            "lobby-2",
            "lobby_refused",
            {"member_id": "kim", "request": "SendChat", "code": "RATE_LIMITED"},
        ),
        (
            42,
            "lobby-2",
            "lobby_refused",
            {"member_id": "kim", "request": "SendChat", "code": "RATE_LIMITED"},
        ),
        # Seats taken back with resume tokens, and two matches the matchmaker seated (their
        # lobbies have no lobby_created here: no per-lobby numbers).
        (50, "lobby-2", "lobby_resumed", {"lobby_id": 33, "member_id": "hal"}),
        (51, "lobby-2", "lobby_resumed", {"lobby_id": 33, "member_id": "gil"}),
        (
            60,
            "lobby-2",
            "lobby_matched",
            {"lobby_id": 55, "members": 4, "tickets": 3, "started": 1},
        ),
        (
            61,
            "lobby-1",
            "lobby_matched",
            {"lobby_id": 66, "members": 2, "tickets": 2, "started": 0},
        ),
    ]
    defaults = {
        "lobby_created": {"visibility": "public"},
        "lobby_left": {"reason": "left"},
    }
    with (tmp_path / "lobby.jsonl").open("w") as f:
        for t, server, event, fields in sorted(rows, key=lambda r: r[0]):
            if event == "lobby_left" and fields["member_id"] == "dan":
                fields = {**fields, "reason": "kicked"}
            line = {"ts": _ts(t), "server_id": server, "event": event, "schema_version": 1}
            f.write(json.dumps({**line, **defaults.get(event, {}), **fields}) + "\n")

    s = run_analysis([str(tmp_path / "lobby.jsonl")], str(tmp_path / "out"), spark=spark)
    assert (s["lines_total"], s["bad_lines"]) == (len(rows), 0)
    assert s["lobbies"] == {
        "servers": ["lobby-1", "lobby-2"],
        "created": 3,
        "rehomed": 1,
        "joins": 10,
        "started": 2,
        "left": {"kicked": 1, "left": 2},
        "deleted": {"empty": 1},
        "sizes": {
            "capacity": {"2": 1, "4": 2},
            "peak": {"2": 2, "3": 1},
            "at_start": {"2": 2},
        },
        "time_to_fill_s": {
            "count": 2,
            "edges": WAIT_EDGES,
            "histogram": [0, 1, 0, 0, 1, 0, 0, 0, 0],
            "p50": 10.0,
            "p90": 60.0,
            "p99": 60.0,
            "never": 1,
        },
        "time_to_start_s": {
            "count": 2,
            "edges": WAIT_EDGES,
            "histogram": [0, 0, 1, 0, 1, 0, 0, 0, 0],
            "p50": 25.0,
            "p90": 60.0,
            "p99": 60.0,
        },
        "chat": {"lines": 4, "bytes": 65, "lobbies_with_chat": 3, "bytes_per_line": 16.25},
        "refusals": {
            "total": 4,
            "by_code": {"BANNED": 1, "LOBBY_FULL": 1, "RATE_LIMITED": 2},
            "by_request": {"JoinLobby": 2, "SendChat": 2},
        },
        "resumed": 2,
        "matched": {"matches": 2, "members": 6, "tickets": 5, "started": 1},
    }
    html = Path(s.report_path).read_text()
    for card in ("seats resumed<b>2</b>", "matches<b>2</b>", "players matched<b>6</b>"):
        assert f'<div class="card">{card}</div>' in html, card
    print_table(s.data)
    rows = [row.split() for row in capsys.readouterr().out.splitlines()]
    assert ["lobby", "seats", "resumed", "2"] in rows and ["matchmaker", "matches", "2"] in rows
    # No echo-server events: those parts are empty, not broken.
    assert s["duologues_created"] == 0 and s["hello_received"] == 0


@pytest.fixture(scope="module")
def both(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[GroundTruth, Any, Any]:
    """The same echo-server log analysed alone and with 150 lobbies on three servers mixed in."""
    from echo.telemetry.pipeline import run_analysis

    work = tmp_path_factory.mktemp("lobbyjob")
    args: dict[str, Any] = {"events": 1500, "seed": 21, "start": START, "days": 1}
    generate(work / "echo.jsonl", **args)
    truth = generate(work / "mixed.jsonl", **args, lobbies=150, lobby_servers=3)
    plain = run_analysis([str(work / "echo.jsonl")], str(work / "out-echo"), spark=spark)
    mixed = run_analysis([str(work / "mixed.jsonl")], str(work / "out-mixed"), spark=spark)
    return truth, plain, mixed


def test_generated_lobby_log_equals_ground_truth(both: tuple[GroundTruth, Any, Any]) -> None:
    truth, _, mixed = both
    expected = truth.expected_summary()
    assert {k: mixed[k] for k in expected} == expected
    lob = mixed["lobbies"]
    assert lob == truth.lobbies.expected_summary()
    # the headline numbers of the report, spelled out
    assert lob["created"] == 150 and lob["rehomed"] > 0
    assert sum(lob["sizes"]["at_start"].values()) == lob["started"] > 0
    assert lob["time_to_fill_s"]["p50"] <= lob["time_to_fill_s"]["p99"]
    assert lob["chat"]["lines"] > 0 and lob["chat"]["bytes"] > lob["chat"]["lines"]
    assert lob["refusals"]["by_code"]["LOBBY_FULL"] > 0


def test_echo_only_log_reports_as_before(both: tuple[GroundTruth, Any, Any]) -> None:
    _, plain, mixed = both
    assert {k: plain[k] for k in ECHO_KEYS} == {k: mixed[k] for k in ECHO_KEYS}
    assert plain["lobbies"] == LobbyTruth().expected_summary()
    assert plain["lobbies"]["created"] == 0 and plain["lobbies"]["servers"] == []
    html = Path(plain.report_path).read_text()
    assert "<h2>Lobbies</h2>" not in html and html.count("<svg") == 8


def test_report_and_table_show_lobbies(
    both: tuple[GroundTruth, Any, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    truth, plain, mixed = both
    lob = truth.lobbies.expected_summary()
    html = Path(mixed.report_path).read_text()
    assert "<h2>Lobbies</h2>" in html
    assert html.count("<svg") == 8 + 6  # sizes at start, peak, fill, start, refusals, leaves
    assert f"<b>{lob['created']:,}</b>" in html and f"<b>{lob['chat']['bytes']:,}</b>" in html
    print_table(plain.data)
    assert "lobbies created" not in capsys.readouterr().out
    print_table(mixed.data)
    out = capsys.readouterr().out
    for line in (
        ("lobbies created", lob["created"]),
        ("lobbies re-homed", lob["rehomed"]),
        ("lobby chat lines", lob["chat"]["lines"]),
        ("lobby chat bytes", lob["chat"]["bytes"]),
        ("refused: LOBBY_FULL", lob["refusals"]["by_code"]["LOBBY_FULL"]),
    ):
        assert any(
            row.startswith(line[0]) and row.endswith(f"{line[1]:,}") for row in out.splitlines()
        ), line
    assert "time to fill p50/p90/p99 s" in out and "members at start" in out
