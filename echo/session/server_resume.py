"""The session server's resumes: a client proves its session from a new network path
(echo.session.resume), both streams of its duologue start again on the same ports, and each end
sends again what the other had not read.
"""

from __future__ import annotations

import structlog
import trio

from echo.protocol import AllClientsError, format_message
from echo.session.admission import ResumeVerdict
from echo.session.resume import ERROR_RESUME_REFUSED, Resume, Resumed, format_resumed
from echo.session.server_base import Duologue, url_host
from echo.session.server_duologues import DuologueHost
from echo.session.session import Session, SessionClosed
from echo.session.shared import response_channel
from echo.transport import Message, Publication
from echo.transport.core.uri import UriError

log = structlog.get_logger("echo.session")


class ResumeHost(DuologueHost):
    """Takes a joined session to the new path a RESUME proves."""

    async def _on_resume(self, request: Resume, message: Message, key: str) -> None:
        """A client asks for its session back from a new path (echo.session.resume)."""
        client_session = message.session_id
        source_ip = message.source_ip
        verdict, slot = self.admission.resume(
            request.session_id, request.counter, request.received, request.proof, source_ip, key
        )
        duologue = None if slot is None else self.duologues.get(slot.slot_id)
        if verdict is not ResumeVerdict.ACCEPT or duologue is None or duologue.session is None:
            # Forged, replayed, a session that is gone or not yet joined: the same answer for
            # all, so a prober learns nothing about which session ids exist.
            self.resumes_refused += 1
            log.warning(
                "resume_refused",
                reason=verdict.value,
                client_session=client_session,
                source_ip=source_ip,
            )
            await self._reply(
                format_message(AllClientsError(client_session, ERROR_RESUME_REFUSED)),
                client_session,
            )
            return
        self.resumes += 1
        received = await self._move(duologue)
        if received is None:
            return
        await self._reply(format_resumed(Resumed(client_session, received)), client_session)
        assert self._nursery is not None
        self._nursery.start_soon(self._replay, duologue, request.received)

    async def _replay(self, duologue: Duologue, peer_received: int) -> None:
        """Once the client's new subscription joined our new stream: send it again what it had
        not read of the old one, then let the application's sends through."""
        session = duologue.session
        publication = duologue.publication
        assert session is not None and (publication is not None or self.config.shared)
        ready = session._path_ready
        try:
            if self.config.shared:
                publication = await self._answer_resumed(duologue)
            if publication is None:
                return
            with trio.move_on_after(self.transport_config.image_liveness_timeout):
                await publication.wait_connected()
            if publication.is_connected:
                await session._replay(peer_received)
        except (SessionClosed, trio.ClosedResourceError):
            pass
        finally:
            ready.set()

    async def _answer_resumed(self, duologue: Duologue) -> Publication | None:
        """Shared ports: once the resumed client's new request stream arrived, answer it with a
        new response publication (it names that image); None if it never came."""
        session = duologue.session
        assert session is not None and self.transport is not None
        with trio.move_on_after(self.transport_config.image_liveness_timeout):
            await duologue.rejoined.wait()
        image = duologue.image
        if image is None or session.is_closed:
            if not session.is_closed:
                session._peer_gone("client gone (resume)", lost=True)
                duologue.cancel_scope.cancel()
            return None
        try:
            publication = await self.transport.add_publication(
                response_channel(
                    url_host(self.config.address),
                    duologue.control_port,
                    image,
                    duologue.session_id,
                ),
                self.config.stream_id,
            )
        except (UriError, OSError) as error:  # (OSError: its control port was taken, `_answer`)
            log.warning("resume_failed", duologue_id=duologue.duologue_id, error=str(error))
            session._mark_closed("resume failed")
            duologue.cancel_scope.cancel()
            return None
        duologue.publication = session.publication = publication
        return publication

    async def _move(self, duologue: Duologue) -> int | None:
        """Take `duologue` to the new path, its owner already moved to the RESUME's address;
        returns how many messages of the client's stream the session has read.

        Both streams start again: the image of the client's stream answers (status messages,
        NAKs) only to the address its SETUP came from, and our stream's MDC destination is the
        client's old mapping, which the client's old image, alive, never re-registers. So what
        the old image holds is read into the session, both streams are replaced on the same
        ports and session id, and the client does the same on its side; each end then sends
        again what the other had not read (`Session._replay`), with the application's sends
        held until then, so no message is lost, doubled or reordered.
        """
        session = duologue.session
        assert session is not None
        session._path_ready = trio.Event()
        moving = session._begin_move()
        try:
            return await self._replace_streams(duologue, session)
        finally:
            session._end_move(moving)

    async def _replace_streams(self, duologue: Duologue, session: Session) -> int | None:
        assert self.transport is not None
        old_sub, old_pub = duologue.subscription, duologue.publication
        assert old_sub is not None and old_pub is not None
        duologue.image = None
        duologue.resuming = True
        session.image = None
        while old_sub.poll(session._batch.append, fragment_limit=1024):
            pass
        received = session._stream_received
        old_sub.on_image_available = None
        old_sub.on_image_unavailable = None
        await old_sub.close()
        if not old_pub.is_closed:
            await old_pub.close(timeout=0)
        slot = duologue.slot
        duologue.rejoined = trio.Event()
        try:
            # Shared ports: the response publication answers the client's new request image,
            # so it is opened once that arrived (`_answer_resumed`); sends wait until then.
            await self._open_streams(duologue)
        except OSError as error:
            log.warning("resume_failed", duologue_id=slot.slot_id, error=str(error))
            session._mark_closed("resume failed")
            duologue.cancel_scope.cancel()
            return None
        if not self.config.shared:
            assert duologue.publication is not None
            session.publication = duologue.publication
        assert duologue.subscription is not None
        session.subscription = duologue.subscription
        if session._owner_ip != slot.owner_ip:
            session._prior_owner_ip = session._owner_ip
            session._owner_ip = slot.owner_ip
        session.counters.resumes += 1
        return received
