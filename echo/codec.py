"""One binary reader and writer for echo's own codecs, as aioquic's `Buffer` serves all of QUIC.

The lobby protocol (`echo.lobby.protocol`), game announcements (`echo.lobby.games`), the game
tickets (`echo.tickets`) and the logical channels' frames (`echo.channels.wire`) read and write
their bytes through a `Buffer`: big-endian fixed-width integers, unsigned LEB128 varints (at
most 9 bytes, 63 bits), raw bytes, and bytes or UTF-8 strings behind a length prefix.

A `Buffer` made from bytes is read front to back with the ``pull_*`` methods; an empty
`Buffer()` is written with the ``push_*`` methods and `data` is what was written. Every failure,
a read past the end, a value that does not fit its field, bytes that are not UTF-8, is a
`CodecError` (a `ValueError`) whose message says which and where; nothing else escapes (no
`IndexError`, no `struct.error`). A codec with its own error type passes it as `error` (a
subclass of `CodecError`), so that its decoder raises nothing but that type.

Pure: no I/O, no clock. The transport's Aeron frames keep their own codecs
(`echo.transport.core.frames`, `echo.transport.core.wireformat`): they are compiled with
mypyc and tuned for the per-datagram path.
"""

from __future__ import annotations

import struct
from typing import Final

#: Varints are capped at 63 bits (at most 9 bytes): larger values are malformed.
MAX_VARINT: Final = (1 << 63) - 1

_U16: Final = struct.Struct(">H")
_U32: Final = struct.Struct(">I")
_U64: Final = struct.Struct(">Q")
_I64: Final = struct.Struct(">q")


class CodecError(ValueError):
    """Bytes that cannot be read as the codec expects, or a value that does not fit its field."""


