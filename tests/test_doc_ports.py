"""The by-hand walk-throughs in the docs start several servers on one host: no server's port
may fall inside the UDP ports another one binds at start (a lobby server binds two per member
of its default --max-clients; the getting-started page once put echo-topics and echo-server
inside echo-lobby's range, and its third command failed with "Address already in use")."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from echo.lobby.cli import server_main as lobby_main
from echo.server.cli import main as server_main

DOCS = Path(__file__).resolve().parent.parent / "docs"
BLOCK = re.compile(r"```[a-z]*\n(.*?)```", re.DOTALL)
#: a server started in the background (`&`): the ones a walk-through runs side by side
SERVER = re.compile(r"^\$? ?(echo-lobby|echo-server|echo-topics)\b(.*)&\s*$", re.MULTILINE)


def _default(command: object, name: str) -> int:
    for param in command.params:  # type: ignore[attr-defined]
        if param.name == name:
            return int(param.default)
    raise AssertionError(name)


def _option(args: str, name: str) -> int | None:
    found = re.search(rf"--{name}[ =](\d+)", args)
    return int(found[1]) if found else None


def _ranges(block: str) -> list[tuple[int, str, range]]:
    """Each server of the block (its index, its tool) and the UDP ports it binds at start."""
    out = []
    for index, (tool, args) in enumerate(SERVER.findall(block)):
        port = _option(args, "port")
        if port is None:
            continue
        if tool == "echo-topics":
            out.append((index, tool, range(port, port + 1)))
            continue
        command = lobby_main if tool == "echo-lobby" else server_main
        clients = _option(args, "max-clients") or _default(command, "max_clients")
        base = _option(args, "clients-base-port") or port + 2
        out.append((index, tool, range(port, port + 2)))
        out.append((index, tool, range(base, base + 2 * clients)))
    return out


BLOCKS = [
    pytest.param(block, id=f"{page.name}:{n}")
    for page in sorted(DOCS.glob("*.md"))
    for n, block in enumerate(BLOCK.findall(page.read_text()))
    if len(SERVER.findall(block)) >= 2
]


@pytest.mark.parametrize("block", BLOCKS)
def test_servers_of_one_walk_through_bind_disjoint_ports(block: str) -> None:
    ranges = _ranges(block)
    for i, (a, tool_a, ra) in enumerate(ranges):
        for b, tool_b, rb in ranges[i + 1 :]:
            overlap = set(ra) & set(rb)
            assert a == b or not overlap, f"{tool_a} {ra} and {tool_b} {rb} share {min(overlap)}"


def test_the_walk_throughs_are_found() -> None:
    assert len(BLOCKS) >= 3
