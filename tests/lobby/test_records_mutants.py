"""The lobby registry's records and rules (echo.lobby.state.records): random ids and codes,
what a retried create is, what a change is, how sizes are counted, and a seat's tags.

Pure: no sockets (in `./dev mutate lobby`'s selection).
"""

from __future__ import annotations

import attrs

from echo.lobby.protocol import (
    CreateLobby,
    ErrorCode,
    LobbyJoined,
    RecreateLobby,
    SeatTag,
    SetAttributes,
    SetMetadata,
)
from echo.lobby.state.records import (
    CODE_ALPHABET,
    CODE_LENGTH,
    MAX_SEAT_TAGS,
    random_join_code,
    random_lobby_id,
)
from tests.lobby.lab import Lab
from tests.lobby.test_recreate import RECREATE_CONFIG, home_a


def test_random_lobby_ids_are_odd_63_bit_numbers_using_the_top_bit() -> None:
    ids = [random_lobby_id() for _ in range(200)]
    assert all(0 < i < 2**63 and i % 2 == 1 for i in ids)
    assert any(i >= 2**62 for i in ids)  # 63 bits, not fewer
    assert len(set(ids)) == len(ids)


def test_random_join_codes_are_eight_characters_of_the_alphabet() -> None:
    codes = [random_join_code() for _ in range(200)]
    assert all(len(c) == CODE_LENGTH == 8 for c in codes)
    assert set("".join(codes)) == set(CODE_ALPHABET)


def test_a_create_asked_again_is_answered_with_its_lobby_and_another_is_refused() -> None:
    lab = Lab()
    create = CreateLobby(lab.rid(), "room", 4, False, {"mode": "ffa", "skill": 1})
    first = lab.ok("a", create)
    assert isinstance(first, LobbyJoined)
    again = lab.ok("a", attrs.evolve(create, request_id=lab.rid()))
    assert again == LobbyJoined(again.request_id, first.lobby_id)
    assert lab.reg.counters["joins_repeated"] == 1 and len(lab.reg) == 1
    others = [
        attrs.evolve(create, name="other"),
        attrs.evolve(create, max_members=5),
        attrs.evolve(create, private=True),
        attrs.evolve(create, metadata={"mode": "ffa"}),
        attrs.evolve(create, metadata={"mode": "ffa", "skill": "1"}),  # a string, not 1
        attrs.evolve(create, metadata={"mode": "ffa", "level": 1}),
        attrs.evolve(create, metadata={"mode": "ffa", "skill": 2}),
    ]
    for other in others:
        lab.refused("a", attrs.evolve(other, request_id=lab.rid()), ErrorCode.ALREADY_IN_LOBBY)


def test_a_change_to_the_same_value_is_no_change_and_a_change_of_type_is_one() -> None:
    lab = Lab()
    reply = lab.ok("a", CreateLobby(lab.rid(), "room", 4, False, {"n": 1, "s": "x"}))
    assert isinstance(reply, LobbyJoined)
    lobby_id = reply.lobby_id
    version = lab.reg._lobbies[lobby_id].version
    handled = lab.do("a", SetMetadata(lab.rid(), lobby_id, {"n": 1, "s": "x", "gone": None}))
    assert handled.sends == () and lab.reg._lobbies[lobby_id].version == version
    handled = lab.do("a", SetMetadata(lab.rid(), lobby_id, {"n": "1", "s": None}))
    (sent,) = handled.sends
    assert sent.message.changes == {"n": "1", "s": None}  # type: ignore[union-attr]
    assert lab.reg._lobbies[lobby_id].metadata == {"n": "1"}


def test_an_integer_counts_eight_bytes_toward_a_maps_size() -> None:
    lab = Lab()
    reply = lab.ok("a", CreateLobby(lab.rid(), "room", 4, False, {}))
    assert isinstance(reply, LobbyJoined)
    lobby_id = reply.lobby_id
    exact = {"a" * 32: "v" * 983, "b": 5}  # 32 + 983 + 1 + 8 = 1024
    lab.ok("a", SetAttributes(lab.rid(), lobby_id, "a", exact))
    over = {"a" * 32: "v" * 984, "b": 5}
    refused = lab.refused(
        "a", SetAttributes(lab.rid(), lobby_id, "a", over), ErrorCode.ATTRIBUTES_LIMIT
    )
    assert refused.message == "attributes: at most 1024 bytes in all"


def test_a_lone_surrogate_or_a_delete_character_is_no_name() -> None:
    lab = Lab()
    for bad in ("\ud800room", "room\x7f"):
        lab.refused("a", CreateLobby(lab.rid(), bad, 4, False, {}), ErrorCode.NAME_INVALID)


def test_a_seat_keeps_at_most_four_tags_one_per_sender_and_value() -> None:
    a, lobby_id = home_a()
    copy = a.replicas["b"].snapshot()
    b = Lab(RECREATE_CONFIG)
    b.do("b", RecreateLobby(b.rid(), copy, seat_tags=(SeatTag("c", b"t-b"),)))
    seat = b.reg._lobbies[lobby_id].members["c"]
    senders = ["s1", "s2", "s3", "s4", "s5"]
    members = (*copy.members, *(attrs.evolve(copy.members[0], member_id=s) for s in senders))
    for i, sender in enumerate(senders):
        forged = attrs.evolve(copy, max_members=8, members=members, version=copy.version + 1 + i)
        tag = b"t-b" if sender == "s1" else f"t-{sender}".encode()  # s1 repeats b's tag
        handled = b.do(sender, RecreateLobby(b.rid(), forged, seat_tags=(SeatTag("c", tag),)))
        assert isinstance(handled.reply, LobbyJoined)
        seat = b.reg._lobbies[lobby_id].members["c"]
        assert len(seat.tags) <= MAX_SEAT_TAGS, i
    assert seat.tags == {"b": b"t-b", "s2": b"t-s2", "s3": b"t-s3", "s4": b"t-s4"}
