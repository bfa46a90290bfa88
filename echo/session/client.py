"""`connect()`: the client side of a session, the pure `HandshakeMachine` run over the transport.

    async with echo.session.connect("203.0.113.7", 9000, 9001) as session:
        await session.send(b"...")
        reply = await session.receive()

Raises `Rejected` (the server's reason), `HandshakeTimeout` (what it waited for),
`LostContact` (the all-clients channel went away) or `ProtocolViolation` (a reply the
handshake cannot accept). Leaving the block closes the session (the stream ends; no ERROR).

Once open, a session whose server is gone (killed, unplugged) is closed with `LostContact`
within `lost_contact_bound(transport_config, resumable=...)` seconds of the server's last
status message: its publication notices after the connection timeout (5 s), the session's
watcher looks once a second, and a resumable session then tries to resume for
`resume_window` seconds (the time the server keeps the session for it) before it gives up.
A server whose subscription said goodbye (end-of-stream: it closes, or its transport shuts
down) is not silent: the session then ends with the server's stream, or as LostContact when
that stream falls silent (the image liveness timeout, 10 s), and never resumes.
"""

from __future__ import annotations

import functools
import math
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import attrs
import trio

from echo.protocol import ECHO_STREAM_ID, RESERVED_SESSION_HIGH, RESERVED_SESSION_LOW
from echo.session.config import DuologuePorts
from echo.session.crypto import ClientHandshake, Pin
from echo.session.machine import (
    Action,
    CloseAllClients,
    Failed,
    Failure,
    FailureKind,
    HandshakeMachine,
    HandshakeState,
    OpenAllClients,
    OpenDuologue,
    Opened,
    ResumeDone,
    ResumeMachine,
    ResumeState,
    SendHello,
    SendResume,
)
from echo.session.pathwatch import path_watch
from echo.session.resume import RESUME_BITS
from echo.session.session import (
    CLOSE_LINGER,
    DEFAULT_RECEIVE_BATCH,
    DEFAULT_SEND_TIMEOUT,
    RESUME_RETAIN_BYTES,
    HandshakeTimeout,
    LostContact,
    ProtocolViolation,
    Rejected,
    Session,
    SessionError,
    Untrusted,
)
from echo.session.timers import echo_timers
from echo.transport import (
    Image,
    Message,
    Publication,
    SendError,
    Subscription,
    Transport,
    TransportConfig,
    open_transport,
)

#: Messages read from the all-clients channel per poll: it carries every client's replies.
_READ_BATCH = 256
#: How often a session's watcher looks whether its path broke (the publication lost its
#: receiver: no status message for the connection timeout, 5 s).
PATH_CHECK_INTERVAL = 1.0


def resume_window(config: TransportConfig) -> float:
    """Seconds a resumable session whose path broke tries to resume before it is LostContact.

    The server forgets a session `image_liveness_timeout` after the last datagram it heard from
    the client, and the client notices the break `publication_connection_timeout` after the
    last status message (plus up to one look of its watcher): resuming later than that is
    refused anyway, and a dead server never answers. Two looks of slack, and at least 2 s.
    """
    return max(
        2.0,
        config.image_liveness_timeout
        - config.publication_connection_timeout
        + 2 * PATH_CHECK_INTERVAL,
    )


def lost_contact_bound(config: TransportConfig, *, resumable: bool = True) -> float:
    """The longest a client session whose server is gone stays open after the server's last
    status message: the publication's connection timeout, one look of the watcher, and for a
    resumable session its `resume_window`. 6 s, or 13 s when resumable, with echo's timers."""
    bound = config.publication_connection_timeout + PATH_CHECK_INTERVAL
    return bound + resume_window(config) if resumable else bound


