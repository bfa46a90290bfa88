"""Lobby messages and their compact binary codec (issue 18 items 1, 3 and 4).

Every message is one transport message: a one-byte type, then its fields in the order of the
record, big-endian. Requests carry a client-chosen u32 ``request_id`` that the one reply to
them repeats. Each message belongs to one of three logical channels (`Channel`): requests and
replies, state updates, chat. This module only tags them; carrying them with credit is the
channels layer's job (seed 003), so a member flooding chat cannot delay lobby state.

Field encodings:

==========  ===========================================================================
u8/u16/...  unsigned big-endian integers; ``bool`` is a u8 that must be 0 or 1
str8        u8 byte length + UTF-8 (ids, keys, names, codes)
str16       u16 byte length + UTF-8 (values, chat text, messages)
bytes16     u16 byte length + bytes (seats)
value       u8 tag + body: 0 = str16, 1 = i64; in change maps also 2 = delete (no body)
map         u8 count + count x (str8 key, value); keys unique
filters     u8 count + count x (u8 kind, ...): 0 = string equals (str8 key, str16 value),
            1 = number range (str8 key, i64 low, i64 high), 2 = free slots (u16 minimum)
opt u64     u8 flag + u64 if the flag is 1
==========  ===========================================================================

The snapshot of a lobby (``LobbySnapshot``, also the body of the recreate request) is: u64
lobby id, u64 version, str8 name, u16 max members, bool private, str8 join code (empty for a
public lobby), bool locked, str8 owner, map metadata, u8 count + str8 banned member ids,
u16 count + members (str8 member id, u32 join sequence, bool ready, u8 presence, map
attributes). The message table with type numbers is in `MessageType` and the README.

``parse_*_untrusted`` take bytes straight from the network and raise only
`LobbyProtocolError`; they cost O(len(data)) (every count is bounded by the bytes that remain).
Semantic limits (sizes of names, metadata, attributes, chat) are the registry's, which refuses
with an error code; the codec only enforces the structure.

Pure module: no trio, no clock, no I/O.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Mapping
from typing import Final, TypeAlias

import attrs

# Bigger than any message the default limits allow (a full snapshot of 64 members with 1 KiB of
# attributes each is ~70 KiB); a parser refuses anything larger before reading it.
MAX_MESSAGE_BYTES: Final = 256 * 1024
U32_MAX: Final = 2**32 - 1
U64_MAX: Final = 2**64 - 1
I64_MIN: Final = -(2**63)
I64_MAX: Final = 2**63 - 1

Value: TypeAlias = "str | int"
# A change map: None deletes the key.
Changes: TypeAlias = "Mapping[str, str | int | None]"


class LobbyProtocolError(Exception):
    """Bytes that are not a lobby message (or a record that cannot be encoded)."""


class Channel(enum.IntEnum):
    """The logical channel a message travels on (issue 18 item 3)."""

    REQUESTS = 0  # requests and their replies
    UPDATES = 1  # lobby state updates, in version order
    CHAT = 2  # chat lines and chat requests: flooding here must not delay the others


class ErrorCode(enum.IntEnum):
    """Why the lobby refused a request (carried in `Refusal`)."""

    BAD_REQUEST = 1  # undecodable, or a field out of its range (e.g. max members 0)
    NO_SUCH_LOBBY = 2
    NOT_MEMBER = 3  # the sender is not in that lobby
    NOT_OWNER = 4  # an owner-only operation by another member
    ALREADY_IN_LOBBY = 5  # a member is in at most one lobby per server
    LOBBY_FULL = 6
    LOBBY_LOCKED = 7
    PRIVATE_LOBBY = 8  # a private lobby is joined by its code, never by id or quick-join
    NO_SUCH_CODE = 9
    BANNED = 10
    NO_MATCH = 11  # quick-join found no lobby
    RATE_LIMITED = 12
    NAME_INVALID = 13
    METADATA_LIMIT = 14
    ATTRIBUTES_LIMIT = 15
    CHAT_LIMIT = 16
    FILTER_INVALID = 17  # a filter on a key that is not indexed, too many filters, low > high
    NO_SUCH_MEMBER = 18
    OTHER_MEMBER = 19  # attributes and ready state are set only by their own member
    MEMBER_NOT_CONNECTED = 20  # ownership goes only to a connected member
    BAN_LIST_FULL = 21
    SERVER_FULL = 22  # this server holds its maximum number of lobbies
    RECREATE_REFUSED = 23  # the lobby lives here and is not being recreated
    NOT_READY = 24  # start while a connected member is not ready
    NO_GAME_SERVER = 25  # no announced game server has room for the lobby


class Presence(enum.IntEnum):
    CONNECTED = 0
    RECONNECTING = 1  # the session dropped; the seat is kept until the grace period ends


class LeaveReason(enum.IntEnum):
    LEFT = 0
    KICKED = 1
    BANNED = 2
    DROPPED = 3  # the reconnection grace period ran out
    DISPLACED = 4  # a recreated lobby had no seat left for a member who had not come back


class MessageType(enum.IntEnum):
    # requests (client -> server); all on Channel.REQUESTS except SEND_CHAT on Channel.CHAT
    CREATE_LOBBY = 0x01
    JOIN_LOBBY = 0x02
    JOIN_BY_CODE = 0x03
    QUICK_JOIN = 0x04
    LEAVE_LOBBY = 0x05
    SEARCH_LOBBIES = 0x06
    SET_METADATA = 0x07
    SET_LOCKED = 0x08
    KICK_MEMBER = 0x09
    BAN_MEMBER = 0x0A
    TRANSFER_OWNER = 0x0B
    SET_ATTRIBUTES = 0x0C
    SET_READY = 0x0D
    SEND_CHAT = 0x0E
    RECREATE_LOBBY = 0x0F
    START_GAME = 0x10
    # replies (server -> client), Channel.REQUESTS
    REFUSAL = 0x20
    DONE = 0x21
    LOBBY_JOINED = 0x22
    SEARCH_RESULTS = 0x23
    # state updates (server -> members), Channel.UPDATES
    LOBBY_SNAPSHOT = 0x40
    MEMBER_JOINED = 0x41
    MEMBER_LEFT = 0x42
    OWNER_CHANGED = 0x43
    METADATA_CHANGED = 0x44
    LOCK_CHANGED = 0x45
    ATTRIBUTES_CHANGED = 0x46
    READY_CHANGED = 0x47
    PRESENCE_CHANGED = 0x48
    MEMBER_BANNED = 0x49
    GAME_STARTING = 0x4A
    # chat (server -> members), Channel.CHAT
    CHAT_LINE = 0x60


# --- records shared by several messages -------------------------------------------------------


@attrs.frozen
class StringEquals:
    key: str
    value: str


@attrs.frozen
class NumberRange:
    """low <= value <= high (both inclusive)."""

    key: str
    low: int
    high: int


@attrs.frozen
class FreeSlots:
    minimum: int


Filter: TypeAlias = StringEquals | NumberRange | FreeSlots


@attrs.frozen
class MemberState:
    member_id: str
    join_seq: int  # order of joining; owner migration picks the lowest (state.py)
    ready: bool
    presence: Presence
    attributes: Mapping[str, Value]


@attrs.frozen
class LobbySnapshot:
    """A lobby's whole state as its members see it; members are in join order."""

    lobby_id: int
    version: int
    name: str
    max_members: int
    private: bool
    join_code: str  # "" for a public lobby
    locked: bool
    owner: str
    metadata: Mapping[str, Value]
    bans: tuple[str, ...]
    members: tuple[MemberState, ...]


