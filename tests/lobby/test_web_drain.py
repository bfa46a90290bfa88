"""A draining lobby server's WebSocket members (echo.lobby.web.moving): each is told where its
lobby goes (``moved``: the next server of the lobby's ring walk and its door's URL, the same
server its UDP members re-create the lobby on), then closed with 1001; following it with its
copy and its seat puts it back in the lobby beside the UDP members, chat both ways."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio

import echo.lobby
from echo.lobby.drain import hand_off
from echo.lobby.protocol import ChatLine, MemberJoined
from echo.lobby.server import LobbyServer
from echo.lobby.web.door import WebDoor, WebDoorConfig
from echo.lobby.web.moving import moved_for, next_server, ws_urls_for
from echo.topics.ring import HashRing
from tests.lobby.servers import cluster
from tests.lobby.wsclient import check, ws_member


@asynccontextmanager
async def doors(servers: list[LobbyServer]) -> AsyncIterator[list[WebDoor]]:
    """A door on each server, each told every door's URL (port 0: the kernel's free TCP port,
    so the URLs are known once every door listens)."""
    async with trio.open_nursery() as nursery:
        opened: list[WebDoor] = []
        for server in servers:
            web = WebDoor(server, WebDoorConfig(port=0))
            await nursery.start(web.run)
            opened.append(web)
        urls = {
            s.server_id: f"ws://127.0.0.1:{d.port}/" for s, d in zip(servers, opened, strict=True)
        }
        for web in opened:
            web.config = attrs.evolve(web.config, ring_urls=urls)
        yield opened
        nursery.cancel_scope.cancel()


def test_the_moved_message_names_the_lobbys_next_server_and_its_door() -> None:
    ring = HashRing(["a:1", "b:1", "c:1"])
    urls = ws_urls_for(["a:1", "b:1", "c:1"], ["ws://a:80", "wss://b.example:443/lobby", "-"])
    assert urls == {"a:1": "ws://a:80", "b:1": "wss://b.example:443/lobby"}
    for lobby_id in range(1, 200):
        here = ring.servers_for(f"lobby:{lobby_id:016x}", 1)[0]
        target = next_server(ring, here, lobby_id, "m")
        assert target is not None and target != here
        # the walk the UDP members take past a dead (here: draining) home
        assert target == ring.servers_for(f"lobby:{lobby_id:016x}", 2)[1]
        moved = moved_for(ring, here, urls, lobby_id, "m")
        if target == "c:1":
            assert moved is None  # no door there: the member hears only the 1001
        else:
            assert moved == {"type": "moved", "lobby_id": str(lobby_id), "server": target,
                             "url": urls[target]}  # fmt: skip
            check(moved, "server_message")
    idle = moved_for(ring, "a:1", urls, None, "m")
    assert idle is not None and idle["lobby_id"] is None and idle["server"] != "a:1"
    check(idle, "server_message")
    assert next_server(HashRing(["a:1"]), "a:1", 5, "m") is None  # nobody to go to
    for bad, why in (
        (["ws://a:80"], "1 WebSocket URL"),
        (["http://a:80", "-", "-"], "not a ws://"),
        (["ws://a:99999", "-", "-"], "not a valid port"),
        (["ws://", "-", "-"], "not a ws://"),
    ):
        with pytest.raises(ValueError, match=why):
            ws_urls_for(["a:1", "b:1", "c:1"], bad)


async def test_a_draining_server_moves_its_websocket_members_to_the_lobbys_next_server() -> None:
    async with cluster(2) as c, doors(c.lobby) as web:
        async with echo.lobby.connect(c.names, member="udp-ann") as ann:
            lobby_id = await ann.create("moving", 4)
            home = c.by_name(ann.server or "")
            door = web[c.lobby.index(home)]
            other = next(s for s in c.lobby if s is not home)
            other_url = f"ws://127.0.0.1:{web[c.lobby.index(other)].port}/"
            secret = b"s" * 16
            async with (
                ws_member(f"ws://127.0.0.1:{door.port}/", "ws-bob", secret=secret) as bob,
                ws_member(f"ws://127.0.0.1:{door.port}/", "ws-idle") as idle,
            ):
                joined = await bob.ok("join_lobby", lobby_id=str(lobby_id))
                copy = await bob.wait_type("lobby_snapshot")
                await ann.next_event(MemberJoined)
                # a chat line in flight while the drain starts: either carried out (its reply
                # comes before the `moved`) or not (no reply from this server at all)
                await bob.send({"type": "send_chat", "request_id": 900,
                                "lobby_id": str(lobby_id), "text": "in flight"})  # fmt: skip
                reports: list[dict[str, float]] = []
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(lambda: _run(reports, hand_off(home, "test", door)))
                    moved = await bob.wait_type("moved")
                    assert moved == {"type": "moved", "lobby_id": str(lobby_id),
                                     "server": other.server_id, "url": other_url}  # fmt: skip
                    where = bob.seen.index(moved)
                    answered = [o for o in bob.seen if o.get("request_id") == 900]
                    assert not answered or bob.seen.index(answered[0]) < where
                    # A client closes on `moved` (the JavaScript one does), so the server reads
                    # everything it sent; nothing comes after the `moved`.
                    await bob.ws.aclose(1000, "moving")
                    await bob.wait_closed()
                    assert bob.seen[-1] == moved
                    # One that does not is closed by the server (after the door's
                    # close_timeout), and told nothing after its `moved` either.
                    idle_moved = await idle.wait_type("moved")
                    assert idle_moved["lobby_id"] is None and idle_moved["url"] == other_url
                    assert (await idle.wait_closed()).reason.code == 1001
                    assert idle.seen[-1] == idle_moved
                assert reports[0]["ws_members_moved"] == 2
            # The UDP member moves by the session's goodbye; the WebSocket one by `moved`: both
            # meet on the same server, whichever gets there first.
            async with ws_member(moved["url"], "ws-bob", secret=secret, seat=joined["seat"]) as b:
                snapshot = {k: v for k, v in copy.items() if k != "type"}
                again = await b.request("recreate_lobby", snapshot=snapshot, seat=joined["seat"])
                if again["type"] == "refusal":
                    assert again["code"] == "recreate_refused"  # ann's copy got there first
                    await b.ok("join_lobby", lobby_id=str(lobby_id))
                await ann.wait_until(lambda a: a.server == other.server_id, timeout=10)
                await b.wait_for(
                    lambda o: (
                        o["type"] == "lobby_snapshot"
                        and sorted(m["member_id"] for m in o["members"]) == ["udp-ann", "ws-bob"]
                    )
                )
                if not answered:  # not carried out by the drained server: say it again here
                    await b.ok("send_chat", lobby_id=str(lobby_id), text="in flight")
                line = await ann.next_event(ChatLine)
                assert (line.member_id, line.text) == ("ws-bob", "in flight")
                await ann.chat("over here")
                await b.wait_type("chat_line", text="over here", member_id="udp-ann")


async def _run(into: list[Any], job: Any) -> None:
    into.append(await job)
