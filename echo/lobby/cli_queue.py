"""`echo-lobby-client`'s matchmaker commands and events (echo.lobby.cli calls these):

    queue MODE REGION [skill=N] [size=N] [party] [start] [strict]   ->  "queued TICKET SERVER"
    cancel                                                          ->  "ok cancel"

and the events "matched TICKET LOBBY_ID WAITED_MS" and "queue_left TICKET REASON"
(``{"event": "matched", ...}`` with --json). Driver module (the command line's).
"""

from __future__ import annotations

from typing import Any

from echo.lobby.queue_wire import Matched, QueueLeft

FLAGS = {"party", "start", "strict"}


async def queue_command(lobby: Any, args: list[str], out: Any) -> None:
    """`queue MODE REGION [skill=N] [size=N] [party] [start] [strict]`; ValueError if bad."""
    mode, region = args[0], args[1]
    numbers = {"skill": 0, "size": 2}
    flags = set()
    for word in args[2:]:
        key, eq, value = word.partition("=")
        if not eq and word in FLAGS:
            flags.add(word)
        elif eq and key in numbers:
            try:
                numbers[key] = int(value)
            except ValueError:
                raise ValueError(f"{key} is a whole number, not {value!r}") from None
        else:
            raise ValueError(f"queue takes skill=N size=N party start strict, not {word!r}")
    ticket = await lobby.queue(
        mode,
        region,
        skill=numbers["skill"],
        size=numbers["size"],
        party="party" in flags,
        start="start" in flags,
        strict_region="strict" in flags,
    )
    out("queued", ticket, lobby.server, ticket=ticket, server=lobby.server)


def print_queue_event(out: Any, event: Any) -> bool:
    """Print a matchmaker event; False if `event` is not one."""
    if isinstance(event, Matched):
        out(
            "matched",
            event.ticket,
            event.lobby_id,
            event.waited_ms,
            ticket=event.ticket,
            lobby_id=event.lobby_id,
            waited_ms=event.waited_ms,
        )
        return True
    if isinstance(event, QueueLeft):
        out("queue_left", event.ticket, event.reason, ticket=event.ticket, reason=event.reason)
        return True
    return False


EVENT_NAMES = {Matched: "matched", QueueLeft: "queue_left"}
