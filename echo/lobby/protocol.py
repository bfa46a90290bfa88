"""Lobby messages and their compact binary codec.

Every message is one transport message: a one-byte type, then its fields in the order of the
record, big-endian. Requests carry a client-chosen u32 ``request_id`` that the one reply to
them repeats. Each message belongs to one of three logical channels (`Channel`): requests and
replies, state updates, chat. This module only tags them; carrying them with credit is the
channels layer's job (echo.channels), so a member flooding chat cannot delay lobby state.

Field encodings (each a field codec below, used by both directions):

==========  ===========================================================================
u8/u16/...  unsigned big-endian integers; ``bool`` is a u8 that must be 0 or 1
str8        u8 byte length + UTF-8 (ids, keys, names, codes)
str16       u16 byte length + UTF-8 (values, chat text, messages)
bytes16     u16 byte length + bytes (seats)
bytes8      u8 byte length + bytes (seat tags)
value       u8 tag + body: 0 = str16, 1 = i64; in change maps also 2 = delete (no body)
map         u8 count + count x (str8 key, value); keys unique
filters     u8 count + count x (u8 kind, ...): 0 = string equals (str8 key, str16 value),
            1 = number range (str8 key, i64 low, i64 high), 2 = free slots (u16 minimum)
opt u64     u8 flag + u64 if the flag is 1
[trailing]  a field added later, last in its message and left out when empty: the
            message without it is the same bytes as before it existed and parses as it
            did (a parser from before it refuses the message that carries it)
==========  ===========================================================================

`_MESSAGES` is the message table: per message type its type byte, channel, class and fields
in order (name -> field codec); records inside messages (a snapshot, a member, a listing, a
filter) are described the same way. docs/lobby-protocol.md has the same table for people.

``parse_*_untrusted`` take bytes straight from the network and raise only
`LobbyProtocolError`; they cost O(len(data)) (every count is bounded by the bytes that remain).
Semantic limits (sizes of names, metadata, attributes, chat) are the registry's, which refuses
with an error code; the codec only enforces the structure.

Pure module: no trio, no clock, no I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeAlias

import attrs

from echo.codec import Buffer, CodecError
from echo.lobby.queue_wire import CancelMatch, EnqueueMatch, Matched, Queued, QueueLeft

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


class LobbyProtocolError(CodecError):
    """Bytes that are not a lobby message (or a record that cannot be encoded)."""


class Channel(enum.IntEnum):
    """The logical channel a message travels on."""

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
    NO_GAME_SERVER = 25  # no announced game server has room for the lobby (or fits the tags)
    NO_GAME = 26  # a ticket or a game-server report for a lobby whose game is not running
    TICKET_TOO_LARGE = 27  # the roster's attributes and the metadata do not fit in a ticket
    NOT_QUEUED = 40  # cancel without a ticket (the matchmaker's codes start at 40)
    PARTY_INVALID = 41  # a party entry without proof of membership, or that disagrees


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
    REQUEST_TICKET = 0x11
    REPORT_GAME_SERVER = 0x12
    ENQUEUE_MATCH = 0x18  # the matchmaker's (echo.lobby.queue_wire)
    CANCEL_MATCH = 0x19
    # replies (server -> client), Channel.REQUESTS
    REFUSAL = 0x20
    DONE = 0x21
    LOBBY_JOINED = 0x22
    SEARCH_RESULTS = 0x23
    QUEUED = 0x28
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
    SEAT_TAGS = 0x4B
    RESUME_TOKEN = 0x4C
    GAME_ENDED = 0x4D
    MATCHED = 0x58
    QUEUE_LEFT = 0x59
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
class SeatTag:
    """A seat's tag: the keyed hash of the hello secret of the client that holds the seat
    (`echo.tickets.TicketSeats.tag`), never the secret. Members keep them in their copies
    so that the next server gives each seat back to its own client, which may never have
    learned its seat (a lost LobbyJoined)."""

    member_id: str
    tag: bytes


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
    # The seat tags of this member's copy (a trailing field: a copy without them is the same
    # bytes as before tags existed). A member may hold several (copies disagreed).
    seat_tags: tuple[SeatTag, ...] = ()


@attrs.frozen
class StartGame:
    """The owner starts the game: every connected member gets a `GameStarting`.

    `filters` choose among the announced game servers by their tags (`StringEquals` only:
    region, mode, version, ...); among those that match, the one with the most free slots.
    A trailing field: a start without filters is the same bytes as before they existed."""

    request_id: int
    lobby_id: int
    filters: tuple[Filter, ...] = ()


@attrs.frozen
class RequestTicket:
    """A member of a lobby whose game is running asks for a fresh ticket (its process
    crashed and came back, or its ticket expired): a new `GameStarting` for the same game,
    while the game runs."""

    request_id: int
    lobby_id: int


@attrs.frozen
class ReportGameServer:
    """A member tells the lobby that the game server of its running game refused its ticket
    (`reason`: the refusal it got). Once half the game's players (at least one) report it,
    the server is out of rotation for a while and the game ends (`GameEnded`)."""

    request_id: int
    lobby_id: int
    server_id: str
    reason: str


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
    | RequestTicket
    | ReportGameServer
    | EnqueueMatch
    | CancelMatch
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


Reply: TypeAlias = Refusal | Done | LobbyJoined | SearchResults | Queued

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
class GameEnded:
    """The lobby's game ended: the lobby is unlocked and every member is not ready again.

    `result` is what the game server reported (signed with its ticket key; see
    `echo.lobby.results`), or, when the lobby ended the game itself, ``{"error": ...}``:
    ``"timed_out"`` (no result within the game's life) or ``"game_server_refused"`` (the
    players reported that the game server refused their tickets)."""

    lobby_id: int
    version: int
    match_id: int
    result: Mapping[str, Value]


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
    | GameEnded
)


@attrs.frozen
class GameDetails:
    """What a `GameStarting` adds to the address: the match id, the game server's control
    port and its duologue-port mode ("per-client" or "shared"; "" for not announced)."""

    match_id: int = 0
    control_port: int = 0
    duologue_ports: str = ""
    #: the game server's X25519 public key as it announced it (32 bytes), which the member's
    #: session to it pins (echo.lobby.keys); b"": it announced none (a session in the clear)
    server_key: bytes = b""


@attrs.frozen
class GameStarting:
    """To one member: go to this game server and show it this ticket (`echo.tickets`).

    On the updates channel, after the state changes of the start, but not a state change
    itself (no version): each member's ticket is its own.
    """

    lobby_id: int
    server_id: str
    address: str  # where the game server admits sessions, "host:port"
    ticket: bytes
    # The rest of what a client needs (a trailing field: a GameStarting without it is the same
    # bytes as before it existed).
    details: GameDetails = attrs.field(factory=lambda: GameDetails())

    @property
    def server_key(self) -> bytes:
        """The game server's announced public key (32 bytes), b"" if it announced none."""
        return self.details.server_key

    @property
    def match_id(self) -> int:
        """The game (as in the ticket, and in the `GameEnded` that ends it); 0: not said."""
        return self.details.match_id

    @property
    def control_port(self) -> int:
        """The game server's control port (0: not announced; by convention the data port + 1)."""
        return self.details.control_port or self.port + 1

    @property
    def duologue_ports(self) -> str:
        """The game server's duologue-port mode, for `echo.session.connect(duologue_ports=)`."""
        return self.details.duologue_ports or "per-client"

    @property
    def host(self) -> str:
        """The address's host (an IP literal; IPv6 without brackets)."""
        return self.address.rsplit(":", 1)[0].strip("[]")

    @property
    def port(self) -> int:
        """The address's port: the game server's data port (0 if the address names none)."""
        tail = self.address.rsplit(":", 1)[-1]
        return int(tail) if tail.isascii() and tail.isdigit() else 0


