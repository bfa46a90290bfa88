"""The game in the loop: a lobby's game from `StartGame` to `GameEnded`, for `LobbyRegistry`.

- **Start** (the owner's `StartGame`): among the announced game servers in rotation whose tags
  match the start's filters (`echo.lobby.games`), the one with the most free slots; a match id
  is drawn; every connected member gets a `GameStarting` with everything its client needs to
  connect (address, control port, duologue-port mode) and a ticket naming the match, the
  roster (every seat with its attributes) and the lobby's metadata (`echo.tickets`). The lobby
  locks.
- **While it runs** (at most `LobbyConfig.game_life`): a member of the roster still seated
  (its process crashed and resumed its seat, or its ticket expired) asks `RequestTicket` and
  gets a fresh `GameStarting` for the same game; members who find the game server refusing
  their tickets say so (`ReportGameServer`): once half of the game's ticket holders (at least
  one) have, that server is out of rotation (`GameServerDirectory.bench`) and the game ends.
- **End**: the game server's signed result (`echo.lobby.results`, checked by the driver), the
  game's life running out, the report above, or the owner starting the next game while one
  still runs (``{"error": "restarted"}``): the lobby unlocks, every ready state is reset,
  and the members get one `GameEnded` (one version) with the result.

The functions here are the registry's (they take it as their first argument and use its
helpers); state.py dispatches to them. Pure module: no trio, no clock.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import TYPE_CHECKING

import attrs

from echo.lobby.protocol import (
    ErrorCode,
    FreeSlots,
    GameDetails,
    GameEnded,
    GameStarting,
    LockChanged,
    NumberRange,
    ReportGameServer,
    RequestTicket,
    StartGame,
    StringEquals,
    Value,
)
from echo.tickets.core import RosterEntry, TicketError

if TYPE_CHECKING:
    from echo.lobby.state import LobbyRegistry, _Lobby

#: The result of a game the lobby ended itself.
TIMED_OUT = "timed_out"
SERVER_REFUSED = "game_server_refused"
RESTARTED = "restarted"


def random_match_id() -> int:
    """A random nonzero 63-bit match id."""
    return secrets.randbits(63) | 1


@attrs.define
class RunningGame:
    """A lobby's game between its start and its end."""

    match_id: int
    server_id: str
    address: str
    control_port: int
    duologue_ports: str
    roster: tuple[RosterEntry, ...]
    metadata: dict[str, Value]
    until: float  # the end of its life (the registry's clock)
    holders: set[str]  # members who were given a ticket
    reporters: set[str] = attrs.Factory(set)  # members who reported its server refusing them
    server_key: bytes = b""  # the game server's announced public key (b"": none)


def start(reg: LobbyRegistry, member_id: str, req: StartGame, now: float) -> None:
    """The owner starts the game (see the module's docstring); raises the registry's refusal
    before any change."""
    from echo.lobby.state import _refuse

    reg._rate(member_id, "update", reg.config.update_limit, now)
    lobby = reg._owned(member_id, req.lobby_id)
    connected = lobby.connected()
    if reg.config.start_requires_ready:
        waiting = [m.member_id for m in connected if not m.ready and m.member_id != member_id]
        if waiting:
            _refuse(ErrorCode.NOT_READY, f"not ready: {', '.join(sorted(waiting)[:5])}")
    wanted = _wanted_tags(req)
    if reg._games is None or reg._tickets is None:
        _refuse(ErrorCode.NO_GAME_SERVER, "this lobby server starts no games")
    server = reg._games.choose(len(lobby.members), now, wanted)
    if server is None:
        tags = ", ".join(f"{k}={v}" for k, v in wanted)
        _refuse(
            ErrorCode.NO_GAME_SERVER,
            f"no game server{' tagged ' + tags if tags else ''} has room for this lobby",
        )
    game = RunningGame(
        match_id=reg._new_match_id(),
        server_id=server.server_id,
        address=server.address,
        control_port=server.control_port,
        duologue_ports=server.duologue_ports,
        roster=tuple(RosterEntry(m.member_id, dict(m.attributes)) for m in lobby.members.values()),
        metadata=dict(lobby.metadata),
        until=now + reg.config.game_life,
        holders={m.member_id for m in connected},
        server_key=server.public_key,
    )
    try:
        starts = [
            (m.member_id, _starting(reg, lobby.lobby_id, game, m.member_id)) for m in connected
        ]
    except TicketError as error:
        _refuse(ErrorCode.TICKET_TOO_LARGE, f"the game's tickets do not fit: {error}")
    # Nothing refuses from here on.
    if lobby.game is not None:
        # A start while a game runs (its server died without a result, say): the owner's
        # call. That game ends first; a late result for it finds no game running.
        end(reg, lobby, {"error": RESTARTED})
    reg._games.reserve(server.server_id, len(lobby.members))
    if not lobby.locked:
        reg._unindex(lobby)
        lobby.locked = True
        reg._index_lobby(lobby)
        reg._broadcast(lobby, lambda v: LockChanged(lobby.lobby_id, v, True))
    lobby.game = game
    reg._game_deadlines[lobby.lobby_id] = game.until
    for to, message in starts:
        reg._send((to,), message)
    reg.counters["games_started"] += 1
    reg.counters["tickets_issued"] += len(starts)


