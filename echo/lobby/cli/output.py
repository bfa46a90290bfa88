"""`echo-lobby-client`'s output: one line (or JSON object) per result and per event.

Driver: a command line.
"""

from __future__ import annotations

import json
from typing import Any

from echo.lobby import cli_queue


class _Printer:
    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json

    def __call__(self, event: str, *words: Any, **fields: Any) -> None:
        if self.as_json:
            record = {"event": event, **fields}
            print(json.dumps(record, default=_jsonable), flush=True)
        else:
            said = [str(w) for w in words]
            # Fields already said as words are not repeated as KEY=VALUE.
            parts = [event, *said]
            parts += [f"{k}={_text(v)}" for k, v in fields.items() if str(v) not in said]
            print(" ".join(parts), flush=True)


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    if hasattr(value, "name"):
        return value.name.lower()
    return str(value)


def _text(value: Any) -> str:
    if isinstance(value, dict):
        return ",".join(f"{k}:{v}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def _print_event(out: _Printer, event: Any) -> None:
    from echo.lobby import protocol as p
    from echo.lobby.client import Left, Reconnected, Rehomed, Resumed

    if cli_queue.print_queue_event(out, event):
        return
    match event:
        case p.LobbySnapshot():
            _print_snapshot(out, event)
        case p.MemberJoined():
            out("member_joined", event.member.member_id, member=event.member.member_id)
        case p.MemberLeft():
            reason = event.reason.name.lower()
            out("member_left", event.member_id, reason, member=event.member_id, reason=reason)
        case p.OwnerChanged():
            out("owner", event.owner, owner=event.owner)
        case p.MetadataChanged():
            out("metadata", changes=dict(event.changes))
        case p.LockChanged():
            out("locked" if event.locked else "unlocked")
        case p.AttributesChanged():
            out("attributes", event.member_id, member=event.member_id, changes=dict(event.changes))
        case p.ReadyChanged():
            out("ready" if event.ready else "unready", event.member_id, member=event.member_id)
        case p.PresenceChanged():
            presence = event.presence.name.lower()
            out("presence", event.member_id, presence, member=event.member_id, presence=presence)
        case p.MemberBanned():
            out("banned", event.member_id, member=event.member_id)
        case p.GameStarting():
            _print_game(out, event)
        case p.GameEnded():
            out("game_ended", event.match_id, match_id=event.match_id, result=dict(event.result))
        case p.ChatLine():
            out("chat", event.member_id, event.text, member=event.member_id, text=event.text)
        case Rehomed():
            out(
                "rehomed",
                event.lobby_id,
                event.server,
                lobby_id=event.lobby_id,
                server=event.server,
            )
        case Reconnected():
            out("reconnected", event.server, server=event.server)
        case Resumed():
            out("resumed", event.lobby_id, event.server, lobby=event.lobby_id, server=event.server)
        case Left():
            out("left", event.lobby_id, event.reason, lobby_id=event.lobby_id, reason=event.reason)


def _print_snapshot(out: _Printer, event: Any) -> None:
    out(
        "snapshot",
        event.lobby_id,
        lobby_id=event.lobby_id,
        name=event.name,
        owner=event.owner,
        members=[m.member_id for m in event.members],
        max=event.max_members,
        locked=event.locked,
        code=event.join_code,
        metadata=dict(event.metadata),
    )


def _print_game(out: _Printer, event: Any) -> None:
    # The game server's public key, when it announced one: what the member pins.
    from echo.session.crypto import public_key_text

    key = (public_key_text(event.server_key),) if event.server_key else ()
    out(
        "game",
        event.server_id,
        event.address,
        event.ticket.hex(),
        *key,
        server_id=event.server_id,
        address=event.address,
        ticket=event.ticket.hex(),
        **({"server_key": key[0]} if key else {}),
        control_port=event.control_port,
        duologue_ports=event.duologue_ports,
        match_id=event.match_id,
    )


def _event_name(event: Any) -> str:
    from echo.lobby import protocol as p
    from echo.lobby.client import Left, Reconnected, Rehomed, Resumed

    names = {
        p.LobbySnapshot: "snapshot",
        p.MemberJoined: "member_joined",
        p.MemberLeft: "member_left",
        p.OwnerChanged: "owner",
        p.MetadataChanged: "metadata",
        p.LockChanged: "locked",
        p.AttributesChanged: "attributes",
        p.ReadyChanged: "ready",
        p.PresenceChanged: "presence",
        p.MemberBanned: "banned",
        p.GameStarting: "game",
        p.GameEnded: "game_ended",
        p.ChatLine: "chat",
        Rehomed: "rehomed",
        Reconnected: "reconnected",
        Resumed: "resumed",
        p.ResumeToken: "token",
        Left: "left",
        **cli_queue.EVENT_NAMES,
    }
    return names.get(type(event), type(event).__name__)
