"""The lobby codec's exact bytes, pinned: one instance of every message type and the edge values
of its fields (largest integers, empty and longest strings, every enum member), with the hex
today's codec produced for each. A refactoring of the codec must keep every byte.

The hex was produced by the per-type encoder before the table-driven codec replaced it; a new
field or message type adds an entry here, never changes one.
"""

from __future__ import annotations

import pytest

from echo.lobby.listings import (
    ListingGone,
    ListingRecord,
    encode_listing_record,
    parse_listing_record_untrusted,
)
from echo.lobby.protocol import (
    AttributesChanged,
    BanMember,
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
    encode,
    parse_message_untrusted,
)

I64_LO, I64_HI = -(2**63), 2**63 - 1
MEMBER = MemberState("ålice", 3, True, Presence.RECONNECTING, {"hero": "mage", "lvl": -7})
EDGE_MEMBER = MemberState("m" * 255, 2**32 - 1, False, Presence.CONNECTED, {})
SNAPSHOT = LobbySnapshot(
    lobby_id=2**63 + 5,
    version=2**40,
    name="Friday 🎮 night",
    max_members=16,
    private=True,
    join_code="ABCD2345",
    locked=True,
    owner="ålice",
    metadata={"mode": "ctf", "skill": I64_HI, "min": I64_LO},
    bans=("troll", "spam"),
    members=(MEMBER, MemberState("bob", 4, False, Presence.CONNECTED, {})),
)
EMPTY_SNAPSHOT = LobbySnapshot(0, 0, "", 0, False, "", False, "", {}, (), ())
FILTERS = (StringEquals("mode", "ctf"), NumberRange("skill", -5, 10), FreeSlots(2))
EDGE_FILTERS = (StringEquals("", ""), NumberRange("k", I64_LO, I64_HI), FreeSlots(0xFFFF))
CASES: list[Message] = [
    CreateLobby(1, "room", 8, False, {"mode": "ffa", "skill": 3}),
    CreateLobby(2**32 - 1, "n" * 255, 0xFFFF, True, {"": "", "s": "v" * 300, "i": I64_LO}),
    CreateLobby(0, "", 0, False, {}),
    JoinLobby(2, 77),
    JoinLobby(0, 2**64 - 1),
    JoinByCode(3, "ABCD2345"),
    JoinByCode(3, ""),
    QuickJoin(4, FILTERS),
    QuickJoin(4, ()),
    LeaveLobby(5, 77),
    SearchLobbies(6, FILTERS, None, 50),
    SearchLobbies(7, EDGE_FILTERS, 123456789, 1),
    SearchLobbies(7, (), 2**64 - 1, 0xFFFF),
    SearchLobbies(7, (), 0, 0),
    SetMetadata(8, 77, {"mode": "ctf", "gone": None, "n": 0}),
    SetMetadata(8, 77, {}),
    SetLocked(9, 77, True),
    SetLocked(9, 77, False),
    KickMember(10, 77, "bob"),
    BanMember(11, 77, "troll"),
    TransferOwner(12, 77, "bob"),
    SetAttributes(13, 77, "bob", {"hero": None, "lvl": 9}),
    SetReady(14, 77, "bob", False),
    SetReady(14, 77, "bob", True),
    SendChat(15, 77, "gl hf ✌"),
    SendChat(15, 77, ""),
    RecreateLobby(16, SNAPSHOT),
    RecreateLobby(16, SNAPSHOT, b"\x01seat\xff"),
    RecreateLobby(16, EMPTY_SNAPSHOT, b""),
    StartGame(20, 77),
    Refusal(2**32 - 1, ErrorCode.LOBBY_FULL, "the lobby is full"),
    Refusal(0, ErrorCode.BAD_REQUEST, ""),
    Refusal(1, ErrorCode.NO_GAME_SERVER, "ø"),
    Done(0),
    Done(2**32 - 1),
    LobbyJoined(17, 77),
    LobbyJoined(17, 77, bytes(range(256))),
    LobbyJoined(0, 2**64 - 1, b"\x00"),
    SearchResults(18, (LobbyListing(77, "room", 3, 8, {"mode": "ffa"}, "lobby-b"),), 77),
    SearchResults(
        18,
        (
            LobbyListing(1, "", 0, 0, {}),
            LobbyListing(2**64 - 1, "x", 0xFFFF, 0xFFFF, {"s": 1}, "h"),
        ),
        None,
    ),
    SearchResults(19, (), None),
    SNAPSHOT,
    EMPTY_SNAPSHOT,
    MemberJoined(77, 2, MEMBER),
    MemberJoined(2**64 - 1, 2**64 - 1, EDGE_MEMBER),
    *[MemberLeft(77, 3, "bob", reason) for reason in LeaveReason],
    OwnerChanged(77, 4, "bob"),
    MetadataChanged(77, 5, {"mode": None, "skill": 1}),
    LockChanged(77, 6, False),
    LockChanged(77, 6, True),
    AttributesChanged(77, 7, "bob", {"x": "y"}),
    ReadyChanged(77, 8, "bob", True),
    *[PresenceChanged(77, 9, "bob", p) for p in Presence],
    MemberBanned(77, 10, "troll"),
    GameStarting(77, "game-1", "203.0.113.5:40123", b"\x01ticket"),
    GameStarting(0, "", "", b""),
    ChatLine(77, "bob", "hello"),
    ChatLine(77, "bob", "x" * 300),
]

