"""Event schema v1: the single source of truth for what `echo-server --events` writes.

Every event is one JSON object on one line with the common fields `ts`, `server_id`, `event` and
`schema_version`, plus the fields of its event type (EVENT_FIELDS). The Spark job
(`echo.telemetry.pipeline`) derives its explicit read schema from EVENT_FIELDS, and
`validate_event` is the same rule set in Python for untrusted, already-decoded JSON.

Rules a reader must follow (so that a newer server never breaks an older job):
- fields not listed here are ignored, never an error;
- an event name not listed here is counted as unknown, not as a bad line;
- nullable fields (`FieldType.*_OR_NULL`) may be null or missing.

Pure module: no clock, no I/O.
"""

from __future__ import annotations

import datetime
import enum
import hashlib
import hmac
import ipaddress
import re
from collections.abc import Mapping
from typing import Any, Final

SCHEMA_VERSION: Final = 1

# RFC 3339, UTC, always six fraction digits: fixed width keeps lines sortable as text and lets
# Spark parse it with one pattern (TS_SPARK_PATTERN) that means exactly what TS_RE means.
TS_FORMAT: Final = "%Y-%m-%dT%H:%M:%S.%fZ"
TS_RE: Final = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z")
TS_SPARK_PATTERN: Final = "yyyy-MM-dd'T'HH:mm:ss.SSSSSS'Z'"

# JSON integers outside int64 cannot be stored by the Spark job (it reads them as LongType), so
# they are invalid here too: Python and Spark must agree on what a bad line is.
INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1


class FieldType(enum.Enum):
    INT = "int"
    FLOAT = "float"  # a JSON int is a valid float (lifetime 3 == 3.0)
    STR = "str"
    FLOAT_OR_NULL = "float|null"
    STR_OR_NULL = "str|null"

    @property
    def nullable(self) -> bool:
        return self in (FieldType.FLOAT_OR_NULL, FieldType.STR_OR_NULL)

    @property
    def is_str(self) -> bool:
        return self in (FieldType.STR, FieldType.STR_OR_NULL)


_I, _F, _S = FieldType.INT, FieldType.FLOAT, FieldType.STR
_FN, _SN = FieldType.FLOAT_OR_NULL, FieldType.STR_OR_NULL

COMMON_FIELDS: Final[Mapping[str, FieldType]] = {
    "ts": _S,
    "server_id": _S,
    "event": _S,
    "schema_version": _I,
}

EVENT_FIELDS: Final[Mapping[str, Mapping[str, FieldType]]] = {
    "server_started": {
        "address": _S,
        "port": _I,
        "control_port": _I,
        "clients_base_port": _I,
        "max_clients": _I,
        "max_per_ip": _I,
    },
    "server_stopped": {"reason": _S, "duologues_open": _I},
    "hello_received": {"client_session": _I, "source_ip": _S, "source_prefix": _S},
    "hello_rejected": {"client_session": _I, "source_ip": _S, "source_prefix": _S, "reason": _S},
    "duologue_created": {
        "duologue_id": _I,
        "client_session": _I,
        "source_ip": _S,
        "source_prefix": _S,
        "data_port": _I,
        "control_port": _I,
    },
    "duologue_connected": {"duologue_id": _I, "source_ip": _S, "source_port": _I},
    "image_refused": {"duologue_id": _I, "source_ip": _S, "reason": _S},
    "duologue_expired": {"duologue_id": _I, "source_ip": _S, "source_prefix": _S, "age_s": _F},
    "duologue_closed": {
        "duologue_id": _I,
        "source_ip": _S,
        "source_prefix": _S,
        "reason": _S,
        "lifetime_s": _F,
        "messages": _I,
    },
    # The lobby service: `echo-lobby --events` writes these next to the same common
    # fields; `lobby_id` is the lobby's 63-bit id, `member_id` the authenticated member name.
    "lobby_server_started": {"address": _S, "port": _I, "control_port": _I},
    "lobby_server_stopped": {"reason": _S, "lobbies_open": _I},
    "lobby_created": {"lobby_id": _I, "member_id": _S, "max_members": _I, "visibility": _S},
    "lobby_joined": {"lobby_id": _I, "member_id": _S, "members": _I},
    "lobby_left": {"lobby_id": _I, "member_id": _S, "members": _I, "reason": _S},
    "lobby_chat": {"lobby_id": _I, "member_id": _S, "bytes": _I},
    "lobby_started": {"lobby_id": _I, "members": _I, "game_server": _S},
    "lobby_deleted": {"lobby_id": _I, "reason": _S},
    "lobby_refused": {"member_id": _S, "request": _S, "code": _S},
    "lobby_resumed": {"lobby_id": _I, "member_id": _S},
    # the matchmaker seated a match in a new lobby (started: 1 if it was started at once)
    "lobby_matched": {"lobby_id": _I, "members": _I, "tickets": _I, "started": _I},
    "client_summary": {
        "server": _S,
        "sent": _I,
        "received": _I,
        "rtt_ms_p50": _FN,
        "rtt_ms_p90": _FN,
        "rtt_ms_p99": _FN,
        "rtt_ms_max": _FN,
        "state": _S,
        "error": _SN,
    },
}

