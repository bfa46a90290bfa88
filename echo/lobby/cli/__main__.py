"""``python -m echo.lobby.cli server|client|announce``: one of the lobby's command lines."""

from __future__ import annotations

import sys

from echo.lobby.cli.announce import announce_main
from echo.lobby.cli.client import client_main
from echo.lobby.cli.server import server_main

if __name__ == "__main__":  # pragma: no cover - `python -m echo.lobby.cli server|client|announce`
    {"server": server_main, "client": client_main, "announce": announce_main}[sys.argv.pop(1)]()
