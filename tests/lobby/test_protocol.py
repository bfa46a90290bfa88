"""The lobby codec: round trips of every message, channel tags, and hostile bytes."""

from __future__ import annotations

import random

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echo.lobby.protocol import (
    MAX_MESSAGE_BYTES,
    AttributesChanged,
    BanMember,
    Channel,
    ChatLine,
    CreateLobby,
    Done,
    ErrorCode,
    FreeSlots,
    GameStarting,
    JoinByCode,
    JoinLobby,
    KickMember,
    LeaveLobby,
    LeaveReason,
    LobbyJoined,
    LobbyListing,
    LobbyProtocolError,
    LobbySnapshot,
    LockChanged,
    MemberBanned,
    MemberJoined,
    MemberLeft,
    MemberState,
    Message,
    MessageType,
    MetadataChanged,
    NumberRange,
    OwnerChanged,
    Presence,
    PresenceChanged,
    QuickJoin,
    ReadyChanged,
    RecreateLobby,
    Refusal,
    SearchLobbies,
    SearchResults,
    SendChat,
    SetAttributes,
    SetLocked,
    SetMetadata,
    SetReady,
    StartGame,
    StringEquals,
    TransferOwner,
    channel_of,
    encode,
    parse_message_untrusted,
    parse_request_untrusted,
    parse_server_message_untrusted,
)

MEMBER = MemberState("ålice", 3, True, Presence.RECONNECTING, {"hero": "mage", "lvl": -7})
SNAPSHOT = LobbySnapshot(
    lobby_id=2**63 + 5,
    version=2**40,
    name="Friday 🎮 night",
    max_members=16,
    private=True,
    join_code="ABCD2345",
    locked=True,
    owner="ålice",
    metadata={"mode": "ctf", "skill": 2**63 - 1, "min": -(2**63)},
    bans=("troll", "spam"),
    members=(MEMBER, MemberState("bob", 4, False, Presence.CONNECTED, {})),
)
FILTERS = (StringEquals("mode", "ctf"), NumberRange("skill", -5, 10), FreeSlots(2))

SAMPLES: list[Message] = [
    CreateLobby(1, "room", 8, False, {"mode": "ffa", "skill": 3}),
    JoinLobby(2, 77),
    JoinByCode(3, "ABCD2345"),
    QuickJoin(4, FILTERS),
    LeaveLobby(5, 77),
    SearchLobbies(6, FILTERS, None, 50),
    SearchLobbies(7, (), 123456789, 1),
    SetMetadata(8, 77, {"mode": "ctf", "gone": None, "n": 0}),
    SetLocked(9, 77, True),
    KickMember(10, 77, "bob"),
    BanMember(11, 77, "troll"),
    TransferOwner(12, 77, "bob"),
    SetAttributes(13, 77, "bob", {"hero": None, "lvl": 9}),
    SetReady(14, 77, "bob", False),
    SendChat(15, 77, "gl hf ✌"),
    RecreateLobby(16, SNAPSHOT),
    RecreateLobby(16, SNAPSHOT, b"\x01seat\xff"),
    Refusal(2**32 - 1, ErrorCode.LOBBY_FULL, "the lobby is full"),
    Done(0),
    LobbyJoined(17, 77),
    LobbyJoined(17, 77, bytes(range(256))),
    SearchResults(18, (LobbyListing(77, "room", 3, 8, {"mode": "ffa"}, "lobby-b"),), 77),
    SearchResults(19, (), None),
    SNAPSHOT,
    MemberJoined(77, 2, MEMBER),
    MemberLeft(77, 3, "bob", LeaveReason.KICKED),
    OwnerChanged(77, 4, "bob"),
    MetadataChanged(77, 5, {"mode": None, "skill": 1}),
    LockChanged(77, 6, False),
    AttributesChanged(77, 7, "bob", {"x": "y"}),
    ReadyChanged(77, 8, "bob", True),
    PresenceChanged(77, 9, "bob", Presence.RECONNECTING),
    MemberBanned(77, 10, "troll"),
    ChatLine(77, "bob", "hello"),
    StartGame(20, 77),
    GameStarting(77, "game-1", "203.0.113.5:40123", b"\x01ticket"),
]


