"""The session server on trio: Echo 2.0's admission and duologues for any application.

One task reads the all-clients subscription and answers HELLOs on the all-clients MDC
publication (the io7m Aeron guide §4.4-§4.5); each admitted HELLO gets a duologue, whose task waits
for the client to join (or for the expiry) and then runs the application with a `Session`, in that
task. All state lives in this one trio thread: no locks, no executor (the guide's §3.3.5). The
decisions (admit, evict, reserve, who may join, expiry, release exactly once) are the pure
`echo.session.admission.Admission`; this module only executes them.

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

import functools
import inspect
import secrets
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeAlias

import attrs
import structlog
import trio

from echo.protocol import (
    ERROR_BAD_MESSAGE,
    ERROR_SERVER_FULL,
    ERROR_SHUTTING_DOWN,
    ERROR_TOO_MANY_FOR_IP,
    RESERVED_SESSION_HIGH,
    RESERVED_SESSION_LOW,
    AllClientsError,
    BadMessage,
    Connect,
    DuologueError,
    Hello,
    encrypt_session,
    format_message,
)
from echo.session.admission import Admission, JoinVerdict, ResumeVerdict, Slot
from echo.session.allocators import PortAllocator, RandomSource, SessionAllocator
from echo.session.config import Encryption, ServerConfig
from echo.session.crypto import (
    BadKey,
    SessionKeys,
    Transcript,
    resume_secret,
    server_keys_from_shared,
)
from echo.session.crypto import server_nonce as fresh_server_nonce
from echo.session.held import HeldPorts
from echo.session.keywire import ConnectKey, HelloKey, append_connect_key, split_hello_key
from echo.session.limits import AddressCounter
from echo.session.resume import (
    ERROR_RESUME_REFUSED,
    RESUME_BITS,
    ResumableConnect,
    ResumableHello,
    Resume,
    Resumed,
    format_resumable_connect,
    format_resumed,
    parse_client_request_untrusted,
)
from echo.session.session import (
    DEFAULT_RECEIVE_BATCH,
    DEFAULT_SEND_TIMEOUT,
    RESUME_RETAIN_BYTES,
    Session,
    SessionClosed,
)
from echo.session.shared import response_channel
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
from echo.transport.core.uri import UriError

log = structlog.get_logger("echo.session")

#: Port pairs tried before a HELLO is refused because no duologue could be opened.
OPEN_ATTEMPTS = 8
#: Seconds an application may go on after its session closed before it is cancelled.
DEFAULT_APP_GRACE = 2.0
#: What the peer is told when the application raised.
ERROR_APPLICATION = "application error"
#: What a HELLO hears that the server's --encryption mode does not serve.
ERROR_ENCRYPTION_REQUIRED = "encryption required"
ERROR_ENCRYPTION_OFF = "encryption not offered"
ERROR_BAD_KEY = "bad key"

#: What became of a HELLO, for the metrics: a duologue, or which refusal.
ADMISSION_RESULTS = (
    "accepted",
    "server_full",
    "per_ip_limit",
    "bad_message",
    "refused",  # by the admission hook (a ticket, a ban): its reason is free text
    "draining",  # the server is draining: it lets its sessions end and admits nobody
    "unvalidated",  # from an address that never answered the MDC cookie (dropped silently)
)
_REFUSALS = {
    ERROR_SERVER_FULL: "server_full",
    ERROR_TOO_MANY_FOR_IP: "per_ip_limit",
    ERROR_BAD_MESSAGE: "bad_message",
    ERROR_SHUTTING_DOWN: "draining",
}
#: Why duologues end, as counted (any other reason, a free-text close, counts as "other").
CLOSE_REASONS = (
    "closed",
    "client gone",
    "send failed",
    "expired",
    "evicted",
    ERROR_SHUTTING_DOWN,
    ERROR_APPLICATION,
    "too slow",
    "other",
)

Application: TypeAlias = Callable[[Session], Awaitable[None]]


@attrs.frozen
class Admitted:
    """An `admit` hook's way to admit a client and say who it is: `claims` (a verified
    ticket's claims, say) reach the application as `session.admission`, so it never asks the
    client for its credentials a second time."""

    claims: object


#: admit(peer, credentials) -> None or Admitted(claims) to admit, or the reason to refuse
#: (sent as ERROR)
AdmitResult: TypeAlias = "str | Admitted | Awaitable[str | Admitted | None] | None"
Admit: TypeAlias = Callable[[tuple[str, int], bytes], AdmitResult]


class EventSink(Protocol):
    def emit(self, event: str, **fields: Any) -> None: ...


class _LogOnly:
    def emit(self, event: str, **fields: Any) -> None:
        log.info(event, **fields)


def server_transport_config(
    base: TransportConfig | None = None, *, max_clients: int = 0
) -> TransportConfig:
    """Transport settings for a server: auto session ids stay out of the duologue range.

    With no `base`, the timers are the Echo defaults of `echo_timers` rather than Aeron's.
    `max_clients` raises (never lowers) the transport's caps on images per subscription and
    destinations per MDC publication to twice that: every client is an image of the
    all-clients subscription while it says HELLO, a destination of the all-clients channel,
    and (shared duologue ports) an image of the one duologue subscription, twice for a moment
    while it resumes. The transport's default caps (1,024) would refuse the 1,025th client's
    streams of a larger server ("too_many_images") and it would never connect.
    """
    config = attrs.evolve(
        base or echo_timers(),
        reserved_session_low=RESERVED_SESSION_LOW,
        reserved_session_high=RESERVED_SESSION_HIGH,
    )
    wanted = 2 * max_clients
    if wanted > config.max_images or wanted > config.max_destinations:
        config = attrs.evolve(
            config,
            max_images=max(config.max_images, wanted),
            max_destinations=max(config.max_destinations, wanted),
        )
    return config


def _url_host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


class Duologue:
    """One client's publication + subscription pair (guide §4.3), and its session once joined."""

    def __init__(self, slot: Slot) -> None:
        self.slot = slot
        self.publication: Publication | None = None
        self.subscription: Subscription | None = None
        self.image: Image | None = None
        self.session: Session | None = None
        self.close_reason: str | None = None
        self.cancel_scope = trio.CancelScope()
        #: the session's keys (None: in the clear)
        self.keys: SessionKeys | None = None
        #: a RESUME moved the client: its next stream is the session's, not a new join
        self.resuming = False
        #: set when the resumed client's new stream arrived (shared ports answer it)
        self.rejoined = trio.Event()
        #: what the admit hook said of the client (`Admitted.claims`), for its session
        self.admission: object = None

    duologue_id = property(lambda self: self.slot.slot_id)
    session_id = property(lambda self: self.slot.session_id)
    owner_ip = property(lambda self: self.slot.owner_ip)
    owner_key = property(lambda self: self.slot.owner_key)
    client_session = property(lambda self: self.slot.client_session)
    data_port = property(lambda self: self.slot.data_port)
    control_port = property(lambda self: self.slot.control_port)
    created = property(lambda self: self.slot.created)
    ever_connected = property(lambda self: self.slot.joined)
    freed = property(lambda self: self.slot.released)

    @property
    def messages(self) -> int:
        """Messages the application sent on this duologue (Echo: echoes answered)."""
        return 0 if self.session is None else self.session.counters.messages_sent


