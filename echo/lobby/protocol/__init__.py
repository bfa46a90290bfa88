"""Lobby messages and their compact binary codec.

Every message is one transport message: a one-byte type, then its fields in the order of the
record, big-endian. Requests carry a client-chosen u32 ``request_id`` that the one reply to
them repeats. Each message belongs to one of three logical channels (`Channel`): requests and
replies, state updates, chat. This module only tags them; carrying them with credit is the
channels layer's job (echo.channels), so a member flooding chat cannot delay lobby state.

Field encodings (each a field codec of `fields`, used by both directions):

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

`echo.lobby.protocol.table` holds the message table (`_MESSAGES`): per message type its type
byte, channel, class and fields in order (name -> field codec); records inside messages (a
snapshot, a member, a listing, a filter) are described the same way. docs/lobby-protocol.md
has the same table for people.

``parse_*_untrusted`` take bytes straight from the network and raise only
`LobbyProtocolError`; they cost O(len(data)) (every count is bounded by the bytes that remain).
Semantic limits (sizes of names, metadata, attributes, chat) are the registry's, which refuses
with an error code; the codec only enforces the structure.

The package's modules, by concern: `records` (constants, enums, the records shared by several
messages), `requests`, `replies`, `updates` (state updates, the game's start, seat tags, resume
tokens, chat), `fields` (the field codecs) and `table` (the message table, `encode`,
`channel_of`, the parsers). Every public name is imported from here.

Pure package: no trio, no clock, no I/O.
"""

from __future__ import annotations

from echo.lobby.protocol.records import I64_MAX as I64_MAX
from echo.lobby.protocol.records import I64_MIN as I64_MIN
from echo.lobby.protocol.records import MAX_MESSAGE_BYTES as MAX_MESSAGE_BYTES
from echo.lobby.protocol.records import U32_MAX as U32_MAX
from echo.lobby.protocol.records import U64_MAX as U64_MAX
from echo.lobby.protocol.records import Changes as Changes
from echo.lobby.protocol.records import Channel as Channel
from echo.lobby.protocol.records import ErrorCode as ErrorCode
from echo.lobby.protocol.records import Filter as Filter
from echo.lobby.protocol.records import FreeSlots as FreeSlots
from echo.lobby.protocol.records import LeaveReason as LeaveReason
from echo.lobby.protocol.records import LobbyListing as LobbyListing
from echo.lobby.protocol.records import LobbyProtocolError as LobbyProtocolError
from echo.lobby.protocol.records import LobbySnapshot as LobbySnapshot
from echo.lobby.protocol.records import MemberState as MemberState
from echo.lobby.protocol.records import MessageType as MessageType
from echo.lobby.protocol.records import NumberRange as NumberRange
from echo.lobby.protocol.records import Presence as Presence
from echo.lobby.protocol.records import SeatTag as SeatTag
from echo.lobby.protocol.records import StringEquals as StringEquals
from echo.lobby.protocol.records import Value as Value
from echo.lobby.protocol.replies import Done as Done
from echo.lobby.protocol.replies import LobbyJoined as LobbyJoined
from echo.lobby.protocol.replies import Refusal as Refusal
from echo.lobby.protocol.replies import Reply as Reply
from echo.lobby.protocol.replies import SearchResults as SearchResults
from echo.lobby.protocol.requests import BanMember as BanMember
from echo.lobby.protocol.requests import CreateLobby as CreateLobby
from echo.lobby.protocol.requests import GameCopy as GameCopy
from echo.lobby.protocol.requests import JoinByCode as JoinByCode
from echo.lobby.protocol.requests import JoinLobby as JoinLobby
from echo.lobby.protocol.requests import KickMember as KickMember
from echo.lobby.protocol.requests import LeaveLobby as LeaveLobby
from echo.lobby.protocol.requests import QuickJoin as QuickJoin
from echo.lobby.protocol.requests import RecreateLobby as RecreateLobby
from echo.lobby.protocol.requests import ReportGameServer as ReportGameServer
from echo.lobby.protocol.requests import Request as Request
from echo.lobby.protocol.requests import RequestTicket as RequestTicket
from echo.lobby.protocol.requests import SearchLobbies as SearchLobbies
from echo.lobby.protocol.requests import SendChat as SendChat
from echo.lobby.protocol.requests import SetAttributes as SetAttributes
from echo.lobby.protocol.requests import SetLocked as SetLocked
from echo.lobby.protocol.requests import SetMetadata as SetMetadata
from echo.lobby.protocol.requests import SetReady as SetReady
from echo.lobby.protocol.requests import StartGame as StartGame
from echo.lobby.protocol.requests import TransferOwner as TransferOwner
from echo.lobby.protocol.table import Message as Message
from echo.lobby.protocol.table import channel_of as channel_of
from echo.lobby.protocol.table import encode as encode
from echo.lobby.protocol.table import parse_message_untrusted as parse_message_untrusted
from echo.lobby.protocol.table import parse_request_untrusted as parse_request_untrusted
from echo.lobby.protocol.table import (
    parse_server_message_untrusted as parse_server_message_untrusted,
)
from echo.lobby.protocol.updates import AttributesChanged as AttributesChanged
from echo.lobby.protocol.updates import ChatLine as ChatLine
from echo.lobby.protocol.updates import GameDetails as GameDetails
from echo.lobby.protocol.updates import GameEnded as GameEnded
from echo.lobby.protocol.updates import GameLife as GameLife
from echo.lobby.protocol.updates import GameStarting as GameStarting
from echo.lobby.protocol.updates import LockChanged as LockChanged
from echo.lobby.protocol.updates import MemberBanned as MemberBanned
from echo.lobby.protocol.updates import MemberJoined as MemberJoined
from echo.lobby.protocol.updates import MemberLeft as MemberLeft
from echo.lobby.protocol.updates import MetadataChanged as MetadataChanged
from echo.lobby.protocol.updates import OwnerChanged as OwnerChanged
from echo.lobby.protocol.updates import PresenceChanged as PresenceChanged
from echo.lobby.protocol.updates import ReadyChanged as ReadyChanged
from echo.lobby.protocol.updates import ResumeToken as ResumeToken
from echo.lobby.protocol.updates import SeatTags as SeatTags
from echo.lobby.protocol.updates import Update as Update