GOLDEN = [
    "010000000104726f6f6d00080002046d6f646500000366666105736b696c6c010000000000000003",
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
    "0200000002000000000000004d",
    "0200000000ffffffffffffffff",
    "0300000003084142434432333435",
    "030000000300",
    "04000000040300046d6f646500036374660105736b696c6cfffffffffffffffb000000000000000a020002",
    "040000000400",
    "0500000005000000000000004d",
    (
        "06000000060300046d6f646500036374660105736b696c6cfffffffffffffffb000000000000000a02000200"
        "0032"
    ),
    "0600000007030000000001016b80000000000000007fffffffffffffff02ffff0100000000075bcd150001",
    "06000000070001ffffffffffffffffffff",
    "0600000007000100000000000000000000",
    "0700000008000000000000004d03046d6f646500000363746604676f6e6502016e010000000000000000",
    "0700000008000000000000004d00",
    "0800000009000000000000004d01",
    "0800000009000000000000004d00",
    "090000000a000000000000004d03626f62",
    "0a0000000b000000000000004d0574726f6c6c",
    "0b0000000c000000000000004d03626f62",
    "0c0000000d000000000000004d03626f6202046865726f02036c766c010000000000000009",
    "0d0000000e000000000000004d03626f6200",
    "0d0000000e000000000000004d03626f6201",
    "0e0000000f000000000000004d0009676c20686620e29c8c",
    "0e0000000f000000000000004d0000",
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
    "0f000000100000000000000000000000000000000000000000000000000000000000",
    "1000000014000000000000004d",
    "20ffffffff00060011746865206c6f6262792069732066756c6c",
    "200000000000010000",
    "200000000100190002c3b8",
    "2100000000",
    "21ffffffff",
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
    "2200000000ffffffffffffffff000100",
    (
        "230000001201000000000000004d04726f6f6d0003000801046d6f6465000003666661076c6f6262792d6201"
        "000000000000004d"
    ),
    (
        "230000001202000000000000000100000000000000ffffffffffffffff0178ffffffff010173010000000000"
        "000001016800"
    ),
    "23000000130000",
    (
        "40800000000000000500000100000000001146726964617920f09f8eae206e69676874001001084142434432"
        "3334350106c3a56c69636503046d6f646500000363746605736b696c6c017fffffffffffffff036d696e0180"
        "00000000000000020574726f6c6c047370616d000206c3a56c69636500000003010102046865726f0000046d"
        "616765036c766c01fffffffffffffff903626f6200000004000000"
    ),
    "40000000000000000000000000000000000000000000000000000000",
    (
        "41000000000000004d000000000000000206c3a56c69636500000003010102046865726f0000046d61676503"
        "6c766c01fffffffffffffff9"
    ),
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
    "42000000000000004d000000000000000303626f6201",
    "42000000000000004d000000000000000303626f6202",
    "42000000000000004d000000000000000303626f6203",
    "42000000000000004d000000000000000303626f6204",
    "43000000000000004d000000000000000403626f62",
    "44000000000000004d000000000000000502046d6f64650205736b696c6c010000000000000001",
    "45000000000000004d000000000000000600",
    "45000000000000004d000000000000000601",
    "46000000000000004d000000000000000703626f6201017800000179",
    "47000000000000004d000000000000000803626f6201",
    "48000000000000004d000000000000000903626f6200",
    "48000000000000004d000000000000000903626f6201",
    "49000000000000004d000000000000000a0574726f6c6c",
    "4a000000000000004d0667616d652d31113230332e302e3131332e353a34303132330007017469636b6574",
    "4a000000000000000000000000",
    "60000000000000004d03626f62000568656c6c6f",
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
]


PINNED = [
    pytest.param(msg, golden, id=f"{i}-{type(msg).__name__}")
    for i, (msg, golden) in enumerate(zip(CASES, GOLDEN, strict=True))
]


def test_every_message_type_is_pinned() -> None:
    assert len(CASES) == len(GOLDEN)
    assert {bytes.fromhex(h)[0] for h in GOLDEN} == set(MessageType)


@pytest.mark.parametrize(("msg", "golden"), PINNED)
def test_encode_gives_the_pinned_bytes(msg: Message, golden: str) -> None:
    assert encode(msg).hex() == golden


@pytest.mark.parametrize(("msg", "golden"), PINNED)
def test_the_pinned_bytes_decode_to_the_message(msg: Message, golden: str) -> None:
    assert parse_message_untrusted(bytes.fromhex(golden)) == msg


# The listings topic record (echo.lobby.listings) shares the codec's field encodings.
LISTING_RECORDS = [
    (
        LobbyListing(77, "room", 3, 8, {"mode": "ffa", "skill": -1}, "lobby-b"),
        "0100000000000000004d04726f6f6d0003000802046d6f646500000366666105736b696c6c01ffffffffffffffff"
        "076c6f6262792d62",
    ),
    (ListingGone(2**64 - 1, "h"), "0101ffffffffffffffff0168"),
]


@pytest.mark.parametrize(("record", "golden"), LISTING_RECORDS)
def test_listing_records_keep_their_bytes(record: ListingRecord, golden: str) -> None:
    assert encode_listing_record(record).hex() == golden
    assert parse_listing_record_untrusted(bytes.fromhex(golden)) == record
