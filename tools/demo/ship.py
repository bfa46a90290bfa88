"""The "ship a game" walk-through as processes: examples/ship_a_game's game server and two
players against a running lobby server and topic server, with a crash in the middle.

alice creates a lobby, bob joins it; both set a team and ready up; alice starts the game on a
server tagged mode=rps; both take their tickets there. bob is killed with SIGKILL before his
move; a new bob process with the same state file takes his seat back ("resumed"), asks the
lobby for a fresh ticket for the game still running, and moves. The game server reports the
result, signed with its ticket key; the lobby unlocks, resets ready states and tells both
(GameEnded): they are back in the lobby. `./dev lobby-demo` runs this after its bots, and the
walk-through's test (tests/lobby/test_ship_a_game.py) runs it against its own servers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import attrs

from tools.demo.server import COLOURS, _pump

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ship_a_game"


@attrs.define
class Run:
    """One process of the walk-through and every line it printed."""

    label: str
    process: subprocess.Popen[str]
    lines: list[str]

    def wait_for(self, text: str, timeout: float = 60.0) -> str:
        """The first line containing `text` (waiting for it); AssertionError if none comes."""
        deadline = time.monotonic() + timeout
        while True:
            for line in list(self.lines):
                if text in line:
                    return line.rstrip("\n")
            if self.process.poll() is not None and not any(text in x for x in self.lines):
                time.sleep(0.2)  # the pump may still hold the last lines
                if not any(text in x for x in self.lines):
                    raise AssertionError(f"{self.label} exited without printing {text!r}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.label} printed no {text!r} in {timeout:.0f} s")
            time.sleep(0.02)


def _script(name: str, args: list[str], label: str, colour: str, hold: bool = False) -> Run:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    process = subprocess.Popen(
        [sys.executable, str(EXAMPLE / name), *args],
        stdin=subprocess.PIPE if hold else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    lines: list[str] = []
    threading.Thread(target=_pump, args=(process, label, colour, lines), daemon=True).start()
    return Run(label, process, lines)


@attrs.define
class Outcome:
    alice: Run
    bob: Run  # the killed process
    bob_again: Run  # its restart with the same state file
    game: Run
    resume_seconds: float  # from the restart to "resumed"


def walkthrough(
    lobby: str,
    topics: str,
    key: Path,
    game_port: int,
    state_dir: Path,
    names: tuple[str, str] = ("alice", "bob"),
    lobby_key: str | None = None,
    matchmaker: bool = False,
) -> Outcome:
    """Run it, the owner and the player who crashes named `names`; raises AssertionError at
    the first step that does not happen."""
    first, second = names
    runs: list[Run] = []
    try:
        game = _script(
            "game_server.py",
            ["--port", str(game_port), "--topics", topics, "--ticket-key", str(key)],
            "rps",
            COLOURS[0],
        )
        runs.append(game)
        game.wait_for("announcing")
        time.sleep(1.0)  # an announcement reaches the lobby (every 0.5 s)
        common = ["--servers", lobby, *(["--server-key", lobby_key] if lobby_key else [])]
        first_state = str(state_dir / f"{first}.state")
        meet = ["--queue", "rps", "eu"] if matchmaker else ["--create"]
        alice = _script(
            "player.py",
            [*common, "--member", first, "--state-file", first_state, *meet, "--team", "red",
             "--move", "rock", "--skill", "1500"],
            first, COLOURS[1],
        )  # fmt: skip
        runs.append(alice)
        bob_state = state_dir / f"{second}.state"
        if matchmaker:
            meet = ["--queue", "rps", "eu", "--skill", "1540"]
        else:
            meet = ["--join", alice.wait_for("created").split()[-1]]
        bob = _script(
            "player.py",
            [*common, "--member", second, "--state-file", str(bob_state), *meet,
             "--team", "blue", "--move", "paper", "--hold"],
            second, COLOURS[2], hold=True,
        )  # fmt: skip
        runs.append(bob)
        bob.wait_for("in_game")
        alice.wait_for("in_game")
        while not bob_state.exists():  # the seat's token is saved (it came with the seat)
            time.sleep(0.02)
        print(f"--- kill -9 {second} in the middle of the game ---", flush=True)
        bob.process.send_signal(signal.SIGKILL)
        bob.process.wait(timeout=10)
        restarted = time.monotonic()
        bob_again = _script(
            "player.py",
            [*common, "--member", second, "--state-file", str(bob_state), "--move", "paper"],
            f"{second}(2)", COLOURS[3],
        )  # fmt: skip
        runs.append(bob_again)
        bob_again.wait_for("resumed")
        resume_seconds = time.monotonic() - restarted
        for player in (alice, bob_again):
            player.wait_for("back_in_lobby")
        for player in (alice, bob_again):
            player.process.wait(timeout=30)
        return Outcome(alice, bob, bob_again, game, resume_seconds)
    finally:
        for run in reversed(runs):
            if run.process.poll() is None:
                run.process.send_signal(signal.SIGTERM)
                try:
                    run.process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    run.process.kill()
                    run.process.wait()
