"""The session library's hook, as docs/operations.md shows it: any `SessionServer` game with
`events=agones.session_events(inner)` reports its sessions as players to the sidecar (the
stand-in of tests/ops/agones_sidecar.py), its own event sink still gets every event, and the
game is over once its last player left."""

from __future__ import annotations

from typing import Any

import trio

import echo.session as es
from echo.ops.agones import Agones
from echo.ops.agones_driver import AgonesClient
from tests.ops.agones_sidecar import Sidecar
from tests.server.test_server import free_base, server_config


class Recorder:
    def __init__(self) -> None:
        self.events: list[str] = []

    def emit(self, event: str, **fields: Any) -> None:
        self.events.append(event)


async def test_a_session_library_game_reports_its_players_and_ends_its_game() -> None:
    async def app(session: es.Session) -> None:
        async for data in session:
            await session.send(data.upper())

    sidecar = Sidecar(health_period=1)
    inner = Recorder()
    config = server_config(free_base(12))
    async with trio.open_nursery() as nursery:
        port = await nursery.start(sidecar.serve)
        agones = AgonesClient(port, Agones(), host="127.0.0.1")
        server = es.SessionServer(config, app, events=agones.session_events(
            inner, player_id=lambda fields: f"player-{fields['duologue_id']}"))  # fmt: skip
        nursery.start_soon(agones.run)
        await nursery.start(server.run)
        agones.listening()
        with trio.fail_after(30):
            await sidecar.wait_for(lambda s: s.state == "Ready")
            async with es.connect(config.address, config.port, config.control_port) as s:
                await s.send(b"one")
                assert await s.receive() == b"ONE"
                await sidecar.wait_for(lambda s: len(s.players) == 1)
                (player,) = sidecar.players
                assert player.startswith("player-")
            # The game ended with its one player: Shutdown, the game is over.
            await agones.game_over.wait()
            await sidecar.wait_for(lambda s: s.state == "Shutdown")
            # The server still serves (stopping is the game's choice); nothing more is said.
            async with es.connect(config.address, config.port, config.control_port) as s:
                await s.send(b"two")
                assert await s.receive() == b"TWO"
            assert agones.machine.idle
        await server.stop()
        nursery.cancel_scope.cancel()
    calls = [n for n in sidecar.names() if n not in ("health", "gameserver", "watch")]
    # After the shutdown nothing more is said: the second session is not announced.
    assert calls == ["ready", "allocate", "connect", "disconnect", "shutdown"]
    assert "duologue_connected" in inner.events and "duologue_closed" in inner.events
    assert agones.calls[-1][0] == "shutdown"
