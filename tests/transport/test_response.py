"""Response channels (Aeron 1.48): the pure parts with hand-moved datagrams, and the vectors
the frames must match, built field by field from Aeron's own layouts:

- SetupFlyweight (aeron-client io/aeron/protocol): 40 bytes; frame_length, version, flags, type
  0x05, term_offset, session_id, stream_id, initial_term_id, active_term_id, term_length, mtu,
  ttl; SEND_RESPONSE_SETUP_FLAG = 0x80 set when `!isResponse && responseCorrelationId != NULL`
  (NetworkPublication.isSendResponseSetupFlag).
- ResponseSetupFlyweight / aeron_response_setup_header_t: 20 bytes; frame_length 20, version
  0, flags 0 (aeron_receive_channel_endpoint_send_response_setup), type 0x0B, session_id at 8,
  stream_id at 12, response_session_id at 16, little-endian.
"""

from __future__ import annotations

import struct

from echo.transport.core.counters import Counters
from echo.transport.core.flow_control import UnicastFlowControl
from echo.transport.core.frames import (
    RTTM_REPLY_FLAG,
    SM_SETUP_FLAG,
    ErrorFrame,
    Nak,
    ResponseSetup,
    Rttm,
    StatusMessage,
)
from echo.transport.core.image import PublicationImage
from echo.transport.core.publication import NetworkPublication
from echo.transport.core.receiver import ReceiveEndpoint, StreamInterest
from echo.transport.core.response import (
    RequestPublication,
    ResponsePublication,
    ResponseSendEndpoint,
    response_setup_from,
)
from echo.transport.core.sender import SendEndpoint, SendMode

SERVER = ("198.18.0.1", 9001)
CLIENT_A = ("198.18.0.2", 40001)
CLIENT_B = ("198.18.0.3", 40002)
STREAM = 0x2044F002


