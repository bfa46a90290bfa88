"""echo-lobby-client's queue and cancel, as processes against an echo-lobby process."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.lobby.test_cli import CLIENT, REPO, lobby, run

__all__ = ["lobby"]  # (the fixture, used by name)


def test_two_line_clients_are_matched_into_one_lobby(lobby: tuple[int, Path]) -> None:
    port, events = lobby
    servers = f"127.0.0.1:{port}"
    procs, files = [], []
    for name, skill in (("ann", 1000), ("ben", 1040)):
        out_file = (events.parent / f"{name}.out").open("w+")
        proc = subprocess.Popen(
            [*CLIENT, "--servers", servers, "--member", name, "--json"],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=out_file,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert proc.stdin is not None
        proc.stdin.write(f"queue duel eu skill={skill} size=2\nwait matched 20\nstate\n")
        proc.stdin.close()
        procs.append(proc)
        files.append(out_file)
    outs = []
    for proc, out_file in zip(procs, files, strict=True):
        proc.wait(timeout=60)
        out_file.seek(0)
        outs.append((out_file.read(), ""))
        out_file.close()
    lobbies = []
    for proc, (out, err) in zip(procs, outs, strict=True):
        assert proc.returncode == 0, (out, err)
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
