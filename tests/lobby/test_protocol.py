"""The lobby codec: round trips of every message, channel tags, and hostile bytes."""

from __future__ import annotations

import random

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echo.lobby.protocol import (
    I64_MAX,
    I64_MIN,
    MAX_MESSAGE_BYTES,
    AttributesChanged,
    BanMember,
    Channel,
    ChatLine,
    CreateLobby,
    Done,
    ErrorCode,
    FreeSlots,
    GameCopy,
    GameDetails,
    GameEnded,
    GameLife,
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
    ReportGameServer,
    RequestTicket,
    ResumeToken,
    SearchLobbies,
    SearchResults,
    SeatTag,
    SeatTags,
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
from echo.lobby.queue_wire import CancelMatch, EnqueueMatch, Matched, Queued, QueueLeft

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
    SeatTags(77, (SeatTag("bob", bytes([1]) + b"\xaa" * 16),)),
    ResumeToken(77, b"Rtok"),
    RequestTicket(21, 77),
    ReportGameServer(22, 77, "game-1", "ticket refused: bad_signature"),
    GameEnded(77, 11, 2**64 - 1, {"winner": "bob", "turns": 9}),
    GameLife(77, 2**64 - 1, 2**32 - 1),
    EnqueueMatch(21, "duel", "eu", -1500, 2, 77, 2, b"seat", True, True, 1500),
    CancelMatch(22),
    Queued(21, 9),
    Matched(9, 77, 1234),
    QueueLeft(9, "cancelled by bob"),
]


# --- the exact bytes, pinned -----------------------------------------------------------------
# The hex below was produced by the per-type encoder before the table-driven codec replaced it
# (the codec's refactoring had to keep every byte): SAMPLES_HEX[i] is SAMPLES[i]'s, and EDGES
# adds the edge values of the fields (largest integers, empty and longest strings, every enum
# member). A new message or field adds entries; it never changes one.

EDGE_MEMBER = MemberState("m" * 255, 2**32 - 1, False, Presence.CONNECTED, {})
EMPTY_SNAPSHOT = LobbySnapshot(0, 0, "", 0, False, "", False, "", {}, (), ())
EDGE_FILTERS = (StringEquals("", ""), NumberRange("k", I64_MIN, I64_MAX), FreeSlots(0xFFFF))
EDGES: list[Message] = [
    CreateLobby(2**32 - 1, "n" * 255, 0xFFFF, True, {"": "", "s": "v" * 300, "i": I64_MIN}),
    CreateLobby(0, "", 0, False, {}),
    JoinLobby(0, 2**64 - 1),
    JoinByCode(3, ""),
    QuickJoin(4, ()),
    SearchLobbies(7, EDGE_FILTERS, 123456789, 1),
    SearchLobbies(7, (), 2**64 - 1, 0xFFFF),
    SearchLobbies(7, (), 0, 0),
    SetMetadata(8, 77, {}),
    SetLocked(9, 77, False),
    SetReady(14, 77, "bob", True),
    SendChat(15, 77, ""),
    RecreateLobby(16, EMPTY_SNAPSHOT, b""),
    Refusal(0, ErrorCode.BAD_REQUEST, ""),
    Refusal(1, ErrorCode.NO_GAME_SERVER, "ø"),
    Done(2**32 - 1),
    LobbyJoined(0, 2**64 - 1, b"\x00"),
    SearchResults(
        18,
        (
            LobbyListing(1, "", 0, 0, {}),
            LobbyListing(2**64 - 1, "x", 0xFFFF, 0xFFFF, {"s": 1}, "h"),
        ),
        None,
    ),
    EMPTY_SNAPSHOT,
    MemberJoined(2**64 - 1, 2**64 - 1, EDGE_MEMBER),
    MemberLeft(77, 3, "bob", LeaveReason.LEFT),
    MemberLeft(77, 3, "bob", LeaveReason.BANNED),
    MemberLeft(77, 3, "bob", LeaveReason.DROPPED),
    MemberLeft(77, 3, "bob", LeaveReason.DISPLACED),
    LockChanged(77, 6, True),
    PresenceChanged(77, 9, "bob", Presence.CONNECTED),
    GameStarting(0, "", "", b""),
    ChatLine(77, "bob", "x" * 300),
    SeatTags(2**64 - 1, ()),
]