@attrs.frozen
class LobbyListing:
    """One search result: only the indexed metadata travels (listings stay small)."""

    lobby_id: int
    name: str
    member_count: int
    max_members: int
    metadata: Mapping[str, Value]
    home: str = ""  # the lobby server that holds it: where to join it


# --- requests ---------------------------------------------------------------------------------


@attrs.frozen
class CreateLobby:
    request_id: int
    name: str
    max_members: int
    private: bool
    metadata: Mapping[str, Value]


@attrs.frozen
class JoinLobby:
    request_id: int
    lobby_id: int


@attrs.frozen
class JoinByCode:
    request_id: int
    code: str


@attrs.frozen
class QuickJoin:
    request_id: int
    filters: tuple[Filter, ...]


@attrs.frozen
class LeaveLobby:
    request_id: int
    lobby_id: int


@attrs.frozen
class SearchLobbies:
    request_id: int
    filters: tuple[Filter, ...]
    cursor: int | None  # the `next_cursor` of the previous page, None for the first page
    limit: int


@attrs.frozen
class SetMetadata:
    request_id: int
    lobby_id: int
    changes: Changes


@attrs.frozen
class SetLocked:
    request_id: int
    lobby_id: int
    locked: bool


@attrs.frozen
class KickMember:
    request_id: int
    lobby_id: int
    member_id: str


@attrs.frozen
class BanMember:
    request_id: int
    lobby_id: int
    member_id: str


@attrs.frozen
class TransferOwner:
    request_id: int
    lobby_id: int
    member_id: str


