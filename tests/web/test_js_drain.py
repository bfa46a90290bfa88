"""The JavaScript client follows its lobby out of a draining server: two real echo-lobby
processes on one ring, each with a WebSocket door and the ring's door URLs (--lobby-ws-urls);
clients/js/test-ring under Node's test runner drains the first (POST /drain) and checks that
its members land on the second with their lobby, their seats and every chat line."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from echo.tickets import new_key_text
from tests.ports import free_base
from tests.web.servers import CLIENTS_JS, LOBBY, REPO, _accepting, node, stop
from tests.web.test_js_client import SIDES, counts

SPAN = 40  # one server's ports: --port, --control-port, the duologues of --max-clients 16


@contextmanager
def ring_of_two(tmp_path: Path) -> Iterator[list[dict[str, Any]]]:
    """Two echo-lobby processes on one ring, each with --ws-port, --metrics and the ring's
    door URLs; a port taken between the probe and the bind means another try."""
    seat_key = tmp_path / "seat.key"
    seat_key.write_text(new_key_text(1))
    seat_key.chmod(0o600)
    for attempt in range(5):
        base = free_base(2 * SPAN + 4)
        servers = [
            {"port": base + SPAN * i, "ws": base + 2 * SPAN + i, "metrics": base + 2 * SPAN + 2 + i}
            for i in range(2)
        ]
        ring = ",".join(f"127.0.0.1:{s['port']}" for s in servers)
        urls = ",".join(f"ws://127.0.0.1:{s['ws']}" for s in servers)
        with ExitStack() as stack:
            for i, server in enumerate(servers):
                server["log"] = log = tmp_path / f"lobby-{attempt}-{i}.log"
                out = stack.enter_context(log.open("wb"))
                server["process"] = subprocess.Popen(
                    [*LOBBY, "--port", str(server["port"]), "--max-clients", "16",
                     "--ws-port", str(server["ws"]), "--metrics", f"127.0.0.1:{server['metrics']}",
                     "--lobby-servers", ring, "--lobby-ws-urls", urls, "--seat-key", str(seat_key),
                     "--log-format", "json"],
                    cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                )  # fmt: skip
        try:
            if all(_listening(server) for server in servers):
                yield servers
                return
        finally:
            for server in servers:
                stop(server["process"], "echo-lobby")
    raise AssertionError("no free ports for two echo-lobby")


def _listening(server: dict[str, Any]) -> bool:
    deadline = time.monotonic() + 60
    log: Path = server["log"]
    while not ('"listening"' in log.read_text() and _accepting(server["ws"])):
        if server["process"].poll() is not None and "in use" in log.read_text():
            return False
        assert server["process"].poll() is None, log.read_text()
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)  # another process's log and port: nothing to await
    return True


def test_the_javascript_client_follows_its_lobby_out_of_a_draining_server(tmp_path: Path) -> None:
    trace = tmp_path / "messages.jsonl"
    with ring_of_two(tmp_path) as servers:
        ring = [
            {"ws": f"ws://127.0.0.1:{s['ws']}", "metrics": f"http://127.0.0.1:{s['metrics']}"}
            for s in servers
        ]
        env = dict(os.environ, ECHO_LOBBY_RING=json.dumps(ring), ECHO_WS_TRACE=str(trace))
        done = subprocess.run(
            [node(), "--test", "--test-reporter=tap", "test-ring/"],
            cwd=CLIENTS_JS, env=env, capture_output=True, text=True, timeout=240, check=False,
        )  # fmt: skip
        drained = servers[0]["process"]
        assert drained.wait(timeout=30) == 0, servers[0]["log"].read_text()[-3000:]
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    found = counts(done.stdout)
    assert found.get("pass") == 1 and found.get("fail") == 0, done.stdout[-4000:]
    assert found.get("skipped", 0) == 0, done.stdout[-4000:]
    # the drained server told its two WebSocket members where to go
    events = [json.loads(line) for line in servers[0]["log"].read_text().splitlines()]
    drained_event = next(e for e in events if e.get("event") == "lobby_drained")
    assert drained_event["ws_members_moved"] == 2 and drained_event["lobbies"] == 1
    # every message each way is one of the protocol's, `moved` and the re-creation included
    kinds: set[tuple[str, str]] = set()
    for line in trace.read_text().splitlines():
        seen = json.loads(line)
        side = "client_message" if seen["direction"] == "out" else "server_message"
        SIDES[side].validate(seen["message"])
        kinds.add((seen["direction"], seen["message"]["type"]))
    assert ("in", "moved") in kinds
    assert ("out", "recreate_lobby") in kinds
