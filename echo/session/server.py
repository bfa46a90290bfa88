"""The session server on trio: Echo 2.0's admission and duologues for any application.

One task reads the all-clients subscription and answers HELLOs on the all-clients MDC
publication (the io7m Aeron guide §4.4-§4.5); each admitted HELLO gets a duologue, whose task waits
for the client to join (or for the expiry) and then runs the application with a `Session`, in that
task. All state lives in this one trio thread: no locks, no executor (the guide's §3.3.5). The
decisions (admit, evict, reserve, who may join, expiry, release exactly once) are the pure
`echo.session.admission.Admission`; this module and its layers only execute them: the
hooks, `Duologue` and the server's state (`server_base`), the duologues' life
(`server_duologues`), resumes (`server_resume`) and HELLOs (`server_hello`); here the
server's start, stop and drain.

Fixed relative to the guide's code, as the Echo server did before it was split out:
the owner of a duologue is the source address of the message that carried the HELLO (no race
with image callbacks); IPv6 clients are limited per prefix; ports, session and per-IP slot are
freed exactly once on every path; an image from the wrong address is rejected; the expiry is
configurable.

An application exception closes its session (the peer gets ``ERROR application error``), is
logged with its traceback, and never reaches the server. An application that does not return
within `app_grace` seconds after its session closed (it never reads, it sleeps) is cancelled.
"""

from __future__ import annotations

from typing import Any, Final

import structlog
import trio

from echo.protocol import ERROR_SHUTTING_DOWN, DuologueError, format_message
from echo.session.allocators import PortAllocator, SessionAllocator
from echo.session.config import ServerConfig
from echo.session.held import HeldPorts
from echo.session.limits import AddressCounter
from echo.session.server_base import (
    ADMISSION_RESULTS,
    CLOSE_REASONS,
    DEFAULT_APP_GRACE,
    ERROR_APPLICATION,
    ERROR_BAD_KEY,
    ERROR_ENCRYPTION_OFF,
    ERROR_ENCRYPTION_REQUIRED,
    OPEN_ATTEMPTS,
    Admit,
    AdmitResult,
    Admitted,
    Application,
    Duologue,
    EventSink,
    server_transport_config,
    url_host,
)
from echo.session.server_hello import HelloHost
from echo.transport import SendError, Transport, open_transport

log = structlog.get_logger("echo.session")

#: The names users import from here (the layers' own modules hold them).
__all__ = [
    "ADMISSION_RESULTS",
    "CLOSE_REASONS",
    "DEFAULT_APP_GRACE",
    "ERROR_APPLICATION",
    "ERROR_BAD_KEY",
    "ERROR_ENCRYPTION_OFF",
    "ERROR_ENCRYPTION_REQUIRED",
    "OPEN_ATTEMPTS",
    "Admit",
    "AdmitResult",
    "Admitted",
    "Application",
    "Duologue",
    "EventSink",
    "SessionServer",
    "serve",
    "server_transport_config",
]


#: The all-clients publication's term length. It carries one short reply per HELLO (a CONNECT
#: of some 170 bytes with its header) for the server's whole life, so with the transport's
#: 16 MiB terms its log kept touching fresh pages until three terms were in memory: the
#: one-hour soak's echo-server grew by 36 MiB an hour, in step with that log's resident pages
#: (`ECHO_MEMDEBUG`). 1 MiB terms bound it to 3 MiB and still keep the last 3 MiB of replies
#: (some 18,000 admissions) for a client's NAK; a CONNECT is far below the term's 128 KiB
#: message limit, and the MDC flow control (the fastest receiver) is not held back by it.
ALL_CLIENTS_TERM_LENGTH: Final = 1 << 20