@attrs.frozen
class SetAttributes:
    request_id: int
    lobby_id: int
    member_id: str  # must be the sender: named so that a forged request can be refused
    changes: Changes


@attrs.frozen
class SetReady:
    request_id: int
    lobby_id: int
    member_id: str  # must be the sender
    ready: bool


@attrs.frozen
class SendChat:
    request_id: int
    lobby_id: int
    text: str


@attrs.frozen
class RecreateLobby:
    """A member's copy of a lobby whose home died, sent to the next server on the ring."""

    request_id: int
    snapshot: LobbySnapshot
    seat: bytes = b""  # the seat from this member's LobbyJoined


@attrs.frozen
class StartGame:
    """The owner starts the game: every connected member gets a `GameStarting`."""

    request_id: int
    lobby_id: int


Request: TypeAlias = (
    CreateLobby
    | JoinLobby
    | JoinByCode
    | QuickJoin
    | LeaveLobby
    | SearchLobbies
    | SetMetadata
    | SetLocked
    | KickMember
    | BanMember
    | TransferOwner
    | SetAttributes
    | SetReady
    | SendChat
    | RecreateLobby
    | StartGame
)

# --- replies ----------------------------------------------------------------------------------


@attrs.frozen
class Refusal:
    request_id: int
    code: ErrorCode
    message: str


@attrs.frozen
class Done:
    request_id: int


@attrs.frozen
class LobbyJoined:
    """Reply to create, join, join-by-code, quick-join and recreate.

    The lobby's state itself arrives as a `LobbySnapshot` on the updates channel: sent here,
    it could overtake or be overtaken by updates, as channels are not ordered with each other.
    """

    request_id: int
    lobby_id: int
    # The member's seat: proof, signed by the lobby servers, that it belongs to this lobby; it
    # is what lets it recreate the lobby elsewhere (see RecreateLobby). Empty if not signed.
    seat: bytes = b""


@attrs.frozen
class SearchResults:
    request_id: int
    listings: tuple[LobbyListing, ...]
    next_cursor: int | None  # None: this was the last page


Reply: TypeAlias = Refusal | Done | LobbyJoined | SearchResults

# --- state updates: each carries the lobby version it produces --------------------------------


@attrs.frozen
class MemberJoined:
    lobby_id: int
    version: int
    member: MemberState


@attrs.frozen
class MemberLeft:
    lobby_id: int
    version: int
    member_id: str
    reason: LeaveReason


@attrs.frozen
class OwnerChanged:
    lobby_id: int
    version: int
    owner: str


@attrs.frozen
class MetadataChanged:
    lobby_id: int
    version: int
    changes: Changes


@attrs.frozen
class LockChanged:
    lobby_id: int
    version: int
    locked: bool


@attrs.frozen
class AttributesChanged:
    lobby_id: int
    version: int
    member_id: str
    changes: Changes


@attrs.frozen
class ReadyChanged:
    lobby_id: int
    version: int
    member_id: str
    ready: bool


@attrs.frozen
class PresenceChanged:
    lobby_id: int
    version: int
    member_id: str
    presence: Presence


@attrs.frozen
class MemberBanned:
    """The ban list grew (the member, if present, also gets a MemberLeft with reason BANNED)."""

    lobby_id: int
    version: int
    member_id: str


Update: TypeAlias = (
    LobbySnapshot
    | MemberJoined
    | MemberLeft
    | OwnerChanged
    | MetadataChanged
    | LockChanged
    | AttributesChanged
    | ReadyChanged
    | PresenceChanged
    | MemberBanned
)


@attrs.frozen
class GameStarting:
    """To one member: go to this game server and show it this ticket (`echo.lobby.tickets`).

    On the updates channel, after the state changes of the start, but not a state change
    itself (no version): each member's ticket is its own.
    """

    lobby_id: int
    server_id: str
    address: str  # where the game server admits sessions, "host:port"
    ticket: bytes


# --- chat -------------------------------------------------------------------------------------


@attrs.frozen
class ChatLine:
    lobby_id: int
    member_id: str
    text: str


Message: TypeAlias = Request | Reply | Update | GameStarting | ChatLine

_REQUEST_TYPES: Final = (
    CreateLobby,
    JoinLobby,
    JoinByCode,
    QuickJoin,
    LeaveLobby,
    SearchLobbies,
    SetMetadata,
    SetLocked,
    KickMember,
    BanMember,
    TransferOwner,
    SetAttributes,
    SetReady,
    SendChat,
    RecreateLobby,
    StartGame,
)
_REPLY_TYPES: Final = (Refusal, Done, LobbyJoined, SearchResults)
_UPDATE_TYPES: Final = (
    LobbySnapshot,
    MemberJoined,
    MemberLeft,
    OwnerChanged,
    MetadataChanged,
    LockChanged,
    AttributesChanged,
    ReadyChanged,
    PresenceChanged,
    MemberBanned,
)


