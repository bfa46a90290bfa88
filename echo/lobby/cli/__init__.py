"""`echo-lobby` (the server), `echo-lobby-client` (a line-oriented member) and
`echo-lobby-announce` (a game server's announcements on the games topic).

The package's modules, by concern: `options` (server lists, key files, identities, ports),
`server` (`echo-lobby`), `client` (`echo-lobby-client`) with its `commands` and its `output`,
and `announce` (`echo-lobby-announce`). ``python -m echo.lobby.cli server|client|announce``
runs one of them (`__main__`).
"""

from __future__ import annotations

from echo.lobby.cli.announce import ANNOUNCE_EPILOG as ANNOUNCE_EPILOG
from echo.lobby.cli.announce import announce_main as announce_main
from echo.lobby.cli.client import CLIENT_EPILOG as CLIENT_EPILOG
from echo.lobby.cli.client import STATE_FILE_HELP as STATE_FILE_HELP
from echo.lobby.cli.client import client_main as client_main
from echo.lobby.cli.options import DEFAULT_PORT as DEFAULT_PORT
from echo.lobby.cli.server import COLLECTOR_THRESHOLDS as COLLECTOR_THRESHOLDS
from echo.lobby.cli.server import SERVER_EPILOG as SERVER_EPILOG
from echo.lobby.cli.server import server_main as server_main
from echo.lobby.cli.server import tune_collector as tune_collector

__all__ = [
    "ANNOUNCE_EPILOG",
    "CLIENT_EPILOG",
    "COLLECTOR_THRESHOLDS",
    "DEFAULT_PORT",
    "SERVER_EPILOG",
    "STATE_FILE_HELP",
    "announce_main",
    "client_main",
    "server_main",
    "tune_collector",
]