@attrs.frozen
class SeatTags:
    """To members: these seats' tags are now these (after every snapshot, all of them; after a
    MemberJoined, the newcomer's). Not a state change (no version), and a message of its own,
    not a field of the snapshot: a member from before tags skips a message type it does not
    know (it logs it) but could not read a snapshot with a field it does not know."""

    lobby_id: int
    tags: tuple[SeatTag, ...]


@attrs.frozen
class ResumeToken:
    """To one member: its seat's resume token (`echo.lobby.resume`), sent when it is seated
    and again before the last one expires. Kept by the client (a state file), it lets a brand-new
    process of the member take the seat back. Not a state change (no version); a message of its
    own so that a member from before it skips it (and logs it), as `SeatTags`."""

    lobby_id: int
    token: bytes


# --- chat -------------------------------------------------------------------------------------


@attrs.frozen
class ChatLine:
    lobby_id: int
    member_id: str
    text: str


Message: TypeAlias = (
    Request | Reply | Update | GameStarting | SeatTags | ResumeToken | Matched | QueueLeft
    | ChatLine
)


# --- the codec: one table entry per message type ----------------------------------------------
#
# Each field codec is one field's wire form both ways: `write` checks that the value fits (and
# raises LobbyProtocolError if not), `read` takes it from untrusted bytes (and raises nothing
# but LobbyProtocolError). A record is a class and its fields in order, name -> codec; a message
# is a record with its type byte and channel (`_MESSAGES`). Encoding and decoding both walk the
# same entry, so a new message is one entry, and the two directions cannot disagree. The bytes
# are read and written by `echo.codec.Buffer` (made with error=LobbyProtocolError, so a read past
# the end or trailing bytes raise nothing but LobbyProtocolError).