def channel_of(msg: Message) -> Channel:
    """The logical channel `msg` is sent on."""
    if isinstance(msg, SendChat | ChatLine):
        return Channel.CHAT
    # A GameStarting follows the start's state changes: it is ordered with them.
    if isinstance(msg, _UPDATE_TYPES) or isinstance(msg, GameStarting):
        return Channel.UPDATES
    return Channel.REQUESTS


# --- encoding ---------------------------------------------------------------------------------

_U16: Final = struct.Struct(">H")
_U32: Final = struct.Struct(">I")
_U64: Final = struct.Struct(">Q")
_I64: Final = struct.Struct(">q")

_TAG_STR: Final = 0
_TAG_INT: Final = 1
_TAG_DELETE: Final = 2
_FILTER_EQUALS: Final = 0
_FILTER_RANGE: Final = 1
_FILTER_FREE: Final = 2


class _Writer:
    def __init__(self, msg_type: MessageType | None) -> None:
        # None: a record of another framing (the topic records of listings.py) that shares
        # these field encodings.
        self.parts: list[bytes] = [] if msg_type is None else [bytes((msg_type,))]

    def u8(self, v: int) -> None:
        _check_int(v, 0, 255)
        self.parts.append(bytes((v,)))

    def u16(self, v: int) -> None:
        _check_int(v, 0, 0xFFFF)
        self.parts.append(_U16.pack(v))

    def u32(self, v: int) -> None:
        _check_int(v, 0, U32_MAX)
        self.parts.append(_U32.pack(v))

    def u64(self, v: int) -> None:
        _check_int(v, 0, U64_MAX)
        self.parts.append(_U64.pack(v))

    def i64(self, v: int) -> None:
        _check_int(v, I64_MIN, I64_MAX)
        self.parts.append(_I64.pack(v))

    def boolean(self, v: bool) -> None:
        if not isinstance(v, bool):
            raise LobbyProtocolError(f"expected a bool, got {v!r}")
        self.parts.append(b"\x01" if v else b"\x00")

    def _utf8(self, s: str) -> bytes:
        if not isinstance(s, str):
            raise LobbyProtocolError(f"expected a str, got {s!r}")
        try:
            return s.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise LobbyProtocolError(f"not encodable as UTF-8: {exc.reason}") from None

    def str8(self, s: str) -> None:
        data = self._utf8(s)
        if len(data) > 255:
            raise LobbyProtocolError(f"string of {len(data)} bytes does not fit a str8")
        self.parts.append(bytes((len(data),)) + data)

    def bytes16(self, b: bytes) -> None:
        if not isinstance(b, bytes) or len(b) > 0xFFFF:
            raise LobbyProtocolError("expected at most 65535 bytes")
        self.parts.append(_U16.pack(len(b)) + b)

    def str16(self, s: str) -> None:
        data = self._utf8(s)
        if len(data) > 0xFFFF:
            raise LobbyProtocolError(f"string of {len(data)} bytes does not fit a str16")
        self.parts.append(_U16.pack(len(data)) + data)

    def value(self, v: str | int | None, *, allow_delete: bool) -> None:
        if v is None and allow_delete:
            self.u8(_TAG_DELETE)
        elif isinstance(v, str):
            self.u8(_TAG_STR)
            self.str16(v)
        elif isinstance(v, int) and not isinstance(v, bool):
            self.u8(_TAG_INT)
            self.i64(v)
        else:
            raise LobbyProtocolError(f"not a lobby value: {v!r}")

    def mapping(self, m: Mapping[str, str | int | None], *, allow_delete: bool) -> None:
        if len(m) > 255:
            raise LobbyProtocolError(f"a map holds at most 255 keys, not {len(m)}")
        self.u8(len(m))
        for key, v in m.items():
            self.str8(key)
            self.value(v, allow_delete=allow_delete)

    def opt_u64(self, v: int | None) -> None:
        if v is None:
            self.u8(0)
        else:
            self.u8(1)
            self.u64(v)

    def filters(self, fs: tuple[Filter, ...]) -> None:
        if len(fs) > 255:
            raise LobbyProtocolError("at most 255 filters")
        self.u8(len(fs))
        for f in fs:
            if isinstance(f, StringEquals):
                self.u8(_FILTER_EQUALS)
                self.str8(f.key)
                self.str16(f.value)
            elif isinstance(f, NumberRange):
                self.u8(_FILTER_RANGE)
                self.str8(f.key)
                self.i64(f.low)
                self.i64(f.high)
            elif isinstance(f, FreeSlots):
                self.u8(_FILTER_FREE)
                self.u16(f.minimum)
            else:
                raise LobbyProtocolError(f"not a filter: {f!r}")

    def member(self, m: MemberState) -> None:
        self.str8(m.member_id)
        self.u32(m.join_seq)
        self.boolean(m.ready)
        self.u8(Presence(m.presence))
        self.mapping(m.attributes, allow_delete=False)

    def snapshot(self, s: LobbySnapshot) -> None:
        self.u64(s.lobby_id)
        self.u64(s.version)
        self.str8(s.name)
        self.u16(s.max_members)
        self.boolean(s.private)
        self.str8(s.join_code)
        self.boolean(s.locked)
        self.str8(s.owner)
        self.mapping(s.metadata, allow_delete=False)
        if len(s.bans) > 255:
            raise LobbyProtocolError("at most 255 bans")
        self.u8(len(s.bans))
        for b in s.bans:
            self.str8(b)
        if len(s.members) > 0xFFFF:
            raise LobbyProtocolError("too many members")
        self.u16(len(s.members))
        for m in s.members:
            self.member(m)

    def listing(self, item: LobbyListing) -> None:
        self.u64(item.lobby_id)
        self.str8(item.name)
        self.u16(item.member_count)
        self.u16(item.max_members)
        self.mapping(item.metadata, allow_delete=False)
        self.str8(item.home)