@attrs.frozen
class HandshakeStep:
    """Where a handshake got to, for `connect(on_step=...)`: CONNECTING (the all-clients
    channel is being opened), AWAITING_CONNECT (HELLO sent), JOINING (the server assigned the
    duologue on `data_port`/`control_port`, which is being opened)."""

    state: HandshakeState
    data_port: int | None = None
    control_port: int | None = None
    #: our all-clients publication's session id (AWAITING_CONNECT, JOINING)
    client_session: int | None = None
    #: the duologue's session id, decrypted (JOINING)
    session_id: int | None = None


def client_transport_config(base: TransportConfig | None = None) -> TransportConfig:
    """Auto session ids of a client stay out of the duologue range, as on the server."""
    return attrs.evolve(
        base or echo_timers(),
        reserved_session_low=RESERVED_SESSION_LOW,
        reserved_session_high=RESERVED_SESSION_HIGH,
    )


def _host(server: str) -> str:
    return f"[{server}]" if ":" in server else server


def duologue_channels(
    host: str, data_port: int, control_port: int, session_id: int, shared: bool
) -> tuple[str, str]:
    """The client's duologue subscription and publication channels; the publication's has a
    `{registration_id}` field for the subscription's registration id.

    Per-client: an MDC subscription registering with the duologue's own control port (Echo
    2.0). Shared: a response channel (Aeron 1.48): the subscription waits for the server's
    RSP_SETUP, the publication's SETUPs ask for it (response-correlation-id).
    """
    if shared:
        return (
            f"aeron:udp?control-mode=response|control={host}:{control_port}"
            f"|session-id={session_id}",
            f"aeron:udp?endpoint={host}:{data_port}|session-id={session_id}"
            "|response-correlation-id={registration_id}",
        )
    return (
        f"aeron:udp?control={host}:{control_port}|control-mode=dynamic|session-id={session_id}",
        f"aeron:udp?endpoint={host}:{data_port}|session-id={session_id}",
    )


def failure_error(failure: Failure, timeout: float) -> SessionError:
    """The exception `connect` raises for a failed handshake."""
    if failure.kind is FailureKind.REJECTED:
        return Rejected(failure.detail)
    if failure.kind is FailureKind.TIMED_OUT:
        return HandshakeTimeout(failure.detail, timeout, failure.phase)
    if failure.kind is FailureKind.CONNECTION:
        return LostContact(failure.message)
    if failure.kind is FailureKind.UNTRUSTED:
        return Untrusted(failure.message)
    return ProtocolViolation(failure.message)


class _Pair:
    """A channel's publication + subscription, and whether its image went away."""

    def __init__(self) -> None:
        self.publication: Publication | None = None
        self.subscription: Subscription | None = None
        self.lost = False

    @property
    def connected(self) -> bool:
        return (
            self.publication is not None
            and self.subscription is not None
            and self.publication.is_connected
            and bool(self.subscription.images)
        )

    def on_image_gone(self, image: Image) -> None:
        self.lost = True


async def _close_pair(pair: _Pair) -> None:
    if pair.subscription is not None:
        await pair.subscription.close()
    if pair.publication is not None and not pair.publication.is_closed:
        pair.publication.close_soon(timeout=0.5)  # lingers in the transport, not here


