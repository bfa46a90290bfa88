"""Bad input at the WebSocket door: each case gets an error object or a close code, is
counted, and the other members go on being served."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from trio_websocket import ConnectionClosed, open_websocket_url

from echo.lobby.limits import RateLimit
from echo.lobby.web.door import WebDoor
from echo.lobby.webpage.paged import PagedDoor
from echo.ops.metrics import LobbyCollector
from tests.lobby.auth import ISSUER, backend, verifier
from tests.lobby.servers import LOBBY, Cluster, cluster, until
from tests.lobby.test_web_door import door, url
from tests.lobby.wsclient import raw_member, refused, ws_member

ED = backend.new_signing_key("2026-12", "ed25519")


def metric(server: Any, name: str, **labels: str) -> float:
    for family in LobbyCollector(server).collect():
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    raise AssertionError(f"no {name} {labels}")


@asynccontextmanager
async def lobby_with_door(**door_config: Any) -> AsyncIterator[tuple[Cluster, Any]]:
    async with cluster(1, hello_timeout=1.0) as c, door(c, **door_config) as web:
        yield c, web


async def test_bad_messages_get_a_refusal_naming_them_and_the_connection_goes_on() -> None:
    bad = [
        ("{not json", 0, "not JSON"),
        ('{"type": "teleport", "request_id": 5}', 5, "unknown message type 'teleport'"),
        ('{"type": "join_lobby", "request_id": 6, "lobby_id": 12}', 6, "lobby_id: expected"),
        ('{"type": "set_ready", "request_id": 7, "lobby_id": "1", "member_id": "a", '
         '"ready": "yes"}', 7, "ready: expected true or false"),
        ('{"type": "lobby_snapshot", "request_id": 8}', 8, "not a client message"),
        ("[1, 2]", 0, "a message is a JSON object"),
        ('{"type": "join_lobby", "request_id": 9, "lobby_id": "1", "extra": true}', 9,
         "unknown field 'extra'"),
    ]  # fmt: skip
    async with lobby_with_door() as (c, web), ws_member(url(web), "alice") as alice:
        for text, rid, why in bad:
            start = len(alice.seen)
            await alice.ws.send_message(text)
            reply = await alice.wait_type("refusal", start=start)
            assert reply["request_id"] == rid and reply["code"] == "bad_request"
            assert why in reply["message"], reply
        created = await alice.ok(
            "create_lobby", name="still here", max_members=2, private=False, metadata={}
        )
        assert created["type"] == "lobby_joined"
        server = c.lobby[0]
        assert server.counters["ws_bad_messages"] == len(bad)
        assert metric(server, "echo_lobby_ws_bad_messages_total") == len(bad)
        assert metric(server, "echo_lobby_refusals_total", code="bad_request") == len(bad)


async def test_a_one_mebibyte_message_closes_with_1009_and_a_binary_frame_with_1003() -> None:
    async with lobby_with_door() as (c, web), ws_member(url(web), "bystander") as bystander:
        async with ws_member(url(web), "big") as big:
            with contextlib.suppress(ConnectionClosed):  # (closed before it was all sent)
                await big.ws.send_message("x" * (1 << 20))
            closed = (await big.wait_closed()).reason
            assert closed is not None and closed.code == 1009
        async with ws_member(url(web), "binary") as binary:
            await binary.ws.send_message(b'{"type": "leave_lobby"}')
            closed = (await binary.wait_closed()).reason
            assert closed is not None and closed.code == 1003 and "JSON text" in closed.reason
        server = c.lobby[0]
        assert server.counters["ws_too_big"] == 1 and server.counters["ws_binary_frames"] == 1
        await bystander.ok("create_lobby", name="fine", max_members=2, private=False, metadata={})


async def test_a_request_every_millisecond_is_refused_then_closed_and_others_are_served() -> None:
    async with lobby_with_door() as (c, web), ws_member(url(web), "calm") as calm:
        async with ws_member(url(web), "flood") as flood:
            sent = 0
            while flood.closed is None and sent < 2000:
                request = {"type": "search_lobbies", "request_id": sent + 1, "filters": [],
                           "cursor": None, "limit": 1}  # fmt: skip
                try:
                    await flood.ws.send_message(json.dumps(request))
                except ConnectionClosed:
                    break  # (closed before its reader saw it)
                sent += 1
                if sent % 50 == 0:  # someone else is answered meanwhile
                    await calm.ok("search_lobbies", filters=[], cursor=None, limit=1)
                await trio.sleep(0.001)
            closed = (await flood.wait_closed()).reason
            assert closed is not None and closed.code == 1008, closed
            limited = [o for o in flood.seen if o.get("code") == "rate_limited"]
            assert limited and "message rate" in limited[0]["message"]
        server = c.lobby[0]
        assert server.counters["ws_rate_limited"] >= 41 and server.counters["ws_rate_closed"] == 1
        await calm.ok("search_lobbies", filters=[], cursor=None, limit=1)


#: The plain door and `echo-lobby --web`'s, which listens its own way: both pace and ping.
DOORS = pytest.mark.parametrize("door_class", [WebDoor, PagedDoor], ids=["door", "paged"])


@DOORS
async def test_chat_waits_for_the_chat_rate_in_a_bounded_queue(door_class: type) -> None:
    async with (
        cluster(1, lobby=LOBBY) as c,
        door(c, max_chat_waiting=4, door_class=door_class) as web,
        ws_member(url(web), "chatty") as chatty,
    ):
        created = await chatty.ok(
            "create_lobby", name="c", max_members=2, private=False, metadata={}
        )
        for n in range(20):
            await chatty.send(
                {"type": "send_chat", "request_id": 100 + n, "lobby_id": created["lobby_id"],
                 "text": f"line {n}"}
            )  # fmt: skip
        # the chat rate lets 8 through at once (its burst); 4 wait; the rest are refused
        await chatty.wait_for(lambda o: o.get("request_id") == 119)
        refused_now = [o for o in chatty.seen if o.get("code") == "rate_limited"]
        assert len(refused_now) >= 1
        assert all("chat lines waiting" in o["message"] for o in refused_now)
        assert c.lobby[0].counters["ws_chat_queue_full"] == len(refused_now)
        # every line not refused is delivered, in order
        accepted = [n for n in range(20) if 100 + n not in {o["request_id"] for o in refused_now}]
        await chatty.wait_type("chat_line", text=f"line {accepted[-1]}")
        lines = [o["text"] for o in chatty.seen if o["type"] == "chat_line"]
        assert lines == [f"line {n}" for n in accepted]


async def test_a_member_that_never_reads_is_cut_off_and_nothing_waits_for_it() -> None:
    fast = RateLimit(rate=10_000.0, burst=10_000)
    lobby = LOBBY.__class__(**{**_fields(LOBBY), "update_limit": fast})
    async with (
        cluster(1, lobby=lobby, updates_backlog=64 * 1024) as c,
        door(c, message_rate=fast, over_rate=fast) as web,
        ws_member(url(web), "owner") as owner,
    ):
        created = await owner.ok(
            "create_lobby", name="s", max_members=4, private=False, metadata={}
        )
        lobby_id = created["lobby_id"]
        slow = await raw_member(web.port, {"member_id": "slow"}, rcvbuf=4096)
        await slow.send({"type": "join_lobby", "request_id": 1, "lobby_id": lobby_id})
        await owner.wait_type("member_joined")
        server = c.lobby[0]
        blob = {f"k{i}": chr(97 + i) * 1000 for i in range(3)}
        for n in range(20_000):
            if server.counters["members_too_slow"]:
                break
            blob["n"] = n
            reply = await owner.request("set_metadata", lobby_id=lobby_id, changes=blob)
            assert reply["type"] == "done", reply
        assert server.counters["members_too_slow"] == 1, n
        gone = await owner.wait_type("presence_changed", member_id="slow")
        assert gone["presence"] == "reconnecting"
        # what waited for it was bounded by the backlog, and is let go with its connection
        assert "slow" not in server.conns
        await slow.aclose()


def _fields(config: Any) -> dict[str, Any]:
    import attrs

    return {f.name: getattr(config, f.name) for f in attrs.fields(type(config))}


@DOORS
async def test_a_member_that_answers_no_ping_is_dropped_and_keeps_its_seat(
    door_class: type,
) -> None:
    async with (
        cluster(1) as c,
        door(c, ping_interval=0.2, ping_timeout=0.3, door_class=door_class) as web,
        ws_member(url(web), "owner") as owner,
    ):
        created = await owner.ok(
            "create_lobby", name="p", max_members=4, private=False, metadata={}
        )
        mute = await raw_member(web.port, {"member_id": "mute"})
        await mute.send({"type": "join_lobby", "request_id": 1, "lobby_id": created["lobby_id"]})
        await owner.wait_type("member_joined")
        gone = await owner.wait_type("presence_changed", member_id="mute")
        assert gone["presence"] == "reconnecting"
        assert c.lobby[0].counters["ws_ping_timeouts"] == 1
        # the owner answers its pings (its client's reader does): still here
        await owner.ok("set_locked", lobby_id=created["lobby_id"], locked=True)
        await mute.aclose()


async def test_hundreds_of_idle_connections_are_held_or_timed_out_and_others_are_served() -> None:
    idle_members, silent = 150, 150
    async with lobby_with_door() as (c, web), trio.open_nursery() as nursery:
        server = c.lobby[0]
        done = trio.Event()
        welcomed = 0

        async def member(n: int) -> None:
            nonlocal welcomed
            async with ws_member(url(web), f"idle-{n}"):
                welcomed += 1
                await done.wait()

        async def mute(n: int) -> None:
            async with open_websocket_url(url(web)) as ws:
                await done.wait()
                assert ws.closed is not None and ws.closed.code == 4003

        for n in range(idle_members):
            nursery.start_soon(member, n)
        for n in range(silent):
            nursery.start_soon(mute, n)
        await until(lambda: welcomed == idle_members, timeout=60)
        async with ws_member(url(web), "active") as active:
            await active.ok("create_lobby", name="a", max_members=2, private=False, metadata={})
        await until(lambda: server.counters["hellos_timed_out"] == silent, timeout=30)
        await until(lambda: web.open == idle_members)  # ("active" is gone, the mute too)
        assert len(server.conns) == idle_members
        done.set()
    await until(lambda: web.open == 0)


def _tasks_under(nursery: Any) -> int:
    return sum(
        1 + sum(_tasks_under(child) for child in task.child_nurseries)
        for task in nursery.child_tasks
    )


async def test_a_member_at_rest_costs_the_door_three_tasks_however_many_there_are() -> None:
    """Pings and paced chat are the door's own tasks, not two sleeping ones per member (a
    sleeping task is ~3 KB: at 8,000 members, 45 MiB)."""
    async with lobby_with_door() as (c, web), trio.open_nursery() as nursery:
        done = trio.Event()
        welcomed = 0

        async def member(n: int) -> None:
            nonlocal welcomed
            async with ws_member(url(web), f"rest-{n}") as m:
                made = await m.ok(
                    "create_lobby", name=f"r{n}", max_members=2, private=False, metadata={}
                )
                await m.send(
                    {"type": "send_chat", "request_id": 99, "lobby_id": made["lobby_id"],
                     "text": "hi"}
                )  # fmt: skip
                await m.wait_type("chat_line", text="hi")  # (paced chat leaves nothing behind)
                welcomed += 1
                await done.wait()

        counts = []
        for batch in (10, 30):
            for n in range(welcomed, batch):
                nursery.start_soon(member, n)
            await until(lambda b=batch: welcomed == b, timeout=30)  # type: ignore[misc]
            await until(lambda b=batch: len(c.lobby[0].conns) == b)  # type: ignore[misc]
            counts.append(_tasks_under(web._nursery))
        # each member: trio-websocket's reader, the handler that reads its messages, its writer
        assert counts[1] - counts[0] == 3 * 20, counts
        done.set()


async def test_connections_beyond_the_maximum_are_closed_with_1013() -> None:
    async with lobby_with_door(max_connections=2) as (c, web):
        async with ws_member(url(web), "a"), ws_member(url(web), "b"):
            closed = await refused(url(web), {"member_id": "c"})
            assert closed.code == 1013
        assert c.lobby[0].counters["ws_connections_refused"] == 1


async def test_hellos_that_are_refused_say_why() -> None:
    async with lobby_with_door() as (c, web), ws_member(url(web), "taken"):
        cases = [
            ({"member_id": "x", "v": 2}, 4000, "bad hello: protocol version 2"),
            ({"member_id": ""}, 4000, "bad hello"),
            ({"member_id": "taken"}, 4000, "member id in use"),
            ({"member_id": "x", "secret": "c2hvcnQ="}, 4000, "bad hello"),
            ({"member_id": "x", "resume": "AAAA", "secret": "eHh4eHh4eHh4eHh4eHh4eA=="}, 4004,
             "resume refused: MALFORMED"),
        ]  # fmt: skip
        for hello, code, why in cases:
            closed = await refused(url(web), hello)
            assert closed.code == code and closed.reason.startswith(why), (hello, closed)
        async with open_websocket_url(url(web)) as ws:
            with trio.fail_after(10), pytest.raises(ConnectionClosed) as caught:
                await ws.get_message()
            reason = caught.value.reason
            assert reason is not None and (reason.code, reason.reason) == (4003, "no hello")
        server = c.lobby[0]
        assert server.counters["hellos_refused"] == 4 and server.counters["resumes_refused"] == 1
        assert server.counters["hellos_timed_out"] == 1


async def test_identity_tokens_apply_to_websocket_members() -> None:
    async with cluster(1, identity=verifier(ED)) as c, door(c) as web:
        good = str(backend.issue_token(ED, "alice", issuer=ISSUER))
        async with ws_member(url(web), "alice", token=good) as alice:
            await alice.ok("create_lobby", name="v", max_members=2, private=False, metadata={})
        secret = "eHh4eHh4eHh4eHh4eHh4eA=="  # (a token travels with a secret, as over UDP)
        closed = await refused(url(web), {"member_id": "mallory", "token": good, "secret": secret})
        assert closed.code == 4000 and closed.reason.startswith("identity refused"), closed
        closed = await refused(url(web), {"member_id": "bob"})
        assert closed.code == 4000 and "missing" in closed.reason
        expired = str(backend.issue_token(ED, "bob", issuer=ISSUER, ttl=-60))
        closed = await refused(url(web), {"member_id": "bob", "token": expired, "secret": secret})
        assert "expired" in closed.reason
        assert c.lobby[0].auth_refusals["expired"] == 1
