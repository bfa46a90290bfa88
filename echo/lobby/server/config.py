"""The lobby server's configuration (`LobbyServerConfig`) and its topics' names (what its
members agree with it on is `echo.lobby.agreement`'s).

Pure module: no trio, no clock.
"""

from __future__ import annotations

import attrs

from echo.lobby.agreement import (  # (re-exported: they were defined here)
    CHAT_LINE_OVERHEAD as CHAT_LINE_OVERHEAD,
)
from echo.lobby.agreement import CHAT_MAX_MESSAGE as CHAT_MAX_MESSAGE
from echo.lobby.agreement import code_home as code_home
from echo.lobby.agreement import code_walk as code_walk
from echo.lobby.agreement import lobby_channel_specs as lobby_channel_specs
from echo.lobby.identity import IdentityVerifier
from echo.lobby.limits import LobbyConfig
from echo.lobby.matchmaker import MatchRules
from echo.tickets import TicketKey

LISTINGS_TOPIC = "echo-lobby/listings"
GAMES_TOPIC = "echo-lobby/games"
RESULTS_TOPIC = "echo-lobby/results"
#: Buckets of the request-latency histograms, in seconds: a request is handled in tens of
#: microseconds to a few milliseconds (a join that updates a full lobby), unless the loop lags.
LATENCY_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


@attrs.frozen
class LobbyServerConfig:
    """Everything one lobby server needs besides its sockets' `ServerConfig`.

    server_id      this server's name on the ring and in listings; members reach it as
                   "host:port" (the all-clients port; the control port is port + 1 unless the
                   members' list says otherwise), so by default it is exactly that
    lobby_servers  every lobby server's id, this one included: the consistent-hashing ring
    topics         topic servers ("host:port") for listings and game-server announcements;
                   empty: no listings from others and no games
    seat_keys      the key every lobby server shares to sign seats (first signs); empty: a
                   random key of this process (seats then only work on this server)
    ticket_keys    the game servers' key for game tickets (first signs); empty: no starts.
                   Game results (`echo.lobby.results`) are checked with every one of them
    game_bench     how long a game server whose tickets the players report refused stays out
                   of rotation (seconds)
    identity       checks each member's identity token (a JWT from the game's backend:
                   `echo.lobby.identity`); None: development mode, a member is who it claims
    """

    lobby: LobbyConfig = attrs.Factory(LobbyConfig)
    server_id: str = ""
    lobby_servers: tuple[str, ...] = ()
    topics: tuple[str, ...] = ()
    seat_keys: tuple[TicketKey, ...] = ()
    seat_ttl: float = 24 * 3600.0
    ticket_keys: tuple[TicketKey, ...] = ()
    ticket_ttl: float = 30.0
    hello_timeout: float = 10.0
    listings_topic: str = LISTINGS_TOPIC
    games_topic: str = GAMES_TOPIC
    results_topic: str = RESULTS_TOPIC
    game_bench: float = 60.0
    listing_ttl: float = 10.0  # how long other servers keep our listings without a refresh
    listing_interval: float = 0.25  # changed listings are published this often
    game_ttl: float = 5.0
    updates_backlog: int = 1 << 20  # bytes of replies/updates waiting for one member: cut off
    chat_backlog: int = 16 * 1024  # bytes of chat waiting for one member: lines dropped for it
    topic_k: int = 3
    identity: IdentityVerifier | None = None
    # The matchmaker (echo.lobby.queues): its rules, and how often its queues are matched
    # while tickets wait (windows widen with time); an entry also wakes it at once.
    match_rules: MatchRules = attrs.Factory(MatchRules)
    match_interval: float = 0.25
