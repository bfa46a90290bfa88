"""The lobby client's timeouts and its small pure helpers: server addresses, search filters,
the member id and identity token, the wait a RATE_LIMITED refusal names, server order.

Pure module: no trio, no clock.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Mapping, Sequence

from echo.lobby.hello import MAX_TOKEN_BYTES
from echo.lobby.identity import token_subject
from echo.lobby.limits import LobbyConfig
from echo.lobby.protocol import (
    I64_MAX,
    I64_MIN,
    ErrorCode,
    Filter,
    FreeSlots,
    NumberRange,
    StringEquals,
)

#: How long a handshake with a lobby server may take before the next server is tried (a
#: handshake on a working network takes one or two round trips; a loaded server, admitting
#: hundreds of members a second, may need more: `connect(connect_timeout=...)`,
#: ``echo-lobby-client --connect-timeout``).
CONNECT_TIMEOUT = 3.0
#: A join past a dead home waits this long for the lobby's members to re-create it on the next
#: server (they do within 5 s of the death; twice that allows for a loaded machine), asking
#: again every `JOIN_RETRY_INTERVAL`.
FAILOVER_WAIT = 10.0
#: A lobby whose home is its only server: how long a member whose session went silent keeps
#: asking that home to take it back (its seat is kept for the server's grace period, 20 s).
ONLY_HOME_RETRY = 20.0
JOIN_RETRY_INTERVAL = 0.25
#: How long `search_all` may wait, in all, for a server's search rate limit to let it go on.
SEARCH_ALL_WAIT = 30.0
#: A RATE_LIMITED refusal's text ends with the wait its server asks for ("(retry in 0.250 s)").
_RETRY_IN = re.compile(r"\(retry in ([0-9]{1,6}(?:\.[0-9]{1,6})?) s\)$")
# What a join walk that found nothing says (the servers' own refusals say the same).
_NOT_THERE = {
    ErrorCode.NO_SUCH_CODE: "no lobby has this code",
    ErrorCode.NO_MATCH: "no open lobby matches",
}


def split_server(server: str) -> tuple[str, int, int]:
    """``host:port`` (control port = port + 1), ``host:port:control``, ``[v6]:port[:control]``."""
    if server.startswith("["):
        host, _, rest = server[1:].partition("]")
        numbers = rest[1:].split(":") if rest.startswith(":") else []
    else:
        host, *numbers = server.split(":")
    if not host or len(numbers) not in (1, 2) or not all(n.isdigit() for n in numbers):
        raise ValueError(f"{server!r} is not host:port")
    port = int(numbers[0])
    control = int(numbers[1]) if len(numbers) == 2 else port + 1
    if not 0 < port < 65536 or not 0 < control < 65536:
        raise ValueError(f"{server!r} is not host:port")
    return host, port, control


def filters_from(
    equals: Mapping[str, str] | None = None,
    ranges: Mapping[str, tuple[int | None, int | None]] | None = None,
    free_slots: int | None = None,
) -> tuple[Filter, ...]:
    """Search filters: ``equals={"mode": "duel"}, ranges={"skill": (10, 20)}, free_slots=2``."""
    out: list[Filter] = [StringEquals(k, v) for k, v in (equals or {}).items()]
    for key, (low, high) in (ranges or {}).items():
        out.append(
            NumberRange(key, I64_MIN if low is None else low, I64_MAX if high is None else high)
        )
    if free_slots is not None:
        out.append(FreeSlots(free_slots))
    return tuple(out)


def _none_let_in(order: Sequence[str], dead: Iterable[str], errors: Sequence[str]) -> str:
    """What `LobbyUnavailable` says after a walk of `order`: nobody answered, or who refused."""
    said = "; ".join(errors)
    if set(order) <= set(dead):
        return "no lobby server answered at " + said
    return "no lobby server let this member in (a server that answered refused): " + said


def member_of(member: str | None, identity_token: str | bytes | None) -> str:
    """The member id: `member`, or the ``sub`` of the token (read, not verified: the lobby
    verifies it); both given, they must agree (ValueError otherwise, as with neither)."""
    if not identity_token:  # None, "" or b"": no token
        if member is None:
            raise ValueError("a member id or an identity token (whose sub is the id) is needed")
        return member
    subject = token_subject(identity_token)
    if member is not None and member != subject:
        raise ValueError(f"the identity token is for {subject!r}, not {member!r}")
    return subject


def _token_bytes(token: str | bytes | None) -> bytes:
    if token is None:
        return b""
    try:
        data = token.encode("ascii") if isinstance(token, str) else bytes(token)
    except UnicodeEncodeError:
        raise ValueError("an identity token is ASCII (a compact JWT)") from None
    if len(data) > MAX_TOKEN_BYTES:
        raise ValueError(f"an identity token of more than {MAX_TOKEN_BYTES} bytes")
    return data


def retry_after(message: str) -> float:
    """How long to wait after a RATE_LIMITED refusal with this text: what the server named
    (its token bucket's next token), or one interval of the default search limit; a little
    more either way, so that the retry finds the token there."""
    found = _RETRY_IN.search(message)
    wait = float(found.group(1)) if found else 1.0 / LobbyConfig().search_limit.rate
    return wait + 0.01


def shuffled(servers: Sequence[str], rng: random.Random | None = None) -> list[str]:
    out = list(servers)
    (rng or random).shuffle(out)
    return out
