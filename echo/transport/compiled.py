"""The compiled core: which transport modules mypyc turns into C, and which are loaded so now.

`COMPILED_MODULES` is the one list of them: setup.py compiles exactly these when asked to
(`ECHO_COMPILE=1`, or `./dev build`), and the checks below read the same list. A module joins it
when it is pure (no trio, no clock), strictly typed, and imports cleanly once compiled; the same
source always runs interpreted too, and a plain `pip install -e .` builds nothing.

A compiled module is an extension file beside its source
(`core/frames.cpython-311-x86_64-linux-gnu.so` next to `core/frames.py`); Python's import
system prefers it. So that an edited source can never be
shadowed silently by an old build, the build records a hash of every source it compiled
(`BUILD_MANIFEST`) and importing `echo.transport` refuses to go on when a source has changed
since. This file imports only the standard library: setup.py reads it before anything is built.

`ECHO_INTERPRETED=1` in the environment makes a process import the sources even where a build
exists (`prefer_sources`): benchmarks compare both from one tree, in one run.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Final

COMPILED_MODULES: Final = (
    "echo.transport.core.wireformat",
    "echo.transport.core.frames",
    "echo.transport.core.logbuffer",
    "echo.transport.core.appender",
    "echo.transport.core.flow_control",
    "echo.transport.core.destinations",
    "echo.transport.core.outbox",
    "echo.transport.core.counters",
    "echo.transport.core.loss",
    "echo.transport.core.retransmit",
    "echo.transport.core.assembly",
    "echo.transport.core.status",
    "echo.transport.core.scanner",
    "echo.transport.core.liveness",
    "echo.transport.core.image",
    "echo.transport.core.publication",
    "echo.transport.core.receiver",
    "echo.transport.core.sender",
    "echo.transport.core.offering",
    "echo.transport.core.message",
)

#: written by the build beside this file:
#: {"echo.transport.core.frames": "<sha256 of core/frames.py>", ...}
BUILD_MANIFEST: Final = "_compiled_sources.json"

_PACKAGE_DIR: Final = Path(__file__).resolve().parent
_ROOT: Final = _PACKAGE_DIR.parent.parent


class StaleBuildError(ImportError):
    """A compiled module whose source changed after it was built (or built outside setup.py)."""


def source_path(module: str, root: Path = _ROOT) -> Path:
    return root.joinpath(*module.split(".")).with_suffix(".py")


def source_hash(module: str, root: Path = _ROOT) -> str:
    return hashlib.sha256(source_path(module, root).read_bytes()).hexdigest()


def extension_paths(module: str, root: Path = _ROOT) -> list[Path]:
    """The extension files on disk that would shadow `module`'s source, if any."""
    source = source_path(module, root)
    return [
        source.with_name(source.stem + suffix)
        for suffix in importlib.machinery.EXTENSION_SUFFIXES
        if source.with_name(source.stem + suffix).exists()
    ]


def write_manifest() -> Path:
    """Record the sources being compiled (called by setup.py just before it compiles them)."""
    path = _PACKAGE_DIR / BUILD_MANIFEST
    path.write_text(json.dumps({m: source_hash(m) for m in COMPILED_MODULES}, indent=1) + "\n")
    return path


def check_not_stale(root: Path = _ROOT) -> None:
    """Raise StaleBuildError if an extension file would shadow a source it was not built from.

    Costs one directory listing when nothing is compiled; hashes the sources only when there
    are extension files. `root` is the directory that holds the `echo` package.
    """
    package = root / "echo" / "transport"
    # The modules' own directories (the pure core's sub-package) and the package's, which
    # holds the group's shared library.
    directories = {package} | {source_path(m, root).parent for m in COMPILED_MODULES}
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    if not any(
        name.endswith(suffixes)
        for directory in directories
        if directory.is_dir()
        for name in os.listdir(directory)
    ):
        return
    try:
        recorded = json.loads((package / BUILD_MANIFEST).read_text())
    except (OSError, ValueError):
        recorded = {}
    if isinstance(recorded, dict) and recorded and set(recorded) != set(COMPILED_MODULES):
        # Built for another module list: a module taken out of COMPILED_MODULES would still be
        # shadowed by its old extension, which no hash below looks at.
        changed = sorted(set(recorded) ^ set(COMPILED_MODULES))
        raise StaleBuildError(
            f"the compiled core was built for another module list (differs in {changed}):"
            " rebuild it (./dev build) or remove it (./dev clean)",
            name=changed[0],
        )
    for module in COMPILED_MODULES:
        if not extension_paths(module, root):
            continue
        if recorded.get(module) != source_hash(module, root):
            raise StaleBuildError(
                f"{module} has a compiled extension that was not built from the current"
                f" {source_path(module, root).name}: rebuild it (./dev build) or remove it"
                " (./dev clean)",
                name=module,
            )


def loaded_compiled() -> dict[str, bool]:
    """For each module of COMPILED_MODULES already imported: is it the compiled one?"""
    return {
        name: not str(getattr(sys.modules[name], "__file__", "")).endswith(".py")
        for name in COMPILED_MODULES
        if name in sys.modules
    }


class _SourcesFirst(importlib.abc.MetaPathFinder):
    """Finds the compiled modules' .py files before the path finder sees their extensions."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in COMPILED_MODULES:
            return None
        return importlib.util.spec_from_file_location(fullname, source_path(fullname))


def prefer_sources() -> None:
    """From now on import COMPILED_MODULES from their sources (before any of them is imported)."""
    if not any(isinstance(finder, _SourcesFirst) for finder in sys.meta_path):
        sys.meta_path.insert(0, _SourcesFirst())
