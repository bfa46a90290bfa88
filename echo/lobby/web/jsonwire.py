"""The lobby's JSON protocol: every binary lobby message as one JSON object, derived from the
message table of `echo.lobby.protocol`.

A WebSocket member (`echo.lobby.web.door`) sends and receives one JSON object per text frame:
``{"type": "join_lobby", "request_id": 7, "lobby_id": "4611686018427387905"}``. ``type`` is the
binary message's name in lower case; the other keys are exactly the fields of its record, in
the JSON form of their field codec. Nothing here is written per message: each field codec of
the binary table has one JSON form, so a message added to the table has its JSON form (and its
JSON Schema) at once.

==============  ==============================================================================
binary codec    JSON form
==============  ==============================================================================
u8/u16/u32      integer within the field's range
u64             decimal string ("0".."18446744073709551615"): ids, versions and cursors are
                64-bit, and a JavaScript number holds integers exactly only up to 2^53
i64             integer (metadata and attribute values, number-range bounds)
bool            true / false
str8 / str16    string of at most 255 / 65,535 bytes of UTF-8
bytes8/bytes16  standard base64 (RFC 4648 section 4, with padding): seats, tickets, tokens
enum            the member's name in lower case ("lobby_full", "reconnecting")
value           string or integer; in change maps also null (delete the key)
map             object of key -> value (at most 255 keys)
opt u64         decimal string, or null
list            array
union           object with ``"kind"`` (the record's name in snake case) and its fields
record          object with exactly its fields (an unknown or a missing key is an error)
trailing        a key that may be left out (its empty value)
==============  ==============================================================================

The first message each way is the hello (``{"type": "hello", "v": 1, "member_id": ...}``,
optionally ``seat``, ``secret``, ``token``, ``resume``: the fields of `echo.lobby.hello.Hello`,
the identity token as the JWT's own text) and the welcome (``{"type": "welcome", "v": 1,
"server_id": ...}``). `json_schema` is the JSON Schema of every message; the repository keeps
it as ``echo/lobby/web/schema.json`` (``python -m echo.lobby.web.jsonwire`` prints it).
docs/json-protocol.md has examples.

The ``load*`` and ``parse_*_untrusted`` functions take text or objects straight from the
network and raise only `JsonProtocolError` (duplicate keys, NaN, deep nesting and huge numbers
included); ``dump*`` raise `echo.lobby.protocol.LobbyProtocolError` for a record that cannot be
a message, as `echo.lobby.protocol.encode` does.

Pure module: no trio, no clock, no I/O.
"""

from __future__ import annotations

import base64
import binascii
import enum
import json
import re
import sys
from collections.abc import Mapping
from typing import Any, Final

import attrs

from echo.lobby import protocol as p
from echo.lobby.hello import MAX_RESUME_BYTES, MAX_SEAT_BYTES, MAX_TOKEN_BYTES, Hello

PROTOCOL_VERSION: Final = 1
SCHEMA_ID: Final = "https://echo.invalid/lobby/json-protocol/v1/schema.json"
_JS_SAFE: Final = 2**53 - 1
_U64_PATTERN: Final = "^(0|[1-9][0-9]{0,19})$"
_U64_RE: Final = re.compile(_U64_PATTERN)


class JsonProtocolError(ValueError):
    """Text or an object that is not a lobby JSON message. `request_id` is the message's own
    request id when it could be read (so the refusal can answer it), else 0."""

    def __init__(self, message: str, request_id: int = 0) -> None:
        super().__init__(message)
        self.request_id = request_id


class CloseCode(enum.IntEnum):
    """Why the door closed a WebSocket (RFC 6455 codes, then the application's 4000s)."""

    NORMAL = 1000
    GOING_AWAY = 1001  # the server stops
    UNSUPPORTED_DATA = 1003  # a binary frame: the protocol is JSON text
    POLICY_VIOLATION = 1008  # over the message rate, or too many requests unanswered
    MESSAGE_TOO_BIG = 1009  # over the door's message size
    HELLO_REFUSED = 4000  # a bad hello, an identity refused, a seat or member id not its own
    TOO_SLOW = 4001  # updates waited for it beyond the backlog: reconnect for a snapshot
    REPLACED = 4002  # the member connected again; the new connection has the seat
    NO_HELLO = 4003  # no hello within the hello timeout
    RESUME_REFUSED = 4004  # the resume token did not take the seat back (the reason says why)


# --- one JSON form per binary field codec -----------------------------------------------------


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


def _record(codec: p._Record, head: tuple[str, str] | None) -> _JRecord:
    fields = []
    for name, c in codec.fields:
        if isinstance(c, p._Trailing):
            fields.append(_Field(name, _form(c.codec), optional=c.empty))
        else:
            fields.append(_Field(name, _form(c)))
    return _JRecord(codec.cls, fields, head)


