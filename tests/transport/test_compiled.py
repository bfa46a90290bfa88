"""The compiled core: the run that claims to be compiled really imported the compiled modules.

`./dev test --both` runs the suite, then the core's suites compiled, and says which run this is
with ECHO_EXPECT_COMPILED (0: interpreted, 1: compiled), so a build that silently fell back to
the sources cannot pass as compiled, and stale extension files cannot slip into the
interpreted run.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from echo.transport import compiled
from echo.transport.compiled import (
    BUILD_MANIFEST,
    COMPILED_MODULES,
    StaleBuildError,
    check_not_stale,
    loaded_compiled,
    source_hash,
)

EXPECT = os.environ.get("ECHO_EXPECT_COMPILED")


def _import_all() -> dict[str, bool]:
    for name in COMPILED_MODULES:
        importlib.import_module(name)
    return loaded_compiled()


@pytest.mark.skipif(EXPECT != "1", reason="not the compiled run (ECHO_EXPECT_COMPILED=1)")
def test_compiled_run_imports_every_compiled_module() -> None:
    loaded = _import_all()
    assert loaded == dict.fromkeys(COMPILED_MODULES, True)
    for name in COMPILED_MODULES:
        module = importlib.import_module(name)
        assert module.__file__ is not None
        assert module.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)), name


@pytest.mark.skipif(EXPECT != "0", reason="not the interpreted run (ECHO_EXPECT_COMPILED=0)")
def test_interpreted_run_imports_only_sources() -> None:
    assert _import_all() == dict.fromkeys(COMPILED_MODULES, False)


def test_never_half_compiled() -> None:
    # One shared library holds the whole group: either all of it is loaded or none of it.
    assert len(set(_import_all().values())) == 1


def _fake_tree(tmp_path: Path) -> Path:
    """A copy of the compiled modules' sources, as `check_not_stale` sees a checkout."""
    for name in COMPILED_MODULES:
        compiled.source_path(name, tmp_path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(compiled.source_path(name), compiled.source_path(name, tmp_path))
    return tmp_path


def _fake_extension(root: Path, module: str) -> Path:
    path = compiled.source_path(module, root).with_suffix(
        importlib.machinery.EXTENSION_SUFFIXES[0]
    )
    path.write_bytes(b"\x7fELF")
    return path


def test_no_extension_files_is_never_stale(tmp_path: Path) -> None:
    check_not_stale(_fake_tree(tmp_path))


def test_an_extension_built_from_this_source_is_accepted(tmp_path: Path) -> None:
    root = _fake_tree(tmp_path)
    _fake_extension(root, "echo.transport.core.frames")
    manifest = {name: source_hash(name, root) for name in COMPILED_MODULES}
    (root / "echo" / "transport" / BUILD_MANIFEST).write_text(json.dumps(manifest))
    check_not_stale(root)


def test_an_edited_source_behind_an_extension_refuses_to_import(tmp_path: Path) -> None:
    root = _fake_tree(tmp_path)
    _fake_extension(root, "echo.transport.core.logbuffer")
    manifest = {name: source_hash(name, root) for name in COMPILED_MODULES}
    (root / "echo" / "transport" / BUILD_MANIFEST).write_text(json.dumps(manifest))
    with compiled.source_path("echo.transport.core.logbuffer", root).open("a") as source:
        source.write("# edited after the build\n")
    with pytest.raises(StaleBuildError, match=r"echo\.transport\.core\.logbuffer .*logbuffer\.py"):
        check_not_stale(root)


def test_a_build_for_another_module_list_refuses_to_import(tmp_path: Path) -> None:
    # A module taken out of COMPILED_MODULES after a build keeps its old extension beside the
    # source; no per-module hash covers it, so the manifest's module list must.
    root = _fake_tree(tmp_path)
    _fake_extension(root, "echo.transport.core.frames")
    manifest = {name: source_hash(name, root) for name in COMPILED_MODULES}
    # (uri: never compiled, its records use attrs validators; see compiled.py)
    manifest["echo.transport.core.uri"] = "0" * 64
    (root / "echo" / "transport" / BUILD_MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(StaleBuildError, match=r"another module list .*uri"):
        check_not_stale(root)


def test_an_extension_without_a_manifest_refuses_to_import(tmp_path: Path) -> None:
    # Built by hand (`mypyc echo/transport/core/frames.py`): nothing says which source it came from.
    root = _fake_tree(tmp_path)
    _fake_extension(root, "echo.transport.core.frames")
    with pytest.raises(StaleBuildError, match=r"echo\.transport\.core\.frames"):
        check_not_stale(root)


def test_the_checkout_itself_is_not_stale() -> None:
    check_not_stale()


def test_echo_interpreted_imports_the_sources_even_beside_a_build() -> None:
    # The benchmarks compare both builds from one tree: ECHO_INTERPRETED=1 must really mean
    # the sources, whether or not extension files are there (in the compiled run they are).
    code = (
        "import importlib, json\n"
        "from echo.transport import compiled\n"
        "for m in compiled.COMPILED_MODULES: importlib.import_module(m)\n"
        "print(json.dumps(compiled.loaded_compiled()))\n"
    )
    env = {**os.environ, "ECHO_INTERPRETED": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert json.loads(done.stdout) == dict.fromkeys(COMPILED_MODULES, False)
