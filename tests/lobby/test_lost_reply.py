"""A lost LobbyJoined over real loopback sockets: the member the server seated gets its seat
back (and no other client naming it does), and a join asked again is answered, not refused.

Seen in L1 at 1,000 x 8: a join carried out by the server whose reply never reached the
member (its session dropped under load, or it gave up waiting) left the member seated but
without the seat its hello must show, so every retry was refused until the grace period ran
out, and the lobby held a ghost.
"""

from __future__ import annotations

import contextlib
import hashlib
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio

import echo.lobby
import echo.session as es
from echo.channels import open_channels
from echo.lobby.client import LobbyClient, LobbyError, Rehomed, filters_from
from echo.lobby.hello import parse_welcome_untrusted
from echo.lobby.home import failover_home, home_of
from echo.lobby.limits import RateLimit
from echo.lobby.protocol import (
    CreateLobby,
    ErrorCode,
    JoinByCode,
    JoinLobby,
    LeaveLobby,
    LobbyJoined,
    LobbySnapshot,
    Presence,
    QuickJoin,
    RecreateLobby,
    Refusal,
    SeatTag,
    SetReady,
    encode,
    parse_server_message_untrusted,
)
from echo.lobby.server import LobbyServer, lobby_channel_specs
from tests.lobby.servers import LOBBY, Cluster, cluster, until


@asynccontextmanager
async def one_server(
    *members: str, **options: Any
) -> AsyncIterator[tuple[LobbyServer, list[LobbyClient]]]:
    """One lobby server, and a connected client for each of `members`."""
    async with cluster(1) as c, contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(echo.lobby.connect(c.names, member=m, **options))
            for m in members
        ]
        yield c.lobby[0], clients


def lose_joined_reply(server: LobbyServer, member: str, *, drop_session: bool) -> list[object]:
    """The next LobbyJoined answering a request of `member` never reaches it: its session is
    closed from the server's side right after the seating (and the snapshot is lost with
    it), or, with `drop_session` False, the reply alone is lost and the session goes on (what
    a client that gave up waiting sees). Returns the list the lost reply is put in."""
    lost: list[object] = []
    deliver: Callable[[str, object], None] = server._reply

    def reply(member_id: str, message: object) -> None:
        if (
            member_id == member
            and isinstance(message, LobbyJoined)
            and message.request_id != 0
            and not lost
        ):
            lost.append(message)
            if drop_session:
                conn = server.conns[member_id]
                conn.closing = "lost under load"  # what follows (its snapshot) is lost too
                assert server._nursery is not None
                server._nursery.start_soon(conn.session.close, "lost under load")
            return
        deliver(member_id, message)

    server._reply = reply  # type: ignore[method-assign]
    return lost


def hello_bytes(member: str, secret: bytes) -> bytes:
    """A hello with no seat and `secret`, as the wire has it (docs/lobby-protocol.md)."""
    name = member.encode()
    return b"LOBBY1" + bytes((len(name),)) + name + b"\x00\x00" + bytes((len(secret),)) + secret


def presence(server: LobbyServer, lobby_id: int, member: str) -> Presence | None:
    snapshot = server.registry.snapshot(lobby_id)
    assert snapshot is not None
    return next((m.presence for m in snapshot.members if m.member_id == member), None)


def seat_valid(server: LobbyServer, client: LobbyClient) -> bool:
    replica = client.replica
    return replica is not None and server.seats.check(replica.seat, replica.lobby_id, client.member)


async def test_a_member_whose_join_reply_was_lost_gets_its_seat_back() -> None:
    async with one_server("alice", "bob") as (server, (alice, bob)):
        lobby_id = await alice.create("room", 4)
        lost = lose_joined_reply(server, "bob", drop_session=True)
        # One call: the reply is lost with the session, the client comes back with its
        # secret, the server gives the seat back, and the join is answered.
        assert await bob.join(lobby_id) == lobby_id
        assert lost, "the first reply was lost"
        assert server.counters["seats_reclaimed"] >= 1
        assert server.counters["hellos_refused"] == 0
        assert presence(server, lobby_id, "bob") is Presence.CONNECTED
        await alice.wait_until(
            lambda m: (
                "bob" in m.replica.members
                and m.replica.members["bob"].presence is Presence.CONNECTED
            )
        )
        # It holds its seat now, and the lobby has one bob, not a ghost.
        assert seat_valid(server, bob)
        assert [m.member_id for m in server.registry.snapshot(lobby_id).members] == [
            "alice",
            "bob",
        ]
        await bob.chat("made it")