def _reader(data: bytes | bytearray | memoryview) -> Buffer:
    return Buffer(data, error=LobbyProtocolError)


def _writer() -> Buffer:
    return Buffer(error=LobbyProtocolError)


class _Codec:
    def write(self, w: Buffer, v: Any) -> None:
        raise NotImplementedError

    def read(self, r: Buffer) -> Any:
        raise NotImplementedError


class _Int(_Codec):
    """A big-endian integer (`kind`: the Buffer's uint8, uint16, ... int64), within low..high
    (the kind's range: the Buffer refuses anything else, and bools)."""

    def __init__(self, kind: str, low: int, high: int) -> None:
        self.push: Callable[[Buffer, int], None] = getattr(Buffer, f"push_{kind}")
        self.pull: Callable[[Buffer], int] = getattr(Buffer, f"pull_{kind}")
        self.low = low
        self.high = high

    def write(self, w: Buffer, v: int) -> None:
        self.push(w, v)

    def read(self, r: Buffer) -> int:
        return self.pull(r)


_U8: Final = _Int("uint8", 0, 0xFF)
_U16: Final = _Int("uint16", 0, 0xFFFF)
_U32: Final = _Int("uint32", 0, U32_MAX)
_U64: Final = _Int("uint64", 0, U64_MAX)
_I64: Final = _Int("int64", I64_MIN, I64_MAX)


class _Bool(_Codec):
    """A u8 that is 0 or 1."""

    def write(self, w: Buffer, v: bool) -> None:
        if not isinstance(v, bool):
            raise LobbyProtocolError(f"expected a bool, got {v!r}")
        w.push_uint8(1 if v else 0)

    def read(self, r: Buffer) -> bool:
        b = _U8.read(r)
        if b > 1:
            raise LobbyProtocolError(f"bool byte {b} is neither 0 nor 1")
        return b == 1


class _Text(_Codec):
    """A length (`kind`: str8 or str16, a u8 or a u16) and that many bytes of UTF-8."""

    def __init__(self, kind: str) -> None:
        self.push: Callable[[Buffer, str], None] = getattr(Buffer, f"push_{kind}")
        self.pull: Callable[[Buffer], str] = getattr(Buffer, f"pull_{kind}")

    def write(self, w: Buffer, s: str) -> None:
        self.push(w, s)

    def read(self, r: Buffer) -> str:
        return self.pull(r)


