"""A lobby registry with every member's replica fed from the registry's sends (test helper).

Each `Send` is delivered in order to each named member's `LobbyReplica`, the way the driver
will deliver the updates channel; a snapshot starts (or restarts) a member's replica. So every
test that uses `Lab` also checks, through `check_replicas`, that the updates a member receives
rebuild the server's state.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from echo.lobby.games import GameServerDirectory
from echo.lobby.limits import LobbyConfig, RateLimit
from echo.lobby.listings import ListingBoard
from echo.lobby.protocol import (
    ChatLine,
    ErrorCode,
    GameLife,
    GameStarting,
    LobbyJoined,
    LobbySnapshot,
    Presence,
    Refusal,
    Reply,
    Request,
    encode,
    parse_message_untrusted,
)
from echo.lobby.replica import ApplyResult, LobbyReplica
from echo.lobby.state import Handled, LobbyRegistry, Seats, Send, Tickets

FAST = RateLimit(rate=1000.0, burst=1000)
CONFIG = LobbyConfig(
    indexed_keys=frozenset({"mode", "skill"}),
    create_limit=FAST,
    update_limit=FAST,
    search_limit=FAST,
    chat_limit=FAST,
    join_limit=FAST,
)


class Lab:
    def __init__(
        self,
        config: LobbyConfig = CONFIG,
        *,
        first_id: int = 100,
        seats: Seats | None = None,
        games: GameServerDirectory | None = None,
        tickets: Tickets | None = None,
        board: ListingBoard | None = None,
        server_id: str = "",
    ) -> None:
        ids = itertools.count(first_id)
        codes = itertools.count(1)
        self.reg = LobbyRegistry(
            config,
            new_lobby_id=lambda: next(ids),
            new_join_code=lambda: f"CODE{next(codes)}",
            seats=seats,
            games=games,
            tickets=tickets,
            board=board,
            server_id=server_id,
        )
        self.now = 0.0
        self.replicas: dict[str, LobbyReplica] = {}
        self.chat: dict[str, list[ChatLine]] = {}
        self.games: dict[str, list[GameStarting]] = {}
        self.gaps: list[str] = []
        self._rid = itertools.count(1)

    def rid(self) -> int:
        return next(self._rid)

    def do(self, member: str, request: Request, secret: bytes = b"") -> Handled:
        """`secret`: the hello secret of the member's session (none by default)."""
        before = self.state()
        handled = self.reg.handle(member, request, self.now, secret=secret)
        assert handled.reply.request_id == request.request_id
        if isinstance(handled.reply, Refusal):
            assert self.state() == before, "a refusal changed the lobbies"
        assert parse_message_untrusted(encode(handled.reply)) == handled.reply
        self.deliver(handled.sends)
        if isinstance(handled.reply, LobbyJoined):
            self.replicas[member].seat = handled.reply.seat
        return handled

    def ok(self, member: str, request: Request, secret: bytes = b"") -> Reply:
        reply = self.do(member, request, secret).reply
        assert not isinstance(reply, Refusal), reply
        return reply

    def refused(
        self, member: str, request: Request, code: ErrorCode, secret: bytes = b""
    ) -> Refusal:
        before = self.reg.refusals[code]
        handled = self.do(member, request, secret)
        assert isinstance(handled.reply, Refusal), handled.reply
        assert handled.reply.code == code, handled.reply
        assert handled.reply.message
        assert handled.sends == ()
        assert self.reg.refusals[code] == before + 1
        return handled.reply

    def deliver(self, sends: Iterable[Send]) -> None:
        for send in sends:
            # Whatever the registry sends must survive the wire.
            assert parse_message_untrusted(encode(send.message)) == send.message
            for member in send.to:
                msg = send.message
                if isinstance(msg, ChatLine):
                    self.chat.setdefault(member, []).append(msg)
                elif isinstance(msg, GameStarting | GameLife):
                    if isinstance(msg, GameStarting):
                        self.games.setdefault(member, []).append(msg)
                    if member in self.replicas:  # (as the client does: the game in its copy)
                        self.replicas[member].note_game(msg, self.now)
                elif isinstance(msg, LobbySnapshot):
                    replica = self.replicas.get(member)
                    if replica is None or replica.closed or replica.lobby_id != msg.lobby_id:
                        self.replicas[member] = LobbyReplica(member, msg)
                    else:
                        assert replica.apply(msg) is ApplyResult.APPLIED
                else:
                    replica = self.replicas[member]
                    result = replica.apply(msg)
                    if result is ApplyResult.GAP:
                        self.gaps.append(member)
                    assert result in (ApplyResult.APPLIED, ApplyResult.LEFT), (member, result, msg)

    def state(self) -> dict[int, LobbySnapshot | None]:
        return {i: self.reg.snapshot(i) for i in self.reg.lobby_ids()}

    def disconnect(self, member: str) -> tuple[Send, ...]:
        sends = self.reg.disconnected(member, self.now)
        self.deliver(sends)
        return sends

    def reconnect(self, member: str) -> tuple[Send, ...]:
        sends = self.reg.reconnected(member, self.now)
        self.deliver(sends)
        return sends

    def advance(self, seconds: float) -> tuple[Send, ...]:
        self.now += seconds
        sends = self.reg.expire(self.now)
        self.deliver(sends)
        return sends

    def check_replicas(self) -> None:
        """Every connected member's copy equals the server's state of its lobby."""
        for lobby_id in self.reg.lobby_ids():
            snap = self.reg.snapshot(lobby_id)
            assert snap is not None
            for m in snap.members:
                if m.presence is Presence.CONNECTED:
                    replica = self.replicas[m.member_id]
                    assert not replica.closed
                    assert replica.snapshot() == snap, m.member_id
