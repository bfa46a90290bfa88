"""The JSON form of each binary field codec of `echo.lobby.protocol` (the table of forms is
`echo.lobby.web.jsonwire`'s docstring): each form dumps a value, loads one from untrusted JSON
(raising only `JsonProtocolError`) and gives its JSON Schema; `_record` and `_form` derive a
message's form from its binary table entry.

Pure module: no trio, no clock, no I/O.
"""

from __future__ import annotations

import base64
import binascii
import enum
import re
from collections.abc import Mapping
from typing import Any, Final

import attrs

from echo.lobby import protocol as p
from echo.lobby.protocol import fields as pf

_JS_SAFE: Final = 2**53 - 1
_U64_PATTERN: Final = "^(0|[1-9][0-9]{0,19})$"
_U64_RE: Final = re.compile(_U64_PATTERN)


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 40 else text[:37] + "..."


class JsonProtocolError(ValueError):
    """Text or an object that is not a lobby JSON message. `request_id` is the message's own
    request id when it could be read (so the refusal can answer it), else 0."""

    def __init__(self, message: str, request_id: int = 0) -> None:
        super().__init__(message)
        self.request_id = request_id



class _J:
    def dump(self, v: Any) -> Any:
        raise NotImplementedError

    def load(self, x: Any, at: str) -> Any:
        raise NotImplementedError

    def schema(self) -> dict[str, Any]:
        raise NotImplementedError


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


class _JInt(_J):
    def __init__(self, low: int, high: int) -> None:
        self.low, self.high = low, high

    def dump(self, v: int) -> int:
        return int(v)

    def load(self, x: Any, at: str) -> int:
        if not _is_int(x) or not self.low <= x <= self.high:
            raise JsonProtocolError(f"{at}: expected an integer in {self.low}..{self.high}")
        return int(x)

    def schema(self) -> dict[str, Any]:
        return {"type": "integer", "minimum": self.low, "maximum": self.high}


class _JU64(_J):
    """Beyond JavaScript's exact integers: a decimal string."""

    def dump(self, v: int) -> str:
        return str(v)

    def load(self, x: Any, at: str) -> int:
        if not isinstance(x, str) or not _U64_RE.match(x) or int(x) > p.U64_MAX:
            raise JsonProtocolError(f"{at}: expected a 64-bit unsigned integer as a string")
        return int(x)

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "pattern": _U64_PATTERN, "maxLength": 20}


class _JBool(_J):
    def dump(self, v: bool) -> bool:
        return bool(v)

    def load(self, x: Any, at: str) -> bool:
        if not isinstance(x, bool):
            raise JsonProtocolError(f"{at}: expected true or false")
        return x

    def schema(self) -> dict[str, Any]:
        return {"type": "boolean"}


def _load_text(x: Any, at: str, max_bytes: int) -> str:
    if not isinstance(x, str):
        raise JsonProtocolError(f"{at}: expected a string")
    try:
        size = len(x.encode("utf-8"))
    except UnicodeEncodeError:
        raise JsonProtocolError(f"{at}: not valid UTF-8 (a lone surrogate)") from None
    if size > max_bytes:
        raise JsonProtocolError(f"{at}: {size} bytes of UTF-8, at most {max_bytes}")
    return x


class _JText(_J):
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes

    def dump(self, v: str) -> str:
        return v

    def load(self, x: Any, at: str) -> str:
        return _load_text(x, at, self.max_bytes)

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "maxLength": self.max_bytes}


def _b64_length(n: int) -> int:
    return (n + 2) // 3 * 4


