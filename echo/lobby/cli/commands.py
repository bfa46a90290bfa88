"""`echo-lobby-client`'s commands: the words of one standard-input line carried out on the
member's lobby client.

Driver: a command line.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import trio

from echo.lobby import cli_queue
from echo.lobby.cli.output import (
    _Printer,
)


def _value(text: str) -> str | int | None:
    if text == "":
        return None
    if text.lstrip("-").isdigit():
        return int(text)
    return text


def _pairs(words: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for word in words:
        key, sep, value = word.partition("=")
        if not sep or not key:
            raise ValueError(f"expected KEY=VALUE, got {word!r}")
        out[key] = _value(value)
    return out


def _filters(words: Sequence[str]) -> tuple[tuple[Any, ...], int]:
    from echo.lobby.client import filters_from

    equals: dict[str, str] = {}
    ranges: dict[str, tuple[int | None, int | None]] = {}
    free: int | None = None
    page = 20
    for word in words:
        key, sep, value = word.partition("=")
        if not sep:
            raise ValueError(f"expected KEY=VALUE, got {word!r}")
        if key == "free":
            free = int(value)
        elif key == "page":
            page = int(value)
        elif ".." in value:
            low, _, high = value.partition("..")
            ranges[key] = (int(low) if low else None, int(high) if high else None)
        else:
            equals[key] = value
    return filters_from(equals, ranges, free), page


def _whole_number(text: str, what: str) -> int:
    """A command's integer argument, or a ValueError that says which and why (not int()'s)."""
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{what} is a whole number, not {text!r}") from None


def _seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise ValueError(f"SECONDS is a number, not {text!r}") from None
    if not 0 <= seconds < float("inf"):
        raise ValueError(f"SECONDS is 0 or more, not {text!r}")
    return seconds


#: The commands that seat the member: each prints "joined LOBBY_ID SERVER".
_JOINS = frozenset({"create", "join", "code", "quick"})


async def _command(lobby: Any, words: list[str], out: _Printer) -> None:
    verb, args = words[0], words[1:]
    if verb in _JOINS:
        lobby_id = await _join_command(lobby, verb, args)
        out("joined", lobby_id, lobby.server, lobby_id=lobby_id, server=lobby.server)
    elif verb == "search":
        await _search_command(lobby, args, out)
        out("ok", verb, command=verb)
    elif verb == "queue":
        await cli_queue.queue_command(lobby, args, out)
    elif verb == "state":
        _state_command(lobby, out)
    else:
        await _member_command(lobby, verb, args)
        out("ok", verb, command=verb)


async def _join_command(lobby: Any, verb: str, args: list[str]) -> int:
    """create, join, code or quick: the lobby the member now sits in."""
    if verb == "create":
        name = args[0]
        rest = args[1:]
        size = int(rest.pop(0)) if rest and rest[0].isdigit() else 8
        private = bool(rest and rest[0] == "private")
        if private:
            rest = rest[1:]
        return int(await lobby.create(name, size, private=private, metadata=_pairs(rest)))
    if verb == "join":
        return int(await lobby.join(_whole_number(args[0], "LOBBY_ID")))
    if verb == "code":
        return int(await lobby.join_code(args[0]))
    filters, _ = _filters(args)
    return int(await lobby.quick_join(filters))


async def _search_command(lobby: Any, args: list[str], out: _Printer) -> None:
    filters, page = _filters(args)
    for listing in await lobby.search_all(filters, limit=page):
        out(
            "lobby",
            listing.lobby_id,
            listing.name,
            f"{listing.member_count}/{listing.max_members}",
            f"home={listing.home}",
            *(f"{k}={v}" for k, v in listing.metadata.items()),
            lobby_id=listing.lobby_id,
            name=listing.name,
            members=listing.member_count,
            max=listing.max_members,
            home=listing.home,
            metadata=dict(listing.metadata),
        )


def _state_command(lobby: Any, out: _Printer) -> None:
    replica = lobby.replica
    if replica is None:
        out("state", "none", lobby_id=None)
        return
    snap = replica.snapshot()
    out(
        "state",
        snap.lobby_id,
        lobby_id=snap.lobby_id,
        owner=snap.owner,
        members=[m.member_id for m in snap.members],
        ready=[m.member_id for m in snap.members if m.ready],
        connected=[m.member_id for m in snap.members if m.presence.name == "CONNECTED"],
        attributes={m.member_id: dict(m.attributes) for m in snap.members},
        metadata=dict(snap.metadata),
    )


async def _member_command(lobby: Any, verb: str, args: list[str]) -> None:
    """Every other command: one request (or a sleep); ValueError for an unknown one."""
    match verb:
        case "leave":
            await lobby.leave()
        case "meta":
            await lobby.set_metadata(_pairs(args))
        case "lock":
            await lobby.lock(True)
        case "unlock":
            await lobby.lock(False)
        case "kick":
            await lobby.kick(args[0])
        case "ban":
            await lobby.ban(args[0])
        case "transfer":
            await lobby.transfer(args[0])
        case "attr":
            await lobby.set_attributes(_pairs(args))
        case "ready":
            await lobby.ready(True)
        case "unready":
            await lobby.ready(False)
        case "chat":
            await lobby.chat(" ".join(args))
        case "start":
            await lobby.start({k: str(v) for k, v in _pairs(args).items()})
        case "ticket":
            await lobby.request_ticket()
        case "report":
            if len(args) < 2:
                raise ValueError("report SERVER_ID REASON...")
            await lobby.report_game_server(args[0], " ".join(args[1:]))
        case "cancel":
            await lobby.cancel_queue()
        case "sleep":
            await trio.sleep(_seconds(args[0]))
        case _:
            raise ValueError(f"unknown command {verb!r}")