def _wanted_tags(req: StartGame) -> tuple[tuple[str, str], ...]:
    from echo.lobby.state import _refuse

    wanted: list[tuple[str, str]] = []
    for f in req.filters:
        if isinstance(f, StringEquals):
            wanted.append((f.key, f.value))
        elif isinstance(f, NumberRange | FreeSlots):
            _refuse(ErrorCode.FILTER_INVALID, "a start filters game servers' tags by equality")
    return tuple(wanted)


def _starting(reg: LobbyRegistry, lobby_id: int, game: RunningGame, member_id: str) -> GameStarting:
    assert reg._tickets is not None
    ticket = reg._tickets.issue(
        lobby_id,
        member_id,
        game.server_id,
        match_id=game.match_id,
        roster=game.roster,
        metadata=game.metadata,
    )
    details = GameDetails(game.match_id, game.control_port, game.duologue_ports, game.server_key)
    return GameStarting(lobby_id, game.server_id, game.address, ticket, details)


def _running(
    reg: LobbyRegistry, member_id: str, lobby_id: int, now: float
) -> tuple[_Lobby, RunningGame]:
    from echo.lobby.state import _refuse

    lobby, _ = reg._membership(member_id, lobby_id)
    game = lobby.game
    if game is None or now >= game.until:
        _refuse(ErrorCode.NO_GAME, "this lobby's game is not running")
    if all(entry.member_id != member_id for entry in game.roster):
        _refuse(ErrorCode.NO_GAME, "not a player of this lobby's game (joined after its start)")
    return lobby, game


def request_ticket(reg: LobbyRegistry, member_id: str, req: RequestTicket, now: float) -> None:
    """A fresh ticket for the running game, to a member of its roster."""
    reg._rate(member_id, "update", reg.config.update_limit, now)
    lobby, game = _running(reg, member_id, req.lobby_id, now)
    message = _starting(reg, lobby.lobby_id, game, member_id)
    game.holders.add(member_id)
    reg._send((member_id,), message)
    reg.counters["tickets_reissued"] += 1


def report_server(reg: LobbyRegistry, member_id: str, req: ReportGameServer, now: float) -> None:
    """A member's word that its game's server refused its ticket."""
    from echo.lobby.state import _refuse

    reg._rate(member_id, "update", reg.config.update_limit, now)
    lobby, game = _running(reg, member_id, req.lobby_id, now)
    if req.server_id != game.server_id:
        _refuse(ErrorCode.BAD_REQUEST, "that is not the game server of this lobby's game")
    if member_id not in game.holders:
        _refuse(ErrorCode.NO_GAME, "no ticket of this game was given to this member")
    game.reporters.add(member_id)
    reg.counters["game_server_reports"] += 1
    if 2 * len(game.reporters) >= len(game.holders):
        assert reg._games is not None
        reg._games.bench(game.server_id, now)
        reg.counters["game_servers_benched"] += 1
        end(reg, lobby, {"error": SERVER_REFUSED, "server_id": game.server_id})


def end(reg: LobbyRegistry, lobby: _Lobby, result: Mapping[str, Value]) -> None:
    """End `lobby`'s game with `result`: unlock, reset every ready state, one GameEnded."""
    game = lobby.game
    if game is None:
        return
    lobby.game = None
    reg._game_deadlines.pop(lobby.lobby_id, None)
    if lobby.locked:
        reg._unindex(lobby)
        lobby.locked = False
        reg._index_lobby(lobby)
    for m in lobby.members.values():
        m.ready = False
    reg.counters["games_ended"] += 1
    reg._broadcast(lobby, lambda v: GameEnded(lobby.lobby_id, v, game.match_id, dict(result)))


def expire(reg: LobbyRegistry, now: float) -> None:
    """End the games whose life ran out."""
    for lobby_id, until in list(reg._game_deadlines.items()):
        if until <= now:
            lobby = reg._lobbies.get(lobby_id)
            if lobby is None:
                del reg._game_deadlines[lobby_id]
                continue
            reg.counters["games_timed_out"] += 1
            end(reg, lobby, {"error": TIMED_OUT})


def game_result(
    reg: LobbyRegistry,
    lobby_id: int,
    match_id: int,
    server_id: str,
    result: Mapping[str, Value],
) -> str:
    """A game server's result (its signature already checked): "ended" if it ended the
    lobby's running game, else why it was ignored ("no_lobby": not here; "not_running": no
    such game running, e.g. a repeat of a result already applied; "wrong_server")."""
    lobby = reg._lobbies.get(lobby_id)
    if lobby is None:
        return "no_lobby"
    game = lobby.game
    if game is None or game.match_id != match_id:
        return "not_running"
    if game.server_id != server_id:
        return "wrong_server"
    end(reg, lobby, result)
    return "ended"