class _Bytes16(_Codec):
    def write(self, w: Buffer, b: bytes) -> None:
        if not isinstance(b, bytes) or len(b) > 0xFFFF:
            raise LobbyProtocolError("expected at most 65535 bytes")
        w.push_bytes16(b)

    def read(self, r: Buffer) -> bytes:
        return r.pull_bytes16()


class _Bytes8(_Codec):
    def write(self, w: Buffer, b: bytes) -> None:
        if not isinstance(b, bytes) or len(b) > 0xFF:
            raise LobbyProtocolError("expected at most 255 bytes")
        w.push_bytes8(b)

    def read(self, r: Buffer) -> bytes:
        return r.pull_bytes8()


class _PublicKey(_Bytes8):
    """An X25519 public key: 32 bytes behind their length byte (one length: one form)."""

    def write(self, w: Buffer, b: bytes) -> None:
        if not isinstance(b, bytes) or len(b) != 32:
            raise LobbyProtocolError("a server key is 32 bytes")
        w.push_bytes8(b)

    def read(self, r: Buffer) -> bytes:
        b = r.pull_bytes8()
        if len(b) != 32:
            raise LobbyProtocolError(f"a server key of {len(b)} bytes, not 32")
        return b


_BOOL: Final = _Bool()
_STR8: Final = _Text("str8")
_STR16: Final = _Text("str16")
_BYTES16: Final = _Bytes16()
_BYTES8: Final = _Bytes8()


class _Enum(_Codec):
    """An `enum.IntEnum` member as an integer; an unknown number read is an error."""

    def __init__(self, kind: type[enum.IntEnum], size: _Int, name: str) -> None:
        self.kind = kind
        self.size = size
        self.name = name

    def write(self, w: Buffer, v: int) -> None:
        self.size.write(w, self.kind(v))

    def read(self, r: Buffer) -> enum.IntEnum:
        b = self.size.read(r)
        try:
            return self.kind(b)
        except ValueError:
            raise LobbyProtocolError(f"unknown {self.name} {b}") from None


_TAG_STR: Final = 0
_TAG_INT: Final = 1
_TAG_DELETE: Final = 2


class _Value(_Codec):
    """u8 tag + body: 0 str16, 1 i64, and (in change maps) 2 delete, written for None."""

    def __init__(self, *, allow_delete: bool) -> None:
        self.allow_delete = allow_delete

    def write(self, w: Buffer, v: str | int | None) -> None:
        if v is None and self.allow_delete:
            _U8.write(w, _TAG_DELETE)
        elif isinstance(v, str):
            _U8.write(w, _TAG_STR)
            _STR16.write(w, v)
        elif isinstance(v, int) and not isinstance(v, bool):
            _U8.write(w, _TAG_INT)
            _I64.write(w, v)
        else:
            raise LobbyProtocolError(f"not a lobby value: {v!r}")

    def read(self, r: Buffer) -> str | int | None:
        tag = _U8.read(r)
        if tag == _TAG_STR:
            return _STR16.read(r)
        if tag == _TAG_INT:
            return _I64.read(r)
        if tag == _TAG_DELETE and self.allow_delete:
            return None
        raise LobbyProtocolError(f"unknown value tag {tag}")


class _Map(_Codec):
    """u8 count + (str8 key, value) pairs; keys unique."""

    def __init__(self, *, allow_delete: bool) -> None:
        self.value = _Value(allow_delete=allow_delete)

    def write(self, w: Buffer, m: Mapping[str, str | int | None]) -> None:
        if len(m) > 255:
            raise LobbyProtocolError(f"a map holds at most 255 keys, not {len(m)}")
        _U8.write(w, len(m))
        for key, v in m.items():
            _STR8.write(w, key)
            self.value.write(w, v)

    def read(self, r: Buffer) -> dict[str, str | int | None]:
        out: dict[str, str | int | None] = {}
        for _ in range(_U8.read(r)):
            key = _STR8.read(r)
            v = self.value.read(r)
            if key in out:
                raise LobbyProtocolError(f"duplicate key {key!r}")
            out[key] = v
        return out