SAMPLES_HEX = [
    "010000000104726f6f6d00080002046d6f646500000366666105736b696c6c010000000000000003",
    "0200000002000000000000004d",
    "0300000003084142434432333435",
    "04000000040300046d6f646500036374660105736b696c6cfffffffffffffffb000000000000000a020002",
    "0500000005000000000000004d",
    (
        "06000000060300046d6f646500036374660105736b696c6cfffffffffffffffb000000000000000a02000200"
        "0032"
    ),
    "0600000007000100000000075bcd150001",
    "0700000008000000000000004d03046d6f646500000363746604676f6e6502016e010000000000000000",
    "0800000009000000000000004d01",
    "090000000a000000000000004d03626f62",
    "0a0000000b000000000000004d0574726f6c6c",
    "0b0000000c000000000000004d03626f62",
    "0c0000000d000000000000004d03626f6202046865726f02036c766c010000000000000009",
    "0d0000000e000000000000004d03626f6200",
    "0e0000000f000000000000004d0009676c20686620e29c8c",
    (
        "0f00000010800000000000000500000100000000001146726964617920f09f8eae206e696768740010010841"
        "424344323334350106c3a56c69636503046d6f646500000363746605736b696c6c017fffffffffffffff036d"
        "696e018000000000000000020574726f6c6c047370616d000206c3a56c69636500000003010102046865726f"
        "0000046d616765036c766c01fffffffffffffff903626f62000000040000000000"
    ),
    (
        "0f00000010800000000000000500000100000000001146726964617920f09f8eae206e696768740010010841"
        "424344323334350106c3a56c69636503046d6f646500000363746605736b696c6c017fffffffffffffff036d"
        "696e018000000000000000020574726f6c6c047370616d000206c3a56c69636500000003010102046865726f"
        "0000046d616765036c766c01fffffffffffffff903626f620000000400000000060173656174ff"
    ),
    "20ffffffff00060011746865206c6f6262792069732066756c6c",
    "2100000000",
    "2200000011000000000000004d0000",
    (
        "2200000011000000000000004d0100000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c"
        "1d1e1f202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f404142434445464748"
        "494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f606162636465666768696a6b6c6d6e6f7071727374"
        "75767778797a7b7c7d7e7f808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9fa0"
        "a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebfc0c1c2c3c4c5c6c7c8c9cacbcc"
        "cdcecfd0d1d2d3d4d5d6d7d8d9dadbdcdddedfe0e1e2e3e4e5e6e7e8e9eaebecedeeeff0f1f2f3f4f5f6f7f8"
        "f9fafbfcfdfeff"
    ),
    (
        "230000001201000000000000004d04726f6f6d0003000801046d6f6465000003666661076c6f6262792d6201"
        "000000000000004d"
    ),
    "23000000130000",
    (
        "40800000000000000500000100000000001146726964617920f09f8eae206e69676874001001084142434432"
        "3334350106c3a56c69636503046d6f646500000363746605736b696c6c017fffffffffffffff036d696e0180"
        "00000000000000020574726f6c6c047370616d000206c3a56c69636500000003010102046865726f0000046d"
        "616765036c766c01fffffffffffffff903626f6200000004000000"
    ),
    (
        "41000000000000004d000000000000000206c3a56c69636500000003010102046865726f0000046d61676503"
        "6c766c01fffffffffffffff9"
    ),
    "42000000000000004d000000000000000303626f6201",
    "43000000000000004d000000000000000403626f62",
    "44000000000000004d000000000000000502046d6f64650205736b696c6c010000000000000001",
    "45000000000000004d000000000000000600",
    "46000000000000004d000000000000000703626f6201017800000179",
    "47000000000000004d000000000000000803626f6201",
    "48000000000000004d000000000000000903626f6201",
    "49000000000000004d000000000000000a0574726f6c6c",
    "60000000000000004d03626f62000568656c6c6f",
    "1000000014000000000000004d",
    "4a000000000000004d0667616d652d31113230332e302e3131332e353a34303132330007017469636b6574",
    "4b000000000000004d000103626f621101aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "4c000000000000004d000452746f6b",
    "1100000015000000000000004d",
    (
        "1200000016000000000000004d0667616d652d31001d7469636b657420726566757365643a206261645f7369"
        "676e6174757265"
    ),
    (
        "4d000000000000004d000000000000000bffffffffffffffff020677696e6e65720000" + "03626f62"
        "057475726e730100000000000000" + "09"
    ),
    # GameLife: u64 lobby id, u64 match id, u32 life left in ms.
    "4e000000000000004d" + "ff" * 8 + "ffffffff",
    "1800000015046475656c026575fffffffffffffa240002000000000000004d00020004736561740101000005dc",
    "1900000016",
    "28000000150000000000000009",
    "580000000000000009000000000000004d000004d2",
    "590000000000000009001063616e63656c6c656420627920626f62",
]
EDGES_HEX = [
    (
        "01ffffffffff6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e"
        "6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e"
        "6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e"
        "6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e"
        "6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e"
        "6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6e6effff01"
        "0300000000017300012c76767676767676767676767676767676767676767676767676767676767676767676"
        "7676767676767676767676767676767676767676767676767676767676767676767676767676767676767676"
        "7676767676767676767676767676767676767676767676767676767676767676767676767676767676767676"
        "7676767676767676767676767676767676767676767676767676767676767676767676767676767676767676"
        "7676767676767676767676767676767676767676767676767676767676767676767676767676767676767676"
        "7676767676767676767676767676767676767676767676767676767676767676767676767676767676767676"
        "7676767676767676767676767676767676767676767676767676767676767676767676767676767676767676"
        "76760169018000000000000000"
    ),
    "01000000000000000000",
    "0200000000ffffffffffffffff",
    "030000000300",
    "040000000400",
    "0600000007030000000001016b80000000000000007fffffffffffffff02ffff0100000000075bcd150001",
    "06000000070001ffffffffffffffffffff",
    "0600000007000100000000000000000000",
    "0700000008000000000000004d00",
    "0800000009000000000000004d00",
    "0d0000000e000000000000004d03626f6201",
    "0e0000000f000000000000004d0000",
    "0f000000100000000000000000000000000000000000000000000000000000000000",
    "200000000000010000",
    "200000000100190002c3b8",
    "21ffffffff",
    "2200000000ffffffffffffffff000100",
    (
        "230000001202000000000000000100000000000000ffffffffffffffff0178ffffffff010173010000000000"
        "000001016800"
    ),
    "40000000000000000000000000000000000000000000000000000000",
    (
        "41ffffffffffffffffffffffffffffffffff6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d"
        "6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d"
        "6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d"
        "6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d"
        "6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d"
        "6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d6d"
        "6d6d6d6d6d6d6d6d6dffffffff000000"
    ),
    "42000000000000004d000000000000000303626f6200",
    "42000000000000004d000000000000000303626f6202",
    "42000000000000004d000000000000000303626f6203",
    "42000000000000004d000000000000000303626f6204",
    "45000000000000004d000000000000000601",
    "48000000000000004d000000000000000903626f6200",
    "4a000000000000000000000000",
    (
        "60000000000000004d03626f62012c7878787878787878787878787878787878787878787878787878787878"
        "7878787878787878787878787878787878787878787878787878787878787878787878787878787878787878"
        "7878787878787878787878787878787878787878787878787878787878787878787878787878787878787878"
        "7878787878787878787878787878787878787878787878787878787878787878787878787878787878787878"
        "7878787878787878787878787878787878787878787878787878787878787878787878787878787878787878"
        "7878787878787878787878787878787878787878787878787878787878787878787878787878787878787878"
        "7878787878787878787878787878787878787878787878787878787878787878787878787878787878787878"
        "78787878787878"
    ),
    "4bffffffffffffffff0000",
]


