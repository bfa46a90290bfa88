"""The lobby registry's operations on one lobby: create, join (by id, by code, quick-join),
leave, the owner's operations (lock, kick, ban, transfer, metadata), a member's attributes
and ready state, and chat (the start of a game is `echo.lobby.gameloop`'s).

Pure module: no trio, no clock.
"""

from __future__ import annotations

from echo.lobby.protocol import (
    AttributesChanged,
    BanMember,
    ChatLine,
    CreateLobby,
    Done,
    ErrorCode,
    FreeSlots,
    JoinByCode,
    JoinLobby,
    KickMember,
    LeaveLobby,
    LeaveReason,
    LobbyJoined,
    LockChanged,
    MemberBanned,
    MemberJoined,
    MetadataChanged,
    Presence,
    QuickJoin,
    ReadyChanged,
    Reply,
    SeatTag,
    SeatTags,
    SendChat,
    SetAttributes,
    SetLocked,
    SetMetadata,
    SetReady,
    TransferOwner,
)
from echo.lobby.state.members import _Members
from echo.lobby.state.records import (
    Send,
    _has_control,
    _is_its_create,
    _Lobby,
    _Member,
    _merge_changes,
    _refuse,
    _utf8_len,
)


class _Operations(_Members):
    """The requests on one lobby, each checked before it changes anything."""

    def _create(self, member_id: str, req: CreateLobby, now: float) -> Reply:
        made = self._lobby_of_member(member_id)
        repeat = made is not None and _is_its_create(made, member_id, req)
        self._rate(member_id, "create", self.config.create_limit, now, repeat=repeat)
        if made is not None and repeat:
            # The same create again: its reply was lost (or came after the member gave up),
            # so it asks again. The lobby it made is its answer, not ALREADY_IN_LOBBY.
            return self._join(member_id, made, req.request_id, now)
        self._not_elsewhere(member_id, None)
        if len(self._lobbies) >= self.config.max_lobbies:
            _refuse(ErrorCode.SERVER_FULL, "this server holds its maximum number of lobbies")
        self._check_name(req.name)
        self._check_max_members(req.max_members)
        self._check_metadata(req.metadata)
        lobby_id = self._fresh_lobby_id()
        code = self._fresh_code() if req.private else ""
        lobby = _Lobby(
            lobby_id=lobby_id,
            name=req.name,
            max_members=req.max_members,
            private=req.private,
            join_code=code,
            locked=False,
            owner=member_id,
            metadata=dict(req.metadata),
            bans=[],
            members={member_id: _Member(member_id, 0, tags=self._own_tags(lobby_id, member_id))},
            version=1,
            next_join_seq=1,
        )
        self._add_lobby(lobby)
        self._where[member_id] = lobby_id
        self.counters["lobbies_created"] += 1
        self._send_state((member_id,), lobby)
        return LobbyJoined(req.request_id, lobby_id)

    def _join(
        self, member_id: str, lobby: _Lobby, request_id: int, now: float, *, proven: bool = False
    ) -> Reply:
        """`proven`: the request showed the member's valid seat (a copy's)."""
        seat = lobby.members.get(member_id)
        if seat is not None:
            if (
                not seat.arrived
                and not proven
                and self._seats is not None
                and not self._tag_holds(lobby, seat, self._secret)
            ):
                # A seat a re-created lobby keeps from a copy is its member's, and the copy
                # is another member's word: a session that came here before the seat existed
                # (so no hello checked it) shows the seat or its client's secret to take it.
                _refuse(
                    ErrorCode.NOT_MEMBER,
                    "this seat is kept for a member who has not come back: its seat is needed",
                )
            # A retried join (its reply was lost), or a member claiming its kept seat: the
            # same LobbyJoined (with its seat) and the state again.
            self.counters["joins_repeated"] += 1
            if seat.presence is Presence.CONNECTED:
                self._send_state((member_id,), lobby)
            else:
                self._come_back(lobby, seat, now)
            return LobbyJoined(request_id, lobby.lobby_id)
        self._not_elsewhere(member_id, None)
        if member_id in lobby.bans:
            _refuse(ErrorCode.BANNED, "banned from this lobby")
        if lobby.locked:
            _refuse(ErrorCode.LOBBY_LOCKED, "the owner locked this lobby")
        if len(lobby.members) >= lobby.max_members:
            _refuse(ErrorCode.LOBBY_FULL, "the lobby is full")
        member = _Member(
            member_id, lobby.next_join_seq, tags=self._own_tags(lobby.lobby_id, member_id)
        )
        lobby.next_join_seq += 1
        lobby.members[member_id] = member
        self._where[member_id] = lobby.lobby_id
        self._list_if_live(lobby)
        self.counters["joins"] += 1
        others = tuple(m for m in lobby.audience() if m != member_id)
        lobby.version += 1
        self._out.append(Send(others, MemberJoined(lobby.lobby_id, lobby.version, member.state())))
        if member.tags and others:
            tags = tuple(SeatTag(member_id, tag) for tag in member.tags.values())
            self._out.append(Send(others, SeatTags(lobby.lobby_id, tags)))
        self._send_state((member_id,), lobby)
        # A first member to connect to a recreated lobby whose owner is still away takes it.
        self._ensure_owner(lobby, now)
        return LobbyJoined(request_id, lobby.lobby_id)

    def _quick_join(self, member_id: str, req: QuickJoin, now: float) -> Reply:
        seated = self._lobby_of_member(member_id)
        repeat = (
            seated is not None
            and not seated.private
            and len(req.filters) <= self.config.max_filters
            and self._matches(seated, req.filters, own_seat=True)
        )
        self._rate(member_id, "search", self.config.search_limit, now, repeat=repeat)
        self._check_filters(req.filters)
        if seated is not None and repeat:
            # A retried quick-join (its reply was lost): the lobby it was put in still
            # matches, counting its own seat as free, so that lobby is the answer.
            return self._join(member_id, seated, req.request_id, now)
        self._not_elsewhere(member_id, None)
        best: _Lobby | None = None
        # (FreeSlots(1): the index leaves the full lobbies out.)
        for listing in self._index.matching((*req.filters, FreeSlots(1))):
            lobby = self._lobbies[listing.lobby_id]
            if (
                member_id not in lobby.bans
                # Fill the fullest lobby first (players want a game soon), then lowest id.
                and (
                    best is None
                    or (len(lobby.members), -lobby.lobby_id) > (len(best.members), -best.lobby_id)
                )
            ):
                best = lobby
        if best is None:
            _refuse(ErrorCode.NO_MATCH, "no open lobby matches")
        self.counters["quick_joins"] += 1
        return self._join(member_id, best, req.request_id, now)

    def _join_by_id(self, member_id: str, req: JoinLobby, now: float) -> Reply:
        repeat = member_id in getattr(self._lobbies.get(req.lobby_id), "members", ())
        self._rate(member_id, "join", self.config.join_limit, now, repeat=repeat)
        lobby = self._lobby(req.lobby_id)
        if lobby.private and member_id not in lobby.members:
            _refuse(ErrorCode.PRIVATE_LOBBY, "a private lobby is joined with its code")
        return self._join(member_id, lobby, req.request_id, now)

    def _join_by_code(self, member_id: str, req: JoinByCode, now: float) -> Reply:
        found = self._by_code.get(req.code)
        repeat = found is not None and self._where.get(member_id) == found
        self._rate(member_id, "join", self.config.join_limit, now, repeat=repeat)
        if found is None:
            _refuse(ErrorCode.NO_SUCH_CODE, "no lobby has this code")
        return self._join(member_id, self._lobbies[found], req.request_id, now)

    def _leave(self, member_id: str, req: LeaveLobby, now: float) -> Reply:
        lobby, _ = self._membership(member_id, req.lobby_id)
        self.counters["leaves"] += 1
        self._remove(lobby, member_id, LeaveReason.LEFT, now)
        return Done(req.request_id)

    # --- owner operations and attributes ------------------------------------------------------

    def _set_locked(self, member_id: str, req: SetLocked, now: float) -> Reply:
        self._rate(member_id, "update", self.config.update_limit, now)
        lobby = self._owned(member_id, req.lobby_id)
        if lobby.locked != req.locked:
            self._unindex(lobby)
            lobby.locked = req.locked
            self._index_lobby(lobby)
            self._broadcast(lobby, lambda v: LockChanged(lobby.lobby_id, v, req.locked))
        return Done(req.request_id)

    def _kick(self, member_id: str, req: KickMember, now: float) -> Reply:
        self._rate(member_id, "update", self.config.update_limit, now)
        lobby = self._owned(member_id, req.lobby_id)
        if req.member_id == member_id:
            _refuse(ErrorCode.BAD_REQUEST, "the owner leaves instead of kicking itself")
        if req.member_id not in lobby.members:
            _refuse(ErrorCode.NO_SUCH_MEMBER, "no such member in this lobby")
        self.counters["kicks"] += 1
        self._remove(lobby, req.member_id, LeaveReason.KICKED, now)
        return Done(req.request_id)

    def _transfer(self, member_id: str, req: TransferOwner, now: float) -> Reply:
        self._rate(member_id, "update", self.config.update_limit, now)
        lobby = self._owned(member_id, req.lobby_id)
        target = lobby.members.get(req.member_id)
        if target is None:
            _refuse(ErrorCode.NO_SUCH_MEMBER, "no such member in this lobby")
        if target.presence is not Presence.CONNECTED:
            _refuse(ErrorCode.MEMBER_NOT_CONNECTED, "that member is reconnecting")
        self._set_owner(lobby, req.member_id)
        # A deliberate transfer overrides the owner a recreated copy named, and the
        # claim of an owner whose session dropped.
        lobby.intended_owner = None
        lobby.dropped_owner = None
        return Done(req.request_id)

    def _set_ready(self, member_id: str, req: SetReady, now: float) -> Reply:
        self._rate(member_id, "update", self.config.update_limit, now)
        lobby, member = self._membership(member_id, req.lobby_id)
        if req.member_id != member_id:
            _refuse(ErrorCode.OTHER_MEMBER, "a ready state is set only by its member")
        if member.ready != req.ready:
            member.ready = req.ready
            self._broadcast(lobby, lambda v: ReadyChanged(lobby.lobby_id, v, member_id, req.ready))
        return Done(req.request_id)

    def _set_metadata(self, member_id: str, req: SetMetadata, now: float) -> Reply:
        self._rate(member_id, "update", self.config.update_limit, now)
        lobby = self._owned(member_id, req.lobby_id)
        merged, effective = _merge_changes(lobby.metadata, req.changes)
        self._check_metadata(merged)
        if effective:
            self._unindex(lobby)
            lobby.metadata = merged
            self._index_lobby(lobby)
            self._broadcast(lobby, lambda v: MetadataChanged(lobby.lobby_id, v, effective))
        return Done(req.request_id)

    def _ban(self, member_id: str, req: BanMember, now: float) -> Reply:
        self._rate(member_id, "update", self.config.update_limit, now)
        lobby = self._owned(member_id, req.lobby_id)
        target = req.member_id
        if target == member_id:
            _refuse(ErrorCode.BAD_REQUEST, "the owner cannot ban itself")
        if not 1 <= _utf8_len(target) <= self.config.max_member_id_bytes:
            _refuse(ErrorCode.BAD_REQUEST, "not a member id")
        if target in lobby.bans:
            return Done(req.request_id)
        if len(lobby.bans) >= self.config.max_bans:
            _refuse(ErrorCode.BAN_LIST_FULL, f"a lobby bans at most {self.config.max_bans}")
        lobby.bans.append(target)
        self.counters["bans"] += 1
        # Everyone connected hears of it, the target included; a banned id may be absent
        # (a ban ahead of time), otherwise the member leaves with reason BANNED.
        self._broadcast(lobby, lambda v: MemberBanned(lobby.lobby_id, v, target))
        if target in lobby.members:
            self._remove(lobby, target, LeaveReason.BANNED, now)
        return Done(req.request_id)

    def _set_attributes(self, member_id: str, req: SetAttributes, now: float) -> Reply:
        self._rate(member_id, "update", self.config.update_limit, now)
        lobby, member = self._membership(member_id, req.lobby_id)
        if req.member_id != member_id:
            _refuse(ErrorCode.OTHER_MEMBER, "attributes are set only by their own member")
        merged, effective = _merge_changes(member.attributes, req.changes)
        self._check_attributes(merged)
        if effective:
            member.attributes = merged
            self._broadcast(
                lobby, lambda v: AttributesChanged(lobby.lobby_id, v, member_id, effective)
            )
        return Done(req.request_id)

    def _chat(self, member_id: str, req: SendChat, now: float) -> Reply:
        self._rate(member_id, "chat", self.config.chat_limit, now)
        lobby, _ = self._membership(member_id, req.lobby_id)
        size = _utf8_len(req.text)
        if not 1 <= size <= self.config.max_chat_bytes:
            _refuse(
                ErrorCode.CHAT_LIMIT, f"a chat line holds 1..{self.config.max_chat_bytes} bytes"
            )
        if _has_control(req.text):
            # Line-oriented clients print chat as lines: a newline would forge another line.
            _refuse(ErrorCode.CHAT_LIMIT, "a chat line holds no control characters")
        audience = lobby.audience()
        self.counters["chat_lines"] += 1
        self.counters["chat_deliveries"] += len(audience)
        line = ChatLine(lobby.lobby_id, member_id, req.text)
        self._out.append(Send(audience, line))
        away = [m.member_id for m in lobby.members.values() if m.presence is Presence.RECONNECTING]
        self.counters["chat_held"] += len(away)
        self.counters["chat_held_dropped"] += self.held_chat.keep(away, line)
        return Done(req.request_id)
