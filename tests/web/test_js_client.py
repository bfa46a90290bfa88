"""The JavaScript client (clients/js) under Node's own test runner against a real echo-lobby
--ws-port process: every test file of clients/js/test, each lobby call and event over the
door's JSON protocol, resume with the token after a dropped WebSocket."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections import Counter
from pathlib import Path

import jsonschema

from echo.lobby.web import jsonwire
from tests.web.servers import CLIENTS_JS, lobby_server, node

SCHEMA = json.loads(Path(jsonwire.__file__).with_name("schema.json").read_text())
SIDES = {
    side: jsonschema.Draft202012Validator({"$ref": f"#/$defs/{side}", "$defs": SCHEMA["$defs"]})
    for side in ("client_message", "server_message")
}


def run_node_tests(env_url: str | None, trace: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, ECHO_WS_TRACE=str(trace))
    env.pop("ECHO_LOBBY_WS", None)
    if env_url is not None:
        env["ECHO_LOBBY_WS"] = env_url
    return subprocess.run(
        [node(), "--test", "--test-reporter=tap", "test/"],
        cwd=CLIENTS_JS, env=env, capture_output=True, text=True, timeout=240, check=False,
    )


def counts(tap: str) -> dict[str, int]:
    found = re.findall(r"^# (tests|pass|fail|skipped|cancelled) (\d+)$", tap, re.M)
    return {k: int(v) for k, v in found}


def test_the_javascript_client_against_a_real_lobby_server(tmp_path: Path) -> None:
    trace = tmp_path / "messages.jsonl"
    with lobby_server(tmp_path / "lobby.log", "--reconnect-grace", "20") as lobby:
        done = run_node_tests(lobby.ws_url, trace)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    found = counts(done.stdout)
    # every test ran and passed: none skipped for want of the server (only the check of the
    # missing WebSocket constructor is skipped where Node has one of its own, from Node 22)
    assert found.get("fail") == 0 and found.get("cancelled") == 0, done.stdout[-4000:]
    assert found.get("skipped", 0) <= 1 and found.get("pass", 0) >= 12, done.stdout[-4000:]
    assert found["pass"] + found.get("skipped", 0) == found["tests"], done.stdout[-4000:]
    assert "ok" in done.stdout and "chat both ways" in done.stdout
    # every message the client sent and received is one of the protocol's (its JSON Schema)
    kinds: Counter[tuple[str, str]] = Counter()
    for line in trace.read_text().splitlines():
        seen = json.loads(line)
        side = "client_message" if seen["direction"] == "out" else "server_message"
        SIDES[side].validate(seen["message"])
        kinds[seen["direction"], seen["message"]["type"]] += 1
    sent = {kind for direction, kind in kinds if direction == "out"}
    assert jsonwire.REQUEST_TYPES - sent == {"recreate_lobby"}, "every lobby call was made"
    assert {"welcome", "lobby_snapshot", "chat_line", "owner_changed", "refusal",
            "resume_token", "presence_changed"} <= {k for d, k in kinds if d == "in"}