_VALUES: Final = _Map(allow_delete=False)  # metadata, attributes
_CHANGES: Final = _Map(allow_delete=True)  # change maps: None deletes a key


class _OptU64(_Codec):
    """u8 flag + u64 if the flag is 1; None if it is 0."""

    def write(self, w: Buffer, v: int | None) -> None:
        if v is None:
            _U8.write(w, 0)
        else:
            _U8.write(w, 1)
            _U64.write(w, v)

    def read(self, r: Buffer) -> int | None:
        flag = _U8.read(r)
        if flag == 0:
            return None
        if flag == 1:
            return _U64.read(r)
        raise LobbyProtocolError(f"optional flag {flag} is neither 0 nor 1")


_OPT_U64: Final = _OptU64()


class _List(_Codec):
    """A count (`size`) + that many items, as a tuple."""

    def __init__(self, size: _Int, item: _Codec, too_many: str) -> None:
        self.size = size
        self.item = item
        self.too_many = too_many

    def write(self, w: Buffer, items: tuple[Any, ...]) -> None:
        if len(items) > self.size.high:
            raise LobbyProtocolError(self.too_many)
        self.size.write(w, len(items))
        for item in items:
            self.item.write(w, item)

    def read(self, r: Buffer) -> tuple[Any, ...]:
        return tuple(self.item.read(r) for _ in range(self.size.read(r)))


class _Trailing(_Codec):
    """A field added to a message after it shipped: the message's last field, left out when
    empty, so the message without it keeps its bytes and old bytes parse as before. Present,
    it is never empty (one message, one form)."""

    def __init__(self, codec: _Codec, empty: Any) -> None:
        self.codec = codec
        self.empty = empty

    def write(self, w: Buffer, v: Any) -> None:
        if v != self.empty:
            self.codec.write(w, v)

    def read(self, r: Buffer) -> Any:
        if r.eof():
            return self.empty
        v = self.codec.read(r)
        if v == self.empty:
            raise LobbyProtocolError("an empty trailing field is left out, not sent")
        return v


class _Record(_Codec):
    """An attrs class and its fields in order, name -> codec (every field, in the class's
    order: checked here, so an entry cannot leave one out or swap two)."""

    def __init__(self, cls: type, **fields: _Codec) -> None:
        names = [f.name for f in attrs.fields(cls)]
        if names != list(fields):
            raise TypeError(f"{cls.__name__}: the table names {list(fields)}, not {names}")
        if any(isinstance(c, _Trailing) for c in list(fields.values())[:-1]):
            raise TypeError(f"{cls.__name__}: only the last field may be trailing")
        self.cls = cls
        self.fields = tuple(fields.items())

    def write(self, w: Buffer, v: Any) -> None:
        for name, codec in self.fields:
            codec.write(w, getattr(v, name))

    def read(self, r: Buffer) -> Any:
        return self.cls(**{name: codec.read(r) for name, codec in self.fields})


class _Union(_Codec):
    """u8 kind + that kind's record."""

    def __init__(self, name: str, kinds: Mapping[int, _Record]) -> None:
        self.name = name
        self.kinds = dict(kinds)

    def write(self, w: Buffer, v: Any) -> None:
        for kind, record in self.kinds.items():
            if isinstance(v, record.cls):
                _U8.write(w, kind)
                record.write(w, v)
                return
        raise LobbyProtocolError(f"not a {self.name}: {v!r}")

    def read(self, r: Buffer) -> Any:
        kind = _U8.read(r)
        record = self.kinds.get(kind)
        if record is None:
            raise LobbyProtocolError(f"unknown {self.name} kind {kind}")
        return record.read(r)


