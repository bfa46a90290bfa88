"""The lobby library a game embeds::

    import echo.lobby

    async with echo.lobby.connect(["10.0.0.1:7600", "10.0.0.2:7600"], member="alice") as lobby:
        lobby_id = await lobby.create("alice's room", max_members=4, metadata={"mode": "duel"})
        await lobby.ready()
        async for event in lobby.events():     # updates, chat lines, GameStarting, ...
            ...

The client talks to one lobby server at a time over one `echo.session` session carrying the
lobby's three logical channels (`echo.lobby.server.lobby_channel_specs`). It keeps a
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
"""

from __future__ import annotations

import contextlib
import itertools
import random
import re
import secrets
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any

import attrs
import structlog
import trio

from echo.channels import ChannelsClosed, open_channels
from echo.channels.api import Channels
from echo.lobby import client_queue
from echo.lobby.hello import MAX_TOKEN_BYTES, Hello, encode_hello, parse_welcome_untrusted
from echo.lobby.home import failover_home
from echo.lobby.identity import parse_close_reason, token_subject
from echo.lobby.keys import RingKeys, ring_pins
from echo.lobby.limits import LobbyConfig
from echo.lobby.protocol import (
    I64_MAX,
    I64_MIN,
    BanMember,
    Channel,
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
    LobbyJoined,
    LobbyListing,
    LobbyProtocolError,
    LobbySnapshot,
    NumberRange,
    QuickJoin,
    Refusal,
    Reply,
    ReportGameServer,
    Request,
    RequestTicket,
    ResumeToken,
    SearchLobbies,
    SearchResults,
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
    channel_of,
    encode,
    parse_server_message_untrusted,
)
from echo.lobby.queue_wire import Matched, Queued, QueueLeft
from echo.lobby.replica import ApplyResult, LobbyReplica
from echo.lobby.resume import (
    ResumeReason,
    ResumeTokenError,
    decode_resume_token_untrusted,
    parse_refusal_reason,
)
from echo.lobby.server import code_walk, lobby_channel_specs
from echo.lobby.timers import CLIENT_LIVENESS, RETRY_TIMEOUT, lobby_client_timers
from echo.session import HandshakeTimeout, LostContact, SessionClosed, SessionError
from echo.session import connect as session_connect
from echo.session.machine import HandshakeState
from echo.topics.ring import HashRing
from echo.transport import TransportConfig

log = structlog.get_logger("echo.lobby.client")

#: How long a handshake with a lobby server may take before the next server is tried (a
#: handshake on a working network takes one or two round trips; a loaded server, admitting
#: hundreds of members a second, may need more: `connect(connect_timeout=...)`,
#: ``echo-lobby-client --connect-timeout``).
CONNECT_TIMEOUT = 3.0
#: A join past a dead home waits this long for the lobby's members to re-create it on the next
#: server (they do within 5 s of the death; twice that allows for a loaded machine), asking
#: again every `JOIN_RETRY_INTERVAL`.
FAILOVER_WAIT = 10.0
#: A lobby whose home is its only server: how long a member whose session went silent keeps
#: asking that home to take it back (its seat is kept for the server's grace period, 20 s).
ONLY_HOME_RETRY = 20.0
JOIN_RETRY_INTERVAL = 0.25
#: How long `search_all` may wait, in all, for a server's search rate limit to let it go on.
SEARCH_ALL_WAIT = 30.0
#: A RATE_LIMITED refusal's text ends with the wait its server asks for ("(retry in 0.250 s)").
_RETRY_IN = re.compile(r"\(retry in ([0-9]{1,6}(?:\.[0-9]{1,6})?) s\)$")
# What a join walk that found nothing says (the servers' own refusals say the same).
_NOT_THERE = {
    ErrorCode.NO_SUCH_CODE: "no lobby has this code",
    ErrorCode.NO_MATCH: "no open lobby matches",
}