async def test_a_create_whose_reply_was_lost_returns_the_lobby_when_asked_again() -> None:
    async with one_server("alice") as (server, (alice,)):
        lose_joined_reply(server, "alice", drop_session=True)
        with pytest.raises(echo.lobby.LobbyUnavailable, match="dropped"):  # (NoReply)
            await alice.create("room", 4, metadata={"mode": "duel"})
        (made,) = server.registry.lobby_ids()
        # The client came back by itself with its secret and was told its seat.
        await alice.wait_until(lambda m: m.replica is not None and seat_valid(server, m))
        assert alice.lobby_id == made
        assert presence(server, made, "alice") is Presence.CONNECTED
        # The user asks again, as it would after an error: the lobby it made.
        assert await alice.create("room", 4, metadata={"mode": "duel"}) == made
        assert len(server.registry) == 1
        # A different create is still one lobby too many.
        with pytest.raises(LobbyError) as refused:
            await alice.create("another room", 4)
        assert refused.value.code is ErrorCode.ALREADY_IN_LOBBY


async def test_another_client_naming_the_member_is_still_refused() -> None:
    async with cluster(1) as c:
        server = c.lobby[0]
        host, port = server.session_config.address, server.session_config.port

        async def hello(secret: bytes) -> tuple[str, list[object]]:
            """A raw session of "bob" with `secret` and no seat: the server's welcome (or the
            reason it closed the session) and the first messages on the requests and updates
            channels."""
            async with es.connect(host, port, port + 1, timeout=5) as session:
                await session.send(hello_bytes("bob", secret))
                try:
                    with trio.fail_after(5):
                        welcome = await session.receive()
                except es.SessionClosed as closed:
                    return closed.reason, []
                assert parse_welcome_untrusted(welcome) == server.server_id
                async with open_channels(session, lobby_channel_specs(server=False)) as ch:
                    with trio.fail_after(5):
                        reply = parse_server_message_untrusted((await ch[0].receive()).data)
                        update = parse_server_message_untrusted((await ch[1].receive()).data)
                return "welcome", [reply, update]

        async with echo.lobby.connect(c.names, member="alice") as alice:
            lobby_id = await alice.create("room", 4)
            # Bob is seated, and its reply and session are lost before it learns its seat.
            async with echo.lobby.connect(c.names, member="bob", reconnect=False) as bob:
                lose_joined_reply(server, "bob", drop_session=True)
                with pytest.raises(echo.lobby.LobbyUnavailable):
                    await bob.request(JoinLobby(0, lobby_id))
                await until(lambda: presence(server, lobby_id, "bob") is Presence.RECONNECTING)
                # Someone else naming bob, with its own secret: the seat is what it needs.
                reason, _ = await hello(secrets.token_bytes(16))
                assert reason == "member seated in a lobby here: its seat is needed"
                assert server.counters["hellos_refused"] == 1
                assert presence(server, lobby_id, "bob") is Presence.RECONNECTING
                # Bob's own client (its secret) is let in and told its seat and the state.
                reason, (reply, update) = await hello(bob.secret)
                assert reason == "welcome"
                assert isinstance(reply, LobbyJoined) and reply.request_id == 0
                assert reply.lobby_id == lobby_id
                assert server.seats.check(reply.seat, lobby_id, "bob")
                assert isinstance(update, LobbySnapshot) and update.lobby_id == lobby_id
                assert server.counters["seats_reclaimed"] == 1
                assert server.counters["hellos_refused"] == 1


async def test_a_join_asked_again_on_a_live_session_is_answered_with_the_lobby() -> None:
    async with one_server("alice", "bob", "carol", "dave") as (server, clients):
        alice, bob, carol, dave = clients
        create = CreateLobby(0, "room", 4, False, {"mode": "duel"})
        first = await alice.request(create)
        assert isinstance(first, LobbyJoined)
        lobby_id = first.lobby_id
        again = await alice.request(create)
        assert isinstance(again, LobbyJoined) and again.lobby_id == lobby_id and again.seat
        quick = QuickJoin(0, filters_from(equals={"mode": "duel"}, free_slots=1))
        for request in (JoinLobby(0, lobby_id), JoinLobby(0, lobby_id)):
            assert (await bob.request(request)).lobby_id == lobby_id
        for request in (quick, quick):
            assert (await carol.request(request)).lobby_id == lobby_id
        # The lobby is full now: a quick-join asked again still finds its own seat.
        assert (await dave.request(quick)).lobby_id == lobby_id
        assert (await dave.request(quick)).lobby_id == lobby_id
        snapshot = server.registry.snapshot(lobby_id)
        assert [m.member_id for m in snapshot.members] == ["alice", "bob", "carol", "dave"]
        assert server.registry.counters["joins_repeated"] >= 4
        assert server.registry.refusals[ErrorCode.ALREADY_IN_LOBBY] == 0


async def test_a_private_join_by_code_asked_again_is_answered_too() -> None:
    async with one_server("alice", "bob") as (_, (alice, bob)):
        lobby_id = await alice.create("secret", 4, private=True)
        code = alice.replica.join_code
        for _ in range(2):
            assert (await bob.request(JoinByCode(0, code))).lobby_id == lobby_id
        assert await bob.join_code(code) == lobby_id  # the library asks its lobby's server


