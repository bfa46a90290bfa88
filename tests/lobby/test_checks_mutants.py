"""The lobby registry's checks at their bounds (echo.lobby.state.checks): each limit accepted
at its value and refused one past it, with the code and the reason a member reads; the
lookups that refuse; and the rate limit's retry time.

Pure: the registry through `tests.lobby.lab.Lab`, no sockets (in `./dev mutate lobby`'s
selection).
"""

from __future__ import annotations

from typing import Any

import pytest

from echo.lobby.limits import LobbyConfig, RateLimit
from echo.lobby.protocol import (
    I64_MAX,
    I64_MIN,
    CreateLobby,
    ErrorCode,
    FreeSlots,
    JoinLobby,
    KickMember,
    LeaveLobby,
    LobbyJoined,
    NumberRange,
    QuickJoin,
    RecreateLobby,
    SearchLobbies,
    SetAttributes,
    SetReady,
    StringEquals,
)
from tests.lobby.lab import CONFIG, FAST, Lab
from tests.lobby.test_recreate import RECREATE_CONFIG, home_a


def refused(lab: Lab, member: str, req: Any, code: ErrorCode, text: str) -> None:
    reply = lab.refused(member, req, code)
    assert reply.message == text


def lobby(lab: Lab, owner: str = "own") -> int:
    reply = lab.ok(owner, CreateLobby(lab.rid(), "room", 8, False, {}))
    assert isinstance(reply, LobbyJoined)
    return reply.lobby_id


# --- names and sizes ---------------------------------------------------------------------------


def test_a_lobby_name_is_1_to_64_bytes_without_control_characters() -> None:
    lab = Lab()
    text = "a lobby name is 1..64 bytes without control characters"
    for bad in ("", "x" * 65, "tab\there"):
        refused(lab, "a", CreateLobby(lab.rid(), bad, 4, False, {}), ErrorCode.NAME_INVALID, text)
    lab.ok("a", CreateLobby(lab.rid(), "é" * 32, 4, False, {}))  # 64 bytes
    lab.ok("b", CreateLobby(lab.rid(), "x", 4, False, {}))


def test_max_members_is_1_to_the_cap() -> None:
    lab = Lab()
    for bad in (0, 65):
        refused(
            lab,
            "a",
            CreateLobby(lab.rid(), "r", bad, False, {}),
            ErrorCode.BAD_REQUEST,
            "max members is 1..64",
        )
    lab.ok("a", CreateLobby(lab.rid(), "r", 64, False, {}))
    lab.ok("b", CreateLobby(lab.rid(), "r", 1, False, {}))


@pytest.mark.parametrize(
    ("metadata", "why"),
    [
        ({f"k{i}": i for i in range(21)}, "at most 20 keys"),
        ({"": 1}, "a key is 1..32 bytes"),
        ({"k" * 33: 1}, "a key is 1..32 bytes"),
        ({"k": True}, "a value is a string or an integer"),
        ({"k": 1.5}, "a value is a string or an integer"),
        ({"k": I64_MAX + 1}, "an integer value is a signed 64-bit integer"),
        ({"k": I64_MIN - 1}, "an integer value is a signed 64-bit integer"),
        ({"k": "v" * 1025}, "a value is at most 1024 bytes"),
        ({f"k{i}": "v" * 1022 for i in range(4)} | {"z": ""}, "at most 4096 bytes in all"),
        ({"mode": "m" * 129}, "indexed key 'mode' holds at most 128 bytes"),
    ],
)
def test_metadata_past_a_limit_is_refused_with_which(metadata: dict[str, Any], why: str) -> None:
    lab = Lab()
    req = CreateLobby(lab.rid(), "r", 4, False, metadata)
    refused(lab, "a", req, ErrorCode.METADATA_LIMIT, f"metadata: {why}")


def test_metadata_at_every_limit_is_accepted() -> None:
    lab = Lab()
    at_limits: list[dict[str, Any]] = [
        {f"k{i}": i for i in range(20)},
        {"k" * 32: 1, "n": I64_MAX, "m": I64_MIN},
        {"k": "v" * 1024},
        {f"k{i}": "v" * 1022 for i in range(4)},  # 4096 bytes in all
        {"mode": "m" * 128},
    ]
    for i, metadata in enumerate(at_limits):
        lab.ok(f"m{i}", CreateLobby(lab.rid(), "r", 4, False, metadata))


