"""echo-lobby-client's queue and cancel, as processes against an echo-lobby process."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.lobby.test_cli import CLIENT, REPO, lobby, run

__all__ = ["lobby"]  # (the fixture, used by name)


def test_two_line_clients_are_matched_into_one_lobby(lobby: tuple[int, Path]) -> None:
    port, events = lobby
    servers = f"127.0.0.1:{port}"

    def start(name: str) -> tuple[subprocess.Popen[str], Any]:
        out_file = (events.parent / f"{name}.out").open("w+")
        proc = subprocess.Popen(
            [*CLIENT, "--servers", servers, "--member", name, "--json"],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=out_file,
            stderr=subprocess.STDOUT,
            text=True,
        )
        return proc, out_file

    # Ann queues and waits; Ben queues once Ann's wait has begun (a `wait` counts events from
    # its own start), and asks for his state once Ann was matched.
    ann, ann_out = start("ann")
    ben, ben_out = start("ben")
    assert ann.stdin is not None and ben.stdin is not None
    ann.stdin.write("queue duel eu skill=1000 size=2\nwait matched 30\nstate\n")
    ann.stdin.flush()
    deadline = time.monotonic() + 30
    while '"queued"' not in Path(ann_out.name).read_text():
        assert time.monotonic() < deadline and ann.poll() is None
        time.sleep(0.05)
    ben.stdin.write("queue duel eu skill=1040 size=2\n")
    ben.stdin.flush()
    ann.stdin.close()
    ann.wait(timeout=60)
    ben.stdin.write("wait snapshot 0.5\nstate\n")  # (its snapshot came already: exit 4)
    ben.stdin.close()
    ben.wait(timeout=60)
    procs = [ann, ben]
    outs = [(Path(f.name).read_text(), "") for f in (ann_out, ben_out)]
    ann_out.close()
    ben_out.close()
    lobbies = []
    for proc, (out, err) in zip(procs, outs, strict=True):
        assert proc.returncode in ((0,) if proc is ann else (0, 4)), (out, err)
        records = [json.loads(line) for line in out.splitlines()]
        kinds = [r["event"] for r in records]
        assert "queued" in kinds and "matched" in kinds, kinds
        matched = next(r for r in records if r["event"] == "matched")
        state = next(r for r in records if r["event"] == "state")
        assert state["lobby_id"] == matched["lobby_id"]
        assert sorted(state["members"]) == ["ann", "ben"]
        lobbies.append(matched["lobby_id"])
    assert lobbies[0] == lobbies[1]
    written = [json.loads(line) for line in events.read_text().splitlines()]
    assert any(r["event"] == "lobby_matched" for r in written)


def test_cancel_and_bad_queue_commands(lobby: tuple[int, Path]) -> None:
    port, _ = lobby
    result = run(
        [*CLIENT, "--servers", f"127.0.0.1:{port}", "--member", "cara"],
        stdin="cancel\nqueue duel eu size=two\nqueue duel eu size=1\nqueue duel eu size=3\n"
        "cancel\n",
    )
    lines = result.stdout.splitlines()
    assert any(line.startswith("refused NOT_QUEUED") for line in lines), lines
    assert any("size is a whole number, not 'two'" in line for line in lines), lines
    assert any(line.startswith("refused BAD_REQUEST") for line in lines), lines
    assert any(line.startswith("queued ") for line in lines), lines
    assert "ok cancel" in lines
    assert result.returncode == 3
