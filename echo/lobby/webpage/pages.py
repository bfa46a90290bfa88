"""The lobby page's HTTP answers: which file a request gets, with which headers.

Only the page's own files are served, by exact name from a fixed table (no path from the
request ever reaches the file system); GET and HEAD only. Every answer forbids content sniffing
and framing, and the page's Content-Security-Policy lets it load only its own files and open
WebSockets (to its door, or the one given as ``?ws=``).

Pure module: no trio, no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import attrs

TYPES: Final = {
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
}
# the page's entry: "/" and "/index.html" are the same file
INDEX: Final = "index.html"
SECURITY_HEADERS: Final = (
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
    (
        "Content-Security-Policy",
        "default-src 'self'; connect-src 'self' ws: wss:; img-src 'self' data:; "
        "frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    ),
)


@attrs.frozen
class Answer:
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes  # empty for HEAD (the Content-Length is the GET's)


def _plain(status: int, text: str, *extra: tuple[str, str]) -> Answer:
    body = (text + "\n").encode()
    return Answer(
        status,
        (
            ("Content-Type", "text/plain; charset=utf-8"),
            ("Content-Length", str(len(body))),
            *extra,
            *SECURITY_HEADERS,
        ),
        body,
    )


def file_name(target: str) -> str:
    """The file a request target names ("" for none): the path without its query, "/" being
    the index; only a plain name of the table can match."""
    path = target.split("?", 1)[0].split("#", 1)[0]
    if path in ("", "/"):
        return INDEX
    return path[1:] if path.startswith("/") else ""


def answer(method: str, target: str, files: Mapping[str, bytes]) -> Answer:
    """The answer to one request for the page (`files`: name -> content)."""
    if method not in ("GET", "HEAD"):
        return _plain(405, "only GET and HEAD", ("Allow", "GET, HEAD"))
    name = file_name(target)
    body = files.get(name)
    suffix = name[name.rfind(".") :] if "." in name else ""
    if body is None or suffix not in TYPES:
        return _plain(404, "not found: the lobby page is at /")
    headers = (
        ("Content-Type", TYPES[suffix]),
        ("Content-Length", str(len(body))),
        # the page and the client change with the server: always ask again
        ("Cache-Control", "no-cache"),
        *SECURITY_HEADERS,
    )
    return Answer(200, headers, b"" if method == "HEAD" else body)
