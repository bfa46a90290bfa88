"""A client session's path: a watcher notices when it breaks, and a resumable session is taken
to the path the host has now with a RESUME (the pure `ResumeMachine`, carried out here), or
closed as LostContact within `lost_contact_bound`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import trio

from echo.session.client_handshake import (
    _READ_BATCH,
    _close_pair,
    _host,
    _open_all_clients,
    _Pair,
    duologue_channels,
    failure_error,
)
from echo.session.machine import (
    Action,
    CloseAllClients,
    Failed,
    OpenAllClients,
    ResumeDone,
    ResumeMachine,
    ResumeState,
    SendResume,
)
from echo.session.pathwatch import path_watch
from echo.session.session import Rejected, Session, SessionError
from echo.transport import (
    Image,
    Message,
    Publication,
    SendError,
    Subscription,
    Transport,
    TransportConfig,
)

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
                        # A subscription of its own: the path to the server may have changed.
                        await _open_all_clients(
                            transport, host, self.port, self.control_port, self.stream_id, pair,
                            share=False,
                        )  # fmt: skip
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
