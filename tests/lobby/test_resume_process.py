"""A crashed echo-lobby-client comes back: real processes, kill -9, the same --state-file.

echo-lobby runs as a process; alice and bob are echo-lobby-client processes. bob keeps its
resume token in a state file, joins alice's lobby, readies and sets its team, and is killed
with SIGKILL (no goodbye: the server still holds its session, half-open). A new bob process
with the same state file prints ``resumed LOBBY_ID`` and sits in its seat again, ready, with
its attributes, as alice sees; the server did not refuse it for the seat's grace period.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from echo.lobby.statefile import read_state
from tests.lobby.test_cli import CLIENT, REPO, start_lobby
from tests.netlab.lab import LineReader
from tests.ports import free_base


class LineClient:
    """An echo-lobby-client --json process fed commands line by line."""

    def __init__(self, servers: str, member: str, *args: str) -> None:
        self.process = subprocess.Popen(
            [*CLIENT, "--servers", servers, "--member", member, "--json", *args],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.lines = LineReader(self.process.stdout)
        self.seen: list[dict[str, Any]] = []

    def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line.encode() + b"\n")
        self.process.stdin.flush()

    def until(self, event: str, timeout: float = 20.0, **fields: Any) -> dict[str, Any]:
        """The next output record of `event` (with those `fields`), others kept in `seen`."""
        deadline = time.monotonic() + timeout
        while True:
            record = json.loads(self.lines.readline(deadline - time.monotonic()))
            self.seen.append(record)
            if record["event"] == event and all(record.get(k) == v for k, v in fields.items()):
                return record

    def seen_or_until(self, event: str) -> dict[str, Any]:
        """The first record of `event` printed so far, else the next (a token saved may come
        before the line the test waited for: it is the server's first message on a seat)."""
        for record in self.seen:
            if record["event"] == event:
                return record
        return self.until(event)

    def state(self) -> dict[str, Any]:
        self.send("state")
        return self.until("state")

    def stop(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


METRICS: dict[str, int] = {}


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[str]:
    metrics = free_base(1)
    process, port = start_lobby(tmp_path / "lobby.log", "--metrics", f"127.0.0.1:{metrics}")
    METRICS[f"127.0.0.1:{port}"] = metrics
    yield f"127.0.0.1:{port}"
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0


def counter(servers: str, name: str) -> float:
    """echo-lobby's counter `name`, from its /metrics."""
    url = f"http://127.0.0.1:{METRICS[servers]}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith(f"echo_lobby_{name}_total "):
            return float(line.split()[1])
    raise AssertionError(f"no echo_lobby_{name}_total in /metrics")


def seated_bob(servers: str, state: Path, lobby_id: int) -> LineClient:
    bob = LineClient(servers, "bob", "--state-file", str(state))
    bob.send(f"join {lobby_id}")
    bob.until("joined")
    bob.send("ready")
    bob.until("ok", command="ready")
    bob.send("attr team=red")
    bob.until("ok", command="attr")
    bob.seen_or_until("token_saved")
    return bob


def test_a_killed_client_resumes_its_seat_from_its_state_file(servers: str, tmp_path: Path) -> None:
    state = tmp_path / "bob.state"
    alice = LineClient(servers, "alice")
    clients = [alice]
    try:
        alice.send("create room 4")
        lobby_id = alice.until("joined")["lobby_id"]
        bob = seated_bob(servers, state, lobby_id)
        clients.append(bob)
        # The file: the token for bob's seat, private to its owner, nothing left behind.
        saved = read_state(state)
        assert saved is not None and (saved.member, saved.lobby_id) == ("bob", lobby_id)
        assert stat.S_IMODE(os.stat(state).st_mode) == 0o600
        assert set(os.listdir(tmp_path)) == {"lobby.log", "bob.state"}  # no temporary left
        bob.process.send_signal(signal.SIGKILL)
        bob.process.wait(timeout=10)
        started = time.monotonic()
        again = LineClient(servers, "bob", "--state-file", str(state))
        clients.append(again)
        resumed = again.until("resumed")
        took = time.monotonic() - started
        assert resumed["lobby"] == lobby_id and resumed["server"] == servers
        assert counter(servers, "seats_resumed") == 1
        assert counter(servers, "hellos_refused") == 0  # never refused for the grace period
        # Back in its seat: connected, still ready, still on its team, as alice sees it.
        view = alice.state()
        assert "bob" in view["connected"] and "bob" in view["ready"], view
        assert view["attributes"]["bob"] == {"team": "red"}
        own = again.state()
        assert own["lobby_id"] == lobby_id and "bob" in own["ready"]
        # The new process keeps its own, new token; and it can act in the lobby.
        again.seen_or_until("token_saved")
        renewed = read_state(state)
        assert renewed is not None and renewed.token != saved.token
        again.send("chat back")
        alice.until("chat", member="bob", text="back")
        print(f"resume: process start to 'resumed' in {took * 1000:.0f} ms")
    finally:
        for client in clients:
            client.stop()


def test_a_stale_or_corrupt_state_file_starts_without_a_seat(servers: str, tmp_path: Path) -> None:
    state = tmp_path / "bob.state"
    alice = LineClient(servers, "alice")
    clients = [alice]
    try:
        alice.send("create room 4")
        lobby_id = alice.until("joined")["lobby_id"]
        bob = seated_bob(servers, state, lobby_id)
        clients.append(bob)
        stale = state.read_bytes()
        bob.process.send_signal(signal.SIGKILL)
        bob.process.wait(timeout=10)
        first = LineClient(servers, "bob", "--state-file", str(state))
        clients.append(first)
        first.until("resumed")
        first.seen_or_until("token_saved")
        # A copy of the old file (the token was used already): refused with its code, said
        # on standard error, and this process starts without a seat (bob's seat is taken).
        copy = tmp_path / "copy.state"
        copy.write_bytes(stale)
        second = subprocess.run(
            [*CLIENT, "--servers", servers, "--member", "bob", "--json", "--state-file",
             str(copy)],
            cwd=REPO, capture_output=True, text=True, timeout=60, input="state\n",
        )  # fmt: skip
        records = [json.loads(line) for line in second.stdout.splitlines()]
        refused = [r for r in records if r["event"] == "resume_refused"]
        assert refused and refused[0]["code"] == "REPLAYED", second.stdout
        assert counter(servers, "resumes_refused") == 1
        assert "could not take the seat back" in second.stderr
        assert not copy.exists()
        # bob's seat is held by `first`: a fresh start is refused too, and the text says a
        # server answered and refused.
        assert second.returncode == 1
        assert "let this member in" in second.stderr
        # A corrupt file: said, and a fresh start (alice's name is free on a new member id).
        broken = tmp_path / "carol.state"
        broken.write_text('{"format": 1, "member": "carol", "lobby": 5, "token": "zz"}')
        carol = subprocess.run(
            [*CLIENT, "--servers", servers, "--member", "carol", "--state-file", str(broken)],
            cwd=REPO, capture_output=True, text=True, timeout=60, input=f"join {lobby_id}\n",
        )  # fmt: skip
        assert carol.returncode == 0, carol.stderr
        assert "is corrupt" in carol.stderr and "starting without a seat" in carol.stderr
        assert f"joined {lobby_id} {servers}" in carol.stdout.splitlines()
        assert read_state(broken) is not None  # replaced by carol's token once seated
        # Another member's file is a usage error: nobody's token is overwritten.
        other = subprocess.run(
            [*CLIENT, "--servers", servers, "--member", "dave", "--state-file", str(broken)],
            cwd=REPO, capture_output=True, text=True, timeout=60, input="",
        )  # fmt: skip
        assert other.returncode == 2 and "member 'carol'" in other.stderr
    finally:
        for client in clients:
            client.stop()


def test_the_resume_finds_the_lobby_re_created_after_its_home_was_killed(
    tmp_path: Path,
) -> None:
    """Three echo-lobby processes sharing a seat key; bob is killed, then the lobby's home is
    killed too: alice's client re-creates the lobby on the next server of the ring, and bob's
    new process, from its state file, takes its seat back there."""
    key = tmp_path / "seat.key"
    key.write_text(f"1 {os.urandom(32).hex()}\n")
    ports: list[int] = []
    while len(ports) < 3:
        port = free_base(40)
        if all(abs(port - p) > 40 for p in ports):
            ports.append(port)
    names = ",".join(f"127.0.0.1:{p}" for p in ports)
    lobbies: dict[str, subprocess.Popen[bytes]] = {}
    clients: list[LineClient] = []
    try:
        for i, port in enumerate(ports):
            log = tmp_path / f"lobby{i}.log"
            with log.open("wb") as out:
                lobbies[f"127.0.0.1:{port}"] = subprocess.Popen(
                    [*CLIENT[:-1], "server", "--port", str(port), "--max-clients", "16",
                     "--lobby-servers", names, "--seat-key", str(key), "--log-format", "json"],
                    cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                )  # fmt: skip
            deadline = time.monotonic() + 30
            while '"listening"' not in log.read_text():
                assert lobbies[f"127.0.0.1:{port}"].poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)  # another process's file or port: nothing to await
        alice = LineClient(names, "alice")
        clients.append(alice)
        alice.send("create room 4")
        joined = alice.until("joined")
        lobby_id, home = joined["lobby_id"], joined["server"]
        state = tmp_path / "bob.state"
        bob = seated_bob(names, state, lobby_id)
        clients.append(bob)
        bob.process.send_signal(signal.SIGKILL)
        bob.process.wait(timeout=10)
        lobbies[home].send_signal(signal.SIGKILL)
        lobbies[home].wait(timeout=10)
        moved = alice.until("rehomed", timeout=30)
        assert moved["lobby_id"] == lobby_id and moved["server"] != home
        again = LineClient(names, "bob", "--state-file", str(state), "--connect-timeout", "1")
        clients.append(again)
        resumed = again.until("resumed", timeout=60)
        assert resumed["lobby"] == lobby_id and resumed["server"] == moved["server"]
        view = alice.state()
        assert "bob" in view["connected"] and "bob" in view["ready"], view
        assert view["attributes"]["bob"] == {"team": "red"}
    finally:
        for client in clients:
            client.stop()
        for process in lobbies.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=30)
