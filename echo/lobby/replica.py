"""A member's own copy of its lobby: the soft state that outlives the home.

Every member keeps a `LobbyReplica`, starts it from the `LobbySnapshot` the server sends when it
joins, and feeds it every update of the updates channel. Updates carry the version they
produce; the replica applies exactly the next version, ignores older ones (a duplicate or a
reordered message after a snapshot) and reports a gap when one is missing, so the member asks
for a snapshot again (a `JoinLobby` for a lobby one is in answers with one).

When the lobby's home dies, the member sends `recreate_request()` to the next server of the
ring (`echo.lobby.home`); the server's merge rule is `LobbyRegistry._recreate` (state.py) and
docs/lobby-protocol.md. The copy carries the seats' tags (`SeatTags`, keyed hashes of the
secrets of the clients that hold them), so that the next server gives each seat back to its own
client even if that client never learned its seat.

Pure module: no trio, no clock.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from echo.lobby.protocol import (
    AttributesChanged,
    GameCopy,
    GameEnded,
    GameLife,
    GameStarting,
    LobbySnapshot,
    LockChanged,
    MemberBanned,
    MemberJoined,
    MemberLeft,
    MemberState,
    MetadataChanged,
    OwnerChanged,
    PresenceChanged,
    ReadyChanged,
    RecreateLobby,
    SeatTag,
    SeatTags,
    Update,
    Value,
)


class ApplyResult(enum.Enum):
    APPLIED = "applied"
    STALE = "stale"  # an older version than the replica's: ignored
    GAP = "gap"  # a version is missing: the replica is unchanged; ask for a snapshot
    OTHER_LOBBY = "other_lobby"  # an update for a different lobby id: ignored
    LEFT = "left"  # this member left (or was kicked, banned, dropped): the replica is closed
    CLOSED = "closed"  # the replica was already closed


class LobbyReplica:
    """The lobby state as one member (`me`) knows it."""

    def __init__(self, me: str, snapshot: LobbySnapshot, seat: bytes = b"") -> None:
        self.me = me
        self.seat = seat  # from this member's LobbyJoined; needed to recreate the lobby
        self.closed = False
        # member id -> its seat's tags, from the server's SeatTags (they travel in our copy).
        self.seat_tags: dict[str, tuple[bytes, ...]] = {}
        # The lobby's running game as this member knows it: the last GameStarting it got, and
        # the life left its GameLife said and when (the caller's clock), until a GameEnded
        # (they travel in our copy: `game_copy`).
        self.game: GameStarting | None = None
        self._life_ms = 0
        self._life_at = 0.0
        self._load(snapshot)

    def _load(self, s: LobbySnapshot) -> None:
        self.lobby_id = s.lobby_id
        self.version = s.version
        self.name = s.name
        self.max_members = s.max_members
        self.private = s.private
        self.join_code = s.join_code
        self.locked = s.locked
        self.owner = s.owner
        self.metadata: dict[str, Value] = dict(s.metadata)
        self.bans: list[str] = list(s.bans)
        self.members: dict[str, MemberState] = {
            m.member_id: m for m in sorted(s.members, key=lambda m: m.join_seq)
        }
        # A snapshot is the whole state: the server follows it with every seat's tags.
        self.seat_tags = {}

    def snapshot(self) -> LobbySnapshot:
        return LobbySnapshot(
            lobby_id=self.lobby_id,
            version=self.version,
            name=self.name,
            max_members=self.max_members,
            private=self.private,
            join_code=self.join_code,
            locked=self.locked,
            owner=self.owner,
            metadata=dict(self.metadata),
            bans=tuple(self.bans),
            members=tuple(self.members.values()),
        )

    def recreate_request(self, request_id: int, now: float | None = None) -> RecreateLobby:
        """What this member sends to the lobby's next home when the home died; `now`: the
        clock `note_game` was given (None: the game's life as it was received)."""
        tags = tuple(
            SeatTag(member_id, tag)
            for member_id in self.members
            for tag in self.seat_tags.get(member_id, ())
        )
        return RecreateLobby(request_id, self.snapshot(), self.seat, tags, self.game_copy(now))

    def note_game(self, message: GameStarting | GameLife, now: float) -> None:
        """A `GameStarting` for this lobby (a start, or a fresh ticket), or the `GameLife` that
        follows it, arrived at `now` (any monotonic clock of the member's): the game is
        running, and its ticket and life go in our copy."""
        if self.closed or message.lobby_id != self.lobby_id:
            return
        if isinstance(message, GameStarting):
            if self.game is None or self.game.match_id != message.match_id:
                self._life_ms = 0  # (its life is still to come)
            self.game = message
        elif self.game is not None and self.game.match_id == message.match_id:
            self._life_ms = message.life_ms
            self._life_at = now

    def game_copy(self, now: float | None = None) -> GameCopy:
        """Our copy of the running game: its last ticket and what is left of its life at
        `now` (None: as received). Empty if no game runs, as far as we know, or its life is
        over, or the server did not say it (a home from before games were copied)."""
        game = self.game
        if game is None or self._life_ms == 0:
            return GameCopy()
        spent = 0 if now is None else max(0, round((now - self._life_at) * 1000))
        left = self._life_ms - spent
        return GameCopy(game.ticket, left) if left > 0 else GameCopy()

    def apply(self, update: Update | SeatTags) -> ApplyResult:
        if self.closed:
            return ApplyResult.CLOSED
        if update.lobby_id != self.lobby_id:
            return ApplyResult.OTHER_LOBBY
        if isinstance(update, SeatTags):
            # Not versioned: it follows the snapshot or MemberJoined it belongs to, on the
            # same channel. For each member named, these are now its seat's tags.
            fresh: dict[str, tuple[bytes, ...]] = {}
            for t in update.tags:
                if t.member_id in self.members:
                    fresh[t.member_id] = (*fresh.get(t.member_id, ()), t.tag)
            self.seat_tags.update(fresh)
            return ApplyResult.APPLIED
        return self._apply_versioned(update)

    def _apply_versioned(self, update: Update) -> ApplyResult:
        """A snapshot (unless older) or the next update; a later one is a GAP."""
        if isinstance(update, LobbySnapshot):
            if update.version < self.version:
                return ApplyResult.STALE
            self._load(update)
            return ApplyResult.APPLIED
        if update.version <= self.version:
            return ApplyResult.STALE
        if update.version != self.version + 1:
            return ApplyResult.GAP
        self.version = update.version
        return self._apply_change(update)

    def _apply_change(self, update: Update) -> ApplyResult:
        """One update in order (its version is now the replica's): LEFT if it removed this
        member, else APPLIED."""
        match update:
            case MemberJoined():
                self.members[update.member.member_id] = update.member
            case MemberLeft():
                self.members.pop(update.member_id, None)
                self.seat_tags.pop(update.member_id, None)
                if update.member_id == self.me:
                    self.closed = True
                    return ApplyResult.LEFT
            case OwnerChanged():
                self.owner = update.owner
            case MetadataChanged():
                _apply_changes(self.metadata, update.changes)
            case LockChanged():
                self.locked = update.locked
            case AttributesChanged():
                m = self.members.get(update.member_id)
                if m is not None:
                    attributes = dict(m.attributes)
                    _apply_changes(attributes, update.changes)
                    self.members[m.member_id] = MemberState(
                        m.member_id, m.join_seq, m.ready, m.presence, attributes
                    )
            case ReadyChanged():
                m = self.members.get(update.member_id)
                if m is not None:
                    self.members[m.member_id] = MemberState(
                        m.member_id, m.join_seq, update.ready, m.presence, m.attributes
                    )
            case PresenceChanged():
                m = self.members.get(update.member_id)
                if m is not None:
                    self.members[m.member_id] = MemberState(
                        m.member_id, m.join_seq, m.ready, update.presence, m.attributes
                    )
            case MemberBanned():
                if update.member_id not in self.bans:
                    self.bans.append(update.member_id)
            case GameEnded():
                # The game is over: the lobby is open again and everyone readies up anew.
                self.game = None
                self._life_ms = 0
                self.locked = False
                for m in list(self.members.values()):
                    self.members[m.member_id] = MemberState(
                        m.member_id, m.join_seq, False, m.presence, m.attributes
                    )
        return ApplyResult.APPLIED


def _apply_changes(target: dict[str, Value], changes: Mapping[str, Value | None]) -> None:
    for key, v in changes.items():
        if v is None:
            target.pop(key, None)
        else:
            target[key] = v
