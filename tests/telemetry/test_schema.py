from __future__ import annotations

import ipaddress
import json
from typing import Any

import pytest

from echo.session.limits import address_key
from echo.telemetry.schema import (
    EVENT_FIELDS,
    SCHEMA_VERSION,
    all_fields,
    field_type_of,
    format_ts,
    prefix_key,
    pseudonymise_ip,
    validate_event,
)

TS = "2026-11-22T19:56:29.123456Z"


def event(name: str = "hello_received", **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "ts": TS,
        "server_id": "s1",
        "event": name,
        "schema_version": SCHEMA_VERSION,
    }
    defaults: dict[str, Any] = {
        "hello_received": {
            "client_session": -5,
            "source_ip": "192.0.2.1",
            "source_prefix": "192.0.2.1",
        },
        "duologue_closed": {
            "duologue_id": 1,
            "source_ip": "192.0.2.1",
            "source_prefix": "192.0.2.1",
            "reason": "client gone",
            "lifetime_s": 2.5,
            "messages": 3,
        },
        "client_summary": {
            "server": "h:1",
            "sent": 3,
            "received": 3,
            "rtt_ms_p50": 1.0,
            "rtt_ms_p90": None,
            "rtt_ms_p99": 2,
            "rtt_ms_max": 3.0,
            "state": "closed",
            "error": None,
        },
    }
    return {**base, **defaults.get(name, {}), **fields}


def test_valid_events_pass() -> None:
    assert validate_event(event()) is None
    assert validate_event(event("duologue_closed")) is None
    assert validate_event(event("client_summary")) is None


def test_unknown_extra_fields_are_ignored() -> None:
    assert validate_event(event(extra={"nested": [1, 2]}, another=5)) is None


def test_nullable_fields_may_be_null_or_missing() -> None:
    summary = event("client_summary")
    del summary["error"], summary["rtt_ms_p50"]
    assert validate_event(summary) is None


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        ([1, 2], "not a JSON object: list"),
        (None, "not a JSON object: NoneType"),
        ({k: v for k, v in event().items() if k != "ts"}, "missing field ts"),
        (event(server_id=7), "field server_id must be str, not int"),
        (event(schema_version="1"), "field schema_version must be int, not str"),
        (event(schema_version=True), "field schema_version must be int, not bool"),
        (event(schema_version=2), "unsupported schema_version 2"),
        (event(ts="2026-11-22 19:56:29.123456Z"), "field ts is not"),
        (event(ts="2026-11-22T19:56:29Z"), "field ts is not"),
        (event(ts="2026-02-30T19:56:29.123456Z"), "field ts is not a valid time"),
        (event(event="config_reloaded"), "unknown event 'config_reloaded'"),
        (event(client_session="5"), "hello_received: field client_session must be int, not str"),
        (event(client_session=1.0), "hello_received: field client_session must be int, not float"),
        (event(client_session=2**63), "hello_received: field client_session is outside int64"),
        (event(source_ip=None), "hello_received: field source_ip is null"),
        (
            event("duologue_closed", lifetime_s="2"),
            "duologue_closed: field lifetime_s must be float",
        ),
        (event("client_summary", rtt_ms_p50="1"), "client_summary: field rtt_ms_p50 must be float"),
    ],
)
def test_invalid_events_say_why(obj: object, expected: str) -> None:
    error = validate_event(obj)
    assert error is not None and error.startswith(expected), error


def test_missing_event_field() -> None:
    obj = event()
    del obj["source_prefix"]
    assert validate_event(obj) == "hello_received: missing field source_prefix"


def test_every_field_has_one_type_across_events() -> None:
    # The Spark read schema needs one column type per field name.
    fields = all_fields()
    assert list(fields)[:4] == ["ts", "server_id", "event", "schema_version"]
    for event_fields in EVENT_FIELDS.values():
        for name, ftype in event_fields.items():
            assert field_type_of(name) is ftype
    assert len(EVENT_FIELDS) == 21  # 10 of echo-server, 11 of echo-lobby


def test_format_ts_is_the_schema_format() -> None:
    assert format_ts(1_795_377_389.123456) == "2026-11-22T19:56:29.123456Z"
    assert validate_event(event(ts=format_ts(0))) is None


def test_pseudonymise_is_keyed_stable_and_keeps_prefix_length() -> None:
    a = pseudonymise_ip("192.0.2.1", b"salt")
    assert a == pseudonymise_ip("192.0.2.1", b"salt")
    assert a.startswith("h:") and len(a) == 26
    assert a != pseudonymise_ip("192.0.2.1", b"other")
    assert a != pseudonymise_ip("192.0.2.2", b"salt")
    net = pseudonymise_ip("2001:db8:1:2::/64", b"salt")
    assert net.endswith("/64") and net.startswith("h:") and "2001" not in net


@pytest.mark.parametrize(
    ("ip", "key"),
    [
        ("192.0.2.7", "192.0.2.7"),
        ("::ffff:192.0.2.7", "192.0.2.7"),
        ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
        ("2001:DB8:1:2::9", "2001:db8:1:2::/64"),
        ("fe80::1%eth0", "fe80::/64"),
    ],
)
def test_prefix_key(ip: str, key: str) -> None:
    assert prefix_key(ip) == key
    # The job's notion of "per-IP key" must be the server's.
    assert address_key(ip) == key


def test_prefix_key_other_lengths_and_errors() -> None:
    assert prefix_key("2001:db8:1:2::9", 48) == "2001:db8:1::/48"
    assert ipaddress.ip_network(prefix_key("2001:db8::1", 128)).prefixlen == 128
    with pytest.raises(ValueError):
        prefix_key("not an address")
    with pytest.raises(ValueError):
        prefix_key("2001:db8::1", 129)


def test_validate_never_raises_on_json_values() -> None:
    for text in ("1", '"x"', "true", "{}", '{"ts":1}', '{"ts":"x","server_id":"s","event":1}'):
        assert isinstance(validate_event(json.loads(text)), str)
