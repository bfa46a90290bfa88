"""The lobby protocol's message table, built afresh inside the test.

The field codecs (`_Int("u16", ...)`, `_List(_U8, ...)`, `_Enum(ErrorCode, _U16, ...)`) and
the table's entries (`_request`, `_lobby_op`, `_update`) are made when
`echo.lobby.protocol.fields` and `table` are imported: a mutation tool that switches a mutant
on after import never sees what they make, and every test of the imported table passes. Here
both modules are executed again (under their own names, `table` reading the fresh `fields`),
and the fresh codec must give the pinned wire bytes, read them back, refuse what does not fit
with the same reasons, and tell requests from server messages like the imported one.

Pure (in `./dev mutate lobby-protocol`'s selection).
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

import attrs
import pytest

import echo.lobby.protocol as protocol_package
import echo.lobby.protocol.fields as fields_module
import echo.lobby.protocol.fields as pf
import echo.lobby.protocol.table as table_module
import echo.lobby.web.jsonforms as jsonforms_module
import echo.lobby.web.jsonwire as jsonwire_module
from echo.lobby.protocol import (
    I64_MAX,
    I64_MIN,
    MAX_MESSAGE_BYTES,
    U64_MAX,
    Channel,
    CreateLobby,
    Done,
    JoinLobby,
    LobbyListing,
    LobbyProtocolError,
    Message,
    MessageType,
    NumberRange,
    QuickJoin,
    SearchResults,
    SeatTag,
    SeatTags,
    SendChat,
    SetMetadata,
    StartGame,
    channel_of,
    encode,
    parse_message_untrusted,
    parse_request_untrusted,
    parse_server_message_untrusted,
)
from tests.lobby import test_protocol
from tests.lobby.test_protocol import EDGES, EDGES_HEX, SAMPLES, SAMPLES_HEX, TRAILING


def _exec(module: ModuleType) -> ModuleType:
    spec = importlib.util.spec_from_file_location(module.__name__, module.__file__)
    assert spec is not None and spec.loader is not None
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)
    return fresh


@pytest.fixture
def fresh() -> ModuleType:
    """`table` built again on a `fields` built again, for each test (a mutation tool learns
    which tests reach a function from the calls each test makes: a fixture kept for the
    module would be counted to its first test only)."""
    fields = _exec(fields_module)
    imported = sys.modules[fields_module.__name__]
    sys.modules[fields_module.__name__] = fields
    try:
        return _exec(table_module)
    finally:
        sys.modules[fields_module.__name__] = imported


PINNED = [
    *zip([*SAMPLES, *EDGES], [*SAMPLES_HEX, *EDGES_HEX], strict=True),
    *TRAILING,
]


def test_the_fresh_table_writes_and_reads_the_pinned_bytes(fresh: ModuleType) -> None:
    for msg, golden in PINNED:
        assert fresh.encode(msg).hex() == golden, msg
        assert fresh.parse_message_untrusted(bytes.fromhex(golden)) == msg


def test_the_fresh_table_has_one_entry_per_message_type_on_its_channel(
    fresh: ModuleType,
) -> None:
    assert {m.kind for m in fresh._MESSAGES} == set(MessageType)
    for msg, _ in PINNED:
        assert fresh.channel_of(msg) is channel_of(msg), msg
    kinds = {fresh.channel_of(m) for m in SAMPLES}
    assert kinds == {Channel.REQUESTS, Channel.UPDATES, Channel.CHAT}


def test_the_fresh_table_tells_requests_from_server_messages(fresh: ModuleType) -> None:
    for msg in SAMPLES:
        data = encode(msg)
        if data[0] < MessageType.REFUSAL:
            assert fresh.parse_request_untrusted(data) == msg
            with pytest.raises(LobbyProtocolError, match="is a request, not a server message"):
                fresh.parse_server_message_untrusted(data)
        else:
            assert fresh.parse_server_message_untrusted(data) == msg
            with pytest.raises(LobbyProtocolError, match="is not a request"):
                fresh.parse_request_untrusted(data)


def test_the_fresh_table_refuses_every_truncation_and_extension(fresh: ModuleType) -> None:
    for msg in SAMPLES:
        data = encode(msg)
        for cut in range(len(data)):
            with pytest.raises(LobbyProtocolError):
                fresh.parse_message_untrusted(data[:cut])
        with pytest.raises(LobbyProtocolError):
            fresh.parse_message_untrusted(data + b"\x00")


def _cases(test: object) -> list[object]:
    """The parameters of one of test_protocol's parametrized tests."""
    (mark,) = [m for m in getattr(test, "pytestmark", ()) if m.name == "parametrize"]
    return [p.values if hasattr(p, "values") else p for p in mark.args[1]]


