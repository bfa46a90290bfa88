"""The lobby server: one trio driver around `LobbyRegistry`.

A `SessionServer` application. Each member's session starts with the hello of
`echo.lobby.hello` (who it is; its seat if it sits in a lobby here), then carries the lobby's
three logical channels (`echo.lobby.protocol.Channel`): requests and replies, state updates,
chat. All registry calls happen in this one trio thread with ``now = trio.current_time()``.

Why the pieces are shaped as they are:

- **Chat never delays state.** A member's outgoing messages are queued on their own logical
  channel (`Channel.send_nowait`, which waits for nothing), and each channel goes out under its
  own credit: a chat channel waiting for a slow member's credit never holds up its updates.
  No task per member and channel: a delivery is one enqueue (`send_nowait(defer=True)`), and
  once a request is handled each member it touched gets what was queued for it in one session
  message, sent from the request's own task (`Channels.flush_nowait`); the session's channel
  writer takes over only under back pressure (at L1's 8,000 members a writer task per channel
  was 24,000 tasks, and three task switches per message delivered; waking the one writer per
  member and message was still more than the send). A member's
  incoming chat is read at its chat rate (the registry's `chat_limit`): while the reader
  waits, that channel's guarantees run out and the flooding member's `send` is held back by
  credit (echo.channels), on its own channel only.
- **A slow member does not slow the others.** Sending to a member never blocks the driver: a
  chat line that finds `chat_backlog` bytes waiting for that member is dropped for it
  (counted); an update that finds `updates_backlog` closes its session (it comes back with a
  snapshot: updates carry versions).
- **Reconnection.** A dropped session leaves the seat RECONNECTING for the grace period
  (`LobbyConfig.reconnect_grace`); a new session of the member with its seat takes it back,
  and so does one from the very client that was seated (its hello secret, `SeatBindings`),
  which may never have learned its seat: the LobbyJoined that carried it was lost. Every
  session that takes a seat is sent a LobbyJoined (request id 0) with its seat again.
- **Many servers.** The server only creates lobbies (and join codes) whose home is itself on
  the consistent-hashing ring of the lobby-server list, so members find a lobby's home from its
  id alone. Listings go out on a topic (soft state, refreshed) and other servers' listings come
  in, so a search sees every server; game servers' announcements come in on another topic.
- **Bad input** is a `Refusal` with a code (undecodable bytes: BAD_REQUEST), counted; it never
  raises here.

The package's modules, by concern: `config` (`LobbyServerConfig`, the channels, the topics'
names, a code's server), `base` (the fields and a member's connection), `routing` (requests
and deliveries), `sessions` (a member's session from its hello), `replication` (timers and
topics, and the game server's side of the topics) and `app` (`LobbyServer`). Every public
name is imported from here.
"""

from __future__ import annotations

from echo.lobby.server.app import LobbyServer as LobbyServer
from echo.lobby.server.base import _Conn as _Conn
from echo.lobby.server.config import CHAT_LINE_OVERHEAD as CHAT_LINE_OVERHEAD
from echo.lobby.server.config import CHAT_MAX_MESSAGE as CHAT_MAX_MESSAGE
from echo.lobby.server.config import GAMES_TOPIC as GAMES_TOPIC
from echo.lobby.server.config import LATENCY_BUCKETS as LATENCY_BUCKETS
from echo.lobby.server.config import LISTINGS_TOPIC as LISTINGS_TOPIC
from echo.lobby.server.config import RESULTS_TOPIC as RESULTS_TOPIC
from echo.lobby.server.config import LobbyServerConfig as LobbyServerConfig
from echo.lobby.server.config import code_home as code_home
from echo.lobby.server.config import code_walk as code_walk
from echo.lobby.server.config import lobby_channel_specs as lobby_channel_specs
from echo.lobby.server.replication import announce_game_server as announce_game_server
from echo.lobby.server.replication import report_game_result as report_game_result

__all__ = [
    "CHAT_LINE_OVERHEAD",
    "CHAT_MAX_MESSAGE",
    "GAMES_TOPIC",
    "LATENCY_BUCKETS",
    "LISTINGS_TOPIC",
    "RESULTS_TOPIC",
    "LobbyServer",
    "LobbyServerConfig",
    "announce_game_server",
    "code_home",
    "code_walk",
    "lobby_channel_specs",
    "report_game_result",
]
