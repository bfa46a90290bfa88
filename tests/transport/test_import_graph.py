"""The transport's import graph, read from the modules' AST (as tests/test_purity.py reads it):
no cycles, counting every import, those under ``if TYPE_CHECKING:`` too (a cycle kept only for
the type checker is still two modules that cannot be read, or moved, one without the other);
and the seam one way: the pure core (`echo.transport.core`) imports nothing of the driver
(`echo.transport.driver`), of the api or of trio, not even for type checking."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "echo" / "transport"
ROOT = PACKAGE.parents[1]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported_modules(path: Path) -> set[str]:
    """The modules of echo.transport that `path` imports, by full name: `from
    echo.transport.core import frames` is echo.transport.core.frames, `from echo.transport
    import Image` is the package echo.transport (its __init__)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            candidates = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names
            ]
        else:
            continue
        # (The packages on the way to a module are not counted: their __init__ has begun
        # before any module inside runs, so importing from within is never a cycle with them.)
        found |= {c for c in candidates if c in MODULES and c != name}
    return found


GRAPH = {name: imported_modules(path) for name, path in MODULES.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` (its modules in order, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_transport_has_no_import_cycle() -> None:
    assert find_cycle(GRAPH) is None


def test_the_cycle_finder_finds_a_cycle_and_only_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"a"}}) == ["a", "a"]


def test_the_reader_sees_type_checking_and_package_imports() -> None:
    # A TYPE_CHECKING import counts here; `from package import module` names the module.
    assert "echo.transport.core.frames" in GRAPH["echo.transport.core.logbuffer"]
    assert "echo.transport.api" in GRAPH["echo.transport"]
    assert "echo.transport.driver.loop" in GRAPH["echo.transport.api"]


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith("echo.transport.core")))
def test_the_core_imports_only_the_core(name: str) -> None:
    outside = {n for n in GRAPH[name] if not n.startswith("echo.transport.core")}
    assert outside == set(), f"{name} imports {sorted(outside)}"
    tree = ast.parse(MODULES[name].read_text())
    roots = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        (node.module or "").split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and not node.level
    }
    assert not roots & {"trio", "socket", "time", "select", "asyncio"}, name


def _driver_members_used(path: Path) -> set[str]:
    """Every `driver.X` and `self._driver.X` that `path` reads."""
    used: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Attribute):
            continue
        owner = node.value
        if (isinstance(owner, ast.Name) and owner.id == "driver") or (
            isinstance(owner, ast.Attribute)
            and owner.attr == "_driver"
            and isinstance(owner.value, ast.Name)
            and owner.value.id == "self"
        ):
            used.add(node.attr)
    return used


def test_a_channel_asks_the_driver_only_what_its_protocol_declares() -> None:
    # The channels reach the driver through ChannelDriver alone: no `service`, no socket
    # reading or lending internals (lending is one call, `wait_lent`).
    from echo.transport.driver.channels import ChannelDriver

    declared = {
        name for name in dir(ChannelDriver) if not name.startswith("_")
    } | set(ChannelDriver.__annotations__)
    used = _driver_members_used(PACKAGE / "driver" / "channels.py")
    assert used, "the reader found no use of the driver at all"
    assert used <= declared, sorted(used - declared)
    assert "service" not in declared
    assert {"wait_lent", "consumed"} <= used
