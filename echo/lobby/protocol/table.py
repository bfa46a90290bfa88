"""The lobby protocol's message table (`_MESSAGES`: per message type its type byte, channel,
class and fields in order) and the codec that walks it: `encode`, `channel_of` and the
``parse_*_untrusted`` functions.

Pure module: no trio, no clock, no I/O.
"""

from __future__ import annotations

from typing import Any, Final, TypeAlias

from echo.lobby.protocol.fields import (
    _BOOL,
    _BYTES16,
    _CHANGES,
    _FILTERS,
    _GAME_COPY,
    _GAME_DETAILS,
    _I64,
    _LISTING,
    _MEMBER,
    _OPT_U64,
    _PRESENCE,
    _SEAT_TAG_LIST,
    _SNAPSHOT,
    _STR8,
    _STR16,
    _U8,
    _U16,
    _U32,
    _U64,
    _VALUES,
    _Codec,
    _Enum,
    _List,
    _reader,
    _Record,
    _Trailing,
    _Union,
    _writer,
)
from echo.lobby.protocol.records import (
    MAX_MESSAGE_BYTES,
    Channel,
    ErrorCode,
    LeaveReason,
    LobbyProtocolError,
    LobbySnapshot,
    MessageType,
)
from echo.lobby.protocol.replies import (
    Done,
    LobbyJoined,
    Refusal,
    Reply,
    SearchResults,
)
from echo.lobby.protocol.requests import (
    BanMember,
    CreateLobby,
    GameCopy,
    JoinByCode,
    JoinLobby,
    KickMember,
    LeaveLobby,
    QuickJoin,
    RecreateLobby,
    ReportGameServer,
    Request,
    RequestTicket,
    SearchLobbies,
    SendChat,
    SetAttributes,
    SetLocked,
    SetMetadata,
    SetReady,
    StartGame,
    TransferOwner,
)
from echo.lobby.protocol.updates import (
    AttributesChanged,
    ChatLine,
    GameDetails,
    GameEnded,
    GameLife,
    GameStarting,
    LockChanged,
    MemberBanned,
    MemberJoined,
    MemberLeft,
    MetadataChanged,
    OwnerChanged,
    PresenceChanged,
    ReadyChanged,
    ResumeToken,
    SeatTags,
    Update,
)
from echo.lobby.queue_wire import CancelMatch, EnqueueMatch, Matched, Queued, QueueLeft

Message: TypeAlias = (
    Request | Reply | Update | GameStarting | GameLife | SeatTags | ResumeToken | Matched
    | QueueLeft | ChatLine
)


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
             seat_tags=_Trailing(_SEAT_TAG_LIST, ()), game=_Trailing(_GAME_COPY, GameCopy())),
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
    _Message(MessageType.GAME_LIFE, Channel.UPDATES, GameLife,
             lobby_id=_U64, match_id=_U64, life_ms=_U32),
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
) -> (
    Reply | Update | GameStarting | GameLife | SeatTags | ResumeToken | Matched | QueueLeft
    | ChatLine
):
    """Decode what the lobby server sent to a member. Raises only LobbyProtocolError."""
    msg = parse_message_untrusted(data)
    if isinstance(msg, _REQUEST_TYPES):
        raise LobbyProtocolError(f"{type(msg).__name__} is a request, not a server message")
    return msg  # type: ignore[return-value]