# fmt: off
_FILTERS: Final = _List(_U8, _Union("filter", {
    0: _Record(StringEquals, key=_STR8, value=_STR16),
    1: _Record(NumberRange, key=_STR8, low=_I64, high=_I64),
    2: _Record(FreeSlots, minimum=_U16),
}), "at most 255 filters")
_PRESENCE: Final = _Enum(Presence, _U8, "presence")
_MEMBER: Final = _Record(MemberState, member_id=_STR8, join_seq=_U32, ready=_BOOL,
                         presence=_PRESENCE, attributes=_VALUES)
_SNAPSHOT: Final = _Record(
    LobbySnapshot, lobby_id=_U64, version=_U64, name=_STR8, max_members=_U16, private=_BOOL,
    join_code=_STR8, locked=_BOOL, owner=_STR8, metadata=_VALUES,
    bans=_List(_U8, _STR8, "at most 255 bans"), members=_List(_U16, _MEMBER, "too many members"),
)
_SEAT_TAG_LIST: Final = _List(_U16, _Record(SeatTag, member_id=_STR8, tag=_BYTES8),
                              "too many seat tags")
_LISTING: Final = _Record(LobbyListing, lobby_id=_U64, name=_STR8, member_count=_U16,
                          max_members=_U16, metadata=_VALUES, home=_STR8)
_GAME_DETAILS: Final = _Record(GameDetails, match_id=_U64, control_port=_U16,
                               duologue_ports=_STR8, server_key=_Trailing(_PublicKey(), b""))
# fmt: on


class _Message(_Record):
    """A record that is a message: its type byte and the channel it travels on."""

    def __init__(self, kind: MessageType, channel: Channel, cls: type, **fields: _Codec) -> None:
        super().__init__(cls, **fields)
        if any(isinstance(c, _Trailing) for c in _nested(fields.values())):
            raise TypeError(f"{cls.__name__}: a trailing field inside a record")
        self.kind = kind
        self.type_byte = bytes((kind,))
        self.channel = channel


def _nested(codecs: Any) -> list[_Codec]:
    """The codecs inside `codecs`' records and lists (not `codecs` themselves)."""
    out: list[_Codec] = []
    for c in codecs:
        inner: list[_Codec] = []
        if isinstance(c, _Record):
            inner = [codec for _, codec in c.fields]
        elif isinstance(c, _List):
            inner = [c.item]
        elif isinstance(c, _Union):
            inner = list(c.kinds.values())
        out += inner + _nested(inner)
    return out


def _request(kind: MessageType, cls: type, **fields: _Codec) -> _Message:
    """A request or a reply: on the requests channel, its request id first."""
    return _Message(kind, Channel.REQUESTS, cls, request_id=_U32, **fields)


def _lobby_op(kind: MessageType, cls: type, **fields: _Codec) -> _Message:
    """A request about one lobby: request id, lobby id, then `fields`."""
    return _request(kind, cls, lobby_id=_U64, **fields)


def _update(kind: MessageType, cls: type, **fields: _Codec) -> _Message:
    """A state update: lobby id, the version it produces, then `fields`."""
    return _Message(kind, Channel.UPDATES, cls, lobby_id=_U64, version=_U64, **fields)


