"""The lobby registry of one lobby server: a pure state machine.

The driver (next step: sessions + logical channels) calls

- ``handle(member_id, request, now)`` for every decoded request: it returns a `Handled` with the
  one reply for the sender and the state updates and chat lines to send, each `Send` naming
  its recipients; `echo.lobby.protocol.channel_of` tells which logical channel carries it;
- ``disconnected(member_id, now)`` / ``reconnected(member_id, now)`` when a member's session
  drops or resumes, and ``expire(now)`` at ``next_deadline()``.

A remote's bad request is never an exception: it is a `Refusal` with an `ErrorCode`, counted in
``refusals``. ``member_id`` is the authenticated identity the driver got from the session.

Rules a reader needs (also in docs/lobby.md):

- A member is in at most one lobby of a server. A lobby with no member is deleted.
- Owner: always a member; whenever any member is connected, the owner is a connected member.
  When that stops being true (the owner leaves, is dropped, or its session drops) ownership
  moves to the connected member who joined earliest (lowest join sequence); if nobody is
  connected it stays (or goes, if the owner left, to the earliest-joined member). An owner
  whose session dropped gets the lobby back when its seat comes back (a NAT rebinding, a
  network change), unless the interim owner transferred it meanwhile: ownership follows the
  member's seat, not its address.
- Presence: a dropped member keeps its seat for ``reconnect_grace`` seconds as RECONNECTING; it
  gets no updates meanwhile and a full snapshot when it comes back.
- Every state change increments the lobby's version and is sent, carrying it, to the connected
  members, so a member's `LobbyReplica` detects a gap and asks for a snapshot.
- No ghosts: a lobby none of whose members is connected (all RECONNECTING: crashed, killed,
  cut off) is not listed: search and quick-join skip it, and the listings topic says it is
  gone, from the moment its last connected member drops; it is listed again as soon as a
  member is connected again (back within its grace period, or a new member who joined it by
  id or code). Its seats are kept for the grace period all the same.
- Search lists public, unlocked lobbies with a connected member in ascending lobby id; the
  cursor is the last id of a page, so paging is stable: a lobby that is listed throughout is
  seen exactly once.
- Recreate (the home died): see `RecreateLobby` handling below and docs/lobby-protocol.md.

Pure module: no trio, no clock.
"""

from __future__ import annotations

import heapq
import hmac
import math
import secrets
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Final, NoReturn, Protocol

import attrs
import structlog

from echo.lobby import gameloop
from echo.lobby.gameloop import RunningGame, random_match_id
from echo.lobby.games import GameServerDirectory
from echo.lobby.limits import LobbyConfig, RateLimit, TokenBucket
from echo.lobby.listings import ListingBoard, ListingGone
from echo.lobby.protocol import (
    I64_MAX,
    I64_MIN,
    AttributesChanged,
    BanMember,
    ChatLine,
    CreateLobby,
    Done,
    ErrorCode,
    Filter,
    FreeSlots,
    GameStarting,
    JoinByCode,
    JoinLobby,
    KickMember,
    LeaveLobby,
    LeaveReason,
    LobbyJoined,
    LobbyListing,
    LobbySnapshot,
    LockChanged,
    MemberBanned,
    MemberJoined,
    MemberLeft,
    MemberState,
    MetadataChanged,
    NumberRange,
    OwnerChanged,
    Presence,
    PresenceChanged,
    QuickJoin,
    ReadyChanged,
    RecreateLobby,
    Refusal,
    Reply,
    ReportGameServer,
    Request,
    RequestTicket,
    SearchLobbies,
    SearchResults,
    SeatTag,
    SeatTags,
    SendChat,
    SetAttributes,
    SetLocked,
    SetMetadata,
    SetReady,
    StartGame,
    StringEquals,
    TransferOwner,
    Update,
    Value,
)
from echo.lobby.queue_wire import Matched, QueueLeft
from echo.lobby.search_index import SearchIndex
from echo.tickets.core import RosterEntry

log = structlog.get_logger("echo.lobby")

CODE_ALPHABET: Final = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"  # no 0/O, 1/I: codes are read aloud
MAX_COPY_VERSION: Final = 2**62
CODE_LENGTH: Final = 8  # 40 bits; guessing is further slowed by the join rate limit
# Seat tags kept per seat: copies may disagree (one is stale, or a hostile re-creator's), and
# keeping each copy's (one per seat and sender) lets the seat's own client in whichever is
# true; bounded so that copies cannot grow a snapshot's tags without end.
MAX_SEAT_TAGS: Final = 4
MAX_SEAT_TAG_BYTES: Final = 64


def random_lobby_id() -> int:
    """A random nonzero 63-bit id: unique across servers without coordination."""
    return secrets.randbits(63) | 1


def random_join_code() -> str:
    return "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))


class Tickets(Protocol):
    """Issues game tickets (`echo.tickets.TicketIssuer` is the real one)."""

    def issue(
        self,
        lobby_id: int,
        member_id: str,
        server_id: str,
        *,
        match_id: int = 0,
        roster: Iterable[RosterEntry] = (),
        metadata: Mapping[str, Value] | None = None,
    ) -> bytes: ...


class Seats(Protocol):
    """Signs and checks seats (`echo.tickets.TicketSeats` is the real one)."""

    def issue(self, lobby_id: int, member_id: str) -> bytes: ...

    def check(self, seat: bytes, lobby_id: int, member_id: str) -> bool: ...

    def tag(self, lobby_id: int, member_id: str, secret: bytes) -> bytes: ...

    def tag_matches(self, tag: bytes, lobby_id: int, member_id: str, secret: bytes) -> bool: ...


@attrs.frozen
class Send:
    """One message to some members; the channel follows from the message (`channel_of`)."""

    to: tuple[str, ...]
    # (a reply only from the matchmaker's desk: a LobbyJoined of request id 0)
    message: Update | GameStarting | SeatTags | ChatLine | Reply | Matched | QueueLeft


@attrs.frozen
class Handled:
    reply: Reply
    sends: tuple[Send, ...]


