"""Random sequences of lobby operations by random members keep every invariant (hypothesis).

After every step: a lobby has 1..max members; exactly one owner, who is a member, and who is
connected whenever any member is; no banned member is in; an empty lobby is gone; the member
index agrees with the lobbies; every connected member's replica, fed only the sends addressed
to it, equals the server's state; and search, paged to the end, returns exactly the lobbies a
brute-force scan says match.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from echo.lobby.games import GameServerAnnouncement, GameServerDirectory
from echo.lobby.limits import LobbyConfig, RateLimit
from echo.lobby.protocol import (
    BanMember,
    CreateLobby,
    ErrorCode,
    Filter,
    FreeSlots,
    JoinByCode,
    JoinLobby,
    KickMember,
    LeaveLobby,
    LobbySnapshot,
    NumberRange,
    Presence,
    QuickJoin,
    Refusal,
    SearchLobbies,
    SearchResults,
    SendChat,
    SetAttributes,
    SetLocked,
    SetMetadata,
    SetReady,
    StartGame,
    StringEquals,
    TransferOwner,
)
from echo.tickets import TicketIssuer, TicketKey
from tests.lobby.lab import CONFIG, Lab

MEMBERS = [f"m{i}" for i in range(7)]
member = st.sampled_from(MEMBERS)
modes = st.sampled_from(["ffa", "ctf"])
skill = st.integers(0, 5)
filters = st.lists(
    st.one_of(
        st.builds(StringEquals, st.just("mode"), modes),
        st.tuples(st.integers(0, 4), st.integers(0, 3)).map(
            lambda lw: NumberRange("skill", lw[0], lw[0] + lw[1])
        ),
        st.builds(FreeSlots, st.integers(0, 3)),
    ),
    max_size=3,
).map(tuple)

# An operation: (kind, member, arguments); lobby targets are picked among live lobbies by index.
join = st.tuples(st.just("join"), member, st.integers(0, 5))
op = st.one_of(
    st.tuples(st.just("create"), member, st.integers(1, 4), st.booleans(), modes, skill),
    join,
    join,
    join,
    st.tuples(st.just("join_code"), member, st.integers(0, 5)),
    st.tuples(st.just("quick"), member, filters),
    st.tuples(st.just("leave"), member),
    st.tuples(st.just("meta"), member, modes, st.one_of(st.none(), skill)),
    st.tuples(st.just("lock"), member, st.booleans()),
    st.tuples(st.just("kick"), member, member),
    st.tuples(st.just("ban"), member, member),
    st.tuples(st.just("transfer"), member, member),
    st.tuples(st.just("attrs"), member, member, st.integers(0, 9)),
    st.tuples(st.just("ready"), member, st.booleans()),
    st.tuples(st.just("chat"), member),
    st.tuples(st.just("start"), member),
    st.tuples(st.just("drop"), member),
    st.tuples(st.just("back"), member),
    st.tuples(st.just("back"), member),
    st.tuples(st.just("kick"), member, member),
    st.tuples(st.just("wait"), st.floats(0.5, 15.0)),
    st.tuples(st.just("search"), filters, st.integers(1, 3)),
)


def populated() -> Lab:
    """Three lobbies and some members to start from, so random steps have targets."""
    games = GameServerDirectory(ttl=1e9)
    games.announce(GameServerAnnouncement("game", "127.0.0.1:1", 1000), 0.0)
    issuer = TicketIssuer(TicketKey(1, b"t" * 32), ttl=60.0, clock=lambda: 1e9)
    lab = Lab(PROPERTY_CONFIG, games=games, tickets=issuer)
    for owner, size, private, mode in (
        ("m0", 4, False, "ffa"),
        ("m1", 3, True, "ctf"),
        ("m2", 2, False, "ffa"),
    ):
        lab.ok(owner, CreateLobby(lab.rid(), owner, size, private, {"mode": mode, "skill": size}))
    first = lab.reg.lobby_ids()[0]
    for m in ("m3", "m4"):
        lab.do(m, JoinLobby(lab.rid(), first))
    return lab


def check_invariants(lab: Lab) -> None:
    reg = lab.reg
    seen: dict[str, int] = {}
    for lobby_id in reg.lobby_ids():
        s = reg.snapshot(lobby_id)
        assert s is not None
        ids = [m.member_id for m in s.members]
        assert 1 <= len(ids) <= s.max_members, "empty lobbies are deleted; size is respected"
        assert len(set(ids)) == len(ids)
        assert s.owner in ids
        if any(m.presence is Presence.CONNECTED for m in s.members):
            owner = next(m for m in s.members if m.member_id == s.owner)
            assert owner.presence is Presence.CONNECTED
        assert not set(ids) & set(s.bans)
        assert [m.join_seq for m in s.members] == sorted(m.join_seq for m in s.members)
        for m in ids:
            assert m not in seen, "a member is in one lobby"
            seen[m] = lobby_id
    for m in MEMBERS:
        assert reg.lobby_of(m) == seen.get(m)
    # the index holds exactly the listed lobbies, each listing current
    assert list(reg._index.ids()) == brute_force(lab, ())
    assert list(reg._index.listings()) == [reg.listing(i) for i in brute_force(lab, ())]
    lab.check_replicas()
    assert not lab.gaps


def brute_force(lab: Lab, fs: tuple[Filter, ...]) -> list[int]:
    out = []
    for lobby_id in lab.reg.lobby_ids():
        s = lab.reg.snapshot(lobby_id)
        assert s is not None
        if s.private or s.locked:
            continue
        if not any(m.presence is Presence.CONNECTED for m in s.members):
            continue  # a ghost: nobody connected
        ok = True
        for f in fs:
            v = s.metadata.get(getattr(f, "key", ""))
            if isinstance(f, StringEquals):
                ok &= v == f.value
            elif isinstance(f, NumberRange):
                ok &= isinstance(v, int) and f.low <= v <= f.high
            elif isinstance(f, FreeSlots):
                ok &= s.max_members - len(s.members) >= f.minimum
        if ok:
            out.append(lobby_id)
    return out


def run(lab: Lab, step: tuple[Any, ...]) -> None:
    kind = step[0]
    lobbies = lab.reg.lobby_ids()

    def target(i: int) -> int:
        return lobbies[i % len(lobbies)] if lobbies else 424242

    def own(m: str) -> int:
        where = lab.reg.lobby_of(m)
        return where if where is not None else target(0)

    rid = lab.rid()
    if kind == "create":
        _, m, size, private, mode, sk = step
        lab.do(m, CreateLobby(rid, f"{m} room", size, private, {"mode": mode, "skill": sk}))
    elif kind == "join":
        lab.do(step[1], JoinLobby(rid, target(step[2])))
    elif kind == "join_code":
        s = lab.reg.snapshot(target(step[2]))
        lab.do(step[1], JoinByCode(rid, s.join_code if s and s.join_code else "NONE"))
    elif kind == "quick":
        lab.do(step[1], QuickJoin(rid, step[2]))
    elif kind == "leave":
        lab.do(step[1], LeaveLobby(rid, own(step[1])))
    elif kind == "meta":
        _, m, mode, sk = step
        lab.do(m, SetMetadata(rid, own(m), {"mode": mode, "skill": sk}))
    elif kind == "lock":
        lab.do(step[1], SetLocked(rid, own(step[1]), step[2]))
    elif kind == "kick":
        lab.do(step[1], KickMember(rid, own(step[1]), step[2]))
    elif kind == "ban":
        lab.do(step[1], BanMember(rid, own(step[1]), step[2]))
    elif kind == "transfer":
        lab.do(step[1], TransferOwner(rid, own(step[1]), step[2]))
    elif kind == "attrs":
        _, m, whose, v = step
        handled = lab.do(m, SetAttributes(rid, own(m), whose, {"v": v}))
        if m != whose and lab.reg.lobby_of(m) is not None:
            assert isinstance(handled.reply, Refusal)
            assert handled.reply.code in (ErrorCode.OTHER_MEMBER, ErrorCode.NOT_MEMBER)
    elif kind == "ready":
        lab.do(step[1], SetReady(rid, own(step[1]), step[1], step[2]))
    elif kind == "start":
        lab.do(step[1], StartGame(rid, own(step[1])))
    elif kind == "chat":
        lab.do(step[1], SendChat(rid, own(step[1]), "hi"))
    elif kind == "drop":
        lab.disconnect(step[1])
    elif kind == "back":
        lab.reconnect(step[1])
    elif kind == "wait":
        lab.advance(step[1])
    elif kind == "search":
        _, fs, limit = step
        got: list[int] = []
        cursor = None
        while True:
            reply = lab.do("searcher", SearchLobbies(lab.rid(), fs, cursor, limit)).reply
            assert isinstance(reply, SearchResults)
            assert len(reply.listings) <= limit
            got += [x.lobby_id for x in reply.listings]
            cursor = reply.next_cursor
            if cursor is None:
                break
        assert got == brute_force(lab, fs)


FAST = RateLimit(rate=1000.0, burst=1000)
PROPERTY_CONFIG = LobbyConfig(
    indexed_keys=CONFIG.indexed_keys,
    max_members_cap=4,
    reconnect_grace=10.0,
    create_limit=FAST,
    update_limit=FAST,
    search_limit=FAST,
    chat_limit=FAST,
    join_limit=FAST,
)


@settings(max_examples=200, deadline=None)
@given(st.lists(op, min_size=5, max_size=80))
def test_random_operations_keep_the_invariants(steps: list[tuple[Any, ...]]) -> None:
    lab = populated()
    check_invariants(lab)
    for step in steps:
        run(lab, step)
        check_invariants(lab)


@settings(max_examples=100, deadline=None)
@given(st.lists(op, max_size=40))
def test_a_late_snapshot_does_not_roll_a_replica_back(steps: list[tuple[Any, ...]]) -> None:
    """Replicas ignore an older snapshot (a reordered resend) and keep the newest state."""
    lab = populated()
    first: dict[int, LobbySnapshot] = {}
    for step in steps:
        run(lab, step)
        for lobby_id in lab.reg.lobby_ids():
            s = lab.reg.snapshot(lobby_id)
            assert s is not None
            first.setdefault(lobby_id, s)
    for lobby_id, old in first.items():
        now = lab.reg.snapshot(lobby_id)
        if now is None:
            continue
        for m in now.members:
            replica = lab.replicas.get(m.member_id)
            if m.presence is Presence.CONNECTED and replica is not None:
                before = replica.snapshot()
                replica.apply(old)
                assert replica.snapshot() == before