# Messages with a trailing field (added after the message shipped, left out when empty): the
# bytes before it are the message without it, which old parsers read and new ones still do.
TRAILING: list[tuple[Message, str]] = [
    (
        StartGame(20, 77, (StringEquals("region", "eu"),)),
        # StartGame(20, 77)'s bytes, then the filters: u8 count 1, kind 0, str8, str16.
        "1000000014000000000000004d" + "01" + "00" + "06726567696f6e" + "0002" + "6575",
    ),
    (
        GameStarting(
            77, "game-1", "203.0.113.5:40123", b"\x01ticket", GameDetails(5, 9001, "shared")
        ),
        # GameStarting's bytes as before, then the details: u64 match id, u16 control port,
        # str8 duologue-port mode.
        "4a000000000000004d0667616d652d31113230332e302e3131332e353a34303132330007017469636b6574"
        + "0000000000000005"
        + "2329"
        + "06736861726564",
    ),
    (
        RecreateLobby(16, EMPTY_SNAPSHOT, b"", (SeatTag("a", bytes([1]) + b"\x02" * 16),)),
        # type, request id, the empty snapshot (27 bytes), an empty seat, then the tags: u16
        # count 1, str8 "a", u8 length 17, key id 1 and 16 bytes.
        "0f00000010" + "00" * 27 + "0000" + "000101611101" + "02" * 16,
    ),
    (
        RecreateLobby(
            16, SNAPSHOT, b"\x01seat\xff", (SeatTag("bob", b"\x01t"), SeatTag("bob", b""))
        ),
        SAMPLES_HEX[SAMPLES.index(RecreateLobby(16, SNAPSHOT, b"\x01seat\xff"))]
        + "0002"
        + "03626f6202"
        + "0174"
        + "03626f6200",
    ),
    (
        RecreateLobby(16, EMPTY_SNAPSHOT, b"", (), GameCopy(b"\x02tk", 90_000)),
        # An empty seat, then a game copy after trailing tags left empty: the empty tags are
        # written (u16 count 0), then the copy: bytes16 ticket, u32 life left in ms.
        "0f00000010" + "00" * 27 + "0000" + "0000" + "0003" + "02746b" + "00015f90",
    ),
]


