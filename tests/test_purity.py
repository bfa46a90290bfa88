"""The shape of the package, checked on the imports the modules really make (their AST), not
on text: a comment that mentions trio does not count, an aliased import or one inside a
function does. Imports under ``if TYPE_CHECKING:`` never run and are not counted as I/O.

1. Every pure core is pure: no trio or asyncio, no sockets, no clock, no threads or
   processes; what it imports from echo is another pure core, by its module (a package's
   ``__init__`` re-exports its drivers). Its trio driver reads the clock, passes ``now`` in and
   does the I/O (docs/architecture.md).
2. Layers import downward only: transport <- session <- channels <- topics, lobby; the
   tickets beside the session; the servers, the clients and telemetry on top. `echo.transport`
   imports nothing of echo but itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ECHO = Path(__file__).resolve().parents[1] / "echo"

# I/O, concurrency and the clock. (`secrets` and `os.urandom` are allowed: the entropy of an
# identifier or a key, which a test replaces through the module's parameters.)
FORBIDDEN = {
    "trio", "asyncio", "socket", "select", "selectors", "ssl", "threading", "multiprocessing",
    "subprocess", "signal", "time", "datetime", "random",
}  # fmt: skip

# A seeded `random.Random` is passed in; these modules name the type, and the first two, the
# topics client's core and the lobby client's `shuffled` make an unseeded one when none is (the
# driver passes its own).
ALLOWED: dict[str, set[str]] = {
    "echo.transport.core.image": {"random"},
    "echo.transport.core.receiver": {"random"},
    "echo.transport.core.loss": {"random"},
    "echo.topics.ring": {"random"},
    "echo.topics.client_core": {"random"},
    "echo.lobby.client.helpers": {"random"},
}

# Per package: its pure cores, and its drivers (I/O by design), every module in one of them.
PURE: dict[str, list[str]] = {
    "echo": ["__init__", "codec", "protocol"],
    "echo.transport": [],
    # the transport's pure core, a sub-package of its own: every module of it, the offer path
    # and the timer heap included (the clock and the alarm are passed in)
    "echo.transport.core": [
        "__init__", "appender", "assembly", "config", "counters", "destinations",
        "flow_control", "frames", "image", "liveness", "logbuffer", "loss", "message",
        "offering", "outbox", "publication", "receiver", "response", "retransmit", "scanner",
        "sender", "status", "timerheap", "uri", "validation", "wireformat",
    ],
    "echo.transport.driver": [],
    "echo.session": [
        "admission", "allocators", "config", "crypto", "keywire", "limits", "machine", "resume",
        "shared", "timers",
    ],
    "echo.tickets": ["core"],
    "echo.channels": ["core", "receiving", "sending", "state", "wire"],
    "echo.topics": ["client_core", "codec", "ring", "server"],
    "echo.lobby": [
        "agreement", "due", "gameloop", "games", "heldchat", "hello", "home", "identity", "keys",
        "limits", "listings", "matchmaker", "queue_stats", "queue_wire", "queues", "replica",
        "results", "resume", "search_index", "timers",
    ],
    # the lobby's messages by family (records, requests, replies, updates), their field codecs
    # and the message table with its codec
    "echo.lobby.protocol": [
        "__init__", "fields", "records", "replies", "requests", "table", "updates",
    ],
    # what the lobby client raises and reports, and its pure helpers
    "echo.lobby.client": ["events", "helpers"],
    "echo.lobby.server": [],
    "echo.lobby.cli": [],
    # the lobby registry in layers: its records, checks, search, members, operations,
    # re-creation from copies, and the registry with its entry points
    "echo.lobby.state": [
        "__init__", "checks", "members", "ops", "records", "recreate", "registry", "search",
    ],
    # the JSON form of the lobby's messages, derived from the binary table (the forms of its
    # field codecs, the messages, the hello, the schema)
    "echo.lobby.web": ["__init__", "jsonforms", "jsonwire", "moving"],
    # the lobby page (a docstring) and its HTTP answers
    "echo.lobby.webpage": ["__init__", "pages"],
    # the package (a docstring); the Agones SDK client's state machine
    "echo.ops": ["__init__", "agones"],
}  # fmt: skip
DRIVERS: dict[str, list[str]] = {
    # the CLIs' helpers: logging setup and usage errors
    "echo": ["_cli", "log"],
    # the package (re-exports api), the api; the build check; the in-memory network of the
    # tests
    "echo.transport": ["__init__", "api", "compiled", "testing"],
    "echo.transport.core": [],
    # the trio side: the driver's loops, its sockets, channels, lending, epoll readiness and
    # wiring
    "echo.transport.driver": [
        "__init__", "channels", "lending", "loop", "readiness", "response_wiring", "sockets",
        "wiring",
    ],
    # the package, the trio server (its life cycle, on its layers: the hooks and state, the
    # duologues, the resumes, the HELLOs), the client (`connect`, its handshake, the all-clients
    # subscription its handshakes share, its path and resumes) and session, the path watch, the
    # port probes
    "echo.session": [
        "__init__", "client", "client_handshake", "client_hub", "client_path", "held",
        "pathwatch", "server",
        "server_base", "server_duologues", "server_hello", "server_resume", "session",
    ],
    # the package (re-exports the key-file reader), the key files
    "echo.tickets": ["__init__", "keyfile"],
    "echo.channels": ["__init__", "api"],
    "echo.topics": ["__init__", "cli", "client", "driver", "events", "serve"],
    # the package (loads the client, and trio, on first use), the client, the trio server,
    # the way from a GameStarting into the game server's session
    "echo.lobby": [
        "__init__", "cli_queue", "client_queue", "drain", "play", "statefile",
    ],
    # the command lines (echo-lobby, echo-lobby-client, echo-lobby-announce), their options,
    # the client's commands and output, and `python -m echo.lobby.cli`
    "echo.lobby.cli": [
        "__init__", "__main__", "announce", "client", "commands", "options", "output", "server",
    ],
    # the package (re-exports), its fields and events, its session to a server, its requests,
    # its way back after a drop, LobbyClient and connect
    "echo.lobby.client": [
        "__init__", "api", "connecting", "links", "rehome", "requests", "state",
    ],
    "echo.lobby.protocol": [],
    # the trio server by concern: its configuration and channels, its fields and a member's
    # connection, requests and deliveries, member sessions, timers and topics, LobbyServer
    "echo.lobby.server": [
        "__init__", "app", "base", "config", "replication", "routing", "sessions",
    ],
    "echo.lobby.state": [],
    # the WebSocket door on the lobby server and its echo-lobby options
    "echo.lobby.web": ["cli", "door"],
    # echo-lobby --web: the page's files read from the package, the listener that serves them
    # in front of the door, the door with the page, the --web option
    "echo.lobby.webpage": ["cli", "files", "paged", "serve"],
    # the --metrics option, the operations endpoint and its collectors; the Agones client's
    # trio driver and its HTTP/1.1 client
    "echo.ops": [
        "agones_driver", "cli", "heap", "http", "httpclient", "memdebug", "metrics",
        "queue_metrics",
    ],
}  # fmt: skip

# Which packages of echo each package may import (besides itself): downward only.
LAYERS: dict[str, set[str]] = {
    "echo.codec": set(),
    "echo.protocol": set(),
    "echo.transport": set(),
    "echo.session": {"echo.transport", "echo.protocol", "echo.codec"},
    "echo.tickets": {"echo.codec"},
    "echo.channels": {"echo.transport", "echo.session", "echo.codec"},
    "echo.topics": {"echo.transport", "echo.session", "echo.channels", "echo.codec"},
    "echo.lobby": {
        "echo.transport", "echo.session", "echo.channels", "echo.topics", "echo.tickets",
        "echo.protocol", "echo.codec",
    },
    "echo.server": {"echo.transport", "echo.session", "echo.tickets", "echo.protocol"},
    "echo.client": {"echo.transport", "echo.session", "echo.protocol"},
    # the operations endpoint (metrics, health) reads the servers it serves: an application
    "echo.ops": {
        "echo.transport", "echo.session", "echo.tickets", "echo.topics", "echo.lobby",
        "echo._cli",
    },
    "echo.telemetry": set(),
    "echo.log": set(),
    # the CLI helpers sit on top: the session's key options (--key, --server-key) load its keys
    "echo._cli": {"echo.session"},
}  # fmt: skip
# A command line (a package's cli.py, or a module of its cli package) may also use the CLI
# helpers and write the event log.
CLI_EXTRA = {"echo.log", "echo._cli", "echo.telemetry", "echo.ops"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ECHO.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    path = ECHO.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _type_checking_only(tree: ast.Module) -> set[int]:
    """The ids of the import nodes under `if TYPE_CHECKING:`."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return skip


