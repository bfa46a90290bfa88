"""What a session server is given and what it holds: the application, the admission hook and
the event sink; the outcomes it counts; one client's duologue; and the server's state, which the
layers of `echo.session.server` build on (duologues, resumes, HELLOs, the life cycle).

The decisions are the pure `echo.session.admission.Admission`; these layers execute them, all
in one trio thread (the io7m Aeron guide §3.3.5).
"""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeAlias

import attrs
import structlog
import trio

from echo.protocol import ERROR_SHUTTING_DOWN, RESERVED_SESSION_HIGH, RESERVED_SESSION_LOW
from echo.session.admission import Admission, Slot
from echo.session.allocators import RandomSource
from echo.session.config import ServerConfig
from echo.session.crypto import SessionKeys
from echo.session.held import HeldPorts
from echo.session.session import DEFAULT_RECEIVE_BATCH, DEFAULT_SEND_TIMEOUT, Session
from echo.session.timers import echo_timers
from echo.transport import Image, Publication, SendError, Subscription, Transport, TransportConfig

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


def url_host(address: str) -> str:
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


class ServerState:
    """The session server's configuration, table of duologues and counters (see `SessionServer`
    for the arguments), and its answer on the all-clients channel."""

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
