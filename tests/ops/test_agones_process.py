"""echo-server --agones as a process against a stand-in for the SDK sidecar (tests/ops/
agones_sidecar.py: the real sidecar needs a cluster), found through $AGONES_SDK_HTTP_PORT as
Agones sets it: the calls it makes, in order, as a real echo-client comes and goes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import trio

from tests.ops.agones_sidecar import Sidecar
from tests.ops.scrape import free_tcp_port
from tests.ops.test_processes import ECHO_CLIENT, ECHO_SERVER, REPO
from tests.ports import free_base


def server_argv(base: int, *extra: str) -> list[str]:
    ports = ["--port", str(base), "--control-port", str(base + 1)]
    return [*ECHO_SERVER, *ports, "--clients-base-port", str(base + 2), "--agones",
            "--log-format", "json", *extra]  # fmt: skip


async def start(argv: list[str], log: Path, sidecar_port: int) -> trio.Process:
    env = {**os.environ, "AGONES_SDK_HTTP_PORT": str(sidecar_port)}
    with log.open("wb") as out:
        return await trio.lowlevel.open_process(
            argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT
        )


async def client(base: int, *args: str) -> trio.Process:
    ports = ["--port", str(base), "--control-port", str(base + 1)]
    return await trio.lowlevel.open_process(
        [*ECHO_CLIENT, *ports, *args], cwd=REPO,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def events(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


def health_pings_after(sidecar: Sidecar, name: str) -> int:
    names = sidecar.names()
    return names[names.index(name) :].count("health") if name in names else 0


def without_health(sidecar: Sidecar) -> list[str]:
    # (GET /gameserver and the watch, opened at start, too: the order of the rest is what
    # is asserted)
    return [n for n in sidecar.names() if n not in ("health", "gameserver", "watch")]


async def test_a_game_ready_allocated_played_and_over(tmp_path: Path) -> None:
    """Ready, Health on the period the GameServer gives, the watch sees an allocation made
    elsewhere (a matchmaker's), the client's session is a player that connects and
    disconnects, and its end is the game's: /shutdown, and the server exits 0 by itself."""
    sidecar = Sidecar(health_period=1)
    base = free_base(12)
    log = tmp_path / "server.log"
    async with trio.open_nursery() as nursery:
        port = await nursery.start(sidecar.serve)
        server = await start(server_argv(base), log, port)
        with trio.fail_after(60):
            await sidecar.wait_for(lambda s: health_pings_after(s, "ready") >= 3)
            await sidecar.wait_for(lambda s: "watch" in s.names())
            sidecar.allocate_externally()
            # Allocated seen on the watch: the first player calls no /allocate.
            await sidecar.wait_for(lambda s: any(e.get("event") == "agones_state"
                                                 and e.get("state") == "Allocated"
                                                 for e in events(log)))  # fmt: skip
            echo = await client(base, "--count", "5", "--interval", "0.05")
            await sidecar.wait_for(lambda s: "connect" in s.names())
            player = sidecar.calls[sidecar.names().index("connect")].body["playerID"]
            assert sidecar.players == [player] and player.startswith("session-")
            assert await echo.wait() == 0
            assert await server.wait() == 0, log.read_text()
        nursery.cancel_scope.cancel()
    assert without_health(sidecar) == ["ready", "connect", "disconnect", "shutdown"]
    assert sidecar.names().count("gameserver") == 1 and "watch" in sidecar.names()
    disconnect = sidecar.calls[sidecar.names().index("disconnect")]
    assert disconnect.body == {"playerID": player} and sidecar.players == []
    assert sidecar.state == "Shutdown"
    names = [e.get("event") for e in events(log)]
    assert "agones_ready" in names and "shutting_down" in names


async def test_sigterm_drains_then_shuts_down(tmp_path: Path) -> None:
    """A client on a Ready server: its session allocates the server (/allocate before the
    player connects); SIGTERM drains for the bound, the client is told the server goes, its
    disconnect reaches the sidecar, then /shutdown, then exit 0."""
    sidecar = Sidecar(health_period=1)
    base = free_base(12)
    log = tmp_path / "server.log"
    async with trio.open_nursery() as nursery:
        port = await nursery.start(sidecar.serve)
        server = await start(server_argv(base, "--drain-timeout", "1"), log, port)
        with trio.fail_after(60):
            await sidecar.wait_for(lambda s: s.state == "Ready")
            echo = await client(base, "--interval", "0.05")
            await sidecar.wait_for(lambda s: "connect" in s.names())
            assert sidecar.state == "Allocated"
            server.send_signal(signal.SIGTERM)
            assert await server.wait() == 0, log.read_text()
            assert await echo.wait() == 4  # told: server shutting down
        nursery.cancel_scope.cancel()
    rest = without_health(sidecar)
    assert rest == ["ready", "allocate", "connect", "disconnect", "shutdown"]
    assert sidecar.players == [] and sidecar.state == "Shutdown"
    names = [e.get("event") for e in events(log)]
    assert names.index("drain_timed_out") < names.index("agones_player_disconnect")
    assert names.index("agones_player_disconnect") < names.index("agones_shutdown")


async def test_a_sidecar_that_starts_late_is_waited_for(tmp_path: Path) -> None:
    """The game server starts first (as Agones' REST page warns it may): it serves at once,
    logs the sidecar as unreachable once and retries. A whole game is played meanwhile; once
    the sidecar listens it hears, in order: /ready, /allocate (the game had a player), and
    /shutdown (the game is over); the player who came and went before it answered is never
    announced, so its player list ends as it should, empty. Then the server exits 0."""
    port = free_tcp_port()
    base = free_base(12)
    log = tmp_path / "server.log"
    sidecar = Sidecar(health_period=1)
    server = await start(server_argv(base), log, port)
    try:
        with trio.fail_after(60):
            # (another process's log file: nothing to await but its content)
            while "agones_sidecar_unreachable" not in log.read_text():  # noqa: ASYNC110
                await trio.sleep(0.05)
            echo = await client(base, "--count", "3", "--interval", "0.05")
            assert await echo.wait() == 0
            assert server.poll() is None
            async with trio.open_nursery() as nursery:
                await nursery.start(sidecar.serve, port)
                assert await server.wait() == 0, log.read_text()
                nursery.cancel_scope.cancel()
    finally:
        if server.poll() is None:
            server.kill()
    assert without_health(sidecar) == ["ready", "allocate",
                                                                    "shutdown"]  # fmt: skip
    assert sidecar.players == [] and sidecar.state == "Shutdown"
    names = [e.get("event") for e in events(log)]
    assert names.count("agones_sidecar_unreachable") == 1
    assert names.index("agones_sidecar_unreachable") < names.index("agones_sidecar_answers")


async def test_a_bad_sidecar_port_is_a_bad_command_line(tmp_path: Path) -> None:
    env = {**os.environ, "AGONES_SDK_HTTP_PORT": "not-a-port"}
    result = await trio.run_process(
        [*ECHO_SERVER, "--agones"], cwd=REPO, env=env, capture_stdout=True,
        capture_stderr=True, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert b"AGONES_SDK_HTTP_PORT='not-a-port' is not a port number" in result.stderr