# One entry per message type: type byte, (channel,) class, and its fields after the common ones.
# fmt: off
_MESSAGES: Final = (
    # requests (client -> server)
    _request(MessageType.CREATE_LOBBY, CreateLobby,
             name=_STR8, max_members=_U16, private=_BOOL, metadata=_VALUES),
    _lobby_op(MessageType.JOIN_LOBBY, JoinLobby),
    _request(MessageType.JOIN_BY_CODE, JoinByCode, code=_STR8),
    _request(MessageType.QUICK_JOIN, QuickJoin, filters=_FILTERS),
    _lobby_op(MessageType.LEAVE_LOBBY, LeaveLobby),
    _request(MessageType.SEARCH_LOBBIES, SearchLobbies,
             filters=_FILTERS, cursor=_OPT_U64, limit=_U16),
    _lobby_op(MessageType.SET_METADATA, SetMetadata, changes=_CHANGES),
    _lobby_op(MessageType.SET_LOCKED, SetLocked, locked=_BOOL),
    _lobby_op(MessageType.KICK_MEMBER, KickMember, member_id=_STR8),
    _lobby_op(MessageType.BAN_MEMBER, BanMember, member_id=_STR8),
    _lobby_op(MessageType.TRANSFER_OWNER, TransferOwner, member_id=_STR8),
    _lobby_op(MessageType.SET_ATTRIBUTES, SetAttributes, member_id=_STR8, changes=_CHANGES),
    _lobby_op(MessageType.SET_READY, SetReady, member_id=_STR8, ready=_BOOL),
    _Message(MessageType.SEND_CHAT, Channel.CHAT, SendChat,
             request_id=_U32, lobby_id=_U64, text=_STR16),
    _request(MessageType.RECREATE_LOBBY, RecreateLobby, snapshot=_SNAPSHOT, seat=_BYTES16,
             seat_tags=_Trailing(_SEAT_TAG_LIST, ())),
    _lobby_op(MessageType.START_GAME, StartGame, filters=_Trailing(_FILTERS, ())),
    _lobby_op(MessageType.REQUEST_TICKET, RequestTicket),
    _lobby_op(MessageType.REPORT_GAME_SERVER, ReportGameServer, server_id=_STR8, reason=_STR16),
    _request(MessageType.ENQUEUE_MATCH, EnqueueMatch, mode=_STR8, region=_STR8, skill=_I64,
             size=_U16, party=_U64, party_size=_U16, party_seat=_BYTES16, strict_region=_BOOL,
             start=_BOOL, waited_ms=_U32),
    _request(MessageType.CANCEL_MATCH, CancelMatch),
    # replies (server -> client)
    _request(MessageType.REFUSAL, Refusal,
             code=_Enum(ErrorCode, _U16, "error code"), message=_STR16),
    _request(MessageType.DONE, Done),
    _request(MessageType.LOBBY_JOINED, LobbyJoined, lobby_id=_U64, seat=_BYTES16),
    _request(MessageType.SEARCH_RESULTS, SearchResults,
             listings=_List(_U8, _LISTING, "at most 255 listings per page"),
             next_cursor=_OPT_U64),
    _request(MessageType.QUEUED, Queued, ticket=_U64),
    # state updates (server -> members)
    _Message(MessageType.LOBBY_SNAPSHOT, Channel.UPDATES, LobbySnapshot, **dict(_SNAPSHOT.fields)),
    _update(MessageType.MEMBER_JOINED, MemberJoined, member=_MEMBER),
    _update(MessageType.MEMBER_LEFT, MemberLeft,
            member_id=_STR8, reason=_Enum(LeaveReason, _U8, "leave reason")),
    _update(MessageType.OWNER_CHANGED, OwnerChanged, owner=_STR8),
    _update(MessageType.METADATA_CHANGED, MetadataChanged, changes=_CHANGES),
    _update(MessageType.LOCK_CHANGED, LockChanged, locked=_BOOL),
    _update(MessageType.ATTRIBUTES_CHANGED, AttributesChanged, member_id=_STR8, changes=_CHANGES),
    _update(MessageType.READY_CHANGED, ReadyChanged, member_id=_STR8, ready=_BOOL),
    _update(MessageType.PRESENCE_CHANGED, PresenceChanged, member_id=_STR8, presence=_PRESENCE),
    _update(MessageType.MEMBER_BANNED, MemberBanned, member_id=_STR8),
    _update(MessageType.GAME_ENDED, GameEnded, match_id=_U64, result=_VALUES),
    # Not a state change (no version), but ordered with the start's changes.
    _Message(MessageType.GAME_STARTING, Channel.UPDATES, GameStarting,
             lobby_id=_U64, server_id=_STR8, address=_STR8, ticket=_BYTES16,
             details=_Trailing(_GAME_DETAILS, GameDetails())),
    _Message(MessageType.SEAT_TAGS, Channel.UPDATES, SeatTags,
             lobby_id=_U64, tags=_SEAT_TAG_LIST),
    _Message(MessageType.RESUME_TOKEN, Channel.UPDATES, ResumeToken,
             lobby_id=_U64, token=_BYTES16),
    _Message(MessageType.MATCHED, Channel.UPDATES, Matched,
             ticket=_U64, lobby_id=_U64, waited_ms=_U32),
    _Message(MessageType.QUEUE_LEFT, Channel.UPDATES, QueueLeft, ticket=_U64, reason=_STR16),
    # chat (server -> members)
    _Message(MessageType.CHAT_LINE, Channel.CHAT, ChatLine,
             lobby_id=_U64, member_id=_STR8, text=_STR16),
)
# fmt: on
_BY_KIND: Final = {m.kind: m for m in _MESSAGES}
_BY_CLASS: Final = {m.cls: m for m in _MESSAGES}
if set(_BY_KIND) != set(MessageType) or not len(_BY_KIND) == len(_BY_CLASS) == len(_MESSAGES):
    raise TypeError("every message type has exactly one table entry")  # pragma: no cover