class SessionServer:
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

    def __init__(
        self,
        config: ServerConfig,
        app: Application,
        *,
        transport_config: TransportConfig | None = None,
        events: EventSink | None = None,
        rng: RandomSource | None = None,
        admit: Admit | None = None,
        receive_batch: int = DEFAULT_RECEIVE_BATCH,
        send_timeout: float = DEFAULT_SEND_TIMEOUT,
        app_grace: float = DEFAULT_APP_GRACE,
    ) -> None:
        if receive_batch < 1:
            raise ValueError(f"receive_batch must be >= 1, got {receive_batch}")
        self.config = config
        self.app = app
        self.admit = admit
        self.transport_config = server_transport_config(
            transport_config, max_clients=config.max_clients
        )
        self.events: EventSink = events or _LogOnly()
        self.admission = Admission(config, rng if rng is not None else secrets.SystemRandom())
        self.duologues: dict[int, Duologue] = {}
        self.transport: Transport | None = None
        self.all_clients_pub: Publication | None = None
        self.all_clients_sub: Subscription | None = None
        self.receive_batch = receive_batch
        self.send_timeout = send_timeout
        self.app_grace = app_grace
        self._nursery: trio.Nursery | None = None
        #: the duologue ports held while the server runs (echo.session.held)
        self._held: HeldPorts | None = None
        self._stopping = False
        #: set by `drain`: HELLOs are refused, sessions go on; `_emptied` wakes it
        self.draining = False
        self._emptied: trio.Event | None = None
        self.hellos = 0
        self.unvalidated_hellos = 0
        self.application_errors = 0
        #: sessions taken to a new address by a RESUME, and RESUMEs refused
        self.resumes = 0
        self.resumes_refused = 0
        #: duologue tasks running (a task leak shows here)
        self.tasks = 0
        #: HELLOs by outcome (`ADMISSION_RESULTS`), sessions joined, duologues ended by why
        #: (`CLOSE_REASONS`): the operations metrics read these (echo.ops.metrics)
        self.admissions: Counter[str] = Counter()
        self.sessions_opened = 0
        self.closes: Counter[str] = Counter()
        #: encrypted sessions agreed; HELLOs refused for their key or the encryption mode;
        #: sessions closed because a message failed authentication or the replay window
        self.encrypted_sessions = 0
        self.key_refusals = 0
        self.messages_refused = 0

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
        host = _url_host(config.address)
        self.transport = transport
        self.all_clients_pub = await transport.add_publication(
            f"aeron:udp?control={host}:{config.control_port}|control-mode=dynamic",
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

    async def _reply(self, text: bytes, client_session: int) -> None:
        """Answer on the all-clients channel without holding up the next HELLO.

        Every datagram on this channel goes to every client still in its handshake, so the
        cost is datagrams x destinations: replies offered together share datagrams (the
        HELLOs that queued up while the last batch went out are answered in one batch).
        """
        assert self.all_clients_pub is not None and self._nursery is not None
        result = self.all_clients_pub.offer(text, flush=False)
        if result > 0:
            return
        # Not connected (the client's SM was lost, it is a validated address so it is there),
        # back pressure or a term rotation: retry in the background, bounded, as the guide's
        # sendMessage did, but without serialising every other client behind this one.
        self._nursery.start_soon(self._send_later, text, client_session)

    async def _send_later(self, text: bytes, client_session: int) -> None:
        assert self.all_clients_pub is not None
        try:
            await self.all_clients_pub.send(text, timeout=2.0)
        except SendError as error:
            log.warning("reply_failed", client_session=client_session, error=error.name)

    async def _refuse(self, reason: str, client_session: int, fields: dict[str, Any]) -> None:
        self.admissions[_REFUSALS.get(reason, "refused")] += 1
        self.events.emit("hello_rejected", reason=reason, **fields)
        await self._reply(format_message(AllClientsError(client_session, reason)), client_session)

    async def _on_hello(self, message: Message) -> None:
        self.hellos += 1
        client_session = message.session_id
        source_ip = message.source_ip
        admission = self.admission
        key = admission.key_of(source_ip)
        fields = {"client_session": client_session, "source_ip": source_ip, "source_prefix": key}
        assert self.all_clients_pub is not None
        if self.transport_config.validate_addresses and not (
            self.all_clients_pub.has_destination_host(source_ip)
        ):
            # A HELLO from an address that never proved, by the MDC cookie exchange, that it
            # can receive our replies: most likely forged (the guide §4.3's spoofer). Drop it
            # silently: a reply could not reach it anyway, and a duologue would only hold the
            # victim's per-IP slots.
            self.unvalidated_hellos += 1
            self.admissions["unvalidated"] += 1
            self.events.emit("hello_rejected", reason="unvalidated address", **fields)
            return
        split = split_hello_key(message.data)
        if isinstance(split, BadMessage):
            self.events.emit("hello_received", **fields)
            await self._refuse(ERROR_BAD_MESSAGE, client_session, fields)
            return
        data, hello_key = split
        parsed = parse_client_request_untrusted(data, credentials=self.admit is not None)
        if isinstance(parsed, Resume):
            await self._on_resume(parsed, message, key)
            return
        self.events.emit("hello_received", **fields)
        if isinstance(parsed, BadMessage):
            await self._refuse(ERROR_BAD_MESSAGE, client_session, fields)
            return
        if self.draining:
            await self._refuse(ERROR_SHUTTING_DOWN, client_session, fields)
            return
        resumable = isinstance(parsed, ResumableHello)
        request = parsed.hello if isinstance(parsed, ResumableHello) else parsed
        admitted: Admitted | None = None
        shared_secret: bytes | None = None
        refusal = self._check_key(hello_key)
        if refusal is None and hello_key is not None:
            assert self.config.key is not None
            try:
                # Before anything is allocated: a low-order key costs the server nothing more.
                shared_secret = self.config.key.exchange(hello_key.client_public)
            except BadKey:
                refusal = ERROR_BAD_KEY
        if refusal is not None:
            self.key_refusals += 1
            await self._refuse(refusal, client_session, fields)
            return
        if self.admit is not None:
            verdict = await self._ask_admit((source_ip, message.source_port), request)
            if isinstance(verdict, str):
                await self._refuse(verdict, client_session, fields)
                return
            admitted = verdict
        decision = admission.decide(key, trio.current_time())
        if decision.reason is not None:
            await self._refuse(decision.reason, client_session, fields)
            return
        for victim in decision.evict:
            # A duologue nobody joined, most likely a spoofer's: freeing it lets the real
            # client in at once instead of after the expiry (the guide §4.3's lock-out attack).
            evicted = self.duologues.get(victim.slot_id)
            if evicted is not None:
                await self._delete(evicted, "evicted")
        duologue = await self._allocate(request, message, key)
        if duologue is None:
            await self._refuse(ERROR_SERVER_FULL, client_session, fields)
            return
        if admitted is not None:
            duologue.admission = admitted.claims
        reply = Connect(
            client_session=client_session,
            data_port=duologue.data_port,
            control_port=duologue.control_port,
            encrypted_session=encrypt_session(duologue.session_id, request.key),
        )
        key_tail: ConnectKey | None = None
        if shared_secret is not None:
            assert hello_key is not None
            key_tail = self._agree(duologue, request, reply, hello_key, shared_secret)
        if resumable and self.config.resume:
            # Only to a client that said "+R": the Echo 2.0 CONNECT is untouched for others.
            assert isinstance(parsed, ResumableHello)
            secret = secrets.randbits(RESUME_BITS)
            padded = secret ^ parsed.pad
            if duologue.keys is not None:
                # Encrypted: the secret comes from the session's keys, and the CONNECT's field
                # is noise (an on-path reader of the HELLO's pad must not learn the secret).
                secret = resume_secret(duologue.keys)
            duologue.slot.resume_secret = secret
            text = format_resumable_connect(ResumableConnect(reply, padded))
        else:
            text = format_message(reply)
        self.admissions["accepted"] += 1
        if key_tail is not None:
            text = append_connect_key(text, key_tail)
        await self._reply(text, client_session)

    def _check_key(self, hello_key: HelloKey | None) -> str | None:
        """Does the --encryption mode serve a HELLO with (or without) a key? The refusal."""
        mode = self.config.encryption_mode
        if hello_key is None:
            return ERROR_ENCRYPTION_REQUIRED if mode is Encryption.REQUIRED else None
        return ERROR_ENCRYPTION_OFF if mode is Encryption.OFF else None

    def _agree(
        self,
        duologue: Duologue,
        request: Hello,
        reply: Connect,
        hello_key: HelloKey,
        shared_secret: bytes,
    ) -> ConnectKey:
        """Derive the session's keys (into `duologue.keys`); the CONNECT's key tail."""
        key = self.config.key
        assert key is not None
        nonce = fresh_server_nonce()
        transcript = Transcript(
            client_public=hello_key.client_public,
            server_public=key.public,
            server_nonce=nonce,
            hello_key=request.key,
            client_session=reply.client_session,
            session_id=duologue.session_id,
            data_port=reply.data_port,
            control_port=reply.control_port,
        )
        duologue.keys, tag = server_keys_from_shared(shared_secret, transcript)
        self.encrypted_sessions += 1
        return ConnectKey(key.public, nonce, tag)

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
                    _url_host(self.config.address),
                    duologue.control_port,
                    image,
                    duologue.session_id,
                ),
                self.config.stream_id,
            )
        except UriError as error:
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
        host = _url_host(self.config.address)
        duologue.rejoined = trio.Event()
        try:
            if not self.config.shared:
                duologue.publication = await self.transport.add_publication(
                    f"aeron:udp?control={host}:{slot.control_port}|control-mode=dynamic"
                    f"|session-id={slot.session_id}",
                    self.config.stream_id,
                )
            # Shared ports: the response publication answers the client's new request image,
            # so it is opened once that arrived (`_answer_resumed`); sends wait until then.
            duologue.subscription = await self.transport.add_subscription(
                f"aeron:udp?endpoint={host}:{slot.data_port}|session-id={slot.session_id}",
                self.config.stream_id,
                on_image_available=functools.partial(self._on_image, duologue),
                on_image_unavailable=functools.partial(self._on_image_gone, duologue),
            )
        except OSError as error:
            log.warning("resume_failed", duologue_id=slot.slot_id, error=str(error))
            session._mark_closed("resume failed")
            duologue.cancel_scope.cancel()
            return None
        if not self.config.shared:
            assert duologue.publication is not None
            session.publication = duologue.publication
        session.subscription = duologue.subscription
        if session._owner_ip != slot.owner_ip:
            session._prior_owner_ip = session._owner_ip
            session._owner_ip = slot.owner_ip
        session.counters.resumes += 1
        return received

    async def _ask_admit(self, peer: tuple[str, int], request: Hello) -> str | Admitted | None:
        """The admission hook's verdict: None or Admitted to admit, else a one-line reason;
        a failing hook refuses."""
        assert self.admit is not None
        try:
            verdict = self.admit(peer, request.credentials)
            if inspect.isawaitable(verdict):
                verdict = await verdict
        except Exception:
            log.exception("admission_hook_failed", source_ip=peer[0])
            return "admission failed"
        if verdict is None or isinstance(verdict, Admitted):
            return verdict
        text = " ".join(str(verdict).split())[:200]
        return text or "refused"

    async def _allocate(self, hello: Hello, message: Message, key: str) -> Duologue | None:
        """Reserve ports and a session, open the streams, then commit (table, per-IP slot).

        All or nothing. A port that another program holds (an ephemeral port of some client on
        this host, say) fails to bind: that reservation goes back and another pair is tried.
        """
        assert self.transport is not None and self._nursery is not None
        config = self.config
        host = _url_host(config.address)
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
                if not config.shared:
                    # Shared: the response publication answers the client's image (it names
                    # the image), so it is opened once the client joined (_run_duologue).
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

    # ---------------------------------------------------------------- duologues

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
        host = _url_host(self.config.address)
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
