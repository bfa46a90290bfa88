"""The send side of a socket (Aeron's send channel endpoint): the publications sharing it,
where their datagrams go (unicast, or MDC destinations: dynamic with address validation, or
manual), and the frames that come back (SMs, NAKs, RTTMs, ERRs). Pure: `now` is passed in,
output goes through an injected `send`.
"""

from __future__ import annotations

import enum
import functools
import math
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from echo.transport.core.config import DEFAULTS, SenderTimers
from echo.transport.core.counters import Counters
from echo.transport.core.destinations import Address, DynamicDestinations, ManualDestinations
from echo.transport.core.frames import (
    SM_LENGTH,
    ErrorFrame,
    FrameError,
    Nak,
    ResponseSetup,
    Rttm,
    StatusMessage,
    parse_datagram_untrusted,
)
from echo.transport.core.outbox import NOTHING, Datagram, Outbox
from echo.transport.core.publication import (
    ADMIN_ACTION,
    BACK_PRESSURED,
    CLOSED,
    MAX_POSITION_EXCEEDED,
    NOT_CONNECTED,
    OFFER_RESULT_NAMES,
    WOULD_BLOCK,
    NetworkPublication,
    PublicationState,
)
from echo.transport.core.scanner import Emit
from echo.transport.core.validation import SM_COOKIE_FLAG, CookieJar, RateLimiter

_T = TypeVar("_T")

try:
    from mypy_extensions import mypyc_attr
except ImportError:  # mypy's own package (a dev dependency): not needed to run interpreted

    def mypyc_attr(*attrs: str, **kwattrs: object) -> Callable[[_T], _T]:
        return lambda cls: cls

__all__ = [
    "ADMIN_ACTION",
    "BACK_PRESSURED",
    "CLOSED",
    "MAX_POSITION_EXCEEDED",
    "NOT_CONNECTED",
    "OFFER_RESULT_NAMES",
    "WOULD_BLOCK",
    "Emit",
    "NetworkPublication",
    "PublicationState",
    "Send",
    "SendEndpoint",
    "SendMode",
    "SenderTimers",
    "response_setup_from",
]


class SendMode(enum.Enum):
    UNICAST = "unicast"
    DYNAMIC = "dynamic"
    MANUAL = "manual"


class Send(Protocol):
    """Sends one datagram (or a run of `segment`-byte datagrams, see Emit) to `address`;
    returns how many datagrams left, or WOULD_BLOCK."""

    def __call__(
        self, datagram: bytes | memoryview, address: Address, segment: int = 0
    ) -> int: ...



