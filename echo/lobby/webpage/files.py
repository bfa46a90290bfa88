"""The lobby page's files, read once from the package (``static/``)."""

from __future__ import annotations

from functools import cache
from importlib import resources

from echo.lobby.webpage.pages import TYPES

NAMES = ("index.html", "app.js", "style.css", "lobby.js")


@cache
def page_files() -> dict[str, bytes]:
    """name -> content of every file of the page (a file missing from an install is an error
    at start, not a 404 later)."""
    static = resources.files("echo.lobby.webpage") / "static"
    files = {name: (static / name).read_bytes() for name in NAMES}
    assert all(name[name.rfind(".") :] in TYPES for name in files)
    return files
