"""The networked lobby over real loopback sockets: every feature through the client library,
one or several lobby servers, topics for listings."""

from __future__ import annotations

import contextlib

import pytest
import trio

import echo.lobby
from echo.lobby.client import Left, LobbyError, filters_from
from echo.lobby.protocol import (
    ChatLine,
    ErrorCode,
    LeaveReason,
    MemberJoined,
    MemberLeft,
    OwnerChanged,
    Presence,
    PresenceChanged,
)
from tests.lobby.servers import cluster, until


async def test_create_join_chat_and_leave() -> None:
    async with cluster(1) as c:
        servers = c.names
        async with (
            echo.lobby.connect(servers, member="alice") as alice,
            echo.lobby.connect(servers, member="bob") as bob,
        ):
            lobby_id = await alice.create("room", 4, metadata={"mode": "duel"})
            assert alice.replica is not None and alice.replica.owner == "alice"
            assert await bob.join(lobby_id) == lobby_id
            joined = await alice.next_event(MemberJoined)
            assert joined.member.member_id == "bob"
            assert bob.replica is not None and list(bob.replica.members) == ["alice", "bob"]
            await bob.chat("hello alice")
            line = await alice.next_event(ChatLine)
            assert (line.member_id, line.text) == ("bob", "hello alice")
            await bob.leave()
            left = await alice.next_event(MemberLeft)
            assert (left.member_id, left.reason) == ("bob", LeaveReason.LEFT)
            assert bob.replica is None
            assert list(alice.replica.members) == ["alice"]
            await alice.leave()
            await until(lambda: len(c.lobby[0].registry) == 0)


async def test_private_lobby_joins_by_code_only() -> None:
    async with cluster(1) as c:
        async with (
            echo.lobby.connect(c.names, member="alice") as alice,
            echo.lobby.connect(c.names, member="bob") as bob,
            echo.lobby.connect(c.names, member="carol") as carol,
        ):
            lobby_id = await alice.create("secret", 4, private=True)
            assert alice.replica is not None
            code = alice.replica.join_code
            assert len(code) == 8
            with pytest.raises(LobbyError) as refused:
                await bob.join(lobby_id)
            assert refused.value.code is ErrorCode.PRIVATE_LOBBY
            assert await bob.join_code(code.lower()) == lobby_id
            with pytest.raises(LobbyError) as refused:
                await carol.join_code("ZZZZZZZZ")
            assert refused.value.code is ErrorCode.NO_SUCH_CODE
            assert (await carol.search()).listings == ()


async def test_quick_join_picks_the_fullest_matching_lobby() -> None:
    async with cluster(1) as c:
        async with (
            echo.lobby.connect(c.names, member="a") as a,
            echo.lobby.connect(c.names, member="b") as b,
            echo.lobby.connect(c.names, member="x") as x,
            echo.lobby.connect(c.names, member="y") as y,
        ):
            duel = await a.create("duel", 4, metadata={"mode": "duel"})
            await b.create("ffa", 4, metadata={"mode": "ffa"})
            assert await x.quick_join(filters_from(equals={"mode": "duel"})) == duel
            with pytest.raises(LobbyError) as refused:
                await y.quick_join(filters_from(equals={"mode": "ctf"}))
            assert refused.value.code is ErrorCode.NO_MATCH


