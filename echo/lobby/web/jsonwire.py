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

import enum
import json
import sys
from collections.abc import Mapping
from typing import Any, Final

from echo.lobby import protocol as p
from echo.lobby.hello import MAX_RESUME_BYTES, MAX_SEAT_BYTES, MAX_TOKEN_BYTES, Hello
from echo.lobby.protocol import table as pt
from echo.lobby.web.jsonforms import JsonProtocolError as JsonProtocolError
from echo.lobby.web.jsonforms import (
    _is_int,
    _JBytes,
    _load_text,
    _record,
    _short,
)

PROTOCOL_VERSION: Final = 1
SCHEMA_ID: Final = "https://echo.invalid/lobby/json-protocol/v1/schema.json"


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




def type_name(kind: p.MessageType) -> str:
    """A message's ``type`` in JSON: its MessageType name in lower case."""
    return kind.name.lower()


_BY_TYPE: Final = {type_name(m.kind): _record(m, ("type", type_name(m.kind))) for m in pt._MESSAGES}
_BY_CLASS: Final = {form.cls: form for form in _BY_TYPE.values()}
REQUEST_TYPES: Final = frozenset(
    type_name(m.kind) for m in pt._MESSAGES if m.cls in pt._REQUEST_TYPES
)
SERVER_TYPES: Final = frozenset(_BY_TYPE) - REQUEST_TYPES


# --- messages ---------------------------------------------------------------------------------


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