class LobbyError(Exception):
    """The lobby server refused a request."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


class LobbyUnavailable(Exception):
    """No lobby server could be reached (or the one that holds the lobby is gone)."""


class ResumeRefused(Exception):
    """A lobby server answered and refused to give the seat back for this resume token:
    `reason` (`echo.lobby.resume.ResumeReason`) says why, `server` which server it was."""

    def __init__(self, reason: ResumeReason, server: str, message: str) -> None:
        super().__init__(f"{reason.name}: {server}: {message}")
        self.reason = reason
        self.server = server
        self.message = message


class AuthRefused(LobbyUnavailable):
    """The lobby (``echo-lobby --auth-key``) refused the member's identity token: `reason` is
    one of `echo.lobby.identity.REASONS` ("expired", "wrong_audience", ...), `detail` the
    server's words. Every lobby server of a ring checks the same keys, so no other server is
    tried: get a fresh token from the game's backend (`LobbyClient.identity_token`)."""

    def __init__(self, server: str, reason: str, detail: str) -> None:
        super().__init__(f"{server}: identity refused: {reason}: {detail}")
        self.reason = reason
        self.detail = detail


class NoReply(LobbyUnavailable):
    """The request went out but its reply did not come back (the session dropped, or no reply
    within the timeout): the server may have carried it out. Asked again, a create or join
    is answered with the lobby it made or joined (and its seat)."""


@attrs.frozen
class Rehomed:
    """The lobby's home died; this member re-created (or joined) it on `server`.

    On a restarted home that is the lobby's only server, only the members that find the
    lobby gone and send their copy see this; one whose retry comes after the lobby is back
    finds its seat there, which looks like a home that kept it: it sees `Reconnected`.
    """

    lobby_id: int
    server: str


@attrs.frozen
class Reconnected:
    """The session dropped and came back to `server` (the seat was kept)."""

    server: str


@attrs.frozen
class Left:
    """This member is no longer in the lobby (`reason`: left, kicked, banned, dropped, ...)."""

    lobby_id: int
    reason: str


@attrs.frozen
class Resumed:
    """This new client took its seat in `lobby_id` back on `server` with a resume token (its
    ready state and attributes as they were: the snapshot follows)."""

    lobby_id: int
    server: str


Event = (
    Update | ChatLine | GameStarting | ResumeToken | Rehomed | Reconnected | Resumed | Left
    | Matched | QueueLeft
)


def split_server(server: str) -> tuple[str, int, int]:
    """``host:port`` (control port = port + 1), ``host:port:control``, ``[v6]:port[:control]``."""
    if server.startswith("["):
        host, _, rest = server[1:].partition("]")
        numbers = rest[1:].split(":") if rest.startswith(":") else []
    else:
        host, *numbers = server.split(":")
    if not host or len(numbers) not in (1, 2) or not all(n.isdigit() for n in numbers):
        raise ValueError(f"{server!r} is not host:port")
    port = int(numbers[0])
    control = int(numbers[1]) if len(numbers) == 2 else port + 1
    if not 0 < port < 65536 or not 0 < control < 65536:
        raise ValueError(f"{server!r} is not host:port")
    return host, port, control


def filters_from(
    equals: Mapping[str, str] | None = None,
    ranges: Mapping[str, tuple[int | None, int | None]] | None = None,
    free_slots: int | None = None,
) -> tuple[Filter, ...]:
    """Search filters: ``equals={"mode": "duel"}, ranges={"skill": (10, 20)}, free_slots=2``."""
    out: list[Filter] = [StringEquals(k, v) for k, v in (equals or {}).items()]
    for key, (low, high) in (ranges or {}).items():
        out.append(
            NumberRange(key, I64_MIN if low is None else low, I64_MAX if high is None else high)
        )
    if free_slots is not None:
        out.append(FreeSlots(free_slots))
    return tuple(out)


class _Link:
    """One session to one lobby server, with its channels."""

    def __init__(self, server: str) -> None:
        self.server = server
        self.resume = b""  # a resume token for the hello (a new process taking its seat back)
        self.channels: Channels | None = None
        self.closed = trio.Event()
        self.close_reason = ""
        self.dropped = False  # ended without our asking
        self.wanted_close = False
        self.cancel_scope = trio.CancelScope()
        self.session: Any = None