PINNED = [
    pytest.param(msg, golden, id=f"{i}-{type(msg).__name__}")
    for i, (msg, golden) in enumerate(
        [
            *zip([*SAMPLES, *EDGES], [*SAMPLES_HEX, *EDGES_HEX], strict=True),
            *TRAILING,
        ]
    )
]


@pytest.mark.parametrize(("msg", "golden"), PINNED)
def test_the_wire_bytes_are_the_pinned_ones(msg: Message, golden: str) -> None:
    assert encode(msg).hex() == golden
    assert parse_message_untrusted(bytes.fromhex(golden)) == msg


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


#: Each trailing field's empty value, and its bytes if it were sent anyway.
_EMPTY = {
    "seat_tags": ((), "0000"),
    "filters": ((), "00"),
    "details": (GameDetails(), "00" * 11),
    # (sent anyway after the empty tags of the message that tests it)
    "game": (GameCopy(), "0000" + "0000" + "00000000"),
}


@pytest.mark.parametrize(("msg", "golden"), TRAILING)
def test_a_trailing_field_is_optional_and_never_empty(msg: Message, golden: str) -> None:
    data = bytes.fromhex(golden)
    # The last trailing field present (the ones after it are empty, and left out).
    last = next(
        f
        for f in reversed(attrs.fields(type(msg)))
        if f.name in _EMPTY and getattr(msg, f.name) != _EMPTY[f.name][0]
    )
    without = attrs.evolve(msg, **{last.name: _EMPTY[last.name][0]})
    base = encode(without)
    # Without the field, the bytes are those of the message before the field existed.
    assert data.startswith(base) and len(data) > len(base)
    for cut in range(len(data)):
        if cut == len(base):
            assert parse_message_untrusted(data[:cut]) == without
        else:
            with pytest.raises(LobbyProtocolError):
                parse_message_untrusted(data[:cut])
    with pytest.raises(LobbyProtocolError):
        parse_message_untrusted(data + b"\x00")
    # Present, it holds something: an empty one sent anyway is not a second form.
    with pytest.raises(LobbyProtocolError, match="empty trailing field"):
        parse_message_untrusted(base + bytes.fromhex(_EMPTY[last.name][1]))


def test_a_trailing_field_is_the_last_of_a_message_only() -> None:
    from echo.lobby.protocol.fields import _U32, _U64, _Record, _Trailing
    from echo.lobby.protocol.table import _Message

    with pytest.raises(TypeError, match="only the last"):
        _Record(JoinLobby, request_id=_Trailing(_U32, 0), lobby_id=_U64)
    inner = _Record(JoinLobby, request_id=_U32, lobby_id=_Trailing(_U64, 0))
    with pytest.raises(TypeError, match="inside a record"):
        _Message(MessageType.JOIN_LOBBY, Channel.REQUESTS, RecreateLobby,
                 request_id=_U32, snapshot=inner, seat=_U32, seat_tags=_U32,
                 game=_U32)  # fmt: skip
    # Several trailing fields: the last ones, none fixed after them.
    with pytest.raises(TypeError, match="only the last"):
        _Record(JoinLobby, request_id=_Trailing(_U32, 0), lobby_id=_U64)
    both = _Record(JoinLobby, request_id=_Trailing(_U32, 0), lobby_id=_Trailing(_U64, 0))
    assert [name for name, _ in both._tail] == ["request_id", "lobby_id"]


def test_mutated_messages_parse_or_raise_only_the_protocol_error() -> None:
    rng = random.Random(18)
    for msg in [*SAMPLES, *(m for m, _ in TRAILING)]:
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
seat_tag_lists = st.lists(st.builds(SeatTag, ids, st.binary(max_size=20)), max_size=3).map(tuple)
messages = st.one_of(
    st.builds(CreateLobby, u32, text, st.integers(0, 0xFFFF), st.booleans(), value_maps),
    st.builds(QuickJoin, u32, filters),
    st.builds(SearchLobbies, u32, filters, st.one_of(st.none(), u64), st.integers(0, 0xFFFF)),
    st.builds(SetMetadata, u32, u64, change_maps),
    st.builds(SetAttributes, u32, u64, ids, change_maps),
    st.builds(SendChat, u32, u64, text),
    st.builds(RecreateLobby, u32, snapshots, st.binary(max_size=100)),
    st.builds(RecreateLobby, u32, snapshots, st.binary(max_size=100), seat_tag_lists),
    st.builds(SeatTags, u64, seat_tag_lists),
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


def test_a_table_entry_names_every_field_of_its_class_in_order() -> None:
    from echo.lobby.protocol.fields import _U32, _U64, _Record

    _Record(JoinLobby, request_id=_U32, lobby_id=_U64)
    for wrong in ({"request_id": _U32}, {"lobby_id": _U64, "request_id": _U32}):
        with pytest.raises(TypeError, match="JoinLobby"):
            _Record(JoinLobby, **wrong)