# Requests are numbered below the replies (MessageType).
_REQUEST_TYPES: Final = tuple(m.cls for m in _MESSAGES if m.kind < MessageType.REFUSAL)


def _entry_of(msg: object) -> _Message | None:
    entry = _BY_CLASS.get(type(msg))
    if entry is None:  # (a subclass of a message)
        entry = next((m for m in _MESSAGES if isinstance(msg, m.cls)), None)
    return entry


def channel_of(msg: Message) -> Channel:
    """The logical channel `msg` is sent on."""
    entry = _entry_of(msg)
    return Channel.REQUESTS if entry is None else entry.channel


def encode(msg: Message) -> bytes:
    """The wire form of `msg`. Raises LobbyProtocolError for a record that cannot be encoded
    (a number out of range, a string too long for its field, a message over MAX_MESSAGE_BYTES).
    """
    entry = _entry_of(msg)
    if entry is None:
        raise LobbyProtocolError(f"not a lobby message: {msg!r}")
    return _encode(entry.type_byte, entry, msg, MAX_MESSAGE_BYTES, "message of {} bytes exceeds {}")


def _encode(head: bytes, codec: _Codec, value: Any, limit: int, too_long: str) -> bytes:
    """`head` + `value` as `codec` writes it, at most `limit` bytes (else the error is
    `too_long` formatted with the size and the limit)."""
    w = _writer()
    w.push_bytes(head)
    codec.write(w, value)
    data = w.data
    if len(data) > limit:
        raise LobbyProtocolError(too_long.format(len(data), limit))
    return data


def parse_message_untrusted(data: bytes | bytearray | memoryview) -> Message:
    """Decode one lobby message of any kind. Raises only LobbyProtocolError."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise LobbyProtocolError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}")
    if len(data) == 0:
        raise LobbyProtocolError("empty message")
    r = _reader(data)
    type_byte = _U8.read(r)
    entry = _BY_KIND.get(type_byte)  # type: ignore[call-overload]
    if entry is None:
        raise LobbyProtocolError(f"unknown message type 0x{type_byte:02x}")
    msg: Message = entry.read(r)
    r.check_end()
    return msg


def parse_request_untrusted(data: bytes | bytearray | memoryview) -> Request:
    """Decode what a client sent to the lobby server; anything but a request is an error.

    Raises only LobbyProtocolError.
    """
    msg = parse_message_untrusted(data)
    if not isinstance(msg, _REQUEST_TYPES):
        raise LobbyProtocolError(f"{type(msg).__name__} is not a request")
    return msg  # type: ignore[return-value]


def parse_server_message_untrusted(
    data: bytes | bytearray | memoryview,
) -> Reply | Update | GameStarting | SeatTags | ResumeToken | Matched | QueueLeft | ChatLine:
    """Decode what the lobby server sent to a member. Raises only LobbyProtocolError."""
    msg = parse_message_untrusted(data)
    if isinstance(msg, _REQUEST_TYPES):
        raise LobbyProtocolError(f"{type(msg).__name__} is a request, not a server message")
    return msg  # type: ignore[return-value]