class LobbyClient:
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

    # ------------------------------------------------------------------ state

    @property
    def identity_token(self) -> bytes:
        """Sent in every hello (a lobby with --auth-key checks it on every new session, the
        reconnections included): replace it with a fresh one before it expires."""
        return self._identity_token

    @identity_token.setter
    def identity_token(self, token: str | bytes | None) -> None:
        self._identity_token = _token_bytes(token)

    @property
    def server(self) -> str | None:
        """The lobby server this member is talking to."""
        return None if self._link is None else self._link.server

    @property
    def lobby_id(self) -> int | None:
        return None if self.replica is None else self.replica.lobby_id

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._iterate()

    def events(self) -> AsyncIterator[Event]:
        """Everything the server sends (updates, chat, game starts) and what the client does
        on its own (`Rehomed`, `Reconnected`, `Left`), in arrival order."""
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Event]:
        async for event in self._events_out:
            yield event

    async def next_event(self, kind: type | tuple[type, ...] = object) -> Any:
        """The next event of `kind` (others before it are skipped)."""
        while True:
            event = await self._events_out.receive()
            if isinstance(event, kind):
                return event

    async def wait_until(self, predicate: Any, timeout: float | None = None) -> None:
        """Until predicate(self) holds (checked after every message)."""
        with trio.fail_after(timeout if timeout is not None else self.timeout):
            while not predicate(self):
                changed = self._changed
                await changed.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _event(self, event: Event) -> None:
        try:
            self._events_in.send_nowait(event)
        except trio.WouldBlock:
            self.events_dropped += 1
        except trio.ClosedResourceError:
            pass  # the client is closing

    # ------------------------------------------------------------------ links

    async def _open(self, server: str, timeout: float, resume: bytes = b"") -> _Link:
        """A new link to `server` (the old one closed first); with a resume token, one that
        takes this member's seat back (`ResumeRefused` if the server will not)."""
        await self._close_link()
        link = _Link(server)
        link.resume = resume
        try:
            await self._nursery.start(self._run_link, link, timeout)
        except (SessionError, OSError, trio.TooSlowError, ChannelsClosed) as error:
            refused = parse_refusal_reason(str(error)) if resume else None
            if refused is not None:
                raise ResumeRefused(refused, server, str(error)) from None
            # Silence is what a dead server looks like; a server that answers with a refusal
            # (its reason in the error) is alive, and stays on the members' walk of the ring.
            if isinstance(error, HandshakeTimeout | LostContact | OSError | trio.TooSlowError):
                self.dead.add(server)
            if isinstance(error, HandshakeTimeout) and error.phase is HandshakeState.CONNECTING:
                raise LobbyUnavailable(f"{server} within {error.timeout:g} s") from None
            auth = isinstance(error, SessionClosed) and parse_close_reason(error.reason)
            if auth:
                raise AuthRefused(server, *auth) from None
            raise LobbyUnavailable(f"{server}: {error}") from None
        self.dead.discard(server)
        self._link = link
        return link

    async def _close_link(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            link.wanted_close = True
            link.cancel_scope.cancel()
            await link.closed.wait()

    async def _run_link(self, link: _Link, timeout: float, *, task_status: Any) -> None:
        host, port, control = split_server(link.server)
        started = False
        try:
            with link.cancel_scope:
                # resume=False: the lobby has its own way back (the member's seat, on this
                # server or the next of the ring); a session resume would keep a link to a dead
                # home alive for its whole window and hide the failover.
                async with session_connect(
                    host, port, control, timeout=timeout, transport=self._transport, resume=False,
                    server_key=self._pins.get(link.server),
                ) as session:  # fmt: skip
                    link.session = session
                    seat = b""
                    if self.replica is not None:
                        seat = self.replica.seat
                    hello = Hello(self.member, seat, self.secret, self.identity_token, link.resume)
                    await session.send(encode_hello(hello))
                    with trio.fail_after(timeout):
                        welcome = await session.receive()
                    if parse_welcome_untrusted(welcome) is None:
                        raise LobbyUnavailable(f"{link.server} is not a lobby server")
                    async with open_channels(
                        session, lobby_channel_specs(server=False)
                    ) as channels:
                        link.channels = channels
                        started = True
                        task_status.started()
                        async with trio.open_nursery() as nursery:
                            nursery.start_soon(self._read_quietly, link, Channel.REQUESTS)
                            nursery.start_soon(self._read_quietly, link, Channel.CHAT)
                            await self._read_quietly(link, Channel.UPDATES)
                            nursery.cancel_scope.cancel()
        except (SessionError, ChannelsClosed, trio.ClosedResourceError) as error:
            if not started:
                raise
            link.close_reason = str(error)
        finally:
            link.closed.set()
            if started and not link.wanted_close:
                link.dropped = True
                self._fail_pending(link)
                if self._link is link:
                    self._link = None
                    # Recovering from now on, not from when `_recover` first runs: a request
                    # made meanwhile (a chat loop) would connect to any server instead of
                    # waiting, and `_recover`, finding a link, would never re-home the lobby.
                    self._recovering = True
                    self._nursery.start_soon(self._recover, link)
            self._notify()

    def _fail_pending(self, link: _Link) -> None:
        for send in list(self._pending_send.values()):
            send.close()

    async def _read_quietly(self, link: _Link, ch: Channel) -> None:
        try:
            await self._read(link, ch)
        except (SessionError, ChannelsClosed, trio.ClosedResourceError) as error:
            link.close_reason = link.close_reason or str(error)

    async def _read(self, link: _Link, ch: Channel) -> None:
        assert link.channels is not None
        async for delivery in link.channels[ch]:
            try:
                message = parse_server_message_untrusted(delivery.data)
            except LobbyProtocolError as error:
                log.warning("lobby_bad_server_message", server=link.server, error=str(error))
                continue
            self._on_message(message)
            self._notify()
        if ch is Channel.UPDATES:
            link.close_reason = link.close_reason or "the server ended the session"

    def _on_message(self, message: Any) -> None:
        if isinstance(message, Refusal | Done | LobbyJoined | SearchResults | Queued):
            if isinstance(message, LobbyJoined):
                self._seats[message.lobby_id] = message.seat
                if self.replica is not None and self.replica.lobby_id == message.lobby_id:
                    self.replica.seat = message.seat
            send = self._pending_send.get(message.request_id)
            if send is not None:
                with contextlib.suppress(trio.WouldBlock, trio.ClosedResourceError):
                    send.send_nowait(message)
            return
        if isinstance(message, LobbySnapshot):
            if self.replica is None or self.replica.lobby_id != message.lobby_id:
                self.replica = LobbyReplica(
                    self.member, message, self._seats.get(message.lobby_id, b"")
                )
            else:
                self.replica.apply(message)
            self._event(message)
            return
        if isinstance(message, Matched | QueueLeft):
            # Matched: the match's LobbyJoined and snapshot follow (the snapshot makes it
            # our lobby); QueueLeft: out of the queue without a match.
            self.waiting = None
            self._event(message)
            return
        if isinstance(message, ChatLine | GameStarting):
            self._event(message)
            return
        if isinstance(message, ResumeToken):
            if self.replica is None or self.replica.lobby_id == message.lobby_id:
                self.resume_token = message.token
                self._event(message)
            return
        if isinstance(message, SeatTags):
            # The seats' tags, for our copy (not an event: nothing a game acts on).
            if self.replica is not None:
                self.replica.apply(message)
            return
        replica = self.replica
        if replica is None:
            return
        result = replica.apply(message)
        if result is ApplyResult.GAP:
            # Missed an update: ask for the whole state again.
            self._nursery.start_soon(self._resync, replica.lobby_id)
        elif result is ApplyResult.LEFT:
            self.replica = None
            self.resume_token = None
            reason = getattr(message, "reason", None)
            self._event(message)
            self._event(Left(replica.lobby_id, reason.name.lower() if reason else "left"))
            return
        if result is ApplyResult.APPLIED:
            self._event(message)

    async def _resync(self, lobby_id: int) -> None:
        with contextlib.suppress(LobbyError, LobbyUnavailable):
            await self._request(JoinLobby(0, lobby_id))

    async def _recover(self, link: _Link) -> None:
        """`_recover_link`, and the requests waiting for it let go whichever way it ends."""
        try:
            await self._recover_link(link)
        finally:
            self._recovering = False
            self._notify()

    async def _recover_link(self, link: _Link) -> None:
        """The session dropped. Back to the same server if it answers (the seat is kept for
        the grace period); else, with a lobby, to the next server of its ring, re-creating it
        from the replica."""
        if "replaced by a new session" in link.close_reason:
            # Another session of this member took the seat (another device, or this program
            # restarted): coming back would only take it back and start a tug of war.
            if self.replica is not None:
                self._event(Left(self.replica.lobby_id, "replaced"))
                self.replica = None
                self.resume_token = None
            return
        if not self.auto_reconnect:
            return
        if self.waiting is not None:
            self._nursery.start_soon(client_queue.send_again, self)
        async with self._lock:
            if self._link is not None:
                return
            self._recovering = True
            try:
                shut_down = "shutting down" in link.close_reason
                # After silence the server may be dead: retry briefly (the 5 s budget of a
                # re-created lobby). After a close it answered, so it is most likely alive.
                silent = "lost contact" in link.close_reason
                if not shut_down:
                    try:
                        await self._open(
                            link.server, RETRY_TIMEOUT if silent else self.connect_timeout
                        )
                    except AuthRefused:
                        raise
                    except LobbyUnavailable:
                        pass
                    else:
                        self._event(Reconnected(link.server))
                        if self.replica is not None:
                            await self._check_still_there(self.replica)
                        return
                replica = self.replica
                if (
                    replica is not None
                    and failover_home(self.ring, replica.lobby_id, self.dead | {link.server})
                    is None
                ):
                    # No other server to take the lobby: the home is silent, not necessarily
                    # dead (a loaded machine, a restart). Keep asking it, as long as it may
                    # still hold the seat (a restarted one gets the lobby back from us).
                    await self._back_to_the_only_home(link.server, replica)
                    return
                self.dead.add(link.server)
                if replica is None:
                    return
                await self._rehome(replica)
            except LobbyUnavailable as error:
                log.warning("lobby_unavailable", member=self.member, error=str(error))
            finally:
                self._recovering = False
                self._notify()

    async def _back_to_the_only_home(self, server: str, replica: LobbyReplica) -> None:
        deadline = trio.current_time() + ONLY_HOME_RETRY
        while trio.current_time() < deadline and self.replica is replica:
            try:
                await self._open(server, self.connect_timeout)
            except AuthRefused:
                raise
            except LobbyUnavailable:
                continue  # (each attempt waited for its handshake's timeout)
            self.dead.discard(server)
            self._event(Reconnected(server))
            await self._check_still_there(replica)
            return
        raise LobbyUnavailable(f"{server} did not answer again within {ONLY_HOME_RETRY} s")

    async def _check_still_there(self, replica: LobbyReplica) -> None:
        """Back on the same server: if it restarted meanwhile it has forgotten the lobby, and
        it is still the lobby's home, so the lobby is re-created there from our copy."""
        reply = await self._exchange(JoinLobby(self._next_id(), replica.lobby_id))
        if isinstance(reply, Refusal) and reply.code is ErrorCode.NO_SUCH_LOBBY:
            recreated = await self._exchange(replica.recreate_request(self._next_id()))
            if isinstance(recreated, LobbyJoined):
                self._event(Rehomed(replica.lobby_id, self.server or ""))

    async def _rehome(self, replica: LobbyReplica) -> None:
        while True:
            target = failover_home(self.ring, replica.lobby_id, self.dead)
            if target is None:
                raise LobbyUnavailable("every lobby server of this lobby is gone")
            try:
                await self._open(target, self.connect_timeout)
            except AuthRefused:
                raise
            except LobbyUnavailable:
                # Silent, _open marked it dead; a server that refused (draining, full) will
                # not take the lobby either: walk on past it too, or this loop never ends.
                self.dead.add(target)
                continue
            reply = await self._exchange(replica.recreate_request(self._next_id()))
            if isinstance(reply, LobbyJoined):
                self._event(Rehomed(replica.lobby_id, target))
                return
            if isinstance(reply, Refusal) and reply.code is ErrorCode.RECREATE_REFUSED:
                # It lives there already (another member's copy made it, or we are a member):
                # a join with our seat brings the state.
                joined = await self._exchange(JoinLobby(self._next_id(), replica.lobby_id))
                if isinstance(joined, LobbyJoined):
                    self._event(Rehomed(replica.lobby_id, target))
                    return
            raise LobbyUnavailable(f"the lobby could not be re-created on {target}: {reply}")

    # ------------------------------------------------------------------ requests

    def _next_id(self) -> int:
        return next(self._request_ids) % 2**32 or next(self._request_ids)

    async def _exchange(self, request: Request) -> Reply:
        """Send on the current link and wait for the reply (no retry)."""
        link = self._link
        if link is None or link.channels is None:
            raise LobbyUnavailable("not connected to a lobby server")
        send, receive = trio.open_memory_channel[Reply](1)
        rid = request.request_id
        self._pending_send[rid] = send
        try:
            with trio.fail_after(self.timeout):
                await link.channels[channel_of(request)].send(encode(request))
                try:
                    return await receive.receive()
                except trio.EndOfChannel:
                    raise NoReply(f"{link.server}: the session dropped") from None
        except ChannelsClosed as error:
            raise NoReply(f"{link.server}: {error.reason}") from None
        except trio.TooSlowError:
            raise NoReply(f"{link.server}: no reply in {self.timeout} s") from None
        finally:
            self._pending_send.pop(rid, None)

    async def _request(self, request: Request, server: str | None = None) -> Reply:
        """On `server` (or the current one, or the member's own server), refusals raised."""
        request = attrs.evolve(request, request_id=self._next_id())
        await self._wait_recovered()
        if server is not None and self.server != server:
            async with self._lock:
                # (A recovery may have reopened it while we waited for the lock.)
                if self.server != server:
                    await self._open(server, self.connect_timeout)
        elif self._link is None:
            await self._connect_any()
        link = self._link
        try:
            reply = await self._exchange(request)
        except NoReply:
            if server is not None or not await self._handed_off(link):
                raise
            # The server drained (echo.lobby.drain): a request without a reply before its
            # goodbye was not carried out; ask the server the lobby moved to.
            reply = await self._exchange(attrs.evolve(request, request_id=self._next_id()))
        if isinstance(reply, Refusal):
            raise LobbyError(reply.code, reply.message)
        return reply

    async def _handed_off(self, link: _Link | None) -> bool:
        """`link` ended with its server's goodbye (a drain), and this member is on another
        server now; False for any other end (the request may have been carried out)."""
        if link is None:
            return False
        with trio.move_on_after(self.timeout):
            await link.closed.wait()
        if "shutting down" not in link.close_reason:
            return False
        with contextlib.suppress(trio.TooSlowError):
            await self.wait_until(
                lambda c: c._link is not None and c._link is not link and not c._recovering,
                timeout=self.timeout * 2,
            )
            return True
        return False

    async def _wait_recovered(self) -> None:
        if self._recovering:
            await self.wait_until(lambda c: not c._recovering, timeout=self.timeout * 2)

    async def _connect_any(self) -> None:
        """The member's own server by CH of its id, or the next that answers."""
        async with self._lock:
            if self._link is not None:
                return
            order = self.ring.servers_for(f"member:{self.member}", len(self.servers))
            errors = []
            for server in sorted(order, key=lambda s: s in self.dead):
                try:
                    await self._open(server, self.connect_timeout)
                    return
                except AuthRefused:
                    raise  # (every server of the ring checks the same keys)
                except LobbyUnavailable as error:
                    errors.append(str(error))
            raise LobbyUnavailable(_none_let_in(order, self.dead, errors))

    async def _joined(self, reply: Reply) -> int:
        assert isinstance(reply, LobbyJoined)
        lobby_id = reply.lobby_id
        await self.wait_until(lambda c: c.replica is not None and c.replica.lobby_id == lobby_id)
        return lobby_id

    def _not_in_a_lobby(self, allowed: int | None = None) -> None:
        # Checked here too: moving to another server for another lobby would leave this
        # lobby's seat reconnecting on its own server.
        if self.replica is not None and self.replica.lobby_id != allowed:
            raise LobbyError(ErrorCode.ALREADY_IN_LOBBY, "already in a lobby: leave it first")

    def _seated_server(self) -> str | None:
        """In a lobby: the server that holds it, the only one a create or quick-join may go
        to (it answers one that was already carried out, whose reply was lost, with that
        very lobby, and any other with ALREADY_IN_LOBBY). Not in one: None, any server."""
        if self.replica is None:
            return None
        if self.server is None:
            raise LobbyError(ErrorCode.ALREADY_IN_LOBBY, "already in a lobby: leave it first")
        return self.server

    def _require_lobby(self) -> int:
        if self.replica is None:
            raise LobbyError(ErrorCode.NOT_MEMBER, "not in a lobby")
        return self.replica.lobby_id

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
        async with self._lock:
            while True:
                target = failover_home(self.ring, lobby_id, self.dead)
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
        attempts = 0
        while attempts < len(self.servers) + 1:
            home = failover_home(self.ring, lobby_id, self.dead)
            if home is None:
                break
            try:
                reply = await self._request(JoinLobby(0, lobby_id), server=home)
                return await self._joined(reply)
            except LobbyUnavailable as error:
                last = error
                attempts += 1
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
        # (a generator: a server found dead during the walk is skipped too)
        alive = (server for server in walk if server not in self.dead)
        return await self._join_walk(alive, request, ErrorCode.NO_SUCH_CODE)

    async def quick_join(self, filters: Sequence[Filter] = ()) -> int:
        """Join the fullest open lobby that matches, on the current server, then the others.

        In a lobby, only its server is asked: the same quick-join asked again after its reply
        was lost returns the lobby the first one joined, if it still matches."""
        request = QuickJoin(0, tuple(filters))
        seated = self._seated_server()
        if seated is not None:
            return await self._join_walk([seated], request, ErrorCode.NO_MATCH)
        first = self.server
        order = [s for s in ([first] if first else []) + self.servers if s not in self.dead]
        return await self._join_walk(dict.fromkeys(order), request, ErrorCode.NO_MATCH)

    async def _join_walk(
        self, servers: Iterable[str | None], request: Request, not_there: ErrorCode
    ) -> int:
        """Ask `servers` in turn until one seats the member; a `not_there` refusal, or a server
        that cannot be reached, moves on to the next. A request that went out unanswered
        (`NoReply`) ends the walk: it may have seated the member there, and the next server
        would seat it twice. None answering at all is `LobbyUnavailable`, not a refusal."""
        refusal: LobbyError | None = None
        unreachable: LobbyUnavailable | None = None
        for server in servers:
            try:
                return await self._joined(await self._request(request, server=server))
            except LobbyError as error:
                if error.code is not not_there:
                    raise
                refusal = refusal or error
            except NoReply:
                raise
            except LobbyUnavailable as error:
                unreachable = error
        raise refusal or unreachable or LobbyError(not_there, _NOT_THERE[not_there])

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
        return await client_queue.queue(self, mode, region, skill=skill, size=size,
                                        party=party, strict_region=strict_region, start=start)

    async def cancel_queue(self) -> None:
        """Leave the matchmaker's queue (`LobbyError` NOT_QUEUED if not queued)."""
        await client_queue.cancel(self)

    async def request(self, request: Request) -> Reply:
        """Any request as it is (tests, tools); refusals raise `LobbyError`."""
        return await self._request(request)


@contextlib.asynccontextmanager
async def connect(
    servers: Sequence[str],
    *,
    member: str | None = None,
    identity_token: str | bytes | None = None,
    timeout: float = 10.0,
    reconnect: bool = True,
    transport: Any = None,
    transport_config: TransportConfig | None = None,
    connect_now: bool = True,
    connect_timeout: float = CONNECT_TIMEOUT,
    liveness: float = CLIENT_LIVENESS,
    resume_token: bytes | None = None,
    server_key: RingKeys = None,
) -> AsyncIterator[LobbyClient]:
    """A member's lobby client over `servers` (``host:port`` of every lobby server, the same
    list on every member: it is the ring). Leaving the block closes the session without
    leaving the lobby: the seat is kept for the server's grace period.

    `connect_timeout` bounds each handshake with a server before the next one is tried;
    `liveness` is how long a silent server is trusted before the member moves on (its own
    transport's image liveness: `transport_config` or a shared `transport` set theirs).

    `resume_token`: a previous process's `LobbyClient.resume_token` (it crashed or was
    killed): the block starts back in that seat (`LobbyClient.resume`; `ResumeRefused` if the
    server will not give it back).

    `identity_token`: the member's token from the game's backend, for a lobby that verifies
    identities (``echo-lobby --auth-key``; one without ignores it). Its ``sub`` is the member
    id: `member` may then be left out, and if given must be the same. A token the lobby
    refuses raises `AuthRefused` (a `LobbyUnavailable`) with the reason.

    `server_key`: encrypt the sessions to the lobby servers, pinning this key (the ring's one
    key, as ``echo-lobby --key`` prints it) or these keys (``{"host:port": key}`` for every
    server of the list); see `echo.lobby.keys`. A server that does not prove its key is not
    used (never a fallback to the clear). BadPin or ValueError at once for a bad value."""
    member = member_of(member, identity_token)
    ring_pins(servers, server_key)  # a bad key is the caller's error, before any session
    try:
        async with _client(
            servers, member, timeout, reconnect, transport, transport_config, connect_now,
            connect_timeout, liveness, identity_token, resume_token, server_key,
        ) as client:  # fmt: skip
            yield client
    except BaseExceptionGroup as group:
        # Our nurseries wrap whatever crosses them; the caller should see LobbyUnavailable
        # (or its own exception) itself.
        sole = _sole(group)
        if sole is None:
            raise
        raise sole from None


def _none_let_in(order: Sequence[str], dead: Iterable[str], errors: Sequence[str]) -> str:
    """What `LobbyUnavailable` says after a walk of `order`: nobody answered, or who refused."""
    said = "; ".join(errors)
    if set(order) <= set(dead):
        return "no lobby server answered at " + said
    return "no lobby server let this member in (a server that answered refused): " + said


def member_of(member: str | None, identity_token: str | bytes | None) -> str:
    """The member id: `member`, or the ``sub`` of the token (read, not verified: the lobby
    verifies it); both given, they must agree (ValueError otherwise, as with neither)."""
    if not identity_token:  # None, "" or b"": no token
        if member is None:
            raise ValueError("a member id or an identity token (whose sub is the id) is needed")
        return member
    subject = token_subject(identity_token)
    if member is not None and member != subject:
        raise ValueError(f"the identity token is for {subject!r}, not {member!r}")
    return subject


def _token_bytes(token: str | bytes | None) -> bytes:
    if token is None:
        return b""
    try:
        data = token.encode("ascii") if isinstance(token, str) else bytes(token)
    except UnicodeEncodeError:
        raise ValueError("an identity token is ASCII (a compact JWT)") from None
    if len(data) > MAX_TOKEN_BYTES:
        raise ValueError(f"an identity token of more than {MAX_TOKEN_BYTES} bytes")
    return data


def _sole(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    found: BaseException = group
    while isinstance(found, BaseExceptionGroup):
        if len(found.exceptions) != 1:
            return None
        found = found.exceptions[0]
    return None if isinstance(found, trio.Cancelled) else found


@contextlib.asynccontextmanager
async def _client(
    servers: Sequence[str],
    member: str,
    timeout: float,
    reconnect: bool,
    transport: Any,
    transport_config: TransportConfig | None,
    connect_now: bool,
    connect_timeout: float,
    liveness: float,
    identity_token: str | bytes | None,
    resume_token: bytes | None = None,
    server_key: RingKeys = None,
) -> AsyncIterator[LobbyClient]:
    from echo.session.client import client_transport_config
    from echo.transport import open_transport

    async with contextlib.AsyncExitStack() as stack:
        if transport is None:
            config = transport_config or lobby_client_timers(liveness=liveness)
            transport = await stack.enter_async_context(
                open_transport(client_transport_config(config))
            )
        nursery = await stack.enter_async_context(trio.open_nursery())
        client = LobbyClient(
            servers,
            member,
            nursery,
            transport,
            timeout=timeout,
            reconnect=reconnect,
            connect_timeout=connect_timeout,
            identity_token=identity_token,
            server_key=server_key,
        )
        try:
            if resume_token is not None:
                await client.resume(resume_token)
            elif connect_now:
                await client.connect()
            yield client
        finally:
            client.auto_reconnect = False
            client._events_in.close()  # an `async for` over the events ends
            with trio.CancelScope(shield=True):
                with trio.move_on_after(2):
                    await client._close_link()
            nursery.cancel_scope.cancel()


def retry_after(message: str) -> float:
    """How long to wait after a RATE_LIMITED refusal with this text: what the server named
    (its token bucket's next token), or one interval of the default search limit; a little
    more either way, so that the retry finds the token there."""
    found = _RETRY_IN.search(message)
    wait = float(found.group(1)) if found else 1.0 / LobbyConfig().search_limit.rate
    return wait + 0.01


def shuffled(servers: Sequence[str], rng: random.Random | None = None) -> list[str]:
    out = list(servers)
    (rng or random).shuffle(out)
    return out
