"""Response channels (Aeron 1.44+, general availability in 1.48): many clients' request
streams on one server port, each answered by a response stream that goes only to its client.

The exchange, as Aeron's driver runs it (DriverConductor, PublicationImage, SendChannelEndpoint,
NetworkPublication of aeron-io/aeron):

1. The client subscribes `aeron:udp?control-mode=response|control=<server>:<control port>`.
   The subscription waits: it joins the receiver only once step 4 names its session.
2. The client publishes `aeron:udp?endpoint=<server>:<port>|response-correlation-id=<the
   subscription's registration id>`. Its SETUPs carry SETUP_SEND_RESPONSE_FLAG (0x80).
3. The server's image of that stream (one of many on the server's port, told apart by session
   id) is answered by a publication `aeron:udp?control-mode=response|control=<server>:<control
   port>|response-correlation-id=<the image's correlation id>`. From then on the image sends
   RSP_SETUP (its session and stream, and the response publication's session) to the request
   publication's address on every status-message interval, until the response publication
   hears from its receiver.
4. The request publication hands RSP_SETUP's response session id to its response
   subscription, which sends setup-eliciting SMs naming that session to the server's control
   port: through the client's NAT, from the socket the responses must reach.
5. The response publication sends its SETUP, data and heartbeats to the source of those SMs,
   and to nothing else: every response publication on the control port has its own receiver.

Aeron sends a response publication to whatever address last elicited a SETUP for its session
(NetworkPublication.triggerSendSetupFrame) and had, while several streams shared one control
port, every stream's data go to every subscription (aeron-io/aeron#2061). Here each response
publication has exactly one destination, learnt from SMs naming its own session and stream,
from the host its request came from (the image's source address: a NAT keeps the host and
changes the port); a live destination is not moved by an SM from another port, and NAKs, RTTMs
and ERRs count only from the destination. Nothing here reads a clock or touches a socket.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from echo.transport.destinations import Address
from echo.transport.frames import (
    SETUP_SEND_RESPONSE_FLAG,
    ErrorFrame,
    FrameError,
    Nak,
    ResponseSetup,
    Rttm,
    StatusMessage,
    parse_datagram_untrusted,
)
from echo.transport.image import PublicationImage
from echo.transport.publication import NetworkPublication
from echo.transport.scanner import Emit
from echo.transport.sender import Send, SendEndpoint, SendMode

__all__ = [
    "RequestPublication",
    "ResponsePublication",
    "ResponseSendEndpoint",
    "response_setup_from",
]

#: where SETUP's flags byte sits (frame_length i32, version u8, flags u8)
_FLAGS_OFFSET = 5


class RequestPublication(NetworkPublication):
    """A publication whose receiver is asked to answer on a response channel.

    `response_correlation_id` is the registration id of the client's response subscription;
    `on_response_setup(correlation_id, response_session_id)` is how an RSP_SETUP reaches it
    (the driver's wiring; DriverConductor.responseSetup)."""

    def __init__(
        self,
        *,
        response_correlation_id: int,
        on_response_setup: Callable[[int, int], None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.response_correlation_id = response_correlation_id
        self.on_response_setup = on_response_setup

    def setup_frame(self) -> bytes:
        # NetworkPublication.isSendResponseSetupFlag: !isResponse && responseCorrelationId set.
        frame = bytearray(super().setup_frame())
        frame[_FLAGS_OFFSET] |= SETUP_SEND_RESPONSE_FLAG
        return bytes(frame)


class ResponsePublication(NetworkPublication):
    """A server's answer to one request image: one receiver, at the host the request came from.

    `image` is the request image it answers: it sends RSP_SETUP while this publication has no
    receiver, and stops once it has (DriverConductor.responseConnected)."""

    def __init__(
        self, *, image: PublicationImage | None, expected_host: str, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.image = image
        self.expected_host = expected_host
        #: the receiver's address once a setup-eliciting SM from it arrived
        self.destination: Address | None = None
        self.last_heard = -1.0

    def answer(self, now: float) -> None:
        """Start the RSP_SETUPs (DriverConductor responseSessionId, requestNextSmDeadlineReset)."""
        image = self.image
        if image is not None:
            image.response_session_id = self.session_id
            image.next_response_setup = now

    def connected(self) -> None:
        image = self.image
        if image is not None:
            image.response_session_id = None
            image.next_response_setup = float("inf")
            self.image = None


def response_setup_from(
    publications: dict[tuple[int, int], NetworkPublication],
    frame: ResponseSetup,
    source: Address,
    remote: Address | None,
) -> RequestPublication | None:
    """The request publication an RSP_SETUP (untrusted) is for, or None to drop it.

    It must name a request publication of this endpoint and come from the address that
    publication sends to: an RSP_SETUP is the server image's answer to our SETUP."""
    publication = publications.get((frame.session_id, frame.stream_id))
    if not isinstance(publication, RequestPublication):
        return None
    if remote is not None and source[:2] != remote[:2]:
        return None
    return publication


class ResponseSendEndpoint(SendEndpoint):
    """The server's control port of a response channel: many response publications, each
    sending to its own receiver only (the module's docstring says how it learns where)."""

    def __init__(self, *, counters: Any, destination_timeout: float, **kwargs: Any) -> None:
        super().__init__(mode=SendMode.MANUAL, counters=counters, **kwargs)
        # MANUAL only so the base class keeps no single remote and no dynamic table: every
        # datagram goes through a publication's own emitter below.
        self.manual = None
        self.destination_timeout = destination_timeout
        self._emits: dict[tuple[int, int], tuple[Send, Emit]] = {}

    @property
    def destinations(self) -> list[Address]:
        found = []
        for publication in self.publications.values():
            if isinstance(publication, ResponsePublication) and publication.destination:
                found.append(publication.destination)
        return found

    def emit_for(self, publication: NetworkPublication, send: Send) -> Emit:
        key = (publication.session_id, publication.stream_id)
        cached = self._emits.get(key)
        if cached is not None and cached[0] is send:
            return cached[1]

        def emit(datagram: bytes | memoryview, segment: int = 0) -> int:
            address = getattr(publication, "destination", None)
            if address is None:
                return 0  # no receiver yet: nothing went on the wire
            if segment:
                return send(datagram, address, segment)
            return send(datagram, address)

        self._emits[key] = (send, emit)
        return emit

    def remove(self, publication: NetworkPublication) -> None:
        super().remove(publication)
        self._emits.pop((publication.session_id, publication.stream_id), None)

    def forget_send(self) -> None:
        super().forget_send()
        self._emits.clear()

    def flush(self, publication: NetworkPublication, now: float, send: Send) -> None:
        publication.send_pending(now, self.emit_for(publication, send))

    def announce_end(self, publication: NetworkPublication, send: Send) -> None:
        publication.announce_end(self.emit_for(publication, send))

    def poll(self, now: float, send: Send) -> None:
        for publication in list(self.publications.values()):
            publication.poll(now, self.emit_for(publication, send))

    def next_deadline(self, now: float) -> float:
        deadline = float("inf")
        for publication in self.publications.values():
            deadline = min(deadline, publication.next_deadline(now))
        return deadline

    def on_datagram(self, data: bytes | memoryview, source: Address, now: float) -> None:
        """Handle one datagram from the network (untrusted)."""
        counters = self.counters
        try:
            frame = parse_datagram_untrusted(data)
        except FrameError as error:
            counters.invalid(error.reason)
            return
        if not isinstance(frame, StatusMessage | Nak | Rttm | ErrorFrame):
            counters.invalid("unexpected_on_send_channel")
            return
        if isinstance(frame, StatusMessage):
            counters.status_messages_received += 1
        elif isinstance(frame, Nak):
            counters.naks_received += 1
        publication = self.publications.get((frame.session_id, frame.stream_id))
        if not isinstance(publication, ResponsePublication):
            # Session 0 / stream 0 registrations included: a response channel has no MDC.
            counters.unknown_session_drops += 1
            return
        if isinstance(frame, StatusMessage):
            if not self._accept_sm(publication, frame, source, now):
                counters.unvalidated_drops += 1
                return
            publication.on_status_message(frame, now)
            if publication.image is not None and publication.is_connected(now):
                publication.connected()
            return
        if source != publication.destination:
            counters.unvalidated_drops += 1
            return
        if isinstance(frame, Nak):
            publication.on_nak(frame, now)
        elif isinstance(frame, Rttm):
            publication.on_rttm(frame, now)
        else:
            publication.on_error_frame(frame, now)

    def _accept_sm(
        self, publication: ResponsePublication, sm: StatusMessage, source: Address, now: float
    ) -> bool:
        """May this SM steer `publication`? Only from the host its request came from; a
        setup-eliciting one sets the destination unless another, still live, holds it."""
        if str(source[0]) != publication.expected_host:
            return False
        current = publication.destination
        if current != source:
            live = current is not None and now - publication.last_heard < self.destination_timeout
            if not sm.is_setup_eliciting or live:
                return False
            publication.destination = source
            self.counters.destinations_added += 1
        publication.last_heard = now
        return True