def _check_int(v: int, low: int, high: int) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
        raise LobbyProtocolError(f"{v!r} is not an integer in {low}..{high}")


def encode(msg: Message) -> bytes:
    """The wire form of `msg`. Raises LobbyProtocolError for a record that cannot be encoded
    (a number out of range, a string too long for its field, a message over MAX_MESSAGE_BYTES).
    """
    w: _Writer
    match msg:
        case CreateLobby():
            w = _Writer(MessageType.CREATE_LOBBY)
            w.u32(msg.request_id)
            w.str8(msg.name)
            w.u16(msg.max_members)
            w.boolean(msg.private)
            w.mapping(msg.metadata, allow_delete=False)
        case JoinLobby():
            w = _Writer(MessageType.JOIN_LOBBY)
            w.u32(msg.request_id)
            w.u64(msg.lobby_id)
        case JoinByCode():
            w = _Writer(MessageType.JOIN_BY_CODE)
            w.u32(msg.request_id)
            w.str8(msg.code)
        case QuickJoin():
            w = _Writer(MessageType.QUICK_JOIN)
            w.u32(msg.request_id)
            w.filters(msg.filters)
        case LeaveLobby():
            w = _Writer(MessageType.LEAVE_LOBBY)
            w.u32(msg.request_id)
            w.u64(msg.lobby_id)
        case SearchLobbies():
            w = _Writer(MessageType.SEARCH_LOBBIES)
            w.u32(msg.request_id)
            w.filters(msg.filters)
            w.opt_u64(msg.cursor)
            w.u16(msg.limit)
        case SetMetadata():
            w = _Writer(MessageType.SET_METADATA)
            w.u32(msg.request_id)
            w.u64(msg.lobby_id)
            w.mapping(msg.changes, allow_delete=True)
        case SetLocked():
            w = _Writer(MessageType.SET_LOCKED)
            w.u32(msg.request_id)
            w.u64(msg.lobby_id)
            w.boolean(msg.locked)
        case KickMember() | BanMember() | TransferOwner():
            kind = {
                KickMember: MessageType.KICK_MEMBER,
                BanMember: MessageType.BAN_MEMBER,
                TransferOwner: MessageType.TRANSFER_OWNER,
            }[type(msg)]
            w = _Writer(kind)
            w.u32(msg.request_id)
            w.u64(msg.lobby_id)
            w.str8(msg.member_id)
        case SetAttributes():
            w = _Writer(MessageType.SET_ATTRIBUTES)
            w.u32(msg.request_id)
            w.u64(msg.lobby_id)
            w.str8(msg.member_id)
            w.mapping(msg.changes, allow_delete=True)
        case SetReady():
            w = _Writer(MessageType.SET_READY)
            w.u32(msg.request_id)
            w.u64(msg.lobby_id)
            w.str8(msg.member_id)
            w.boolean(msg.ready)
        case SendChat():
            w = _Writer(MessageType.SEND_CHAT)
            w.u32(msg.request_id)
            w.u64(msg.lobby_id)
            w.str16(msg.text)
        case RecreateLobby():
            w = _Writer(MessageType.RECREATE_LOBBY)
            w.u32(msg.request_id)
            w.snapshot(msg.snapshot)
            w.bytes16(msg.seat)
        case Refusal():
            w = _Writer(MessageType.REFUSAL)
            w.u32(msg.request_id)
            w.u16(ErrorCode(msg.code))
            w.str16(msg.message)
        case Done():
            w = _Writer(MessageType.DONE)
            w.u32(msg.request_id)
        case LobbyJoined():
            w = _Writer(MessageType.LOBBY_JOINED)
            w.u32(msg.request_id)
            w.u64(msg.lobby_id)
            w.bytes16(msg.seat)
        case SearchResults():
            w = _Writer(MessageType.SEARCH_RESULTS)
            w.u32(msg.request_id)
            if len(msg.listings) > 255:
                raise LobbyProtocolError("at most 255 listings per page")
            w.u8(len(msg.listings))
            for item in msg.listings:
                w.listing(item)
            w.opt_u64(msg.next_cursor)
        case LobbySnapshot():
            w = _Writer(MessageType.LOBBY_SNAPSHOT)
            w.snapshot(msg)
        case MemberJoined():
            w = _Writer(MessageType.MEMBER_JOINED)
            w.u64(msg.lobby_id)
            w.u64(msg.version)
            w.member(msg.member)
        case MemberLeft():
            w = _Writer(MessageType.MEMBER_LEFT)
            w.u64(msg.lobby_id)
            w.u64(msg.version)
            w.str8(msg.member_id)
            w.u8(LeaveReason(msg.reason))
        case OwnerChanged():
            w = _Writer(MessageType.OWNER_CHANGED)
            w.u64(msg.lobby_id)
            w.u64(msg.version)
            w.str8(msg.owner)
        case MetadataChanged():
            w = _Writer(MessageType.METADATA_CHANGED)
            w.u64(msg.lobby_id)
            w.u64(msg.version)
            w.mapping(msg.changes, allow_delete=True)
        case LockChanged():
            w = _Writer(MessageType.LOCK_CHANGED)
            w.u64(msg.lobby_id)
            w.u64(msg.version)
            w.boolean(msg.locked)
        case AttributesChanged():
            w = _Writer(MessageType.ATTRIBUTES_CHANGED)
            w.u64(msg.lobby_id)
            w.u64(msg.version)
            w.str8(msg.member_id)
            w.mapping(msg.changes, allow_delete=True)
        case ReadyChanged():
            w = _Writer(MessageType.READY_CHANGED)
            w.u64(msg.lobby_id)
            w.u64(msg.version)
            w.str8(msg.member_id)
            w.boolean(msg.ready)
        case PresenceChanged():
            w = _Writer(MessageType.PRESENCE_CHANGED)
            w.u64(msg.lobby_id)
            w.u64(msg.version)
            w.str8(msg.member_id)
            w.u8(Presence(msg.presence))
        case MemberBanned():
            w = _Writer(MessageType.MEMBER_BANNED)
            w.u64(msg.lobby_id)
            w.u64(msg.version)
            w.str8(msg.member_id)
        case StartGame():
            w = _Writer(MessageType.START_GAME)
            w.u32(msg.request_id)
            w.u64(msg.lobby_id)
        case GameStarting():
            w = _Writer(MessageType.GAME_STARTING)
            w.u64(msg.lobby_id)
            w.str8(msg.server_id)
            w.str8(msg.address)
            w.bytes16(msg.ticket)
        case ChatLine():
            w = _Writer(MessageType.CHAT_LINE)
            w.u64(msg.lobby_id)
            w.str8(msg.member_id)
            w.str16(msg.text)
        case _:
            raise LobbyProtocolError(f"not a lobby message: {msg!r}")
    data = b"".join(w.parts)
    if len(data) > MAX_MESSAGE_BYTES:
        raise LobbyProtocolError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}")
    return data