async def test_a_reply_that_came_too_late_is_not_a_refusal_when_asked_again() -> None:
    async with one_server("alice", "bob", timeout=2.0) as (server, (alice, bob)):
        # The replies are lost, the sessions go on: each call gives up after its timeout.
        lose_joined_reply(server, "alice", drop_session=False)
        with pytest.raises(echo.lobby.LobbyUnavailable, match="no reply"):
            await alice.create("room", 4, metadata={"mode": "duel"})
        await alice.wait_until(lambda m: m.replica is not None)  # (its snapshot came)
        lobby_id = await alice.create("room", 4, metadata={"mode": "duel"})
        assert server.registry.lobby_ids() == [lobby_id] and seat_valid(server, alice)
        lose_joined_reply(server, "bob", drop_session=False)
        duel = filters_from(equals={"mode": "duel"})
        with pytest.raises(echo.lobby.LobbyUnavailable, match="no reply"):
            await bob.quick_join(duel)
        await bob.wait_until(lambda m: m.replica is not None)
        assert await bob.quick_join(duel) == lobby_id
        assert seat_valid(server, bob)
        assert presence(server, lobby_id, "bob") is Presence.CONNECTED


# --- across servers: the home dies before the member learned its seat --------------------------


async def lose_seat_then_kill_home(
    c: Cluster, bob: LobbyClient, lobby_id: int, copies: list[LobbyClient]
) -> tuple[LobbyServer, LobbyServer]:
    """bob is seated at the lobby's home, but its reply and session are lost, and the home
    dies before bob gets back to it. Returns (the dead home, the next server)."""
    home = c.by_name(home_of(c.lobby[0].ring, lobby_id).home)
    nxt = c.by_name(failover_home(home.ring, lobby_id, {home.server_id}) or "")
    lose_joined_reply(home, "bob", drop_session=True)
    with pytest.raises(echo.lobby.LobbyUnavailable):
        await bob._request(JoinLobby(0, lobby_id), server=home.server_id)
    assert bob.replica is None
    # The others' copies hold bob's seat and its tag (never its secret).
    for m in copies:
        await m.wait_until(lambda m: "bob" in m.replica.seat_tags)
        assert all(bob.secret not in tag for tag in m.replica.seat_tags["bob"])
    return home, nxt


async def test_a_member_whose_reply_was_lost_gets_its_seat_on_the_next_server() -> None:
    async with (
        cluster(3) as c,
        echo.lobby.connect(c.names, member="alice") as alice,
        echo.lobby.connect(c.names, member="carol") as carol,
        # (reconnect=False: its client does not get back to the home before the home dies)
        echo.lobby.connect(c.names, member="bob", reconnect=False) as bob,
    ):
        lobby_id = await alice.create("room", 4)
        await carol.join(lobby_id)
        home, nxt = await lose_seat_then_kill_home(c, bob, lobby_id, [alice, carol])
        c.kill(home)
        for m in (alice, carol):
            assert await m.next_event(Rehomed) == Rehomed(lobby_id, nxt.server_id)
        await until(lambda: presence(nxt, lobby_id, "bob") is Presence.RECONNECTING)
        # bob asks again: past the dead home, the next server lets its client in by its
        # secret (the copies' tag of its seat), and it learns its seat there.
        assert await bob.join(lobby_id) == lobby_id
        assert bob.server == nxt.server_id
        assert nxt.counters["hellos_refused"] == 0
        assert nxt.counters["seats_reclaimed"] == 1
        assert seat_valid(nxt, bob)
        assert presence(nxt, lobby_id, "bob") is Presence.CONNECTED
        await alice.wait_until(lambda m: m.replica.members["bob"].presence is Presence.CONNECTED)
        await bob.chat("made it")


@asynccontextmanager
async def raw_member(
    server: LobbyServer, member: str, secret: bytes
) -> AsyncIterator[tuple[str, Any]]:
    """A session naming `member` with `secret` and no seat, as anyone could open: ("welcome",
    its channels) or (the reason the server closed it, None)."""
    host, port = server.session_config.address, server.session_config.port
    async with es.connect(host, port, port + 1, timeout=5) as session:
        await session.send(hello_bytes(member, secret))
        try:
            with trio.fail_after(5):
                welcome = await session.receive()
        except es.SessionClosed as closed:
            yield closed.reason, None
            return
        assert parse_welcome_untrusted(welcome) == server.server_id
        async with open_channels(session, lobby_channel_specs(server=False)) as channels:
            yield "welcome", channels


