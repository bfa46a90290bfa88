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

from echo.transport.counters import Counters
from echo.transport.flow_control import UnicastFlowControl
from echo.transport.frames import SM_SETUP_FLAG, Nak, StatusMessage
from echo.transport.image import PublicationImage
from echo.transport.receiver import ReceiveEndpoint, StreamInterest
from echo.transport.response import RequestPublication, ResponsePublication, ResponseSendEndpoint
from echo.transport.sender import SendEndpoint, SendMode

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


def test_a_response_channel_has_no_mdc_registration() -> None:
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
    endpoint.on_datagram(registration, CLIENT_A, 0.0)
    assert a.destination is None
    assert counters.unknown_session_drops >= 1


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
