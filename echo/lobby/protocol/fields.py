"""The lobby protocol's field codecs: each is one field's wire form both ways (the field
encodings of `echo.lobby.protocol`), and the records inside messages described with them.

Pure module: no trio, no clock, no I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs

from echo.codec import Buffer
from echo.lobby.protocol.records import (
    I64_MAX,
    I64_MIN,
    U32_MAX,
    U64_MAX,
    FreeSlots,
    LobbyListing,
    LobbyProtocolError,
    LobbySnapshot,
    MemberState,
    NumberRange,
    Presence,
    SeatTag,
    StringEquals,
)
from echo.lobby.protocol.requests import GameCopy
from echo.lobby.protocol.updates import (
    GameDetails,
)

# --- the codec: one table entry per message type ----------------------------------------------
#
# Each field codec is one field's wire form both ways: `write` checks that the value fits (and
# raises LobbyProtocolError if not), `read` takes it from untrusted bytes (and raises nothing
# but LobbyProtocolError). A record is a class and its fields in order, name -> codec; a message
# is a record with its type byte and channel (`_MESSAGES`). Encoding and decoding both walk the
# same entry, so a new message is one entry, and the two directions cannot disagree. The bytes
# are read and written by `echo.codec.Buffer` (made with error=LobbyProtocolError, so a read past
# the end or trailing bytes raise nothing but LobbyProtocolError).


def _reader(data: bytes | bytearray | memoryview) -> Buffer:
    return Buffer(data, error=LobbyProtocolError)


def _writer() -> Buffer:
    return Buffer(error=LobbyProtocolError)


class _Codec:
    def write(self, w: Buffer, v: Any) -> None:
        raise NotImplementedError

    def read(self, r: Buffer) -> Any:
        raise NotImplementedError


class _Int(_Codec):
    """A big-endian integer (`kind`: the Buffer's uint8, uint16, ... int64), within low..high
    (the kind's range: the Buffer refuses anything else, and bools)."""

    def __init__(self, kind: str, low: int, high: int) -> None:
        self.push: Callable[[Buffer, int], None] = getattr(Buffer, f"push_{kind}")
        self.pull: Callable[[Buffer], int] = getattr(Buffer, f"pull_{kind}")
        self.low = low
        self.high = high

    def write(self, w: Buffer, v: int) -> None:
        self.push(w, v)

    def read(self, r: Buffer) -> int:
        return self.pull(r)


_U8: Final = _Int("uint8", 0, 0xFF)
_U16: Final = _Int("uint16", 0, 0xFFFF)
_U32: Final = _Int("uint32", 0, U32_MAX)
_U64: Final = _Int("uint64", 0, U64_MAX)
_I64: Final = _Int("int64", I64_MIN, I64_MAX)


class _Bool(_Codec):
    """A u8 that is 0 or 1."""

    def write(self, w: Buffer, v: bool) -> None:
        if not isinstance(v, bool):
            raise LobbyProtocolError(f"expected a bool, got {v!r}")
        w.push_uint8(1 if v else 0)

    def read(self, r: Buffer) -> bool:
        b = _U8.read(r)
        if b > 1:
            raise LobbyProtocolError(f"bool byte {b} is neither 0 nor 1")
        return b == 1


class _Text(_Codec):
    """A length (`kind`: str8 or str16, a u8 or a u16) and that many bytes of UTF-8."""

    def __init__(self, kind: str) -> None:
        self.push: Callable[[Buffer, str], None] = getattr(Buffer, f"push_{kind}")
        self.pull: Callable[[Buffer], str] = getattr(Buffer, f"pull_{kind}")

    def write(self, w: Buffer, s: str) -> None:
        self.push(w, s)

    def read(self, r: Buffer) -> str:
        return self.pull(r)


class _Bytes16(_Codec):
    def write(self, w: Buffer, b: bytes) -> None:
        if not isinstance(b, bytes) or len(b) > 0xFFFF:
            raise LobbyProtocolError("expected at most 65535 bytes")
        w.push_bytes16(b)

    def read(self, r: Buffer) -> bytes:
        return r.pull_bytes16()


class _Bytes8(_Codec):
    def write(self, w: Buffer, b: bytes) -> None:
        if not isinstance(b, bytes) or len(b) > 0xFF:
            raise LobbyProtocolError("expected at most 255 bytes")
        w.push_bytes8(b)

    def read(self, r: Buffer) -> bytes:
        return r.pull_bytes8()


class _PublicKey(_Bytes8):
    """An X25519 public key: 32 bytes behind their length byte (one length: one form)."""

    def write(self, w: Buffer, b: bytes) -> None:
        if not isinstance(b, bytes) or len(b) != 32:
            raise LobbyProtocolError("a server key is 32 bytes")
        w.push_bytes8(b)

    def read(self, r: Buffer) -> bytes:
        b = r.pull_bytes8()
        if len(b) != 32:
            raise LobbyProtocolError(f"a server key of {len(b)} bytes, not 32")
        return b


_BOOL: Final = _Bool()
_STR8: Final = _Text("str8")
_STR16: Final = _Text("str16")
_BYTES16: Final = _Bytes16()
_BYTES8: Final = _Bytes8()


class _Enum(_Codec):
    """An `enum.IntEnum` member as an integer; an unknown number read is an error."""

    def __init__(self, kind: type[enum.IntEnum], size: _Int, name: str) -> None:
        self.kind = kind
        self.size = size
        self.name = name

    def write(self, w: Buffer, v: int) -> None:
        self.size.write(w, self.kind(v))

    def read(self, r: Buffer) -> enum.IntEnum:
        b = self.size.read(r)
        try:
            return self.kind(b)
        except ValueError:
            raise LobbyProtocolError(f"unknown {self.name} {b}") from None


_TAG_STR: Final = 0
_TAG_INT: Final = 1
_TAG_DELETE: Final = 2


class _Value(_Codec):
    """u8 tag + body: 0 str16, 1 i64, and (in change maps) 2 delete, written for None."""

    def __init__(self, *, allow_delete: bool) -> None:
        self.allow_delete = allow_delete

    def write(self, w: Buffer, v: str | int | None) -> None:
        if v is None and self.allow_delete:
            _U8.write(w, _TAG_DELETE)
        elif isinstance(v, str):
            _U8.write(w, _TAG_STR)
            _STR16.write(w, v)
        elif isinstance(v, int) and not isinstance(v, bool):
            _U8.write(w, _TAG_INT)
            _I64.write(w, v)
        else:
            raise LobbyProtocolError(f"not a lobby value: {v!r}")

    def read(self, r: Buffer) -> str | int | None:
        tag = _U8.read(r)
        if tag == _TAG_STR:
            return _STR16.read(r)
        if tag == _TAG_INT:
            return _I64.read(r)
        if tag == _TAG_DELETE and self.allow_delete:
            return None
        raise LobbyProtocolError(f"unknown value tag {tag}")


class _Map(_Codec):
    """u8 count + (str8 key, value) pairs; keys unique."""

    def __init__(self, *, allow_delete: bool) -> None:
        self.value = _Value(allow_delete=allow_delete)

    def write(self, w: Buffer, m: Mapping[str, str | int | None]) -> None:
        if len(m) > 255:
            raise LobbyProtocolError(f"a map holds at most 255 keys, not {len(m)}")
        _U8.write(w, len(m))
        for key, v in m.items():
            _STR8.write(w, key)
            self.value.write(w, v)

    def read(self, r: Buffer) -> dict[str, str | int | None]:
        out: dict[str, str | int | None] = {}
        for _ in range(_U8.read(r)):
            key = _STR8.read(r)
            v = self.value.read(r)
            if key in out:
                raise LobbyProtocolError(f"duplicate key {key!r}")
            out[key] = v
        return out


_VALUES: Final = _Map(allow_delete=False)  # metadata, attributes
_CHANGES: Final = _Map(allow_delete=True)  # change maps: None deletes a key


class _OptU64(_Codec):
    """u8 flag + u64 if the flag is 1; None if it is 0."""

    def write(self, w: Buffer, v: int | None) -> None:
        if v is None:
            _U8.write(w, 0)
        else:
            _U8.write(w, 1)
            _U64.write(w, v)

    def read(self, r: Buffer) -> int | None:
        flag = _U8.read(r)
        if flag == 0:
            return None
        if flag == 1:
            return _U64.read(r)
        raise LobbyProtocolError(f"optional flag {flag} is neither 0 nor 1")


_OPT_U64: Final = _OptU64()


class _List(_Codec):
    """A count (`size`) + that many items, as a tuple."""

    def __init__(self, size: _Int, item: _Codec, too_many: str) -> None:
        self.size = size
        self.item = item
        self.too_many = too_many

    def write(self, w: Buffer, items: tuple[Any, ...]) -> None:
        if len(items) > self.size.high:
            raise LobbyProtocolError(self.too_many)
        self.size.write(w, len(items))
        for item in items:
            self.item.write(w, item)

    def read(self, r: Buffer) -> tuple[Any, ...]:
        return tuple(self.item.read(r) for _ in range(self.size.read(r)))


class _Trailing(_Codec):
    """A field added to a message after it shipped: among the message's last fields, left out
    when it and every trailing field after it are empty, so the message without it keeps its
    bytes and old bytes parse as before. The last trailing field present is never empty (one
    message, one form); an empty one before it is written as it is. `_Record` does both, with
    `codec` and `empty`: whether a trailing field is written depends on the fields after it,
    so it has no `write` or `read` of its own."""

    def __init__(self, codec: _Codec, empty: Any) -> None:
        self.codec = codec
        self.empty = empty


class _Record(_Codec):
    """An attrs class and its fields in order, name -> codec (every field, in the class's
    order: checked here, so an entry cannot leave one out or swap two)."""

    def __init__(self, cls: type, **fields: _Codec) -> None:
        names = [f.name for f in attrs.fields(cls)]
        if names != list(fields):
            raise TypeError(f"{cls.__name__}: the table names {list(fields)}, not {names}")
        codecs = list(fields.values())
        first = next((i for i, c in enumerate(codecs) if isinstance(c, _Trailing)), len(codecs))
        if not all(isinstance(c, _Trailing) for c in codecs[first:]):
            raise TypeError(f"{cls.__name__}: only the last fields may be trailing")
        self.cls = cls
        self.fields = tuple(fields.items())
        self._fixed = self.fields[:first]
        self._tail: tuple[tuple[str, _Trailing], ...] = tuple(
            (name, c) for name, c in self.fields[first:] if isinstance(c, _Trailing)
        )

    def write(self, w: Buffer, v: Any) -> None:
        for name, codec in self._fixed:
            codec.write(w, getattr(v, name))
        tail = [(codec, getattr(v, name)) for name, codec in self._tail]
        while tail and tail[-1][1] == tail[-1][0].empty:
            tail.pop()
        for codec, value in tail:
            codec.codec.write(w, value)

    def read(self, r: Buffer) -> Any:
        values = {name: codec.read(r) for name, codec in self._fixed}
        last: tuple[_Trailing, Any] | None = None
        for name, codec in self._tail:
            if r.eof():
                values[name] = codec.empty
            else:
                values[name] = codec.codec.read(r)
                last = (codec, values[name])
        if last is not None and last[1] == last[0].empty:
            raise LobbyProtocolError("an empty trailing field is left out, not sent")
        return self.cls(**values)


class _Union(_Codec):
    """u8 kind + that kind's record."""

    def __init__(self, name: str, kinds: Mapping[int, _Record]) -> None:
        self.name = name
        self.kinds = dict(kinds)

    def write(self, w: Buffer, v: Any) -> None:
        for kind, record in self.kinds.items():
            if isinstance(v, record.cls):
                _U8.write(w, kind)
                record.write(w, v)
                return
        raise LobbyProtocolError(f"not a {self.name}: {v!r}")

    def read(self, r: Buffer) -> Any:
        kind = _U8.read(r)
        record = self.kinds.get(kind)
        if record is None:
            raise LobbyProtocolError(f"unknown {self.name} kind {kind}")
        return record.read(r)


# fmt: off
_FILTERS: Final = _List(_U8, _Union("filter", {
    0: _Record(StringEquals, key=_STR8, value=_STR16),
    1: _Record(NumberRange, key=_STR8, low=_I64, high=_I64),
    2: _Record(FreeSlots, minimum=_U16),
}), "at most 255 filters")
_PRESENCE: Final = _Enum(Presence, _U8, "presence")
_MEMBER: Final = _Record(MemberState, member_id=_STR8, join_seq=_U32, ready=_BOOL,
                         presence=_PRESENCE, attributes=_VALUES)
_SNAPSHOT: Final = _Record(
    LobbySnapshot, lobby_id=_U64, version=_U64, name=_STR8, max_members=_U16, private=_BOOL,
    join_code=_STR8, locked=_BOOL, owner=_STR8, metadata=_VALUES,
    bans=_List(_U8, _STR8, "at most 255 bans"), members=_List(_U16, _MEMBER, "too many members"),
)
_SEAT_TAG_LIST: Final = _List(_U16, _Record(SeatTag, member_id=_STR8, tag=_BYTES8),
                              "too many seat tags")
_LISTING: Final = _Record(LobbyListing, lobby_id=_U64, name=_STR8, member_count=_U16,
                          max_members=_U16, metadata=_VALUES, home=_STR8)
_GAME_DETAILS: Final = _Record(GameDetails, match_id=_U64, control_port=_U16,
                               duologue_ports=_STR8, server_key=_Trailing(_PublicKey(), b""))
_GAME_COPY: Final = _Record(GameCopy, ticket=_BYTES16, life_ms=_U32)
# fmt: on
