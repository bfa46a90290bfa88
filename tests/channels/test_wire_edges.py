"""The channels wire at its edges: the hot paths' bounds (one-byte channels, one- and two-byte
lengths) against the general LEB128 encoding on both sides of each bound, every frame kind's
exact bytes, the reference count's bound, and the words of each refusal. These kill mutants of
echo.channels.wire that the behaviour tests let through (./dev mutate channels;
docs/mutation.md)."""

from __future__ import annotations

import pytest

from echo.channels.wire import (
    Absolve,
    AnnounceDropping,
    Apologise,
    Bind,
    Data,
    FreeHandle,
    Guarantee,
    HandleRef,
    LimitReceiving,
    LimitSending,
    Plead,
    WireError,
    decode_frame,
    decode_frames,
    decode_frames_raw,
    encode,
    message_size,
    plain_header,
)


def _leb128(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


@pytest.mark.parametrize("channel", [0, 0x7F, 0x80, 0x3FFF, 0x4000])
@pytest.mark.parametrize("size", [0, 1, 0x7F, 0x80, 0x3FFF, 0x4000, 0x4001])
def test_a_plain_message_is_kind_leb128_channel_leb128_length_payload(
    channel: int, size: int
) -> None:
    payload = bytes(i % 251 for i in range(size))
    wire = b"\x01" + _leb128(channel) + _leb128(size) + payload
    assert plain_header(channel, size) + payload == wire
    assert encode(Data(channel, payload)) == wire
    assert decode_frames(wire) == [Data(channel, payload)]
    assert decode_frames_raw(wire + wire) == [(channel, payload), (channel, payload)]
    assert decode_frame(b"\x00" + wire, 1) == ((channel, payload), len(wire) + 1)


def test_every_control_frame_has_its_exact_bytes() -> None:
    frames = {
        Guarantee(0x80, 1): b"\x10\x80\x01\x01",
        Absolve(1, 0x80): b"\x11\x01\x80\x01",
        Plead(2, 3): b"\x12\x02\x03",
        LimitSending(4, 0x4000): b"\x13\x04\x80\x80\x01",
        LimitReceiving(5, 6): b"\x14\x05\x06",
        AnnounceDropping(0x81): b"\x15\x81\x01",
        Apologise(7): b"\x16\x07",
        FreeHandle(8, 9, True): b"\x17\x08\x13",
        FreeHandle(8, 9, False): b"\x17\x08\x12",
        Bind(3, b"v"): b"\x03\x03\x01v",
        Data(2, b"p", (HandleRef(3, 4, True), HandleRef(5, 0x40, False))): (
            b"\x02\x02\x02\x03\x09\x05\x80\x01\x01p"
        ),
    }
    for frame, wire in frames.items():
        assert encode(frame) == wire, frame
        assert decode_frames(wire) == [frame]
        assert decode_frame(b"\x99" + wire, 1) == (frame, len(wire) + 1)


def test_the_sizes_a_receiver_counts() -> None:
    assert message_size(Bind(1, b"")) == 1
    assert message_size(Bind(1, b"abc")) == 3
    assert message_size(Data(1, b"")) == 1
    assert message_size(Data(1, b"ab")) == 2
    assert message_size(Data(1, b"", (HandleRef(1, 1, True),))) == 2
    assert message_size(Data(1, b"abc", (HandleRef(1, 1, True),) * 2)) == 7


def test_the_hot_path_stops_where_the_message_does() -> None:
    # a length that runs past the end takes the general path, which refuses it in words
    with pytest.raises(WireError, match=r"^truncated"):
        decode_frames(b"\x01\x05\x04abc")
    # a two-byte length whose second byte continues is a three-byte length
    wire = b"\x01\x05" + _leb128(0x4000) + bytes(0x4000)
    assert decode_frames(wire) == [Data(5, bytes(0x4000))]
    # a three-byte frame at the very end: channel, empty payload
    assert decode_frames(b"\x16\x01\x01\x05\x00") == [Apologise(1), Data(5, b"")]
    # a length byte that continues, at the very end: refused in words, never an IndexError
    with pytest.raises(WireError, match=r"^truncated"):
        decode_frames(b"\x01\x05\x80")
    # a two-byte length of 1 with no byte after it
    with pytest.raises(WireError):
        decode_frames(b"\x01\x05\x81\x00")


def test_a_reference_count_is_bounded_by_the_bytes_left() -> None:
    # two references take at least four bytes: exactly four are enough
    wire = b"\x02\x01\x02\x01\x02\x01\x02"
    with pytest.raises(WireError, match=r"^truncated"):
        decode_frames(wire)  # (no payload length after them)
    assert decode_frames(wire + b"\x00") == [
        Data(1, b"", (HandleRef(1, 1, False), HandleRef(1, 1, False)))
    ]
    with pytest.raises(WireError, match=r"^bad reference count 3$"):
        decode_frames(b"\x02\x01\x03\x01\x02\x01\x02")
    with pytest.raises(WireError, match=r"^bad reference count 0$"):
        decode_frames(b"\x02\x01\x00\x00")


def test_refusals_in_words() -> None:
    with pytest.raises(WireError, match=r"^empty message$"):
        decode_frames(b"")
    with pytest.raises(WireError, match=r"^unknown frame kind 0x04$"):
        decode_frames(b"\x04")
    with pytest.raises(WireError, match=r"^unknown frame kind 0xff$"):
        decode_frames(b"\x16\x01\xff")
