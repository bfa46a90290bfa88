"""The WebSocket door on a real lobby server: members of both kinds in one lobby, every lobby
operation over JSON, the seat kept across a dropped WebSocket, wss://."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

import echo.lobby
from echo.lobby.client import LobbyError
from echo.lobby.protocol import (
    ChatLine,
    ErrorCode,
    GameStarting,
    MemberJoined,
    MemberLeft,
    Presence,
    PresenceChanged,
)
from echo.lobby.server import LobbyServer
from echo.lobby.web.door import WebDoor, WebDoorConfig
from tests.lobby.servers import GAME_KEY, Cluster, cluster, until
from tests.lobby.test_server_games import echo_once, game_server, write_key
from tests.lobby.wsclient import refused, ws_member


@asynccontextmanager
async def door(
    c: Cluster, server: LobbyServer | None = None, **config: Any
) -> AsyncIterator[WebDoor]:
    """A door on `server` (the cluster's first). Port 0: the kernel's free TCP port, which no
    other test can take between probe and bind (the UDP ranges come from tests/ports.py)."""
    door_class = config.pop("door_class", WebDoor)
    web = door_class(server or c.lobby[0], WebDoorConfig(port=0, **config))
    async with trio.open_nursery() as nursery:
        await nursery.start(web.run)
        yield web
        nursery.cancel_scope.cancel()


def url(web: WebDoor, scheme: str = "ws") -> str:
    return f"{scheme}://127.0.0.1:{web.port}/"


async def test_a_lobby_holds_members_of_both_kinds() -> None:
    async with cluster(1) as c, door(c) as web:
        async with (
            echo.lobby.connect(c.names, member="udp-owner") as owner,
            ws_member(url(web), "ws-bob") as bob,
        ):
            lobby_id = await owner.create("mixed", 4, metadata={"mode": "ctf"})
            found = await bob.ok(
                "search_lobbies",
                filters=[{"kind": "string_equals", "key": "mode", "value": "ctf"}],
                cursor=None,
                limit=10,
            )
            assert [x["lobby_id"] for x in found["listings"]] == [str(lobby_id)]
            joined = await bob.ok("join_lobby", lobby_id=str(lobby_id))
            assert joined["type"] == "lobby_joined" and joined["seat"]
            snapshot = await bob.wait_type("lobby_snapshot")
            assert [m["member_id"] for m in snapshot["members"]] == ["udp-owner", "ws-bob"]
            assert snapshot["owner"] == "udp-owner" and snapshot["metadata"] == {"mode": "ctf"}
            await owner.next_event(MemberJoined)
            await bob.wait_type("resume_token", lobby_id=str(lobby_id))

            # chat both ways
            await bob.send(
                {"type": "send_chat", "request_id": 50, "lobby_id": str(lobby_id), "text": "hi"}
            )
            line = await owner.next_event(ChatLine)
            assert (line.member_id, line.text) == ("ws-bob", "hi")
            await owner.chat("hello browser")
            got = await bob.wait_type("chat_line", text="hello browser")
            assert got["member_id"] == "udp-owner"

            # attributes, ready, metadata, lock: seen on both sides
            await bob.ok(
                "set_attributes", lobby_id=str(lobby_id), member_id="ws-bob",
                changes={"hero": "mage", "lvl": 12},
            )  # fmt: skip
            await owner.wait_until(
                lambda o: o.replica is not None
                and o.replica.members["ws-bob"].attributes == {"hero": "mage", "lvl": 12}
            )
            await bob.ok("set_ready", lobby_id=str(lobby_id), member_id="ws-bob", ready=True)
            await owner.set_metadata({"mode": None, "round": 2})
            changed = await bob.wait_type("metadata_changed")
            assert changed["changes"] == {"mode": None, "round": 2}
            forged = await bob.request(
                "set_ready", lobby_id=str(lobby_id), member_id="udp-owner", ready=True
            )
            assert forged["type"] == "refusal" and forged["code"] == "other_member"
            not_owner = await bob.request("set_locked", lobby_id=str(lobby_id), locked=True)
            assert not_owner["code"] == "not_owner"

            # the owner hands over to the WebSocket member, who kicks the UDP one
            await owner.transfer("ws-bob")
            await bob.wait_type("owner_changed", owner="ws-bob")
            await bob.ok("kick_member", lobby_id=str(lobby_id), member_id="udp-owner")
            left = await owner.next_event(MemberLeft)
            assert left.reason.name == "KICKED"
            left_json = await bob.wait_type("member_left", member_id="udp-owner")
            assert left_json["reason"] == "kicked"


async def test_join_by_code_quick_join_and_private_lobbies_over_json() -> None:
    async with cluster(1) as c, door(c) as web:
        async with (
            ws_member(url(web), "alice") as alice,
            ws_member(url(web), "bob") as bob,
            echo.lobby.connect(c.names, member="carol") as carol,
        ):
            created = await alice.ok(
                "create_lobby", name="secret", max_members=3, private=True, metadata={}
            )
            snap = await alice.wait_type("lobby_snapshot")
            code = snap["join_code"]
            assert code and snap["private"] is True
            by_id = await bob.request("join_lobby", lobby_id=created["lobby_id"])
            assert by_id["code"] == "private_lobby"
            await bob.ok("join_by_code", code=code)
            none = await bob.request("quick_join", filters=[])
            assert none["code"] == "already_in_lobby"
            await bob.ok("leave_lobby", lobby_id=created["lobby_id"])
            public = await carol.create("open", 4, metadata={"skill": 5})
            quick = await bob.ok(
                "quick_join",
                filters=[{"kind": "number_range", "key": "skill", "low": 1, "high": 9}],
            )
            assert quick["lobby_id"] == str(public)


async def test_a_dropped_websocket_keeps_the_seat_and_the_same_client_takes_it_back() -> None:
    async with cluster(1) as c, door(c) as web:
        async with echo.lobby.connect(c.names, member="owner") as owner:
            lobby_id = await owner.create("r", 4)
            secret = b"k" * 16
            async with ws_member(url(web), "bob", secret=secret) as bob:
                await bob.ok("join_lobby", lobby_id=str(lobby_id))
                await bob.ok("set_ready", lobby_id=str(lobby_id), member_id="bob", ready=True)
                token = (await bob.wait_type("resume_token"))["token"]
                await owner.next_event(MemberJoined)
                await bob.ws._close_stream()  # the TCP connection dies: no closing handshake
            dropped = await owner.next_event(PresenceChanged)
            assert (dropped.member_id, dropped.presence) == ("bob", Presence.RECONNECTING)
            # the same client (its secret) takes the seat back
            async with ws_member(url(web), "bob", secret=secret) as again:
                seat = await again.wait_type("lobby_joined", request_id=0)
                assert seat["lobby_id"] == str(lobby_id)
                snap = await again.wait_type("lobby_snapshot")
                me = next(m for m in snap["members"] if m["member_id"] == "bob")
                assert me["ready"] is True and me["presence"] == "connected"
                back = await owner.next_event(PresenceChanged)
                assert back.presence == Presence.CONNECTED
                await again.ws._close_stream()
            await owner.next_event(PresenceChanged)
            # a brand-new process (another secret) with the resume token
            async with ws_member(url(web), "bob", resume=token) as fresh:
                await fresh.wait_type("lobby_joined", request_id=0, lobby_id=str(lobby_id))
                await fresh.ws._close_stream()
            # the token took the seat once: it is bound to the new secret now
            closed = await refused(
                url(web), {"member_id": "bob", "secret": "eHh4eHh4eHh4eHh4eHh4eA==",
                           "resume": token},
            )  # fmt: skip
            assert closed.code == 4004 and closed.reason.startswith("resume refused: REPLAYED")


async def test_start_gives_websocket_members_tickets_the_game_server_admits(
    tmp_path: Path,
) -> None:
    key_file = write_key(tmp_path, GAME_KEY)
    async with cluster(1, topics=1, ticket_keys=(GAME_KEY,)) as c, door(c) as web:
        game, _ = await game_server(c.nursery, key_file, c.topic_names)
        await until(lambda: c.lobby[0].games.live(trio.current_time()) != [])
        async with (
            ws_member(url(web), "owner") as owner,
            ws_member(url(web), "web-bob") as bob,
            echo.lobby.connect(c.names, member="udp-carol") as carol,
        ):
            created = await owner.ok(
                "create_lobby", name="match", max_members=3, private=False, metadata={}
            )
            lobby_id = created["lobby_id"]
            await bob.ok("join_lobby", lobby_id=lobby_id)
            await carol.join(int(lobby_id))
            await bob.ok("set_ready", lobby_id=lobby_id, member_id="web-bob", ready=True)
            not_ready = await owner.request("start_game", lobby_id=lobby_id)
            assert not_ready["code"] == "not_ready"
            await carol.ready()
            await owner.wait_type("ready_changed", member_id="udp-carol", ready=True)
            await owner.ok("start_game", lobby_id=lobby_id)
            starts = [await m.wait_type("game_starting") for m in (owner, bob)]
            udp_start = await carol.next_event(GameStarting)
            tickets = [base64.b64decode(s["ticket"]) for s in starts] + [udp_start.ticket]
            assert len(set(tickets)) == 3
            assert {s["address"] for s in starts} == {udp_start.address}
            for ticket in tickets:
                assert await echo_once(game, ticket) == b"ECHO through the lobby"
            locked = await owner.wait_type("lock_changed")
            assert locked["locked"] is True


async def test_owner_operations_over_json_reach_udp_members() -> None:
    async with cluster(1) as c, door(c) as web:
        async with (
            ws_member(url(web), "owner") as owner,
            echo.lobby.connect(c.names, member="troll") as troll,
            echo.lobby.connect(c.names, member="friend") as friend,
        ):
            created = await owner.ok(
                "create_lobby", name="mod", max_members=4, private=False, metadata={"mode": "ffa"}
            )
            lobby_id = created["lobby_id"]
            await troll.join(int(lobby_id))
            await friend.join(int(lobby_id))
            await owner.ok("ban_member", lobby_id=lobby_id, member_id="troll")
            banned = await owner.wait_type("member_banned", member_id="troll")
            left = await owner.wait_type("member_left", member_id="troll")
            assert left["reason"] == "banned" and banned["lobby_id"] == lobby_id
            with pytest.raises(LobbyError) as refused_join:
                await troll.join(int(lobby_id))
            assert refused_join.value.code is ErrorCode.BANNED
            await owner.ok("set_locked", lobby_id=lobby_id, locked=True)
            await friend.wait_until(lambda m: m.replica is not None and m.replica.locked)
            await owner.ok("set_metadata", lobby_id=lobby_id, changes={"mode": "ctf", "round": 1})
            await friend.wait_until(
                lambda m: m.replica is not None
                and m.replica.metadata == {"mode": "ctf", "round": 1}
            )
            await owner.ok("transfer_owner", lobby_id=lobby_id, member_id="friend")
            await friend.wait_until(lambda m: m.replica is not None and m.replica.owner == "friend")
            await owner.ok("leave_lobby", lobby_id=lobby_id)
            await friend.wait_until(
                lambda m: m.replica is not None and set(m.replica.members) == {"friend"}
            )