@asynccontextmanager
async def connect(
    server: str = "127.0.0.1",
    port: int = 9000,
    control_port: int = 9001,
    *,
    credentials: bytes = b"",
    timeout: float = 10.0,
    stream_id: int = ECHO_STREAM_ID,
    transport: Transport | None = None,
    transport_config: TransportConfig | None = None,
    receive_batch: int = DEFAULT_RECEIVE_BATCH,
    send_timeout: float = DEFAULT_SEND_TIMEOUT,
    pad: int | None = None,
    duologue_ports: DuologuePorts | str = DuologuePorts.PER_CLIENT,
    resume: bool = True,
    on_step: Callable[[HandshakeStep], None] | None = None,
    server_key: Pin | str | None = None,
) -> AsyncIterator[Session]:
    """Say HELLO to `server` (an IP literal), join the duologue it assigns, yield the Session.

    `credentials` are opaque bytes for the server's admission hook (they travel in the HELLO,
    base64url); `timeout` bounds each step of the handshake. Many sessions can share one
    `transport` (a game's bots, a load test); without one, the session opens its own.
    `duologue_ports` must be the server's (ServerConfig.duologue_ports): "shared" opens the
    duologue as an Aeron response channel.

    `resume` (on by default): ask the server for a resume secret ("+R" in the HELLO; a server
    without the extension answers as Echo 2.0 and the session simply cannot resume), and when
    the path to the server breaks (its status messages stop: a NAT mapping changed, the host
    moved to another network) take the session to the new path with a RESUME, by itself. The
    application sees no break; `session.counters.resumes` counts the moves. `resume=False`
    sends Echo 2.0's HELLO byte for byte.

    `on_step(HandshakeStep)` (optional) hears where the handshake got to, as it gets there (a
    CLI prints "connecting...", "server assigned a duologue on ports ...").

    `server_key` (the server's public key as echo-server prints it, or its full SHA-256
    fingerprint, or a `Pin`): encrypt the session (echo.session.crypto). The handshake then
    raises `Untrusted` unless the server proves it holds that key; it never falls back to the
    clear. Raises echo.session.crypto.BadPin at once for a value that is neither.

    Either way, a session whose server is gone is closed with LostContact within
    `lost_contact_bound` (see the module docstring).
    """
    shared = DuologuePorts(duologue_ports) is DuologuePorts.SHARED
    pin = Pin.parse(server_key) if isinstance(server_key, str) else server_key
    try:
        if transport is None:
            async with open_transport(client_transport_config(transport_config)) as own:
                try:
                    async with _connect(
                        own, server, port, control_port, credentials, timeout, stream_id,
                        receive_batch, send_timeout, pad, resume, shared, on_step, pin,
                    ) as session:  # fmt: skip
                        yield session
                finally:
                    # The session's close returned at once; its goodbye and last messages
                    # still linger in this transport: let them reach a live server first.
                    with trio.CancelScope(shield=True):
                        await own.settle(CLOSE_LINGER)
        else:
            async with _connect(
                transport, server, port, control_port, credentials, timeout, stream_id,
                receive_batch, send_timeout, pad, resume, shared, on_step, pin,
            ) as session:  # fmt: skip
                yield session
    except BaseExceptionGroup as group:
        # The nurseries (the transport's, the resume watcher's) wrap whatever crosses them; a
        # caller of connect() should see Rejected (or their own exception) itself.
        sole = _sole(group)
        if sole is None:
            raise
        raise sole from None


