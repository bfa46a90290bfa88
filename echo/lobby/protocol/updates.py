"""The lobby protocol's state updates (each carries the lobby version it produces), the
game's start, seat tags, resume tokens and chat lines (server -> members).

Pure module: no trio, no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeAlias

import attrs

from echo.lobby.protocol.records import (
    Changes,
    LeaveReason,
    LobbySnapshot,
    MemberState,
    Presence,
    SeatTag,
    Value,
)

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
class GameLife:
    """To one member, right after each `GameStarting`: how long its game (``match_id``) may
    still run, in milliseconds, when this was sent; the lobby ends it then (``{"error":
    "timed_out"}``). The member's copy carries what is left of it to the server where the
    lobby is re-created if its home dies, so the game keeps its bound there. Not a state
    change (no version); a client from before it skips it (a message of its own, not a field
    of `GameStarting`, so that upgraded lobby servers do not break the older clients' starts).
    """

    lobby_id: int
    match_id: int
    life_ms: int


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
