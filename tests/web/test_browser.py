"""The lobby page end to end in real headless Chromium (Debian's chromium, driven by
playwright-core: clients/js/e2e/lobby-page.mjs), with two Python members on echo's UDP protocol
in the same lobby, real server processes, and the game server admitting every ticket.

A browser cannot speak echo's UDP protocol: the browser members' tickets, read from their
pages, are shown to `echo-server --ticket-key` by a Python session client, as the browser's
game would show them. Screenshots of every step are kept in artifacts/web/ (ignored by git).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import trio

from tests.ports import free_ports
from tests.web.servers import ARTIFACTS, CHROMIUM, REPO, node
from tests.web.test_js_client import SIDES
from tools.demo.web import BROWSER_MEMBERS, PORT_OFFSETS, PYTHON_MEMBERS, scenario, stack

EVERYONE = (*PYTHON_MEMBERS, *BROWSER_MEMBERS)


def trace_line(line: str) -> tuple[str, str]:
    """One traced message of a page, checked against the JSON Schema: (direction, type)."""
    seen = json.loads(line)
    side = "client_message" if seen["direction"] == "out" else "server_message"
    SIDES[side].validate(seen["message"])
    return seen["direction"], seen["message"]["type"]


def _browser_ready() -> None:
    node()
    assert CHROMIUM.exists(), "Debian's chromium is not installed (./dev test installs it)"


def test_two_browser_and_two_python_members_play_one_lobby_to_the_game_server(
    tmp_path: Path,
) -> None:
    _browser_ready()
    shots = ARTIFACTS / "e2e"
    shutil.rmtree(shots, ignore_errors=True)
    with stack(free_ports(PORT_OFFSETS), tmp_path / "logs") as the:
        report = trio.run(functools.partial(scenario, the, shots, mode=f"e2e-{os.getpid()}"))
    told = "\n".join(f"{who}: {line}" for who, lines in report.saw.items() for line in lines)
    told += f"\nadmitted: {report.admitted}"
    assert report.browser_exit == 0, told
    # chat both ways: the page's line reached Python, Python's reached both pages
    for name in PYTHON_MEMBERS:
        assert "chat <web-bea> hello from the browser" in report.saw[name], told
    for name in BROWSER_MEMBERS:
        assert any("chat from python" in s and "hello from python" in s
                   for s in report.saw[name]), told
    # the owner left: both pages and the Python member saw the lobby pass to web-bea
    assert any(s.startswith("owner changed") and "you_own=True" in s
               for s in report.saw["web-bea"]), told
    assert any(s.startswith("owner changed") and "owner=web-bea" in s
               for s in report.saw["web-cal"]), told
    assert "owner is now web-bea" in report.saw["py-dan"], told
    # all four got their own ticket for the same game server, and all four were admitted
    assert set(report.tickets) == set(EVERYONE), told
    assert {address for address, _ in report.tickets.values()} == {the.game}
    assert len({ticket for _, ticket in report.tickets.values()}) == 4
    for name in EVERYONE:
        assert report.admitted[name] == f"ECHO {name} is in the game", told
    # the game server checks the tickets: web-cal's changed by one bit is refused
    assert report.admitted["forged"] == "refused: ticket refused: bad_signature", told
    assert report.everyone_in_the_game
    # every message both pages sent and received is one of the protocol's (its JSON Schema)
    kinds = {
        name: {trace_line(t) for t in (shots / f"trace-{name}.jsonl").read_text().splitlines()}
        for name in BROWSER_MEMBERS
    }
    for name in BROWSER_MEMBERS:
        assert {("out", "hello"), ("out", "search_lobbies"), ("out", "join_lobby"),
                ("out", "set_attributes"), ("out", "set_ready"), ("in", "welcome"),
                ("in", "owner_changed"), ("in", "chat_line"), ("in", "game_starting")
                } <= kinds[name], kinds[name]
    assert {("out", "send_chat"), ("out", "start_game")} <= kinds["web-bea"]
    # the screenshots of each step are the run's artefacts
    names = {p.name.split("-", 1)[1] for p in report.screenshots}
    assert {"web-bea-search.png", "web-bea-owner.png", "web-cal-game.png"} <= names, names


def test_the_web_demo_runs_to_the_end_by_itself(tmp_path: Path) -> None:
    _browser_ready()
    out = tmp_path / "demo"
    done = subprocess.run(
        [sys.executable, "-m", "tools.demo.web", "--port", str(free_ports(PORT_OFFSETS)),
         "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=240, check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    for name in EVERYONE:
        assert f"  {name}: ECHO {name} is in the game" in done.stdout, done.stdout[-3000:]
    assert "web-bea [browser] saw:" in done.stdout and "py-ann [python (UDP)] saw:" in done.stdout
    assert "all four reached the game server" in done.stdout
    assert "  forged: refused: ticket refused: bad_signature" in done.stdout
    assert len(list((out / "screenshots").glob("*.png"))) == 7  # each step of both pages


def test_a_reloaded_page_takes_its_seat_back(tmp_path: Path) -> None:
    from tests.web.servers import CLIENTS_JS, lobby_server

    _browser_ready()
    with lobby_server(tmp_path / "lobby.log", "--web") as lobby:
        done = subprocess.run(
            [node(), "e2e/page-reload.mjs", "--page", lobby.http_url, "--out",
             str(ARTIFACTS / "reload")],
            cwd=CLIENTS_JS, capture_output=True, text=True, timeout=120, check=False,
        )
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    before, after = seen["before"], seen["after"]
    assert after["status"].endswith("as web-eve (seat taken back).")
    assert after["lobby"] == before["lobby"] == "Reload test"
    assert after["members"] == before["members"] == ["web-eve"]
    assert "hat=green" in after["attributes"]
