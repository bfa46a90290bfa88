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

The handshake's streams are carried out in `echo.session.client_handshake`, the watcher and
the resumes in `echo.session.client_path`; here `connect` puts them together.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import attrs
import trio

from echo.protocol import ECHO_STREAM_ID, RESERVED_SESSION_HIGH, RESERVED_SESSION_LOW
from echo.session.client_handshake import (
    HandshakeStep,
    _close_pair,
    _handshake,
    _Pair,
    duologue_channels,
    failure_error,
)
from echo.session.client_path import PATH_CHECK_INTERVAL, _Path, lost_contact_bound, resume_window
from echo.session.config import DuologuePorts
from echo.session.crypto import ClientHandshake, Pin
from echo.session.machine import HandshakeMachine, Opened
from echo.session.resume import RESUME_BITS
from echo.session.session import (
    CLOSE_LINGER,
    DEFAULT_RECEIVE_BATCH,
    DEFAULT_SEND_TIMEOUT,
    RESUME_RETAIN_BYTES,
    Session,
)
from echo.session.timers import echo_timers
from echo.transport import Image, Subscription, Transport, TransportConfig, open_transport

#: The names users import from here (the handshake's and the path's modules hold some).
__all__ = [
    "PATH_CHECK_INTERVAL",
    "HandshakeStep",
    "client_transport_config",
    "connect",
    "duologue_channels",
    "failure_error",
    "lost_contact_bound",
    "resume_window",
]


def client_transport_config(base: TransportConfig | None = None) -> TransportConfig:
    """Auto session ids of a client stay out of the duologue range, as on the server."""
    return attrs.evolve(
        base or echo_timers(),
        reserved_session_low=RESERVED_SESSION_LOW,
        reserved_session_high=RESERVED_SESSION_HIGH,
    )


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
        session, image_gone = _open_session(
            transport, opened, duologue, server, receive_batch, send_timeout
        )
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
            await _close_session(session, all_clients, duologue)


def _open_session(
    transport: Transport,
    opened: Opened,
    duologue: _Pair,
    server: str,
    receive_batch: int,
    send_timeout: float,
) -> tuple[Session, Callable[[Image], None]]:
    """The `Session` on the joined duologue, and the callback that closes it when the
    server's stream goes (the duologue subscription's, kept across resumes)."""
    assert duologue.publication is not None
    assert isinstance(duologue.subscription, Subscription)  # (a duologue's is its own)
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
    return session, image_gone


async def _close_session(session: Session | None, all_clients: _Pair, duologue: _Pair) -> None:
    """Close the session (a goodbye, bounded) and both pairs; drop the callbacks."""
    if session is not None:
        with trio.move_on_after(2.0):
            await session.close()
    await _close_pair(all_clients)
    await _close_pair(duologue)
    if session is not None:
        session._release()
    if isinstance(duologue.subscription, Subscription):
        duologue.subscription.on_image_unavailable = None