def test_the_samples_cover_every_message_type() -> None:
    assert {encode(m)[0] for m in SAMPLES} == set(MessageType)


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_round_trip(msg: Message) -> None:
    data = encode(msg)
    assert data[0] in set(MessageType)
    assert parse_message_untrusted(data) == msg
    assert parse_message_untrusted(bytearray(data)) == msg
    assert parse_message_untrusted(memoryview(data)) == msg


def test_channels() -> None:
    for msg in SAMPLES:
        kind = MessageType(encode(msg)[0])
        if kind in (MessageType.SEND_CHAT, MessageType.CHAT_LINE):
            expected = Channel.CHAT
        elif kind >= MessageType.LOBBY_SNAPSHOT:
            expected = Channel.UPDATES
        else:
            expected = Channel.REQUESTS
        assert channel_of(msg) is expected, msg


def test_requests_and_server_messages_are_told_apart() -> None:
    for msg in SAMPLES:
        data = encode(msg)
        if encode(msg)[0] < MessageType.REFUSAL:
            assert parse_request_untrusted(data) == msg
            with pytest.raises(LobbyProtocolError):
                parse_server_message_untrusted(data)
        else:
            assert parse_server_message_untrusted(data) == msg
            with pytest.raises(LobbyProtocolError):
                parse_request_untrusted(data)


def test_a_snapshot_message_is_compact() -> None:
    # type + ids + fields + two members: a few bytes over its contents, no per-field names.
    assert len(encode(JoinLobby(1, 2))) == 13
    assert len(encode(Done(1))) == 5
    assert len(encode(ChatLine(1, "bob", "hi"))) == 1 + 8 + 4 + 4


@pytest.mark.parametrize(
    "bad",
    [
        JoinLobby(-1, 1),
        JoinLobby(2**32, 1),
        JoinLobby(1, 2**64),
        CreateLobby(1, "x" * 256, 2, False, {}),
        CreateLobby(1, "r", 2**16, False, {}),
        CreateLobby(1, "r", 2, False, {"k": True}),
        CreateLobby(1, "r", 2, False, {"k": 2**63}),
        CreateLobby(1, "r", 2, False, {"k": None}),  # delete only in change maps
        CreateLobby(1, "\ud800", 2, False, {}),  # a lone surrogate is not UTF-8
        CreateLobby(1, "r", 2, False, {f"k{i}": i for i in range(256)}),
        SetReady(1, 2, "m", 1),  # type: ignore[arg-type]
        SendChat(1, 2, "x" * 70000),
        RecreateLobby(1, attrs.evolve(SNAPSHOT, bans=tuple(f"b{i}" for i in range(256)))),
    ],
)
def test_encode_refuses_what_does_not_fit(bad: Message) -> None:
    with pytest.raises(LobbyProtocolError):
        encode(bad)


def test_encode_refuses_oversized_messages() -> None:
    big = MemberState("m", 0, False, Presence.CONNECTED, {f"k{i}": "v" * 60000 for i in range(5)})
    with pytest.raises(LobbyProtocolError, match="exceeds"):
        encode(MemberJoined(1, 1, big))


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "empty"),
        (b"\xff", "unknown message type"),
        (bytes([MessageType.DONE]) + b"\x00\x00\x00", "truncated"),
        (bytes([MessageType.DONE]) + b"\x00\x00\x00\x01\x00", "trailing"),
        (bytes([MessageType.SET_LOCKED]) + b"\x00" * 12 + b"\x02", "bool"),
        (bytes([MessageType.JOIN_BY_CODE, 0, 0, 0, 1, 2, 0xC3, 0x28]), "UTF-8"),
        (bytes([MessageType.QUICK_JOIN, 0, 0, 0, 1, 1, 9]), "filter"),
        (bytes([MessageType.CREATE_LOBBY, 0, 0, 0, 1, 1, 65, 0, 2, 0, 1, 1, 75, 7]), "value tag"),
        (
            bytes([MessageType.CREATE_LOBBY, 0, 0, 0, 1, 1, 65, 0, 2, 0, 2])
            + (b"\x01K\x01" + b"\x00" * 8) * 2,
            "duplicate key",
        ),
        (bytes([MessageType.REFUSAL, 0, 0, 0, 1, 0x7F, 0xFF, 0, 0]), "error code"),
        (bytes([MessageType.PRESENCE_CHANGED]) + b"\x00" * 16 + b"\x01m\x07", "presence"),
        (bytes([MessageType.MEMBER_LEFT]) + b"\x00" * 16 + b"\x01m\x09", "leave reason"),
        (bytes([MessageType.SEARCH_LOBBIES, 0, 0, 0, 1, 0, 5]), "optional flag"),
        (b"\x01" * (MAX_MESSAGE_BYTES + 1), "exceeds"),
    ],
)
def test_hostile_bytes_are_refused_with_a_reason(data: bytes, why: str) -> None:
    with pytest.raises(LobbyProtocolError, match=why):
        parse_message_untrusted(data)


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_every_truncation_and_extension_is_refused(msg: Message) -> None:
    data = encode(msg)
    for cut in range(len(data)):
        with pytest.raises(LobbyProtocolError):
            parse_message_untrusted(data[:cut])
    with pytest.raises(LobbyProtocolError):
        parse_message_untrusted(data + b"\x00")