def imports(path: Path, *, runtime_only: bool = False) -> list[str]:
    """Every module `path` imports, by full name: `from echo.channels import wire` is
    echo.channels.wire, `from echo.transport import Image` is echo.transport."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_only(tree) if runtime_only else set()
    package = module_name(path) if path.name == "__init__.py" else module_name(path.parent)
    names: list[str] = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                names.append(full if base.startswith("echo") and is_module(full) else base)
    return names


def package_of(name: str) -> str:
    parts = name.split(".")
    return ".".join(parts[:2])


def all_modules() -> list[Path]:
    return sorted(p for p in ECHO.rglob("*.py"))


PURE_PATHS = [
    ECHO.parent.joinpath(*package.split("."), f"{stem}.py")
    for package, stems in PURE.items()
    for stem in stems
]
PURE_NAMES = {module_name(p) for p in PURE_PATHS}


@pytest.mark.parametrize("package", sorted(PURE))
def test_every_module_is_classified(package: str) -> None:
    directory = ECHO.parent.joinpath(*package.split("."))
    found = sorted(p.stem for p in directory.glob("*.py"))
    assert found == sorted(PURE[package] + DRIVERS[package])
    assert not set(PURE[package]) & set(DRIVERS[package])


@pytest.mark.parametrize("path", PURE_PATHS, ids=lambda p: module_name(p) or "echo")
def test_a_pure_core_has_no_io_no_clock_and_imports_only_pure_cores(path: Path) -> None:
    name = module_name(path)
    for imported in imports(path, runtime_only=True):
        root = imported.split(".")[0]
        assert root not in FORBIDDEN - ALLOWED.get(name, set()), (name, imported)
        if root == "echo":
            assert imported in PURE_NAMES, f"{name} imports {imported}, which is not pure"


@pytest.mark.parametrize("path", all_modules(), ids=lambda p: module_name(p) or "echo")
def test_layers_import_downward_only(path: Path) -> None:
    name = module_name(path)
    own = package_of(name) if name != "echo" else "echo"
    if own == "echo":
        return  # the package's own __init__: a docstring
    allowed = LAYERS[own] | {own}
    if path.name == "cli.py" or path.parent.name == "cli":
        allowed |= CLI_EXTRA
    for imported in imports(path):
        if imported.split(".")[0] == "echo":
            assert package_of(imported) in allowed, f"{name} imports {imported}"


def test_every_package_has_its_layer() -> None:
    packages = {package_of(module_name(p)) for p in all_modules()} - {"echo"}
    assert packages == set(LAYERS)


@pytest.mark.parametrize(
    "path", sorted((ECHO / "transport").rglob("*.py")), ids=lambda p: module_name(p)
)
def test_transport_imports_nothing_above_it(path: Path) -> None:
    echo = [n for n in imports(path) if n.startswith("echo.")]
    assert [n for n in echo if package_of(n) != "echo.transport"] == []


def test_the_server_does_not_import_the_lobby() -> None:
    # The game tickets it checks live in echo.tickets, beside the session library.
    for path in (ECHO / "server").glob("*.py"):
        assert not [n for n in imports(path) if n.startswith("echo.lobby")], path.name


def test_the_import_reader_sees_what_python_runs() -> None:
    """The checks above are only as good as `imports`: what it reports for known cases."""
    assert "echo.channels.wire" in imports(ECHO / "channels" / "core.py")
    lending = ECHO / "transport" / "driver" / "lending.py"
    assert "trio" in imports(lending)
    assert "echo.transport.driver.channels" in imports(lending)
    assert "echo.transport.driver.channels" not in imports(lending, runtime_only=True)
    assert "echo.tickets.core" in imports(ECHO / "tickets" / "keyfile.py")
    assert "echo.transport" in imports(ECHO / "session" / "session.py")