# (Compiled, the class allows subclasses in interpreted code: response.py's
# ResponseSendEndpoint.)
@mypyc_attr(allow_interpreted_subclasses=True)
class SendEndpoint:
    """The publications sharing one socket and where their datagrams go (SendChannelEndpoint).

    Unicast: one remote address. MDC dynamic: destinations learnt from SMs on this (control)
    socket. MDC manual: destinations the application adds.
    """

    def __init__(
        self,
        *,
        mode: SendMode,
        counters: Counters,
        remote: Address | None = None,
        destination_timeout: float = DEFAULTS.destination_timeout,
        max_destinations: int = DEFAULTS.max_destinations,
        cookies: CookieJar | None = None,
        limiter: RateLimiter | None = None,
        run_segments: int = 0,
    ) -> None:
        self.mode = mode
        #: what each publication's `run_segments` is (see NetworkPublication._send_range)
        self.run_segments = run_segments
        #: set: dynamic destinations must echo a cookie before they are added (validation.py)
        self.cookies = cookies
        self.limiter = limiter or RateLimiter()
        # Replies to one address (cookie challenges, SETUPs for a new MDC destination), sent on
        # the next poll: (datagram, address, the counter it counts in).
        self._replies: list[tuple[bytes, Address, str]] = []
        self.counters = counters
        self.remote = remote
        self.publications: dict[tuple[int, int], NetworkPublication] = {}
        self.dynamic = (
            DynamicDestinations(timeout=destination_timeout, max_destinations=max_destinations)
            if mode is SendMode.DYNAMIC
            else None
        )
        self.manual = ManualDestinations() if mode is SendMode.MANUAL else None
        self._emit_send: Send | None = None
        self._emit: Emit = self._no_emit
        #: what handle_timer decided to send, until datagrams_to_send takes it
        self._outbox = Outbox()
        self._queue: Send = self._outbox.send
        #: something read since the last poll may need one (a timer, a reply, a channel to
        #: wake); an idle stream's repeated status message does not (docs/transport.md, "The
        #: idle cadence"), so the driver skips the service after it
        self.news = False
        #: a NAK read since the last poll made a resend due: `repair` sends it before the
        #: driver reads on (the publications it is due on are in `_repairs`)
        self.repair_due = False
        self._repairs: list[NetworkPublication] = []

    @staticmethod
    def _no_emit(datagram: bytes | memoryview, segment: int = 0) -> int:
        return 0

    def emitter(self, send: Send) -> Emit:
        """`emit(datagram)` that sends to every destination through `send` (made once)."""
        if send is not self._emit_send:
            remote = self.remote
            if self.mode is SendMode.UNICAST and remote is not None:

                def emit(datagram: bytes | memoryview, segment: int = 0) -> int:
                    if segment:
                        return send(datagram, remote, segment)
                    return send(datagram, remote)

                self._emit = emit
            else:
                self._emit = functools.partial(self.emit_to_all, send=send)
            self._emit_send = send
        return self._emit

    def forget_send(self) -> None:
        """Drop the cached emitter (the socket is closed; it only kept the endpoint alive)."""
        self._emit_send = None
        self._emit = self._no_emit

    def flush(self, publication: NetworkPublication, now: float, send: Send) -> None:
        """Send what `publication` has just been offered (see `NetworkPublication.send_pending`)."""
        # (The cached emitter without the call to `emitter`: this runs for every offer sent
        # at once.)
        emit = self._emit if send is self._emit_send else self.emitter(send)
        publication.send_pending(now, emit)

    @property
    def destinations(self) -> list[Address]:
        if self.dynamic is not None:
            return self.dynamic.addresses
        if self.manual is not None:
            return self.manual.addresses
        return [self.remote] if self.remote is not None else []

    def add(self, publication: NetworkPublication) -> None:
        key = (publication.session_id, publication.stream_id)
        if key in self.publications:
            raise ValueError(
                f"a publication with session-id {publication.session_id} on stream "
                f"{publication.stream_id} already exists on this channel"
            )
        self.publications[key] = publication
        publication.run_segments = self.run_segments

    def remove(self, publication: NetworkPublication) -> None:
        self.publications.pop((publication.session_id, publication.stream_id), None)

    def on_datagram(self, data: bytes | memoryview, source: Address, now: float) -> None:
        """Handle one datagram from the network (untrusted)."""
        counters = self.counters
        news = self.news
        self.news = True
        try:
            frame = parse_datagram_untrusted(data)
        except FrameError as error:
            counters.invalid(error.reason)
            return
        if isinstance(frame, StatusMessage):
            counters.status_messages_received += 1
            if frame.is_setup_eliciting:
                counters.setup_elicitations_received += 1
            if self.dynamic is not None and not self._on_destination_sm(frame, source, data, now):
                return
            if frame.session_id == 0 and frame.stream_id == 0:
                if frame.is_setup_eliciting:
                    for each in self.publications.values():
                        each.trigger_setup()
                return
            publication = self.publications.get((frame.session_id, frame.stream_id))
            if publication is None:
                counters.unknown_session_drops += 1
                return
            if not publication.on_status_message(frame, now):
                self.news = news  # the same status again: nothing for a poll to do
        elif isinstance(frame, Nak):
            counters.naks_received += 1
            if not self._validated(source):
                return
            publication = self.publications.get((frame.session_id, frame.stream_id))
            if publication is None:
                counters.unknown_session_drops += 1
                return
            if publication.on_nak(frame, now):
                self._repairs.append(publication)
                self.repair_due = True
        elif isinstance(frame, Rttm):
            if not self._validated(source):
                return
            publication = self.publications.get((frame.session_id, frame.stream_id))
            if publication is not None:
                publication.on_rttm(frame, now)
        elif isinstance(frame, ErrorFrame):
            publication = self.publications.get((frame.session_id, frame.stream_id))
            if publication is not None:
                publication.on_error_frame(frame, now)
        elif isinstance(frame, ResponseSetup):
            counters.response_setups_received += 1
            request = response_setup_from(self.publications, frame, source, self.remote)
            answer = getattr(request, "on_response_setup", None)
            if request is None or answer is None:
                counters.unknown_session_drops += 1
                return
            answer(getattr(request, "response_correlation_id", 0), frame.response_session_id)
        else:
            # DATA, SETUP and the rest flow towards subscriptions, never into a publication.
            counters.invalid("unexpected_on_send_channel")

    def _on_destination_sm(
        self, frame: StatusMessage, source: Address, data: bytes | memoryview, now: float
    ) -> bool:
        """Dynamic MDC: an SM (un)registers its source as a destination, and a setup-eliciting
        one is answered with a SETUP to that address alone. False: nothing more to do."""
        dynamic = self.dynamic
        assert dynamic is not None
        counters = self.counters
        if self.cookies is not None and not dynamic.contains(frame.receiver_id, source):
            if not self._admit(frame, source, len(data), now):
                return False
        outcome = dynamic.on_status_message(frame.receiver_id, source, now)
        if outcome == "added":
            counters.destinations_added += 1
        elif outcome == "refused":
            counters.destinations_refused += 1
            return False
        if frame.is_end_of_stream:
            if dynamic.remove_receiver(frame.receiver_id, source):
                counters.destinations_removed += 1
        if not frame.is_setup_eliciting:
            return True
        # A destination asks for a SETUP (it has just registered, or has no image yet): answer
        # that address at once, and it alone. Aeron marks every publication for a SETUP to
        # every destination at the next 100 ms tick: a new receiver waited for it, and with a
        # thousand destinations each newcomer cost a thousand SETUPs.
        if frame.session_id == 0 and frame.stream_id == 0:
            wanted = list(self.publications.values())
        else:
            found = self.publications.get((frame.session_id, frame.stream_id))
            wanted = [found] if found is not None else []
        # A validated destination has shown it receives at `source`: no limit. Without
        # validation the source may be forged: at most the per-host rate of replies to
        # strangers.
        if self.cookies is not None or self.limiter.allow(str(source[0]), now):
            for each in wanted:
                if not each.is_done:
                    self._replies.append((each.setup_frame(), source, "setups_sent"))
        else:
            counters.rate_limited += 1
        return False

    def _validated(self, source: Address) -> bool:
        """May a NAK or RTTM from `source` make this endpoint send?

        A retransmit or an RTTM reply goes to every destination: with validation on, only a
        destination's own address may ask for one, so a forged NAK (28 bytes) cannot make the
        publication resend a window's worth of data to all its receivers.
        """
        if self.cookies is None or self.dynamic is None or self.dynamic.has_address(source):
            return True
        self.counters.unvalidated_drops += 1
        return False

    def _admit(self, sm: StatusMessage, source: Address, size: int, now: float) -> bool:
        """A stranger's SM: admit it only with a valid cookie, else answer with a challenge.

        Nothing else from an unvalidated address is acted on, so a forged source gets at most
        one challenge per SM, never larger than the SM (amplification factor <= 1).
        """
        assert self.cookies is not None
        cookie = (sm.consumption_term_id, sm.consumption_term_offset)
        registration = sm.session_id == 0 and sm.stream_id == 0 and sm.is_setup_eliciting
        if registration and self.cookies.check(source, sm.receiver_id, cookie, now):
            return True
        self.counters.unvalidated_drops += 1
        if registration and size >= SM_LENGTH and self.limiter.allow(str(source[0]), now):
            first, second = self.cookies.make(source, sm.receiver_id, now)
            challenge = StatusMessage(
                session_id=0,
                stream_id=0,
                consumption_term_id=first,
                consumption_term_offset=second,
                receiver_window=0,
                receiver_id=sm.receiver_id,
                flags=SM_COOKIE_FLAG,
            ).encode()
            self._replies.append((challenge, source, "cookie_challenges_sent"))
        elif registration:
            self.counters.rate_limited += 1
        return False

    def handle_timer(self, now: float) -> None:
        """Act on what is due at `now` (heartbeats, setups, retransmits, data offered and not
        yet sent, replies); what that sends waits for `datagrams_to_send`."""
        self.poll(now, self._queue)

    def datagrams_to_send(self, now: float) -> Sequence[Datagram]:
        """Everything to send as of `now`, oldest first, each datagram copied out of the term
        buffer: what `handle_timer` queued, and what is due at `now`. (The trio driver sends
        through `poll(now, send)` instead: runs straight from the term buffer, GSO, and the
        socket's back-pressure, which leaves unsent data in the term for later.)"""
        outbox = self._outbox
        self.poll(now, self._queue)
        if not outbox.queued:
            return NOTHING
        return outbox.take()
    def quiet(self) -> bool:
        """Did the datagrams since the last poll leave nothing to do before the next timer?"""
        return not self.news

    def repair(self, now: float, send: Send) -> None:
        """Send the resends that NAKs read since the last poll made due, and nothing else.

        A NAK is acted on when it is read, not after whatever is queued behind it: a current
        Aeron receiver NAKs an open gap again on every scan of its loss detector, and a busy
        socket held a few hundred of those, each a duplicate of a resend not yet sent, which
        the driver read before the poll that sent it (docs/transport.md, "A NAK is acted on
        when it is read"). The rest of a poll (new data, heartbeats, channels to wake) waits
        for the one the driver makes after its reads."""
        self.repair_due = False
        repairs = self._repairs
        if not repairs:
            return
        self._repairs = []
        for publication in repairs:
            publication.repair(now, self.emit_for(publication, send))

    def emit_for(self, publication: NetworkPublication, send: Send) -> Emit:
        """How `publication`'s datagrams leave through `send`: to every destination of this
        endpoint (a response port sends each publication's to its own receiver)."""
        return self.emitter(send)

    def poll(self, now: float, send: Send) -> None:
        self.news = False
        if self.repair_due:
            self.repair_due = False
            self._repairs = []  # (each publication's poll below sends them)
        if self._replies:
            counters = self.counters
            for datagram, address, counter in self._replies:
                sent = send(datagram, address)
                if sent > 0:
                    setattr(counters, counter, getattr(counters, counter) + sent)
            self._replies.clear()
        if self.dynamic is not None:
            removed = self.dynamic.expire(now)
            if removed:
                self.counters.destinations_removed += removed
        emit = self.emitter(send)
        for publication in list(self.publications.values()):
            publication.poll(now, emit)

    def announce_end(self, publication: NetworkPublication, send: Send) -> None:
        """Transport shutdown: `publication`'s end-of-stream heartbeat to every destination."""
        publication.announce_end(functools.partial(self.emit_to_all, send=send))

    def emit_to_all(self, datagram: bytes | memoryview, segment: int = 0, *, send: Send) -> int:
        """Send one datagram (or run) to every destination: the datagrams that left, or
        WOULD_BLOCK if any send would block (the caller retries; the others get a duplicate).
        No destination yet: 0, nothing went on the wire."""
        total = 0
        blocked = False
        for address in self.destinations:
            sent = send(datagram, address, segment) if segment else send(datagram, address)
            if sent < 0:
                blocked = True
            else:
                total += sent
        if blocked:
            # What did leave is counted by the socket (datagrams_sent); the frame's own
            # counter waits for the retry that reaches everyone.
            return WOULD_BLOCK
        return total

    def set_run_segments(self, run_segments: int) -> None:
        """Runs of datagrams on (the socket can send them) or off (it cannot, after all)."""
        self.run_segments = run_segments
        for publication in self.publications.values():
            publication.run_segments = run_segments

    def next_deadline(self, now: float) -> float:
        if self._replies:
            return now
        deadline = math.inf
        for publication in self.publications.values():
            deadline = min(deadline, publication.next_deadline(now))
        if self.dynamic is not None:
            expiry = self.dynamic.next_expiry()
            if expiry is not None:
                # An entry expires strictly after its timeout (DynamicDestinations.expire).
                deadline = min(deadline, math.nextafter(expiry, math.inf))
        return deadline


def response_setup_from(
    publications: dict[tuple[int, int], NetworkPublication],
    frame: ResponseSetup,
    source: Address,
    remote: Address | None,
) -> NetworkPublication | None:
    """The request publication an RSP_SETUP (untrusted) is for, or None to drop it.

    It must name a request publication of this endpoint (response.RequestPublication: one
    with a `response_correlation_id`) and come from the address that publication sends to: an
    RSP_SETUP is the server image's answer to our SETUP. (Here, not in response.py, which
    builds on this module: the two would import each other.)"""
    publication = publications.get((frame.session_id, frame.stream_id))
    if publication is None or not hasattr(publication, "response_correlation_id"):
        return None
    if remote is not None and source[:2] != remote[:2]:
        return None
    return publication