def _sole(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The one exception inside nested single-member groups, if that is what `group` is."""
    found: BaseException = group
    while isinstance(found, BaseExceptionGroup):
        if len(found.exceptions) != 1:
            return None
        found = found.exceptions[0]
    if isinstance(found, trio.Cancelled):
        return None
    return found


@asynccontextmanager
async def _connect(
    transport: Transport,
    server: str,
    port: int,
    control_port: int,
    credentials: bytes,
    timeout: float,
    stream_id: int,
    receive_batch: int,
    send_timeout: float,
    pad: int | None,
    resume: bool,
    shared: bool = False,
    on_step: Callable[[HandshakeStep], None] | None = None,
    pin: Pin | None = None,
) -> AsyncIterator[Session]:
    machine = HandshakeMachine(
        pad=secrets.randbits(32) if pad is None else pad,
        timeout=timeout,
        credentials=credentials,
        resume_pad=secrets.randbits(RESUME_BITS) if resume else None,
        # A fresh ephemeral key per handshake, never kept: see echo.session.crypto.
        client_key=None if pin is None else ClientHandshake(pin),
    )
    all_clients = _Pair()
    duologue = _Pair()
    session: Session | None = None
    try:
        failure: Exception | None = None
        # The nursery holds the all-clients publication's goodbye (its linger) while the
        # duologue connects; it ends with the handshake, so an exception of the caller's
        # block is never wrapped in an ExceptionGroup.
        async with trio.open_nursery() as nursery:
            try:
                opened = await _handshake(
                    transport, machine, server, port, control_port, stream_id, all_clients,
                    duologue, nursery, shared, on_step,
                )  # fmt: skip
            except Exception as error:  # raised below, outside the nursery
                failure = error
        if failure is not None:
            raise failure
        assert duologue.publication is not None and duologue.subscription is not None
        session = Session(
            transport=transport,
            publication=duologue.publication,
            subscription=duologue.subscription,
            session_id=opened.session_id,
            peer=(server, opened.data_port),
            opened_at=trio.current_time(),
            receive_batch=receive_batch,
            send_timeout=send_timeout,
        )
        if opened.keys is not None:
            session.cipher = opened.keys.cipher()
        images = duologue.subscription.images
        session.image = images[0] if images else None
        live = session

        def image_gone(image: Image) -> None:
            if image is live.image:
                timed_out = image.close_reason == "timed_out"
                live._peer_gone(
                    "lost contact with the server" if timed_out else "closed by the server",
                    lost=timed_out,
                )

        duologue.subscription.on_image_unavailable = image_gone
        if session.image is None:
            live._peer_gone("closed by the server")
        path = _Path(
            transport, server, port, control_port, stream_id, timeout, duologue,
            opened.data_port, opened.control_port, image_gone, shared,
        )  # fmt: skip
        if opened.resume_secret is not None:
            # A sender that stops hearing status messages means the server answers an old
            # address (or is gone): take the session to the path this host has now.
            session._resume_wait = transport.config.image_liveness_timeout
            session._retain = RESUME_RETAIN_BYTES
            session._resumer = functools.partial(path.resume, session, opened.resume_secret)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(path.keep, session, opened.resume_secret)
            try:
                yield session
            finally:
                nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            if session is not None:
                with trio.move_on_after(2.0):
                    await session.close()
            await _close_pair(all_clients)
            await _close_pair(duologue)
            if session is not None:
                session._release()
            if duologue.subscription is not None:
                duologue.subscription.on_image_unavailable = None


async def _handshake(
    transport: Transport,
    machine: HandshakeMachine,
    server: str,
    port: int,
    control_port: int,
    stream_id: int,
    all_clients: _Pair,
    duologue: _Pair,
    nursery: trio.Nursery,
    shared: bool = False,
    on_step: Callable[[HandshakeStep], None] | None = None,
) -> Opened:
    host = _host(server)
    pending: list[Action] = machine.start(trio.current_time())
    while True:
        while pending:
            action = pending.pop(0)
            if isinstance(action, OpenAllClients):
                if on_step is not None:
                    on_step(HandshakeStep(HandshakeState.CONNECTING))
                all_clients.subscription = await transport.add_subscription(
                    f"aeron:udp?control={host}:{control_port}|control-mode=dynamic",
                    stream_id,
                    on_image_unavailable=all_clients.on_image_gone,
                )
                all_clients.publication = await transport.add_publication(
                    f"aeron:udp?endpoint={host}:{port}", stream_id
                )
            elif isinstance(action, SendHello):
                assert all_clients.publication is not None
                if on_step is not None:
                    on_step(
                        HandshakeStep(
                            HandshakeState.AWAITING_CONNECT, client_session=machine.client_session
                        )
                    )
                try:
                    await all_clients.publication.send(action.data, timeout=1.0)
                except SendError as error:
                    pending += machine.on_send_failed(
                        f"could not send to the server ({error.name})", trio.current_time()
                    )
            elif isinstance(action, CloseAllClients):
                # The subscription at once (its end-of-stream SM removes us from the server's
                # MDC destinations, so we stop receiving everyone's replies); the publication
                # says goodbye in the background.
                pair_sub, all_clients.subscription = all_clients.subscription, None
                pair_pub, all_clients.publication = all_clients.publication, None
                if pair_sub is not None:
                    await pair_sub.close()
                if pair_pub is not None:
                    nursery.start_soon(_close_publication, pair_pub)
            elif isinstance(action, OpenDuologue):
                if on_step is not None:
                    on_step(
                        HandshakeStep(
                            HandshakeState.JOINING,
                            action.data_port,
                            action.control_port,
                            machine.client_session,
                            action.session_id,
                        )
                    )
                session_id = action.session_id
                sub_channel, pub_channel = duologue_channels(
                    host, action.data_port, action.control_port, session_id, shared
                )
                duologue.subscription = await transport.add_subscription(
                    sub_channel, stream_id, on_image_unavailable=duologue.on_image_gone
                )
                duologue.publication = await transport.add_publication(
                    pub_channel.format(registration_id=duologue.subscription.registration_id),
                    stream_id,
                )
            elif isinstance(action, Opened):
                return action
            elif isinstance(action, Failed):
                raise failure_error(action.failure, machine.timeout)
        deadline = machine.next_deadline()
        with trio.move_on_at(math.inf if deadline is None else deadline):
            pending += await _next_event(machine, all_clients, duologue)
        if not pending and deadline is not None and trio.current_time() >= deadline:
            pending += machine.on_timer(trio.current_time())


async def _next_event(
    machine: HandshakeMachine, all_clients: _Pair, duologue: _Pair
) -> list[Action]:
    """Wait for what the machine needs to hear next (the caller bounds the wait)."""
    state = machine.state
    pair = duologue if state is HandshakeState.JOINING else all_clients
    if pair.lost:
        now = trio.current_time()
        if state is HandshakeState.JOINING:
            return machine.on_duologue_closed(now)
        return machine.on_all_clients_closed(now)
    publication, subscription = pair.publication, pair.subscription
    assert publication is not None and subscription is not None
    if state is HandshakeState.AWAITING_CONNECT:
        received: list[Message] = []
        subscription.poll(received.append, fragment_limit=_READ_BATCH)
        actions: list[Action] = []
        for message in received:
            actions += machine.on_all_clients_message(message.data, trio.current_time())
            if actions:
                return actions
        if len(received) < _READ_BATCH:
            await subscription.wait_activity()
        return []
    if pair.connected:
        now = trio.current_time()
        if state is HandshakeState.CONNECTING:
            return machine.on_all_clients_connected(publication.session_id, now)
        return machine.on_duologue_connected(now)
    if not publication.is_connected:
        try:
            await publication.wait_connected()
        except trio.ClosedResourceError:
            await trio.sleep_forever()
    else:
        await subscription.wait_activity()
    return []


def _path_broken(session: Session, publication: Publication) -> bool:
    """Has `session` closed, or has `publication` (its stream) lost its receiver?"""
    return session.is_closed or not publication.is_connected


def _path_left(session: Session, publication: Publication) -> bool:
    """Has `session` closed, or moved off `publication` (a resume)?"""
    return session.is_closed or session.publication is not publication


class _Path:
    """Watches a session's path: when it breaks, resumes it (a resumable session) or closes it
    as LostContact (a session that cannot resume, or whose resume window passed)."""

    def __init__(
        self,
        transport: Transport,
        server: str,
        port: int,
        control_port: int,
        stream_id: int,
        timeout: float,
        duologue: _Pair,
        data_port: int,
        duologue_control_port: int,
        image_gone: Callable[[Image], None],
        shared: bool = False,
    ) -> None:
        self.shared = shared
        self.duologue = duologue
        self.data_port = data_port
        self.control_port_of_duologue = duologue_control_port
        self.image_gone = image_gone
        self.transport = transport
        self.server = server
        self.port = port
        self.control_port = control_port
        self.stream_id = stream_id
        self.timeout = timeout
        #: RESUME counter: the server takes each value once, in increasing order
        self.counter = 0
        self._lock = trio.Lock()

    async def keep(self, session: Session, secret: int | None) -> None:
        config = self.transport.config
        window = resume_window(config)
        # A look a second, not `wait_disconnected`: that wakes at every service of the
        # socket, and a bot farm or load test holds hundreds of sessions per transport. One
        # look for all of them (pathwatch.py), not a sleep each.
        watch = path_watch(self.transport, PATH_CHECK_INTERVAL)
        while not session.is_closed:
            publication = session.publication
            await watch.until(functools.partial(_path_broken, session, publication))
            if session.is_closed:
                return
            if session.publication is not publication:
                continue  # a resume (the application's) replaced it meanwhile
            if publication.receiver_left:
                # The server's subscription said goodbye (end-of-stream): the server closes the
                # session or is shutting down, in order; its stream's end, or its silence
                # (the image's liveness timeout), closes the session. Not a broken path. (Or
                # the server is moving the session for a resume under way: watch the new one.)
                await watch.until(functools.partial(_path_left, session, publication))
                continue
            if secret is None:
                # No status message for the connection timeout: the server is gone (or our
                # path to it), and this session cannot move. Sooner than the image's liveness
                # timeout, and before the application's own timeouts, it says what happened.
                await self._lose(session, "lost contact with the server")
                return
            # Try the new path, each attempt bounded by the handshake timeout, for as long as
            # the server may still hold the session; then it is LostContact, as without resume.
            with trio.move_on_after(window):
                try:
                    await self.resume(session, secret, broken=publication)
                except SessionError:
                    return
                continue
            await self._lose(session, "lost contact with the server (no resume)")
            return

    async def _lose(self, session: Session, reason: str, *, lost: bool = True) -> None:
        """Close `session` (as LostContact if `lost`) and wake whatever of the application
        waits on it."""
        session._peer_gone(reason, lost=lost)
        with trio.CancelScope(shield=True):
            # Closing the streams wakes a `receive` (the subscription tells its waiters) and a
            # `send` waiting for the publication to connect (it raises, and the send reports
            # the session's close): both then raise LostContact.
            await session.subscription.close()
            if not session.publication.is_closed:
                await session.publication.close(timeout=0)

    async def resume(
        self, session: Session, secret: int, *, broken: Publication | None = None
    ) -> None:
        """RESUME until the session's stream is connected again; raises SessionClosed if the
        server refused (the session is then closed) or it closed meanwhile. With `broken`,
        only if that publication is still the session's (nobody resumed meanwhile)."""
        async with self._lock:  # the watcher and the application may both ask
            if broken is not None and (session.publication is not broken or broken.is_connected):
                return
            ready = session._path_ready = trio.Event()
            try:
                await self._resume(session, secret)
            finally:
                ready.set()

    async def _resume(self, session: Session, secret: int) -> None:
        """Leave the old path, RESUME, start both streams again, send what the server missed.

        Both streams start again (the server does the same): our old stream's image at the
        server answers only the old address, and the server's stream goes to our old mapping,
        which our old image, alive, would never register again. What the old image holds is
        read into the session first; our application's sends wait (`_path_ready`) until what
        the server had not read of our old stream has gone out again on the new one.
        """
        old_sub, old_pub = session.subscription, session.publication
        old_sub.on_image_unavailable = None
        while old_sub.poll(session._batch.append, fragment_limit=1024):
            pass
        # From here on nothing more is read from the old stream (the server sends again what
        # this count leaves out) and nothing more is offered on ours (sends wait). The old
        # streams stay open until RESUMED: their end would tell the server we left.
        received = session._stream_received
        session.image = None
        while True:
            if session.is_closed:
                raise session._closed_error()
            self.counter += 1
            attempt = ResumeMachine(
                session_id=session.session_id,
                secret=secret,
                counter=self.counter,
                received=received,
                timeout=self.timeout,
            )
            try:
                peer_received = await self._attempt(attempt)
            except Rejected as error:
                # The server no longer has it (it expired) or refuses us: it is gone.
                session._peer_gone(f"resume refused: {error.reason}", lost=True)
                raise session._closed_error() from None
            except SessionError:
                await trio.sleep(0.2)  # the new path is not up yet: try again shortly
                continue
            break
        moving = session._begin_move()
        try:
            await self._replace_streams(session, old_sub, old_pub)
        finally:
            session._end_move(moving)
        await session._replay(peer_received)

    async def _replace_streams(
        self, session: Session, old_sub: Subscription, old_pub: Publication
    ) -> None:
        await old_sub.close()
        if not old_pub.is_closed:
            await old_pub.close(timeout=0)
        sub_channel, pub_channel = duologue_channels(
            _host(self.server),
            self.data_port,
            self.control_port_of_duologue,
            session.session_id,
            self.shared,
        )
        subscription = await self.transport.add_subscription(
            sub_channel, self.stream_id, on_image_unavailable=self.image_gone
        )
        publication = await self.transport.add_publication(
            pub_channel.format(registration_id=subscription.registration_id), self.stream_id
        )
        session.subscription = self.duologue.subscription = subscription
        session.publication = self.duologue.publication = publication
        session.counters.resumes += 1
        with trio.move_on_after(self.timeout):
            await publication.wait_connected()
            while not subscription.images:
                await subscription.wait_activity()
        if not (publication.is_connected and subscription.images):
            session._peer_gone("lost contact with the server (resume)", lost=True)
            raise session._closed_error()
        session.image = subscription.images[0]

    async def _attempt(self, machine: ResumeMachine) -> int:
        """One RESUME over a fresh all-clients pair: how many of our messages the server has
        read; raises the failure as `connect` does."""
        host = _host(self.server)
        pair = _Pair()
        transport = self.transport
        try:
            pending: list[Action] = machine.start(trio.current_time())
            while True:
                while pending:
                    action = pending.pop(0)
                    if isinstance(action, OpenAllClients):
                        pair.subscription = await transport.add_subscription(
                            f"aeron:udp?control={host}:{self.control_port}|control-mode=dynamic",
                            self.stream_id,
                            on_image_unavailable=pair.on_image_gone,
                        )
                        pair.publication = await transport.add_publication(
                            f"aeron:udp?endpoint={host}:{self.port}", self.stream_id
                        )
                    elif isinstance(action, SendResume):
                        assert pair.publication is not None
                        try:
                            await pair.publication.send(action.data, timeout=1.0)
                        except SendError as error:
                            pending += machine.on_send_failed(error.name, trio.current_time())
                    elif isinstance(action, CloseAllClients):
                        await _close_pair(pair)
                        pair = _Pair()
                    elif isinstance(action, ResumeDone):
                        return action.peer_received
                    elif isinstance(action, Failed):
                        raise failure_error(action.failure, machine.timeout)
                deadline = machine.next_deadline()
                with trio.move_on_at(math.inf if deadline is None else deadline):
                    pending += await _next_resume_event(machine, pair)
                if not pending and deadline is not None and trio.current_time() >= deadline:
                    pending += machine.on_timer(trio.current_time())
        finally:
            with trio.CancelScope(shield=True):
                await _close_pair(pair)


async def _next_resume_event(machine: ResumeMachine, pair: _Pair) -> list[Action]:
    now = trio.current_time()
    if pair.lost:
        return machine.on_all_clients_closed(now)
    publication, subscription = pair.publication, pair.subscription
    assert publication is not None and subscription is not None
    if machine.state is ResumeState.AWAITING_RESUMED:
        received: list[Message] = []
        subscription.poll(received.append, fragment_limit=_READ_BATCH)
        for message in received:
            actions = machine.on_all_clients_message(message.data, trio.current_time())
            if actions:
                return actions
        if len(received) < _READ_BATCH:
            await subscription.wait_activity()
        return []
    if pair.connected:
        return machine.on_all_clients_connected(publication.session_id, now)
    if not publication.is_connected:
        try:
            await publication.wait_connected()
        except trio.ClosedResourceError:
            await trio.sleep_forever()
    else:
        await subscription.wait_activity()
    return []


async def _close_publication(publication: Publication) -> None:
    if not publication.is_closed:
        await publication.close(timeout=0.5)
