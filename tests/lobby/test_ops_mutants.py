"""The operations on one lobby at their edges (echo.lobby.state.ops): the reasons of their
refusals as a member reads them, the chat line's size bounds, and the counters the metrics
scrape, which are totals (two of a thing count two).

Pure: the registry through `tests.lobby.lab.Lab`, no sockets (in `./dev mutate lobby`'s
selection).
"""

from __future__ import annotations

from typing import Any

import attrs

from echo.lobby.limits import RateLimit
from echo.lobby.protocol import (
    BanMember,
    CreateLobby,
    ErrorCode,
    JoinByCode,
    JoinLobby,
    KickMember,
    LeaveLobby,
    LobbyJoined,
    QuickJoin,
    RecreateLobby,
    SendChat,
    SetLocked,
    SetMetadata,
    SetReady,
)
from tests.lobby.lab import CONFIG, Lab
from tests.lobby.test_recreate import RECREATE_CONFIG, state


def refused(lab: Lab, member: str, req: Any, code: ErrorCode, text: str) -> None:
    reply = lab.refused(member, req, code)
    assert reply.message == text


def lobby(lab: Lab, owner: str, *others: str) -> int:
    reply = lab.ok(owner, CreateLobby(lab.rid(), "room", 8, False, {}))
    assert isinstance(reply, LobbyJoined)
    for m in others:
        lab.ok(m, JoinLobby(lab.rid(), reply.lobby_id))
    return reply.lobby_id


def test_the_owners_operations_refuse_with_their_reasons() -> None:
    lab = Lab()
    lobby_id = lobby(lab, "own", "b")
    refused(
        lab,
        "own",
        BanMember(lab.rid(), lobby_id, "own"),
        ErrorCode.BAD_REQUEST,
        "the owner cannot ban itself",
    )
    refused(
        lab,
        "own",
        KickMember(lab.rid(), lobby_id, "own"),
        ErrorCode.BAD_REQUEST,
        "the owner leaves instead of kicking itself",
    )
    refused(
        lab,
        "own",
        KickMember(lab.rid(), lobby_id, "ghost"),
        ErrorCode.NO_SUCH_MEMBER,
        "no such member in this lobby",
    )
    refused(
        lab,
        "b",
        SetReady(lab.rid(), lobby_id, "own", True),
        ErrorCode.OTHER_MEMBER,
        "a ready state is set only by its member",
    )
    lab.ok("own", SetLocked(lab.rid(), lobby_id, True))
    refused(
        lab,
        "c",
        JoinLobby(lab.rid(), lobby_id),
        ErrorCode.LOBBY_LOCKED,
        "the owner locked this lobby",
    )


def test_a_full_server_creates_no_lobby() -> None:
    lab = Lab(attrs.evolve(CONFIG, max_lobbies=1))
    lobby(lab, "a")
    refused(
        lab,
        "b",
        CreateLobby(lab.rid(), "r", 4, False, {}),
        ErrorCode.SERVER_FULL,
        "this server holds its maximum number of lobbies",
    )


def test_a_chat_line_is_1_to_max_bytes_without_control_characters() -> None:
    lab = Lab()
    lobby_id = lobby(lab, "a")
    size = "a chat line holds 1..256 bytes"
    for bad in ("", "x" * 257):
        refused(lab, "a", SendChat(lab.rid(), lobby_id, bad), ErrorCode.CHAT_LIMIT, size)
    refused(
        lab,
        "a",
        SendChat(lab.rid(), lobby_id, "two\nlines"),
        ErrorCode.CHAT_LIMIT,
        "a chat line holds no control characters",
    )
    lab.ok("a", SendChat(lab.rid(), lobby_id, "x"))
    lab.ok("a", SendChat(lab.rid(), lobby_id, "é" * 128))  # 256 bytes
    assert lab.reg.counters["chat_lines"] == 2


def test_chat_held_for_away_members_is_counted_in_total() -> None:
    lab = Lab(attrs.evolve(CONFIG, held_chat_bytes=4))
    lobby_id = lobby(lab, "a", "b", "c")
    lab.disconnect("b")
    lab.disconnect("c")
    lab.ok("a", SendChat(lab.rid(), lobby_id, "abc"))
    lab.ok("a", SendChat(lab.rid(), lobby_id, "def"))  # pushes "abc" out for both
    assert lab.reg.counters["chat_held"] == 4
    assert lab.reg.counters["chat_held_dropped"] == 2
    assert lab.reg.counters["chat_deliveries"] == 2


def test_each_operation_is_counted_in_total() -> None:
    lab = Lab()
    lobby_id = lobby(lab, "own", "b", "c", "d", "e", "f")
    for m in ("b", "c"):
        lab.ok("own", KickMember(lab.rid(), lobby_id, m))
    for m in ("d", "x"):
        lab.ok("own", BanMember(lab.rid(), lobby_id, m))
    for m in ("e", "f"):
        lab.ok(m, LeaveLobby(lab.rid(), lobby_id))
    counters = lab.reg.counters
    assert (counters["kicks"], counters["bans"], counters["leaves"]) == (2, 2, 2)
    assert counters["joins"] == 5
    for m in ("q1", "q2"):
        lab.ok(m, QuickJoin(lab.rid(), ()))
    assert counters["quick_joins"] == 2 and counters["joins"] == 7


def test_metadata_changes_spend_the_update_budget() -> None:
    config = attrs.evolve(CONFIG, update_limit=RateLimit(rate=0.001, burst=1))
    lab = Lab(config)
    lobby_id = lobby(lab, "a")
    lab.ok("a", SetMetadata(lab.rid(), lobby_id, {"mode": "ffa"}))
    reply = lab.refused("a", SetLocked(lab.rid(), lobby_id, True), ErrorCode.RATE_LIMITED)
    assert reply.message.startswith("too many update requests")


def test_a_member_joins_a_recreated_private_lobby_by_its_code() -> None:
    a = Lab(RECREATE_CONFIG)
    reply = a.ok("a", CreateLobby(a.rid(), "secret", 4, True, {}))
    assert isinstance(reply, LobbyJoined)
    lobby_id = reply.lobby_id
    a.ok("b", JoinByCode(a.rid(), state(a, lobby_id).join_code))
    b = Lab(RECREATE_CONFIG, first_id=500)
    b.do("b", RecreateLobby(b.rid(), a.replicas["b"].snapshot()))
    b.now = 1.0
    code = state(b, lobby_id).join_code
    joined = b.ok("d", JoinByCode(b.rid(), code))
    assert isinstance(joined, LobbyJoined) and joined.lobby_id == lobby_id
    assert state(b, lobby_id).owner == "b"
