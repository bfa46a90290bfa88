"""The lobby registry's membership changes: a member coming back or leaving, the owner
rule, the seat tags, and the queue of what an operation sends.

Pure module: no trio, no clock.
"""

from __future__ import annotations

from collections.abc import Callable

from echo.lobby.protocol import (
    GameLife,
    GameStarting,
    LeaveReason,
    MemberLeft,
    OwnerChanged,
    Presence,
    PresenceChanged,
    SeatTag,
    SeatTags,
    Update,
)
from echo.lobby.state.records import (
    Send,
    _Lobby,
    _Member,
)
from echo.lobby.state.search import _Search


class _Members(_Search):
    """Members coming and going, the owner rule, seat tags and the sends of an operation."""

    def _come_back(self, lobby: _Lobby, member: _Member, now: float) -> None:
        if member.presence is Presence.RECONNECTING:
            first = len(self._out)
            member.presence = Presence.CONNECTED
            member.grace_until = None
            member.arrived = True
            self._reconnecting.pop(member.member_id, None)
            self.counters["members_reconnected"] += 1
            self._list_if_live(lobby)
            self._broadcast(
                lobby,
                lambda v: PresenceChanged(lobby.lobby_id, v, member.member_id, Presence.CONNECTED),
            )
            self._ensure_owner(lobby, now)
            # Its copy is stale: the updates of its own return would not apply to it; the
            # snapshot below holds them.
            self._out[first:] = [
                Send(tuple(m for m in send.to if m != member.member_id), send.message)
                for send in self._out[first:]
            ]
        # It missed the updates sent while it was away: the whole state, after them.
        self._send_state((member.member_id,), lobby)

    def _remove(self, lobby: _Lobby, member_id: str, reason: LeaveReason, now: float) -> None:
        audience = lobby.audience()
        del lobby.members[member_id]
        self._where.pop(member_id, None)
        self.held_chat.forget(member_id)
        self._reconnecting.pop(member_id, None)
        lobby.version += 1
        # The member itself is told too (if it can hear): a kicked member learns why.
        self._out.append(
            Send(audience, MemberLeft(lobby.lobby_id, lobby.version, member_id, reason))
        )
        if not lobby.members:
            self._delete_lobby(lobby)
            return
        self._list_if_live(lobby)
        self._ensure_owner(lobby, now)

    def _ensure_owner(self, lobby: _Lobby, now: float, *, notify: bool = True) -> None:
        connected = lobby.connected()
        intended = lobby.intended_owner
        if (
            intended is not None
            and lobby.recreated_until is not None
            and now <= lobby.recreated_until
            and intended in lobby.members
            and lobby.members[intended].presence is Presence.CONNECTED
        ):
            new_owner = intended
        elif (returning := self._returning_owner(lobby)) is not None:
            new_owner = returning
        else:
            owner = lobby.members.get(lobby.owner)
            if owner is not None and (owner.presence is Presence.CONNECTED or not connected):
                return
            if owner is not None:
                # Its session dropped (a crash, a network change, a NAT that forgot its
                # mapping): the seat is kept, and so is its claim on the lobby.
                lobby.dropped_owner = owner.member_id
            pool = connected or list(lobby.members.values())
            new_owner = min(pool, key=lambda m: m.join_seq).member_id
        if new_owner != lobby.owner:
            self.counters["owner_migrations"] += 1
            if notify:
                self._set_owner(lobby, new_owner)
            else:
                lobby.owner = new_owner

    @staticmethod
    def _returning_owner(lobby: _Lobby) -> str | None:
        """The owner whose session dropped, once it is connected again (its seat came back
        within the grace period): ownership follows the member, not its address."""
        returning = lobby.dropped_owner
        if returning is None or returning == lobby.owner:
            lobby.dropped_owner = None
            return None
        member = lobby.members.get(returning)
        if member is None:  # it left, was kicked, or its seat expired
            lobby.dropped_owner = None
            return None
        if member.presence is not Presence.CONNECTED:
            return None
        lobby.dropped_owner = None
        return returning

    def _send_state(self, to: tuple[str, ...], lobby: _Lobby) -> None:
        """The whole lobby to `to`: its snapshot, then its seat tags (if any)."""
        self._out.append(Send(to, lobby.snapshot()))
        tags = self._seat_tags(lobby)
        if tags.tags and to:
            self._out.append(Send(to, tags))
        for member_id in to:  # a member back from away: the chat it missed, after the state
            for line in self.held_chat.take(member_id, lobby.lobby_id):
                self._out.append(Send((member_id,), line))

    @staticmethod
    def _seat_tags(lobby: _Lobby, only: str | None = None) -> SeatTags:
        """The tags of every seat (or of `only`'s)."""
        return SeatTags(
            lobby.lobby_id,
            tuple(
                SeatTag(m.member_id, tag)
                for m in lobby.members.values()
                if only is None or m.member_id == only
                for tag in m.tags.values()
            ),
        )

    def _own_tags(self, lobby_id: int, member_id: str) -> dict[str, bytes]:
        """The tag of the current request's session for this seat (none without a secret)."""
        if self._seats is None or not self._secret:
            return {}
        return {member_id: self._seats.tag(lobby_id, member_id, self._secret)}

    def _tag_holds(self, lobby: _Lobby, seat: _Member, secret: bytes) -> bool:
        seats = self._seats
        return (
            seats is not None
            and bool(secret)
            and any(
                seats.tag_matches(tag, lobby.lobby_id, seat.member_id, secret)
                for tag in seat.tags.values()
            )
        )

    def _set_owner(self, lobby: _Lobby, owner: str) -> None:
        if lobby.owner != owner:
            lobby.owner = owner
            self._broadcast(lobby, lambda v: OwnerChanged(lobby.lobby_id, v, owner))

    def _broadcast(self, lobby: _Lobby, make: Callable[[int], Update]) -> None:
        lobby.version += 1
        self._out.append(Send(lobby.audience(), make(lobby.version)))

    def _send(self, to: tuple[str, ...], message: Update | GameStarting | GameLife) -> None:
        self._out.append(Send(to, message))

    def _take_out(self) -> tuple[Send, ...]:
        out, self._out = tuple(self._out), []
        return out