# --- decoding (untrusted) ---------------------------------------------------------------------


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.data):
            raise LobbyProtocolError(f"truncated at byte {self.pos}: need {n} more")
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        v: int = _U16.unpack(self.take(2))[0]
        return v

    def u32(self) -> int:
        v: int = _U32.unpack(self.take(4))[0]
        return v

    def u64(self) -> int:
        v: int = _U64.unpack(self.take(8))[0]
        return v

    def i64(self) -> int:
        v: int = _I64.unpack(self.take(8))[0]
        return v

    def boolean(self) -> bool:
        b = self.u8()
        if b > 1:
            raise LobbyProtocolError(f"bool byte {b} is neither 0 nor 1")
        return b == 1

    def _text(self, n: int) -> str:
        raw = self.take(n)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise LobbyProtocolError(f"invalid UTF-8: {exc.reason}") from None

    def str8(self) -> str:
        return self._text(self.u8())

    def bytes16(self) -> bytes:
        return self.take(self.u16())

    def str16(self) -> str:
        return self._text(self.u16())

    def value(self, *, allow_delete: bool) -> str | int | None:
        tag = self.u8()
        if tag == _TAG_STR:
            return self.str16()
        if tag == _TAG_INT:
            return self.i64()
        if tag == _TAG_DELETE and allow_delete:
            return None
        raise LobbyProtocolError(f"unknown value tag {tag}")

    def values(self) -> dict[str, str | int]:
        out: dict[str, str | int] = {}
        for _ in range(self.u8()):
            key = self.str8()
            v = self.value(allow_delete=False)
            assert v is not None
            if key in out:
                raise LobbyProtocolError(f"duplicate key {key!r}")
            out[key] = v
        return out

    def changes(self) -> dict[str, str | int | None]:
        out: dict[str, str | int | None] = {}
        for _ in range(self.u8()):
            key = self.str8()
            v = self.value(allow_delete=True)
            if key in out:
                raise LobbyProtocolError(f"duplicate key {key!r}")
            out[key] = v
        return out

    def opt_u64(self) -> int | None:
        flag = self.u8()
        if flag == 0:
            return None
        if flag == 1:
            return self.u64()
        raise LobbyProtocolError(f"optional flag {flag} is neither 0 nor 1")

    def filters(self) -> tuple[Filter, ...]:
        out: list[Filter] = []
        for _ in range(self.u8()):
            kind = self.u8()
            if kind == _FILTER_EQUALS:
                out.append(StringEquals(self.str8(), self.str16()))
            elif kind == _FILTER_RANGE:
                out.append(NumberRange(self.str8(), self.i64(), self.i64()))
            elif kind == _FILTER_FREE:
                out.append(FreeSlots(self.u16()))
            else:
                raise LobbyProtocolError(f"unknown filter kind {kind}")
        return tuple(out)

    def presence(self) -> Presence:
        b = self.u8()
        try:
            return Presence(b)
        except ValueError:
            raise LobbyProtocolError(f"unknown presence {b}") from None

    def member(self) -> MemberState:
        return MemberState(self.str8(), self.u32(), self.boolean(), self.presence(), self.values())

    def snapshot(self) -> LobbySnapshot:
        lobby_id = self.u64()
        version = self.u64()
        name = self.str8()
        max_members = self.u16()
        private = self.boolean()
        join_code = self.str8()
        locked = self.boolean()
        owner = self.str8()
        metadata = self.values()
        bans = tuple(self.str8() for _ in range(self.u8()))
        members = tuple(self.member() for _ in range(self.u16()))
        return LobbySnapshot(
            lobby_id, version, name, max_members, private, join_code, locked, owner, metadata,
            bans, members,
        )  # fmt: skip

    def listing(self) -> LobbyListing:
        return LobbyListing(
            self.u64(), self.str8(), self.u16(), self.u16(), self.values(), self.str8()
        )

    def end(self) -> None:
        if self.pos != len(self.data):
            raise LobbyProtocolError(f"{len(self.data) - self.pos} trailing bytes")


