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
- **Its home dies** (`adopt_copy`, called by the re-creation of the lobby from its members'
  copies, `echo.lobby.state.recreate`): each member's copy carries the last ticket it was
  given and what was left of the game's life (`GameCopy`; the life comes to each member in a
  `GameLife` after each `GameStarting`). The ticket is signed with the game
  servers' key, which every lobby server holds, so the next server believes the game server,
  the match, the roster and the metadata from it, and nothing else: the game server's address,
  ports and key come from its own announcements. The re-created lobby runs the same game: a
  member of the roster gets fresh tickets there, and the game server's result ends it there.
  A result that arrives before the lobby does (the members are still on their way) is held
  for `LobbyConfig.result_hold` seconds (`game_result`), and ends the game once every member
  of the copies is back, or at the end of the re-creation window (`apply_held`).

The functions here are the registry's (they take it as their first argument and use its
helpers); state.py dispatches to them. Pure module: no trio, no clock.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping
from typing import TYPE_CHECKING

import attrs

from echo.lobby.protocol import (
    U32_MAX,
    ErrorCode,
    FreeSlots,
    GameCopy,
    GameDetails,
    GameEnded,
    GameLife,
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
#: How many of a lobby's last ended games it remembers, so that no copy brings one back.
_ENDED_KEPT = 4


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
    # Re-created from members' copies: the highest version of a copy that carried it.
    copy_version: int = 0


@attrs.frozen
class HeldResult:
    """A game server's result for a lobby that is not (yet) here, kept for its re-creation."""

    match_id: int
    server_id: str
    result: Mapping[str, Value]
    until: float


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
            (m.member_id, _starting(reg, lobby.lobby_id, game, m.member_id, now))
            for m in connected
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
        reg._send((to,), _life(lobby.lobby_id, game, now))
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


def _starting(
    reg: LobbyRegistry, lobby_id: int, game: RunningGame, member_id: str, now: float
) -> GameStarting:
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


def _life(lobby_id: int, game: RunningGame, now: float) -> GameLife:
    """What follows each GameStarting: the game's life left (rounded up, so that the copies
    never shorten it; at least 1 ms)."""
    life_ms = min(U32_MAX, max(1, math.ceil((game.until - now) * 1000)))
    return GameLife(lobby_id, game.match_id, life_ms)


def _locate(reg: LobbyRegistry, game: RunningGame, now: float) -> bool:
    """Does `game` know where its server admits players? A game re-created from copies learns
    it from that server's announcements here (never from a copy: a member's word)."""
    if game.address:
        return True
    server = None if reg._games is None else reg._games.get(game.server_id, now)
    if server is None:
        return False
    game.address = server.address
    game.control_port = server.control_port
    game.duologue_ports = server.duologue_ports
    game.server_key = server.public_key
    return True


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
    from echo.lobby.state import _refuse

    reg._rate(member_id, "update", reg.config.update_limit, now)
    lobby, game = _running(reg, member_id, req.lobby_id, now)
    if reg._tickets is None:
        _refuse(ErrorCode.NO_GAME_SERVER, "this lobby server holds no ticket key")
    if not _locate(reg, game, now):
        _refuse(
            ErrorCode.NO_GAME_SERVER,
            f"this game's server {game.server_id} is not announced here (yet)",
        )
    message = _starting(reg, lobby.lobby_id, game, member_id, now)
    game.holders.add(member_id)
    reg._send((member_id,), message)
    reg._send((member_id,), _life(lobby.lobby_id, game, now))
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
    # (a copy of it still on its way, from a member of its re-created lobby, is stale)
    lobby.ended_matches = [*lobby.ended_matches[-(_ENDED_KEPT - 1) :], game.match_id]
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
    now: float,
) -> str:
    """A game server's result (its signature already checked): "ended" if it ended the
    lobby's running game; "held" if the lobby is not here, or is being re-created here
    without that game so far: its members may be re-creating it here from their copies (its
    home died), and the result ends the game when it comes (`adopt_copy`); else why it was
    ignored ("not_running": no such game running, e.g. a repeat of a result already applied;
    "wrong_server")."""
    lobby = reg._lobbies.get(lobby_id)
    game = None if lobby is None else lobby.game
    if lobby is None or game is None or game.match_id != match_id:
        recovering = lobby is not None and (
            lobby.recreated_until is not None and now <= lobby.recreated_until
        )
        if lobby is None or recovering:
            _hold(reg, lobby_id, HeldResult(match_id, server_id, dict(result), now))
            return "held"
        return "not_running"
    if game.server_id != server_id:
        return "wrong_server"
    end(reg, lobby, result)
    return "ended"


def _hold(reg: LobbyRegistry, lobby_id: int, held: HeldResult) -> None:
    """Keep `held` (its `until` is when it came) for `result_hold` seconds (`due_held` lets
    go of it then); the oldest go first beyond `max_held_results`. Every lobby server hears
    every result (the results topic), so each holds those of lobbies it does not hold:
    bounded, and short-lived."""
    results = reg._held_results
    now = held.until
    results.pop(lobby_id, None)  # (a repeat, or a later game's: the latest counts)
    while results and len(results) >= reg.config.max_held_results:
        del results[next(iter(results))]
    results[lobby_id] = attrs.evolve(held, until=now + reg.config.result_hold)


