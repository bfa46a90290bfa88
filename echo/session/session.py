"""`Session`: one joined duologue as an application sees it, the same shape on both ends.

A session is a publication (to the peer) and a subscription (from the peer) with one session
id, on one stream id. `send` offers into the publication; `receive` reads the subscription.

Receive queue, bounded: a session keeps no queue of its own beyond one poll's batch
(`receive_batch` messages, 16 by default). Everything else waits in the transport's receiver
window (2 MiB of term buffer): an application that reads slowly, or not at all, stops consuming,
its status messages stop opening the window, and the peer's publication is back-pressured
(`offer` returns BACK_PRESSURED) — the flow control of the Aeron protocol, not a growing list.

Closing: `close(reason)` sends ``ERROR <reason>`` (Echo 2.0's duologue error, the io7m Aeron guide
§4.4) when a reason is given, then ends the stream; a peer's ``ERROR <text>`` closes the session on
this end with that reason. So messages that start with ``ERROR `` are reserved and `send`
refuses them.
`close` returns at once whatever the peer's state: the transport delivers the goodbye and
lingers for the peer's acknowledgement in the background (`Transport.settle` waits for it).

How `async for data in session` ends, by `close_reason`:

- it stops (StopAsyncIteration) when the session was closed in order: by this end's `close`,
  by the peer's `close` (its ``ERROR <reason>``, or the end of its stream: "closed by the
  server", "client gone"), by the server shutting down ("server shutting down"), or by a
  `send` that gave up ("send failed": that `send` raised `SendFailed` already);
- it raises `LostContact` when the peer fell silent: nothing heard for the transport's
  liveness timeout or the publication's connection timeout ("lost contact with the server",
  "client gone"), a broken path not resumed in time ("lost contact with the server (no
  resume)", "... (resume)", "client gone (resume)"), or a resume the server refused ("resume
  refused: <why>"). `error.reason` is `session.close_reason`.

`receive` raises the session's error either way (`PeerClosed`, `LostContact`, `SessionClosed`).

Later layers (logical channels, echo.channels) add more streams, by stream id, to the same two
ports and session id; a `Session` carries the transport and addresses they need
(`transport`, `stream_id`), and this module does not assume it owns the only stream.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final

import attrs
import trio

from echo.protocol import DuologueError, format_message, parse_duologue_reply_untrusted
from echo.session.crypto import OpenError, SessionCipher
from echo.transport import (
    NOT_CONNECTED,
    Image,
    Message,
    Publication,
    SendError,
    Subscription,
    Transport,
)

#: Messages read from the subscription per poll; the bound on a session's own queue.
DEFAULT_RECEIVE_BATCH: Final = 16
#: How long `send` retries an offer that meets back pressure before the session gives up.
DEFAULT_SEND_TIMEOUT: Final = 0.5
#: How long the transport lingers, after `close(reason)`, for the peer to acknowledge
#: everything, the ERROR included (in the background: `close` itself does not wait).
CLOSE_LINGER: Final = 1.0
#: A resumable session keeps the last messages it sent, up to this many bytes, to send again
#: those the peer had not read when the path broke (echo.session.resume).
RESUME_RETAIN_BYTES: Final = 256 * 1024

_ERROR_PREFIX: Final = b"ERROR "


class SessionError(Exception):
    """Base of everything echo.session raises about a session or a handshake."""


class Rejected(SessionError):
    """The server refused the HELLO; `reason` is its ERROR text ("server full", ...)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"rejected by the server: {reason}")
        self.reason = reason


class HandshakeTimeout(SessionError):
    """A step of the handshake did not happen in time; `waiting_for` says which, in words, and
    `phase` (an `echo.session.machine.HandshakeState`: CONNECTING, AWAITING_CONNECT, JOINING)
    for a program to act on: a JOINING timeout after a CONNECT is most often a server that runs
    the other duologue-port mode."""

    def __init__(self, waiting_for: str, timeout: float, phase: object = None) -> None:
        super().__init__(f"timed out after {timeout} s waiting for {waiting_for}")
        self.waiting_for = waiting_for
        self.timeout = timeout
        self.phase = phase