def test_mutated_messages_parse_or_raise_only_the_protocol_error() -> None:
    rng = random.Random(18)
    for msg in SAMPLES:
        data = bytearray(encode(msg))
        for _ in range(300):
            mutated = bytearray(data)
            for _ in range(rng.randint(1, 4)):
                mutated[rng.randrange(len(mutated))] = rng.randrange(256)
            try:
                parsed = parse_message_untrusted(mutated)
            except LobbyProtocolError:
                continue
            # Whatever parses re-encodes to the same bytes: one message, one form.
            assert encode(parsed) == bytes(mutated)


@settings(max_examples=500)
@given(st.binary(max_size=300))
def test_random_bytes_raise_only_the_protocol_error(data: bytes) -> None:
    for parse in (parse_message_untrusted, parse_request_untrusted, parse_server_message_untrusted):
        try:
            parse(data)
        except LobbyProtocolError:
            pass


text = st.text(max_size=20)
ids = st.text(min_size=1, max_size=10)
values = st.one_of(st.text(max_size=30), st.integers(-(2**63), 2**63 - 1))
value_maps = st.dictionaries(st.text(max_size=8), values, max_size=5)
change_maps = st.dictionaries(st.text(max_size=8), st.one_of(st.none(), values), max_size=5)
u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
filters = st.lists(
    st.one_of(
        st.builds(StringEquals, st.text(max_size=8), text),
        st.builds(
            NumberRange,
            st.text(max_size=8),
            st.integers(-(2**63), 2**63 - 1),
            st.integers(-(2**63), 2**63 - 1),
        ),
        st.builds(FreeSlots, st.integers(0, 0xFFFF)),
    ),
    max_size=4,
).map(tuple)
members = st.builds(MemberState, ids, u32, st.booleans(), st.sampled_from(Presence), value_maps)
snapshots = st.builds(
    LobbySnapshot,
    u64, u64, text, st.integers(0, 0xFFFF), st.booleans(), text, st.booleans(), ids, value_maps,
    st.lists(ids, max_size=4).map(tuple), st.lists(members, max_size=4).map(tuple),
)  # fmt: skip
messages = st.one_of(
    st.builds(CreateLobby, u32, text, st.integers(0, 0xFFFF), st.booleans(), value_maps),
    st.builds(QuickJoin, u32, filters),
    st.builds(SearchLobbies, u32, filters, st.one_of(st.none(), u64), st.integers(0, 0xFFFF)),
    st.builds(SetMetadata, u32, u64, change_maps),
    st.builds(SetAttributes, u32, u64, ids, change_maps),
    st.builds(SendChat, u32, u64, text),
    st.builds(RecreateLobby, u32, snapshots, st.binary(max_size=100)),
    st.builds(LobbyJoined, u32, u64, st.binary(max_size=100)),
    st.builds(Refusal, u32, st.sampled_from(ErrorCode), text),
    st.builds(
        SearchResults,
        u32,
        st.lists(
            st.builds(
                LobbyListing, u64, text, st.integers(0, 0xFFFF), st.integers(0, 0xFFFF), value_maps
            ),
            max_size=3,
        ).map(tuple),
        st.one_of(st.none(), u64),
    ),
    snapshots,
    st.builds(MemberJoined, u64, u64, members),
    st.builds(MemberLeft, u64, u64, ids, st.sampled_from(LeaveReason)),
    st.builds(MetadataChanged, u64, u64, change_maps),
    st.builds(ChatLine, u64, ids, text),
)


@settings(max_examples=300)
@given(messages)
def test_generated_messages_round_trip(msg: Message) -> None:
    assert parse_message_untrusted(encode(msg)) == msg