def due_held(reg: LobbyRegistry, now: float) -> None:
    """The held results whose time ran out: one whose game the lobby's copies brought here
    ends it now (the members who were to come had the re-creation window: `apply_held`);
    the others are forgotten."""
    results = reg._held_results
    for lobby_id in [i for i, h in results.items() if h.until <= now]:
        lobby = reg._lobbies.get(lobby_id)
        if lobby is not None:
            apply_held(reg, lobby, now, due=True)
        results.pop(lobby_id, None)


def next_held(reg: LobbyRegistry) -> float | None:
    """When `due_held` next has work."""
    return min((h.until for h in reg._held_results.values()), default=None)


# --- the running game in the members' copies (a lobby re-created after its home died) ------


def game_of_copy(
    reg: LobbyRegistry, lobby_id: int, member_id: str, copy: GameCopy, version: int, now: float
) -> RunningGame | None:
    """The game a member's copy (of `version`) carries, if any: believed only from a ticket
    signed with our ticket keys, for this lobby and this member, of a game (a match id); its
    life is what the copy says was left, at most `game_life`. A copy that does not qualify is
    counted (``game_copies_refused``) and the lobby is re-created without it."""
    if copy == GameCopy():
        return None
    claims = None if reg._tickets is None else reg._tickets.claims(copy.ticket)
    if (
        claims is None
        or claims.lobby_id != lobby_id
        or claims.member_id != member_id
        or claims.match_id == 0
        or copy.life_ms <= 0
    ):
        reg.counters["game_copies_refused"] += 1
        return None
    game = RunningGame(
        match_id=claims.match_id,
        server_id=claims.server_id,
        address="",
        control_port=0,
        duologue_ports="per-client",
        roster=claims.roster,
        metadata=dict(claims.metadata),
        until=now + min(copy.life_ms / 1000, reg.config.game_life),
        holders={member_id},
        copy_version=version,
    )
    _locate(reg, game, now)
    return game


def adopt_copy(
    reg: LobbyRegistry,
    lobby: _Lobby,
    game: RunningGame | None,
    version: int,
    locked: bool,
    now: float,
) -> None:
    """Merge one member's copy of the game (`game_of_copy`; None: its copy carried none) into
    the re-created `lobby` (the merge's rule 7, `echo.lobby.state.recreate`):

    - a copy's game is the lobby's unless a copy of a higher version came unlocked and
      without a game (that member saw the game end: `GameEnded` unlocks the lobby and takes
      a version; a member who never held a ticket sends no game, but its copy stays locked);
    - a copy of a game that already ended here (its result came first) is stale;
    - copies of the same match add their senders to its ticket holders; a copy of another
      match replaces the game only if it is of a higher version (the owner started a new game:
      the end of the old one took a version), else the first one stays.

    A result held for this lobby's game ends it once the members have the lobby
    (`apply_held`)."""
    if game is None:
        if not locked:
            lobby.gameless_version = max(lobby.gameless_version, version)
            if lobby.game is not None and lobby.game.copy_version < version:
                _drop(reg, lobby)
        return
    if game.copy_version < lobby.gameless_version or game.match_id in lobby.ended_matches:
        reg.counters["game_copies_stale"] += 1
        return
    current = lobby.game
    if current is not None and current.match_id == game.match_id:
        current.holders |= game.holders
        current.copy_version = max(current.copy_version, game.copy_version)
        return
    if current is not None and current.copy_version >= game.copy_version:
        reg.counters["game_copies_stale"] += 1
        return
    if current is None:
        reg.counters["games_recreated"] += 1
    lobby.game = game
    reg._game_deadlines[lobby.lobby_id] = game.until


def apply_held(reg: LobbyRegistry, lobby: _Lobby, now: float, *, due: bool = False) -> None:
    """End the re-created lobby's game with the result held for it (`game_result`), if any,
    once every seat of the copies has arrived (so that every member hears its `GameEnded`:
    one who arrives later gets the lobby's state, never the result), or at the end of the
    re-creation window (`due`: the members still away crashed with their home). Called
    after the members' snapshot, so that the `GameEnded` is their next version."""
    held = reg._held_results.get(lobby.lobby_id)
    game = lobby.game
    if held is None or game is None or held.match_id != game.match_id:
        return
    if not due and not all(m.arrived for m in lobby.members.values()):
        # Due at the window's end at the latest (its own time too, if that is sooner).
        if lobby.recreated_until is not None:
            reg._held_results[lobby.lobby_id] = attrs.evolve(
                held, until=min(held.until, lobby.recreated_until)
            )
        return
    del reg._held_results[lobby.lobby_id]
    outcome = game_result(reg, lobby.lobby_id, held.match_id, held.server_id, held.result, now)
    reg.counters[f"game_results_{outcome}"] += 1
    reg.counters["game_results_applied_late"] += 1


def _drop(reg: LobbyRegistry, lobby: _Lobby) -> None:
    """Forget the lobby's game without a word: a newer copy says its members saw it end."""
    lobby.game = None
    reg._game_deadlines.pop(lobby.lobby_id, None)