def _form(c: p._Codec) -> _J:
    """The JSON form of one binary field codec (a codec kind unknown here fails at import)."""
    if isinstance(c, p._Enum):
        return _JEnum(c.kind)
    if isinstance(c, p._Int):
        return _JU64() if c.low == 0 and c.high > _JS_SAFE else _JInt(c.low, c.high)
    if isinstance(c, p._Bool):
        return _JBool()
    if isinstance(c, p._Text):
        return _JText(255 if c.push.__name__.endswith("str8") else 0xFFFF)
    if isinstance(c, p._Bytes8 | p._Bytes16):
        return _JBytes(0xFF if isinstance(c, p._Bytes8) else 0xFFFF)
    if isinstance(c, p._Map):
        return _JMap(c.value.allow_delete)
    if isinstance(c, p._OptU64):
        return _JOptU64()
    if isinstance(c, p._List):
        return _JList(_form(c.item), c.size.high)
    if isinstance(c, p._Union):
        return _JUnion(
            c.name, [_record(r, ("kind", _snake(r.cls.__name__))) for r in c.kinds.values()]
        )
    if isinstance(c, p._Record):
        return _record(c, None)
    raise TypeError(f"no JSON form for the field codec {type(c).__name__}")  # pragma: no cover


def type_name(kind: p.MessageType) -> str:
    """A message's ``type`` in JSON: its MessageType name in lower case."""
    return kind.name.lower()


_BY_TYPE: Final = {type_name(m.kind): _record(m, ("type", type_name(m.kind))) for m in p._MESSAGES}
_BY_CLASS: Final = {form.cls: form for form in _BY_TYPE.values()}
REQUEST_TYPES: Final = frozenset(
    type_name(m.kind) for m in p._MESSAGES if m.cls in p._REQUEST_TYPES
)
SERVER_TYPES: Final = frozenset(_BY_TYPE) - REQUEST_TYPES


# --- messages ---------------------------------------------------------------------------------


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 40 else text[:37] + "..."


def dump_message(msg: p.Message) -> dict[str, Any]:
    """The JSON object of a lobby message. Raises LobbyProtocolError for a non-message."""
    form = _BY_CLASS.get(type(msg))
    if form is None:
        raise p.LobbyProtocolError(f"not a lobby message: {msg!r}")
    return form.dump(msg)


def dumps(obj: Mapping[str, Any]) -> str:
    """One JSON object as the text of one frame (compact, UTF-8 kept as is)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def _no_constant(name: str) -> Any:
    raise JsonProtocolError(f"{name} is not JSON")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise JsonProtocolError("an object with a duplicate key")
    return out


def loads(text: str | bytes) -> Any:
    """Strict JSON: no NaN or Infinity, no duplicate keys. Raises only JsonProtocolError."""
    try:
        return json.loads(text, parse_constant=_no_constant, object_pairs_hook=_no_duplicates)
    except JsonProtocolError:
        raise
    except RecursionError:
        raise JsonProtocolError("nested too deeply") from None
    except (ValueError, TypeError) as error:  # JSONDecodeError, digits over Python's limit
        raise JsonProtocolError(f"not JSON: {str(error)[:80]}") from None


def request_id_of(obj: Any) -> int:
    """The object's request id if it has a valid one, else 0."""
    rid: Any = obj.get("request_id") if isinstance(obj, dict) else None
    return int(rid) if _is_int(rid) and 0 <= rid <= p.U32_MAX else 0


def _load(obj: Any, types: frozenset[str], side: str) -> Any:
    if not isinstance(obj, dict):
        raise JsonProtocolError("a message is a JSON object")
    kind = obj.get("type")
    rid = request_id_of(obj)
    if not isinstance(kind, str):
        raise JsonProtocolError('a message has a string "type"', rid)
    if kind not in types:
        what = "unknown message type" if kind not in _BY_TYPE else f"not a {side} message:"
        raise JsonProtocolError(f"{what} {_short(kind)}", rid)
    try:
        return _BY_TYPE[kind].load(obj, "")
    except JsonProtocolError as error:
        raise JsonProtocolError(str(error), rid) from None


def load_request(obj: Any) -> p.Request:
    """A request from its JSON object. Raises only JsonProtocolError."""
    return _load(obj, REQUEST_TYPES, "client")  # type: ignore[no-any-return]


def load_server_message(obj: Any) -> Any:
    """A reply, update or chat line from its JSON object. Raises only JsonProtocolError."""
    return _load(obj, SERVER_TYPES, "server")


