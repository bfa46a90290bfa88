"""`LobbyClient`: a member's connection to the lobby service, its public operations.

Driver: trio, sessions and the clock.
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

import structlog
import trio

from echo.lobby import client_queue
from echo.lobby.agreement import code_walk
from echo.lobby.client.events import (
    Event,
    LobbyError,
    LobbyUnavailable,
    Resumed,
    ResumeRefused,
)
from echo.lobby.client.helpers import (
    CONNECT_TIMEOUT,
    FAILOVER_WAIT,
    JOIN_RETRY_INTERVAL,
    SEARCH_ALL_WAIT,
    _token_bytes,
    retry_after,
    split_server,
)
from echo.lobby.client.rehome import _Rehome
from echo.lobby.client.state import (
    _Link,
)
from echo.lobby.home import failover_home, past_dead
from echo.lobby.keys import RingKeys, ring_pins
from echo.lobby.protocol import (
    BanMember,
    CreateLobby,
    ErrorCode,
    Filter,
    JoinByCode,
    JoinLobby,
    KickMember,
    LeaveLobby,
    LobbyListing,
    QuickJoin,
    Reply,
    ReportGameServer,
    Request,
    RequestTicket,
    SearchLobbies,
    SearchResults,
    SendChat,
    SetAttributes,
    SetLocked,
    SetMetadata,
    SetReady,
    StartGame,
    StringEquals,
    TransferOwner,
    Value,
)
from echo.lobby.replica import LobbyReplica
from echo.lobby.resume import (
    ResumeReason,
    ResumeTokenError,
    decode_resume_token_untrusted,
)
from echo.topics.ring import HashRing

log = structlog.get_logger("echo.lobby.client")


class LobbyClient(_Rehome):
    """A member's connection to the lobby service. Use `connect`."""

    def __init__(
        self,
        servers: Sequence[str],
        member: str,
        nursery: trio.Nursery,
        transport: Any,
        *,
        timeout: float,
        reconnect: bool,
        connect_timeout: float = CONNECT_TIMEOUT,
        identity_token: str | bytes | None = None,
        server_key: RingKeys = None,
    ) -> None:
        if not servers:
            raise ValueError("the lobby-server list is empty")
        for server in servers:
            split_server(server)
        self.servers = list(servers)
        self._pins = ring_pins(self.servers, server_key)
        self.ring = HashRing(self.servers)
        self.member = member
        # Sent in every hello: the server binds a seat taken on our session to it, so that
        # this client (and no other naming the same member) gets the seat back without the
        # seat itself, should the LobbyJoined carrying it be lost.
        self.secret = secrets.token_bytes(16)
        self._identity_token = _token_bytes(identity_token)
        self.timeout = timeout
        self.connect_timeout = min(timeout, connect_timeout)
        self.auto_reconnect = reconnect
        self._nursery = nursery
        self._transport = transport
        self._link: _Link | None = None
        self._request_ids = itertools.count(1)
        self._pending: dict[int, trio.MemoryReceiveChannel[Reply]] = {}
        self._pending_send: dict[int, trio.MemorySendChannel[Reply]] = {}
        self._events_in, self._events_out = trio.open_memory_channel[Event](10_000)
        self.events_dropped = 0
        self.replica: LobbyReplica | None = None
        self._seats: dict[int, bytes] = {}
        #: The seat's resume token (`echo.lobby.resume`): keep it (a state file) and pass it to
        #: `connect(resume_token=...)` in a new process to take the seat back after a crash.
        #: Set as soon as the member is seated and renewed every grace period, each time also
        #: sent as a `ResumeToken` event; None when not seated.
        self.resume_token: bytes | None = None
        self._changed = trio.Event()
        self.dead: set[str] = set()
        self._lock = trio.Lock()  # one server switch at a time
        self._recovering = False
        #: The matchmaker entry this member waits with (`queue`), None when not queued.
        self.waiting: client_queue.Waiting | None = None

    # ------------------------------------------------------------------ the API

    async def connect(self) -> None:
        """Open a session to this member's server now (otherwise the first request does)."""
        await self._connect_any()

    async def resume(self, token: bytes) -> int:
        """Take this member's seat back with `token` (another process's `resume_token`: this
        one's predecessor, crashed or killed): on the lobby's home, or on the server of its
        ring where the lobby was re-created if the home is gone (asked again for
        `FAILOVER_WAIT` while the other members re-create it). The lobby id; the seat comes
        back with its ready state and attributes, and a session of the old process still open
        is replaced. Raises `ResumeRefused` (forged, expired, replayed, seat gone), or
        `LobbyUnavailable` if no server of the lobby answers."""
        try:
            claims = decode_resume_token_untrusted(token)
        except ResumeTokenError as error:
            raise ResumeRefused(ResumeReason.MALFORMED, "(not sent)", str(error)) from None
        if claims.member_id != self.member:
            raise ResumeRefused(
                ResumeReason.WRONG_MEMBER, "(not sent)", f"the token is {claims.member_id!r}'s"
            )
        self._not_in_a_lobby()
        lobby_id = claims.lobby_id
        deadline = trio.current_time() + FAILOVER_WAIT
        tried: set[str] = set()  # (silent in this walk; servers marked dead are asked last)
        async with self._lock:
            while True:
                target = failover_home(self.ring, lobby_id, self.dead | tried) or failover_home(
                    self.ring, lobby_id, tried
                )
                if target is None:
                    raise LobbyUnavailable(f"every lobby server of lobby {lobby_id} is gone")
                try:
                    await self._open(target, self.connect_timeout, resume=token)
                except ResumeRefused as refused:
                    # A server of the ring other than the home may not have the lobby yet:
                    # the members re-create it there within seconds of the home's death.
                    home = failover_home(self.ring, lobby_id, ())
                    if refused.reason is not ResumeReason.NOT_SEATED or target == home:
                        raise
                    if trio.current_time() >= deadline:
                        raise
                    await trio.sleep(JOIN_RETRY_INTERVAL)
                    continue
                except LobbyUnavailable:
                    if target not in self.dead:
                        raise  # it answered, and not with a resume refusal
                    tried.add(target)
                    continue  # silent: the next server of the ring
                break
        await self.wait_until(lambda c: c.replica is not None and c.replica.lobby_id == lobby_id)
        self._event(Resumed(lobby_id, target))
        return lobby_id

    async def create(
        self,
        name: str,
        max_members: int = 8,
        *,
        private: bool = False,
        metadata: Mapping[str, Value] | None = None,
    ) -> int:
        """Create a lobby on the current server (its id lands there by CH); its id.

        Asked again after its reply was lost (`NoReply`), the same create returns the lobby
        the first one made."""
        request = CreateLobby(0, name, max_members, private, metadata or {})
        reply = await self._request(request, server=self._seated_server())
        return await self._joined(reply)

    async def join(self, lobby_id: int) -> int:
        """Join by id on the lobby's home, walking on past dead servers.

        A member who joins while the home is failing over is not lost: past a dead home, the
        next server of the ring says NO_SUCH_LOBBY until the lobby's members have re-created
        it there (within the 5 s failover bound), so the join is asked again there, every
        `JOIN_RETRY_INTERVAL`, for up to `FAILOVER_WAIT`."""
        self._not_in_a_lobby(allowed=lobby_id)
        last: Exception | None = None
        deadline = trio.current_time() + FAILOVER_WAIT
        tried: set[str] = set()  # (found silent in this walk; marked dead ones are asked last)
        attempts = 0
        while attempts < len(self.servers) + 1:
            home = failover_home(self.ring, lobby_id, self.dead | tried) or failover_home(
                self.ring, lobby_id, tried
            )
            if home is None:
                break
            try:
                reply = await self._request(JoinLobby(0, lobby_id), server=home)
                return await self._joined(reply)
            except LobbyUnavailable as error:
                last = error
                attempts += 1
                if home in self.dead:
                    tried.add(home)  # silent: the next server (a dropped session: again)
            except LobbyError as error:
                first_home = failover_home(self.ring, lobby_id, set())
                failing_over = home != first_home
                if (
                    error.code is not ErrorCode.NO_SUCH_LOBBY
                    or not failing_over
                    or trio.current_time() >= deadline
                ):
                    raise
                log.info("lobby_join_waits_for_failover", lobby_id=lobby_id, server=home)
                await trio.sleep(JOIN_RETRY_INTERVAL)
        raise LobbyUnavailable(f"no server holds lobby {lobby_id}: {last}")

    async def join_code(self, code: str) -> int:
        """Join a private lobby by its code: the code's own server first, then along its ring."""
        code = code.strip().upper()
        request = JoinByCode(0, code)
        mine = self.replica
        if mine is not None and mine.join_code == code:
            # Its own lobby's code (a join asked again after its reply was lost): the lobby
            # is where this member is, whether or not that is still the code's home.
            return await self._join_walk([self._seated_server()], request, ErrorCode.NO_SUCH_CODE)
        self._not_in_a_lobby()
        walk = code_walk(self.ring, code, len(self.servers))
        # (servers marked dead last, not never: `past_dead`)
        return await self._join_walk(past_dead(walk, self.dead), request, ErrorCode.NO_SUCH_CODE)

    async def quick_join(self, filters: Sequence[Filter] = ()) -> int:
        """Join the fullest open lobby that matches, on the current server, then the others.

        In a lobby, only its server is asked: the same quick-join asked again after its reply
        was lost returns the lobby the first one joined, if it still matches."""
        request = QuickJoin(0, tuple(filters))
        seated = self._seated_server()
        if seated is not None:
            return await self._join_walk([seated], request, ErrorCode.NO_MATCH)
        first = self.server
        order = past_dead(([first] if first else []) + self.servers, self.dead)
        return await self._join_walk(order, request, ErrorCode.NO_MATCH)

    async def search(
        self, filters: Sequence[Filter] = (), *, cursor: int | None = None, limit: int = 20
    ) -> SearchResults:
        """One page of every server's listed lobbies (each names its `home`)."""
        reply = await self._request(SearchLobbies(0, tuple(filters), cursor, limit))
        assert isinstance(reply, SearchResults)
        return reply

    async def search_all(
        self, filters: Sequence[Filter] = (), limit: int = 20, *, max_wait: float = SEARCH_ALL_WAIT
    ) -> list[LobbyListing]:
        """Every page of a search, paced under the server's search rate limit.

        A page refused RATE_LIMITED is asked again (the same cursor: nothing is seen twice or
        missed) after the wait the refusal names, or, from a server that names none, one
        interval of the default search limit (1 s). Raises `LobbyError` RATE_LIMITED only if
        the waits would pass `max_wait` seconds in all; any other refusal at once.
        """
        out: list[LobbyListing] = []
        cursor: int | None = None
        waited = 0.0
        while True:
            try:
                page = await self.search(filters, cursor=cursor, limit=limit)
            except LobbyError as error:
                if error.code is not ErrorCode.RATE_LIMITED:
                    raise
                wait = retry_after(error.message)
                if waited + wait > max_wait:
                    raise
                waited += wait
                await trio.sleep(wait)
                continue
            out.extend(page.listings)
            if page.next_cursor is None:
                return out
            cursor = page.next_cursor

    async def leave(self) -> None:
        lobby_id = self._require_lobby()
        await self._request(LeaveLobby(0, lobby_id))
        if self.replica is not None and self.replica.lobby_id == lobby_id:
            self.replica = None

    async def set_metadata(self, changes: Mapping[str, Value | None]) -> None:
        await self._request(SetMetadata(0, self._require_lobby(), dict(changes)))

    async def lock(self, locked: bool = True) -> None:
        await self._request(SetLocked(0, self._require_lobby(), locked))

    async def kick(self, member: str) -> None:
        await self._request(KickMember(0, self._require_lobby(), member))

    async def ban(self, member: str) -> None:
        await self._request(BanMember(0, self._require_lobby(), member))

    async def transfer(self, member: str) -> None:
        await self._request(TransferOwner(0, self._require_lobby(), member))

    async def set_attributes(self, changes: Mapping[str, Value | None]) -> None:
        await self._request(SetAttributes(0, self._require_lobby(), self.member, dict(changes)))

    async def ready(self, ready: bool = True) -> None:
        await self._request(SetReady(0, self._require_lobby(), self.member, ready))

    async def chat(self, text: str) -> None:
        """Send a chat line; returns once the server took it (held back by credit when
        sending faster than the server's chat rate)."""
        await self._request(SendChat(0, self._require_lobby(), text))

    async def start(self, tags: Mapping[str, str] | None = None) -> None:
        """Owner only: every member gets a `GameStarting` with its ticket. `tags` choose the
        game server by the tags it announced (``{"region": "eu", "mode": "ctf"}``); among
        those that match, the one with the most free slots."""
        filters = tuple(StringEquals(k, v) for k, v in (tags or {}).items())
        await self._request(StartGame(0, self._require_lobby(), filters))

    async def request_ticket(self) -> None:
        """A fresh ticket for the lobby's running game (a player whose process crashed and
        resumed its seat, or whose ticket expired): it arrives as a new `GameStarting`."""
        await self._request(RequestTicket(0, self._require_lobby()))

    async def report_game_server(self, server_id: str, reason: str) -> None:
        """Tell the lobby that the game server of the running game refused our ticket
        (`reason`: its refusal): once half the players have, the lobby takes that server out
        of rotation and ends the game (`GameEnded` with ``{"error": "game_server_refused"}``),
        so the owner can start again on another."""
        await self._request(ReportGameServer(0, self._require_lobby(), server_id, reason[:1000]))

    async def queue(
        self,
        mode: str,
        region: str,
        *,
        skill: int = 0,
        size: int = 2,
        party: bool = False,
        strict_region: bool = False,
        start: bool = False,
    ) -> int:
        """Ask the matchmaker for a match of `size` players (`echo.lobby.client_queue`): the
        ticket id; a `Matched` event follows, and this member then sits in the match's lobby
        (started at once if every ticket asked to `start`). With `party`, this member's lobby
        queues as one ticket: each of its members calls this."""
        return await client_queue.queue(
            self,
            mode,
            region,
            skill=skill,
            size=size,
            party=party,
            strict_region=strict_region,
            start=start,
        )

    async def cancel_queue(self) -> None:
        """Leave the matchmaker's queue (`LobbyError` NOT_QUEUED if not queued)."""
        await client_queue.cancel(self)

    async def request(self, request: Request) -> Reply:
        """Any request as it is (tests, tools); refusals raise `LobbyError`."""
        return await self._request(request)
