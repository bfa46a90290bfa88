"""The idle cadence of lobby sessions (docs/lobby.md, "Idle cadence").

A lobby member's session carries a few messages a second at most, and most of the time none:
what it costs a server to keep thousands of members is the transport's idle traffic. With
`echo_timers` (heartbeats 0.5 s, status messages 1 s, each direction) a server sends 3 and
receives 3 datagrams a second per member: 48,000 a second at L1's 8,000 members, each a system
call and a wake-up. Each of the four idle flows of a lobby session has one job, and its own
interval follows from that job alone:

- **server -> member heartbeats** are how a member notices its home died (image liveness,
  `CLIENT_LIVENESS`), which starts the failover that must end within 5 s:
  liveness + one retry of the home (`RETRY_TIMEOUT`) + the next server's handshake and the
  re-creation. `SERVER_HEARTBEAT` 0.8 s keeps three heartbeats in the 2.5 s liveness (one lost
  heartbeat on a real network is no drop) and the failover near 3.5-4 s.
- **member -> server heartbeats** are how the server notices a member dropped (presence
  RECONNECTING, owner migration, and a lobby left with no connected member leaving search: no
  ghost lobbies). That is the server's image liveness, `MEMBER_LIVENESS` 2.5 s, the same bound
  as a member's for its home; `CLIENT_HEARTBEAT` 0.8 s keeps three heartbeats in it, as
  `SERVER_HEARTBEAT` does the other way. (It was the transport's 10 s with a heartbeat every
  2 s: a killed player's lobby stayed in search results for 10 s and more.)
- **status messages both ways** keep the other side's publication connected, and that is
  all they do at rest: each side learns that the other died from the missing heartbeats
  (the liveness above), not from these, and flow control does not need them sooner (a
  lobby's traffic in an interval is a sliver of the receiver window, and an image sends an SM
  early anyway when the window must move: `echo.transport.core.status`, as Aeron's receiver
  does, so a busy member is never held back). `STATUS_INTERVAL` 4 s, with the publications'
  connection timeout `CONNECTION_TIMEOUT` 13 s on both sides (three and a margin; the
  transport's is 5 s, which needed one every 1.5 s).
- **tail loss** does not wait for an idle heartbeat: `probe_after_data` sends one probe heartbeat
  right after each burst of data, so a lost last message (a chat line, an update) is NAKed and
  repaired in milliseconds, as in `echo_timers`.

A server then sends 1.5 and receives 1.5 idle datagrams a second per member (half of
`echo_timers`' 6).

A lobby server's publications (one per member session, and its links to the other servers of
the ring) also get smaller terms than the transport's 16 MiB: `LOBBY_TERM_LENGTH`, 4 MiB. A
publication that lives for hours touches a fresh page of its log for every 4 KiB it sends
until its three terms are resident, so with 16 MiB terms each long-lived stream could come to
hold 48 MiB (the one-hour soak's lobby servers held 2.3 MB of publication pages after 55
minutes, and rising). 4 MiB terms bound that to 12 MiB a stream and still carry the largest
lobby message (`MAX_MESSAGE_BYTES`, 256 KiB, and its framing) under the term / 8 limit.
"""

from __future__ import annotations

from typing import Any

import attrs

from echo.session.timers import echo_timers
from echo.transport.core.config import TransportConfig

SERVER_HEARTBEAT = 0.8
CLIENT_HEARTBEAT = 0.8
#: Status messages at rest, both ways (see the module's text).
STATUS_INTERVAL = 4.0
#: A publication stays connected this long without the other side's status messages.
CONNECTION_TIMEOUT = 13.0
#: The home's heartbeats come every `SERVER_HEARTBEAT`; silence this long means it is gone.
CLIENT_LIVENESS = 2.5
#: A member's heartbeats come every `CLIENT_HEARTBEAT`; silence this long means it dropped.
MEMBER_LIVENESS = 2.5
#: After silence, how long the home gets to answer again before the lobby moves on.
RETRY_TIMEOUT = 1.0
#: The term length of a lobby server's publications (see the module's text).
LOBBY_TERM_LENGTH = 4 * 1024 * 1024


def lobby_server_timers(base: TransportConfig | None = None, **overrides: Any) -> TransportConfig:
    """A lobby server's transport timers and term length (see the module's text)."""
    fields: dict[str, Any] = {
        "heartbeat_interval": SERVER_HEARTBEAT,
        "status_message_interval": STATUS_INTERVAL,
        "image_liveness_timeout": MEMBER_LIVENESS,
        "publication_connection_timeout": CONNECTION_TIMEOUT,
        "term_length": LOBBY_TERM_LENGTH,
    }
    fields.update(overrides)
    return attrs.evolve(echo_timers(base), **fields)


def lobby_client_timers(
    base: TransportConfig | None = None, *, liveness: float = CLIENT_LIVENESS, **overrides: Any
) -> TransportConfig:
    """A lobby member's transport timers; `liveness` is how long a silent home is trusted."""
    fields: dict[str, Any] = {
        "heartbeat_interval": CLIENT_HEARTBEAT,
        "status_message_interval": STATUS_INTERVAL,
        "image_liveness_timeout": liveness,
        "publication_connection_timeout": CONNECTION_TIMEOUT,
    }
    fields.update(overrides)
    return attrs.evolve(echo_timers(base), **fields)
