"""Build hook: pure Python by default; the compiled core only when ECHO_COMPILE=1.

    pip install -e .                    # pure Python, nothing built (the default)
    ECHO_COMPILE=1 pip install -e .     # also compiles echo.transport.compiled.COMPILED_MODULES
    ./dev build                         # the same, in the project's venv, without build isolation

Everything else about the package is in pyproject.toml.
"""

from __future__ import annotations

import os
import runpy
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent


def _compiled_extensions() -> list[object]:
    # Read the module list without importing echo (its dependencies need not be installed yet).
    compiled = runpy.run_path(str(HERE / "echo" / "transport" / "compiled.py"))
    modules: tuple[str, ...] = compiled["COMPILED_MODULES"]
    try:
        from mypyc.build import mypycify
    except ImportError:
        # Under build isolation the first pass only asks what the build needs: say mypy.
        setup(setup_requires=["mypy==2.4.1"])
        raise SystemExit(0) from None
    compiled["write_manifest"]()
    paths = [str(Path(*m.split(".")).with_suffix(".py")) for m in modules]
    # One shared library for the group, named so that it lands inside the package.
    return list(mypycify(paths, opt_level="3", group_name="echo.transport._core"))


if os.environ.get("ECHO_COMPILE") == "1":
    setup(ext_modules=_compiled_extensions())
else:
    setup()
