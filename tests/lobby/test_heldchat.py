"""Chat said while a seated member is away reaches it when it is back (echo.lobby.heldchat):
after a dropped session on the same server, and on a lobby re-created on the next server of the
ring before every member arrived there (the hand-off of a drain)."""

from __future__ import annotations

import pytest

from echo.lobby.heldchat import HeldChat
from echo.lobby.limits import LobbyConfig
from echo.lobby.protocol import (
    ChatLine,
    JoinLobby,
    LeaveLobby,
    LobbySnapshot,
    RecreateLobby,
    SendChat,
)
from tests.lobby.lab import FAST, Lab
from tests.lobby.test_recreate import RECREATE_CONFIG, home_a
from tests.lobby.test_state import lobby_with


def lines_to(sends: tuple, member: str) -> list[str]:
    return [s.message.text for s in sends if isinstance(s.message, ChatLine) and member in s.to]


def test_the_hold_keeps_the_most_recent_lines_within_its_bytes_per_member() -> None:
    hold = HeldChat(max_bytes=10)
    assert hold.keep(["b", "c"], ChatLine(1, "a", "12345")) == 0
    assert hold.keep(["b"], ChatLine(1, "a", "6789")) == 0
    assert hold.keep(["b"], ChatLine(1, "a", "ab")) == 1  # 11 bytes: the oldest goes
    assert hold.keep(["b"], ChatLine(1, "a", "x" * 11)) == 1  # never fits
    assert hold.waiting("b") == 2 and hold.waiting("c") == 1 and len(hold) == 2
    assert [line.text for line in hold.take("b", 1)] == ["6789", "ab"]
    assert hold.take("b", 1) == [] and hold.waiting("b") == 0  # taken once
    hold.keep(["c"], ChatLine(2, "a", "other"))
    assert [line.text for line in hold.take("c", 1)] == ["12345"]  # not another lobby's
    hold.keep(["d"], ChatLine(1, "a", "x"))
    hold.forget("d")
    assert len(hold) == 0
    with pytest.raises(ValueError):
        HeldChat(max_bytes=-1)
    with pytest.raises(ValueError):
        LobbyConfig(held_chat_bytes=-1)


def test_a_member_back_within_the_grace_period_gets_the_chat_it_missed() -> None:
    lab = Lab(LobbyConfig(reconnect_grace=10.0, chat_limit=FAST, join_limit=FAST))
    lobby_id = lobby_with(lab, "a", "b", "c")
    lab.disconnect("b")
    said = lab.do("a", SendChat(lab.rid(), lobby_id, "while b is away")).sends
    assert lines_to(said, "b") == [] and lines_to(said, "c") == ["while b is away"]
    lab.do("c", SendChat(lab.rid(), lobby_id, "and another"))
    back = lab.reconnect("b")
    # The state first, then the lines, in the order they were said, to b alone.
    kinds = [type(s.message) for s in back if "b" in s.to]
    assert kinds.index(LobbySnapshot) < kinds.index(ChatLine)
    assert lines_to(back, "b") == ["while b is away", "and another"]
    assert all(s.to == ("b",) for s in back if isinstance(s.message, ChatLine))
    lab.disconnect("b")
    assert lines_to(lab.reconnect("b"), "b") == []  # given once


def test_a_seat_that_goes_takes_its_lines_with_it() -> None:
    lab = Lab(LobbyConfig(reconnect_grace=10.0, chat_limit=FAST, join_limit=FAST))
    lobby_id = lobby_with(lab, "a", "b")
    lab.disconnect("b")
    lab.do("a", SendChat(lab.rid(), lobby_id, "nobody hears this"))
    assert lab.reg.held_chat.waiting("b") == 1
    lab.advance(11.0)  # b's grace period ends: its seat goes
    assert lab.reg.lobby_of("b") is None and len(lab.reg.held_chat) == 0
    # Back as a new member of the lobby: it does not get the lines of the seat it lost.
    joined = lab.do("b", JoinLobby(lab.rid(), lobby_id)).sends
    assert lines_to(joined, "b") == []
    lab.ok("b", LeaveLobby(lab.rid(), lobby_id))
    assert len(lab.reg.held_chat) == 0


def test_a_line_said_on_the_new_home_before_the_others_arrive_reaches_them() -> None:
    """The drain's hand-off: b re-creates the lobby first and speaks at once; a arrives with
    its copy (merged within the window), c by joining with its kept seat."""
    a_home, lobby_id = home_a()
    new_home = Lab(RECREATE_CONFIG)
    new_home.ok("b", RecreateLobby(new_home.rid(), a_home.replicas["b"].snapshot()))
    said = new_home.do("b", SendChat(new_home.rid(), lobby_id, "first on the new home")).sends
    assert lines_to(said, "a") == [] and lines_to(said, "c") == []
    merged = new_home.do("a", RecreateLobby(new_home.rid(), a_home.replicas["a"].snapshot()))
    assert lines_to(merged.sends, "a") == ["first on the new home"]
    assert lines_to(merged.sends, "b") == []  # b said it and had it already
    new_home.now = 5.0
    joined = new_home.do("c", JoinLobby(new_home.rid(), lobby_id)).sends
    assert lines_to(joined, "c") == ["first on the new home"]
    assert len(new_home.reg.held_chat) == 0
    new_home.check_replicas()
