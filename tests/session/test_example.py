"""examples/game_server.py runs: a room on a session server, two bots moving in it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import trio

import echo.session as es
from tests.server.test_server import free_base, server_config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "game_server.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("game_server_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


async def test_the_game_server_example_serves_two_bots() -> None:
    game = load_example()
    config = server_config(free_base(12))
    room = game.Room()
    results: dict[str, list[bytes]] = {}

    async def play(name: str) -> None:
        results[name] = await game.bot(name, config.address, config.port, config.control_port)

    async with trio.open_nursery() as nursery:
        server = await nursery.start(es.SessionServer(config, room).run)
        async with trio.open_nursery() as bots:
            bots.start_soon(play, "alice")
            bots.start_soon(play, "bob")
        assert set(results) == {"alice", "bob"}
        for seen in results.values():
            assert seen[0].startswith(b"WELCOME ")
            me = int(seen[0].split()[1])
            own = [m for m in seen if m.startswith(b"AT %d " % me)]
            assert len(own) == 5
        # Each saw the other's moves too (they played at the same time).
        alice_id = int(results["alice"][0].split()[1])
        assert any(m.startswith(b"AT %d " % alice_id) for m in results["bob"])
        with trio.fail_after(10):
            while room.players or server.duologues:  # noqa: ASYNC110 (no event for it)
                await trio.sleep(0.01)
        await server.stop()


async def test_a_bad_command_gets_the_room_s_reason() -> None:
    game = load_example()
    config = server_config(free_base(12))
    async with trio.open_nursery() as nursery:
        server = await nursery.start(es.SessionServer(config, game.Room()).run)
        async with es.connect(config.address, config.port, config.control_port) as session:
            assert (await session.receive()).startswith(b"WELCOME")
            await session.send(b"JUMP")
            try:
                await session.receive()
            except es.SessionClosed as closed:
                assert closed.reason == "expected MOVE <x> <y>"
            else:
                raise AssertionError("the room did not close the session")
        await server.stop()