class Buffer:
    """Bytes to read (``pull_*``, from `data`) or to write (``push_*``, onto an empty buffer).

    `error` is the exception type raised for every failure: `CodecError` or a subclass of it.
    """

    __slots__ = ("_data", "_error", "_out", "_pos")

    def __init__(
        self,
        data: bytes | bytearray | memoryview = b"",
        *,
        error: type[CodecError] = CodecError,
    ) -> None:
        self._data = data if type(data) is bytes else bytes(data)
        self._pos = 0
        self._out = bytearray()
        self._error = error

    # --- reading -------------------------------------------------------------------------

    def tell(self) -> int:
        """How many bytes have been read."""
        return self._pos

    def seek(self, pos: int) -> None:
        """Read on from byte `pos` (0..len(data))."""
        if not 0 <= pos <= len(self._data):
            raise self._error(f"position {pos} is outside the {len(self._data)} bytes")
        self._pos = pos

    @property
    def remaining(self) -> int:
        """How many bytes are left to read."""
        return len(self._data) - self._pos

    def eof(self) -> bool:
        """Whether every byte has been read."""
        return self._pos == len(self._data)

    def check_end(self) -> None:
        """Raise unless every byte has been read (trailing bytes are an error)."""
        if self._pos != len(self._data):
            raise self._error(f"{len(self._data) - self._pos} trailing bytes")

    def _need(self, n: int) -> int:
        """The position after the next `n` bytes; raises if fewer remain."""
        end = self._pos + n
        if end > len(self._data):
            raise self._error(
                f"truncated at byte {self._pos}: a field of {n} bytes runs past the end "
                f"({len(self._data) - self._pos} left)"
            )
        return end

    def pull_bytes(self, n: int) -> bytes:
        """The next `n` bytes."""
        if n < 0:
            raise self._error(f"a negative length {n}")
        end = self._need(n)
        chunk = self._data[self._pos : end]
        self._pos = end
        return chunk

    def pull_uint8(self) -> int:
        pos = self._pos
        if pos >= len(self._data):
            raise self._error(f"truncated at byte {pos}: a 1-byte field runs past the end")
        self._pos = pos + 1
        return self._data[pos]

    def _pull(self, fmt: struct.Struct) -> int:
        end = self._need(fmt.size)
        value: int = fmt.unpack_from(self._data, self._pos)[0]
        self._pos = end
        return value

    def pull_uint16(self) -> int:
        return self._pull(_U16)

    def pull_uint32(self) -> int:
        return self._pull(_U32)

    def pull_uint64(self) -> int:
        return self._pull(_U64)

    def pull_int64(self) -> int:
        return self._pull(_I64)

    def pull_varint(self) -> int:
        """An unsigned LEB128 varint of at most 9 bytes (63 bits)."""
        data, pos = self._data, self._pos
        if pos < len(data) and data[pos] < 0x80:  # one byte: most lengths and ids
            self._pos = pos + 1
            return data[pos]
        value = 0
        shift = 0
        while True:
            if pos >= len(data):
                raise self._error(f"truncated varint at byte {self._pos}")
            byte = data[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                break
            shift += 7
            if shift > 56:
                raise self._error(f"varint longer than 9 bytes at byte {self._pos}")
        if value > MAX_VARINT:  # pragma: no cover - 9 bytes of 7 bits cannot exceed it
            raise self._error("varint out of range")
        self._pos = pos
        return value

    def pull_bytes8(self) -> bytes:
        """A u8 length and that many bytes."""
        return self.pull_bytes(self.pull_uint8())

    def pull_bytes16(self) -> bytes:
        """A u16 length and that many bytes."""
        return self.pull_bytes(self.pull_uint16())

    def pull_bytes_varint(self) -> bytes:
        """A varint length and that many bytes."""
        return self.pull_bytes(self.pull_varint())

    def _text(self, raw: bytes) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self._error(f"invalid UTF-8: {exc.reason}") from None

    def pull_str8(self) -> str:
        """A u8 length and that many bytes of UTF-8."""
        return self._text(self.pull_bytes8())

    def pull_str16(self) -> str:
        """A u16 length and that many bytes of UTF-8."""
        return self._text(self.pull_bytes16())

    # --- writing -------------------------------------------------------------------------

    @property
    def data(self) -> bytes:
        """What has been written."""
        return bytes(self._out)

    def __len__(self) -> int:
        """How many bytes have been written."""
        return len(self._out)

    def _check(self, value: int, low: int, high: int, name: str) -> None:
        # The callers test `type(value) is int` and the range first (the common case, cheap)
        # and call this for anything else: an int subclass (an IntEnum) in range passes.
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise self._error(f"{value!r} does not fit a {name} ({low}..{high})")

    def push_bytes(self, data: bytes | bytearray | memoryview) -> None:
        self._out += data

    def push_uint8(self, value: int) -> None:
        if type(value) is not int or not 0 <= value <= 0xFF:
            self._check(value, 0, 0xFF, "uint8")
        self._out.append(value)

    def push_uint16(self, value: int) -> None:
        if type(value) is not int or not 0 <= value <= 0xFFFF:
            self._check(value, 0, 0xFFFF, "uint16")
        self._out += _U16.pack(value)

    def push_uint32(self, value: int) -> None:
        if type(value) is not int or not 0 <= value <= 0xFFFF_FFFF:
            self._check(value, 0, 0xFFFF_FFFF, "uint32")
        self._out += _U32.pack(value)

    def push_uint64(self, value: int) -> None:
        if type(value) is not int or not 0 <= value <= 0xFFFF_FFFF_FFFF_FFFF:
            self._check(value, 0, 0xFFFF_FFFF_FFFF_FFFF, "uint64")
        self._out += _U64.pack(value)

    def push_int64(self, value: int) -> None:
        if type(value) is not int or not -(1 << 63) <= value < (1 << 63):
            self._check(value, -(1 << 63), (1 << 63) - 1, "int64")
        self._out += _I64.pack(value)

    def push_varint(self, value: int) -> None:
        """`value` as an unsigned LEB128 varint (0..MAX_VARINT)."""
        out = self._out
        if type(value) is int and 0 <= value < 0x80:  # one byte: most lengths and ids
            out.append(value)
            return
        self._check(value, 0, MAX_VARINT, "varint")
        while value >= 0x80:
            out.append((value & 0x7F) | 0x80)
            value >>= 7
        out.append(value)

    def _prefixed(self, data: bytes | bytearray | memoryview, high: int, name: str) -> None:
        if len(data) > high:
            raise self._error(f"{len(data)} bytes do not fit a {name} (at most {high})")

    def push_bytes8(self, data: bytes | bytearray | memoryview) -> None:
        """A u8 length and `data` (at most 255 bytes)."""
        self._prefixed(data, 0xFF, "bytes8")
        self._out.append(len(data))
        self._out += data

    def push_bytes16(self, data: bytes | bytearray | memoryview) -> None:
        """A u16 length and `data` (at most 65,535 bytes)."""
        self._prefixed(data, 0xFFFF, "bytes16")
        self._out += _U16.pack(len(data))
        self._out += data

    def push_bytes_varint(self, data: bytes | bytearray | memoryview) -> None:
        """A varint length and `data`."""
        self.push_varint(len(data))
        self._out += data

    def _utf8(self, text: str) -> bytes:
        if not isinstance(text, str):
            raise self._error(f"expected a str, got {text!r}")
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise self._error(f"not encodable as UTF-8: {exc.reason}") from None

    def push_str8(self, text: str) -> None:
        """A u8 length and `text` as UTF-8 (at most 255 bytes)."""
        data = self._utf8(text)
        if len(data) > 0xFF:
            raise self._error(f"string of {len(data)} bytes does not fit a str8")
        self.push_bytes8(data)

    def push_str16(self, text: str) -> None:
        """A u16 length and `text` as UTF-8 (at most 65,535 bytes)."""
        data = self._utf8(text)
        if len(data) > 0xFFFF:
            raise self._error(f"string of {len(data)} bytes does not fit a str16")
        self.push_bytes16(data)