async def reply_to(channels: Any, request: object) -> object:
    await channels[0].send(encode(request))
    with trio.fail_after(5):
        while True:
            message = parse_server_message_untrusted((await channels[0].receive()).data)
            if getattr(message, "request_id", None) == getattr(request, "request_id", None):
                return message


async def test_a_hostile_recreator_cannot_take_the_seat_of_a_member_who_lost_its_reply() -> None:
    async with (
        cluster(3) as c,
        echo.lobby.connect(c.names, member="alice") as alice,
        echo.lobby.connect(c.names, member="mallory", reconnect=False) as mallory,
        echo.lobby.connect(c.names, member="bob", reconnect=False) as bob,
    ):
        lobby_id = await alice.create("room", 4)
        await mallory.join(lobby_id)
        home, nxt = await lose_seat_then_kill_home(c, bob, lobby_id, [alice, mallory])
        # mallory opens a session as "bob" on the next server while bob sits nowhere there
        # (so no hello can ask for bob's seat), with a secret of its own.
        mine = secrets.token_bytes(16)
        async with raw_member(nxt, "bob", mine) as (said, impostor):
            assert said == "welcome"
            c.kill(home)
            # ... and re-creates the lobby there first, from a copy of its making: newer, its
            # own owner, and bob's seat tagged with tags it made (a plain hash of its secret,
            # its own seat's tag).
            assert mallory.replica is not None
            copy = mallory.replica.recreate_request(0)
            forged = (
                SeatTag("bob", b"\x01" + hashlib.sha256(mine).digest()[:16]),
                *(SeatTag("bob", t.tag) for t in copy.seat_tags if t.member_id == "mallory"),
                *(t for t in copy.seat_tags if t.member_id != "bob"),
            )
            newer = attrs.evolve(copy.snapshot, version=copy.snapshot.version + 99)
            made = await mallory._request(
                RecreateLobby(0, newer, copy.seat, forged), server=nxt.server_id
            )
            assert isinstance(made, LobbyJoined)
            assert presence(nxt, lobby_id, "bob") is Presence.RECONNECTING
            # Its "bob" cannot take bob's seat, nor give it up, nor act for bob.
            for request in (
                JoinLobby(7, lobby_id),
                LeaveLobby(8, lobby_id),
                SetReady(9, lobby_id, "bob", True),
            ):
                refusal = await reply_to(impostor, request)
                assert isinstance(refusal, Refusal) and refusal.code is ErrorCode.NOT_MEMBER
            # Nor does a new session naming bob with mallory's secret get in.
            async with raw_member(nxt, "bob", mine) as (said, _):
                assert said == "member seated in a lobby here: its seat is needed"
            assert presence(nxt, lobby_id, "bob") is Presence.RECONNECTING
            # alice's honest copy comes (older: mallory's fields stay) and brings bob's true
            # tag; bob's own client gets in by its secret, and its seat is its own again.
            assert await alice.next_event(Rehomed) == Rehomed(lobby_id, nxt.server_id)
            assert await bob.join(lobby_id) == lobby_id
            assert seat_valid(nxt, bob)
            assert presence(nxt, lobby_id, "bob") is Presence.CONNECTED
            assert nxt.registry.refusals[ErrorCode.NOT_MEMBER] == 3


# --- a repeat spends no rate budget -------------------------------------------------------------


async def test_a_member_asking_again_and_again_is_not_rate_limited() -> None:
    slow = RateLimit(rate=1 / 600, burst=2)
    config = attrs.evolve(LOBBY, create_limit=slow, join_limit=slow)
    async with (
        cluster(1, lobby=config) as c,
        echo.lobby.connect(c.names, member="alice") as alice,
        echo.lobby.connect(c.names, member="bob") as bob,
    ):
        create = CreateLobby(0, "room", 4, False, {"mode": "duel"})
        lobby_id = await alice.create("room", 4, metadata={"mode": "duel"})
        # Replies lost under load, asked again and again: each answered with the lobby, and
        # none spends the budget (2 creates and 2 joins per 10 minutes here).
        for _ in range(5):
            again = await alice.request(create)
            assert isinstance(again, LobbyJoined) and again.lobby_id == lobby_id
        for _ in range(6):
            joined = await bob.request(JoinLobby(0, lobby_id))
            assert isinstance(joined, LobbyJoined) and joined.lobby_id == lobby_id
        registry = c.lobby[0].registry
        assert registry.refusals[ErrorCode.RATE_LIMITED] == 0
        # Distinct requests still spend it: bob's one join left, then refused.
        await bob.leave()
        with pytest.raises(LobbyError) as first:
            await bob.request(JoinLobby(0, lobby_id + 1))
        assert first.value.code is ErrorCode.NO_SUCH_LOBBY
        with pytest.raises(LobbyError) as second:
            await bob.request(JoinLobby(0, lobby_id))
        assert second.value.code is ErrorCode.RATE_LIMITED
