"""The JSON protocol (echo.lobby.web.jsonwire): every message of the binary table has a JSON
form that round-trips and that the committed JSON Schema accepts; hostile text is refused with
a reason, never an exception of another kind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import attrs
import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echo.lobby import protocol as p
from echo.lobby.hello import Hello, encode_hello, parse_hello_untrusted
from echo.lobby.protocol import fields as pf
from echo.lobby.protocol import table as pt
from echo.lobby.web import jsonforms
from echo.lobby.web import jsonwire as j
from echo.lobby.web.door import WebDoor
from echo.lobby.web.moving import moved_message
from tests.lobby.test_protocol import EDGES, SAMPLES, messages

SCHEMA_PATH = Path(j.__file__).with_name("schema.json")
SCHEMA = json.loads(SCHEMA_PATH.read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def validate(obj: Any, side: str) -> None:
    """`obj` is a valid message of `side` ("client_message" or "server_message")."""
    VALIDATOR.validate(obj)
    jsonschema.Draft202012Validator({"$ref": f"#/$defs/{side}", "$defs": SCHEMA["$defs"]}).validate(
        obj
    )


def side_of(msg: p.Message) -> str:
    return "client_message" if isinstance(msg, pt._REQUEST_TYPES) else "server_message"


def round_trip(msg: p.Message) -> dict[str, Any]:
    obj = j.dump_message(msg)
    text = j.dumps(obj)
    again = j.loads(text)
    assert again == obj
    validate(again, side_of(msg))
    load = j.load_request if isinstance(msg, pt._REQUEST_TYPES) else j.load_server_message
    assert load(again) == msg
    return obj


def test_the_committed_schema_is_the_generated_one() -> None:
    """Regenerate with: python -m echo.lobby.web.jsonwire > echo/lobby/web/schema.json"""
    assert SCHEMA_PATH.read_text() == j.schema_text()
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


def test_every_message_type_has_a_json_type_and_a_schema() -> None:
    names = {j.type_name(k) for k in p.MessageType}
    assert names == j.REQUEST_TYPES | j.SERVER_TYPES
    assert not j.REQUEST_TYPES & j.SERVER_TYPES
    assert names | {"hello", "welcome"} <= set(SCHEMA["$defs"])
    assert "create_lobby" in j.REQUEST_TYPES and "lobby_snapshot" in j.SERVER_TYPES


@pytest.mark.parametrize("msg", [*SAMPLES, *EDGES], ids=lambda m: type(m).__name__)
def test_every_sample_round_trips_and_validates(msg: p.Message) -> None:
    round_trip(msg)


@settings(max_examples=200, deadline=None)
@given(messages)
def test_generated_messages_round_trip_and_validate(msg: p.Message) -> None:
    round_trip(msg)


@settings(max_examples=300, deadline=None)
@given(messages)
def test_the_door_forms_what_the_server_encoded_as_it_would_from_the_bytes(
    msg: p.Message,
) -> None:
    """The door's `text_of` takes the message the server just encoded instead of parsing its
    bytes back: both must give the same text."""
    if j.dump_message(msg)["type"] not in j.SERVER_TYPES:
        return

    class Server:
        counters: dict[str, int] = {}
        encoded: tuple[bytes, Any] | None = None

    server = Server()
    door = WebDoor(cast(Any, server))
    data = p.encode(msg)
    parsed = door.text_of(data)
    assert parsed == j.dumps(j.dump_message(msg))
    other = next(m for m in SAMPLES if j.dump_message(m)["type"] in j.SERVER_TYPES and m != msg)
    door._last = None
    server.encoded = (p.encode(other), other)  # the server's last message was another
    assert door.text_of(data) == parsed
    door._last = None
    server.encoded = (data, msg)
    assert door.text_of(data) == parsed


def test_the_json_forms_of_the_field_codecs() -> None:
    obj = round_trip(
        p.SearchLobbies(
            7,
            (p.StringEquals("mode", "ctf"), p.NumberRange("lvl", -5, 2**62), p.FreeSlots(2)),
            2**63 + 5,
            20,
        )
    )
    assert obj == {
        "type": "search_lobbies", "request_id": 7,
        "filters": [
            {"kind": "string_equals", "key": "mode", "value": "ctf"},
            {"kind": "number_range", "key": "lvl", "low": -5, "high": 2**62},
            {"kind": "free_slots", "minimum": 2},
        ],
        "cursor": str(2**63 + 5), "limit": 20,
    }  # fmt: skip
    obj = round_trip(p.MetadataChanged(2**62 + 1, 3, {"mode": None, "n": -1, "s": "x"}))
    assert obj["lobby_id"] == "4611686018427387905" and obj["version"] == "3"
    assert obj["changes"] == {"mode": None, "n": -1, "s": "x"}
    obj = round_trip(p.Refusal(5, p.ErrorCode.LOBBY_FULL, "full"))
    assert obj["code"] == "lobby_full"
    obj = round_trip(p.GameStarting(1, "g", "127.0.0.1:9", b"\x00\xfftk"))
    assert obj["ticket"] == "AP90aw=="
    # a trailing field is left out when empty, and may be left out
    plain = j.dump_message(p.RecreateLobby(1, SAMPLES[15].snapshot, b"s"))  # type: ignore[attr-defined]
    assert "seat_tags" not in plain
    assert j.load_request(plain).seat_tags == ()  # type: ignore[union-attr]


def test_a_message_added_to_the_table_gets_a_json_form() -> None:
    """The mapping is built from the codecs, not per message: a new record of existing field
    codecs (here with every kind) round-trips without a line written for it."""

    @attrs.frozen
    class Result:
        request_id: int
        lobby_id: int
        scores: tuple[Any, ...]
        winner: p.Presence
        note: Any

    entry = pt._request(
        p.MessageType.START_GAME, Result, lobby_id=pf._U64,
        scores=pf._List(pf._U8, pf._Record(p.SeatTag, member_id=pf._STR8, tag=pf._BYTES8), "many"),
        winner=pf._PRESENCE, note=pf._Trailing(pf._CHANGES, {}),
    )  # fmt: skip
    form = jsonforms._record(entry, ("type", "game_result"))
    value = Result(1, 2**63, (p.SeatTag("a", b"\x01"),), p.Presence.RECONNECTING, {"k": None})
    obj = form.dump(value)
    assert obj == {
        "type": "game_result", "request_id": 1, "lobby_id": str(2**63),
        "scores": [{"member_id": "a", "tag": "AQ=="}], "winner": "reconnecting",
        "note": {"k": None},
    }  # fmt: skip
    assert form.load(obj, "") == value
    jsonschema.Draft202012Validator(form.schema()).validate(obj)


BAD_TEXT = [
    ("", "not JSON"),
    ("{", "not JSON"),
    ("[]", "a message is a JSON object"),
    ('"join_lobby"', "a message is a JSON object"),
    ("{}", 'a string "type"'),
    ('{"type": 5}', 'a string "type"'),
    ('{"type": "teleport", "request_id": 9}', "unknown message type 'teleport'"),
    ('{"type": "lobby_snapshot"}', "not a client message"),
    ('{"type": "join_lobby", "request_id": 9}', "missing field 'lobby_id'"),
    ('{"type": "join_lobby", "request_id": 9, "lobby_id": 5}', "lobby_id: expected a 64-bit"),
    ('{"type": "join_lobby", "request_id": 9, "lobby_id": "05"}', "expected a 64-bit"),
    ('{"type": "join_lobby", "request_id": 9, "lobby_id": "18446744073709551616"}', "64-bit"),
    ('{"type": "join_lobby", "request_id": 9, "lobby_id": "1", "x": 1}', "unknown field 'x'"),
    ('{"type": "join_lobby", "request_id": -1, "lobby_id": "1"}', "request_id: expected an"),
    ('{"type": "join_lobby", "request_id": 1.5, "lobby_id": "1"}', "request_id: expected an"),
    ('{"type": "join_lobby", "request_id": true, "lobby_id": "1"}', "request_id: expected an"),
    ('{"type": "set_locked", "request_id": 1, "lobby_id": "1", "locked": 1}', "true or false"),
    ('{"type": "join_lobby", "request_id": NaN, "lobby_id": "1"}', "NaN is not JSON"),
    ('{"type": "join_lobby", "type": "join_lobby"}', "duplicate key"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"type": "join_lobby", "request_id": 1' + "0" * 5000 + "}", "not JSON"),
    ('{"type": "send_chat", "request_id": 1, "lobby_id": "1", "text": "\\ud800"}', "surrogate"),
    ('{"type": "join_by_code", "request_id": 1, "code": "' + "é" * 200 + '"}', "at most 255"),
    (
        '{"type": "set_metadata", "request_id": 1, "lobby_id": "1", "changes": {"a": 1.5}}',
        "changes.a: expected a string, a 64-bit integer or null",
    ),
    (
        '{"type": "create_lobby", "request_id": 1, "name": "n", "max_members": 4, '
        '"private": false, "metadata": {"a": null}}',
        "metadata.a: expected a string or",
    ),
    (
        '{"type": "quick_join", "request_id": 1, "filters": [{"kind": "near"}]}',
        "filters[0]: expected a filter",
    ),
    ('{"type": "quick_join", "request_id": 1, "filters": {}}', "filters: expected an array"),
    (
        '{"type": "search_lobbies", "request_id": 1, "filters": [], "cursor": 3, "limit": 1}',
        "cursor: expected a 64-bit",
    ),
]


@pytest.mark.parametrize(("text", "why"), BAD_TEXT, ids=lambda x: str(x)[:30])
def test_hostile_text_is_refused_with_a_reason(text: str, why: str) -> None:
    with pytest.raises(j.JsonProtocolError, match=None) as caught:
        j.parse_request_text_untrusted(text)
    assert why in str(caught.value)


def test_a_refusal_names_the_request_it_answers_when_it_can() -> None:
    with pytest.raises(j.JsonProtocolError) as caught:
        j.parse_request_text_untrusted('{"type": "join_lobby", "request_id": 42}')
    assert caught.value.request_id == 42
    with pytest.raises(j.JsonProtocolError) as caught:
        j.parse_request_text_untrusted('{"type": "nope", "request_id": 43}')
    assert caught.value.request_id == 43
    with pytest.raises(j.JsonProtocolError) as caught:
        j.parse_request_text_untrusted('{"type": "nope", "request_id": "43"}')
    assert caught.value.request_id == 0


@settings(max_examples=300, deadline=None)
@given(st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["type", "request_id", "lobby_id", "filters", "kind", "x"]), inner,
        max_size=4),
    max_leaves=12,
))  # fmt: skip
def test_any_json_value_is_a_request_or_the_protocol_error(value: Any) -> None:
    try:
        request = j.load_request(value)
    except j.JsonProtocolError:
        return
    assert j.load_request(j.dump_message(request)) == request


def test_the_hello_and_the_welcome() -> None:
    hello = Hello("ålice", b"seat", b"s" * 16, b"eyJ.a.b", b"resume")
    obj = j.dump_hello(hello)
    validate(obj, "client_message")
    assert obj["v"] == 1 and obj["token"] == "eyJ.a.b"
    assert j.load_hello(j.loads(j.dumps(obj))) == hello
    # the same hello the binary path parses
    assert parse_hello_untrusted(encode_hello(j.load_hello(obj))) == hello
    assert j.load_hello({"type": "hello", "v": 1, "member_id": "bob"}) == Hello("bob")
    validate(j.dump_welcome("lobby-a"), "server_message")
    for bad, why in [
        ({"type": "join_lobby"}, '"type": "hello"'),
        ({"type": "hello", "member_id": "a"}, "protocol version None"),
        ({"type": "hello", "v": 2, "member_id": "a"}, "protocol version 2"),
        ({"type": "hello", "v": True, "member_id": "a"}, "protocol version True"),
        ({"type": "hello", "v": 1}, "missing field 'member_id'"),
        ({"type": "hello", "v": 1, "member_id": "a", "pw": "x"}, "unknown field 'pw'"),
        ({"type": "hello", "v": 1, "member_id": "a", "secret": "!!"}, "not standard base64"),
        ({"type": "hello", "v": 1, "member_id": 7}, "member_id: expected a string"),
    ]:
        with pytest.raises(j.JsonProtocolError) as caught:
            j.load_hello(bad)
        assert why in str(caught.value), bad


def test_the_examples_of_the_docs_page_are_valid_messages() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "json-protocol.md").read_text()
    blocks = [b.split("```", 1)[0] for b in page.split("```json\n")[1:]]
    assert len(blocks) >= 15
    for block in blocks:
        obj = j.loads(block)
        VALIDATOR.validate(obj)
        if obj["type"] == "hello":
            j.load_hello(obj)
        elif obj["type"] in j.REQUEST_TYPES:
            assert j.dump_message(j.load_request(obj)) == obj
        elif obj["type"] == "moved":  # the door's own, on drain (echo.lobby.web.moving)
            lobby = int(obj["lobby_id"]) if obj["lobby_id"] is not None else None
            assert moved_message(lobby, obj["server"], obj["url"]) == obj
        elif obj["type"] != "welcome":
            assert j.dump_message(j.load_server_message(obj)) == obj
