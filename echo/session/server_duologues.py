"""The session server's duologues: reserve and open one for an admitted HELLO, let only its
owner join (the io7m Aeron guide §4.3), run the application on the session, and free
everything exactly once on every path (`_delete`).
"""

from __future__ import annotations

import functools

import structlog
import trio

from echo.protocol import Hello
from echo.session.admission import JoinVerdict
from echo.session.server_base import (
    CLOSE_REASONS,
    ERROR_APPLICATION,
    OPEN_ATTEMPTS,
    Duologue,
    ServerState,
    url_host,
)
from echo.session.session import RESUME_RETAIN_BYTES, Session, SessionClosed
from echo.session.shared import response_channel
from echo.transport import Image, Message, Publication
from echo.transport.core.uri import UriError

log = structlog.get_logger("echo.session")


class DuologueHost(ServerState):
    """Opens, joins, runs and frees the duologues."""

    async def _allocate(self, hello: Hello, message: Message, key: str) -> Duologue | None:
        """Reserve ports and a session, open the streams, then commit (table, per-IP slot).

        All or nothing. A port that another program holds (an ephemeral port of some client on
        this host, say) fails to bind: that reservation goes back and another pair is tried.
        """
        assert self._nursery is not None
        admission = self.admission
        if self._held is not None:
            self._held.sweep()  # ports of ended duologues whose sockets closed since
        for _ in range(OPEN_ATTEMPTS):
            slot = admission.reserve(
                message.source_ip, key, message.session_id, trio.current_time()
            )
            if slot is None:
                return None
            duologue = Duologue(slot)
            try:
                await self._open_streams(duologue)
            except OSError as error:
                log.warning(
                    "duologue_ports_unavailable",
                    data_port=slot.data_port,
                    control_port=slot.control_port,
                    error=str(error),
                )
                if duologue.publication is not None:
                    await duologue.publication.close(timeout=0)
                admission.unreserve(slot)
                continue
            break
        else:
            return None
        admission.commit(slot)
        self.duologues[slot.slot_id] = duologue
        self.events.emit(
            "duologue_created",
            duologue_id=slot.slot_id,
            client_session=slot.client_session,
            source_ip=slot.owner_ip,
            source_prefix=key,
            data_port=slot.data_port,
            control_port=slot.control_port,
        )
        self._nursery.start_soon(self._run_duologue, duologue)
        return duologue

    async def _open_streams(self, duologue: Duologue) -> None:
        """Open the duologue's subscription on its data port and, per-client ports, its
        publication on its control port (OSError: a port is taken)."""
        assert self.transport is not None
        config = self.config
        host = url_host(config.address)
        slot = duologue.slot
        if not config.shared:
            # Shared: the response publication answers the client's image (it names the
            # image), so it is opened once the client joined (`_answer`, `_answer_resumed`).
            duologue.publication = await self.transport.add_publication(
                f"aeron:udp?control={host}:{slot.control_port}|control-mode=dynamic"
                f"|session-id={slot.session_id}",
                config.stream_id,
            )
        duologue.subscription = await self.transport.add_subscription(
            f"aeron:udp?endpoint={host}:{slot.data_port}|session-id={slot.session_id}",
            config.stream_id,
            on_image_available=functools.partial(self._on_image, duologue),
            on_image_unavailable=functools.partial(self._on_image_gone, duologue),
        )

    def _on_image(self, duologue: Duologue, image: Image) -> None:
        verdict = self.admission.join(
            duologue.slot, image.source_ip, has_stream=duologue.image is not None
        )
        if verdict is not JoinVerdict.ACCEPT:
            # Someone who is not the client that asked (spoofed or guessed the session):
            # refuse the stream, so it can neither talk nor keep the duologue from expiring.
            self.events.emit(
                "image_refused",
                duologue_id=duologue.duologue_id,
                source_ip=image.source_ip,
                reason=verdict.value,
            )
            image.reject()
            return
        duologue.image = image
        session = duologue.session
        if session is not None:
            session.image = image
            session.peer = (image.source_ip, image.source_port)
        if duologue.resuming:
            duologue.resuming = False
            duologue.rejoined.set()
            log.info(
                "session_resumed",
                duologue_id=duologue.duologue_id,
                source_ip=image.source_ip,
                source_port=image.source_port,
            )
            return
        self.sessions_opened += 1
        self.events.emit(
            "duologue_connected",
            duologue_id=duologue.duologue_id,
            source_ip=image.source_ip,
            source_port=image.source_port,
        )

    def _on_image_gone(self, duologue: Duologue, image: Image) -> None:
        if duologue.image is not image:
            return
        duologue.image = None
        if duologue.session is not None:
            duologue.session._peer_gone("client gone", lost=image.close_reason == "timed_out")

    async def _run_duologue(self, duologue: Duologue) -> None:
        reason = "client gone"
        self.tasks += 1
        try:
            with duologue.cancel_scope:
                joined = await self._wait_for_join(duologue)
                if joined is None and self.config.shared:
                    joined = await self._answer(duologue)
                reason = joined or await self._run_session(duologue)
        finally:
            # (Counted until its streams are closed too: `_delete` waits, and a server that
            # says it has no task left has no socket of a duologue left either.)
            try:
                with trio.CancelScope(shield=True):
                    await self._delete(duologue, reason)
            finally:
                self.tasks -= 1

    async def _wait_for_join(self, duologue: Duologue) -> str | None:
        """None once the owner joined; else why the duologue ends ("expired", "client gone")."""
        subscription = duologue.subscription
        assert subscription is not None
        admission = self.admission
        expires = admission.expires_at(duologue.slot)
        while duologue.image is None:
            if duologue.ever_connected:
                return "client gone"  # joined and left before this task looked
            # Not joined yet: wait for a join or the expiry (guide §4.3: spoofed HELLOs die here).
            if admission.is_expired(duologue.slot, trio.current_time()):
                return "expired"
            with trio.move_on_at(expires):
                await subscription.wait_activity()
        return None

    async def _answer(self, duologue: Duologue) -> str | None:
        """Shared ports: open the response publication to the client that joined; None, or
        why the duologue ends (a client that did not ask for a response channel)."""
        assert self.transport is not None and duologue.image is not None
        host = url_host(self.config.address)
        image = duologue.image
        try:
            duologue.publication = await self.transport.add_publication(
                response_channel(host, duologue.control_port, image, duologue.session_id),
                self.config.stream_id,
            )
        except UriError as error:
            # A per-client client (the Java Echo 2.0 client, a plain Aeron peer) joined the
            # shared ports: its SETUP did not ask for a response channel.
            self.events.emit(
                "image_refused",
                duologue_id=duologue.duologue_id,
                source_ip=image.source_ip,
                reason="no response channel",
            )
            log.warning("duologue_needs_response_channel", error=str(error))
            return "client has no response channel (--duologue-ports per-client?)"
        except OSError as error:
            # The shared control port is bound only while a response publication uses it and
            # held by a placeholder between; another program (a client's ephemeral port on
            # this host) can take it in that instant. This duologue ends; the server goes on,
            # and the port is bound again on demand once that program lets it go.
            log.error(
                "duologue_control_port_unavailable",
                duologue_id=duologue.duologue_id,
                control_port=duologue.control_port,
                error=str(error),
            )
            return f"the server's duologue port {duologue.control_port} is unavailable"
        return None

    async def _run_session(self, duologue: Duologue) -> str:
        """Run the application on the joined duologue; the session's close reason."""
        assert self.transport is not None and self._nursery is not None
        image = duologue.image
        assert image is not None and duologue.publication is not None
        assert duologue.subscription is not None
        session = Session(
            transport=self.transport,
            publication=duologue.publication,
            subscription=duologue.subscription,
            session_id=duologue.session_id,
            peer=(image.source_ip, image.source_port),
            opened_at=trio.current_time(),
            owner_ip=duologue.owner_ip,
            receive_batch=self.receive_batch,
            send_timeout=self.send_timeout,
            on_close=functools.partial(self._on_session_closed, duologue),
        )
        session.image = image
        session.admission = duologue.admission
        if duologue.keys is not None:
            session.cipher = duologue.keys.cipher()
        duologue.session = session
        if duologue.slot.resume_secret is not None:
            # The client can resume: keep what we send (to send again what it missed) and
            # let sends wait out a resume rather than fail.
            session._retain = RESUME_RETAIN_BYTES
            session._resume_wait = self.transport_config.image_liveness_timeout
        try:
            await self.app(session)
        except SessionClosed:
            pass  # a send or receive after the close: the application's normal way out
        except Exception as error:
            if isinstance(error, ExceptionGroup) and error.split(SessionClosed)[1] is None:
                pass  # the same, from tasks of the application's own nursery (LostContact...)
            else:
                self._application_failed(duologue, error)
                await session.close(ERROR_APPLICATION)
        except BaseExceptionGroup as group:
            # The application failed while it was being cancelled (its grace after the close
            # ran out): a Cancelled beside its own error. The error is the application's, not
            # the server's: count and log it, and let only the cancellation go on, which this
            # duologue's cancel scope ends. (Left whole, the group passed `except Exception`
            # and the scope, and its error took the server down.)
            cancelled, failed = group.split(trio.Cancelled)
            if failed is not None:
                self._application_failed(duologue, failed)
            if cancelled is not None:
                raise cancelled from None
            await session.close(ERROR_APPLICATION)
        else:
            if not session.is_closed:
                # The application is done with it: end the stream, no ERROR.
                await session.close()
        return session.close_reason or "closed"

    def _application_failed(self, duologue: Duologue, error: BaseException) -> None:
        self.application_errors += 1
        log.error(
            "application_failed",
            duologue_id=duologue.duologue_id,
            source_ip=duologue.owner_ip,
            error=repr(error),
            exc_info=error,
        )

    def _on_session_closed(self, duologue: Duologue, session: Session) -> None:
        if session.counters.refused:
            self.messages_refused += 1
            self.events.emit(
                "message_refused",
                duologue_id=duologue.duologue_id,
                source_ip=duologue.owner_ip,
                reason=session.close_reason,
            )
        # An application that goes on regardless (never reads, sleeps) is cancelled after the
        # grace; one that reads sees SessionClosed at once and returns well before.
        scope = duologue.cancel_scope
        scope.deadline = min(scope.deadline, trio.current_time() + self.app_grace)

    async def _delete(self, duologue: Duologue, reason: str) -> None:
        """Free everything the duologue holds, exactly once, whatever path got us here."""
        slot = duologue.slot
        if not self.admission.release(slot):
            return
        duologue.close_reason = reason
        self.closes[reason if reason in CLOSE_REASONS else "other"] += 1
        self.duologues.pop(slot.slot_id, None)
        if not self.duologues and self._emptied is not None:
            self._emptied.set()
        duologue.cancel_scope.cancel()
        if duologue.session is not None:
            duologue.session._mark_closed(reason)
        lifetime = trio.current_time() - slot.created
        if reason == "expired":
            self.events.emit(
                "duologue_expired",
                duologue_id=slot.slot_id,
                source_ip=slot.owner_ip,
                source_prefix=slot.owner_key,
                age_s=round(lifetime, 6),
            )
        self.events.emit(
            "duologue_closed",
            duologue_id=slot.slot_id,
            source_ip=slot.owner_ip,
            source_prefix=slot.owner_key,
            reason=reason,
            lifetime_s=round(lifetime, 6),
            messages=duologue.messages,
        )
        for stream in (duologue.subscription, duologue.publication):
            if stream is None:
                continue
            try:
                if isinstance(stream, Publication):
                    if not stream.is_closed:
                        await stream.close(timeout=0.0)
                else:
                    await stream.close()
                    # Its callbacks hold the duologue, and the session (which the application
                    # may keep) holds the subscription.
                    stream.on_image_available = None
                    stream.on_image_unavailable = None
            except (trio.ClosedResourceError, OSError):
                pass
        # The subscription's image callbacks hold the duologue, which holds the subscription:
        # without this the pair (with its sockets and term buffers) waits for a full pass of
        # the cyclic collector, which takes 100-200 ms with 1,000 duologues open.
        duologue.subscription = None
        duologue.publication = None
        duologue.image = None
        if duologue.session is not None:
            duologue.session._release()
        if self._held is not None:
            self._held.returned((slot.data_port, slot.control_port))
