"""The lobby library a game embeds::

    import echo.lobby

    async with echo.lobby.connect(["10.0.0.1:7600", "10.0.0.2:7600"], member="alice") as lobby:
        lobby_id = await lobby.create("alice's room", max_members=4, metadata={"mode": "duel"})
        await lobby.ready()
        async for event in lobby.events():     # updates, chat lines, GameStarting, ...
            ...

The client talks to one lobby server at a time over one `echo.session` session carrying the
lobby's three logical channels (`echo.lobby.agreement.lobby_channel_specs`). It keeps a
`LobbyReplica` of its lobby from the snapshot and the versioned updates (a gap asks for a
snapshot again). A lobby's home is the first server of its id on the consistent-hashing ring of
the lobby-server list (`echo.lobby.home`); every member computes it alone, so:

- when the session to the home drops, the client first tries the home again (same seat: within
  the server's grace period the seat is kept; the hello also carries this client's random
  secret, by which the home gives the seat back to the client it seated even when the
  LobbyJoined that carried the seat never arrived), and if the home does not answer it re-creates
  the lobby on the next server of the ring from its replica (`RecreateLobby`); every member
  does the same, so they meet there within a few seconds (liveness 2.5 s + one retry of
  1 s: `echo.lobby.timers`);
- a join by id goes to the id's home; a join code is made to land on its server, so a join by
  code goes to the code's home; both walk on along the ring past dead servers.

Errors: a refused request raises `LobbyError` (`.code`, an `ErrorCode`, and the server's
message); no reachable server raises `LobbyUnavailable`.

The package's modules, by concern: `events` (what the client raises and reports), `helpers`
(timeouts, addresses, filters, tokens), `state` (its fields, events and waits), `links` (the
session to one server and what its messages do), `rehome` (the way back after a drop),
`requests` (exchanges and join walks), `api` (`LobbyClient`) and `connecting` (`connect`).
Every public name is imported from here.
"""

from __future__ import annotations

from echo.lobby.client.api import LobbyClient as LobbyClient
from echo.lobby.client.connecting import connect as connect
from echo.lobby.client.events import AuthRefused as AuthRefused
from echo.lobby.client.events import Event as Event
from echo.lobby.client.events import Left as Left
from echo.lobby.client.events import LobbyError as LobbyError
from echo.lobby.client.events import LobbyUnavailable as LobbyUnavailable
from echo.lobby.client.events import NoReply as NoReply
from echo.lobby.client.events import Reconnected as Reconnected
from echo.lobby.client.events import Rehomed as Rehomed
from echo.lobby.client.events import Resumed as Resumed
from echo.lobby.client.events import ResumeRefused as ResumeRefused
from echo.lobby.client.helpers import CONNECT_TIMEOUT as CONNECT_TIMEOUT
from echo.lobby.client.helpers import FAILOVER_WAIT as FAILOVER_WAIT
from echo.lobby.client.helpers import JOIN_RETRY_INTERVAL as JOIN_RETRY_INTERVAL
from echo.lobby.client.helpers import ONLY_HOME_RETRY as ONLY_HOME_RETRY
from echo.lobby.client.helpers import SEARCH_ALL_WAIT as SEARCH_ALL_WAIT
from echo.lobby.client.helpers import filters_from as filters_from
from echo.lobby.client.helpers import member_of as member_of
from echo.lobby.client.helpers import retry_after as retry_after
from echo.lobby.client.helpers import shuffled as shuffled
from echo.lobby.client.helpers import split_server as split_server

__all__ = [
    "CONNECT_TIMEOUT",
    "FAILOVER_WAIT",
    "JOIN_RETRY_INTERVAL",
    "ONLY_HOME_RETRY",
    "SEARCH_ALL_WAIT",
    "AuthRefused",
    "Event",
    "Left",
    "LobbyClient",
    "LobbyError",
    "LobbyUnavailable",
    "NoReply",
    "Reconnected",
    "Rehomed",
    "ResumeRefused",
    "Resumed",
    "connect",
    "filters_from",
    "member_of",
    "retry_after",
    "shuffled",
    "split_server",
]