class Wire:
    """A `send` that records (datagram, address) instead of sending."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, tuple[str, int]]] = []

    def __call__(
        self, datagram: bytes | memoryview, address: tuple[str, int], segment: int = 0
    ) -> int:
        self.sent.append((bytes(datagram), address))
        return 1

    def to(self, address: tuple[str, int]) -> list[bytes]:
        return [data for data, where in self.sent if where == address]


def _publication_kwargs(session_id: int, counters: Counters, now: float = 0.0) -> dict[str, object]:
    return {
        "session_id": session_id,
        "stream_id": STREAM,
        "initial_term_id": 100,
        "term_length": 65536,
        "mtu": 1408,
        "flow_control": UnicastFlowControl(),
        "counters": counters,
        "now": now,
    }


def _image(counters: Counters, session_id: int = 77) -> PublicationImage:
    return PublicationImage(
        session_id=session_id,
        stream_id=STREAM,
        initial_term_id=5,
        active_term_id=5,
        term_offset=0,
        term_length=65536,
        mtu=1408,
        control_address=CLIENT_A,
        receiver_id=9,
        counters=counters,
        now=0.0,
    )


def _eliciting(session_id: int) -> bytes:
    return StatusMessage(
        session_id=session_id,
        stream_id=STREAM,
        consumption_term_id=0,
        consumption_term_offset=0,
        receiver_window=0,
        receiver_id=1234,
        flags=SM_SETUP_FLAG,
    ).encode()


def _status(publication: ResponsePublication, receiver_id: int = 1234) -> bytes:
    return StatusMessage(
        session_id=publication.session_id,
        stream_id=STREAM,
        consumption_term_id=publication.initial_term_id,
        consumption_term_offset=0,
        receiver_window=65536,
        receiver_id=receiver_id,
    ).encode()


# ------------------------------------------------------------------------------ frame vectors


def test_a_request_publication_sets_the_send_response_flag_in_aerons_setup_layout() -> None:
    counters = Counters()
    request = RequestPublication(response_correlation_id=42, **_publication_kwargs(-7, counters))
    expected = struct.pack(
        "<iBBHiiiiiiii", 40, 0, 0x80, 0x05, 0, -7, STREAM, 100, 100, 65536, 1408, 0
    )
    assert request.setup_frame() == expected
    # Without response-correlation-id the same publication's SETUP is unchanged (flags 0).
    plain = ResponsePublication(image=None, expected_host="x", **_publication_kwargs(-7, counters))
    assert plain.setup_frame() == expected[:5] + b"\x00" + expected[6:]


def test_a_request_image_answers_rsp_setup_in_aerons_layout_until_the_response_connects() -> None:
    counters = Counters()
    image = _image(counters, session_id=-123456)
    wire = Wire()
    image.poll(0.0, wire)
    assert not any(len(data) == 20 for data in wire.to(CLIENT_A))  # nobody answers it yet

    response = ResponsePublication(
        image=image, expected_host=CLIENT_A[0], **_publication_kwargs(0x10203040, counters)
    )
    response.answer(1.0)
    image.poll(1.0, wire)
    rsp = [data for data in wire.to(CLIENT_A) if len(data) == 20]
    assert rsp == [
        struct.pack("<iBBHiii", 20, 0, 0, 0x0B, -123456, STREAM, 0x10203040),
    ]
    assert counters.response_setups_sent == 1
    # Repeated on the status-message interval (Aeron: on every SM timeout), not per poll.
    image.poll(1.01, wire)
    assert len([d for d in wire.to(CLIENT_A) if len(d) == 20]) == 1
    assert image.next_deadline(1.01) <= 1.0 + image.timers.status_message_interval
    image.poll(1.0 + image.timers.status_message_interval, wire)
    assert len([d for d in wire.to(CLIENT_A) if len(d) == 20]) == 2
    # Connected (DriverConductor.responseConnected): no more RSP_SETUP.
    response.connected()
    image.poll(5.0, wire)
    assert len([d for d in wire.to(CLIENT_A) if len(d) == 20]) == 2


# ------------------------------------------------------------------------------ server side


def _server(now: float = 0.0) -> tuple[ResponseSendEndpoint, Counters]:
    counters = Counters()
    return ResponseSendEndpoint(counters=counters, destination_timeout=5.0), counters


def _response(endpoint: ResponseSendEndpoint, session_id: int, host: str) -> ResponsePublication:
    publication = ResponsePublication(
        image=None, expected_host=host, **_publication_kwargs(session_id, endpoint.counters)
    )
    endpoint.add(publication)
    return publication


def test_each_response_publication_sends_only_to_its_own_receiver() -> None:
    # aeron-io/aeron#2061: streams sharing one control port sent everything to everyone.
    endpoint, _ = _server()
    a = _response(endpoint, 1, CLIENT_A[0])
    b = _response(endpoint, 2, CLIENT_B[0])
    wire = Wire()
    endpoint.poll(0.0, wire)
    assert wire.sent == []  # no receiver yet: nothing goes anywhere

    endpoint.on_datagram(_eliciting(1), CLIENT_A, 0.1)
    endpoint.on_datagram(_eliciting(2), CLIENT_B, 0.1)
    endpoint.on_datagram(_status(a), CLIENT_A, 0.1)
    endpoint.on_datagram(_status(b), CLIENT_B, 0.1)
    assert a.offer(b"for a", 0.2) > 0 and b.offer(b"for b", 0.2) > 0
    endpoint.poll(0.2, wire)
    for address, session in ((CLIENT_A, 1), (CLIENT_B, 2)):
        datagrams = wire.to(address)
        assert datagrams
        assert {struct.unpack_from("<i", d, 12)[0] for d in datagrams} == {session}
    assert all(b"for b" not in d for d in wire.to(CLIENT_A))
    assert all(b"for a" not in d for d in wire.to(CLIENT_B))
    assert sorted(endpoint.destinations) == sorted([CLIENT_A, CLIENT_B])


def test_only_the_request_host_may_claim_a_response_and_a_live_receiver_keeps_it() -> None:
    endpoint, counters = _server()
    a = _response(endpoint, 1, CLIENT_A[0])
    endpoint.on_datagram(_eliciting(1), CLIENT_B, 0.0)  # a stranger names A's session
    assert a.destination is None and counters.unvalidated_drops == 1

    endpoint.on_datagram(_eliciting(1), CLIENT_A, 0.0)
    assert a.destination == CLIENT_A
    endpoint.on_datagram(_status(a), CLIENT_A, 1.0)
    # Same host, another port (another socket behind the same NAT): not while A is live.
    elsewhere = (CLIENT_A[0], 50000)
    endpoint.on_datagram(_eliciting(1), elsewhere, 2.0)
    assert a.destination == CLIENT_A
    # NAKs from anyone but the receiver are ignored.
    nak = Nak(session_id=1, stream_id=STREAM, term_id=100, term_offset=0, length=1408).encode()
    before = counters.unvalidated_drops
    endpoint.on_datagram(nak, elsewhere, 2.0)
    assert counters.unvalidated_drops == before + 1
    # Silent past the destination timeout (the client's NAT mapping changed): it may move.
    endpoint.on_datagram(_eliciting(1), elsewhere, 1.0 + 5.0 + 0.1)
    assert a.destination == elsewhere


def test_aerons_periodic_session_0_status_message_steers_nothing_and_is_no_error() -> None:
    """A current Aeron response subscription sends a setup-eliciting SM for session 0 / stream
    0 to the control port about once a second before its RSP_SETUP: a response channel has no
    MDC, so it moves no publication, but it is what Aeron sends, not an unknown session."""
    endpoint, counters = _server()
    a = _response(endpoint, 1, CLIENT_A[0])
    registration = StatusMessage(
        session_id=0,
        stream_id=0,
        consumption_term_id=0,
        consumption_term_offset=0,
        receiver_window=0,
        receiver_id=5,
        flags=SM_SETUP_FLAG,
    ).encode()
    for second in range(3):  # Aeron sends it about once a second until it has an image
        endpoint.on_datagram(registration, CLIENT_A, float(second))
    assert a.destination is None
    assert counters.setup_elicitations_received == 3
    assert counters.unknown_session_drops == 0  # what Aeron sends is not an error
    assert counters.invalid_frames == 0


def test_the_first_status_message_ends_the_images_rsp_setups() -> None:
    endpoint, _ = _server()
    counters = endpoint.counters
    image = _image(counters)
    publication = ResponsePublication(
        image=image, expected_host=CLIENT_A[0], **_publication_kwargs(3, counters)
    )
    endpoint.add(publication)
    publication.answer(0.0)
    assert image.response_session_id == 3
    endpoint.on_datagram(_eliciting(3), CLIENT_A, 0.1)
    assert image.response_session_id == 3  # a SETUP was asked for; nobody receives yet
    endpoint.on_datagram(_status(publication), CLIENT_A, 0.2)
    assert image.response_session_id is None


# ------------------------------------------------------------------------------ client side


def test_rsp_setup_reaches_the_request_publication_only_from_its_server() -> None:
    counters = Counters()
    endpoint = SendEndpoint(mode=SendMode.UNICAST, counters=counters, remote=SERVER)
    heard: list[tuple[int, int]] = []
    request = RequestPublication(
        response_correlation_id=99,
        on_response_setup=lambda c, s: heard.append((c, s)),
        **_publication_kwargs(-5, counters),
    )
    endpoint.add(request)
    rsp = struct.pack("<iBBHiii", 20, 0, 0, 0x0B, -5, STREAM, 31337)
    endpoint.on_datagram(rsp, CLIENT_B, 0.0)  # forged: not from the server
    assert heard == []
    wrong_session = struct.pack("<iBBHiii", 20, 0, 0, 0x0B, -6, STREAM, 31337)
    endpoint.on_datagram(wrong_session, SERVER, 0.0)
    assert heard == []
    endpoint.on_datagram(rsp, SERVER, 0.0)
    assert heard == [(99, 31337)]
    assert counters.response_setups_received == 3


def test_a_response_subscription_waits_for_rsp_setup_then_elicits_its_session() -> None:
    counters = Counters()
    endpoint = ReceiveEndpoint(
        counters=counters, receiver_id=1234, now=0.0, control=SERVER, response=True
    )
    endpoint.add_interest(StreamInterest(stream_id=STREAM), 0.0)
    wire = Wire()
    endpoint.poll(0.0, wire)
    endpoint.poll(10.0, wire)
    assert wire.sent == []  # not even an MDC registration: the session is not known yet

    endpoint.on_response_setup(STREAM, 31337, 11.0)
    endpoint.poll(11.0, wire)
    ((datagram, address),) = wire.sent
    assert address == SERVER
    sm = struct.unpack_from("<iBBHiiiiiq", datagram, 0)
    assert sm[2] == SM_SETUP_FLAG and sm[3] == 0x03 and (sm[4], sm[5]) == (31337, STREAM)
    # Data of another session on this socket makes no image (the interest is session 31337).
    assert endpoint.interests == {
        (STREAM, 31337): StreamInterest(stream_id=STREAM, session_id=31337)
    }


def test_session_specific_subscriptions_share_a_channel_with_each_other() -> None:
    counters = Counters()
    endpoint = ReceiveEndpoint(counters=counters, receiver_id=1, now=0.0)
    endpoint.add_interest(StreamInterest(stream_id=STREAM, session_id=1), 0.0)
    endpoint.add_interest(StreamInterest(stream_id=STREAM, session_id=2), 0.0)
    wire = Wire()
    for session in (1, 2, 3):
        request = RequestPublication(
            response_correlation_id=1, **_publication_kwargs(session, counters)
        )
        endpoint.on_datagram(request.setup_frame(), CLIENT_A, 0.0)
    assert set(endpoint.images) == {(1, STREAM), (2, STREAM)}
    assert counters.session_filter_drops == 1
    assert all(image.requested_response for image in endpoint.images.values())
    endpoint.remove_interest(STREAM, wire, 1)
    assert set(endpoint.images) == {(2, STREAM)}


def test_the_control_port_polls_only_the_publications_with_something_to_do() -> None:
    # 200 response publications on one socket: a status message, an offer or a close touches
    # one publication, and only that one is polled (not 200 per datagram).
    endpoint, _ = _server()
    publications = [_response(endpoint, session, CLIENT_A[0]) for session in range(1, 201)]
    polled: list[int] = []
    for publication in publications:
        original = publication.poll

        def counting(now: float, emit: object, p: ResponsePublication = publication, f=original):  # type: ignore[no-untyped-def]
            polled.append(p.session_id)
            f(now, emit)

        publication.poll = counting  # type: ignore[method-assign]
    wire = Wire()
    endpoint.poll(0.0, wire)
    assert sorted(polled) == list(range(1, 201))  # each new publication once
    polled.clear()
    endpoint.poll(0.001, wire)
    assert polled == []  # nothing due a millisecond later
    endpoint.on_datagram(_eliciting(7), CLIENT_A, 0.002)
    assert endpoint.next_deadline(0.002) == 0.002
    endpoint.poll(0.002, wire)
    assert polled == [7]
    assert wire.to(CLIENT_A)  # its SETUP went to the receiver that asked
    polled.clear()
    endpoint.on_datagram(_status(publications[6]), CLIENT_A, 0.003)
    endpoint.poll(0.003, wire)
    publications[6].offer(b"answer", 0.004)
    endpoint.poll(0.004, wire)
    assert polled == [7, 7]
    assert any(b"answer" in data for data in wire.to(CLIENT_A))
    # Housekeeping deadlines still come: every publication is polled again within 0.1 s.
    polled.clear()
    endpoint.poll(0.2, wire)
    assert len(polled) == 200


def test_offer_many_on_a_response_publication_goes_through_its_own_offer() -> None:
    # NetworkPublication is compiled and allows interpreted subclasses: its offer_many must
    # reach the subclass's offer (which tells the endpoint it has something to do), not the
    # base class's directly.
    counters = Counters()
    response = ResponsePublication(
        image=None, expected_host=CLIENT_A[0], **_publication_kwargs(5, counters)
    )
    touches: list[None] = []
    response.touched = lambda: touches.append(None)
    assert response.offer_many([b"a", b"b"], 0.0) == 0  # no receiver yet: NOT_CONNECTED
    assert len(touches) == 1


# ------------------------------------------------------------------------------ the control port,
# rule by rule (what ./dev mutate response showed no test held)


class SegmentWire(Wire):
    """A Wire that also records the segment size of each call (0: a plain datagram)."""

    def __init__(self) -> None:
        super().__init__()
        self.segments: list[int] = []

    def __call__(
        self, datagram: bytes | memoryview, address: tuple[str, int], segment: int = 0
    ) -> int:
        self.segments.append(segment)
        return super().__call__(datagram, address)


def _connected(
    endpoint: ResponseSendEndpoint, session_id: int = 1, now: float = 0.0
) -> ResponsePublication:
    publication = _response(endpoint, session_id, CLIENT_A[0])
    endpoint.on_datagram(_eliciting(session_id), CLIENT_A, now)
    endpoint.on_datagram(_status(publication), CLIENT_A, now)
    return publication


def test_a_flushed_offer_goes_to_the_receiver_at_once_as_plain_datagrams() -> None:
    endpoint, _ = _server()
    publication = _connected(endpoint)
    wire = SegmentWire()
    endpoint.poll(0.0, wire)
    sent = len(wire.sent)
    assert publication.offer(b"now", 0.01) > 0
    endpoint.flush(publication, 0.01, wire)
    assert any(b"now" in data for data in wire.to(CLIENT_A)[sent:])
    assert set(wire.segments) == {0}
    # ...and its next deadline (a heartbeat after the data) is the endpoint's
    assert endpoint.next_deadline(0.01) == 0.01  # the offer touched it
    endpoint.poll(0.01, wire)
    assert endpoint.next_deadline(0.01) == publication.next_deadline(0.01) > 0.01


def test_announce_end_sends_the_end_of_stream_heartbeat_to_the_receiver() -> None:
    endpoint, _ = _server()
    publication = _connected(endpoint)
    wire = Wire()
    endpoint.announce_end(publication, wire)
    ((data, address),) = wire.sent
    assert address == CLIENT_A and len(data) == 32 and data[5] == 0xE0  # BEGIN|END|EOS


def test_no_receiver_no_setup_counted_and_a_plain_publication_sends_nowhere() -> None:
    endpoint, counters = _server()
    _response(endpoint, 1, CLIENT_A[0])
    plain = NetworkPublication(**_publication_kwargs(2, counters))  # type: ignore[arg-type]
    endpoint.add(plain)
    wire = Wire()
    endpoint.poll(0.0, wire)
    assert wire.sent == [] and counters.setups_sent == 0


def test_a_removed_publication_is_forgotten_whole() -> None:
    endpoint, _ = _server()
    fresh = _response(endpoint, 9, CLIENT_A[0])
    endpoint.remove(fresh)  # never polled: nothing of it to forget but itself
    publication = _connected(endpoint)
    wire = Wire()
    endpoint.poll(0.0, wire)
    endpoint.on_datagram(_status(publication), CLIENT_A, 0.01)  # touched again
    endpoint.remove(publication)
    assert endpoint.publications == {}
    assert endpoint.next_deadline(0.01) == float("inf")
    publication.offer(b"x", 0.02)  # no endpoint to tell any more: not an error
    assert endpoint.next_deadline(0.02) == float("inf")


def test_the_next_deadline_is_the_live_one_not_a_stale_one() -> None:
    endpoint, _ = _server()
    assert endpoint.next_deadline(0.0) == float("inf")
    publication = _response(endpoint, 1, CLIENT_A[0])
    wire = Wire()
    endpoint.poll(0.0, wire)
    first = endpoint.next_deadline(0.0)
    assert first == publication.next_deadline(0.0) < float("inf")
    endpoint.on_datagram(_eliciting(1), CLIENT_A, first / 2)  # a SETUP now: later deadline
    endpoint.poll(first / 2, wire)
    later = publication.next_deadline(first / 2)
    assert later > first
    assert endpoint.next_deadline(first / 2) == later
    polled = []
    original = publication.poll

    def counting(now: float, emit: object) -> None:
        polled.append(now)
        original(now, emit)  # type: ignore[arg-type]

    publication.poll = counting  # type: ignore[method-assign]
    endpoint.poll(first, wire)  # the stale deadline: nothing to do
    assert polled == []
    endpoint.poll(later, wire)  # exactly its deadline
    assert polled == [later]


def test_the_control_ports_deadline_heap_is_rebuilt_past_twice_the_live_ones_plus_64() -> None:
    endpoint, _ = _server()
    publication = _connected(endpoint)
    wire = Wire()
    other = _connected(endpoint, 2)  # a second live deadline: the bound is 2 * 2 + 64
    endpoint.poll(0.0, wire)
    assert endpoint._deadlines.keys() == {(1, STREAM), (2, STREAM)}
    assert other.destination == CLIENT_A
    sizes = []
    for i in range(150):
        now = i * 0.0001
        assert publication.offer(b"m", now) > 0
        endpoint.flush(publication, now, wire)  # each moves its heartbeat deadline
        endpoint.poll(now, wire)
        sizes.append(len(endpoint._heap))
    assert max(sizes) == 2 * 2 + 64


def test_control_frames_are_counted_and_go_to_their_publication() -> None:
    endpoint, counters = _server()
    publication = _connected(endpoint)
    assert counters.status_messages_received == 2 and counters.destinations_added == 1
    wire = Wire()
    assert publication.offer(b"lost", 0.01) > 0
    endpoint.poll(0.01, wire)
    nak = Nak(session_id=1, stream_id=STREAM, term_id=100, term_offset=0, length=64).encode()
    endpoint.on_datagram(nak, CLIENT_A, 0.02)
    endpoint.on_datagram(nak, CLIENT_A, 0.02)
    assert counters.naks_received == 2
    sent = len(wire.sent)
    endpoint.poll(0.02, wire)
    assert any(b"lost" in data for data in wire.to(CLIENT_A)[sent:])  # the retransmit
    rttm = Rttm(
        session_id=1, stream_id=STREAM, echo_timestamp_ns=77, reception_delta_ns=0,
        receiver_id=1234, flags=RTTM_REPLY_FLAG,
    ).encode()  # fmt: skip
    endpoint.on_datagram(rttm, CLIENT_A, 0.03)
    sent = len(wire.sent)
    endpoint.poll(0.03, wire)
    assert any(len(data) == len(rttm) for data in wire.to(CLIENT_A)[sent:])  # the reply
    error = ErrorFrame(
        session_id=1, stream_id=STREAM, receiver_id=1234, error_code=1, message="no"
    ).encode()
    endpoint.on_datagram(error, CLIENT_A, 0.04)
    assert not publication.is_connected(0.04)  # its only receiver refused it
    for frame in (_eliciting(77), _eliciting(78)):  # no such session here
        endpoint.on_datagram(frame, CLIENT_A, 0.05)
    assert counters.unknown_session_drops == 2
    endpoint.on_datagram(nak, CLIENT_B, 0.05)
    endpoint.on_datagram(nak, CLIENT_B, 0.05)
    assert counters.unvalidated_drops == 2
    endpoint.on_datagram(b"\x00" * 5, CLIENT_A, 0.06)
    endpoint.on_datagram(publication.setup_frame(), CLIENT_A, 0.06)
    assert dict(counters.invalid_by_reason) == {"too_short": 1, "unexpected_on_send_channel": 1}


def test_a_nak_on_the_control_port_is_resent_at_once_to_its_own_receiver_only() -> None:
    endpoint, _ = _server()
    publication = _connected(endpoint, 1)
    other = _response(endpoint, 2, CLIENT_B[0])
    endpoint.on_datagram(_eliciting(2), CLIENT_B, 0.0)
    endpoint.on_datagram(_status(other), CLIENT_B, 0.0)
    wire = Wire()
    assert publication.offer(b"lost", 0.01) > 0
    endpoint.poll(0.01, wire)
    assert not endpoint.repair_due
    nak = Nak(session_id=1, stream_id=STREAM, term_id=100, term_offset=0, length=64).encode()
    endpoint.on_datagram(nak, CLIENT_A, 0.02)
    assert endpoint.repair_due  # the driver sends it before it reads the next datagram
    sent = len(wire.sent)
    endpoint.repair(0.02, wire)
    assert not endpoint.repair_due
    # The resend alone, to its own receiver: no heartbeat, nothing of the other publication.
    assert [(b"lost" in data, where) for data, where in wire.sent[sent:]] == [(True, CLIENT_A)]
    endpoint.on_datagram(nak, CLIENT_A, 0.02)  # the receiver's NAK again: a duplicate
    assert not endpoint.repair_due


def test_a_live_receiver_keeps_its_publication_until_exactly_the_destination_timeout() -> None:
    endpoint, counters = _server()
    publication = _connected(endpoint)
    elsewhere = (CLIENT_A[0], 50000)
    endpoint.on_datagram(_status(publication), CLIENT_A, 3.0)
    endpoint.on_datagram(_eliciting(1), elsewhere, 4.0)  # heard 1 s ago: live
    assert publication.destination == CLIENT_A
    drops = counters.unvalidated_drops
    endpoint.on_datagram(_status(publication), elsewhere, 4.5)  # a plain SM: never steers
    assert counters.unvalidated_drops == drops + 1
    endpoint.on_datagram(_eliciting(1), elsewhere, 8.0)  # exactly 5 s of silence
    assert publication.destination == elsewhere
    assert counters.destinations_added == 2


def test_status_messages_after_the_connection_keep_flowing() -> None:
    endpoint, counters = _server()
    image = _image(counters)
    publication = ResponsePublication(
        image=image, expected_host=CLIENT_A[0], **_publication_kwargs(3, counters)
    )
    endpoint.add(publication)
    publication.answer(0.0)
    endpoint.on_datagram(_eliciting(3), CLIENT_A, 0.1)
    endpoint.on_datagram(_status(publication), CLIENT_A, 0.2)
    endpoint.on_datagram(_status(publication), CLIENT_A, 0.3)
    assert publication.image is None and image.response_session_id is None
    assert publication.is_connected(0.3)


def test_closing_or_offering_tells_the_endpoint_only_when_on_one() -> None:
    counters = Counters()
    alone = ResponsePublication(
        image=None, expected_host=CLIENT_A[0], **_publication_kwargs(5, counters)
    )
    assert alone.offer(b"x", 0.0) < 0  # NOT_CONNECTED, and nobody to tell
    alone.close(0.0)
    endpoint, _ = _server()
    publication = _response(endpoint, 6, CLIENT_A[0])
    endpoint.poll(0.0, Wire())
    assert endpoint.next_deadline(0.0) > 0.0
    publication.close(0.01)
    assert endpoint.next_deadline(0.01) == 0.01


def test_a_request_publication_keeps_its_other_setup_flags() -> None:
    counters = Counters()
    request = RequestPublication(
        response_correlation_id=1, is_group=True, **_publication_kwargs(-7, counters)
    )
    assert request.setup_frame()[5] == 0x80 | 0x40  # SEND_RESPONSE | GROUP


def test_rsp_setup_is_accepted_from_an_ipv6_server() -> None:
    counters = Counters()
    request = RequestPublication(response_correlation_id=1, **_publication_kwargs(-5, counters))
    publications: dict[tuple[int, int], NetworkPublication] = {(-5, STREAM): request}
    frame = ResponseSetup(session_id=-5, stream_id=STREAM, response_session_id=9)
    server = ("2001:db8::1", 9001, 0, 0)
    assert response_setup_from(publications, frame, server, server) is request
    assert response_setup_from(publications, frame, ("2001:db8::2", 9001, 0, 0), server) is None


def test_runs_of_datagrams_go_to_the_receiver_with_their_segment_size() -> None:
    endpoint, _ = _server()
    publication = _connected(endpoint)
    endpoint.set_run_segments(8)
    wire = SegmentWire()
    endpoint.poll(0.0, wire)
    for i in range(6):  # six full frames: one run
        assert publication.offer(bytes([i]) * 1376, 0.01) > 0
    endpoint.flush(publication, 0.01, wire)
    runs = [
        (len(data), segment)
        for (data, _), segment in zip(wire.sent, wire.segments, strict=True)
        if segment
    ]
    assert runs == [(6 * 1408, 1408)]
    assert all(address == CLIENT_A for _, address in wire.sent)


def test_a_new_socket_is_used_as_soon_as_it_is_handed_in() -> None:
    endpoint, _ = _server()
    publication = _connected(endpoint)
    old, new = Wire(), Wire()
    endpoint.poll(0.0, old)
    assert publication.offer(b"via the new socket", 0.01) > 0
    endpoint.flush(publication, 0.01, new)
    assert any(b"via the new socket" in data for data in new.to(CLIENT_A))
    assert not any(b"via the new socket" in data for data in old.sent)


def test_a_closed_publication_leaves_no_deadline() -> None:
    endpoint, _ = _server()
    publication = _connected(endpoint)
    wire = Wire()
    endpoint.poll(0.0, wire)
    assert endpoint.next_deadline(0.0) < float("inf")
    endpoint.announce_end(publication, wire)
    endpoint.flush(publication, 0.01, wire)
    assert endpoint.next_deadline(0.01) == float("inf")
    fresh = _response(endpoint, 2, CLIENT_A[0])
    endpoint.announce_end(fresh, wire)  # closed before it was ever scheduled
    endpoint.flush(fresh, 0.02, wire)
    endpoint.poll(0.02, wire)
    assert endpoint.next_deadline(0.02) == float("inf")
