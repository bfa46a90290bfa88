"""echo.codec.Buffer: every push reads back with its pull, byte for byte as struct and LEB128
write them, and every failure is a CodecError (or the codec's own subclass), never an
IndexError or a struct.error."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from echo.codec import MAX_VARINT, Buffer, CodecError

# (push, pull, values, the bytes struct writes for a value, or None for a prefixed form)
FIXED = [
    ("uint8", st.integers(0, 0xFF), ">B"),
    ("uint16", st.integers(0, 0xFFFF), ">H"),
    ("uint32", st.integers(0, 0xFFFF_FFFF), ">I"),
    ("uint64", st.integers(0, 2**64 - 1), ">Q"),
    ("int64", st.integers(-(2**63), 2**63 - 1), ">q"),
]
PREFIXED: list[tuple[str, Any]] = [
    ("bytes8", st.binary(max_size=255)),
    ("bytes16", st.binary(max_size=600)),
    ("bytes_varint", st.binary(max_size=600)),
    ("str8", st.text(max_size=60).filter(lambda s: len(s.encode()) <= 255)),
    ("str16", st.text(max_size=300)),
    ("varint", st.integers(0, MAX_VARINT)),
]
KINDS = [name for name, _, _ in FIXED] + [name for name, _ in PREFIXED]
STRATEGY = {name: s for name, s, _ in FIXED} | dict(PREFIXED)


def leb128(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


@pytest.mark.parametrize(("name", "values", "fmt"), FIXED, ids=[f[0] for f in FIXED])
@given(data=st.data())
def test_fixed_width_integers_are_big_endian_struct(
    name: str, values: Any, fmt: str, data: st.DataObject
) -> None:
    value = data.draw(values)
    buf = Buffer()
    getattr(buf, f"push_{name}")(value)
    assert buf.data == struct.pack(fmt, value)
    reader = Buffer(buf.data)
    assert getattr(reader, f"pull_{name}")() == value
    assert reader.eof()


@given(st.integers(0, MAX_VARINT))
def test_varints_are_leb128(value: int) -> None:
    buf = Buffer()
    buf.push_varint(value)
    assert buf.data == leb128(value)
    assert len(buf.data) <= 9


@given(st.binary(max_size=300), st.text(max_size=80))
def test_prefixed_forms(raw: bytes, text: str) -> None:
    buf = Buffer()
    buf.push_bytes16(raw)
    buf.push_bytes_varint(raw)
    buf.push_str16(text)
    encoded = text.encode()
    assert buf.data == (
        struct.pack(">H", len(raw))
        + raw
        + leb128(len(raw))
        + raw
        + struct.pack(">H", len(encoded))
        + encoded
    )


@given(
    st.lists(st.sampled_from(KINDS), max_size=12).flatmap(
        lambda kinds: st.tuples(st.just(kinds), st.tuples(*(STRATEGY[k] for k in kinds)))
    )
)
def test_any_sequence_round_trips_and_every_prefix_is_refused(
    case: tuple[list[str], tuple[Any, ...]],
) -> None:
    kinds, values = case
    buf = Buffer()
    for kind, value in zip(kinds, values, strict=True):
        getattr(buf, f"push_{kind}")(value)
    data = buf.data
    assert len(buf) == len(data)
    reader = Buffer(memoryview(data))
    assert [getattr(reader, f"pull_{kind}")() for kind in kinds] == list(values)
    reader.check_end()
    assert reader.tell() == len(data) and reader.remaining == 0
    for cut in range(len(data)):
        short = Buffer(data[:cut])
        with pytest.raises(CodecError):
            for kind in kinds:
                getattr(short, f"pull_{kind}")()
            short.check_end()


@given(st.binary(max_size=64), st.lists(st.sampled_from([*KINDS, "bytes"]), max_size=20))
def test_any_bytes_raise_only_codec_error(data: bytes, kinds: list[str]) -> None:
    reader = Buffer(data)
    try:
        for kind in kinds:
            if kind == "bytes":
                reader.pull_bytes(3)
            else:
                getattr(reader, f"pull_{kind}")()
    except CodecError:
        return


def test_truncation_says_where() -> None:
    reader = Buffer(b"\x00\x01\x02")
    assert reader.pull_uint8() == 0
    with pytest.raises(CodecError, match="truncated at byte 1: a field of 4 bytes runs past"):
        reader.pull_uint32()
    assert reader.tell() == 1  # a failed read consumes nothing
    with pytest.raises(CodecError, match="truncated varint"):
        Buffer(b"\x80\x80").pull_varint()
    with pytest.raises(CodecError, match="longer than 9 bytes"):
        Buffer(b"\xff" * 10).pull_varint()
    with pytest.raises(CodecError, match="2 trailing bytes"):
        Buffer(b"ab").check_end()
    with pytest.raises(CodecError, match="invalid UTF-8"):
        Buffer(b"\x02\xc3\x28").pull_str8()
    with pytest.raises(CodecError, match="negative"):
        Buffer(b"ab").pull_bytes(-1)
    with pytest.raises(CodecError, match="outside"):
        Buffer(b"ab").seek(3)


@pytest.mark.parametrize(
    ("push", "value", "why"),
    [
        ("push_uint8", 256, "does not fit a uint8"),
        ("push_uint8", -1, "does not fit a uint8"),
        ("push_uint16", 1 << 16, "does not fit a uint16"),
        ("push_uint32", 1 << 32, "does not fit a uint32"),
        ("push_uint64", 1 << 64, "does not fit a uint64"),
        ("push_int64", 1 << 63, "does not fit a int64"),
        ("push_varint", MAX_VARINT + 1, "does not fit a varint"),
        ("push_varint", -1, "does not fit a varint"),
        ("push_uint8", True, "does not fit"),
        ("push_uint16", 1.0, "does not fit"),
        ("push_bytes8", b"x" * 256, "do not fit a bytes8"),
        ("push_bytes16", b"x" * 65536, "do not fit a bytes16"),
        ("push_str8", "é" * 128, "does not fit a str8"),
        ("push_str16", "x" * 65536, "does not fit a str16"),
        ("push_str8", "\ud800", "not encodable as UTF-8"),
        ("push_str8", b"bytes", "expected a str"),
    ],
)
def test_values_that_do_not_fit_are_refused(push: str, value: Any, why: str) -> None:
    buf = Buffer()
    with pytest.raises(CodecError, match=why):
        getattr(buf, push)(value)
    assert buf.data == b""


def test_a_codec_passes_its_own_error_type() -> None:
    class MyError(CodecError):
        pass

    with pytest.raises(MyError, match="truncated"):
        Buffer(b"", error=MyError).pull_uint16()
    with pytest.raises(MyError):
        Buffer(error=MyError).push_uint8(300)
    assert issubclass(CodecError, ValueError)


def test_every_codec_of_echo_raises_a_codec_error() -> None:
    from echo.channels.wire import WireError
    from echo.lobby.hello import HelloError
    from echo.lobby.protocol import LobbyProtocolError
    from echo.tickets import TicketError

    for error in (WireError, HelloError, LobbyProtocolError, TicketError):
        assert issubclass(error, CodecError)