class ProtocolViolation(SessionError):
    """The server sent something the handshake cannot accept (a bad reply, an id out of range)."""


class Untrusted(SessionError):
    """The server did not prove it holds the pinned key (another key, a failed confirmation),
    or answered an encrypting client in the clear: nothing was sent to it but the HELLO."""


class SessionClosed(SessionError):
    """The session is closed; `reason` says why (the peer's ERROR text, "client gone", ...)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class LostContact(SessionClosed):
    """Nothing heard from the peer for the transport's liveness timeout (or, in a handshake,
    the all-clients channel went away). The one close that ends `async for` with an
    exception rather than a stop (see the module docstring for every reason). A client
    session raises it once its publication has heard no status message for the connection
    timeout and, if it can resume, no resume succeeded within the resume window
    (`echo.session.client.lost_contact_bound`)."""


class PeerClosed(SessionClosed):
    """The peer closed the session with a reason (its ``ERROR <reason>``); `reason` is it."""


class SendFailed(SessionClosed):
    """A send gave up (back pressure or no receiver for `send_timeout`): the session is closed.
    `error_name` is the transport's name for the last offer's result (`SendError.name`)."""

    def __init__(self, reason: str, error_name: str) -> None:
        super().__init__(reason)
        self.error_name = error_name


@attrs.define
class SessionCounters:
    """Per-session counts; the application reads them, the session bumps them."""

    messages_sent: int = 0
    bytes_sent: int = 0
    messages_received: int = 0
    bytes_received: int = 0
    #: messages from another address than the peer's, dropped before the application saw them
    foreign_dropped: int = 0
    #: times the session moved to a new path (echo.session.resume)
    resumes: int = 0
    #: messages refused by the session's encryption (forged, replayed, too old): the first
    #: one closes the session, so this is 0 or 1
    refused: int = 0


class Session:
    """One duologue: `send`, `receive`, `async for`, `close`. See the module docstring."""

    def __init__(
        self,
        *,
        transport: Transport,
        publication: Publication,
        subscription: Subscription,
        session_id: int,
        peer: tuple[str, int],
        opened_at: float,
        owner_ip: str | None = None,
        receive_batch: int = DEFAULT_RECEIVE_BATCH,
        send_timeout: float = DEFAULT_SEND_TIMEOUT,
        on_close: Callable[[Session], None] | None = None,
    ) -> None:
        if receive_batch < 1:
            raise ValueError(f"receive_batch must be >= 1, got {receive_batch}")
        self.transport = transport
        self.publication = publication
        self.subscription = subscription
        self.session_id = session_id
        self.stream_id = publication.stream_id
        self.peer = peer
        self.opened_at = opened_at
        self.counters = SessionCounters()
        self.close_reason: str | None = None
        #: server side: what the server's `admit` hook said of this client when it returned
        #: `Admitted(claims)` (a verified ticket's claims, say); None otherwise
        self.admission: object = None
        #: the peer's stream, while it is up
        self.image: Image | None = None
        self._owner_ip = owner_ip
        #: the owner's address before its last resume: messages read from the old path before
        #: the move are still the peer's
        self._prior_owner_ip: str | None = None
        self._batch_size = receive_batch
        self._send_timeout = send_timeout
        self._batch: deque[Message] = deque()
        self._on_close = on_close
        self._closing = False
        self._closed_event = trio.Event()
        # The transport's count of datagrams read when the last poll came back short: if it
        # has not moved since, no datagram arrived anywhere (this task did not yield and no
        # socket was read), so `receive` waits at once instead of polling for nothing first.
        # With 1,000 sessions every empty poll is paid 1,000 times over.
        self._polled_at_count = -1
        #: a resumable session's `send` waits this long for a broken path to be resumed
        #: (instead of failing after `send_timeout`); 0 for a session that cannot resume
        self._resume_wait = 0.0
        #: the client's way to resume now (None: this session cannot resume)
        self._resumer: Callable[[], Awaitable[None]] | None = None
        #: set while no resume is under way; `send` waits on it (so nothing is offered on a
        #: path that is being left)
        self._path_ready = trio.Event()
        self._path_ready.set()
        #: set while a resume replaces the streams: `receive` waits on it rather than on a
        #: subscription that is being closed
        self._moving: trio.Event | None = None
        #: the last messages sent (resumable sessions only: `_retain` > 0), oldest first
        self._retain = 0
        self._sent_log: deque[bytes] = deque()
        self._sent_log_bytes = 0
        #: seals what is sent and opens what is received (None: the session is in the clear).
        #: What a resume sends again is kept sealed, so it goes out with the same nonce.
        self.cipher: SessionCipher | None = None
        #: why a received message was refused (the session closes with it)
        self._refused: str | None = None

    # ---------------------------------------------------------------- state

    @property
    def is_closed(self) -> bool:
        return self.close_reason is not None

    async def wait_closed(self) -> None:
        await self._closed_event.wait()

    def _mark_closed(self, reason: str) -> bool:
        """Closed from now on, for `reason`; False if it already was."""
        if self.close_reason is not None:
            return False
        self.close_reason = reason
        self._closed_event.set()
        self._path_ready.set()
        if self._moving is not None:
            self._moving.set()
        if self._on_close is not None:
            self._on_close(self)
        return True

    def _peer_gone(self, reason: str, *, lost: bool = False, by_peer: bool = False) -> None:
        """The transport says the peer's stream ended (end of stream, liveness timeout), or
        (`by_peer`) the peer sent its ERROR."""
        if self.close_reason is None:  # the first reason stands (a late resume refusal, say)
            self._lost = lost
            self._by_peer = by_peer
            self._stream_ended = not lost and not by_peer
        elif by_peer and self._stream_ended:
            # The peer's stream ended while its goodbye, read with its last messages, waited
            # to be taken: the goodbye says why it ended ("identity refused: ...", not
            # "closed by the server").
            self.close_reason = reason
            self._by_peer = True
            self._stream_ended = False
            return
        self._mark_closed(reason)

    _lost = False
    _by_peer = False
    _stream_ended = False

    def _closed_error(self) -> SessionClosed:
        reason = self.close_reason or "closed"
        if self._lost:
            return LostContact(reason)
        if self._by_peer:
            return PeerClosed(reason)
        return SessionClosed(reason)

    def _release(self) -> None:
        """The server or client is done with this session: drop the references that make
        cycles (the callbacks hold the duologue that holds this session), so it is freed by
        reference counting, not by a pass of the cyclic collector."""
        self._on_close = None
        self._resumer = None
        self.image = None
        self._batch.clear()
        self._sent_log.clear()

    @property
    def resumable(self) -> bool:
        """Can this end take the session to a new path (a client that holds a secret)?"""
        return self._resumer is not None

    async def resume(self) -> None:
        """Take the session to the path this host has now, at once (client side).

        A resumable session does this by itself when its path breaks; call it when the
        application knows better (the OS said the network changed). Raises SessionError if the
        session cannot resume, SessionClosed if it is closed or the server refused.
        """
        if self._resumer is None:
            raise SessionError("this session cannot resume (no resume secret)")
        if self.close_reason is not None:
            raise self._closed_error()
        await self._resumer()

    # ---------------------------------------------------------------- sending

    async def send(self, data: bytes) -> None:
        """Send one message (at most the publication's `max_message_length` bytes).

        Raises SessionClosed once the session is closed, or when back pressure outlasts
        `send_timeout` (the session is then closed, reason "send failed"); ValueError for a
        message that starts with ``ERROR `` (reserved for `close`) or is too long.
        """
        if self.close_reason is not None:
            raise self._closed_error()
        if data.startswith(_ERROR_PREFIX):
            raise ValueError("messages starting with b'ERROR ' are reserved for close(reason)")
        if not self._path_ready.is_set():
            await self._wait_path()
        publication = self.publication
        wire = data if self.cipher is None else self.cipher.seal(data)
        if publication.offer(wire) <= 0:
            # Back pressure or a term rotation: retry (and so yield) a while.
            try:
                await self._send_retrying(publication, wire)
            except SendError as error:
                if self._mark_closed("send failed"):
                    raise SendFailed("send failed", error.name) from None
                raise self._closed_error() from None
            except trio.ClosedResourceError:
                self._mark_closed("closed")
                raise self._closed_error() from None
        counters = self.counters
        counters.messages_sent += 1
        counters.bytes_sent += len(data)
        if self._retain:
            self._log_sent(wire)

    def send_nowait(self, data: bytes) -> bool:
        """`send` without waiting: True once the message is on its way; False (nothing sent)
        when it would have to wait (back pressure, no receiver yet, a path being resumed):
        `send` it then. Raises as `send` does for a closed session or a reserved message.

        For a server's fan-out, which hands each member its messages from the task that made
        them instead of waking a writer task per member and message.
        """
        if self.close_reason is not None:
            raise self._closed_error()
        if data.startswith(_ERROR_PREFIX):
            raise ValueError("messages starting with b'ERROR ' are reserved for close(reason)")
        if not self._path_ready.is_set():
            return False
        # (A message that could not be offered leaves a gap in the counters: harmless, the
        # window accepts gaps; a counter is never used twice.)
        wire = data if self.cipher is None else self.cipher.seal(data)
        if self.publication.offer(wire) <= 0:
            return False
        counters = self.counters
        counters.messages_sent += 1
        counters.bytes_sent += len(data)
        if self._retain:
            self._log_sent(wire)
        return True

    def seal_control(self, message: DuologueError) -> bytes:
        """The wire form of a duologue ERROR: sealed in an encrypted session (so that a
        goodbye cannot be forged either)."""
        data = format_message(message)
        return data if self.cipher is None else self.cipher.seal(data)

    def _log_sent(self, data: bytes) -> None:
        log = self._sent_log
        log.append(data)
        self._sent_log_bytes += len(data)
        while self._sent_log_bytes > self._retain and len(log) > 1:
            self._sent_log_bytes -= len(log.popleft())

    def _begin_move(self) -> trio.Event:
        """A resume is about to replace the streams; set the event it returns once done."""
        moving = self._moving = trio.Event()
        return moving

    def _end_move(self, moving: trio.Event) -> None:
        if self._moving is moving:
            self._moving = None
        self._polled_at_count = -1
        moving.set()

    @property
    def _stream_received(self) -> int:
        """Messages of the peer's stream read into this session (the application's or not)."""
        counters = self.counters
        return counters.messages_received + counters.foreign_dropped + len(self._batch)

    async def _replay(self, peer_received: int) -> None:
        """Send again, on the new stream, what the peer had not read of the old one."""
        missing = self.counters.messages_sent - peer_received
        if missing < 0 or missing > len(self._sent_log):
            reason = (
                "resume: the peer has read more than was sent"
                if missing < 0
                else ("resume: messages the peer missed are no longer kept")
            )
            self._mark_closed(reason)
            raise self._closed_error()
        log = self._sent_log
        for data in list(log)[len(log) - missing :]:
            try:
                await self.publication.send(data, timeout=self._send_timeout)
            except (SendError, trio.ClosedResourceError):
                self._mark_closed("send failed")
                raise self._closed_error() from None

    async def _wait_path(self) -> None:
        with trio.move_on_after(self._resume_wait):
            await self._path_ready.wait()
        if self.close_reason is not None:
            raise self._closed_error()

    async def _send_retrying(self, publication: Publication, data: bytes) -> None:
        try:
            await publication.send(data, timeout=self._send_timeout)
        except SendError as error:
            if error.code != NOT_CONNECTED or self._resume_wait <= 0:
                raise
            # Nobody answers at the old path: a resume is under way (or the peer is gone,
            # which the session learns within the wait). Nothing was appended, so nothing is
            # lost or sent twice: offer again once the stream is connected.
            with trio.move_on_after(self._resume_wait):
                await self._until_connected_or_closed(publication)
            if self.close_reason is not None:
                raise
            await publication.send(data, timeout=self._send_timeout)

    async def _until_connected_or_closed(self, publication: Publication) -> None:
        """Until `publication` connects or the session closes (a resume that gave up): a
        publication's waiters are not woken by the session closing."""
        async with trio.open_nursery() as nursery:

            async def connected() -> None:
                try:
                    await publication.wait_connected()
                except trio.ClosedResourceError:
                    pass
                nursery.cancel_scope.cancel()

            async def closed() -> None:
                await self._closed_event.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(connected)
            nursery.start_soon(closed)

    # ---------------------------------------------------------------- receiving

    def _take(self) -> bytes | None:
        """The next message already read, or None. Plain function: on the path of every
        message, where a coroutine frame more is a measurable share of a round trip."""
        batch = self._batch
        owner = self._owner_ip
        while batch:
            message = batch.popleft()
            if (
                owner is not None
                and message.source_ip != owner
                and message.source_ip != self._prior_owner_ip
            ):
                self.counters.foreign_dropped += 1
                continue
            data = message.data
            if self.cipher is not None:
                try:
                    data = self.cipher.open(data)
                except OpenError as refusal:
                    # Forged, replayed or too old: nothing after it is trusted either.
                    batch.clear()
                    self.counters.refused += 1
                    self._refused = refusal.reason
                    return None
            if data.startswith(_ERROR_PREFIX):
                error = parse_duologue_reply_untrusted(data)
                if isinstance(error, DuologueError):
                    # The peer's close(reason): nothing follows it.
                    batch.clear()
                    self._peer_gone(error.message or "closed by peer", by_peer=True)
                    return None
            counters = self.counters
            counters.messages_received += 1
            counters.bytes_received += len(data)
            return data
        return None

    async def receive(self) -> bytes:
        """The next message from the peer; raises SessionClosed (or LostContact) once closed."""
        while True:
            data = self._take()
            if data is not None:
                return data
            if self._refused is not None and not self._closing:
                # Tell the peer why (sealed), then end the session.
                await self.close(self._refused)
            if self.close_reason is not None:
                raise self._closed_error()
            if self._moving is not None:
                await self._moving.wait()
                continue
            subscription = self.subscription
            counters = self.transport.counters
            if counters.datagrams_received == self._polled_at_count:
                await subscription.wait_activity()
                if self.close_reason is not None:
                    continue
            n = subscription.poll(self._batch.append, fragment_limit=self._batch_size)
            self._polled_at_count = counters.datagrams_received if n < self._batch_size else -1

    def __aiter__(self) -> AsyncIterator[bytes]:
        return _Messages(self)

    # ---------------------------------------------------------------- closing

    async def close(self, reason: str = "") -> None:
        """Close the session (idempotent). A non-empty `reason` reaches the peer as ERROR.

        Returns at once, whatever the peer's state (gone, silent or slow): the goodbye and
        what was sent before it are delivered by the transport in the background, which
        lingers up to CLOSE_LINGER seconds for the peer's acknowledgement and then releases
        the stream. (`connect` waits for that before closing a transport of its own.)
        """
        if self._closing:
            await self._closed_event.wait()
            return
        self._closing = True
        publication = self.publication
        already = self.close_reason is not None
        self._mark_closed(reason or "closed")
        # Nothing more is read from a closed session: closing the subscription now wakes any
        # task of the application still waiting in `receive` (the transport tells its waiters).
        await self.subscription.close()
        if already or publication.is_closed:
            return
        goodbye = self.seal_control(DuologueError(_one_line(reason))) if reason else None
        publication.close_soon(timeout=CLOSE_LINGER, last=goodbye)


class _Messages:
    """`async for data in session`: a plain iterator object, cheaper per message than an async
    generator (no generator frame to resume)."""

    __slots__ = ("_session",)

    def __init__(self, session: Session) -> None:
        self._session = session

    def __aiter__(self) -> _Messages:
        return self

    async def __anext__(self) -> bytes:
        session = self._session
        data = session._take()  # a message of the last poll: no coroutine for `receive`
        if data is not None:
            return data
        try:
            return await session.receive()
        except LostContact:
            raise  # silence is not an end the application may take for a goodbye
        except SessionClosed:
            raise StopAsyncIteration from None


def _one_line(reason: str) -> str:
    """`reason` as a valid ERROR text: one line, bounded (the wire regex uses Java's `.`)."""
    text = " ".join(reason.split())
    return text[:900] if text else "closed"