class _Refuse(Exception):
    """Internal short-cut of validation; always turned into a Refusal before `handle` returns."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _refuse(code: ErrorCode, message: str) -> NoReturn:
    raise _Refuse(code, message)


@attrs.define
class _Member:
    member_id: str
    join_seq: int
    ready: bool = False
    presence: Presence = Presence.CONNECTED
    attributes: dict[str, Value] = attrs.Factory(dict)
    grace_until: float | None = None
    # Has this member shown up on this server? False only for the seats a recreated lobby keeps
    # for members of the copy who have not come back yet.
    arrived: bool = True
    # The seat's tags (`Seats.tag` of the hello secret of the client seated by a request, or
    # those of the copies for a seat not yet claimed), by who brought each (the member itself,
    # or the sender of a copy: one each): that client takes the seat back with its secret
    # alone, here or on the next server (the tags travel in the members' copies).
    tags: dict[str, bytes] = attrs.Factory(dict)

    def state(self) -> MemberState:
        return MemberState(
            self.member_id, self.join_seq, self.ready, self.presence, dict(self.attributes)
        )


@attrs.define
class _Lobby:
    lobby_id: int
    name: str
    max_members: int
    private: bool
    join_code: str
    locked: bool
    owner: str
    metadata: dict[str, Value]
    bans: list[str]
    members: dict[str, _Member]  # in join order
    version: int
    next_join_seq: int
    # Set when the lobby was recreated here from a member's copy: until then, more copies are
    # merged; `base_version` is the highest copy merged, `intended_owner` that copy's owner.
    recreated_until: float | None = None
    base_version: int = 0
    intended_owner: str | None = None
    # The owner whose session dropped (not who left): ownership follows its seat, so it gets
    # the lobby back when it returns, unless the lobby was given away on purpose meanwhile.
    dropped_owner: str | None = None
    # Its game, from the start to its end (echo.lobby.gameloop).
    game: RunningGame | None = None

    def connected(self) -> list[_Member]:
        return [m for m in self.members.values() if m.presence is Presence.CONNECTED]

    def audience(self) -> tuple[str, ...]:
        return tuple(m.member_id for m in self.connected())

    def snapshot(self) -> LobbySnapshot:
        return LobbySnapshot(
            lobby_id=self.lobby_id,
            version=self.version,
            name=self.name,
            max_members=self.max_members,
            private=self.private,
            join_code=self.join_code,
            locked=self.locked,
            owner=self.owner,
            metadata=dict(self.metadata),
            bans=tuple(self.bans),
            members=tuple(m.state() for m in self.members.values()),
        )


def _utf8_len(s: str) -> int:
    return len(s.encode("utf-8", "surrogatepass"))


def _value_bytes(v: Value) -> int:
    return _utf8_len(v) if isinstance(v, str) else 8


def _has_control(s: str) -> bool:
    return any(unicodedata.category(c) in ("Cc", "Cs") for c in s)


class LobbyRegistry:
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
        self._reconnecting: dict[str, float] = {}  # member id -> end of its grace period
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
        """When `expire` next has work: the earliest end of a reconnection grace period or
        of a game's life."""
        return (
            min(
                min(self._reconnecting.values(), default=math.inf),
                min(self._game_deadlines.values(), default=math.inf),
            )
            if self._reconnecting or self._game_deadlines
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
        for key, bucket in list(self._buckets.items()):
            if bucket.is_full(now):
                del self._buckets[key]
        return self._take_out()

    def game_result(
        self, lobby_id: int, match_id: int, server_id: str, result: Mapping[str, Value]
    ) -> tuple[str, tuple[Send, ...]]:
        """A game server's result for its game (its signature checked by the caller,
        `echo.lobby.results`): ("ended", the GameEnded to send) if it ended the lobby's
        running game; else why it was ignored ("no_lobby", "not_running", "wrong_server")."""
        self._out = []
        outcome = gameloop.game_result(self, lobby_id, match_id, server_id, result)
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
                repeat = member_id in getattr(self._lobbies.get(req.lobby_id), "members", ())
                self._rate(member_id, "join", self.config.join_limit, now, repeat=repeat)
                lobby = self._lobby(req.lobby_id)
                if lobby.private and member_id not in lobby.members:
                    _refuse(ErrorCode.PRIVATE_LOBBY, "a private lobby is joined with its code")
                return self._join(member_id, lobby, req.request_id, now)
            case JoinByCode():
                found = self._by_code.get(req.code)
                repeat = found is not None and self._where.get(member_id) == found
                self._rate(member_id, "join", self.config.join_limit, now, repeat=repeat)
                if found is None:
                    _refuse(ErrorCode.NO_SUCH_CODE, "no lobby has this code")
                return self._join(member_id, self._lobbies[found], req.request_id, now)
            case QuickJoin():
                return self._quick_join(member_id, req, now)
            case LeaveLobby():
                lobby, _ = self._membership(member_id, req.lobby_id)
                self.counters["leaves"] += 1
                self._remove(lobby, member_id, LeaveReason.LEFT, now)
                return Done(req.request_id)
            case SearchLobbies():
                return self._search(member_id, req, now)
            case SetMetadata():
                return self._set_metadata(member_id, req, now)
            case SetLocked():
                self._rate(member_id, "update", self.config.update_limit, now)
                lobby = self._owned(member_id, req.lobby_id)
                if lobby.locked != req.locked:
                    self._unindex(lobby)
                    lobby.locked = req.locked
                    self._index_lobby(lobby)
                    self._broadcast(lobby, lambda v: LockChanged(lobby.lobby_id, v, req.locked))
                return Done(req.request_id)
            case KickMember():
                self._rate(member_id, "update", self.config.update_limit, now)
                lobby = self._owned(member_id, req.lobby_id)
                if req.member_id == member_id:
                    _refuse(ErrorCode.BAD_REQUEST, "the owner leaves instead of kicking itself")
                if req.member_id not in lobby.members:
                    _refuse(ErrorCode.NO_SUCH_MEMBER, "no such member in this lobby")
                self.counters["kicks"] += 1
                self._remove(lobby, req.member_id, LeaveReason.KICKED, now)
                return Done(req.request_id)
            case BanMember():
                return self._ban(member_id, req, now)
            case TransferOwner():
                self._rate(member_id, "update", self.config.update_limit, now)
                lobby = self._owned(member_id, req.lobby_id)
                target = lobby.members.get(req.member_id)
                if target is None:
                    _refuse(ErrorCode.NO_SUCH_MEMBER, "no such member in this lobby")
                if target.presence is not Presence.CONNECTED:
                    _refuse(ErrorCode.MEMBER_NOT_CONNECTED, "that member is reconnecting")
                self._set_owner(lobby, req.member_id)
                # A deliberate transfer overrides the owner a recreated copy named, and the
                # claim of an owner whose session dropped.
                lobby.intended_owner = None
                lobby.dropped_owner = None
                return Done(req.request_id)
            case SetAttributes():
                return self._set_attributes(member_id, req, now)
            case SetReady():
                self._rate(member_id, "update", self.config.update_limit, now)
                lobby, member = self._membership(member_id, req.lobby_id)
                if req.member_id != member_id:
                    _refuse(ErrorCode.OTHER_MEMBER, "a ready state is set only by its member")
                if member.ready != req.ready:
                    member.ready = req.ready
                    self._broadcast(
                        lobby, lambda v: ReadyChanged(lobby.lobby_id, v, member_id, req.ready)
                    )
                return Done(req.request_id)
            case SendChat():
                return self._chat(member_id, req, now)
            case RecreateLobby():
                return self._recreate(member_id, req, now)
            case StartGame():
                return self._start(member_id, req, now)
            case RequestTicket():
                gameloop.request_ticket(self, member_id, req, now)
                return Done(req.request_id)
            case ReportGameServer():
                gameloop.report_server(self, member_id, req, now)
                return Done(req.request_id)
        _refuse(ErrorCode.BAD_REQUEST, f"not a request: {type(req).__name__}")

    # --- operations ----------------------------------------------------------------------------

    def _create(self, member_id: str, req: CreateLobby, now: float) -> Reply:
        made = self._lobby_of_member(member_id)
        repeat = made is not None and _is_its_create(made, member_id, req)
        self._rate(member_id, "create", self.config.create_limit, now, repeat=repeat)
        if made is not None and repeat:
            # The same create again: its reply was lost (or came after the member gave up),
            # so it asks again. The lobby it made is its answer, not ALREADY_IN_LOBBY.
            return self._join(member_id, made, req.request_id, now)
        self._not_elsewhere(member_id, None)
        if len(self._lobbies) >= self.config.max_lobbies:
            _refuse(ErrorCode.SERVER_FULL, "this server holds its maximum number of lobbies")
        self._check_name(req.name)
        self._check_max_members(req.max_members)
        self._check_metadata(req.metadata)
        lobby_id = self._fresh_lobby_id()
        code = self._fresh_code() if req.private else ""
        lobby = _Lobby(
            lobby_id=lobby_id,
            name=req.name,
            max_members=req.max_members,
            private=req.private,
            join_code=code,
            locked=False,
            owner=member_id,
            metadata=dict(req.metadata),
            bans=[],
            members={member_id: _Member(member_id, 0, tags=self._own_tags(lobby_id, member_id))},
            version=1,
            next_join_seq=1,
        )
        self._add_lobby(lobby)
        self._where[member_id] = lobby_id
        self.counters["lobbies_created"] += 1
        self._send_state((member_id,), lobby)
        return LobbyJoined(req.request_id, lobby_id)

    def _join(
        self, member_id: str, lobby: _Lobby, request_id: int, now: float, *, proven: bool = False
    ) -> Reply:
        """`proven`: the request showed the member's valid seat (a copy's)."""
        seat = lobby.members.get(member_id)
        if seat is not None:
            if (
                not seat.arrived
                and not proven
                and self._seats is not None
                and not self._tag_holds(lobby, seat, self._secret)
            ):
                # A seat a re-created lobby keeps from a copy is its member's, and the copy
                # is another member's word: a session that came here before the seat existed
                # (so no hello checked it) shows the seat or its client's secret to take it.
                _refuse(
                    ErrorCode.NOT_MEMBER,
                    "this seat is kept for a member who has not come back: its seat is needed",
                )
            # A retried join (its reply was lost), or a member claiming its kept seat: the
            # same LobbyJoined (with its seat) and the state again.
            self.counters["joins_repeated"] += 1
            if seat.presence is Presence.CONNECTED:
                self._send_state((member_id,), lobby)
            else:
                self._come_back(lobby, seat, now)
            return LobbyJoined(request_id, lobby.lobby_id)
        self._not_elsewhere(member_id, None)
        if member_id in lobby.bans:
            _refuse(ErrorCode.BANNED, "banned from this lobby")
        if lobby.locked:
            _refuse(ErrorCode.LOBBY_LOCKED, "the owner locked this lobby")
        if len(lobby.members) >= lobby.max_members:
            _refuse(ErrorCode.LOBBY_FULL, "the lobby is full")
        member = _Member(
            member_id, lobby.next_join_seq, tags=self._own_tags(lobby.lobby_id, member_id)
        )
        lobby.next_join_seq += 1
        lobby.members[member_id] = member
        self._where[member_id] = lobby.lobby_id
        self._list_if_live(lobby)
        self.counters["joins"] += 1
        others = tuple(m for m in lobby.audience() if m != member_id)
        lobby.version += 1
        self._out.append(Send(others, MemberJoined(lobby.lobby_id, lobby.version, member.state())))
        if member.tags and others:
            tags = tuple(SeatTag(member_id, tag) for tag in member.tags.values())
            self._out.append(Send(others, SeatTags(lobby.lobby_id, tags)))
        self._send_state((member_id,), lobby)
        # A first member to connect to a recreated lobby whose owner is still away takes it.
        self._ensure_owner(lobby, now)
        return LobbyJoined(request_id, lobby.lobby_id)

    def _quick_join(self, member_id: str, req: QuickJoin, now: float) -> Reply:
        seated = self._lobby_of_member(member_id)
        repeat = (
            seated is not None
            and not seated.private
            and len(req.filters) <= self.config.max_filters
            and self._matches(seated, req.filters, own_seat=True)
        )
        self._rate(member_id, "search", self.config.search_limit, now, repeat=repeat)
        self._check_filters(req.filters)
        if seated is not None and repeat:
            # A retried quick-join (its reply was lost): the lobby it was put in still
            # matches, counting its own seat as free, so that lobby is the answer.
            return self._join(member_id, seated, req.request_id, now)
        self._not_elsewhere(member_id, None)
        best: _Lobby | None = None
        # (FreeSlots(1): the index leaves the full lobbies out.)
        for listing in self._index.matching((*req.filters, FreeSlots(1))):
            lobby = self._lobbies[listing.lobby_id]
            if (
                member_id not in lobby.bans
                # Fill the fullest lobby first (players want a game soon), then lowest id.
                and (
                    best is None
                    or (len(lobby.members), -lobby.lobby_id) > (len(best.members), -best.lobby_id)
                )
            ):
                best = lobby
        if best is None:
            _refuse(ErrorCode.NO_MATCH, "no open lobby matches")
        self.counters["quick_joins"] += 1
        return self._join(member_id, best, req.request_id, now)

    def _search(self, member_id: str, req: SearchLobbies, now: float) -> Reply:
        self._rate(member_id, "search", self.config.search_limit, now)
        self._check_filters(req.filters)
        if not 1 <= req.limit <= self.config.max_page:
            _refuse(ErrorCode.BAD_REQUEST, f"a page holds 1..{self.config.max_page} lobbies")
        self.counters["searches"] += 1
        after = req.cursor if req.cursor is not None else -1
        streams = [self._index.matching(req.filters, after)]
        if self._board is not None:
            streams.append(self._board.matching(req.filters, after, now))
        page: list[LobbyListing] = []
        more = False
        last = after
        # Both streams ascend by id, so one cursor pages through this server and the others.
        merged = heapq.merge(*streams, key=_lobby_id) if len(streams) > 1 else streams[0]
        for found in merged:
            lobby_id = found.lobby_id
            if lobby_id == last:
                continue  # a stale remote listing of a lobby that now lives here
            if len(page) == req.limit:
                more = True
                break
            page.append(found)
            last = lobby_id
        next_cursor = last if more else None
        return SearchResults(req.request_id, tuple(page), next_cursor)

    def _set_metadata(self, member_id: str, req: SetMetadata, now: float) -> Reply:
        self._rate(member_id, "update", self.config.update_limit, now)
        lobby = self._owned(member_id, req.lobby_id)
        merged, effective = _merge_changes(lobby.metadata, req.changes)
        self._check_metadata(merged)
        if effective:
            self._unindex(lobby)
            lobby.metadata = merged
            self._index_lobby(lobby)
            self._broadcast(lobby, lambda v: MetadataChanged(lobby.lobby_id, v, effective))
        return Done(req.request_id)

    def _ban(self, member_id: str, req: BanMember, now: float) -> Reply:
        self._rate(member_id, "update", self.config.update_limit, now)
        lobby = self._owned(member_id, req.lobby_id)
        target = req.member_id
        if target == member_id:
            _refuse(ErrorCode.BAD_REQUEST, "the owner cannot ban itself")
        if not 1 <= _utf8_len(target) <= self.config.max_member_id_bytes:
            _refuse(ErrorCode.BAD_REQUEST, "not a member id")
        if target in lobby.bans:
            return Done(req.request_id)
        if len(lobby.bans) >= self.config.max_bans:
            _refuse(ErrorCode.BAN_LIST_FULL, f"a lobby bans at most {self.config.max_bans}")
        lobby.bans.append(target)
        self.counters["bans"] += 1
        # Everyone connected hears of it, the target included; a banned id may be absent
        # (a ban ahead of time), otherwise the member leaves with reason BANNED.
        self._broadcast(lobby, lambda v: MemberBanned(lobby.lobby_id, v, target))
        if target in lobby.members:
            self._remove(lobby, target, LeaveReason.BANNED, now)
        return Done(req.request_id)

    def _set_attributes(self, member_id: str, req: SetAttributes, now: float) -> Reply:
        self._rate(member_id, "update", self.config.update_limit, now)
        lobby, member = self._membership(member_id, req.lobby_id)
        if req.member_id != member_id:
            _refuse(ErrorCode.OTHER_MEMBER, "attributes are set only by their own member")
        merged, effective = _merge_changes(member.attributes, req.changes)
        self._check_attributes(merged)
        if effective:
            member.attributes = merged
            self._broadcast(
                lobby, lambda v: AttributesChanged(lobby.lobby_id, v, member_id, effective)
            )
        return Done(req.request_id)

    def _chat(self, member_id: str, req: SendChat, now: float) -> Reply:
        self._rate(member_id, "chat", self.config.chat_limit, now)
        lobby, _ = self._membership(member_id, req.lobby_id)
        size = _utf8_len(req.text)
        if not 1 <= size <= self.config.max_chat_bytes:
            _refuse(
                ErrorCode.CHAT_LIMIT, f"a chat line holds 1..{self.config.max_chat_bytes} bytes"
            )
        if _has_control(req.text):
            # Line-oriented clients print chat as lines: a newline would forge another line.
            _refuse(ErrorCode.CHAT_LIMIT, "a chat line holds no control characters")
        audience = lobby.audience()
        self.counters["chat_lines"] += 1
        self.counters["chat_deliveries"] += len(audience)
        self._out.append(Send(audience, ChatLine(lobby.lobby_id, member_id, req.text)))
        return Done(req.request_id)

    def _start(self, member_id: str, req: StartGame, now: float) -> Reply:
        """The owner starts the lobby's game (`echo.lobby.gameloop.start`)."""
        gameloop.start(self, member_id, req, now)
        return Done(req.request_id)

    # --- recreate (a lobby rebuilt from its members' copies) ----------------------------------

    def _recreate(self, member_id: str, req: RecreateLobby, now: float) -> Reply:
        """A member's copy of a lobby whose home died arrives at the next server of the ring.

        The merge rule, for several copies of one lobby id arriving here:
        1. The copy with the highest version supplies the lobby's fields (name, size, access,
           lock, metadata, owner-to-restore); a lower or equal copy changes none of them.
        2. Bans are the union of all copies (a ban is for the lobby's life, so never undone).
        3. Members are the highest copy's members plus every member who has *arrived* here
           (sent a copy, or joined the recreated lobby): a member who joined meanwhile is not
           lost. Members of the highest copy who have not arrived hold RECONNECTING seats for
           the grace period; members only in lower copies who have not arrived are dropped
           (the newer copy says they left). Banned members are removed.
        4. If that is more than the lobby's size, seats not yet claimed go first, latest
           joined first; arrived members are never displaced (a copy that would need it is
           refused as LOBBY_FULL).
        5. The copy's owner gets the lobby back if it arrives within `recreate_window`;
           until then the owner rule of this module applies (a connected owner).
        6. The version becomes max(current, copy) + 1 and every connected member receives a
           full snapshot.
        """
        snap = req.snapshot
        existing = self._lobbies.get(snap.lobby_id)
        held = None if existing is None else existing.members.get(member_id)
        repeat = held is not None and held.arrived
        self._rate(member_id, "join", self.config.join_limit, now, repeat=repeat)
        if self._seats is not None and not self._seats.check(req.seat, snap.lobby_id, member_id):
            _refuse(ErrorCode.RECREATE_REFUSED, "no valid seat of this member in this lobby")
        entry = self._check_copy(member_id, snap, req.seat_tags)
        copy_tags = self._copy_tags(req.seat_tags)
        if existing is not None:
            if held is not None and held.arrived:
                # Already here (a retried copy, the lobby never left, or its hello took its
                # seat back first): just resync. Its tags still count for the seats not yet
                # claimed (once per sender: a copy sent again adds nothing).
                self._add_copy_tags(existing, member_id, copy_tags)
                return self._join(member_id, existing, req.request_id, now)
            if existing.recreated_until is None or now > existing.recreated_until:
                if held is not None:
                    # Its kept seat, claimed with its seat after the window: the copy's fields
                    # no longer merge, but the seat is its own.
                    return self._join(member_id, existing, req.request_id, now, proven=True)
                _refuse(ErrorCode.RECREATE_REFUSED, "this lobby lives here and is not recovering")
            self._not_elsewhere(member_id, snap.lobby_id)
            self._merge_copy(existing, member_id, entry, snap, copy_tags, now)
            return LobbyJoined(req.request_id, existing.lobby_id)
        self._not_elsewhere(member_id, None)
        if len(self._lobbies) >= self.config.max_lobbies:
            _refuse(ErrorCode.SERVER_FULL, "this server holds its maximum number of lobbies")
        if snap.private and snap.join_code in self._by_code:
            _refuse(ErrorCode.RECREATE_REFUSED, "the copy's join code is taken here")
        lobby = _Lobby(
            lobby_id=snap.lobby_id,
            name=snap.name,
            max_members=snap.max_members,
            private=snap.private,
            join_code=snap.join_code,
            locked=snap.locked,
            owner=snap.owner,
            metadata=dict(snap.metadata),
            bans=list(snap.bans),
            members={},
            version=snap.version,
            next_join_seq=0,
            recreated_until=now + self.config.recreate_window,
            base_version=snap.version,
            intended_owner=snap.owner,
        )
        for m in sorted(snap.members, key=lambda s: s.join_seq):
            if m.member_id in snap.bans:
                continue
            if m.member_id != member_id and m.member_id in self._where:
                continue  # that member has moved on to another lobby here
            lobby.members[m.member_id] = self._seat_from_copy(
                snap.lobby_id,
                m,
                now,
                arrived=m.member_id == member_id,
                tags=_with_tag({}, member_id, copy_tags.get(m.member_id)),
            )
        self._renumber(lobby)
        for m_id, seat in lobby.members.items():
            self._where[m_id] = lobby.lobby_id
            if seat.grace_until is not None:
                self._reconnecting[m_id] = seat.grace_until
        if lobby.owner not in lobby.members:
            lobby.owner = member_id
        self._add_lobby(lobby)
        self.counters["lobbies_recreated"] += 1
        self._ensure_owner(lobby, now, notify=False)
        lobby.version += 1
        self._send_state(lobby.audience(), lobby)
        return LobbyJoined(req.request_id, lobby.lobby_id)

    def _check_copy(
        self, member_id: str, snap: LobbySnapshot, tags: tuple[SeatTag, ...]
    ) -> MemberState:
        if snap.lobby_id == 0:
            _refuse(ErrorCode.BAD_REQUEST, "lobby id 0 is not a lobby")
        if snap.version > MAX_COPY_VERSION:
            # Honest versions count changes; this one would overflow the u64 on the wire.
            _refuse(ErrorCode.BAD_REQUEST, "the copy's version is not believable")
        self._check_name(snap.name)
        self._check_max_members(snap.max_members)
        self._check_metadata(snap.metadata)
        if snap.private != (snap.join_code != ""):
            _refuse(ErrorCode.BAD_REQUEST, "a private lobby has a join code, a public one none")
        if len(snap.bans) > self.config.max_bans:
            _refuse(ErrorCode.BAN_LIST_FULL, "the copy bans too many members")
        if member_id in snap.bans:
            _refuse(ErrorCode.BANNED, "banned from this lobby")
        ids = [m.member_id for m in snap.members]
        if len(set(ids)) != len(ids) or len(ids) > snap.max_members:
            _refuse(ErrorCode.BAD_REQUEST, "the copy's members are not a valid lobby")
        entry: MemberState | None = None
        for m in snap.members:
            if not 1 <= _utf8_len(m.member_id) <= self.config.max_member_id_bytes:
                _refuse(ErrorCode.BAD_REQUEST, "not a member id")
            self._check_attributes(m.attributes)
            if m.member_id == member_id:
                entry = m
        if entry is None:
            _refuse(ErrorCode.NOT_MEMBER, "a copy is recreated only by one of its members")
        if len(tags) > MAX_SEAT_TAGS * len(ids) or any(
            len(t.tag) > MAX_SEAT_TAG_BYTES for t in tags
        ):
            _refuse(ErrorCode.BAD_REQUEST, "the copy's seat tags are not a valid lobby's")
        return entry

    @staticmethod
    def _copy_tags(tags: tuple[SeatTag, ...]) -> dict[str, bytes]:
        """A copy's tags by member: the first of each member only. A copy is its sender's
        word; one tag per seat and sender keeps a hostile member from crowding out the tags
        of honest copies (a seat keeps `MAX_SEAT_TAGS`, from different senders)."""
        by_member: dict[str, bytes] = {}
        for t in tags:
            if t.tag and t.member_id not in by_member:
                by_member[t.member_id] = t.tag
        return by_member

    def _add_copy_tags(self, lobby: _Lobby, sender: str, copy_tags: dict[str, bytes]) -> None:
        """A copy's tags for the seats still unclaimed (the others have their own client's)."""
        changed = False
        for seat in lobby.members.values():
            if not seat.arrived and seat.member_id in copy_tags:
                more = _with_tag(seat.tags, sender, copy_tags[seat.member_id])
                changed = changed or more is not seat.tags  # (a new dict when it added one)
                seat.tags = more
        if changed:
            self._out.append(Send(lobby.audience(), self._seat_tags(lobby)))

    def _seat_from_copy(
        self,
        lobby_id: int,
        m: MemberState,
        now: float,
        *,
        arrived: bool,
        tags: dict[str, bytes] | None = None,
    ) -> _Member:
        seat = _Member(m.member_id, m.join_seq, m.ready, Presence.CONNECTED, dict(m.attributes))
        seat.arrived = arrived
        # The sender's own seat is tagged with its own session's secret (if it has one).
        seat.tags = dict(tags or {})
        if arrived:
            seat.tags = self._own_tags(lobby_id, m.member_id) or seat.tags
        if not arrived:
            seat.presence = Presence.RECONNECTING
            seat.grace_until = now + self.config.reconnect_grace
        return seat

    def _merge_copy(
        self,
        lobby: _Lobby,
        member_id: str,
        entry: MemberState,
        snap: LobbySnapshot,
        copy_tags: dict[str, bytes],
        now: float,
    ) -> None:
        bans = list(lobby.bans) + [b for b in snap.bans if b not in lobby.bans]
        if len(bans) > 255:
            _refuse(ErrorCode.BAN_LIST_FULL, "the copies together ban too many members")
        if member_id in bans:
            _refuse(ErrorCode.BANNED, "banned from this lobby")
        newer = snap.version > lobby.base_version
        current = lobby.members
        # Seats in join order of the copy that wins; arrived members it lacks come after.
        order: list[_Member] = []
        lobby_id = lobby.lobby_id
        if newer:
            for copied in sorted(snap.members, key=lambda s: s.join_seq):
                held = current.get(copied.member_id)
                if held is not None and held.arrived:
                    order.append(held)
                elif copied.member_id == member_id:
                    order.append(self._seat_from_copy(lobby_id, copied, now, arrived=True))
                elif held is None and copied.member_id in self._where:
                    continue  # moved on to another lobby here
                else:
                    # (A seat still unclaimed keeps the tags of the copies before: the new
                    # copy's word does not erase theirs.)
                    before = {} if held is None else held.tags
                    tags = _with_tag(before, member_id, copy_tags.get(copied.member_id))
                    order.append(
                        self._seat_from_copy(lobby_id, copied, now, arrived=False, tags=tags)
                    )
            in_order = {seat.member_id for seat in order}
            order += [
                seat for seat in current.values() if seat.arrived and seat.member_id not in in_order
            ]
        else:
            order = [
                attrs.evolve(
                    seat, tags=_with_tag(seat.tags, member_id, copy_tags.get(seat.member_id))
                )
                if not seat.arrived
                else seat
                for seat in current.values()
            ]
            if member_id not in current:
                order.append(self._seat_from_copy(lobby_id, entry, now, arrived=True))
        # The sender's seat as a new record: the checks below may still refuse, and a refusal
        # must leave the lobby as it was.
        own = self._own_tags(lobby_id, member_id)
        order = [
            attrs.evolve(
                m,
                arrived=True,
                presence=Presence.CONNECTED,
                grace_until=None,
                tags=own or m.tags,
            )
            if m.member_id == member_id
            else m
            for m in order
            if m.member_id not in bans
        ]
        max_members = snap.max_members if newer else lobby.max_members
        if sum(1 for m in order if m.arrived) > max_members:
            _refuse(ErrorCode.LOBBY_FULL, "the recreated lobby is full")
        while len(order) > max_members:
            last_unclaimed = max((i for i, m in enumerate(order) if not m.arrived), default=None)
            assert last_unclaimed is not None
            del order[last_unclaimed]
        if newer:
            new_code = snap.join_code
            if snap.private and self._by_code.get(new_code, lobby.lobby_id) != lobby.lobby_id:
                _refuse(ErrorCode.RECREATE_REFUSED, "the copy's join code is taken here")
        # From here on nothing refuses: apply.
        self._unindex(lobby)
        if newer:
            lobby.name = snap.name
            lobby.max_members = snap.max_members
            lobby.private = snap.private
            lobby.join_code = snap.join_code
            lobby.locked = snap.locked
            lobby.metadata = dict(snap.metadata)
            lobby.base_version = snap.version
            lobby.intended_owner = snap.owner
        lobby.bans = bans
        kept = {m.member_id for m in order}
        banned_here: list[str] = []
        for gone, seat in current.items():
            if gone not in kept:
                self._where.pop(gone, None)
                self._reconnecting.pop(gone, None)
                if seat.presence is Presence.CONNECTED:
                    banned_here.append(gone)  # only a ban in a copy removes an arrived member
        lobby.members = {m.member_id: m for m in order}
        for m in order:
            self._where[m.member_id] = lobby.lobby_id
            if m.grace_until is not None:
                self._reconnecting[m.member_id] = m.grace_until
            else:
                self._reconnecting.pop(m.member_id, None)
        self._renumber(lobby)
        self._index_lobby(lobby)
        if lobby.owner not in lobby.members:
            lobby.owner = member_id
        self.counters["recreate_merges"] += 1
        self._ensure_owner(lobby, now, notify=False)
        lobby.version = max(lobby.version, snap.version) + 1
        for gone in banned_here:
            self._out.append(
                Send((gone,), MemberLeft(lobby.lobby_id, lobby.version, gone, LeaveReason.BANNED))
            )
        self._send_state(lobby.audience(), lobby)

    @staticmethod
    def _renumber(lobby: _Lobby) -> None:
        """Number the members 0.. in their current order: copies and local joins number
        independently, and owner migration needs one order."""
        for seq, m in enumerate(lobby.members.values()):
            m.join_seq = seq
        lobby.next_join_seq = len(lobby.members)

    # --- membership changes --------------------------------------------------------------------

    def _come_back(self, lobby: _Lobby, member: _Member, now: float) -> None:
        if member.presence is Presence.RECONNECTING:
            first = len(self._out)
            member.presence = Presence.CONNECTED
            member.grace_until = None
            member.arrived = True
            self._reconnecting.pop(member.member_id, None)
            self.counters["members_reconnected"] += 1
            self._list_if_live(lobby)
            self._broadcast(
                lobby,
                lambda v: PresenceChanged(lobby.lobby_id, v, member.member_id, Presence.CONNECTED),
            )
            self._ensure_owner(lobby, now)
            # Its copy is stale: the updates of its own return would not apply to it; the
            # snapshot below holds them.
            self._out[first:] = [
                Send(tuple(m for m in send.to if m != member.member_id), send.message)
                for send in self._out[first:]
            ]
        # It missed the updates sent while it was away: the whole state, after them.
        self._send_state((member.member_id,), lobby)

    def _remove(self, lobby: _Lobby, member_id: str, reason: LeaveReason, now: float) -> None:
        audience = lobby.audience()
        del lobby.members[member_id]
        self._where.pop(member_id, None)
        self._reconnecting.pop(member_id, None)
        lobby.version += 1
        # The member itself is told too (if it can hear): a kicked member learns why.
        self._out.append(
            Send(audience, MemberLeft(lobby.lobby_id, lobby.version, member_id, reason))
        )
        if not lobby.members:
            self._delete_lobby(lobby)
            return
        self._list_if_live(lobby)
        self._ensure_owner(lobby, now)

    def _ensure_owner(self, lobby: _Lobby, now: float, *, notify: bool = True) -> None:
        connected = lobby.connected()
        intended = lobby.intended_owner
        if (
            intended is not None
            and lobby.recreated_until is not None
            and now <= lobby.recreated_until
            and intended in lobby.members
            and lobby.members[intended].presence is Presence.CONNECTED
        ):
            new_owner = intended
        elif (returning := self._returning_owner(lobby)) is not None:
            new_owner = returning
        else:
            owner = lobby.members.get(lobby.owner)
            if owner is not None and (owner.presence is Presence.CONNECTED or not connected):
                return
            if owner is not None:
                # Its session dropped (a crash, a network change, a NAT that forgot its
                # mapping): the seat is kept, and so is its claim on the lobby.
                lobby.dropped_owner = owner.member_id
            pool = connected or list(lobby.members.values())
            new_owner = min(pool, key=lambda m: m.join_seq).member_id
        if new_owner != lobby.owner:
            self.counters["owner_migrations"] += 1
            if notify:
                self._set_owner(lobby, new_owner)
            else:
                lobby.owner = new_owner

    @staticmethod
    def _returning_owner(lobby: _Lobby) -> str | None:
        """The owner whose session dropped, once it is connected again (its seat came back
        within the grace period): ownership follows the member, not its address."""
        returning = lobby.dropped_owner
        if returning is None or returning == lobby.owner:
            lobby.dropped_owner = None
            return None
        member = lobby.members.get(returning)
        if member is None:  # it left, was kicked, or its seat expired
            lobby.dropped_owner = None
            return None
        if member.presence is not Presence.CONNECTED:
            return None
        lobby.dropped_owner = None
        return returning

    def _send_state(self, to: tuple[str, ...], lobby: _Lobby) -> None:
        """The whole lobby to `to`: its snapshot, then its seat tags (if any)."""
        self._out.append(Send(to, lobby.snapshot()))
        tags = self._seat_tags(lobby)
        if tags.tags and to:
            self._out.append(Send(to, tags))

    @staticmethod
    def _seat_tags(lobby: _Lobby, only: str | None = None) -> SeatTags:
        """The tags of every seat (or of `only`'s)."""
        return SeatTags(
            lobby.lobby_id,
            tuple(
                SeatTag(m.member_id, tag)
                for m in lobby.members.values()
                if only is None or m.member_id == only
                for tag in m.tags.values()
            ),
        )

    def _own_tags(self, lobby_id: int, member_id: str) -> dict[str, bytes]:
        """The tag of the current request's session for this seat (none without a secret)."""
        if self._seats is None or not self._secret:
            return {}
        return {member_id: self._seats.tag(lobby_id, member_id, self._secret)}

    def _tag_holds(self, lobby: _Lobby, seat: _Member, secret: bytes) -> bool:
        seats = self._seats
        return (
            seats is not None
            and bool(secret)
            and any(
                seats.tag_matches(tag, lobby.lobby_id, seat.member_id, secret)
                for tag in seat.tags.values()
            )
        )

    def _set_owner(self, lobby: _Lobby, owner: str) -> None:
        if lobby.owner != owner:
            lobby.owner = owner
            self._broadcast(lobby, lambda v: OwnerChanged(lobby.lobby_id, v, owner))

    def _broadcast(self, lobby: _Lobby, make: Callable[[int], Update]) -> None:
        lobby.version += 1
        self._out.append(Send(lobby.audience(), make(lobby.version)))

    def _send(self, to: tuple[str, ...], message: Update | GameStarting) -> None:
        self._out.append(Send(to, message))

    def _take_out(self) -> tuple[Send, ...]:
        out, self._out = tuple(self._out), []
        return out

    # --- lobby table and search index ----------------------------------------------------------

    def _add_lobby(self, lobby: _Lobby) -> None:
        self._lobbies[lobby.lobby_id] = lobby
        if lobby.join_code:
            self._by_code[lobby.join_code] = lobby.lobby_id
        self._index_lobby(lobby)

    def _delete_lobby(self, lobby: _Lobby) -> None:
        self._game_deadlines.pop(lobby.lobby_id, None)
        self._unindex(lobby)
        del self._lobbies[lobby.lobby_id]
        if lobby.join_code:
            self._by_code.pop(lobby.join_code, None)
        self.counters["lobbies_deleted"] += 1

    def _index_lobby(self, lobby: _Lobby) -> None:
        if lobby.join_code and self._by_code.get(lobby.join_code) is None:
            self._by_code[lobby.join_code] = lobby.lobby_id
        self._list_if_live(lobby)

    @staticmethod
    def _listable(lobby: _Lobby) -> bool:
        """Should search and quick-join see `lobby`: public, unlocked, and not a ghost (some
        member is connected)?"""
        return (
            not lobby.private
            and not lobby.locked
            and any(m.presence is Presence.CONNECTED for m in lobby.members.values())
        )

    def _list_if_live(self, lobby: _Lobby) -> None:
        """Keep `lobby`'s listing in the index, current, exactly while it is `_listable`: every
        change to what a listing shows (members, metadata, size, name) or to whether it is
        listed comes through here."""
        if self._listable(lobby):
            self._index.put(self._listing(lobby))
        else:
            self._index.remove(lobby.lobby_id)

    def _unindex(self, lobby: _Lobby) -> None:
        if lobby.join_code and self._by_code.get(lobby.join_code) == lobby.lobby_id:
            del self._by_code[lobby.join_code]
        self._index.remove(lobby.lobby_id)

    @staticmethod
    def _matches(lobby: _Lobby, filters: Iterable[Filter], *, own_seat: bool = False) -> bool:
        """`own_seat`: the asking member sits in `lobby`, so its seat counts as free."""
        # The rules of search_index.listing_matches, on the lobby itself (with its own seat).
        taken = len(lobby.members) - (1 if own_seat else 0)
        for f in filters:
            if isinstance(f, StringEquals):
                if lobby.metadata.get(f.key) != f.value:
                    return False
            elif isinstance(f, NumberRange):
                v = lobby.metadata.get(f.key)
                if not isinstance(v, int) or not f.low <= v <= f.high:
                    return False
            elif isinstance(f, FreeSlots):
                if lobby.max_members - taken < f.minimum:
                    return False
        return True

    def _listing(self, lobby: _Lobby) -> LobbyListing:
        indexed = {k: v for k, v in lobby.metadata.items() if k in self.config.indexed_keys}
        return LobbyListing(
            lobby.lobby_id,
            lobby.name,
            len(lobby.members),
            lobby.max_members,
            indexed,
            self.server_id,
        )

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

    def _fresh_lobby_id(self) -> int:
        for _ in range(100):
            lobby_id = self._new_lobby_id()
            if 0 < lobby_id < 2**64 and lobby_id not in self._lobbies:
                return lobby_id
        raise RuntimeError("the lobby id source keeps returning ids in use")

    def _fresh_code(self) -> str:
        for _ in range(100):
            code = self._new_join_code()
            if code and code not in self._by_code:
                return code
        raise RuntimeError("the join code source keeps returning codes in use")

    # --- checks --------------------------------------------------------------------------------

    def _rate(
        self, member_id: str, kind: str, limit: RateLimit, now: float, *, repeat: bool = False
    ) -> None:
        """Spend a token of `kind`, or refuse RATE_LIMITED, the text ending with when the next
        token comes ("(retry in 0.250 s)"). A `repeat` (the very create or
        join that seated the member, asked again because its reply was lost) spends from the
        member's repeat budget instead: a member retrying under load must not use up the
        budget of its real requests, and a flood of repeats (each answered with a snapshot)
        is still bounded."""
        if repeat:
            kind, limit = "repeat", self.config.repeat_limit
        key = (member_id, kind)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = TokenBucket(limit, now)
        if not bucket.take(now):
            # The wait ends the text: a client paces itself by it (LobbyClient.search_all).
            wait = bucket.wait(now)
            _refuse(
                ErrorCode.RATE_LIMITED,
                f"too many {kind} requests; slow down (retry in {wait:.3f} s)",
            )

    def _lobby(self, lobby_id: int) -> _Lobby:
        lobby = self._lobbies.get(lobby_id)
        if lobby is None:
            _refuse(ErrorCode.NO_SUCH_LOBBY, "no such lobby")
        return lobby

    def _lobby_of_member(self, member_id: str) -> _Lobby | None:
        lobby_id = self._where.get(member_id)
        return None if lobby_id is None else self._lobbies[lobby_id]

    def _membership(self, member_id: str, lobby_id: int) -> tuple[_Lobby, _Member]:
        lobby = self._lobby(lobby_id)
        member = lobby.members.get(member_id)
        if member is None:
            _refuse(ErrorCode.NOT_MEMBER, "not a member of this lobby")
        if not member.arrived:
            # A seat a re-created lobby keeps for a member who has not come back: until it is
            # claimed (a join with its client's secret, its copy, or a hello with its seat),
            # a session naming that member is not it.
            _refuse(ErrorCode.NOT_MEMBER, "this seat is kept for a member who has not come back")
        return lobby, member

    def _owned(self, member_id: str, lobby_id: int) -> _Lobby:
        lobby, _ = self._membership(member_id, lobby_id)
        if lobby.owner != member_id:
            _refuse(ErrorCode.NOT_OWNER, "only the lobby's owner may do this")
        return lobby

    def _not_elsewhere(self, member_id: str, allowed: int | None) -> None:
        where = self._where.get(member_id)
        if where is not None and where != allowed:
            _refuse(ErrorCode.ALREADY_IN_LOBBY, f"already in lobby {where}; leave it first")

    def _check_name(self, name: str) -> None:
        size = _utf8_len(name)
        if not 1 <= size <= self.config.max_name_bytes or _has_control(name):
            _refuse(
                ErrorCode.NAME_INVALID,
                f"a lobby name is 1..{self.config.max_name_bytes} bytes without control characters",
            )

    def _check_max_members(self, n: int) -> None:
        if not 1 <= n <= self.config.max_members_cap:
            _refuse(ErrorCode.BAD_REQUEST, f"max members is 1..{self.config.max_members_cap}")

    def _check_map(self, values: Mapping[str, Value], *, max_keys: int, max_total: int) -> str:
        """Why `values` breaks the limits, or "" if it does not."""
        if len(values) > max_keys:
            return f"at most {max_keys} keys"
        total = 0
        for key, v in values.items():
            key_size = _utf8_len(key)
            if not 1 <= key_size <= self.config.max_key_bytes:
                return f"a key is 1..{self.config.max_key_bytes} bytes"
            if isinstance(v, bool) or not isinstance(v, str | int):
                return "a value is a string or an integer"
            if isinstance(v, int) and not I64_MIN <= v <= I64_MAX:
                return "an integer value is a signed 64-bit integer"
            size = _value_bytes(v)
            if isinstance(v, str) and size > self.config.max_value_bytes:
                return f"a value is at most {self.config.max_value_bytes} bytes"
            total += key_size + size
        if total > max_total:
            return f"at most {max_total} bytes in all"
        return ""

    def _check_metadata(self, metadata: Mapping[str, Value]) -> None:
        why = self._check_map(
            metadata,
            max_keys=self.config.max_metadata_keys,
            max_total=self.config.max_metadata_bytes,
        )
        if not why:
            for key in self.config.indexed_keys:
                v = metadata.get(key)
                if isinstance(v, str) and _utf8_len(v) > self.config.max_indexed_value_bytes:
                    why = (
                        f"indexed key {key!r} holds at most "
                        f"{self.config.max_indexed_value_bytes} bytes"
                    )
                    break
        if why:
            _refuse(ErrorCode.METADATA_LIMIT, f"metadata: {why}")

    def _check_attributes(self, attributes: Mapping[str, Value]) -> None:
        why = self._check_map(
            attributes,
            max_keys=self.config.max_attribute_keys,
            max_total=self.config.max_attributes_bytes,
        )
        if why:
            _refuse(ErrorCode.ATTRIBUTES_LIMIT, f"attributes: {why}")

    def _check_filters(self, filters: tuple[Filter, ...]) -> None:
        if len(filters) > self.config.max_filters:
            _refuse(ErrorCode.FILTER_INVALID, f"at most {self.config.max_filters} filters")
        for f in filters:
            if isinstance(f, StringEquals | NumberRange) and f.key not in self.config.indexed_keys:
                _refuse(ErrorCode.FILTER_INVALID, f"{f.key!r} is not an indexed key")
            if isinstance(f, NumberRange) and f.low > f.high:
                _refuse(ErrorCode.FILTER_INVALID, "a range's low end is above its high end")


def _is_its_create(lobby: _Lobby, member_id: str, req: CreateLobby) -> bool:
    """Is `lobby` what `req` made, asked again by its owner (a retry, not a second lobby)?"""
    return (
        lobby.owner == member_id
        and lobby.name == req.name
        and lobby.max_members == req.max_members
        and lobby.private == req.private
        and len(lobby.metadata) == len(req.metadata)
        # (type too: 1 and True are equal in Python, not on the wire)
        and all(
            key in lobby.metadata
            and type(lobby.metadata[key]) is type(v)
            and lobby.metadata[key] == v
            for key, v in req.metadata.items()
        )
    )


def _with_tag(kept: dict[str, bytes], sender: str, tag: bytes | None) -> dict[str, bytes]:
    """`kept` and `sender`'s `tag`: one per sender, at most MAX_SEAT_TAGS (the first kept)."""
    if tag is None or sender in kept or len(kept) >= MAX_SEAT_TAGS:
        return kept
    if any(hmac.compare_digest(tag, other) for other in kept.values()):
        return kept
    return {**kept, sender: tag}


def _same_tags(a: Mapping[str, bytes], b: Mapping[str, bytes]) -> bool:
    """Do two seats' tags say the same, compared in constant time (tags are MACs)?"""
    return a.keys() == b.keys() and all(hmac.compare_digest(a[k], b[k]) for k in a)


def _merge_changes(
    current: Mapping[str, Value], changes: Mapping[str, Value | None]
) -> tuple[dict[str, Value], dict[str, Value | None]]:
    """(the map after `changes`, the changes that did change something)."""
    merged = dict(current)
    effective: dict[str, Value | None] = {}
    for key, v in changes.items():
        if v is None:
            if key in merged:
                del merged[key]
                effective[key] = None
        elif key not in merged or merged[key] != v or type(merged[key]) is not type(v):
            merged[key] = v
            effective[key] = v
    return merged, effective


def _lobby_id(listing: LobbyListing) -> int:
    return listing.lobby_id
