"""Where a WebSocket member goes when its lobby server drains: the ``moved`` message.

A draining `echo-lobby` (`echo.lobby.drain`) tells each member on its WebSocket door where to
go before it closes the connection (1001), as its UDP members are told by the session's
goodbye: ``{"type": "moved", "lobby_id": "...", "server": "10.0.0.2:7600", "url":
"wss://lobby-2.example.com:7680"}``. For a member in a lobby, ``server`` is the server its
lobby's members re-create it on: the first of the lobby's ring walk that is not the draining
server (`echo.lobby.home.failover_home`, the very walk the UDP members take, so both kinds meet
there). For a member in no lobby (``"lobby_id": null``) it is the next server of the ring for
that member. ``url`` is that server's WebSocket door: servers know one another by their UDP
names (``--lobby-servers``), so each is also given the ring's WebSocket URLs
(``--lobby-ws-urls``, in the same order). Without them, or when no other server has a door,
no ``moved`` is sent and the member hears only the 1001.

The JavaScript client (clients/js/lobby.js) follows it: it connects to ``url``, re-creates its
lobby there from its copy (``recreate_lobby`` with its seat, or a ``join_lobby`` if another
member's copy got there first), and sends again the requests that had no reply: the draining
server carried out none of them (what it carried out was answered before the ``moved``).

Pure module: no trio, no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from echo.lobby.home import Ring, failover_home

#: The JSON form of a u64 (echo.lobby.web.jsonwire's): a decimal string.
_U64_SCHEMA = {"type": "string", "pattern": "^(0|[1-9][0-9]{0,19})$"}


def next_server(ring: Ring, here: str, lobby_id: int | None, member_id: str) -> str | None:
    """The server a member of `here` goes to when `here` drains (None: no other server)."""
    if lobby_id is not None:
        return failover_home(ring, lobby_id, {here})
    for server in ring.servers_for(f"member:{member_id}", 2):
        if server != here:
            return server
    return None


def moved_message(lobby_id: int | None, server: str, url: str) -> dict[str, Any]:
    """The ``moved`` message (its JSON object)."""
    return {
        "type": "moved",
        "lobby_id": None if lobby_id is None else str(lobby_id),
        "server": server,
        "url": url,
    }


def moved_schema() -> dict[str, Any]:
    """The JSON Schema of ``moved`` (a server message of the door only)."""
    return {
        "type": "object",
        "properties": {
            "type": {"const": "moved"},
            "lobby_id": {"oneOf": [_U64_SCHEMA, {"type": "null"}]},
            "server": {"type": "string", "minLength": 1},
            "url": {"type": "string", "pattern": "^wss?://"},
        },
        "required": ["type", "lobby_id", "server", "url"],
        "additionalProperties": False,
    }


def ws_urls_for(ring: Sequence[str], urls: Sequence[str]) -> dict[str, str]:
    """Each ring server's WebSocket URL, from ``--lobby-ws-urls`` (one per ``--lobby-servers``
    entry, in its order; ``-`` for a server without a door). ValueError says what is wrong."""
    if len(urls) != len(ring):
        raise ValueError(
            f"{len(urls)} WebSocket URL(s) for {len(ring)} lobby server(s): give one per "
            "--lobby-servers entry, in the same order ('-' for a server without a door)"
        )
    out: dict[str, str] = {}
    for server, url in zip(ring, urls, strict=True):
        if url == "-":
            continue
        parts = urlsplit(url)
        if parts.scheme not in ("ws", "wss") or not parts.hostname:
            raise ValueError(f"not a ws:// or wss:// URL: {url!r}")
        try:
            parts.port  # noqa: B018 (a port out of range raises here)
        except ValueError:
            raise ValueError(f"not a valid port in {url!r}") from None
        out[server] = url
    return out


def moved_for(
    ring: Ring, here: str, urls: Mapping[str, str], lobby_id: int | None, member_id: str
) -> dict[str, Any] | None:
    """The ``moved`` message for one member of `here`, or None when its next server has no
    WebSocket URL (or there is no other server)."""
    server = next_server(ring, here, lobby_id, member_id)
    if server is None or server not in urls:
        return None
    return moved_message(lobby_id, server, urls[server])