class _JBytes(_J):
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes

    def dump(self, v: bytes) -> str:
        return base64.b64encode(v).decode("ascii")

    def load(self, x: Any, at: str) -> bytes:
        if not isinstance(x, str) or len(x) > _b64_length(self.max_bytes):
            raise JsonProtocolError(f"{at}: expected base64 of at most {self.max_bytes} bytes")
        try:
            return base64.b64decode(x.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError):
            raise JsonProtocolError(f"{at}: not standard base64") from None

    def schema(self) -> dict[str, Any]:
        return {
            "type": "string",
            "contentEncoding": "base64",
            "pattern": "^[A-Za-z0-9+/]*={0,2}$",
            "maxLength": _b64_length(self.max_bytes),
        }


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class _JEnum(_J):
    def __init__(self, kind: type[enum.IntEnum]) -> None:
        self.kind = kind
        self.by_name = {m.name.lower(): m for m in kind}
        self.what = _snake(kind.__name__).replace("_", " ")

    def dump(self, v: int) -> str:
        return self.kind(v).name.lower()

    def load(self, x: Any, at: str) -> enum.IntEnum:
        member = self.by_name.get(x) if isinstance(x, str) else None
        if member is None:
            raise JsonProtocolError(f"{at}: not a {self.what}: {_short(x)}")
        return member

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "enum": list(self.by_name)}


class _JMap(_J):
    """A metadata or attribute map (values: string or integer), or a change map (also null)."""

    def __init__(self, allow_delete: bool) -> None:
        self.allow_delete = allow_delete

    def dump(self, m: Mapping[str, Any]) -> dict[str, Any]:
        return dict(m)

    def load(self, x: Any, at: str) -> dict[str, Any]:
        if not isinstance(x, dict):
            raise JsonProtocolError(f"{at}: expected an object")
        if len(x) > 255:
            raise JsonProtocolError(f"{at}: at most 255 keys")
        out: dict[str, Any] = {}
        for key, v in x.items():
            _load_text(key, f"{at} key", 255)
            if isinstance(v, str):
                out[key] = _load_text(v, f"{at}.{key}", 0xFFFF)
            elif _is_int(v) and p.I64_MIN <= v <= p.I64_MAX:
                out[key] = v
            elif v is None and self.allow_delete:
                out[key] = None
            else:
                what = (
                    "a string, a 64-bit integer or null"
                    if self.allow_delete
                    else ("a string or a 64-bit integer")
                )
                raise JsonProtocolError(f"{at}.{key}: expected {what}")
        return out

    def schema(self) -> dict[str, Any]:
        values: list[dict[str, Any]] = [
            {"type": "string", "maxLength": 0xFFFF},
            {"type": "integer", "minimum": p.I64_MIN, "maximum": p.I64_MAX},
        ]
        if self.allow_delete:
            values.append({"type": "null"})
        return {
            "type": "object",
            "maxProperties": 255,
            "propertyNames": {"maxLength": 255},
            "additionalProperties": {"anyOf": values},
        }


class _JOptU64(_J):
    def dump(self, v: int | None) -> str | None:
        return None if v is None else str(v)

    def load(self, x: Any, at: str) -> int | None:
        return None if x is None else _JU64().load(x, at)

    def schema(self) -> dict[str, Any]:
        return {"anyOf": [_JU64().schema(), {"type": "null"}]}


class _JList(_J):
    def __init__(self, item: _J, max_items: int) -> None:
        self.item, self.max_items = item, max_items

    def dump(self, v: tuple[Any, ...]) -> list[Any]:
        return [self.item.dump(i) for i in v]

    def load(self, x: Any, at: str) -> tuple[Any, ...]:
        if not isinstance(x, list) or len(x) > self.max_items:
            raise JsonProtocolError(f"{at}: expected an array of at most {self.max_items}")
        return tuple(self.item.load(i, f"{at}[{n}]") for n, i in enumerate(x))

    def schema(self) -> dict[str, Any]:
        return {"type": "array", "maxItems": self.max_items, "items": self.item.schema()}


_REQUIRED: Final = object()


@attrs.frozen
class _Field:
    name: str
    form: _J
    optional: Any = _REQUIRED  # a trailing field's empty value: the key may be left out