def test_the_fresh_table_refuses_what_does_not_fit(fresh: ModuleType) -> None:
    bad = _cases(test_protocol.test_encode_refuses_what_does_not_fit)
    assert len(bad) > 10
    for msg in bad:
        with pytest.raises(LobbyProtocolError):
            fresh.encode(msg)


def test_the_fresh_table_refuses_hostile_bytes_with_the_same_reasons(fresh: ModuleType) -> None:
    cases = _cases(test_protocol.test_hostile_bytes_are_refused_with_a_reason)
    assert len(cases) > 10
    for data, why in cases:  # type: ignore[misc]
        with pytest.raises(LobbyProtocolError, match=why):
            fresh.parse_message_untrusted(data)


def test_a_list_past_its_count_is_refused_with_its_reason(fresh: ModuleType) -> None:
    listing = LobbyListing(1, "r", 2, 1, {})
    page = SearchResults(1, (listing,) * 256, None)
    for codec in (table_module, fresh):
        with pytest.raises(LobbyProtocolError, match="at most 255 listings per page"):
            codec.encode(page)
    full = attrs.evolve(page, listings=(listing,) * 255)
    assert fresh.parse_message_untrusted(fresh.encode(full)) == full
    assert fresh.encode(full) == encode(full)


def test_seat_tags_round_trip_through_the_fresh_table(fresh: ModuleType) -> None:
    tags = SeatTags(7, (SeatTag("a", b"\x00" * 255), SeatTag("b", b"")))
    data = fresh.encode(tags)
    assert data == encode(tags)
    assert fresh.parse_message_untrusted(data) == tags


def test_an_object_that_is_no_message_is_refused_by_the_fresh_table(fresh: ModuleType) -> None:
    with pytest.raises(LobbyProtocolError, match="not a lobby message"):
        fresh.encode(object())  # type: ignore[arg-type]
    assert fresh.channel_of(object()) is Channel.REQUESTS  # type: ignore[arg-type]


def test_every_sample_is_a_message(fresh: ModuleType) -> None:
    msgs: list[Message] = [m for m, _ in PINNED]
    assert {fresh.encode(m)[0] for m in msgs} == set(MessageType)


# --- the field codecs, one by one -----------------------------------------------------------------


def written(codec: object, value: object) -> bytes:
    w = pf._writer()
    codec.write(w, value)  # type: ignore[attr-defined]
    return bytes(w.data)


def read(codec: object, data: bytes) -> object:
    r = pf._reader(data)
    value = codec.read(r)  # type: ignore[attr-defined]
    r.check_end()
    return value


def refused_writing(codec: object, value: object, message: str) -> None:
    with pytest.raises(LobbyProtocolError) as refused:
        written(codec, value)
    assert str(refused.value) == message


def test_a_bool_field_takes_only_a_bool() -> None:
    assert written(pf._BOOL, True) == b"\x01" and written(pf._BOOL, False) == b"\x00"
    refused_writing(pf._BOOL, 1, "expected a bool, got 1")


def test_a_bytes16_field_holds_up_to_65535_bytes_of_bytes() -> None:
    most = b"\xab" * 0xFFFF
    assert written(pf._BYTES16, most) == b"\xff\xff" + most
    assert read(pf._BYTES16, b"\xff\xff" + most) == most
    refused_writing(pf._BYTES16, most + b"\x00", "expected at most 65535 bytes")
    refused_writing(pf._BYTES16, "text", "expected at most 65535 bytes")