class SessionServer(HelloHost):
    """Admission, duologues and sessions for `app`. `run()` serves; `stop()` ends it gracefully.

    app(session)          coroutine function, called once per joined session, in its own task
    admit(peer, creds)    optional, called for each HELLO before a duologue is allocated;
                          returns None to admit, `Admitted(claims)` to admit with claims
                          the application reads as `session.admission`, or a reason to
                          refuse (the client's `Rejected.reason`);
                          may be a coroutine function (HELLOs wait for it: keep it quick).
                          With a hook, HELLO may carry credentials (protocol.py's extension).
    receive_batch         the bound on each session's own receive queue (see Session)
    app_grace             seconds an application may run on after its session closed
    """

    @property
    def ports(self) -> PortAllocator:
        return self.admission.ports

    @property
    def sessions(self) -> SessionAllocator:
        return self.admission.sessions

    @property
    def per_ip(self) -> AddressCounter:
        return self.admission.per_ip

    # ---------------------------------------------------------------- life cycle

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; `stop()` ends it gracefully. `task_status.started(self)`."""
        config = self.config
        # Every port the server will use is bound before it says it started: the two
        # all-clients ports by the transport, the duologue ports held (echo.session.held) so
        # that a second server on the same range fails at its start, not at a client's HELLO.
        held = self._held = HeldPorts(config.address, config.clients_port_range)
        try:
            async with open_transport(
                self.transport_config, socket_factory=held.socket_factory
            ) as transport:
                await self._start(transport, held, task_status)
        finally:
            held.close()

    async def _start(self, transport: Transport, held: HeldPorts, task_status: Any) -> None:
        """Open the all-clients channels, hold the duologue ports, serve."""
        config = self.config
        host = url_host(config.address)
        self.transport = transport
        self.all_clients_pub = await transport.add_publication(
            f"aeron:udp?control={host}:{config.control_port}|control-mode=dynamic"
            f"|term-length={ALL_CLIENTS_TERM_LENGTH}",
            config.stream_id,
        )
        self.all_clients_sub = await transport.add_subscription(
            f"aeron:udp?endpoint={host}:{config.port}", config.stream_id
        )
        held.hold()
        self.events.emit(
            "server_started",
            address=config.address,
            port=config.port,
            control_port=config.control_port,
            clients_base_port=config.clients_base_port,
            max_clients=config.max_clients,
            max_per_ip=config.max_per_ip,
            encryption=config.encryption_mode.value,
            key_fingerprint=None if config.key is None else config.key.short_fingerprint,
        )
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started(self)
                nursery.start_soon(self._serve_all_clients)
        finally:
            self._nursery = None

    async def stop(self, reason: str = "signal") -> None:
        """Tell every connected client the server is going, close everything, return."""
        if self._stopping:
            return
        self._stopping = True
        open_before = len(self.duologues)
        with trio.move_on_after(2.0) as scope:
            scope.shield = True
            async with trio.open_nursery() as nursery:
                for duologue in list(self.duologues.values()):
                    nursery.start_soon(self._say_goodbye, duologue)
        for duologue in list(self.duologues.values()):
            await self._delete(duologue, ERROR_SHUTTING_DOWN)
        self.events.emit("server_stopped", reason=reason, duologues_open=open_before)
        if self.transport is not None:
            counters = {k: v for k, v in self.transport.counters.snapshot().items() if v}
            log.info("transport_counters", **counters)
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    async def drain(self, timeout: float) -> bool:
        """Stop admitting and wait, up to `timeout` seconds, for every duologue to end.

        New HELLOs are refused ("server shutting down") from now on; sessions already open
        go on until their clients close them (RESUMEs still work). True if every duologue
        ended in time; either way the server still runs: `stop()` ends what is left.
        """
        if not self.draining:
            self.draining = True
            log.info("server_draining", duologues_open=len(self.duologues))
        with trio.move_on_after(timeout):
            while self.duologues:
                self._emptied = trio.Event()
                await self._emptied.wait()
        return not self.duologues

    async def _say_goodbye(self, duologue: Duologue) -> None:
        publication = duologue.publication
        if publication is None or not duologue.ever_connected:
            return
        if duologue.session is not None:
            # The application hears it first, so it stops sending behind the goodbye.
            duologue.session._mark_closed(ERROR_SHUTTING_DOWN)
        if publication.is_closed:
            return
        # Whatever was offered to this client (the messages in flight, then the goodbye) is
        # delivered or reported here as not delivered, never dropped in silence.
        problem: str | None = None
        try:
            goodbye = DuologueError(ERROR_SHUTTING_DOWN)
            data = (
                format_message(goodbye)
                if duologue.session is None
                else duologue.session.seal_control(goodbye)
            )
            await publication.send(data, timeout=0.5)
            if not await publication.close(timeout=1.0):
                problem = "not acknowledged by the client"
        except SendError as error:
            problem = f"could not send: {error.name}"
        except trio.ClosedResourceError:
            problem = "stream already closed"
        if problem is not None:
            log.warning(
                "goodbye_undelivered",
                duologue_id=duologue.duologue_id,
                source_ip=duologue.owner_ip,
                problem=problem,
            )

    # ---------------------------------------------------------------- all-clients channel

    async def _serve_all_clients(self) -> None:
        assert self.all_clients_sub is not None
        async for message in self.all_clients_sub:
            if self._stopping:
                return
            await self._on_hello(message)


async def serve(
    config: ServerConfig,
    app: Application,
    *,
    task_status: Any = trio.TASK_STATUS_IGNORED,
    **options: Any,
) -> None:
    """`SessionServer(config, app, **options).run()`: serve until cancelled.

    With `nursery.start(serve, config, app)` the started value is the SessionServer.
    """
    await SessionServer(config, app, **options).run(task_status=task_status)