class _JRecord(_J):
    """An object with exactly the record's fields (plus `head`: "type" or "kind")."""

    def __init__(self, cls: type, fields: list[_Field], head: tuple[str, str] | None) -> None:
        self.cls, self.fields, self.head = cls, fields, head
        self.names = {f.name for f in fields} | ({head[0]} if head else set())

    def dump(self, v: Any) -> dict[str, Any]:
        out: dict[str, Any] = {self.head[0]: self.head[1]} if self.head else {}
        for f in self.fields:
            value = getattr(v, f.name)
            if f.optional is _REQUIRED or value != f.optional:
                out[f.name] = f.form.dump(value)
        return out

    def load(self, x: Any, at: str) -> Any:
        if not isinstance(x, dict):
            raise JsonProtocolError(f"{at}: expected an object")
        unknown = [k for k in x if k not in self.names]
        if unknown:
            raise JsonProtocolError(f"{at}: unknown field {_short(unknown[0])}")
        values: dict[str, Any] = {}
        for f in self.fields:
            if f.name in x:
                values[f.name] = f.form.load(x[f.name], f"{at}.{f.name}" if at else f.name)
            elif f.optional is not _REQUIRED:
                values[f.name] = f.optional
            else:
                raise JsonProtocolError(f"{at or 'message'}: missing field {f.name!r}")
        return self.cls(**values)

    def schema(self) -> dict[str, Any]:
        props: dict[str, Any] = {self.head[0]: {"const": self.head[1]}} if self.head else {}
        props |= {f.name: f.form.schema() for f in self.fields}
        required = ([self.head[0]] if self.head else []) + [
            f.name for f in self.fields if f.optional is _REQUIRED
        ]
        return {
            "type": "object",
            "properties": props,
            "required": required,
            "additionalProperties": False,
        }


class _JUnion(_J):
    def __init__(self, what: str, kinds: list[_JRecord]) -> None:
        self.what = what
        self.by_kind = {k.head[1]: k for k in kinds if k.head}
        self.by_cls = {k.cls: k for k in kinds}

    def dump(self, v: Any) -> dict[str, Any]:
        record = self.by_cls.get(type(v))
        if record is None:
            raise p.LobbyProtocolError(f"not a {self.what}: {v!r}")
        return record.dump(v)

    def load(self, x: Any, at: str) -> Any:
        kind = x.get("kind") if isinstance(x, dict) else None
        record = self.by_kind.get(kind) if isinstance(kind, str) else None
        if record is None:
            raise JsonProtocolError(
                f"{at}: expected a {self.what} with a kind of {', '.join(self.by_kind)}"
            )
        return record.load(x, at)

    def schema(self) -> dict[str, Any]:
        return {"oneOf": [k.schema() for k in self.by_kind.values()]}


def _record(codec: pf._Record, head: tuple[str, str] | None) -> _JRecord:
    fields = []
    for name, c in codec.fields:
        if isinstance(c, pf._Trailing):
            fields.append(_Field(name, _form(c.codec), optional=c.empty))
        else:
            fields.append(_Field(name, _form(c)))
    return _JRecord(codec.cls, fields, head)


def _form(c: pf._Codec) -> _J:
    """The JSON form of one binary field codec (a codec kind unknown here fails at import)."""
    if isinstance(c, pf._Enum):
        return _JEnum(c.kind)
    if isinstance(c, pf._Int):
        return _JU64() if c.low == 0 and c.high > _JS_SAFE else _JInt(c.low, c.high)
    if isinstance(c, pf._Bool):
        return _JBool()
    if isinstance(c, pf._Text):
        return _JText(255 if c.push.__name__.endswith("str8") else 0xFFFF)
    if isinstance(c, pf._Bytes8 | pf._Bytes16):
        return _JBytes(0xFF if isinstance(c, pf._Bytes8) else 0xFFFF)
    if isinstance(c, pf._Map):
        return _JMap(c.value.allow_delete)
    if isinstance(c, pf._OptU64):
        return _JOptU64()
    if isinstance(c, pf._List):
        return _JList(_form(c.item), c.size.high)
    if isinstance(c, pf._Union):
        return _JUnion(
            c.name, [_record(r, ("kind", _snake(r.cls.__name__))) for r in c.kinds.values()]
        )
    if isinstance(c, pf._Record):
        return _record(c, None)
    raise TypeError(f"no JSON form for the field codec {type(c).__name__}")  # pragma: no cover