def test_a_bytes8_field_holds_up_to_255_bytes_of_bytes() -> None:
    most = b"\xab" * 0xFF
    assert written(pf._BYTES8, most) == b"\xff" + most
    refused_writing(pf._BYTES8, most + b"\x00", "expected at most 255 bytes")
    refused_writing(pf._BYTES8, "text", "expected at most 255 bytes")


def test_a_server_key_is_exactly_32_bytes_both_ways() -> None:
    key = bytes(range(32))
    codec = pf._PublicKey()
    assert written(codec, key) == b"\x20" + key
    assert read(codec, b"\x20" + key) == key
    for bad in (key[:31], key + b"\x00"):
        refused_writing(codec, bad, "a server key is 32 bytes")
        with pytest.raises(LobbyProtocolError) as refused:
            read(codec, bytes([len(bad)]) + bad)
        assert str(refused.value) == f"a server key of {len(bad)} bytes, not 32"
    refused_writing(codec, "k" * 32, "a server key is 32 bytes")


def test_a_map_holds_up_to_255_keys() -> None:
    most = {f"k{i}": i for i in range(255)}
    data = written(pf._VALUES, most)
    assert data[0] == 255 and read(pf._VALUES, data) == most
    refused_writing(pf._VALUES, {**most, "one more": 1}, "a map holds at most 255 keys, not 256")


def test_a_value_is_a_string_or_a_64_bit_integer_and_nothing_else() -> None:
    assert written(pf._VALUES, {"k": 5}) == b"\x01\x01k\x01" + (5).to_bytes(8, "big")
    for bad in (True, 1.5, b"x", None):
        refused_writing(pf._VALUES, {"k": bad}, f"not a lobby value: {bad!r}")
    assert written(pf._CHANGES, {"k": None}) == b"\x01\x01k\x02"


def test_a_filter_is_one_of_the_three_kinds(fresh: ModuleType) -> None:
    for codec in (table_module, fresh):
        with pytest.raises(LobbyProtocolError) as refused:
            codec.encode(QuickJoin(1, ("mode",)))  # type: ignore[arg-type]
        assert str(refused.value) == "not a filter: 'mode'"


def test_an_empty_trailing_field_sent_anyway_is_refused_with_why(fresh: ModuleType) -> None:
    data = encode(StartGame(1, 2)) + b"\x00"  # filters present, and empty
    with pytest.raises(LobbyProtocolError) as refused:
        fresh.parse_message_untrusted(data)
    assert str(refused.value) == "an empty trailing field is left out, not sent"


def test_a_trailing_field_anywhere_but_last_is_refused_by_the_fresh_codecs() -> None:
    fields = _exec(fields_module)
    with pytest.raises(TypeError, match="only the last fields may be trailing"):
        fields._Record(
            CreateLobby,
            request_id=fields._U32,
            name=fields._Trailing(fields._STR8, ""),
            max_members=fields._U16,
            private=fields._BOOL,
            metadata=fields._VALUES,
        )


# --- the JSON door, whose forms are made from the codecs when it is imported ----------------------


@pytest.fixture
def fresh_door() -> ModuleType:
    """`echo.lobby.web.jsonwire` built again on `jsonforms`, `table` and `fields` built again:
    its forms come from the table's codecs at import (an integer field's JSON range is its
    codec's low..high), so a mutant of a codec's constructor reaches the door only this way.
    `jsonforms` and `jsonwire` import `fields` and `table` from their package: both its
    attributes and `sys.modules` name the fresh ones while the door is built."""
    with pytest.MonkeyPatch.context() as patch:
        for module in (fields_module, table_module):
            made = _exec(module)
            patch.setitem(sys.modules, module.__name__, made)
            patch.setattr(protocol_package, module.__name__.rpartition(".")[2], made)
        forms = _exec(jsonforms_module)
        patch.setitem(sys.modules, jsonforms_module.__name__, forms)
        return _exec(jsonwire_module)


