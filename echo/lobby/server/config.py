"""The lobby server's configuration (`LobbyServerConfig`) and what its members agree with it
on: the logical channels and their sizes, the topics' names, the server a join code lives
on.

Pure module: no trio, no clock.
"""

from __future__ import annotations

import attrs

from echo.channels import ChannelSpec
from echo.lobby.identity import IdentityVerifier
from echo.lobby.limits import LobbyConfig
from echo.lobby.matchmaker import MatchRules
from echo.lobby.protocol import (
    MAX_MESSAGE_BYTES,
    Channel,
)
from echo.tickets import TicketKey
from echo.topics.ring import HashRing

LISTINGS_TOPIC = "echo-lobby/listings"
GAMES_TOPIC = "echo-lobby/games"
RESULTS_TOPIC = "echo-lobby/results"
#: Buckets of the request-latency histograms, in seconds: a request is handled in tens of
#: microseconds to a few milliseconds (a join that updates a full lobby), unless the loop lags.
LATENCY_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


#: The largest message on the chat channel, either way: the server's whole chat buffer (a
#: larger SendChat could never be guaranteed there). Declared, it lets a member hand back
#: chat credit once a quarter of its 16 KiB is read instead of after every line: one datagram
#: to the server per chat line delivered was as many as the deliveries themselves.
CHAT_MAX_MESSAGE = 2048
#: A ChatLine's bytes besides its member id and text: type, lobby id, str8 and str16 lengths.
CHAT_LINE_OVERHEAD = 1 + 8 + 1 + 2


def lobby_channel_specs(*, server: bool) -> list[ChannelSpec]:
    """The lobby's logical channels. Capacities are each side's receive buffers: the server
    takes requests up to the largest message (a recreate carries a whole lobby) and hardly
    anything on the updates channel (members send nothing there); chat holds a few lines, so a
    flood runs out of credit at once. Chat has the lowest priority on the wire, and a bound on
    its messages (`CHAT_MAX_MESSAGE`)."""
    if server:
        caps = {Channel.REQUESTS: MAX_MESSAGE_BYTES, Channel.UPDATES: 1024, Channel.CHAT: 2048}
    else:
        caps = {
            Channel.REQUESTS: MAX_MESSAGE_BYTES,
            Channel.UPDATES: MAX_MESSAGE_BYTES,
            Channel.CHAT: 16 * 1024,
        }
    return [
        ChannelSpec(Channel.REQUESTS, capacity=caps[Channel.REQUESTS], priority=0),
        ChannelSpec(Channel.UPDATES, capacity=caps[Channel.UPDATES], priority=0),
        ChannelSpec(
            Channel.CHAT, capacity=caps[Channel.CHAT], priority=1, max_message=CHAT_MAX_MESSAGE
        ),
    ]


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


def code_home(ring: HashRing, code: str) -> str:
    """The lobby server a join code was made on (codes are chosen to land on their server)."""
    return ring.servers_for(f"code:{code}", 1)[0]


def code_walk(ring: HashRing, code: str, n: int) -> list[str]:
    return ring.servers_for(f"code:{code}", n)
