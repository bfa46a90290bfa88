"""ECHO_MEMDEBUG: a real echo-server (and echo-lobby, and echo-topics) dumps its live heap on
SIGUSR1, compared with start-up, and says where in its log."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.ops.test_processes import ECHO_CLIENT, ECHO_SERVER, REPO, TOPICS, running
from tests.ports import free_base


def wait_for(
    path: Path, server: subprocess.Popen[bytes], timeout: float = 60.0
) -> dict[str, object]:
    """The dump, once the server wrote all of it (it writes the file in one call); the server
    must stay alive meanwhile (a SIGUSR1 it does not catch ends it)."""
    deadline = time.monotonic() + timeout
    while True:
        if path.exists():
            try:
                return json.loads(path.read_text())  # type: ignore[no-any-return]
            except json.JSONDecodeError:
                pass  # still being written
        assert server.poll() is None, f"the server exited with {server.returncode}"
        assert time.monotonic() < deadline, f"no {path}"
        time.sleep(0.05)  # another process's file or port: nothing to await


def test_sigusr1_dumps_what_grew_since_start_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dumps = tmp_path / "dumps"
    monkeypatch.setenv("ECHO_MEMDEBUG", str(dumps))
    monkeypatch.setenv("ECHO_MEMDEBUG_FRAMES", "4")
    base = free_base(12)
    ports = ["--port", str(base), "--control-port", str(base + 1)]
    argv = [*ECHO_SERVER, *ports, "--clients-base-port", str(base + 2), "--max-clients", "4"]
    with running(argv, tmp_path / "server.log") as server:
        client = subprocess.run(
            [*ECHO_CLIENT, *ports, "--count", "3"], cwd=REPO, capture_output=True, timeout=60
        )
        assert client.returncode == 0, client.stderr
        server.send_signal(signal.SIGUSR1)
        first = wait_for(dumps / f"memdebug-{server.pid}-1.json", server)
        server.send_signal(signal.SIGUSR1)
        second = wait_for(dumps / f"memdebug-{server.pid}-2.json", server)
    assert first["pid"] == server.pid
    assert isinstance(first["traced_bytes"], int) and first["traced_bytes"] > 0
    grown = dict(first["types_grown"])  # type: ignore[call-overload]
    # The session's images (its HELLO's and its duologue's) linger in the cool-down.
    assert grown.get("echo.transport.core.image.PublicationImage", 0) >= 1, grown
    sites = first["sites_grown"]
    assert isinstance(sites, list) and sites and all(s["traceback"] for s in sites)
    # The logs: the all-clients publication at least is open, mapped as three terms, and
    # holds some pages (its replies); resident never exceeds mapped.
    logs = first["logs"]
    assert isinstance(logs, dict)
    publications = logs["publications"]
    assert publications["open"] >= 1
    assert publications["mapped"] >= 3 * 64 * 1024
    assert 0 < publications["resident"] <= publications["mapped"]
    assert logs["images"]["count"] == sum(logs["image_states"].values()) >= 1
    # glibc's heap (this is Linux with glibc): what it got from the kernel, and uses. pymalloc
    # says nothing while tracemalloc wraps it.
    heap = first["glibc_heap"]
    assert isinstance(heap, dict) and 0 < heap["in_use"] <= heap["heap"] + heap["mmapped"]
    assert first["pymalloc"] == {}
    # The second dump compares with the first: nothing happened in between.
    assert "echo.transport.core.image.PublicationImage" not in dict(second["types_grown"])  # type: ignore[call-overload]


def test_echo_lobby_dumps_on_sigusr1_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe is how the soak's lobby servers' growth was found (one rate bucket kept per
    member ever rate-checked): on SIGUSR1 a real echo-lobby writes the dump, and a member who
    came and went shows as the images of its session in their cool-down."""
    from tests.lobby.test_cli import CLIENT, run, start_lobby

    dumps = tmp_path / "dumps"
    monkeypatch.setenv("ECHO_MEMDEBUG", str(dumps))
    monkeypatch.setenv("ECHO_MEMDEBUG_FRAMES", "0")  # type counts only
    lobby, port = start_lobby(tmp_path / "lobby.log")
    try:
        member = run(
            [*CLIENT, "--servers", f"127.0.0.1:{port}", "--member", "alice"],
            stdin="create room\nleave\n",
        )
        assert member.returncode == 0, member.stderr
        lobby.send_signal(signal.SIGUSR1)
        first = wait_for(dumps / f"memdebug-{lobby.pid}-1.json", lobby)
    finally:
        lobby.send_signal(signal.SIGTERM)
        assert lobby.wait(timeout=30) == 0
    assert first["pid"] == lobby.pid and first["traced_bytes"] is None
    written = _logged(tmp_path / "lobby.log", "memdebug_written")
    assert written == [str(dumps / f"memdebug-{lobby.pid}-1.json")]
    grown = dict(first["types_grown"])  # type: ignore[call-overload]
    assert grown.get("echo.transport.core.image.PublicationImage", 0) >= 1, grown
    # Without tracemalloc, pymalloc's arenas (1 MiB each) and the bytes of their blocks.
    pymalloc = first["pymalloc"]
    assert isinstance(pymalloc, dict)
    assert 0 < pymalloc["arenas"] <= pymalloc["arenas_highwater"]
    assert 0 < pymalloc["allocated_bytes"] <= pymalloc["arenas"] * 1024 * 1024


def _logged(log: Path, event: str) -> list[str]:
    """The `path` of every JSON log line of `event`."""
    lines = [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]
    return [x["path"] for x in lines if x.get("event") == event]


def test_echo_topics_dumps_on_sigusr1_instead_of_dying(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGUSR1's default action ends a process: a topics server that had no probe died when
    the soak's operator signalled every server. Now it dumps like the others and goes on."""
    dumps = tmp_path / "dumps"
    monkeypatch.setenv("ECHO_MEMDEBUG", str(dumps))
    monkeypatch.setenv("ECHO_MEMDEBUG_FRAMES", "2")
    log = tmp_path / "topics.log"
    with running([*TOPICS, "--port", str(free_base(1))], log) as topics:
        for n in (1, 2):
            topics.send_signal(signal.SIGUSR1)
            dump = wait_for(dumps / f"memdebug-{topics.pid}-{n}.json", topics)
            assert dump["pid"] == topics.pid and isinstance(dump["traced_bytes"], int)
        assert topics.poll() is None  # alive after both signals (and exits 0 at SIGTERM)
    assert _logged(log, "memdebug_written") == [
        str(dumps / f"memdebug-{topics.pid}-{n}.json") for n in (1, 2)
    ]