def test_the_json_door_takes_each_integer_field_s_range_from_its_codec(
    fresh_door: ModuleType,
) -> None:
    def quick_join(request_id: int, low: int, high: int) -> dict[str, object]:
        bounds = {"kind": "number_range", "key": "k", "low": low, "high": high}
        return {"type": "quick_join", "request_id": request_id, "filters": [bounds]}

    most = QuickJoin(0xFFFFFFFF, (NumberRange("k", I64_MIN, I64_MAX),))
    assert fresh_door.load_request(quick_join(0xFFFFFFFF, I64_MIN, I64_MAX)) == most
    for low, high in ((I64_MIN - 1, 0), (0, I64_MAX + 1)):
        with pytest.raises(fresh_door.JsonProtocolError) as refused:
            fresh_door.load_request(quick_join(1, low, high))
        assert f"expected an integer in {I64_MIN}..{I64_MAX}" in str(refused.value)
    for request_id in (-1, 0x1_0000_0000):
        with pytest.raises(fresh_door.JsonProtocolError) as refused:
            fresh_door.load_request(quick_join(request_id, 0, 0))
        assert "request_id: expected an integer in 0..4294967295" in str(refused.value)
    # a u64 is a decimal string (past 2^53 a JavaScript number is not exact)
    join = {"type": "join_lobby", "request_id": 1, "lobby_id": str(U64_MAX)}
    assert fresh_door.load_request(join) == JoinLobby(1, U64_MAX)
    with pytest.raises(fresh_door.JsonProtocolError, match="expected a 64-bit"):
        fresh_door.load_request({**join, "lobby_id": 5})


# --- the table's functions: the size limit, and what their refusals say -------------------------


def _metadata_of(size: int) -> SetMetadata:
    """A SetMetadata whose wire form is `size` bytes (about 4 string values of 64 KiB)."""
    big = "x" * 0xFFFF
    msg = SetMetadata(1, 2, {"a": big, "b": big, "c": big, "d": ""})
    rest = size - len(encode(msg))
    assert 0 <= rest <= 0xFFFF
    return attrs.evolve(msg, changes={**msg.changes, "d": "y" * rest})


def test_a_message_of_exactly_the_largest_size_is_written_and_read() -> None:
    largest = _metadata_of(MAX_MESSAGE_BYTES)
    data = encode(largest)
    assert len(data) == MAX_MESSAGE_BYTES
    assert parse_message_untrusted(data) == largest


def test_a_message_one_byte_larger_is_refused_both_ways_with_its_size() -> None:
    why = f"message of {MAX_MESSAGE_BYTES + 1} bytes exceeds {MAX_MESSAGE_BYTES}"
    with pytest.raises(LobbyProtocolError) as refused:
        encode(_metadata_of(MAX_MESSAGE_BYTES + 1))
    assert str(refused.value) == why
    with pytest.raises(LobbyProtocolError) as refused:
        parse_message_untrusted(encode(_metadata_of(MAX_MESSAGE_BYTES)) + b"\x00")
    assert str(refused.value) == why


def test_no_bytes_are_refused_as_an_empty_message() -> None:
    with pytest.raises(LobbyProtocolError) as refused:
        parse_message_untrusted(b"")
    assert str(refused.value) == "empty message"


def test_a_message_from_the_wrong_side_is_refused_by_its_name() -> None:
    with pytest.raises(LobbyProtocolError) as refused:
        parse_request_untrusted(encode(Done(7)))
    assert str(refused.value) == "Done is not a request"
    with pytest.raises(LobbyProtocolError) as refused:
        parse_server_message_untrusted(encode(JoinLobby(7, 9)))
    assert str(refused.value) == "JoinLobby is a request, not a server message"


class _LoudChat(SendChat):
    """A subclass of a message: an application's own, say, with methods of its own."""


def test_a_subclass_of_a_message_is_sent_as_that_message_on_its_channel() -> None:
    loud = _LoudChat(1, 2, "hi")
    assert encode(loud) == encode(SendChat(1, 2, "hi"))
    assert channel_of(loud) is Channel.CHAT
    assert parse_message_untrusted(encode(loud)) == SendChat(1, 2, "hi")
