"""The lobby core is pure (DESIGN.md §3): no trio, no clock, no sockets, nothing above it.

Checked on the imports the modules really make (their AST), not on text, so a comment that
mentions trio does not count and an aliased import does.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

LOBBY = Path(__file__).resolve().parents[2] / "echo" / "lobby"
FORBIDDEN_MODULES = {"trio", "socket", "asyncio", "time", "datetime", "random", "threading"}
FORBIDDEN_PREFIXES = ("echo.server", "echo.client", "echo.session", "echo.channels", "echo.topics")


# The pure core; the trio driver that will sit on sessions, channels and topics is not in it.
PURE = [
    "__init__",
    "games",
    "hello",
    "home",
    "limits",
    "listings",
    "protocol",
    "replica",
    "state",
]


# The trio driver, the client library and the CLIs: I/O by design; and
# the sessions' transport timers (built on echo.session's).
DRIVERS = ["cli", "client", "server", "timers"]


def test_every_module_is_classified() -> None:
    assert sorted(p.stem for p in LOBBY.glob("*.py")) == sorted(PURE + DRIVERS)


@pytest.mark.parametrize("path", [LOBBY / f"{name}.py" for name in PURE], ids=lambda p: p.name)
def test_no_io_no_clock_no_upward_imports(path: Path) -> None:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        for name in names:
            assert name.split(".")[0] not in FORBIDDEN_MODULES, (path.name, name)
            assert not name.startswith(FORBIDDEN_PREFIXES), (path.name, name)
