"""echo-analyze on the log a real lobby server wrote (EventLog, as `echo-lobby --events` does).

The generator's lobby lines imitate echo-lobby; this checks the imitation against the real
thing: a lobby server and its members on loopback, then the Spark job (real local Spark).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

import echo.lobby
from echo.lobby.client import LobbyError
from echo.lobby.protocol import ErrorCode
from echo.lobby.server import LobbyServer, LobbyServerConfig
from echo.telemetry.events import EventLog
from tests.lobby.servers import LOBBY, SEAT_KEY, name_of, session_config

pytestmark = pytest.mark.spark


async def test_a_real_lobby_servers_log_is_reported_exactly(spark: Any, tmp_path: Path) -> None:
    from echo.telemetry.pipeline import run_analysis

    log = tmp_path / "lobby-events.jsonl"
    config = session_config()
    name = name_of(config)
    events = EventLog(log, server_id="lobby-a")
    server = LobbyServer(
        config,
        LobbyServerConfig(lobby=LOBBY, lobby_servers=(name,), seat_keys=(SEAT_KEY,)),
        events=events,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        async with (
            echo.lobby.connect([name], member="ann") as ann,
            echo.lobby.connect([name], member="bob") as bob,
            echo.lobby.connect([name], member="cat") as cat,
        ):
            lobby_id = await ann.create("duel", 2)
            await bob.join(lobby_id)  # full: time to fill ends here
            with pytest.raises(LobbyError) as refused:
                await cat.join(lobby_id)
            assert refused.value.code is ErrorCode.LOBBY_FULL
            await ann.chat("hello")
            await bob.chat("hi there")
            await bob.leave()
            await ann.leave()
        await server.stop(reason="test over")
        nursery.cancel_scope.cancel()
    events.close()

    s = run_analysis([str(log)], str(tmp_path / "out"), spark=spark)
    assert (s["bad_lines"], s["unknown_events"]) == (0, 0)
    lob = s["lobbies"]
    fill = lob["time_to_fill_s"]
    assert {k: v for k, v in lob.items() if k != "time_to_fill_s"} | {
        "time_to_fill_s": {"count": fill["count"], "never": fill["never"]}
    } == {
        "servers": ["lobby-a"],
        "created": 1,
        "rehomed": 0,
        "joins": 2,
        "started": 0,
        "left": {"left": 2},
        "deleted": {"empty": 1},
        "sizes": {"capacity": {"2": 1}, "peak": {"2": 1}, "at_start": {}},
        "time_to_fill_s": {"count": 1, "never": 0},
        "time_to_start_s": lob["time_to_start_s"],
        "chat": {"lines": 2, "bytes": 13, "lobbies_with_chat": 1, "bytes_per_line": 6.5},
        "refusals": {"total": 1, "by_code": {"LOBBY_FULL": 1}, "by_request": {"JoinLobby": 1}},
        "resumed": 0,
        "matched": {"matches": 0, "members": 0, "tickets": 0, "started": 0},
    }
    assert lob["time_to_start_s"]["count"] == 0
    assert 0 <= fill["p50"] == fill["p99"] < 10  # seconds from create to bob's join
    assert s["servers"] == ["lobby-a"]
