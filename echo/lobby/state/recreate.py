"""The lobby registry's re-creation of a lobby whose home died, from its members' copies
(the merge rule is `_Recreate._recreate`'s; docs/lobby-protocol.md).

Pure module: no trio, no clock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import attrs

from echo.lobby import gameloop
from echo.lobby.protocol import (
    ErrorCode,
    GameCopy,
    LeaveReason,
    LobbyJoined,
    LobbySnapshot,
    MemberLeft,
    MemberState,
    Presence,
    RecreateLobby,
    Reply,
    SeatTag,
)
from echo.lobby.state.ops import _Operations
from echo.lobby.state.records import (
    MAX_COPY_VERSION,
    MAX_SEAT_TAG_BYTES,
    MAX_SEAT_TAGS,
    Send,
    _Lobby,
    _Member,
    _refuse,
    _utf8_len,
    _with_tag,
)

if TYPE_CHECKING:
    from echo.lobby.state.registry import LobbyRegistry


class _Recreate(_Operations):
    """A lobby rebuilt from its members' copies."""

    def _recreate(self, member_id: str, req: RecreateLobby, now: float) -> Reply:
        """A member's copy of a lobby whose home died arrives at the next server of the ring.

        The merge rule, for several copies of one lobby id arriving here:
        1. The copy with the highest version supplies the lobby's fields (name, size, access,
           lock, metadata, owner-to-restore); a lower or equal copy changes none of them.
        2. Bans are the union of all copies (a ban is for the lobby's life, so never undone).
        3. Members are the highest copy's members plus every member who has *arrived* here
           (sent a copy, or joined the recreated lobby): a member who joined meanwhile is not
           lost. Members of the highest copy who have not arrived hold RECONNECTING seats for
           the grace period; members only in lower copies who have not arrived are dropped
           (the newer copy says they left). Banned members are removed.
        4. If that is more than the lobby's size, seats not yet claimed go first, latest
           joined first; arrived members are never displaced (a copy that would need it is
           refused as LOBBY_FULL).
        5. The copy's owner gets the lobby back if it arrives within `recreate_window`;
           until then the owner rule of `echo.lobby.state` applies (a connected owner).
        6. The version becomes max(current, copy) + 1 and every connected member receives a
           full snapshot.
        7. The running game (`echo.lobby.gameloop.adopt_copy`): a copy carries its member's
           last ticket, believed only under our ticket keys; the game of the highest copy
           that carries one is the lobby's, unless a higher copy came unlocked without one
           (its member saw the game end). A result held for it ends it once every seat has
           arrived, or at the window's end (`echo.lobby.gameloop.apply_held`).
        """
        snap = req.snapshot
        existing = self._lobbies.get(snap.lobby_id)
        held = None if existing is None else existing.members.get(member_id)
        repeat = held is not None and held.arrived
        self._rate(member_id, "join", self.config.join_limit, now, repeat=repeat)
        if self._seats is not None and not self._seats.check(req.seat, snap.lobby_id, member_id):
            _refuse(ErrorCode.RECREATE_REFUSED, "no valid seat of this member in this lobby")
        entry = self._check_copy(member_id, snap, req.seat_tags)
        copy_tags = self._copy_tags(req.seat_tags)
        if existing is not None:
            if held is not None and held.arrived:
                # Already here (a retried copy, the lobby never left, or its hello took its
                # seat back first): just resync. Its tags still count for the seats not yet
                # claimed (once per sender: a copy sent again adds nothing).
                self._add_copy_tags(existing, member_id, copy_tags)
                return self._join(member_id, existing, req.request_id, now)
            if existing.recreated_until is None or now > existing.recreated_until:
                if held is not None:
                    # Its kept seat, claimed with its seat after the window: the copy's fields
                    # no longer merge, but the seat is its own.
                    return self._join(member_id, existing, req.request_id, now, proven=True)
                _refuse(ErrorCode.RECREATE_REFUSED, "this lobby lives here and is not recovering")
            self._not_elsewhere(member_id, snap.lobby_id)
            self._merge_copy(existing, member_id, entry, snap, copy_tags, now, req.game)
            return LobbyJoined(req.request_id, existing.lobby_id)
        return self._recreate_here(member_id, req, copy_tags, now)

    def _recreate_here(
        self, member_id: str, req: RecreateLobby, copy_tags: dict[str, bytes], now: float
    ) -> Reply:
        """The first copy of a lobby this server does not hold: the lobby, from it."""
        snap = req.snapshot
        self._not_elsewhere(member_id, None)
        if len(self._lobbies) >= self.config.max_lobbies:
            _refuse(ErrorCode.SERVER_FULL, "this server holds its maximum number of lobbies")
        if snap.private and snap.join_code in self._by_code:
            _refuse(ErrorCode.RECREATE_REFUSED, "the copy's join code is taken here")
        lobby = _Lobby(
            lobby_id=snap.lobby_id,
            name=snap.name,
            max_members=snap.max_members,
            private=snap.private,
            join_code=snap.join_code,
            locked=snap.locked,
            owner=snap.owner,
            metadata=dict(snap.metadata),
            bans=list(snap.bans),
            members={},
            version=snap.version,
            next_join_seq=0,
            recreated_until=now + self.config.recreate_window,
            base_version=snap.version,
            intended_owner=snap.owner,
        )
        for m in sorted(snap.members, key=lambda s: s.join_seq):
            if m.member_id in snap.bans:
                continue
            if m.member_id != member_id and m.member_id in self._where:
                continue  # that member has moved on to another lobby here
            lobby.members[m.member_id] = self._seat_from_copy(
                snap.lobby_id,
                m,
                now,
                arrived=m.member_id == member_id,
                tags=_with_tag({}, member_id, copy_tags.get(m.member_id)),
            )
        self._renumber(lobby)
        for m_id, seat in lobby.members.items():
            self._where[m_id] = lobby.lobby_id
            if seat.grace_until is not None:
                self._reconnecting[m_id] = seat.grace_until
        if lobby.owner not in lobby.members:
            lobby.owner = member_id
        self._add_lobby(lobby)
        self.counters["lobbies_recreated"] += 1
        self._ensure_owner(lobby, now, notify=False)
        lobby.version += 1
        self._adopt_game(lobby, member_id, req.game, snap, now)
        self._send_state(lobby.audience(), lobby)
        gameloop.apply_held(cast("LobbyRegistry", self), lobby, now)
        return LobbyJoined(req.request_id, lobby.lobby_id)

    def _adopt_game(
        self, lobby: _Lobby, member_id: str, copy: GameCopy, snap: LobbySnapshot, now: float
    ) -> None:
        """Rule 7: the copy's game, if it carries one we believe, merged into the lobby's."""
        reg = cast("LobbyRegistry", self)
        game = gameloop.game_of_copy(reg, lobby.lobby_id, member_id, copy, snap.version, now)
        gameloop.adopt_copy(reg, lobby, game, snap.version, snap.locked, now)

    def _check_copy(
        self, member_id: str, snap: LobbySnapshot, tags: tuple[SeatTag, ...]
    ) -> MemberState:
        if snap.lobby_id == 0:
            _refuse(ErrorCode.BAD_REQUEST, "lobby id 0 is not a lobby")
        if snap.version > MAX_COPY_VERSION:
            # Honest versions count changes; this one would overflow the u64 on the wire.
            _refuse(ErrorCode.BAD_REQUEST, "the copy's version is not believable")
        self._check_name(snap.name)
        self._check_max_members(snap.max_members)
        self._check_metadata(snap.metadata)
        if snap.private != (snap.join_code != ""):
            _refuse(ErrorCode.BAD_REQUEST, "a private lobby has a join code, a public one none")
        if len(snap.bans) > self.config.max_bans:
            _refuse(ErrorCode.BAN_LIST_FULL, "the copy bans too many members")
        if member_id in snap.bans:
            _refuse(ErrorCode.BANNED, "banned from this lobby")
        ids = [m.member_id for m in snap.members]
        if len(set(ids)) != len(ids) or len(ids) > snap.max_members:
            _refuse(ErrorCode.BAD_REQUEST, "the copy's members are not a valid lobby")
        entry: MemberState | None = None
        for m in snap.members:
            if not 1 <= _utf8_len(m.member_id) <= self.config.max_member_id_bytes:
                _refuse(ErrorCode.BAD_REQUEST, "not a member id")
            self._check_attributes(m.attributes)
            if m.member_id == member_id:
                entry = m
        if entry is None:
            _refuse(ErrorCode.NOT_MEMBER, "a copy is recreated only by one of its members")
        if len(tags) > MAX_SEAT_TAGS * len(ids) or any(
            len(t.tag) > MAX_SEAT_TAG_BYTES for t in tags
        ):
            _refuse(ErrorCode.BAD_REQUEST, "the copy's seat tags are not a valid lobby's")
        return entry

    @staticmethod
    def _copy_tags(tags: tuple[SeatTag, ...]) -> dict[str, bytes]:
        """A copy's tags by member: the first of each member only. A copy is its sender's
        word; one tag per seat and sender keeps a hostile member from crowding out the tags
        of honest copies (a seat keeps `MAX_SEAT_TAGS`, from different senders)."""
        by_member: dict[str, bytes] = {}
        for t in tags:
            if t.tag and t.member_id not in by_member:
                by_member[t.member_id] = t.tag
        return by_member

    def _add_copy_tags(self, lobby: _Lobby, sender: str, copy_tags: dict[str, bytes]) -> None:
        """A copy's tags for the seats still unclaimed (the others have their own client's)."""
        changed = False
        for seat in lobby.members.values():
            if not seat.arrived and seat.member_id in copy_tags:
                more = _with_tag(seat.tags, sender, copy_tags[seat.member_id])
                changed = changed or more is not seat.tags  # (a new dict when it added one)
                seat.tags = more
        if changed:
            self._out.append(Send(lobby.audience(), self._seat_tags(lobby)))

    def _seat_from_copy(
        self,
        lobby_id: int,
        m: MemberState,
        now: float,
        *,
        arrived: bool,
        tags: dict[str, bytes] | None = None,
    ) -> _Member:
        seat = _Member(m.member_id, m.join_seq, m.ready, Presence.CONNECTED, dict(m.attributes))
        seat.arrived = arrived
        # The sender's own seat is tagged with its own session's secret (if it has one).
        seat.tags = dict(tags or {})
        if arrived:
            seat.tags = self._own_tags(lobby_id, m.member_id) or seat.tags
        if not arrived:
            seat.presence = Presence.RECONNECTING
            seat.grace_until = now + self.config.reconnect_grace
        return seat

    def _merge_copy(
        self,
        lobby: _Lobby,
        member_id: str,
        entry: MemberState,
        snap: LobbySnapshot,
        copy_tags: dict[str, bytes],
        now: float,
        game: GameCopy,
    ) -> None:
        bans = list(lobby.bans) + [b for b in snap.bans if b not in lobby.bans]
        if len(bans) > 255:
            _refuse(ErrorCode.BAN_LIST_FULL, "the copies together ban too many members")
        if member_id in bans:
            _refuse(ErrorCode.BANNED, "banned from this lobby")
        newer = snap.version > lobby.base_version
        order = self._merged_seats(lobby, member_id, entry, snap, copy_tags, now, newer=newer)
        # The sender's seat as a new record: the checks below may still refuse, and a refusal
        # must leave the lobby as it was.
        own = self._own_tags(lobby.lobby_id, member_id)
        order = [
            attrs.evolve(
                m,
                arrived=True,
                presence=Presence.CONNECTED,
                grace_until=None,
                tags=own or m.tags,
            )
            if m.member_id == member_id
            else m
            for m in order
            if m.member_id not in bans
        ]
        max_members = snap.max_members if newer else lobby.max_members
        if sum(1 for m in order if m.arrived) > max_members:
            _refuse(ErrorCode.LOBBY_FULL, "the recreated lobby is full")
        while len(order) > max_members:
            last_unclaimed = max((i for i, m in enumerate(order) if not m.arrived), default=None)
            assert last_unclaimed is not None
            del order[last_unclaimed]
        if newer:
            new_code = snap.join_code
            if snap.private and self._by_code.get(new_code, lobby.lobby_id) != lobby.lobby_id:
                _refuse(ErrorCode.RECREATE_REFUSED, "the copy's join code is taken here")
        # From here on nothing refuses: apply.
        self._apply_copy(lobby, member_id, snap, bans, order, now, newer=newer, game=game)
        # (after the snapshot _apply_copy sent: a GameEnded is the members' next version)
        gameloop.apply_held(cast("LobbyRegistry", self), lobby, now)

    def _merged_seats(
        self,
        lobby: _Lobby,
        member_id: str,
        entry: MemberState,
        snap: LobbySnapshot,
        copy_tags: dict[str, bytes],
        now: float,
        *,
        newer: bool,
    ) -> list[_Member]:
        """The seats after merging the copy (rule 3), before bans and the lobby's size."""
        current = lobby.members
        # Seats in join order of the copy that wins; arrived members it lacks come after.
        order: list[_Member] = []
        lobby_id = lobby.lobby_id
        if newer:
            for copied in sorted(snap.members, key=lambda s: s.join_seq):
                held = current.get(copied.member_id)
                if held is not None and held.arrived:
                    order.append(held)
                elif copied.member_id == member_id:
                    order.append(self._seat_from_copy(lobby_id, copied, now, arrived=True))
                elif held is None and copied.member_id in self._where:
                    continue  # moved on to another lobby here
                else:
                    # (A seat still unclaimed keeps the tags of the copies before: the new
                    # copy's word does not erase theirs.)
                    before = {} if held is None else held.tags
                    tags = _with_tag(before, member_id, copy_tags.get(copied.member_id))
                    order.append(
                        self._seat_from_copy(lobby_id, copied, now, arrived=False, tags=tags)
                    )
            in_order = {seat.member_id for seat in order}
            order += [
                seat for seat in current.values() if seat.arrived and seat.member_id not in in_order
            ]
        else:
            order = [
                attrs.evolve(
                    seat, tags=_with_tag(seat.tags, member_id, copy_tags.get(seat.member_id))
                )
                if not seat.arrived
                else seat
                for seat in current.values()
            ]
            if member_id not in current:
                order.append(self._seat_from_copy(lobby_id, entry, now, arrived=True))
        return order

    def _apply_copy(
        self,
        lobby: _Lobby,
        member_id: str,
        snap: LobbySnapshot,
        bans: list[str],
        order: list[_Member],
        now: float,
        *,
        newer: bool,
        game: GameCopy,
    ) -> None:
        """The merged copy, checked, becomes the lobby (rules 1, 2, 5, 6 and 7)."""
        current = lobby.members
        self._unindex(lobby)
        if newer:
            lobby.name = snap.name
            lobby.max_members = snap.max_members
            lobby.private = snap.private
            lobby.join_code = snap.join_code
            lobby.locked = snap.locked
            lobby.metadata = dict(snap.metadata)
            lobby.base_version = snap.version
            lobby.intended_owner = snap.owner
        lobby.bans = bans
        kept = {m.member_id for m in order}
        banned_here: list[str] = []
        for gone, seat in current.items():
            if gone not in kept:
                self._where.pop(gone, None)
                self.held_chat.forget(gone)
                self._reconnecting.pop(gone, None)
                if seat.presence is Presence.CONNECTED:
                    banned_here.append(gone)  # only a ban in a copy removes an arrived member
        lobby.members = {m.member_id: m for m in order}
        for m in order:
            self._where[m.member_id] = lobby.lobby_id
            if m.grace_until is not None:
                self._reconnecting[m.member_id] = m.grace_until
            else:
                self._reconnecting.pop(m.member_id, None)
        self._renumber(lobby)
        self._index_lobby(lobby)
        if lobby.owner not in lobby.members:
            lobby.owner = member_id
        self.counters["recreate_merges"] += 1
        self._ensure_owner(lobby, now, notify=False)
        # A member the copy bans hears it as the version after the last it saw (the lobby's
        # before the merge): the merged version may be further on, a gap to its replica
        # rather than its leaving.
        left = lobby.version + 1
        lobby.version = max(lobby.version, snap.version) + 1
        self._adopt_game(lobby, member_id, game, snap, now)
        for gone in banned_here:
            self._out.append(
                Send((gone,), MemberLeft(lobby.lobby_id, left, gone, LeaveReason.BANNED))
            )
        self._send_state(lobby.audience(), lobby)

    @staticmethod
    def _renumber(lobby: _Lobby) -> None:
        """Number the members 0.. in their current order: copies and local joins number
        independently, and owner migration needs one order."""
        for seq, m in enumerate(lobby.members.values()):
            m.join_seq = seq
        lobby.next_join_seq = len(lobby.members)
