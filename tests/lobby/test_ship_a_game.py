"""The "ship a game" walk-through (docs/ship-a-game.md) runs: its example programs as real
processes against echo-topics and echo-lobby processes, with a player killed (SIGKILL) in the
middle of the game who comes back from its state file, gets a fresh ticket for the running
game, and finishes it; the game server's signed result takes everyone back to the lobby."""

from __future__ import annotations

import ast
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from echo.tickets import new_key_text
from tests.lobby.test_cli import REPO, start_lobby
from tests.ports import free_base
from tools.demo.ship import EXAMPLE, walkthrough

PAGE = REPO / "docs" / "ship-a-game.md"


@pytest.mark.parametrize("matchmaker", [False, True], ids=["lobby", "matchmaker"])
def test_the_walkthrough_runs_with_a_crash_in_the_middle(tmp_path: Path, matchmaker: bool) -> None:
    """The players meet in a lobby one creates and the other joins, or as strangers through
    the matchmaker (mode rps, region eu, skills 1500 and 1540): the rest is the same."""
    key = tmp_path / "game.key"
    key.write_text(new_key_text())
    topics_port = free_base(1)
    topics = subprocess.Popen(
        [sys.executable, "-m", "echo.topics.serve", "--port", str(topics_port),
         "--log-level", "warning"],
        cwd=REPO,
    )  # fmt: skip
    lobby_process, lobby_port = start_lobby(
        tmp_path / "lobby.log", "--topics", f"127.0.0.1:{topics_port}", "--ticket-key", str(key)
    )
    try:
        outcome = walkthrough(
            f"127.0.0.1:{lobby_port}",
            f"127.0.0.1:{topics_port}",
            key,
            free_base(20),
            tmp_path,
            matchmaker=matchmaker,
        )
    finally:
        for process in (lobby_process, topics):
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)
    alice, bob, again = outcome.alice, outcome.bob, outcome.bob_again
    lobby_id = alice.wait_for("matched" if matchmaker else "created").split()[-1]
    if matchmaker:
        assert bob.wait_for("matched").split()[-1] == lobby_id  # one lobby made for the two
    # Both got their GameStarting for one match and were welcomed with their team and roster.
    match_id = alice.wait_for("game ").split()[1]
    assert bob.wait_for("game ").split()[1] == match_id
    assert "WELCOME alice team=red against=bob" in alice.wait_for("WELCOME")
    assert "WELCOME bob team=blue against=alice" in bob.wait_for("WELCOME")
    assert bob.process.returncode == -signal.SIGKILL
    # The new bob: its seat back, a fresh ticket for the same match, the game played on.
    assert again.wait_for("resumed").split()[1] == lobby_id
    assert outcome.resume_seconds < 10  # the process's start-up included (CI is slow)
    assert again.wait_for("game ").split()[1] == match_id
    assert "WELCOME bob team=blue" in again.wait_for("WELCOME")
    # paper beats rock; the game server said so, and the lobby passed its result on.
    for player in (alice, again):
        assert player.wait_for("RESULT") == "RESULT winner=bob"
        ended = ast.literal_eval(player.wait_for("game_ended").split(" ", 1)[1])
        assert ended == {"winner": "bob", "moves": "alice:rock,bob:paper"}
        assert player.wait_for("back_in_lobby") == "back_in_lobby locked=False ready=[]"
        assert player.process.returncode == 0
    assert not (tmp_path / "bob.state").exists()  # left the lobby: nothing to resume
    print(f"resume: restart to 'resumed' in {outcome.resume_seconds * 1000:.0f} ms")


def test_the_page_shows_the_example_programs_it_runs() -> None:
    page = PAGE.read_text()
    for name in ("game_server.py", "player.py"):
        assert (EXAMPLE / name).exists()
        assert f'--8<-- "examples/ship_a_game/{name}"' in page
    assert "matchmaker" in page.lower()