# Known values, for documentation, the generator and the report's ordering. Readers accept any
# string: a server may add a reason (today's server also says "unvalidated address") and the job
# must still count it rather than call the line bad.
HELLO_REJECT_REASONS: Final = (
    "bad message",
    "server full",
    "too many connections for IP address",
    "rate limited",
)
CLOSE_REASONS: Final = (
    "client gone",
    "bad message",
    "server shutting down",
    "send failed",
    "expired",
)

# Fields that carry a client address and are pseudonymised when a salt is set.
IP_FIELDS: Final = ("source_ip", "source_prefix")


def field_type_of(name: str) -> FieldType:
    """The one type a field name has across all events (the Spark read schema needs one)."""
    if name in COMMON_FIELDS:
        return COMMON_FIELDS[name]
    found = {fields[name] for fields in EVENT_FIELDS.values() if name in fields}
    if len(found) != 1:
        raise KeyError(name)
    return found.pop()


def all_fields() -> dict[str, FieldType]:
    """Every field of every event, common fields first, in a stable order."""
    out: dict[str, FieldType] = dict(COMMON_FIELDS)
    for fields in EVENT_FIELDS.values():
        for name in fields:
            out.setdefault(name, field_type_of(name))
    return out


def format_ts(epoch_s: float) -> str:
    """`epoch_s` as the schema's timestamp string."""
    return datetime.datetime.fromtimestamp(epoch_s, datetime.UTC).strftime(TS_FORMAT)


def _type_error(value: Any, ftype: FieldType) -> str | None:
    if value is None:
        return None if ftype.nullable else "is null"
    # bool is an int subclass in Python, but true is not a port number in JSON.
    if isinstance(value, bool):
        return f"must be {ftype.value}, not bool"
    if ftype is FieldType.INT:
        if not isinstance(value, int):
            return f"must be int, not {type(value).__name__}"
        if not INT64_MIN <= value <= INT64_MAX:
            return "is outside int64"
        return None
    if ftype in (FieldType.FLOAT, FieldType.FLOAT_OR_NULL):
        if isinstance(value, int):
            return None if INT64_MIN <= value <= INT64_MAX else "is outside int64"
        return None if isinstance(value, float) else f"must be float, not {type(value).__name__}"
    return None if isinstance(value, str) else f"must be str, not {type(value).__name__}"


def validate_event(obj: object) -> str | None:
    """Check one decoded JSON value (untrusted input) against schema v1.

    Returns None when it is a valid event, else a short reason. Never raises. Unknown events
    return a reason starting with "unknown event" so a reader can tell them from broken lines.
    """
    if not isinstance(obj, dict):
        return f"not a JSON object: {type(obj).__name__}"
    for name, ftype in COMMON_FIELDS.items():
        if name not in obj:
            return f"missing field {name}"
        error = _type_error(obj[name], ftype)
        if error is not None:
            return f"field {name} {error}"
    if obj["schema_version"] != SCHEMA_VERSION:
        return f"unsupported schema_version {obj['schema_version']}"
    ts = obj["ts"]
    if TS_RE.fullmatch(ts) is None:
        return f"field ts is not {TS_FORMAT}: {ts[:40]!r}"
    try:
        datetime.datetime.strptime(ts, TS_FORMAT)
    except ValueError:
        return f"field ts is not a valid time: {ts[:40]!r}"
    event = obj["event"]
    fields = EVENT_FIELDS.get(event)
    if fields is None:
        return f"unknown event {event[:40]!r}"
    for name, ftype in fields.items():
        if name not in obj:
            if ftype.nullable:
                continue
            return f"{event}: missing field {name}"
        error = _type_error(obj[name], ftype)
        if error is not None:
            return f"{event}: field {name} {error}"
    return None


def pseudonymise_ip(ip: str, salt: bytes) -> str:
    """A stable keyed pseudonym for an address or prefix: "h:" + 24 hex digits.

    HMAC-BLAKE2b, so without the salt nobody can test guesses against the log (a plain hash of
    the 2^32 IPv4 addresses is reversed by enumeration). A prefix "net/len" keeps its "/len", so
    a pseudonymised log still tells IPv6 networks from single addresses.
    """
    base, slash, bits = ip.partition("/")
    digest = hmac.new(salt, base.encode("utf-8", "surrogatepass"), hashlib.blake2b).hexdigest()
    return f"h:{digest[:24]}{slash}{bits}"


def prefix_key(ip: str, v6_prefix: int = 64) -> str:
    """The per-IP-limit key of `ip`, as the server computes it (echo.session.limits.address_key).

    IPv4 and IPv4-mapped IPv6 -> the IPv4 address; other IPv6 -> its network of `v6_prefix`
    bits ("2001:db8:1:2::/64"), because one IPv6 host usually owns a whole /64.
    Raises ValueError for anything that is not an address or a prefix outside 0..128.
    """
    if isinstance(v6_prefix, bool) or not 0 <= v6_prefix <= 128:
        raise ValueError(f"v6_prefix {v6_prefix!r} is out of range 0..128")
    addr = ipaddress.ip_address(ip.split("%", 1)[0])
    if isinstance(addr, ipaddress.IPv4Address):
        return str(addr)
    if addr.ipv4_mapped is not None:
        return str(addr.ipv4_mapped)
    return str(ipaddress.IPv6Network((addr, v6_prefix), strict=False))
