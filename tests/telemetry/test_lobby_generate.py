"""The generator's lobby part (no Spark): the truth it returns is what is in the file."""

from __future__ import annotations

import datetime
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from echo.telemetry.cli import main
from echo.telemetry.generate import generate
from echo.telemetry.schema import validate_event

START = datetime.datetime(2026, 11, 20, tzinfo=datetime.UTC)


def valid_events(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text().splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if validate_event(obj) is None:
            out.append(obj)
    return out


def micros(ts: str) -> int:
    day = datetime.datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.UTC)
    return round(day.timestamp() * 1_000_000)


def test_lobby_truth_matches_an_independent_recount(tmp_path: Path) -> None:
    path = tmp_path / "l.jsonl"
    truth = generate(
        path, events=2000, seed=8, start=START, days=1, lobbies=400, lobby_servers=3, bad_rate=0.01
    )
    events = valid_events(path)
    assert len(events) == truth.events_total - truth.unknown_events
    assert [e["ts"] for e in events] == sorted(e["ts"] for e in events)  # time order
    assert truth.bad_lines > 20  # lobby lines get mangled copies too
    lob = [e for e in events if e["event"].startswith("lobby_")]
    expected = truth.lobbies.expected_summary()
    assert expected["servers"] == ["lobby-1", "lobby-2", "lobby-3"]
    assert sorted({e["server_id"] for e in lob}) == expected["servers"]

    # Per lobby, by the rules of pipeline._lobbies, written again here from the file.
    by_lobby: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in lob:
        if "lobby_id" in e:
            by_lobby[e["lobby_id"]].append(e)
    fill: list[float] = []
    start: list[float] = []
    never = 0
    at_start: Counter[str] = Counter()
    for evs in by_lobby.values():
        created = [e for e in evs if e["event"] == "lobby_created"]
        t0, cap = micros(created[0]["ts"]), created[0]["max_members"]
        full = [
            micros(e["ts"]) for e in evs if e["event"] == "lobby_joined" and e["members"] >= cap
        ]
        started = [e for e in evs if e["event"] == "lobby_started"]
        ends = full[:1] + [micros(e["ts"]) for e in started[:1]]
        if ends:
            fill.append((min(ends) - t0) / 1e6)
        else:
            never += 1
        if started:
            start.append((micros(started[0]["ts"]) - t0) / 1e6)
            at_start[str(started[0]["members"])] += 1
    assert len(by_lobby) == expected["created"] == 400
    moved = [evs for evs in by_lobby.values() if len({e["server_id"] for e in evs}) > 1]
    assert expected["rehomed"] == len(moved) > 0  # three servers: some lobbies failed over
    assert sorted(fill) == sorted(truth.lobbies.fill_s)
    assert sorted(start) == sorted(truth.lobbies.start_s)
    assert expected["time_to_fill_s"]["never"] == never > 0
    assert expected["time_to_start_s"]["count"] == len(start) == expected["started"] > 0
    assert expected["sizes"]["at_start"] == dict(at_start)
    chats = [e["bytes"] for e in lob if e["event"] == "lobby_chat"]
    assert expected["chat"]["lines"] == len(chats) > 0
    assert expected["chat"]["bytes"] == sum(chats)
    refused = [e for e in lob if e["event"] == "lobby_refused"]
    assert expected["refusals"]["by_code"] == dict(Counter(e["code"] for e in refused))
    assert {"LOBBY_FULL", "RATE_LIMITED", "NOT_OWNER"} <= set(expected["refusals"]["by_code"])
    assert expected["joins"] == sum(e["event"] == "lobby_joined" for e in lob)
    # Every lobby ends deleted, with no member left in it.
    assert expected["deleted"] == {"empty": 400}


def test_lobbies_leave_the_echo_part_of_the_file_unchanged(tmp_path: Path) -> None:
    """Lobby lines are merged in; the echo-server lines (bad copies included) stay as they were."""
    plain = generate(tmp_path / "plain", events=3000, seed=5, start=START, days=1)
    default = generate(tmp_path / "default", events=3000, seed=5, start=START, days=1, lobbies=0)
    mixed = generate(tmp_path / "mixed", events=3000, seed=5, start=START, days=1, lobbies=50)
    assert (tmp_path / "plain").read_bytes() == (tmp_path / "default").read_bytes()
    assert plain.lobbies.expected_summary()["created"] == 0 == default.lobbies.created
    echo_lines = (tmp_path / "plain").read_text().splitlines()
    mixed_lines = iter((tmp_path / "mixed").read_text().splitlines())
    assert all(line in mixed_lines for line in echo_lines)  # an ordered subsequence
    assert mixed.hello_received == plain.hello_received
    assert mixed.duologues_created == plain.duologues_created
    lobby_lines = sum(n for k, n in mixed.events_by_type.items() if k.startswith("lobby_"))
    assert mixed.lines_total - plain.lines_total == lobby_lines + mixed.bad_lines - plain.bad_lines
    assert mixed.lobbies.created == 50


def test_generate_cli_writes_the_library_file(tmp_path: Path) -> None:
    args = ["--events", "500", "--seed", "3", "--days", "1", "--lobbies", "40"]
    result = CliRunner().invoke(
        main, ["--generate", str(tmp_path / "c"), *args, "--lobby-servers", "2"]
    )
    assert result.exit_code == 0, result.output
    truth = generate(
        tmp_path / "lib", events=500, seed=3, start=START, days=1, lobbies=40, lobby_servers=2
    )
    assert (tmp_path / "c").read_bytes() == (tmp_path / "lib").read_bytes()
    assert truth.lobbies.servers == ["lobby-1", "lobby-2"]
