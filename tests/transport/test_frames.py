"""Frame codecs, checked against the Aeron C driver captures (tests/data) and by rule."""

from __future__ import annotations

import collections
import itertools
import re
import struct
from collections.abc import Callable
from functools import cache
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from echo.transport.core.frames import (
    BEGIN_END_AND_EOS_FLAGS,
    COMMON_HEADER_STRUCT,
    DATA_HEADER_LENGTH,
    DATA_HEADER_STRUCT,
    ERR_HAS_GROUP_TAG_FLAG,
    ERR_HEADER_LENGTH,
    ERR_STRUCT,
    MAX_ERROR_MESSAGE_LENGTH,
    NAK_LENGTH,
    RSP_SETUP_LENGTH,
    RTTM_LENGTH,
    RTTM_REPLY_FLAG,
    SETUP_GROUP_FLAG,
    SETUP_LENGTH,
    SETUP_SEND_RESPONSE_FLAG,
    SETUP_STRUCT,
    SM_EOS_FLAG,
    SM_GTAG_LENGTH,
    SM_GTAG_STRUCT,
    SM_LENGTH,
    SM_SETUP_FLAG,
    UNFRAGMENTED_FLAGS,
    DataHeader,
    ErrorFrame,
    Frame,
    FrameError,
    FrameType,
    Nak,
    ResponseSetup,
    Rttm,
    Setup,
    StatusMessage,
    align,
    iter_data_frames_untrusted,
    parse_datagram_untrusted,
)
from tests.transport.pcapng import CAPTURE_NAMES, Record, captures_dir, read_capture

