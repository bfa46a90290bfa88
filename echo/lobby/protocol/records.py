"""The lobby protocol's constants, enums (logical channels, error codes, presence, leave
reasons, message types) and the records shared by several messages (filters, a member, a
lobby's snapshot, a seat tag, a listing).

Pure module: no trio, no clock, no I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Final, TypeAlias

import attrs

from echo.codec import CodecError

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
    GAME_LIFE = 0x4E
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