async def test_search_pages_through_the_lobbies_of_two_servers() -> None:
    async with cluster(2, topics=1) as c, contextlib.AsyncExitStack() as members:
        made: dict[int, str] = {}
        i = 0
        # Each member's own server is CH of its name, and the servers' names are their random
        # ports: six names can all land on one server, so go on until both hold lobbies.
        while len(made) < 6 or set(made.values()) != set(c.names):
            assert i < 40, f"40 members' lobbies all landed on {set(made.values())}"
            m = await members.enter_async_context(
                echo.lobby.connect(c.names, member=f"m{i}", reconnect=False)
            )
            await m.connect()
            lobby_id = await m.create(f"room {i}", 4, metadata={"skill": i % 6})
            made[lobby_id] = m.server or ""
            i += 1
        # The members stay connected: a lobby with nobody connected is not listed.
        assert set(made.values()) == set(c.names), "both servers hold lobbies"
        await until(
            lambda: all(
                len(s.board) == sum(1 for h in made.values() if h != s.server_id) for s in c.lobby
            )
        )
        async with echo.lobby.connect(c.names, member="searcher") as s:
            pages = []
            cursor = None
            while True:
                page = await s.search(cursor=cursor, limit=4)
                pages.append(page.listings)
                if page.next_cursor is None:
                    break
                cursor = page.next_cursor
            seen = [listing.lobby_id for listings in pages for listing in listings]
            assert sorted(seen) == sorted(made) and len(pages) == -(-len(made) // 4)
            homes = {listing.lobby_id: listing.home for p in pages for listing in p}
            assert homes == made
            ranged = await s.search_all(filters_from(ranges={"skill": (2, 4)}))
            assert sorted(listing.metadata["skill"] for listing in ranged) == sorted(
                i % 6 for i in range(len(made)) if 2 <= i % 6 <= 4
            )
            # A listing found on one server is joined at its home, whichever server that is.
            far = next(i for i, home in made.items() if home != s.server)
            assert await s.join(far) == far
            assert s.server == made[far]


async def test_owner_operations_and_non_owner_refusals() -> None:
    async with cluster(1) as c:
        async with (
            echo.lobby.connect(c.names, member="owner") as owner,
            echo.lobby.connect(c.names, member="bob") as bob,
            echo.lobby.connect(c.names, member="eve") as eve,
        ):
            lobby_id = await owner.create("room", 4, metadata={"mode": "duel"})
            await bob.join(lobby_id)
            await eve.join(lobby_id)
            for attempt in (
                eve.set_metadata({"mode": "ffa"}),
                eve.lock(),
                eve.kick("bob"),
                eve.ban("bob"),
                eve.transfer("eve"),
                eve.start(),
            ):
                with pytest.raises(LobbyError) as refused:
                    await attempt
                assert refused.value.code is ErrorCode.NOT_OWNER
            await owner.set_metadata({"mode": "ffa", "map": "dust"})
            await bob.wait_until(lambda m: m.replica.metadata.get("map") == "dust")
            await owner.lock()
            await bob.wait_until(lambda m: m.replica.locked)
            await owner.lock(False)
            await owner.kick("eve")
            left = await eve.next_event(Left)
            assert left.reason == "kicked" and eve.replica is None
            await owner.ban("eve")
            with pytest.raises(LobbyError) as refused:
                await eve.join(lobby_id)
            assert refused.value.code is ErrorCode.BANNED
            await owner.transfer("bob")
            await bob.wait_until(lambda m: m.replica.owner == "bob")
            with pytest.raises(LobbyError) as refused:
                await owner.lock()
            assert refused.value.code is ErrorCode.NOT_OWNER
            assert c.lobby[0].registry.refusals[ErrorCode.NOT_OWNER] == 7


async def test_attributes_and_ready_are_set_by_their_member_only() -> None:
    async with cluster(1) as c:
        async with (
            echo.lobby.connect(c.names, member="alice") as alice,
            echo.lobby.connect(c.names, member="bob") as bob,
        ):
            lobby_id = await alice.create("room", 4)
            await bob.join(lobby_id)
            await bob.set_attributes({"colour": "red", "level": 3})
            await bob.ready()
            await alice.wait_until(
                lambda m: (
                    m.replica.members["bob"].ready
                    and m.replica.members["bob"].attributes == {"colour": "red", "level": 3}
                )
            )
            from echo.lobby.protocol import SetAttributes, SetReady

            with pytest.raises(LobbyError) as refused:
                await alice.request(SetAttributes(0, lobby_id, "bob", {"colour": "blue"}))
            assert refused.value.code is ErrorCode.OTHER_MEMBER
            with pytest.raises(LobbyError) as refused:
                await alice.request(SetReady(0, lobby_id, "bob", False))
            assert refused.value.code is ErrorCode.OTHER_MEMBER
            assert c.lobby[0].registry.snapshot(lobby_id).members[1].ready is True


async def test_owner_that_drops_hands_the_lobby_to_the_earliest_connected_member() -> None:
    async with cluster(1) as c:
        async with (
            echo.lobby.connect(c.names, member="bob") as bob,
            echo.lobby.connect(c.names, member="carol") as carol,
        ):
            async with echo.lobby.connect(c.names, member="owner", reconnect=False) as owner:
                lobby_id = await owner.create("room", 4)
                await bob.join(lobby_id)
                await carol.join(lobby_id)
                await owner.wait_until(lambda m: len(m.replica.members) == 3)
            # The owner's session closed without leaving: its seat waits, ownership moves.
            changed = await carol.next_event(OwnerChanged)
            assert changed.owner == "bob"
            assert carol.replica.members["owner"].presence is Presence.RECONNECTING
            await bob.kick("owner")
            await carol.wait_until(lambda m: "owner" not in m.replica.members)


async def test_reconnection_within_the_grace_period_keeps_the_seat() -> None:
    async with cluster(1) as c:
        async with (
            echo.lobby.connect(c.names, member="alice") as alice,
            echo.lobby.connect(c.names, member="bob") as bob,
        ):
            lobby_id = await alice.create("room", 4)
            await bob.join(lobby_id)
            await bob.set_attributes({"colour": "red"})
            # Bob's session breaks under him (not a leave): the library comes back by itself.
            assert bob._link is not None
            await bob._link.session.close("network changed")
            gone = await alice.next_event(PresenceChanged)
            assert (gone.member_id, gone.presence) == ("bob", Presence.RECONNECTING)
            back = await alice.next_event(PresenceChanged)
            assert (back.member_id, back.presence) == ("bob", Presence.CONNECTED)
            await bob.wait_until(
                lambda m: (
                    m.replica is not None
                    and m.replica.members["bob"].presence is Presence.CONNECTED
                )
            )
            assert bob.replica.members["bob"].attributes == {"colour": "red"}
            await bob.chat("back")
            assert (await alice.next_event(ChatLine)).text == "back"


async def test_a_seat_is_lost_after_the_grace_period() -> None:
    lobby = attrs_evolve_grace(1.0)
    async with cluster(1, lobby=lobby) as c:
        async with echo.lobby.connect(c.names, member="alice") as alice:
            lobby_id = await alice.create("room", 4)
            async with echo.lobby.connect(c.names, member="bob", reconnect=False) as bob:
                await bob.join(lobby_id)
                await alice.wait_until(lambda m: "bob" in m.replica.members)
            left = await alice.next_event(MemberLeft)
            assert (left.member_id, left.reason) == ("bob", LeaveReason.DROPPED)
            # A new session of bob is a stranger now: no seat, a fresh join.
            async with echo.lobby.connect(c.names, member="bob") as bob:
                assert bob.replica is None
                await bob.join(lobby_id)
                assert bob.replica.members["bob"].join_seq > 0


async def test_nobody_takes_over_a_seated_member_without_its_seat() -> None:
    async with cluster(1) as c:
        async with echo.lobby.connect(c.names, member="alice") as alice:
            await alice.create("room", 4)
            with pytest.raises(echo.lobby.LobbyUnavailable, match="seat"):
                async with echo.lobby.connect(c.names, member="alice", timeout=3):
                    pass
            assert c.lobby[0].counters["hellos_refused"] == 1
            await alice.chat("still here")


def attrs_evolve_grace(grace: float) -> echo.lobby.limits.LobbyConfig:
    import attrs

    from tests.lobby.servers import LOBBY

    return attrs.evolve(LOBBY, reconnect_grace=grace)


async def test_bad_bytes_are_refused_with_a_code_and_the_server_goes_on() -> None:
    async with cluster(1) as c:
        async with echo.lobby.connect(c.names, member="alice") as alice:
            await alice.create("room", 4)
            link = alice._link
            assert link is not None and link.channels is not None
            for junk in (b"", b"\xff\x00\x00\x00\x07junk", b"\x01\x00\x00\x00\x09\xff"):
                await link.channels[0].send(junk)
            await until(lambda: c.lobby[0].counters["bad_messages"] == 3)
            await alice.chat("the server still answers")
            assert c.lobby[0].registry.refusals[ErrorCode.BAD_REQUEST] == 0
            assert c.lobby[0].sessions.application_errors == 0


async def test_chat_sent_on_the_requests_channel_is_refused() -> None:
    from echo.lobby.protocol import SendChat, encode

    async with cluster(1) as c:
        async with echo.lobby.connect(c.names, member="alice") as alice:
            lobby_id = await alice.create("room", 4)
            link = alice._link
            assert link is not None and link.channels is not None
            await link.channels[0].send(encode(SendChat(99, lobby_id, "sneaky")))
            await until(lambda: c.lobby[0].counters["wrong_channel"] == 1)


async def test_chat_beyond_a_members_backlog_is_dropped_for_it_and_counted() -> None:
    from echo.lobby.protocol import ChatLine

    # A backlog of 0 bytes: every line finds it full (what a member that stopped reading
    # meets once 16 KiB wait for it); the requests and updates channels are not affected.
    async with cluster(1, chat_backlog=0) as c:
        async with (
            echo.lobby.connect(c.names, member="alice") as alice,
            echo.lobby.connect(c.names, member="bob") as bob,
        ):
            lobby_id = await alice.create("room", 4)
            await bob.join(lobby_id)
            await bob.chat("lost")  # taken by the server (its Done came back)...
            await bob.ready()
            await alice.wait_until(lambda m: m.replica.members["bob"].ready)
            assert c.lobby[0].counters["chat_dropped"] == 2  # ...but dropped for both
            while True:
                event = await alice.next_event()
                assert not isinstance(event, ChatLine)
                if getattr(event, "ready", None) is True:
                    break
            assert alice.lobby_id == lobby_id


async def test_a_member_whose_updates_backlog_is_full_is_cut_off() -> None:
    async with cluster(1, updates_backlog=0) as c:
        async with echo.lobby.connect(c.names, member="alice", reconnect=False) as alice:
            with pytest.raises(echo.lobby.LobbyUnavailable, match="dropped"):
                await alice.create("room", 4)  # the reply finds the backlog full
            assert c.lobby[0].counters["members_too_slow"] == 1
            await until(lambda: not c.lobby[0].conns)


async def test_events_are_written_for_the_telemetry_pipeline() -> None:
    events: list = []
    async with cluster(1, events=events) as c:
        async with (
            echo.lobby.connect(c.names, member="alice") as alice,
            echo.lobby.connect(c.names, member="bob") as bob,
        ):
            lobby_id = await alice.create("room", 4)
            await bob.join(lobby_id)
            await bob.chat("hi")
            with pytest.raises(LobbyError):
                await bob.lock()
            await bob.leave()
            await alice.leave()
            await until(lambda: any(e == "lobby_deleted" for e, _ in events))
    names = [e for e, _ in events if e.startswith("lobby_")]
    assert names[0] == "lobby_server_started"
    assert names[1:] == [
        "lobby_created",
        "lobby_joined",
        "lobby_joined",
        "lobby_chat",
        "lobby_refused",
        "lobby_left",
        "lobby_left",
        "lobby_deleted",
    ]
    fields = dict(events)
    assert fields["lobby_created"] == {
        "lobby_id": lobby_id,
        "member_id": "alice",
        "max_members": 4,
        "visibility": "public",
    }
    assert fields["lobby_refused"] == {
        "member_id": "bob",
        "request": "SetLocked",
        "code": "NOT_OWNER",
    }


async def test_a_chat_flood_is_held_back_while_updates_still_arrive() -> None:
    from echo.lobby.protocol import SendChat, encode

    async with cluster(1) as c:  # the default chat rate: 8 at once, then 4 a second
        async with (
            echo.lobby.connect(c.names, member="flooder") as flooder,
            echo.lobby.connect(c.names, member="owner") as owner,
            echo.lobby.connect(c.names, member="bystander") as bystander,
        ):
            lobby_id = await owner.create("room", 8)
            await flooder.join(lobby_id)
            await bystander.join(lobby_id)
            sent = 0
            started = trio.current_time()

            async def flood() -> None:
                nonlocal sent
                link = flooder._link
                assert link is not None and link.channels is not None
                data = encode(SendChat(0, lobby_id, "x" * 200))
                while True:
                    await link.channels[2].send(data)  # returns once under guarantees
                    sent += 1

            delays = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(flood)
                await until(lambda: sent >= 20)
                # State still flows promptly to everyone while the flood goes on.
                for i in range(5):
                    t0 = trio.current_time()
                    await owner.set_metadata({"round": i})
                    await bystander.wait_until(
                        lambda m, i=i: m.replica.metadata.get("round") == i, timeout=2.0
                    )
                    delays.append(trio.current_time() - t0)
                await trio.sleep(1.0)
                nursery.cancel_scope.cancel()
            elapsed = trio.current_time() - started
            print(
                f"flood: {sent} lines in {elapsed:.1f} s; update delays "
                f"{', '.join(f'{d * 1000:.0f}' for d in delays)} ms"
            )
            assert max(delays) < 1.0
            # Held back by credit: the server's rate (8, then 4/s) plus its 2 KiB buffer.
            assert sent <= 8 + 10 + 4 * elapsed + 4, f"not held back: {sent} in {elapsed:.1f} s"
            assert c.lobby[0].registry.refusals[ErrorCode.RATE_LIMITED] <= 1


async def test_a_new_session_with_the_seat_replaces_the_old_one() -> None:
    import echo.session as es
    from echo.channels import open_channels
    from echo.lobby.hello import Hello, encode_hello, parse_welcome_untrusted
    from echo.lobby.protocol import LobbySnapshot, parse_server_message_untrusted
    from echo.lobby.server import lobby_channel_specs

    async with cluster(1) as c:
        server = c.lobby[0]
        host, port = server.session_config.address, server.session_config.port
        async with (
            echo.lobby.connect(c.names, member="alice") as alice,
            echo.lobby.connect(c.names, member="bob") as bob,
        ):
            lobby_id = await alice.create("room", 4)
            await bob.join(lobby_id)
            seat = bob.replica.seat
            assert seat
            # Bob on another device, with his seat, while the first session is still alive.
            async with es.connect(host, port, port + 1, timeout=5) as session:
                await session.send(encode_hello(Hello("bob", seat)))
                assert parse_welcome_untrusted(await session.receive()) == server.server_id
                async with open_channels(session, lobby_channel_specs(server=False)) as ch:
                    delivery = await ch[1].receive()
                    snapshot = parse_server_message_untrusted(delivery.data)
                    assert isinstance(snapshot, LobbySnapshot) and snapshot.lobby_id == lobby_id
                    # The old session was told, and does not fight back.
                    left = await bob.next_event(Left)
                    assert left.reason == "replaced"
                    assert server.counters["sessions_replaced"] == 1
                    assert server.registry.snapshot(lobby_id).members[1].presence is (
                        Presence.CONNECTED
                    )
                    await alice.chat("still one bob")
                    line = parse_server_message_untrusted((await ch[2].receive()).data)
                    assert isinstance(line, ChatLine) and line.text == "still one bob"
            assert server.counters["sessions_replaced"] == 1


async def test_hostile_requests_are_refused_with_codes_and_counted() -> None:
    from echo.lobby.protocol import CreateLobby, SetMetadata

    async with cluster(1) as c:
        registry = c.lobby[0].registry
        async with echo.lobby.connect(c.names, member="mallory") as mallory:
            for metadata, code in (
                ({"blob": "x" * 2000}, ErrorCode.METADATA_LIMIT),  # one value over 1 KiB
                ({f"k{i}": "v" * 200 for i in range(21)}, ErrorCode.METADATA_LIMIT),  # 21 keys
                ({"mode": "m" * 200}, ErrorCode.METADATA_LIMIT),  # indexed value over 128 B
            ):
                with pytest.raises(LobbyError) as refused:
                    await mallory.request(CreateLobby(0, "room", 4, False, metadata))
                assert refused.value.code is code
            with pytest.raises(LobbyError) as refused:
                await mallory.create("n" * 100, 4)
            assert refused.value.code is ErrorCode.NAME_INVALID
            with pytest.raises(LobbyError) as refused:
                await mallory.create("room", 1000)
            assert refused.value.code is ErrorCode.BAD_REQUEST
            lobby_id = await mallory.create("room", 4)
            with pytest.raises(LobbyError) as refused:
                await mallory.request(SetMetadata(0, lobby_id, {"big": "y" * 5000}))
            assert refused.value.code is ErrorCode.METADATA_LIMIT
            for text in ("x" * 300, "", "two\nlines"):
                with pytest.raises(LobbyError) as refused:
                    await mallory.chat(text)
                assert refused.value.code is ErrorCode.CHAT_LIMIT
            with pytest.raises(LobbyError) as refused:
                await mallory.request(echo.lobby.protocol.KickMember(0, lobby_id + 1, "someone"))
            assert refused.value.code is ErrorCode.NO_SUCH_LOBBY
            assert registry.refusals[ErrorCode.METADATA_LIMIT] == 4
            assert registry.refusals[ErrorCode.CHAT_LIMIT] == 3
            assert c.lobby[0].counters["refusals"] == sum(registry.refusals.values())
            assert c.lobby[0].sessions.application_errors == 0
            assert registry.snapshot(lobby_id).metadata == {}


def member_on(c: object, server: str, prefix: str) -> str:
    """A member name whose own server (CH of its name) is `server`."""
    ring = c.lobby[0].ring  # type: ignore[attr-defined]
    return next(
        f"{prefix}{i}"
        for i in range(1000)
        if ring.servers_for(f"member:{prefix}{i}", 1)[0] == server
    )


async def test_join_code_and_quick_join_find_a_lobby_on_another_server() -> None:
    async with cluster(2, topics=1) as c:
        a, b = c.names
        owner_name, guest_name = member_on(c, a, "owner"), member_on(c, b, "guest")
        async with (
            echo.lobby.connect(c.names, member=owner_name) as owner,
            echo.lobby.connect(c.names, member=guest_name) as guest,
            echo.lobby.connect(c.names, member=member_on(c, b, "quick")) as quick,
        ):
            assert (owner.server, guest.server) == (a, b)
            lobby_id = await owner.create("private", 4, private=True)
            code = owner.replica.join_code
            assert await guest.join_code(code) == lobby_id and guest.server == a
            await guest.leave()
            # quick-join looks at its own server first, then the others.
            other = member_on(c, a, "host")
            async with echo.lobby.connect(c.names, member=other) as host:
                made = await host.create("open", 4, metadata={"mode": "ctf"})
                assert quick.server == b
                assert await quick.quick_join(filters_from(equals={"mode": "ctf"})) == made
                assert quick.server == a


async def test_one_lobby_at_a_time_and_events_end_with_the_client() -> None:
    async with cluster(1) as c:
        async with echo.lobby.connect(c.names, member="alice") as alice:
            lobby_id = await alice.create("room", 4)
            for attempt in (alice.create("second", 4), alice.join_code("ABCDEFGH")):
                with pytest.raises(LobbyError) as refused:
                    await attempt
                assert refused.value.code is ErrorCode.ALREADY_IN_LOBBY
            assert await alice.join(lobby_id) == lobby_id  # its own lobby: a resync
            seen = []
            chatted = trio.Event()

            async def collect() -> None:
                async for event in alice:
                    seen.append(event)
                    if isinstance(event, ChatLine):
                        chatted.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(collect)
                await alice.chat("one")
                with trio.fail_after(10):
                    await chatted.wait()
                alice._events_in.close()  # what leaving the block does: the loop ends
        assert [e.text for e in seen if isinstance(e, ChatLine)] == ["one"]


async def test_raw_hostile_sessions_are_closed_with_a_reason_and_counted() -> None:
    import echo.session as es
    from echo.lobby.hello import Hello, encode_hello

    async with cluster(1, hello_timeout=1.0) as c:
        server = c.lobby[0]
        host, port = server.session_config.address, server.session_config.port

        async def closed_reason(*messages: bytes) -> str:
            async with es.connect(host, port, port + 1, timeout=5) as session:
                for message in messages:
                    await session.send(message)
                with trio.fail_after(10):
                    try:
                        while True:
                            await session.receive()
                    except es.SessionClosed as closed:
                        return closed.reason
            raise AssertionError("unreachable")

        assert (await closed_reason(b"HELLO there")).startswith("bad hello")
        assert "a member id is" in await closed_reason(encode_hello(Hello("bad\x00id")))
        assert await closed_reason() == "no hello"
        # Past the hello, bytes that are not channel frames end the session, nothing more.
        reason = await closed_reason(encode_hello(Hello("junk")), b"\xff" * 40)
        assert reason.startswith("channel protocol error")
        assert server.counters["hellos_refused"] == 2
        assert server.counters["hellos_timed_out"] == 1
        assert server.sessions.application_errors == 0
        async with echo.lobby.connect(c.names, member="junk") as fine:
            await fine.create("still serving", 2)