__all__ = [
    "I64_MAX",
    "I64_MIN",
    "MAX_MESSAGE_BYTES",
    "U32_MAX",
    "U64_MAX",
    "AttributesChanged",
    "BanMember",
    "Changes",
    "Channel",
    "ChatLine",
    "CreateLobby",
    "Done",
    "ErrorCode",
    "Filter",
    "FreeSlots",
    "GameCopy",
    "GameDetails",
    "GameEnded",
    "GameLife",
    "GameStarting",
    "JoinByCode",
    "JoinLobby",
    "KickMember",
    "LeaveLobby",
    "LeaveReason",
    "LobbyJoined",
    "LobbyListing",
    "LobbyProtocolError",
    "LobbySnapshot",
    "LockChanged",
    "MemberBanned",
    "MemberJoined",
    "MemberLeft",
    "MemberState",
    "Message",
    "MessageType",
    "MetadataChanged",
    "NumberRange",
    "OwnerChanged",
    "Presence",
    "PresenceChanged",
    "QuickJoin",
    "ReadyChanged",
    "RecreateLobby",
    "Refusal",
    "Reply",
    "ReportGameServer",
    "Request",
    "RequestTicket",
    "ResumeToken",
    "SearchLobbies",
    "SearchResults",
    "SeatTag",
    "SeatTags",
    "SendChat",
    "SetAttributes",
    "SetLocked",
    "SetMetadata",
    "SetReady",
    "StartGame",
    "StringEquals",
    "TransferOwner",
    "Update",
    "Value",
    "channel_of",
    "encode",
    "parse_message_untrusted",
    "parse_request_untrusted",
    "parse_server_message_untrusted",
]