def test_attributes_past_a_limit_are_refused_and_at_it_accepted() -> None:
    lab = Lab()
    lobby_id = lobby(lab, "a")
    too_many = {f"k{i}": i for i in range(11)}
    refused(
        lab,
        "a",
        SetAttributes(lab.rid(), lobby_id, "a", too_many),
        ErrorCode.ATTRIBUTES_LIMIT,
        "attributes: at most 10 keys",
    )
    refused(
        lab,
        "a",
        SetAttributes(lab.rid(), lobby_id, "a", {"k": "v" * 1024}),
        ErrorCode.ATTRIBUTES_LIMIT,
        "attributes: at most 1024 bytes in all",
    )
    lab.ok("a", SetAttributes(lab.rid(), lobby_id, "a", {f"k{i}": i for i in range(10)}))


# --- filters -------------------------------------------------------------------------------------


def test_filters_past_their_limits_are_refused_with_why() -> None:
    lab = Lab()
    nine = tuple(FreeSlots(1) for _ in range(9))
    refused(
        lab,
        "a",
        SearchLobbies(lab.rid(), nine, None, 10),
        ErrorCode.FILTER_INVALID,
        "at most 8 filters",
    )
    refused(
        lab,
        "a",
        QuickJoin(lab.rid(), (StringEquals("colour", "red"),)),
        ErrorCode.FILTER_INVALID,
        "'colour' is not an indexed key",
    )
    refused(
        lab,
        "a",
        SearchLobbies(lab.rid(), (NumberRange("skill", 5, 4),), None, 10),
        ErrorCode.FILTER_INVALID,
        "a range's low end is above its high end",
    )
    eight = (*(FreeSlots(1) for _ in range(7)), NumberRange("skill", 4, 4))
    lab.ok("a", SearchLobbies(lab.rid(), eight, None, 10))


# --- lookups that refuse ---------------------------------------------------------------------


def test_the_lookups_refuse_with_their_reasons() -> None:
    lab = Lab()
    lobby_id = lobby(lab, "own")
    lab.ok("b", JoinLobby(lab.rid(), lobby_id))
    refused(lab, "b", LeaveLobby(lab.rid(), 999), ErrorCode.NO_SUCH_LOBBY, "no such lobby")
    refused(
        lab,
        "x",
        LeaveLobby(lab.rid(), lobby_id),
        ErrorCode.NOT_MEMBER,
        "not a member of this lobby",
    )
    refused(
        lab,
        "b",
        KickMember(lab.rid(), lobby_id, "own"),
        ErrorCode.NOT_OWNER,
        "only the lobby's owner may do this",
    )
    refused(
        lab,
        "b",
        CreateLobby(lab.rid(), "another", 4, False, {}),
        ErrorCode.ALREADY_IN_LOBBY,
        f"already in lobby {lobby_id}; leave it first",
    )


def test_a_seat_kept_for_a_member_not_back_is_not_that_member_yet() -> None:
    a, lobby_id = home_a()
    b = Lab(RECREATE_CONFIG)
    b.do("b", RecreateLobby(b.rid(), a.replicas["b"].snapshot()))
    refused(
        b,
        "c",
        SetReady(b.rid(), lobby_id, "c", False),
        ErrorCode.NOT_MEMBER,
        "this seat is kept for a member who has not come back",
    )


# --- rate limits -------------------------------------------------------------------------------


def test_a_rate_limited_request_says_its_kind_and_when_to_retry() -> None:
    config = LobbyConfig(
        indexed_keys=CONFIG.indexed_keys,
        create_limit=RateLimit(rate=4.0, burst=1),
        update_limit=FAST,
        join_limit=FAST,
        search_limit=FAST,
        chat_limit=FAST,
    )
    lab = Lab(config)
    lobby_id = lobby(lab, "a")
    lab.ok("a", LeaveLobby(lab.rid(), lobby_id))
    refused(
        lab,
        "a",
        CreateLobby(lab.rid(), "again", 4, False, {}),
        ErrorCode.RATE_LIMITED,
        "too many create requests; slow down (retry in 0.250 s)",
    )
    lab.now = 0.125
    refused(
        lab,
        "a",
        CreateLobby(lab.rid(), "again", 4, False, {}),
        ErrorCode.RATE_LIMITED,
        "too many create requests; slow down (retry in 0.125 s)",
    )
    lab.now = 0.25
    lab.ok("a", CreateLobby(lab.rid(), "again", 4, False, {}))
    # Each member has its own budget.
    lab.ok("b", CreateLobby(lab.rid(), "b's", 4, False, {}))
