"""The lobby registry (`LobbyRegistry`): its constructor, queries and entry points, and the
dispatch of a request to the operation that handles it. Each module of this package adds
one concern (`checks`, `search`, `members`, `ops`, `recreate`) on top of the one below.

Pure module: no trio, no clock.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping

import attrs
import structlog

from echo.lobby import gameloop
from echo.lobby.gameloop import HeldResult, RunningGame, random_match_id
from echo.lobby.games import GameServerDirectory
from echo.lobby.heldchat import HeldChat
from echo.lobby.limits import LobbyConfig, TokenBucket
from echo.lobby.listings import ListingBoard, ListingGone
from echo.lobby.protocol import (
    BanMember,
    CreateLobby,
    Done,
    ErrorCode,
    JoinByCode,
    JoinLobby,
    KickMember,
    LeaveLobby,
    LeaveReason,
    LobbyJoined,
    LobbyListing,
    LobbySnapshot,
    Presence,
    PresenceChanged,
    QuickJoin,
    RecreateLobby,
    Refusal,
    Reply,
    ReportGameServer,
    Request,
    RequestTicket,
    SearchLobbies,
    SeatTags,
    SendChat,
    SetAttributes,
    SetLocked,
    SetMetadata,
    SetReady,
    StartGame,
    TransferOwner,
    Value,
)
from echo.lobby.search_index import SearchIndex
from echo.lobby.state.checks import BUCKET_SWEEP_S
from echo.lobby.state.records import (
    Handled,
    Seats,
    Send,
    Tickets,
    _Lobby,
    _Member,
    _Refuse,
    _refuse,
    _same_tags,
    random_join_code,
    random_lobby_id,
)
from echo.lobby.state.recreate import _Recreate

log = structlog.get_logger("echo.lobby")


class LobbyRegistry(_Recreate):
    """Every lobby of one lobby server, with its members, limits and counters."""

    def __init__(
        self,
        config: LobbyConfig | None = None,
        *,
        new_lobby_id: Callable[[], int] = random_lobby_id,
        new_join_code: Callable[[], str] = random_join_code,
        seats: Seats | None = None,
        games: GameServerDirectory | None = None,
        tickets: Tickets | None = None,
        server_id: str = "",
        board: ListingBoard | None = None,
        new_match_id: Callable[[], int] = random_match_id,
    ) -> None:
        self.config = config or LobbyConfig()
        self._new_match_id = new_match_id
        self._game_deadlines: dict[int, float] = {}  # lobby id -> the end of its game's life
        # Game results for lobbies not here (yet): their members may re-create them here.
        self._held_results: dict[int, HeldResult] = {}
        # With seats, every LobbyJoined carries one, and a copy is recreated only by a member
        # showing a valid seat for that lobby: without them a copy is the sender's word.
        self._seats = seats
        # Without both, this lobby server starts no games (NO_GAME_SERVER).
        self._games = games
        self._tickets = tickets
        # This server's id (the `home` of its listings), and the other servers' listings
        # that its searches include.
        self.server_id = server_id
        self._board = board
        self._published: dict[int, int] = {}  # lobby id -> version last given to the topic
        self._new_lobby_id = new_lobby_id
        self._new_join_code = new_join_code
        self._lobbies: dict[int, _Lobby] = {}
        self._by_code: dict[str, int] = {}
        self._where: dict[str, int] = {}  # member id -> the lobby it is in
        # The listed lobbies' listings (public, unlocked, not ghosts), kept in step by every
        # change that lists, unlists or alters one: search and quick-join narrow by it, and a
        # page is a walk from the cursor that stops after `limit` matches.
        self._index = SearchIndex()
        self._buckets: dict[tuple[str, str], TokenBucket] = {}
        self._bucket_sweep_at: float | None = None  # the next look for full buckets
        self._reconnecting: dict[str, float] = {}  # member id -> end of its grace period
        # Chat said while a seated member was away, for its return (echo.lobby.heldchat).
        self.held_chat = HeldChat(self.config.held_chat_bytes)
        self.refusals: Counter[ErrorCode] = Counter()
        self.counters: Counter[str] = Counter()
        # Filled while one operation runs; handed out in its result.
        self._out: list[Send] = []
        self._secret = b""  # the hello secret of the session of the request being handled

    # --- queries (for the driver, tests and the topics listing) --------------------------------

    def lobby_ids(self) -> list[int]:
        return sorted(self._lobbies)

    def snapshot(self, lobby_id: int) -> LobbySnapshot | None:
        lobby = self._lobbies.get(lobby_id)
        return None if lobby is None else lobby.snapshot()

    def lobby_of(self, member_id: str) -> int | None:
        return self._where.get(member_id)

    def member_count(self, lobby_id: int) -> int | None:
        """How many members the lobby has; None if no such lobby (it was deleted)."""
        lobby = self._lobbies.get(lobby_id)
        return None if lobby is None else len(lobby.members)

    def census(self) -> tuple[dict[str, int], dict[Presence, int]]:
        """Lobbies by state ("listed", "private", "locked": a locked lobby counts as locked
        whatever its visibility) and their seats by presence: one pass over every lobby,
        for the metrics (a scrape every few seconds: 0.5 ms for 8,000 seats, measured)."""
        listed = private = locked = seats = connected = 0
        here = Presence.CONNECTED
        for lobby in self._lobbies.values():
            if lobby.locked:
                locked += 1
            elif lobby.private:
                private += 1
            else:
                listed += 1
            members = lobby.members
            seats += len(members)
            for member in members.values():
                if member.presence is here:
                    connected += 1
        lobbies = {"listed": listed, "private": private, "locked": locked}
        return lobbies, {here: connected, Presence.RECONNECTING: seats - connected}

    def __len__(self) -> int:
        return len(self._lobbies)

    def listing(self, lobby_id: int) -> LobbyListing | None:
        lobby = self._lobbies.get(lobby_id)
        return None if lobby is None else self._listing(lobby)

    def listing_changes(self) -> tuple[list[LobbyListing], list[ListingGone]]:
        """What to publish on the listings topic since the last call: the listed lobbies that
        changed (or are new) and those no longer listed (deleted, locked, made private)."""
        changed: list[LobbyListing] = []
        for listing in self._index.listings():
            lobby_id = listing.lobby_id
            version = self._lobbies[lobby_id].version
            if self._published.get(lobby_id) != version:
                self._published[lobby_id] = version
                changed.append(listing)
        gone: list[ListingGone] = []
        listed = self._index
        for lobby_id in [i for i in self._published if i not in listed]:
            del self._published[lobby_id]
            gone.append(ListingGone(lobby_id, self.server_id))
        return changed, gone

    def listings(self) -> list[LobbyListing]:
        """Every listed lobby: the periodic refresh that keeps the soft state alive."""
        return list(self._index.listings())

    def holds_secret(self, member_id: str, secret: bytes) -> bool:
        """Does `secret` (a hello's) match a tag of the seat `member_id` holds here? Then it is
        the client that was seated (here, or on the server the lobby was re-created from),
        which may never have learned its seat."""
        lobby = self._lobby_of_member(member_id)
        return lobby is not None and self._tag_holds(lobby, lobby.members[member_id], secret)

    def bind_secret(self, member_id: str, secret: bytes) -> tuple[Send, ...]:
        """A session with `secret` took `member_id`'s seat (a hello with its seat or secret):
        the seat is now that client's, here and, through the members' copies, on the next
        server; its previous client's secret no longer takes it. A client without a secret
        (from before secrets) leaves the tags as they were."""
        lobby = self._lobby_of_member(member_id)
        if lobby is None or self._seats is None or not secret:
            return ()
        seat = lobby.members[member_id]
        tags = {member_id: self._seats.tag(lobby.lobby_id, member_id, secret)}
        if _same_tags(seat.tags, tags):
            return ()
        seat.tags = tags
        return (Send(lobby.audience(), self._seat_tags(lobby, member_id)),)

    def seat_tags(self, lobby_id: int) -> SeatTags | None:
        lobby = self._lobbies.get(lobby_id)
        return None if lobby is None else self._seat_tags(lobby)

    def next_deadline(self) -> float | None:
        """When `expire` next has work: the earliest end of a reconnection grace period, of a
        game's life, or of a held game result's time (`echo.lobby.gameloop.due_held`), or the
        next look for rate buckets that are full again (every `BUCKET_SWEEP_S` while any are
        kept: a server that never looked would keep one per member it ever rate-checked)."""
        held = gameloop.next_held(self)
        sweep = self._bucket_sweep_at
        return (
            min(
                min(self._reconnecting.values(), default=math.inf),
                min(self._game_deadlines.values(), default=math.inf),
                math.inf if held is None else held,
                math.inf if sweep is None else sweep,
            )
            if self._reconnecting or self._game_deadlines or held is not None or sweep is not None
            else None
        )

    # --- entry points --------------------------------------------------------------------------

    def handle(
        self, member_id: str, request: Request, now: float, *, secret: bytes = b""
    ) -> Handled:
        """Apply one request from `member_id`. Never raises for a bad request.

        `secret` is the hello secret of the session the request came on (empty: none): a seat
        taken by this request is tagged with it, and it claims a seat that a re-created lobby
        keeps for this member if the copies tagged that seat with it."""
        self._out = []
        self._secret = secret
        try:
            reply = self._dispatch(member_id, request, now)
        except _Refuse as refused:
            self._secret = b""
            self.refusals[refused.code] += 1
            log.debug(
                "lobby_request_refused",
                member_id=member_id,
                request=type(request).__name__,
                code=refused.code.name,
                reason=refused.message,
            )
            # Validation refuses before changing anything, so nothing was queued to send.
            assert not self._out, "a refusal after a state change"
            return Handled(Refusal(request.request_id, refused.code, refused.message), ())
        sends, self._out = tuple(self._out), []
        self._secret = b""
        if isinstance(reply, LobbyJoined) and self._seats is not None:
            reply = attrs.evolve(reply, seat=self._seats.issue(reply.lobby_id, member_id))
        return Handled(reply, sends)

    def seat_match(
        self,
        members: Mapping[str, bytes],
        now: float,
        *,
        name: str,
        metadata: Mapping[str, Value],
        ready: bool = False,
    ) -> tuple[int, tuple[Send, ...]]:
        """A lobby for a match the matchmaker formed (`echo.lobby.queues`): every member
        (its hello secret, for its seat's tag) seated at once, the first the owner, each
        leaving the lobby it was in here. Private (only its members know it) and exactly
        full. Never refuses: the matchmaker checked the sizes (ValueError if it did not)."""
        if not 1 <= len(members) <= 0xFFFF or len(self._lobbies) >= self.config.max_lobbies:
            raise ValueError("no room for this match's lobby")
        self._out = []
        for member_id in members:
            lobby = self._lobby_of_member(member_id)
            if lobby is not None:
                self._remove(lobby, member_id, LeaveReason.LEFT, now)
        lobby_id = self._fresh_lobby_id()
        seats = {}
        for seq, (member_id, secret) in enumerate(members.items()):
            self._secret = secret
            tags = self._own_tags(lobby_id, member_id)
            seats[member_id] = _Member(member_id, seq, ready=ready, tags=tags)
            self._where[member_id] = lobby_id
        self._secret = b""
        lobby = _Lobby(lobby_id=lobby_id, name=name, max_members=len(members), private=True,
                       join_code=self._fresh_code(), locked=False, owner=next(iter(members)),
                       metadata=dict(metadata), bans=[], members=seats, version=1,
                       next_join_seq=len(members))  # fmt: skip
        self._add_lobby(lobby)
        self.counters["lobbies_matched"] += 1
        self._send_state(lobby.audience(), lobby)
        return lobby_id, self._take_out()

    def disconnected(self, member_id: str, now: float) -> tuple[Send, ...]:
        """The member's session dropped: keep its seat as RECONNECTING for the grace period."""
        self._out = []
        lobby = self._lobby_of_member(member_id)
        if lobby is not None:
            member = lobby.members[member_id]
            if member.presence is Presence.CONNECTED:
                member.presence = Presence.RECONNECTING
                member.grace_until = now + self.config.reconnect_grace
                self._reconnecting[member_id] = member.grace_until
                self.counters["members_dropped"] += 1
                self._broadcast(
                    lobby,
                    lambda v: PresenceChanged(lobby.lobby_id, v, member_id, Presence.RECONNECTING),
                )
                self._ensure_owner(lobby, now)
                self._list_if_live(lobby)
        return self._take_out()

    def reconnected(self, member_id: str, now: float) -> tuple[Send, ...]:
        """The member's session resumed within the grace period: it keeps its seat."""
        self._out = []
        lobby = self._lobby_of_member(member_id)
        if lobby is not None:
            self._come_back(lobby, lobby.members[member_id], now)
        return self._take_out()

    def expire(self, now: float) -> tuple[Send, ...]:
        """Drop the members whose grace period ended; forget rate buckets that are full."""
        self._out = []
        for member_id, until in list(self._reconnecting.items()):
            if until <= now:
                lobby = self._lobby_of_member(member_id)
                if lobby is None:  # pragma: no cover - the two maps are kept in step
                    del self._reconnecting[member_id]
                    continue
                member = lobby.members[member_id]
                reason = LeaveReason.DROPPED if member.arrived else LeaveReason.DISPLACED
                self.counters["members_expired"] += 1
                self._remove(lobby, member_id, reason, now)
        gameloop.expire(self, now)
        gameloop.due_held(self, now)
        if self._bucket_sweep_at is not None and now >= self._bucket_sweep_at:
            for key, bucket in list(self._buckets.items()):
                if bucket.is_full(now):
                    del self._buckets[key]
            self._bucket_sweep_at = now + BUCKET_SWEEP_S if self._buckets else None
        return self._take_out()

    def game_result(
        self,
        lobby_id: int,
        match_id: int,
        server_id: str,
        result: Mapping[str, Value],
        now: float,
    ) -> tuple[str, tuple[Send, ...]]:
        """A game server's result for its game (its signature checked by the caller,
        `echo.lobby.results`): ("ended", the GameEnded to send) if it ended the lobby's
        running game; ("held", ()) if the lobby is not here, or is being re-created here
        without that game so far (it ends the game if the lobby's members bring it here
        within `LobbyConfig.result_hold`); else why it was ignored ("not_running",
        "wrong_server")."""
        self._out = []
        outcome = gameloop.game_result(self, lobby_id, match_id, server_id, result, now)
        self.counters[f"game_results_{outcome}"] += 1
        return outcome, self._take_out()

    def game_of(self, lobby_id: int) -> RunningGame | None:
        lobby = self._lobbies.get(lobby_id)
        return None if lobby is None else lobby.game

    # --- dispatch ------------------------------------------------------------------------------

    def _dispatch(self, member_id: str, req: Request, now: float) -> Reply:
        match req:
            case CreateLobby():
                return self._create(member_id, req, now)
            case JoinLobby():
                return self._join_by_id(member_id, req, now)
            case JoinByCode():
                return self._join_by_code(member_id, req, now)
            case QuickJoin():
                return self._quick_join(member_id, req, now)
            case LeaveLobby():
                return self._leave(member_id, req, now)
            case SearchLobbies():
                return self._search(member_id, req, now)
            case SetMetadata():
                return self._set_metadata(member_id, req, now)
            case SetLocked():
                return self._set_locked(member_id, req, now)
            case KickMember():
                return self._kick(member_id, req, now)
            case BanMember():
                return self._ban(member_id, req, now)
            case TransferOwner():
                return self._transfer(member_id, req, now)
            case SetAttributes():
                return self._set_attributes(member_id, req, now)
            case SetReady():
                return self._set_ready(member_id, req, now)
            case SendChat():
                return self._chat(member_id, req, now)
            case RecreateLobby():
                return self._recreate(member_id, req, now)
            case StartGame():
                gameloop.start(self, member_id, req, now)  # the owner starts the lobby's game
                return Done(req.request_id)
            case RequestTicket():
                gameloop.request_ticket(self, member_id, req, now)
                return Done(req.request_id)
            case ReportGameServer():
                gameloop.report_server(self, member_id, req, now)
                return Done(req.request_id)
        _refuse(ErrorCode.BAD_REQUEST, f"not a request: {type(req).__name__}")