I32 = st.integers(-(2**31), 2**31 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
U8 = st.integers(0, 255)

DROPPED_COMMENT = "DROPPED_BY_NFTABLES_INPUT_HOOK_never_delivered_to_the_socket"


@cache
def capture(name: str) -> tuple[Record, ...]:
    return tuple(read_capture(name))


def all_records() -> list[tuple[str, Record]]:
    return [(name, record) for name in CAPTURE_NAMES for record in capture(name)]


def category(header: DataHeader) -> str:
    """The listing's category names (NAME.txt legend)."""
    if header.is_pad:
        return "PAD"
    if header.is_heartbeat:
        return "HB-EOS" if header.is_end_of_stream else "HB"
    flags = header.flags & UNFRAGMENTED_FLAGS
    return {0xC0: "DATA", 0x80: "DATA-B", 0x40: "DATA-E", 0x00: "DATA-MID"}[flags]


def control_category(frame: Frame) -> str:
    if isinstance(frame, Setup):
        return "SETUP"
    if isinstance(frame, Nak):
        return "NAK"
    if isinstance(frame, Rttm):
        return "RTTM-R" if frame.flags & RTTM_REPLY_FLAG else "RTTM"
    if isinstance(frame, StatusMessage):
        name = "SM"
        if frame.is_setup_eliciting:
            name += "-SETUP"
        if frame.is_end_of_stream:
            name += "-EOS"
        return name + ("+GTAG" if frame.group_tag is not None else "")
    raise AssertionError(f"unexpected frame in captures: {frame!r}")


@cache
def categorize(name: str) -> list[list[str]]:
    """Per datagram, the category of each frame, with (RETX) as the listing computes it."""
    seen: set[tuple[int, int, int, int]] = set()
    result = []
    for record in capture(name):
        frame = parse_datagram_untrusted(record.payload)
        if not isinstance(frame, DataHeader):
            result.append([control_category(frame)])
            continue
        cats = []
        for header in iter_data_frames_untrusted(record.payload):
            cat = category(header)
            if cat in ("DATA", "PAD", "DATA-B", "DATA-E", "DATA-MID"):
                key = (record.dst_port, header.session_id, header.term_id, header.term_offset)
                if key in seen:
                    cat += "(RETX)"
                seen.add(key)
            cats.append(cat)
        result.append(cats)
    return result


# ---------------------------------------------------------------------------------------------
# Every datagram of every capture


def test_captures_dir_is_found_beside_the_repo() -> None:
    directory = captures_dir()
    for name in CAPTURE_NAMES:
        assert (directory / f"{name}.pcapng").is_file()
        assert (directory / f"{name}.txt").is_file()


@pytest.mark.parametrize(
    ("name", "datagrams"),
    [
        ("unicast", 166),
        ("mdc-dynamic", 363),
        ("loss-nak", 334),
        ("fragmented", 70),
        ("gtag-rttm", 161),
    ],
)
def test_capture_datagram_counts(name: str, datagrams: int) -> None:
    assert len(capture(name)) == datagrams


@pytest.mark.parametrize("name", CAPTURE_NAMES)
def test_every_captured_datagram_decodes_and_reencodes(name: str) -> None:
    for record in capture(name):
        frame = parse_datagram_untrusted(record.payload)
        if isinstance(frame, DataHeader):
            assert frame.encode() == record.payload[:DATA_HEADER_LENGTH], record.frame
            # The whole chain re-encodes: every header, and zero padding after each payload.
            offset = 0
            for header in iter_data_frames_untrusted(record.payload):
                assert header.encode() == record.payload[offset : offset + 32], record.frame
                if header.type == FrameType.DATA and header.frame_length:
                    end = offset + header.frame_length
                    assert record.payload[end : offset + align(header.frame_length)] == bytes(
                        align(header.frame_length) - header.frame_length
                    )
                    offset += align(header.frame_length)
                else:
                    offset += 32
            assert offset == len(record.payload)
        else:
            assert frame.encode() == record.payload, record.frame
        # Every accepted buffer type gives the same answer.
        assert parse_datagram_untrusted(bytearray(record.payload)) == frame
        assert parse_datagram_untrusted(memoryview(record.payload)) == frame


def counts(name: str) -> collections.Counter[str]:
    return collections.Counter(cat for cats in categorize(name) for cat in cats)


def test_unicast_counts_match_readme() -> None:
    assert counts("unicast") == {
        "SETUP": 1,
        "SM": 50,
        "SM-EOS": 5,
        "DATA": 7,
        "HB": 83,
        "HB-EOS": 20,
    }


def test_mdc_dynamic_counts_match_readme() -> None:
    assert counts("mdc-dynamic") == {
        "SM-SETUP": 25,
        "SETUP": 2,
        "SM": 76,
        "SM-EOS": 10,
        "DATA": 10,
        "HB": 120,
        "HB-EOS": 120,
    }
    # The README's per-port table.
    by_port: collections.Counter[tuple[str, str, int]] = collections.Counter()
    for record, cats in zip(capture("mdc-dynamic"), categorize("mdc-dynamic"), strict=True):
        for cat in cats:
            if cat.startswith("SM"):
                by_port[(cat, "from", record.src_port)] += 1
            else:
                by_port[(cat, "to", record.dst_port)] += 1
    assert by_port == {
        ("SM-SETUP", "from", 20123): 12,
        ("SM-SETUP", "from", 20124): 13,
        ("SETUP", "to", 20123): 1,
        ("SETUP", "to", 20124): 1,
        ("SM", "from", 20123): 38,
        ("SM", "from", 20124): 38,
        ("SM-EOS", "from", 20123): 5,
        ("SM-EOS", "from", 20124): 5,
        ("DATA", "to", 20123): 5,
        ("DATA", "to", 20124): 5,
        ("HB", "to", 20123): 60,
        ("HB", "to", 20124): 60,
        ("HB-EOS", "to", 20123): 60,
        ("HB-EOS", "to", 20124): 60,
    }


def test_loss_nak_counts_match_readme() -> None:
    assert counts("loss-nak") == {
        "DATA": 400,
        "DATA(RETX)": 42,
        "NAK": 24,
        "SM": 33,
        "SM-EOS": 5,
        "HB": 28,
        "HB-EOS": 20,
        "PAD": 3,
        "PAD(RETX)": 1,
        "SETUP": 1,
    }
    frames_in_datagrams = sum(len(cats) for cats in categorize("loss-nak"))
    assert frames_in_datagrams == 557
    # The listing's "datagram composition": the set of categories in each datagram.
    composition = collections.Counter(
        "+".join(dict.fromkeys(cats)) for cats in categorize("loss-nak")
    )
    assert composition == {
        "DATA": 199,
        "SM": 33,
        "HB": 28,
        "NAK": 24,
        "DATA(RETX)": 20,
        "HB-EOS": 20,
        "SM-EOS": 5,
        "DATA+PAD": 3,
        "DATA(RETX)+PAD(RETX)": 1,
        "SETUP": 1,
    }


def test_loss_nak_dropped_datagrams_match_readme() -> None:
    records = capture("loss-nak")
    dropped = [r for r in records if r.comment is not None]
    assert all(r.comment == DROPPED_COMMENT for r in dropped)
    assert len(dropped) == 39
    publisher_port = 45428
    to_subscriber = [r for r in dropped if r.src_port == publisher_port]
    to_publisher = [r for r in dropped if r.dst_port == publisher_port]
    assert (len(to_subscriber), len(to_publisher)) == (28, 11)
    kinds = collections.Counter(categorize("loss-nak")[r.frame - 1][0] for r in dropped)
    assert kinds == {
        "DATA": 17,
        "DATA(RETX)": 4,
        "HB": 2,
        "HB-EOS": 5,
        "NAK": 4,
        "SM": 6,
        "SM-EOS": 1,
    }


def test_fragmented_counts_match_readme() -> None:
    assert counts("fragmented") == {
        "SETUP": 1,
        "SM": 15,
        "SM-EOS": 5,
        "DATA-B": 3,
        "DATA-MID": 3,
        "DATA-E": 3,
        "HB": 20,
        "HB-EOS": 20,
    }


def test_gtag_rttm_counts_match_readme() -> None:
    assert counts("gtag-rttm") == {
        "SETUP": 1,
        "SM+GTAG": 35,
        "SM-EOS+GTAG": 5,
        "RTTM-R": 30,
        "RTTM": 30,
        "DATA": 2,
        "HB": 38,
        "HB-EOS": 20,
    }
    for record in capture("gtag-rttm"):
        frame = parse_datagram_untrusted(record.payload)
        if isinstance(frame, StatusMessage):
            assert len(record.payload) == SM_GTAG_LENGTH
            assert frame.group_tag == 77


# ---------------------------------------------------------------------------------------------
# Field-by-field agreement with the decoded listings (NAME.txt section 1)

_LINE_RE = re.compile(
    r"^\s*(\d+)\s+([\d.]+)\s+(\d+)>(\d+)\s+(\d+)( \[DROPPED-BY-NFT\])? \| [^|]* \| (.*)$"
)
_FIELD_RE = re.compile(r"(\w+)(?:\[\d+\])?=(\S+)")


def listing(
    name: str,
) -> list[tuple[int, float, int, int, int, bool, list[tuple[str, dict[str, str]]]]]:
    text = (captures_dir() / f"{name}.txt").read_text()
    section = text.split("1. Per-frame listing", 1)[1].split("\n2. ", 1)[0]
    rows = []
    for line in section.splitlines():
        match = _LINE_RE.match(line)
        if match is None:
            continue
        frame, time, src, dst, size, dropped, decoded = match.groups()
        frames = []
        for part in decoded.split(" || "):
            cat, _, rest = part.partition(" ")
            frames.append((cat, dict(_FIELD_RE.findall(rest))))
        rows.append((int(frame), float(time), int(src), int(dst), int(size), bool(dropped), frames))
    return rows


def _signed(text: str) -> int:
    # "sess=-1303405411/0xb24f9c9d" and "flags=0xc0(B|E)": keep the first spelling.
    text = text.split("/")[0].split("(")[0]
    return int(text, 0)


def _i64(text: str) -> int:
    value = int(text, 0)
    return value - 2**64 if value >= 2**63 else value


def _i32(text: str) -> int:
    value = _signed(text)
    return value - 2**32 if value >= 2**31 else value


def expected_fields(frame: Frame | DataHeader) -> dict[str, int]:
    if isinstance(frame, DataHeader):
        return {
            "len": frame.frame_length,
            "flags": frame.flags,
            "sess": frame.session_id,
            "strm": frame.stream_id,
            "term": frame.term_id,
            "off": frame.term_offset,
        }
    if isinstance(frame, Setup):
        return {
            "len": SETUP_LENGTH,
            "flags": frame.flags,
            "sess": frame.session_id,
            "strm": frame.stream_id,
            "initTerm": frame.initial_term_id,
            "activeTerm": frame.active_term_id,
            "termOff": frame.term_offset,
            "termLen": frame.term_length,
            "mtu": frame.mtu,
            "ttl": frame.ttl,
        }
    if isinstance(frame, StatusMessage):
        fields = {
            "len": SM_LENGTH if frame.group_tag is None else SM_GTAG_LENGTH,
            "flags": frame.flags,
            "sess": frame.session_id,
            "strm": frame.stream_id,
            "consTerm": frame.consumption_term_id,
            "consOff": frame.consumption_term_offset,
            "window": frame.receiver_window,
            "rcvId": frame.receiver_id,
        }
        if frame.group_tag is not None:
            fields["groupTag"] = frame.group_tag
        return fields
    if isinstance(frame, Nak):
        return {
            "len": NAK_LENGTH,
            "flags": frame.flags,
            "sess": frame.session_id,
            "strm": frame.stream_id,
            "term": frame.term_id,
            "off": frame.term_offset,
            "length": frame.length,
        }
    if isinstance(frame, Rttm):
        return {
            "len": RTTM_LENGTH,
            "flags": frame.flags,
            "sess": frame.session_id,
            "strm": frame.stream_id,
            "echoTs": frame.echo_timestamp_ns,
            "rcptDelta": frame.reception_delta_ns,
            "rcvId": frame.receiver_id,
        }
    raise AssertionError(frame)


_I32_FIELDS = {"term", "initTerm", "activeTerm", "consTerm"}
_I64_FIELDS = {"rcvId", "echoTs", "rcptDelta", "groupTag"}


def listed_fields(fields: dict[str, str]) -> dict[str, int]:
    result = {}
    for key, value in fields.items():
        if key == "data":
            continue
        if key in _I64_FIELDS:
            result[key] = _i64(value)
        elif key in _I32_FIELDS:
            result[key] = _i32(value)
        else:
            result[key] = _signed(value)
    return result


@pytest.mark.parametrize("name", CAPTURE_NAMES)
def test_decoded_fields_match_the_listing(name: str) -> None:
    rows = listing(name)
    records = capture(name)
    assert len(rows) == len(records)
    start = records[0].timestamp
    for record, cats, row in zip(records, categorize(name), rows, strict=True):
        frame_no, time, src, dst, size, dropped, listed = row
        assert (record.frame, record.src_port, record.dst_port) == (frame_no, src, dst)
        assert len(record.payload) == size
        assert record.timestamp - start == pytest.approx(time, abs=2e-6)
        assert (record.comment == DROPPED_COMMENT) == dropped
        assert cats == [cat for cat, _ in listed], frame_no
        frame = parse_datagram_untrusted(record.payload)
        decoded: list[Frame | DataHeader] = (
            list(iter_data_frames_untrusted(record.payload))
            if isinstance(frame, DataHeader)
            else [frame]
        )
        assert len(decoded) == len(listed)
        for one, (_, fields) in zip(decoded, listed, strict=True):
            assert expected_fields(one) == listed_fields(fields), frame_no


# ---------------------------------------------------------------------------------------------
# The "frames to look at" of the captures README


def frame_at(name: str, number: int) -> tuple[Record, Frame]:
    record = capture(name)[number - 1]
    assert record.frame == number
    return record, parse_datagram_untrusted(record.payload)


def test_unicast_frames_to_look_at() -> None:
    session = -2125572490
    _, setup = frame_at("unicast", 1)
    assert setup == Setup(
        term_offset=0,
        session_id=session,
        stream_id=1001,
        initial_term_id=0x063A1021,
        active_term_id=0x063A1021,
        term_length=16777216,
        mtu=1408,
        ttl=0,
        flags=0,
    )
    _, sm = frame_at("unicast", 2)
    assert isinstance(sm, StatusMessage)
    assert sm.receiver_id == struct.unpack("<q", struct.pack("<Q", 0xF8EAADB5B9BD48DA))[0]
    _, heartbeat = frame_at("unicast", 3)
    assert isinstance(heartbeat, DataHeader) and heartbeat.is_heartbeat
    assert heartbeat.term_offset == 0 and not heartbeat.is_end_of_stream
    data = [
        (r, f)
        for r in capture("unicast")
        if isinstance(f := parse_datagram_untrusted(r.payload), DataHeader) and not f.is_heartbeat
    ]
    assert [f.term_offset for _, f in data] == [0, 64, 128, 192, 256, 320, 384]
    assert data[0][0].frame == 18
    for index, (record, header) in enumerate(data, start=1):
        assert header.frame_length == 46 and len(record.payload) == 64
        assert header.flags == UNFRAGMENTED_FLAGS and header.reserved_value == 0
        assert record.payload[32:46] == f"Hello World! {index}".encode()
    _, after = frame_at("unicast", 19)
    assert isinstance(after, DataHeader) and after.is_heartbeat and after.term_offset == 64
    _, eos = frame_at("unicast", 137)
    assert isinstance(eos, DataHeader) and eos.is_heartbeat and eos.is_end_of_stream
    assert eos.term_offset == 448 and eos.flags == BEGIN_END_AND_EOS_FLAGS
    _, eos_sm = frame_at("unicast", 152)
    assert isinstance(eos_sm, StatusMessage) and eos_sm.is_end_of_stream
    assert eos_sm.flags == SM_EOS_FLAG
    # The SM consumption offset stays 0 for the whole capture (window/4 rule).
    sms = [
        f
        for r in capture("unicast")
        if isinstance(f := parse_datagram_untrusted(r.payload), StatusMessage)
    ]
    assert {sm.consumption_term_offset for sm in sms} == {0}
    assert {sm.receiver_window for sm in sms} == {131072}


def test_mdc_dynamic_frames_to_look_at() -> None:
    for number in range(1, 7):
        record, sm = frame_at("mdc-dynamic", number)
        assert record.payload[:8] == bytes.fromhex("2400000000800300")
        assert record.payload[8:28] == bytes(20)
        assert isinstance(sm, StatusMessage) and sm.is_setup_eliciting
        assert (sm.session_id, sm.stream_id, sm.receiver_window) == (0, 0, 0)
        assert record.dst_port == 20122
    for number, port in ((7, 20123), (8, 20124)):
        record, setup = frame_at("mdc-dynamic", number)
        assert isinstance(setup, Setup) and setup.flags == SETUP_GROUP_FLAG
        assert (record.src_port, record.dst_port) == (20122, port)
        assert setup.session_id == -241150913
    receiver_ids: dict[int, set[int]] = {}
    for record in capture("mdc-dynamic"):
        frame = parse_datagram_untrusted(record.payload)
        if isinstance(frame, StatusMessage):
            receiver_ids.setdefault(record.src_port, set()).add(frame.receiver_id & (2**64 - 1))
            assert frame.group_tag is None
        else:
            assert record.src_port == 20122  # the publisher sends from its control port
    assert receiver_ids == {20123: {0x2D271D76D1EB0403}, 20124: {0x1DB42827FD50E03F}}


def test_loss_nak_frames_to_look_at() -> None:
    pads = []
    for record in capture("loss-nak"):
        frame = parse_datagram_untrusted(record.payload)
        if isinstance(frame, DataHeader) and not frame.is_heartbeat:
            headers = list(iter_data_frames_untrusted(record.payload))
            for header in headers:
                assert header.frame_length in (532, 256)
            if headers[-1].is_pad:
                pads.append((record.frame, len(record.payload), headers[-1]))
    assert [p[0] for p in pads] == [75, 142, 173, 234]
    assert [p[1] for p in pads] == [1120, 1120, 1120, 576]
    for _, _, pad in pads:
        assert (pad.term_offset, pad.frame_length, pad.flags) == (65280, 256, 0xC0)
    _, nak = frame_at("loss-nak", 52)
    assert isinstance(nak, Nak) and (nak.term_offset, nak.length) == (17408, 1088)
    record, retransmit = frame_at("loss-nak", 53)
    assert isinstance(retransmit, DataHeader) and retransmit.term_offset == 17408
    assert record.payload == capture("loss-nak")[19].payload  # frame 20, the dropped original
    _, nak_with_pad = frame_at("loss-nak", 160)
    assert isinstance(nak_with_pad, Nak) and nak_with_pad.length == 1344
    terms = []
    for record in capture("loss-nak"):
        frame = parse_datagram_untrusted(record.payload)
        if isinstance(frame, DataHeader) and not frame.is_heartbeat and frame.term_id not in terms:
            terms.append(frame.term_id)
            assert (
                record.frame
                == {0x47CE41A8: 4, 0x47CE41A9: 76, 0x47CE41AA: 143, 0x47CE41AB: 235}[frame.term_id]
            )
    assert len(terms) == 4


def test_fragmented_frames_to_look_at() -> None:
    expected = []
    for base in (0, 4096, 8192):
        expected += [(0x80, 1408, base), (0x00, 1408, base + 1408), (0x40, 1280, base + 2816)]
    got = []
    for number in range(4, 13):
        record, frame = frame_at("fragmented", number)
        assert isinstance(frame, DataHeader)
        assert len(record.payload) == align(frame.frame_length)
        got.append((frame.flags, frame.frame_length, frame.term_offset))
    assert got == expected
    _, heartbeat = frame_at("fragmented", 13)
    assert isinstance(heartbeat, DataHeader) and heartbeat.is_heartbeat
    assert heartbeat.term_offset == 12288


def test_gtag_rttm_frames_to_look_at() -> None:
    record, sm = frame_at("gtag-rttm", 2)
    assert isinstance(sm, StatusMessage) and sm.group_tag == 77
    assert record.payload[36:44] == bytes.fromhex("4d00000000000000")
    assert sm.receiver_window == 14080
    _, request = frame_at("gtag-rttm", 3)
    _, answer = frame_at("gtag-rttm", 5)
    assert isinstance(request, Rttm) and isinstance(answer, Rttm)
    assert request.flags == RTTM_REPLY_FLAG and answer.flags == 0
    assert answer.echo_timestamp_ns == request.echo_timestamp_ns
    assert answer.reception_delta_ns == 0
    _, eos = frame_at("gtag-rttm", 140)
    assert isinstance(eos, StatusMessage) and eos.is_end_of_stream and eos.group_tag == 77


# ---------------------------------------------------------------------------------------------
# minimal handshake traces


def test_unicast_handshake_trace() -> None:
    records = capture("unicast")
    publisher, subscriber = records[0].src_port, records[0].dst_port
    assert subscriber == 20121
    frames = [parse_datagram_untrusted(r.payload) for r in records]
    setup = frames[0]
    assert isinstance(setup, Setup)
    assert setup.initial_term_id == setup.active_term_id and setup.term_offset == 0
    # SETUP until the first SM; then the SM answers with the SETUP's session/stream/term.
    first_sm = next(i for i, f in enumerate(frames) if isinstance(f, StatusMessage))
    assert all(isinstance(f, Setup) for f in frames[:first_sm])
    sm = frames[first_sm]
    assert isinstance(sm, StatusMessage)
    assert (records[first_sm].src_port, records[first_sm].dst_port) == (subscriber, publisher)
    assert (sm.session_id, sm.stream_id, sm.consumption_term_id) == (
        setup.session_id,
        setup.stream_id,
        setup.initial_term_id,
    )
    assert sm.consumption_term_offset == 0 and sm.flags == 0
    assert sm.receiver_window == min(128 * 1024, setup.term_length // 2)
    # No data before the first SM (sender limit opens on SM, as in Aeron).
    assert not any(isinstance(f, DataHeader) for f in frames[:first_sm])
    for record, frame in zip(records, frames, strict=True):
        if isinstance(frame, DataHeader):
            assert (record.src_port, record.dst_port) == (publisher, subscriber)
            assert frame.session_id == setup.session_id and frame.term_id == setup.initial_term_id
            assert frame.reserved_value == 0


def test_dynamic_mdc_handshake_trace() -> None:
    records = capture("mdc-dynamic")
    frames = [parse_datagram_untrusted(r.payload) for r in records]
    control = 20122
    first_setup = next(i for i, f in enumerate(frames) if isinstance(f, Setup))
    # Before any SETUP: only "register me" SMs with session 0 / stream 0, to the control port.
    for record, frame in zip(records[:first_setup], frames[:first_setup], strict=True):
        assert isinstance(frame, StatusMessage) and frame.flags == SM_SETUP_FLAG
        assert record.dst_port == control
    # Setup-eliciting SMs keep coming about once a second per receiver.
    times: dict[int, list[float]] = collections.defaultdict(list)
    for record, frame in zip(records, frames, strict=True):
        if isinstance(frame, StatusMessage) and frame.is_setup_eliciting:
            assert (frame.session_id, frame.stream_id, frame.receiver_window) == (0, 0, 0)
            times[record.src_port].append(record.timestamp)
    for stamps in times.values():
        gaps = [b - a for a, b in itertools.pairwise(stamps)]
        assert all(0.9 < gap < 1.1 for gap in gaps)
    # Each destination gets SETUP (GROUP) from the control port before its data.
    for port in (20123, 20124):
        to_port = [(r, f) for r, f in zip(records, frames, strict=True) if r.dst_port == port]
        assert isinstance(to_port[0][1], Setup) and to_port[0][1].flags & SETUP_GROUP_FLAG
        assert all(r.src_port == control for r, _ in to_port)


# ---------------------------------------------------------------------------------------------
# Round trips

data_headers = st.builds(
    DataHeader,
    frame_length=I32,
    flags=U8,
    term_offset=I32,
    session_id=I32,
    stream_id=I32,
    term_id=I32,
    reserved_value=I64,
    type=st.sampled_from([FrameType.DATA, FrameType.PAD]),
)
setups = st.builds(
    Setup,
    term_offset=I32,
    session_id=I32,
    stream_id=I32,
    initial_term_id=I32,
    active_term_id=I32,
    term_length=I32,
    mtu=I32,
    ttl=I32,
    flags=U8,
)
status_messages = st.builds(
    StatusMessage,
    session_id=I32,
    stream_id=I32,
    consumption_term_id=I32,
    consumption_term_offset=I32,
    receiver_window=I32,
    receiver_id=I64,
    group_tag=st.none() | I64,
    flags=U8,
)
naks = st.builds(
    Nak, session_id=I32, stream_id=I32, term_id=I32, term_offset=I32, length=I32, flags=U8
)
rttms = st.builds(
    Rttm,
    session_id=I32,
    stream_id=I32,
    echo_timestamp_ns=I64,
    reception_delta_ns=I64,
    receiver_id=I64,
    flags=U8,
)
error_frames = st.builds(
    ErrorFrame,
    session_id=I32,
    stream_id=I32,
    receiver_id=I64,
    error_code=I32,
    message=st.text(st.characters(max_codepoint=127), max_size=MAX_ERROR_MESSAGE_LENGTH),
    group_tag=st.none() | I64,
    flags=U8,
)
response_setups = st.builds(
    ResponseSetup, session_id=I32, stream_id=I32, response_session_id=I32, flags=U8
)
control_frames = setups | status_messages | naks | rttms | error_frames | response_setups


@given(control_frames)
def test_control_frame_round_trip(frame: Frame) -> None:
    wire = frame.encode()
    assert parse_datagram_untrusted(wire) == frame
    assert COMMON_HEADER_STRUCT.unpack_from(wire)[0] == len(wire)


@given(
    st.builds(
        DataHeader,
        frame_length=st.integers(32, 1408),
        flags=U8,
        term_offset=st.integers(0, 2**26 - 1).map(lambda n: n * 32),
        session_id=I32,
        stream_id=I32,
        term_id=I32,
        reserved_value=I64,
    )
)
def test_data_frame_round_trip(header: DataHeader) -> None:
    wire = header.encode() + bytes(align(header.frame_length) - DATA_HEADER_LENGTH)
    assert parse_datagram_untrusted(wire) == header


@given(data_headers)
def test_data_header_encodes_32_bytes_in_field_order(header: DataHeader) -> None:
    wire = header.encode()
    assert DATA_HEADER_STRUCT.unpack(wire) == (
        header.frame_length,
        0,
        header.flags,
        header.type,
        header.term_offset,
        header.session_id,
        header.stream_id,
        header.term_id,
        header.reserved_value,
    )


def test_heartbeat_and_pad_round_trip() -> None:
    heartbeat = DataHeader(
        frame_length=0, flags=0xE0, term_offset=448, session_id=5, stream_id=7, term_id=-3
    )
    assert heartbeat.is_heartbeat and heartbeat.is_end_of_stream and not heartbeat.is_pad
    assert parse_datagram_untrusted(heartbeat.encode()) == heartbeat
    pad = DataHeader(
        frame_length=256,
        flags=0xC0,
        term_offset=65280,
        session_id=5,
        stream_id=7,
        term_id=-3,
        type=FrameType.PAD,
    )
    assert pad.is_pad and not pad.is_heartbeat and not pad.is_end_of_stream
    assert parse_datagram_untrusted(pad.encode()) == pad


def test_frame_lengths_on_the_wire() -> None:
    sm = StatusMessage(
        session_id=1,
        stream_id=2,
        consumption_term_id=3,
        consumption_term_offset=4,
        receiver_window=5,
        receiver_id=6,
    )
    assert len(sm.encode()) == SM_LENGTH
    assert len(attrs.evolve(sm, group_tag=0).encode()) == SM_GTAG_LENGTH
    assert SM_GTAG_STRUCT.unpack(attrs.evolve(sm, group_tag=-1).encode())[-1] == -1
    assert len(Nak(session_id=1, stream_id=2, term_id=3, term_offset=4, length=5).encode()) == 28
    assert len(SETUP_STRUCT.pack(40, 0, 0, 5, *range(8))) == SETUP_LENGTH
    err = ErrorFrame(session_id=1, stream_id=2, receiver_id=3, error_code=13, message="rejected")
    assert len(err.encode()) == ERR_HEADER_LENGTH + len("rejected")
    assert err.frame_length == len(err.encode())


# ---------------------------------------------------------------------------------------------
# Response channels (Aeron 1.44+, general availability 1.48.0). The vectors are written out
# byte by byte from Aeron 1.48.0's own definitions, not from echo's code:
#   aeron-client/src/main/c/protocol/aeron_udp_protocol.h: aeron_response_setup_header_t is
#     the 8-byte frame header (int32 frame_length, uint8 version, uint8 flags, int16 type)
#     then int32 session_id, int32 stream_id, int32 response_session_id, packed, 20 bytes;
#     AERON_HDR_TYPE_RSP_SETUP 0x0B; AERON_SETUP_HEADER_SEND_RESPONSE_FLAG 0x80.
#   aeron-client/src/main/java/io/aeron/protocol/ResponseSetupFlyweight.java: HEADER_LENGTH
#     20; session id at 8, stream id at 12, response session id at 16, little-endian.
#   aeron-driver/src/main/c/media/aeron_receive_channel_endpoint.c,
#     aeron_receive_channel_endpoint_send_response_setup: frame_length 20, version 0, flags 0.

RSP_SETUP_VECTOR = bytes.fromhex(
    "14000000"  # frame_length 20
    "00"  # version 0
    "00"  # flags 0
    "0b00"  # type 0x000B, RSP_SETUP
    "78563412"  # session id 0x12345678
    "e9030000"  # stream id 1001
    "feffffff"  # response session id -2
)


def test_response_setup_matches_aerons_layout() -> None:
    frame = ResponseSetup(session_id=0x12345678, stream_id=1001, response_session_id=-2)
    assert RSP_SETUP_LENGTH == 20
    assert frame.encode() == RSP_SETUP_VECTOR
    assert parse_datagram_untrusted(RSP_SETUP_VECTOR) == frame
    assert FrameType(RSP_SETUP_VECTOR[6]) is FrameType.RSP_SETUP


def test_response_setup_rejects_short_and_inconsistent_frames() -> None:
    rejects(RSP_SETUP_VECTOR[:19], "too_short")
    for bad in (19, 21, 0, -1):
        wire = bytearray(RSP_SETUP_VECTOR)
        struct.pack_into("<i", wire, 0, bad)
        rejects(bytes(wire), "length_mismatch")
    # Trailing bytes beyond frame_length are ignored, as for every control frame.
    assert isinstance(parse_datagram_untrusted(RSP_SETUP_VECTOR + bytes(12)), ResponseSetup)


def test_setup_asking_for_a_response_channel_matches_aerons_layout() -> None:
    # SETUP of a request publication (response-correlation-id set): flag 0x80 at offset 5
    # (SetupFlyweight.SEND_RESPONSE_SETUP_FLAG; the GROUP flag is 0x40).
    vector = bytes.fromhex(
        "28000000" "00" "80" "0500"  # frame_length 40, version 0, flags 0x80, type SETUP
        "00000000"  # term offset 0
        "78563412"  # session id
        "e9030000"  # stream id 1001
        "0a000000"  # initial term id 10
        "0b000000"  # active term id 11
        "00000100"  # term length 64 KiB
        "80050000"  # mtu 1408
        "00000000"  # ttl 0
    )
    setup = Setup(
        term_offset=0,
        session_id=0x12345678,
        stream_id=1001,
        initial_term_id=10,
        active_term_id=11,
        term_length=65536,
        mtu=1408,
        flags=SETUP_SEND_RESPONSE_FLAG,
    )
    assert SETUP_SEND_RESPONSE_FLAG == 0x80
    assert setup.encode() == vector
    assert parse_datagram_untrusted(vector) == setup


def test_error_frame_group_tag_flag_follows_group_tag() -> None:
    plain = ErrorFrame(
        session_id=1, stream_id=2, receiver_id=3, error_code=13, message="x", flags=0xFF
    )
    assert plain.flags == 0xFF & ~ERR_HAS_GROUP_TAG_FLAG
    tagged = ErrorFrame(
        session_id=1, stream_id=2, receiver_id=3, error_code=13, message="x", group_tag=9
    )
    assert tagged.flags == ERR_HAS_GROUP_TAG_FLAG
    fields = ERR_STRUCT.unpack_from(tagged.encode())
    assert fields[2] == ERR_HAS_GROUP_TAG_FLAG and fields[7] == 9 and fields[9] == 1
    # A tag on the wire without the flag means nothing (ErrorFlyweight.hasGroupTag).
    wire = bytearray(tagged.encode())
    wire[5] = 0
    assert parse_datagram_untrusted(bytes(wire)) == attrs.evolve(tagged, group_tag=None)


def test_error_frame_rejects_bad_messages_locally() -> None:
    with pytest.raises(ValueError, match="ASCII"):
        ErrorFrame(session_id=1, stream_id=2, receiver_id=3, error_code=1, message="é")
    with pytest.raises(ValueError, match="1023"):
        ErrorFrame(session_id=1, stream_id=2, receiver_id=3, error_code=1, message="x" * 1024)
    ErrorFrame(session_id=1, stream_id=2, receiver_id=3, error_code=1, message="x" * 1023)


def test_encode_out_of_range_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="cannot encode"):
        Nak(session_id=2**31, stream_id=0, term_id=0, term_offset=0, length=0).encode()
    with pytest.raises(ValueError, match="cannot encode"):
        DataHeader(
            frame_length=0, flags=256, term_offset=0, session_id=0, stream_id=0, term_id=0
        ).encode()


def test_status_message_flags() -> None:
    sm = StatusMessage(
        session_id=0,
        stream_id=0,
        consumption_term_id=0,
        consumption_term_offset=0,
        receiver_window=0,
        receiver_id=1,
        flags=SM_SETUP_FLAG,
    )
    assert sm.is_setup_eliciting and not sm.is_end_of_stream
    eos = attrs.evolve(sm, flags=SM_EOS_FLAG)
    assert eos.is_end_of_stream and not eos.is_setup_eliciting


def test_align() -> None:
    assert [align(n) for n in (0, 1, 31, 32, 33, 46, 532)] == [0, 32, 32, 32, 64, 64, 544]
    assert align(5, 8) == 8


# ---------------------------------------------------------------------------------------------
# Data chains built by hand


def chain(
    payload_lengths: list[int],
    *,
    pad: int | None = None,
    term_offset: int = 0,
    session_id: int = 11,
    stream_id: int = 22,
    term_id: int = 33,
) -> tuple[bytes, list[DataHeader]]:
    """A datagram of contiguous DATA frames (and a trailing PAD header) as Aeron's sender sends."""
    wire = bytearray()
    headers = []
    offset = term_offset
    for index, payload_length in enumerate(payload_lengths):
        header = DataHeader(
            frame_length=32 + payload_length,
            flags=0xC0,
            term_offset=offset,
            session_id=session_id,
            stream_id=stream_id,
            term_id=term_id,
            reserved_value=index,
        )
        frame = header.encode() + bytes([index % 251 + 1]) * payload_length
        wire += frame + bytes(align(len(frame)) - len(frame))
        headers.append(header)
        offset += align(header.frame_length)
    if pad is not None:
        header = DataHeader(
            frame_length=pad,
            flags=0xC0,
            term_offset=offset,
            session_id=session_id,
            stream_id=stream_id,
            term_id=term_id,
            type=FrameType.PAD,
        )
        wire += header.encode()
        headers.append(header)
    return bytes(wire), headers


@given(
    lengths=st.lists(st.integers(0, 1400), max_size=8),
    pad=st.none() | st.integers(1, 2048).map(lambda n: n * 32),
    term_offset=st.integers(0, 2**20).map(lambda n: n * 32),
)
def test_valid_chains_decode(lengths: list[int], pad: int | None, term_offset: int) -> None:
    assume(lengths or pad is not None)
    wire, headers = chain(lengths, pad=pad, term_offset=term_offset)
    assert parse_datagram_untrusted(wire) == headers[0]
    assert list(iter_data_frames_untrusted(wire)) == headers


def rejects(data: bytes | bytearray, reason: str) -> FrameError:
    with pytest.raises(FrameError) as info:
        parse_datagram_untrusted(bytes(data))
    assert info.value.reason == reason, info.value
    assert str(info.value).startswith(reason + ": ")
    return info.value


def test_rejects_short_datagrams() -> None:
    for length in range(8):
        rejects(bytes(length), "too_short")
    setup = Setup(
        term_offset=0,
        session_id=1,
        stream_id=2,
        initial_term_id=3,
        active_term_id=3,
        term_length=65536,
        mtu=1408,
    ).encode()
    rejects(setup[:39], "too_short")
    sm = StatusMessage(
        session_id=1,
        stream_id=2,
        consumption_term_id=3,
        consumption_term_offset=0,
        receiver_window=4,
        receiver_id=5,
    ).encode()
    rejects(sm[:35], "too_short")
    rejects(
        Nak(session_id=1, stream_id=2, term_id=3, term_offset=0, length=32).encode()[:27],
        "too_short",
    )
    rttm = Rttm(session_id=1, stream_id=2, echo_timestamp_ns=3, reception_delta_ns=0, receiver_id=4)
    rejects(rttm.encode()[:39], "too_short")
    err = ErrorFrame(session_id=1, stream_id=2, receiver_id=3, error_code=1, message="")
    rejects(err.encode()[:39], "too_short")
    rejects(
        DataHeader(
            frame_length=0, flags=0xC0, term_offset=0, session_id=1, stream_id=2, term_id=3
        ).encode()[:31],
        "too_short",
    )


def test_rejects_bad_version() -> None:
    wire, _ = chain([10])
    rejects(wire[:4] + b"\x01" + wire[5:], "bad_version")
    # A later frame in the chain too.
    wire, _ = chain([10, 10])
    rejects(wire[:68] + b"\x02" + wire[69:], "bad_version")


@pytest.mark.parametrize(
    "frame_type",
    [
        FrameType.RES,
        FrameType.ATS_DATA,
        FrameType.ATS_SM,
        FrameType.ATS_SETUP,
        FrameType.EXT,
        12,
        0x7FFF,
    ],
)
def test_rejects_unknown_and_unsupported_types(frame_type: int) -> None:
    wire = COMMON_HEADER_STRUCT.pack(64, 0, 0, frame_type) + bytes(56)
    error = rejects(wire, "unknown_type")
    assert f"{int(frame_type):#x}" in str(error)


def test_rejects_control_frame_length_mismatch() -> None:
    nak = bytearray(Nak(session_id=1, stream_id=2, term_id=3, term_offset=0, length=32).encode())
    for bad in (0, 27, 29, -1, 2**31 - 1):
        struct.pack_into("<i", nak, 0, bad)
        rejects(nak, "length_mismatch")
    # frame_length may be shorter than the datagram (trailing bytes ignored, as in Aeron C).
    struct.pack_into("<i", nak, 0, 28)
    assert isinstance(parse_datagram_untrusted(bytes(nak) + bytes(4)), Nak)
    sm = bytearray(
        StatusMessage(
            session_id=1,
            stream_id=2,
            consumption_term_id=3,
            consumption_term_offset=0,
            receiver_window=4,
            receiver_id=5,
            group_tag=6,
        ).encode()
    )
    struct.pack_into("<i", sm, 0, 45)
    rejects(sm, "length_mismatch")
    # frame_length 36 in a 44-byte datagram: no group tag.
    struct.pack_into("<i", sm, 0, 36)
    decoded = parse_datagram_untrusted(bytes(sm))
    assert isinstance(decoded, StatusMessage) and decoded.group_tag is None


def test_rejects_bad_error_frames() -> None:
    err = bytearray(
        ErrorFrame(session_id=1, stream_id=2, receiver_id=3, error_code=1, message="abc").encode()
    )
    bad = bytearray(err)
    struct.pack_into("<i", bad, 36, 4)  # message longer than frame_length
    rejects(bad, "length_mismatch")
    struct.pack_into("<i", bad, 36, -1)
    rejects(bad, "bad_field")
    struct.pack_into("<i", bad, 36, 2000)
    rejects(bad, "bad_field")
    bad = bytearray(err)
    bad[41] = 0xC3
    rejects(bad, "bad_field")
    bad = bytearray(err)
    struct.pack_into("<i", bad, 0, 44)
    rejects(bad, "length_mismatch")


def test_rejects_misaligned_data() -> None:
    wire, _ = chain([14])
    rejects(wire + bytes(1), "bad_alignment")
    rejects(wire[:-1], "bad_alignment")
    rejects(wire[:33], "bad_alignment")
    wire, _ = chain([14], term_offset=64)
    shifted = bytearray(wire)
    struct.pack_into("<i", shifted, 8, 65)
    rejects(shifted, "bad_alignment")
    wire, _ = chain([], pad=100 * 32)
    struct.pack_into("<i", (pad := bytearray(wire)), 0, 100 * 32 + 1)
    rejects(pad, "bad_alignment")


def test_rejects_negative_term_offset() -> None:
    wire = bytearray(chain([14])[0])
    struct.pack_into("<i", wire, 8, -32)
    rejects(wire, "bad_field")


def test_rejects_bad_data_frame_lengths() -> None:
    for bad in (1, 31, -32, -(2**31), 2**31 - 1, 65, 97):
        wire = bytearray(chain([14])[0])  # 64 bytes on the wire
        struct.pack_into("<i", wire, 0, bad)
        rejects(wire, "length_mismatch")
    # PAD shorter than a header.
    wire = bytearray(chain([], pad=64)[0])
    struct.pack_into("<i", wire, 0, 0)
    rejects(wire, "length_mismatch")
    # A zero slot after a frame is not a frame (a PAD of length 0).
    rejects(chain([14])[0] + bytes(32), "bad_data_chain")
    rejects(chain([14], session_id=0, stream_id=0, term_id=0)[0] + bytes(32), "bad_data_chain")


def test_rejects_broken_chains() -> None:
    # Heartbeat padded or followed by frames.
    heartbeat = DataHeader(
        frame_length=0, flags=0xC0, term_offset=0, session_id=1, stream_id=2, term_id=3
    ).encode()
    rejects(heartbeat + bytes(32), "bad_data_chain")
    rejects(heartbeat + heartbeat, "bad_data_chain")
    # A heartbeat inside a chain.
    wire, _ = chain([14, 14])
    struct.pack_into("<i", (broken := bytearray(wire)), 64, 0)
    rejects(broken, "length_mismatch")
    # Second frame with another session, stream or term.
    for field_offset in (12, 16, 20):
        broken = bytearray(wire)
        struct.pack_into("<i", broken, 64 + field_offset, 99)
        rejects(broken, "bad_data_chain")
    # Non-contiguous term offsets.
    for bad in (0, 32, 96, 128):
        broken = bytearray(wire)
        struct.pack_into("<i", broken, 64 + 8, bad)
        rejects(broken, "bad_data_chain")
    # A control frame type in the middle of data.
    broken = bytearray(wire)
    struct.pack_into("<H", broken, 64 + 6, FrameType.SM)
    rejects(broken, "bad_data_chain")
    # PAD not last.
    pad_then_data = chain([], pad=64)[0] + chain([14], term_offset=64)[0]
    rejects(pad_then_data, "bad_data_chain")
    wire, _ = chain([14, 14], pad=64)
    rejects(wire + bytes(32), "bad_data_chain")
    # DATA frame overrunning the datagram.
    rejects(chain([100])[0][:64], "length_mismatch")


def test_iter_data_frames_rejects_control_datagrams() -> None:
    nak = Nak(session_id=1, stream_id=2, term_id=3, term_offset=0, length=32).encode()
    with pytest.raises(FrameError) as info:
        iter_data_frames_untrusted(nak)
    assert info.value.reason == "not_data"
    with pytest.raises(FrameError):
        iter_data_frames_untrusted(bytes(7))


def test_frame_error_is_a_value_error_with_reason() -> None:
    error = FrameError("too_short", "3 bytes")
    assert isinstance(error, ValueError)
    assert (error.reason, error.detail, str(error)) == (
        "too_short",
        "3 bytes",
        "too_short: 3 bytes",
    )


# ---------------------------------------------------------------------------------------------
# Fuzz: untrusted bytes raise FrameError and nothing else

KNOWN_REASONS = {
    "too_short",
    "bad_version",
    "length_mismatch",
    "unknown_type",
    "bad_alignment",
    "bad_data_chain",
    "bad_field",
}


def parse_or_reason(data: bytes | bytearray) -> Frame | str:
    try:
        frame = parse_datagram_untrusted(data)
    except FrameError as error:
        assert error.reason in KNOWN_REASONS
        return error.reason
    # Whatever is accepted is self-consistent.
    if isinstance(frame, DataHeader):
        headers = list(iter_data_frames_untrusted(data))
        assert headers[0] == frame
        assert frame.encode() == bytes(data[:32])
    else:
        wire = frame.encode()
        assert parse_datagram_untrusted(wire) == frame
        if not isinstance(frame, ErrorFrame):  # ERR's group tag bytes mean nothing unflagged
            assert wire[4:] == bytes(data[4 : len(wire)])
    return frame


@settings(max_examples=500)
@given(st.binary(max_size=200))
@example(b"")
@example(bytes(32))
def test_fuzz_random_bytes(data: bytes) -> None:
    parse_or_reason(data)


@settings(max_examples=300)
@given(
    st.sampled_from(
        [
            FrameType.DATA,
            FrameType.PAD,
            FrameType.SM,
            FrameType.SETUP,
            FrameType.NAK,
            FrameType.RTTM,
            FrameType.ERR,
            FrameType.RSP_SETUP,
        ]
    ),
    st.integers(-(2**31), 2**31 - 1),
    st.binary(min_size=0, max_size=120),
)
def test_fuzz_valid_headers_with_random_bodies(
    frame_type: int, frame_length: int, body: bytes
) -> None:
    parse_or_reason(COMMON_HEADER_STRUCT.pack(frame_length, 0, 0xC0, frame_type) + body)


@cache
def sample_datagrams() -> list[bytes]:
    """One datagram of each layout in the captures (distinct lengths and types)."""
    chosen: dict[tuple[int, int], bytes] = {}
    for _, record in all_records():
        key = (len(record.payload), record.payload[6])
        chosen.setdefault(key, record.payload)
    return list(chosen.values())


INTERESTING_I32 = [0, 1, -1, 31, 32, 33, 2**31 - 1, -(2**31), 65536, 65504]


def mutate(data: bytes, draw: Callable[[st.SearchStrategy[Any]], Any]) -> bytes:
    buffer = bytearray(data)
    kind = draw(st.sampled_from(["flip", "truncate", "extend", "int32", "version", "type"]))
    if len(buffer) < 8:
        kind = "extend"
    if kind == "flip":
        for _ in range(int(draw(st.integers(1, 4)))):
            index = int(draw(st.integers(0, len(buffer) - 1)))
            buffer[index] ^= int(draw(st.integers(1, 255)))
    elif kind == "truncate":
        del buffer[int(draw(st.integers(0, len(buffer) - 1))) :]
    elif kind == "extend":
        buffer += bytes(draw(st.binary(min_size=1, max_size=64)))
    elif kind == "int32":
        offset = int(draw(st.integers(0, (len(buffer) - 4) // 4))) * 4
        value = draw(st.sampled_from(INTERESTING_I32) | st.integers(-(2**31), 2**31 - 1))
        struct.pack_into("<i", buffer, offset, value)
    elif kind == "version":
        buffer[4] = int(draw(st.integers(1, 255)))
    else:
        struct.pack_into("<H", buffer, 6, int(draw(st.integers(0, 0xFFFF))))
    return bytes(buffer)


@settings(max_examples=1000, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fuzz_mutated_real_frames(data: st.DataObject) -> None:
    original = data.draw(st.sampled_from(sample_datagrams()))
    mutated = original
    for _ in range(data.draw(st.integers(1, 3))):
        if not mutated:
            break
        mutated = mutate(mutated, data.draw)
    parse_or_reason(mutated)


@pytest.mark.parametrize("index", range(len(INTERESTING_I32)))
def test_every_header_int_of_real_frames_set_to_extremes(index: int) -> None:
    """Deterministic sweep: each aligned int32 of each sample set to an edge value."""
    value = INTERESTING_I32[index]
    for original in sample_datagrams():
        for offset in range(0, min(len(original), 64) - 3, 4):
            buffer = bytearray(original)
            struct.pack_into("<i", buffer, offset, value)
            parse_or_reason(buffer)
            parse_or_reason(buffer[: offset + 2])


def test_frame_length_max_int_is_rejected_for_every_sample() -> None:
    for original in sample_datagrams():
        buffer = bytearray(original)
        struct.pack_into("<i", buffer, 0, 2**31 - 1)
        with pytest.raises(FrameError) as info:
            parse_datagram_untrusted(buffer)
        assert info.value.reason in ("length_mismatch", "bad_alignment")
