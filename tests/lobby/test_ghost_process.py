"""No ghost lobbies, with real processes: the only member of a lobby is killed with SIGKILL (it
says nothing more), and the lobby leaves another player's search and quick-join within the
liveness bound (2.5 s), though its seat is still kept for the grace period."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

import echo.lobby
from echo.lobby.client import LobbyError
from echo.lobby.protocol import ErrorCode, StringEquals
from echo.lobby.timers import MEMBER_LIVENESS
from tests.ports import free_base

REPO = Path(__file__).resolve().parents[2]

#: a lobby server on ports BASE..BASE+17 of 127.0.0.1, searches not rate-limited (the test
#: looks every 50 ms); prints "ready" once it listens
LOBBY_SERVER = """
import sys, trio, echo.session as es
from echo.lobby.limits import LobbyConfig, RateLimit
from echo.lobby.server import LobbyServer, LobbyServerConfig

async def main(base):
    sessions = es.ServerConfig(
        address="127.0.0.1", port=base, control_port=base + 1, clients_base_port=base + 2,
        max_clients=8, max_per_ip=8,
    )
    fast = RateLimit(rate=100.0, burst=100)
    lobby = LobbyConfig(indexed_keys=frozenset({"mode"}), search_limit=fast)
    server = LobbyServer(sessions, LobbyServerConfig(lobby=lobby))
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        print("ready", flush=True)

trio.run(main, int(sys.argv[1]))
"""

#: a player that creates a lobby, prints its id and waits (until it is killed)
PLAYER = """
import sys, trio, echo.lobby

async def main(server):
    async with echo.lobby.connect([server], member="doomed") as lobby:
        print(await lobby.create("haunted", 4, metadata={"mode": "ghost"}), flush=True)
        await trio.sleep_forever()

trio.run(main, sys.argv[1])
"""


def _start(script: str, arg: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", script, arg],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def _first_line(process: subprocess.Popen[str], want: str | None = None) -> str:
    assert process.stdout is not None
    for line in process.stdout:
        if want is None or line.strip() == want:
            return line.strip()
    raise AssertionError(f"the process ended (status {process.wait()}) before saying it")


@pytest.mark.timeout(120)
def test_a_killed_player_s_lobby_leaves_search_within_the_liveness_bound() -> None:
    base = free_base(18)
    server = _start(LOBBY_SERVER, str(base))
    player: subprocess.Popen[str] | None = None
    try:
        _first_line(server, "ready")
        address = f"127.0.0.1:{base}"
        player = _start(PLAYER, address)
        lobby_id = int(_first_line(player))
        took = trio.run(_gone_after_kill, address, player, lobby_id)
    finally:
        for process in (player, server):
            if process is not None:
                process.kill()
                process.wait()
    print(f"ghost lobby left search {took:.3f} s after the kill")
    assert took <= MEMBER_LIVENESS + 0.5  # the bound, and a loaded machine's scheduling


async def _gone_after_kill(address: str, player: subprocess.Popen[str], lobby_id: int) -> float:
    ghost = (StringEquals("mode", "ghost"),)
    with trio.fail_after(60):
        async with echo.lobby.connect([address], member="seeker") as seeker:
            assert [x.lobby_id for x in await seeker.search_all(ghost)] == [lobby_id]
            os.kill(player.pid, signal.SIGKILL)
            killed = time.monotonic()
            await trio.to_thread.run_sync(player.wait)
            while await seeker.search_all(ghost):  # noqa: ASYNC110 (what another player sees)
                await trio.sleep(0.05)
            took = time.monotonic() - killed
            # Quick-join does not seat the seeker alone in it either.
            with pytest.raises(LobbyError) as caught:
                await seeker.quick_join(ghost)
            assert caught.value.code is ErrorCode.NO_MATCH
            # The seat is still kept (the grace period): joined by its id, the lobby is there.
            assert await seeker.join(lobby_id) == lobby_id
            assert seeker.replica is not None and "doomed" in seeker.replica.members
            # A member is connected again: it is found again.
            assert [x.lobby_id for x in await seeker.search_all(ghost)] == [lobby_id]
    return took
