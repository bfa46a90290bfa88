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

import functools
import heapq
import math
from collections.abc import Callable
from typing import Any

from echo.transport.core.destinations import Address
from echo.transport.core.frames import (
    SETUP_SEND_RESPONSE_FLAG,
    ErrorFrame,
    FrameError,
    Nak,
    Rttm,
    StatusMessage,
    parse_datagram_untrusted,
)
from echo.transport.core.image import PublicationImage
from echo.transport.core.publication import NetworkPublication
from echo.transport.core.scanner import Emit
from echo.transport.core.sender import Send, SendEndpoint, SendMode, response_setup_from

__all__ = [
    "RequestPublication",
    "ResponsePublication",
    "ResponseSendEndpoint",
    "response_setup_from",
]

#: where SETUP's flags byte sits (frame_length i32, version u8, flags u8)
_FLAGS_OFFSET = 5
#: the deadline heap is rebuilt when stale entries outnumber live ones by 2:1 plus this slack
_HEAP_SLACK = 64


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
        #: tells the endpoint this publication has something to do (ResponseSendEndpoint)
        self.touched: Callable[[], object] | None = None

    def offer(self, data: bytes | bytearray | memoryview, now: float) -> int:
        result = super().offer(data, now)
        if self.touched is not None:
            self.touched()
        return result

    def close(self, now: float) -> None:
        super().close(now)
        if self.touched is not None:
            self.touched()

    def found_receiver(self, address: Address) -> None:
        """A receiver asked for this stream from `address`: SETUP to it at once. (Before
        that the SETUPs went nowhere, yet set the SETUP interval's clock: NetworkPublication's
        `trigger_setup` resets it only once a receiver had answered.)"""
        self.destination = address
        self._setup_pending = True
        self._last_setup = -math.inf

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
        # What poll looks at: publications touched since, and a heap of (deadline, key) whose
        # entries count only while they match `_deadlines` (as the receive endpoint's images).
        self._touched: set[tuple[int, int]] = set()
        self._deadlines: dict[tuple[int, int], float] = {}
        self._heap: list[tuple[float, tuple[int, int]]] = []

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

    def add(self, publication: NetworkPublication) -> None:
        super().add(publication)
        key = (publication.session_id, publication.stream_id)
        if isinstance(publication, ResponsePublication):
            publication.touched = functools.partial(self._touch, key)
        self._touched.add(key)

    def _touch(self, key: tuple[int, int]) -> None:
        self._touched.add(key)

    def remove(self, publication: NetworkPublication) -> None:
        super().remove(publication)
        key = (publication.session_id, publication.stream_id)
        self._emits.pop(key, None)
        self._deadlines.pop(key, None)
        self._touched.discard(key)
        if isinstance(publication, ResponsePublication):
            publication.touched = None

    def forget_send(self) -> None:
        super().forget_send()
        self._emits.clear()

    def flush(self, publication: NetworkPublication, now: float, send: Send) -> None:
        publication.send_pending(now, self.emit_for(publication, send))
        self._schedule((publication.session_id, publication.stream_id), publication, now)

    def announce_end(self, publication: NetworkPublication, send: Send) -> None:
        publication.announce_end(self.emit_for(publication, send))

    def quiet(self) -> bool:
        return False  # (its own on_datagram: every datagram is serviced)

    def poll(self, now: float, send: Send) -> None:
        """Poll the publications that heard something, were offered to or closed, or whose
        deadline came: a control port with 1,000 response publications must not cost
        O(publications) per status message."""
        if self.repair_due:
            self.repair_due = False
            self._repairs = []  # (touched: their polls below send the resends)
        due = self._touched
        self._touched = set()
        heap = self._heap
        deadlines = self._deadlines
        while heap and heap[0][0] <= now:
            deadline, key = heapq.heappop(heap)
            if deadlines.get(key) == deadline:
                del deadlines[key]
                due.add(key)
        publications = self.publications
        for key in due:
            publication = publications.get(key)
            if publication is not None:
                publication.poll(now, self.emit_for(publication, send))
                self._schedule(key, publication, now)
        if len(heap) > 2 * len(deadlines) + _HEAP_SLACK:
            heap[:] = [(deadline, key) for key, deadline in deadlines.items()]
            heapq.heapify(heap)

    def _schedule(self, key: tuple[int, int], publication: NetworkPublication, now: float) -> None:
        deadline = publication.next_deadline(now)
        if deadline == math.inf:
            self._deadlines.pop(key, None)
        elif self._deadlines.get(key) != deadline:
            self._deadlines[key] = deadline
            heapq.heappush(self._heap, (deadline, key))

    def next_deadline(self, now: float) -> float:
        if self._touched:
            return now
        heap = self._heap
        deadlines = self._deadlines
        while heap and deadlines.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)  # stale
        return heap[0][0] if heap else math.inf

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
            if frame.is_setup_eliciting:
                counters.setup_elicitations_received += 1
                if frame.session_id == 0 and frame.stream_id == 0:
                    # What a current Aeron response subscription sends to the control port
                    # about once a second from the moment its channel opens, until it has an
                    # image: its receive endpoint has an explicit control address, and every
                    # such endpoint sends this (the receiver's periodic pending setup for
                    # session 0 / stream 0, Aeron's `aeron_driver_receiver_on_add_endpoint`).
                    # It names no stream, so it can steer no response publication; Aeron's
                    # sender, with no destination tracker on a response channel, drops it
                    # without counting it an error, and so does echo.
                    return
        elif isinstance(frame, Nak):
            counters.naks_received += 1
        key = (frame.session_id, frame.stream_id)
        publication = self.publications.get(key)
        if not isinstance(publication, ResponsePublication):
            counters.unknown_session_drops += 1
            return
        self._touched.add(key)
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
            if publication.on_nak(frame, now):
                self._repairs.append(publication)  # sent before the next read (repair)
                self.repair_due = True
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
            publication.found_receiver(source)
            self.counters.destinations_added += 1
        publication.last_heard = now
        return True