def _decode(r: _Reader, kind: MessageType) -> Message:
    match kind:
        case MessageType.CREATE_LOBBY:
            return CreateLobby(r.u32(), r.str8(), r.u16(), r.boolean(), r.values())
        case MessageType.JOIN_LOBBY:
            return JoinLobby(r.u32(), r.u64())
        case MessageType.JOIN_BY_CODE:
            return JoinByCode(r.u32(), r.str8())
        case MessageType.QUICK_JOIN:
            return QuickJoin(r.u32(), r.filters())
        case MessageType.LEAVE_LOBBY:
            return LeaveLobby(r.u32(), r.u64())
        case MessageType.SEARCH_LOBBIES:
            return SearchLobbies(r.u32(), r.filters(), r.opt_u64(), r.u16())
        case MessageType.SET_METADATA:
            return SetMetadata(r.u32(), r.u64(), r.changes())
        case MessageType.SET_LOCKED:
            return SetLocked(r.u32(), r.u64(), r.boolean())
        case MessageType.KICK_MEMBER:
            return KickMember(r.u32(), r.u64(), r.str8())
        case MessageType.BAN_MEMBER:
            return BanMember(r.u32(), r.u64(), r.str8())
        case MessageType.TRANSFER_OWNER:
            return TransferOwner(r.u32(), r.u64(), r.str8())
        case MessageType.SET_ATTRIBUTES:
            return SetAttributes(r.u32(), r.u64(), r.str8(), r.changes())
        case MessageType.SET_READY:
            return SetReady(r.u32(), r.u64(), r.str8(), r.boolean())
        case MessageType.SEND_CHAT:
            return SendChat(r.u32(), r.u64(), r.str16())
        case MessageType.RECREATE_LOBBY:
            return RecreateLobby(r.u32(), r.snapshot(), r.bytes16())
        case MessageType.REFUSAL:
            request_id = r.u32()
            code = r.u16()
            try:
                error = ErrorCode(code)
            except ValueError:
                raise LobbyProtocolError(f"unknown error code {code}") from None
            return Refusal(request_id, error, r.str16())
        case MessageType.DONE:
            return Done(r.u32())
        case MessageType.LOBBY_JOINED:
            return LobbyJoined(r.u32(), r.u64(), r.bytes16())
        case MessageType.SEARCH_RESULTS:
            request_id = r.u32()
            listings = tuple(r.listing() for _ in range(r.u8()))
            return SearchResults(request_id, listings, r.opt_u64())
        case MessageType.LOBBY_SNAPSHOT:
            return r.snapshot()
        case MessageType.MEMBER_JOINED:
            return MemberJoined(r.u64(), r.u64(), r.member())
        case MessageType.MEMBER_LEFT:
            lobby_id, version, member_id, reason = r.u64(), r.u64(), r.str8(), r.u8()
            try:
                return MemberLeft(lobby_id, version, member_id, LeaveReason(reason))
            except ValueError:
                raise LobbyProtocolError(f"unknown leave reason {reason}") from None
        case MessageType.OWNER_CHANGED:
            return OwnerChanged(r.u64(), r.u64(), r.str8())
        case MessageType.METADATA_CHANGED:
            return MetadataChanged(r.u64(), r.u64(), r.changes())
        case MessageType.LOCK_CHANGED:
            return LockChanged(r.u64(), r.u64(), r.boolean())
        case MessageType.ATTRIBUTES_CHANGED:
            return AttributesChanged(r.u64(), r.u64(), r.str8(), r.changes())
        case MessageType.READY_CHANGED:
            return ReadyChanged(r.u64(), r.u64(), r.str8(), r.boolean())
        case MessageType.PRESENCE_CHANGED:
            return PresenceChanged(r.u64(), r.u64(), r.str8(), r.presence())
        case MessageType.MEMBER_BANNED:
            return MemberBanned(r.u64(), r.u64(), r.str8())
        case MessageType.START_GAME:
            return StartGame(r.u32(), r.u64())
        case MessageType.GAME_STARTING:
            return GameStarting(r.u64(), r.str8(), r.str8(), r.bytes16())
        case MessageType.CHAT_LINE:
            return ChatLine(r.u64(), r.str8(), r.str16())
    raise LobbyProtocolError(f"unhandled message type {kind!r}")  # pragma: no cover