def parse_request_text_untrusted(text: str | bytes) -> p.Request:
    """One frame's text as a request. Raises only JsonProtocolError."""
    return load_request(loads(text))


# --- the hello and the welcome ----------------------------------------------------------------

_SEAT: Final = _JBytes(MAX_SEAT_BYTES)
_SECRET: Final = _JBytes(64)
_RESUME: Final = _JBytes(MAX_RESUME_BYTES)
_HELLO_KEYS: Final = frozenset({"type", "v", "member_id", "seat", "secret", "token", "resume"})


def load_hello(obj: Any) -> Hello:
    """The hello's fields (checked further by `echo.lobby.hello` and the server, as a binary
    hello is). Raises only JsonProtocolError."""
    if not isinstance(obj, dict) or obj.get("type") != "hello":
        raise JsonProtocolError('the first message is {"type": "hello", ...}')
    if obj.get("v") != PROTOCOL_VERSION or isinstance(obj.get("v"), bool):
        raise JsonProtocolError(
            f'protocol version {_short(obj.get("v"))}: this server speaks "v": {PROTOCOL_VERSION}'
        )
    unknown = sorted(set(obj) - _HELLO_KEYS)
    if unknown:
        raise JsonProtocolError(f"hello: unknown field {_short(unknown[0])}")
    if "member_id" not in obj:
        raise JsonProtocolError("hello: missing field 'member_id'")
    member_id = _load_text(obj["member_id"], "member_id", 255)
    token = _load_text(obj.get("token", ""), "token", MAX_TOKEN_BYTES)
    return Hello(
        member_id=member_id,
        seat=_SEAT.load(obj.get("seat", ""), "seat"),
        secret=_SECRET.load(obj.get("secret", ""), "secret"),
        token=token.encode("utf-8"),
        resume=_RESUME.load(obj.get("resume", ""), "resume"),
    )


def dump_hello(hello: Hello) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "hello", "v": PROTOCOL_VERSION, "member_id": hello.member_id}
    if hello.seat:
        out["seat"] = _SEAT.dump(hello.seat)
    if hello.secret:
        out["secret"] = _SECRET.dump(hello.secret)
    if hello.token:
        out["token"] = hello.token.decode("utf-8")
    if hello.resume:
        out["resume"] = _RESUME.dump(hello.resume)
    return out


def dump_welcome(server_id: str) -> dict[str, Any]:
    return {"type": "welcome", "v": PROTOCOL_VERSION, "server_id": server_id}


# --- the schema -------------------------------------------------------------------------------


def _hello_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "type": {"const": "hello"},
            "v": {"const": PROTOCOL_VERSION},
            "member_id": {"type": "string", "minLength": 1, "maxLength": 255},
            "seat": _SEAT.schema(),
            "secret": _SECRET.schema(),
            "token": {"type": "string", "maxLength": MAX_TOKEN_BYTES},
            "resume": _RESUME.schema(),
        },
        "required": ["type", "v", "member_id"],
        "additionalProperties": False,
    }


def _welcome_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "type": {"const": "welcome"},
            "v": {"const": PROTOCOL_VERSION},
            "server_id": {"type": "string"},
        },
        "required": ["type", "v", "server_id"],
        "additionalProperties": False,
    }


def json_schema() -> dict[str, Any]:
    """The JSON Schema (2020-12) of every message: ``$defs`` has one per ``type``,
    ``client_message`` and ``server_message`` each side's, the root either."""
    from echo.lobby.web.moving import moved_schema  # (the door's own message: a drain's)

    defs: dict[str, Any] = {"hello": _hello_schema(), "welcome": _welcome_schema()}
    defs |= {name: form.schema() for name, form in _BY_TYPE.items()}
    defs["moved"] = moved_schema()
    client = ["hello", *(n for n in _BY_TYPE if n in REQUEST_TYPES)]
    server = ["welcome", *(n for n in _BY_TYPE if n in SERVER_TYPES), "moved"]
    defs["client_message"] = {"oneOf": [{"$ref": f"#/$defs/{n}"} for n in client]}
    defs["server_message"] = {"oneOf": [{"$ref": f"#/$defs/{n}"} for n in server]}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": f"echo lobby JSON protocol, version {PROTOCOL_VERSION}",
        "description": "One JSON object per WebSocket text frame (docs/json-protocol.md).",
        "oneOf": [{"$ref": "#/$defs/client_message"}, {"$ref": "#/$defs/server_message"}],
        "$defs": defs,
    }


def schema_text() -> str:
    """`json_schema` as the repository keeps it (echo/lobby/web/schema.json)."""
    return json.dumps(json_schema(), indent=1) + "\n"


if __name__ == "__main__":  # pragma: no cover
    sys.stdout.write(schema_text())
