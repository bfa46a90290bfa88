"""The receiver rebuilds the streams of the Aeron C driver captures (tests/data/aeron-captures).

The DATA/PAD/SETUP datagrams that reached the subscriber (for loss-nak: not those the packet
comment marks as dropped by nftables) are fed to a ReceiveEndpoint in capture order, with `now`
taken from the capture timestamps; the messages the image delivers must be the captured stream,
and what the receiver sends back (SMs, NAKs) must say what the C driver's receiver said.
"""

from __future__ import annotations

import struct
from functools import cache

import attrs
import pytest

from echo.transport.core.counters import Counters
from echo.transport.core.frames import (
    SM_EOS_FLAG,
    DataHeader,
    Frame,
    Nak,
    Setup,
    StatusMessage,
    parse_datagram_untrusted,
)
from echo.transport.core.receiver import (
    ImageAvailable,
    ImageState,
    ImageUnavailable,
    ReceiveEndpoint,
    StreamInterest,
)
from tests.transport.pcapng import Record, read_capture

DROPPED_COMMENT = "DROPPED_BY_NFTABLES_INPUT_HOOK_never_delivered_to_the_socket"
SUBSCRIBER_PORT = 20121


@attrs.define
class Replay:
    messages: list[bytes]
    sent: list[tuple[float, Frame, object]]
    endpoint: ReceiveEndpoint
    counters: Counters
    events: list[object]
    fed: int


def replay(name: str, *, skip_dropped: bool = True) -> Replay:
    records: list[Record] = read_capture(name)
    start = records[0].timestamp
    counters = Counters()
    endpoint = ReceiveEndpoint(counters=counters, receiver_id=0x5EED, now=0.0)
    endpoint.add_interest(StreamInterest(stream_id=1001), 0.0)
    messages: list[bytes] = []
    sent: list[tuple[float, Frame, object]] = []
    events: list[object] = []
    now = 0.0

    def send(datagram: bytes | memoryview, address: object) -> bool:
        sent.append((now, parse_datagram_untrusted(bytes(datagram)), address))
        return True

    def service() -> None:
        endpoint.poll(now, send)
        for image in list(endpoint.images.values()):
            while image.poll_messages(messages.append, 64) or (
                image.subscriber_position < image.rebuild_position
            ):
                pass
            if image.status_message_due():
                endpoint.touch(image.session_id, image.stream_id)
        endpoint.poll(now, send)
        events.extend(endpoint.take_events())

    fed = 0
    for record in records:
        if record.dst_port != SUBSCRIBER_PORT:
            continue
        if skip_dropped and record.comment == DROPPED_COMMENT:
            continue
        frame = parse_datagram_untrusted(record.payload)
        if not isinstance(frame, (DataHeader, Setup)):
            continue
        # Timers that fell due between two packets run first, as the driver's timer loop would.
        next_now = record.timestamp - start
        while True:
            deadline = endpoint.next_deadline(now)
            if deadline >= next_now:
                break
            now = max(deadline, now + 1e-6)
            service()
        now = next_now
        endpoint.on_datagram(record.payload, ("127.0.0.1", record.src_port), now)
        fed += 1
        service()
    for _ in range(20):  # let end-of-stream be noticed
        now += 0.01
        service()
    return Replay(messages, sent, endpoint, counters, events, fed)


@cache
def cached(name: str) -> Replay:
    return replay(name)


def status_messages(result: Replay) -> list[StatusMessage]:
    return [f for _, f, _ in result.sent if isinstance(f, StatusMessage)]


def test_unicast_rebuilds_hello_world() -> None:
    result = cached("unicast")
    assert result.messages == [f"Hello World! {n}".encode() for n in range(1, 8)]
    assert result.counters.invalid_frames == 0
    (available,) = [e for e in result.events if isinstance(e, ImageAvailable)]
    assert available.image.control_address == ("127.0.0.1", 60450)
    assert available.image.session_id == -2125572490


def test_fragmented_rebuilds_three_4000_byte_messages() -> None:
    result = cached("fragmented")
    assert [len(m) for m in result.messages] == [4000, 4000, 4000]
    for index, data in enumerate(result.messages):
        assert data == struct.pack("<Q", index) + bytes(3992)


def test_loss_nak_rebuilds_400_messages_in_order() -> None:
    result = cached("loss-nak")
    assert len(result.messages) == 400
    for index, data in enumerate(result.messages):
        assert data == struct.pack("<Q", index) + bytes(492), f"message {index}"
    image_events = [e for e in result.events if isinstance(e, ImageAvailable)]
    (available,) = image_events
    image = available.image
    # rcv-pos = sub-pos = 218368 = 400 x 544 + 3 PADs of 256 (captures README).
    assert image.subscriber_position == image.rebuild_position == 218368


def test_loss_nak_first_nak_matches_the_c_driver() -> None:
    """Frame 20 (offsets 17408 and 17952) was dropped; the C driver NAKed (17408, 1088)."""
    result = cached("loss-nak")
    naks = [f for _, f, _ in result.sent if isinstance(f, Nak)]
    assert naks
    first = naks[0]
    assert (first.session_id, first.stream_id) == (-1303405411, 1001)
    assert (first.term_id, first.term_offset, first.length) == (0x47CE41A8, 17408, 1088)
    for nak in naks:  # every NAK goes to the publisher's address, for whole frames
        assert nak.term_offset % 32 == 0 and nak.length % 32 == 0 and nak.length > 0
    assert all(address == ("127.0.0.1", 45428) for _, _, address in result.sent)


@pytest.mark.parametrize(
    ("name", "window"),
    [("unicast", 128 * 1024), ("fragmented", 128 * 1024), ("loss-nak", 32768)],
)
def test_sms_carry_the_window_and_the_capture_ends_in_eos(name: str, window: int) -> None:
    result = cached(name)
    sms = status_messages(result)
    assert sms
    assert {sm.receiver_window for sm in sms} == {window}  # min(128 KiB, term/2)
    assert all(sm.receiver_id == 0x5EED for sm in sms)
    # The capture's SMs say the same window.
    captured = [
        f
        for r in read_capture(name)
        if r.src_port == SUBSCRIBER_PORT
        for f in [parse_datagram_untrusted(r.payload)]
        if isinstance(f, StatusMessage)
    ]
    assert {sm.receiver_window for sm in captured} == {window}
    # The publisher closed: the image ends at end-of-stream after an EOS SM.
    assert sms[-1].flags & SM_EOS_FLAG
    (gone,) = [e for e in result.events if isinstance(e, ImageUnavailable)]
    assert gone.reason is ImageState.END_OF_STREAM
    assert result.endpoint.images == {}


def test_loss_nak_with_nothing_dropped_still_rebuilds() -> None:
    # Feeding every datagram, dropped ones included, is only more duplicates.
    result = replay("loss-nak", skip_dropped=False)
    assert [struct.unpack_from("<Q", m)[0] for m in result.messages] == list(range(400))
    assert not [f for _, f, _ in result.sent if isinstance(f, Nak)]
    counters = result.counters
    assert counters.duplicate_data + counters.flow_control_underruns >= 21  # the resends