def parse_message_untrusted(data: bytes | bytearray | memoryview) -> Message:
    """Decode one lobby message of any kind. Raises only LobbyProtocolError."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise LobbyProtocolError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}")
    if len(data) == 0:
        raise LobbyProtocolError("empty message")
    r = _Reader(bytes(data))
    type_byte = r.u8()
    try:
        kind = MessageType(type_byte)
    except ValueError:
        raise LobbyProtocolError(f"unknown message type 0x{type_byte:02x}") from None
    msg = _decode(r, kind)
    r.end()
    return msg


def parse_request_untrusted(data: bytes | bytearray | memoryview) -> Request:
    """Decode what a client sent to the lobby server; anything but a request is an error.

    Raises only LobbyProtocolError.
    """
    msg = parse_message_untrusted(data)
    if not isinstance(msg, _REQUEST_TYPES):
        raise LobbyProtocolError(f"{type(msg).__name__} is not a request")
    return msg


def parse_server_message_untrusted(
    data: bytes | bytearray | memoryview,
) -> Reply | Update | GameStarting | ChatLine:
    """Decode what the lobby server sent to a member. Raises only LobbyProtocolError."""
    msg = parse_message_untrusted(data)
    if isinstance(msg, _REQUEST_TYPES):
        raise LobbyProtocolError(f"{type(msg).__name__} is a request, not a server message")
    return msg
