"""kill -9 of the matchmaker's server, with real processes: three echo-lobby processes sharing
a seat key, four echo-lobby-client processes queueing for a match of 4.

1. Three players queue on the queue's home, which is killed (SIGKILL) before the match is
   complete: their clients send their entries again to the queue's next home, where the
   fourth player (who finds the home silent and walks on) completes the match. All four are
   in one lobby, no one in two, no one lost.
2. Then the server holding the match's lobby is killed too: the four clients re-create the
   lobby on the next server of its ring, all four seated there.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from echo.lobby.matchmaker import queue_home
from echo.topics.ring import HashRing
from tests.lobby.test_cli import CLIENT, REPO
from tests.lobby.test_resume_process import LineClient
from tests.ports import free_base


def start_servers(tmp_path: Path, n: int) -> tuple[str, dict[str, subprocess.Popen[bytes]]]:
    key = tmp_path / "seat.key"
    key.write_text(f"1 {os.urandom(32).hex()}\n")
    ports: list[int] = []
    while len(ports) < n:
        port = free_base(40)
        if all(abs(port - p) > 40 for p in ports):
            ports.append(port)
    names = ",".join(f"127.0.0.1:{p}" for p in ports)
    lobbies: dict[str, subprocess.Popen[bytes]] = {}
    for i, port in enumerate(ports):
        log = tmp_path / f"lobby{i}.log"
        with log.open("wb") as out:
            lobbies[f"127.0.0.1:{port}"] = subprocess.Popen(
                [
                    *CLIENT[:-1],
                    "server",
                    "--port",
                    str(port),
                    "--max-clients",
                    "16",
                    "--lobby-servers",
                    names,
                    "--seat-key",
                    str(key),
                    "--log-format",
                    "json",
                ],
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 30
        while '"listening"' not in log.read_text():
            assert lobbies[f"127.0.0.1:{port}"].poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)  # another process's file or port: nothing to await
    return names, lobbies


def test_killing_the_matchmakers_server_loses_no_one_and_seats_no_one_twice(
    tmp_path: Path,
) -> None:
    names, lobbies = start_servers(tmp_path, 3)
    ring = HashRing(names.split(","))
    home = queue_home(ring, "squad", "eu")
    assert home is not None
    nxt = queue_home(ring, "squad", "eu", {home})
    clients: list[LineClient] = []
    try:
        for i in range(3):
            player = LineClient(names, f"p{i}", "--connect-timeout", "1")
            clients.append(player)
            player.send(f"queue squad eu skill={1000 + i} size=4")
            assert player.until("queued")["server"] == home
        lobbies[home].send_signal(signal.SIGKILL)
        lobbies[home].wait(timeout=10)
        # The fourth finds the home silent and walks on to the next home, where the others'
        # entries arrive again once their clients have found the home silent too.
        last = LineClient(names, "p3", "--connect-timeout", "1")
        clients.append(last)
        last.send("queue squad eu skill=1003 size=4")
        assert last.until("queued", timeout=30)["server"] == nxt
        matched = [c.until("matched", timeout=40) for c in clients]
        assert len({m["lobby_id"] for m in matched}) == 1, matched
        lobby_id = matched[0]["lobby_id"]
        assert not any(r["event"] == "queue_left" for c in clients for r in c.seen)
        views = [c.state() for c in clients]
        for view in views:
            assert view["lobby_id"] == lobby_id
            assert sorted(view["members"]) == ["p0", "p1", "p2", "p3"]
        # Now the server holding the match's lobby dies: its members re-create it elsewhere.
        where = nxt
        lobbies[where].send_signal(signal.SIGKILL)
        lobbies[where].wait(timeout=10)
        moved = [c.until("rehomed", timeout=40) for c in clients]
        assert {m["lobby_id"] for m in moved} == {lobby_id}
        assert len({m["server"] for m in moved}) == 1 and moved[0]["server"] != where
        for client in clients:
            view = client.state()
            assert view["lobby_id"] == lobby_id
            assert sorted(view["members"]) == ["p0", "p1", "p2", "p3"]
    finally:
        for client in clients:
            client.stop()
        for process in lobbies.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=30)
