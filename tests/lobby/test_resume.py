"""Resume tokens (the pure core): a brand-new process of a member takes its seat back.

The registry keeps the seat for the grace period; the token, signed with the lobby servers'
seat key, names the lobby, the member and the secret the seat is bound to. `check_resume`
decides with ``now`` passed in; the driver then does what it does for any seat taken back
(reconnected, bound to the new session's secret), mirrored here.
"""

from __future__ import annotations

import hashlib

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echo.lobby.due import DueQueue
from echo.lobby.hello import SeatBindings
from echo.lobby.protocol import (
    CreateLobby,
    JoinLobby,
    LobbyJoined,
    Presence,
    ResumeToken,
    SetAttributes,
    SetReady,
    encode,
    parse_message_untrusted,
)
from echo.lobby.resume import (
    RESUME_VERSION,
    ResumeClaims,
    ResumeReason,
    ResumeRefusal,
    ResumeTokenError,
    check_resume,
    decode_resume_token_untrusted,
    issue_resume_token,
    parse_refusal_reason,
    token_ttl,
    verify_resume_token,
)
from echo.tickets import TicketKey, TicketSeats, verify
from tests.lobby.lab import CONFIG, Lab

WALL = 1_800_000_000.0  # UNIX seconds (tokens), apart from the registry's monotonic clock
KEY = TicketKey(1, b"k" * 32)
KEYS = {KEY.key_id: KEY.secret}
SEATS = TicketSeats(KEY, ttl=3600.0, clock=lambda: WALL)
GRACE = 10.0
GRACEFUL = attrs.evolve(CONFIG, reconnect_grace=GRACE, recreate_window=10.0)
SECRET = {m: hashlib.sha256(m.encode()).digest()[:16] for m in ("a", "b", "b2", "b3", "x")}


def token_of(lab: Lab, member: str, secret: bytes, at: float = WALL) -> bytes:
    """What the driver sends a seated member (`LobbyServer._send_resume_token`)."""
    lobby_id = lab.reg.lobby_of(member)
    assert lobby_id is not None
    return issue_resume_token(KEY, lobby_id, member, secret, at + token_ttl(GRACE))


def seated() -> tuple[Lab, int]:
    """a's lobby on one server; b joined, readied and set its team, each with its secret."""
    lab = Lab(GRACEFUL, seats=SEATS)
    reply = lab.ok("a", CreateLobby(lab.rid(), "room", 4, False, {}), SECRET["a"])
    assert isinstance(reply, LobbyJoined)
    lobby_id = reply.lobby_id
    lab.ok("b", JoinLobby(lab.rid(), lobby_id), SECRET["b"])
    lab.ok("b", SetReady(lab.rid(), lobby_id, "b", True), SECRET["b"])
    lab.ok("b", SetAttributes(lab.rid(), lobby_id, "b", {"team": "red"}), SECRET["b"])
    return lab, lobby_id


def take_back(lab: Lab, member: str, new_secret: bytes, *, half_open: bool = False) -> None:
    """The driver after a resume is let in: the seat comes back (unless the old session still
    looked alive: it is replaced) and is bound to the new process's secret."""
    if not half_open:
        lab.reconnect(member)
    lab.deliver(lab.reg.bind_secret(member, new_secret))


def seat_of(lab: Lab, lobby_id: int, member: str) -> tuple[Presence, bool, dict[str, object]]:
    snapshot = lab.reg.snapshot(lobby_id)
    assert snapshot is not None
    m = next(m for m in snapshot.members if m.member_id == member)
    return m.presence, m.ready, dict(m.attributes)


def refused(decision: int | ResumeRefusal, reason: ResumeReason) -> None:
    assert isinstance(decision, ResumeRefusal), decision
    assert decision.reason is reason, decision
    assert decision.detail
    assert parse_refusal_reason("rejected: " + decision.close_reason()) is reason


def test_the_token_is_versioned_signed_and_names_lobby_member_and_secret() -> None:
    token = issue_resume_token(KEY, 7, "bob", SECRET["b"], WALL + 20)
    assert token[0] == RESUME_VERSION and token[1] == KEY.key_id
    claims = verify_resume_token(token, KEYS, WALL)
    assert claims == ResumeClaims(7, "bob", SECRET["b"], WALL + 20, 1)
    assert decode_resume_token_untrusted(token) == claims
    assert repr(SECRET["b"]) not in repr(claims)  # never logged
    # The message that carries it survives the wire.
    message = ResumeToken(7, token)
    assert parse_message_untrusted(encode(message)) == message
    # A domain of its own: never a seat or a game ticket under the same key, nor they a token.
    assert not SEATS.check(token, 7, "bob")
    assert not isinstance(verify(token, KEY, "\x00lobby-seat", WALL), type(claims))
    seat = SEATS.issue(7, "bob")
    refused(verify_resume_token(seat, KEYS, WALL), ResumeReason.MALFORMED)


def test_forged_unknown_key_expired_and_malformed_tokens_are_refused() -> None:
    token = issue_resume_token(KEY, 7, "bob", SECRET["b"], WALL + 20)
    flipped = token[:-1] + bytes([token[-1] ^ 1])
    refused(verify_resume_token(flipped, KEYS, WALL), ResumeReason.FORGED)
    # Another secret (a forger's own key under our key id), a changed claim.
    forged = issue_resume_token(TicketKey(1, b"f" * 32), 7, "bob", SECRET["b"], WALL + 20)
    refused(verify_resume_token(forged, KEYS, WALL), ResumeReason.FORGED)
    longer = token[:10] + (int.from_bytes(token[10:18], "big") + 10**6).to_bytes(8, "big")
    refused(verify_resume_token(longer + token[18:], KEYS, WALL), ResumeReason.FORGED)
    other = issue_resume_token(TicketKey(9, b"k" * 32), 7, "bob", SECRET["b"], WALL + 20)
    refused(verify_resume_token(other, KEYS, WALL), ResumeReason.UNKNOWN_KEY)
    refused(verify_resume_token(token, KEYS, WALL + 20), ResumeReason.EXPIRED)
    for bad in (b"", b"R", token[:-40], token + b"x" * 600, b"\x01" + token[1:]):
        refused(verify_resume_token(bad, KEYS, WALL), ResumeReason.MALFORMED)
    # A retired key still verifies (a rotation), as seats do.
    assert isinstance(verify_resume_token(other, {**KEYS, 9: b"k" * 32}, WALL), ResumeClaims)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_decoding_garbage_raises_only_the_codec_error(data: bytes) -> None:
    try:
        decode_resume_token_untrusted(data)
    except ResumeTokenError:
        pass
    assert isinstance(verify_resume_token(data, KEYS, WALL), ResumeRefusal)


def test_values_that_do_not_fit_a_token_are_refused_when_issuing() -> None:
    for args in (
        (2**64, "bob", SECRET["b"], WALL),
        (7, "", SECRET["b"], WALL),
        (7, "m" * 256, SECRET["b"], WALL),
        (7, "bob", b"short", WALL),
        (7, "bob", SECRET["b"], float("inf")),
    ):
        with pytest.raises(ResumeTokenError):
            issue_resume_token(KEY, *args)  # type: ignore[arg-type]


def test_a_crashed_member_resumes_within_grace_with_its_ready_state_and_attributes() -> None:
    lab, lobby_id = seated()
    token = token_of(lab, "b", SECRET["b"])
    lab.disconnect("b")  # kill -9: its session goes silent
    lab.advance(GRACE - 0.5)
    assert seat_of(lab, lobby_id, "b")[0] is Presence.RECONNECTING
    decision = check_resume(lab.reg, "b", token, KEYS, WALL + GRACE - 0.5)
    assert decision == lobby_id
    take_back(lab, "b", SECRET["b2"])
    assert seat_of(lab, lobby_id, "b") == (Presence.CONNECTED, True, {"team": "red"})
    lab.check_replicas()  # a saw b come back
    # The seat is the new process's now: its secret holds it, the old one holds nothing.
    assert lab.reg.holds_secret("b", SECRET["b2"])
    assert not lab.reg.holds_secret("b", SECRET["b"])


def test_after_the_grace_period_the_seat_is_gone_and_the_token_with_it() -> None:
    lab, _ = seated()
    token = token_of(lab, "b", SECRET["b"])
    lab.disconnect("b")
    lab.advance(GRACE + 0.01)
    assert lab.reg.lobby_of("b") is None
    # The token itself still verifies (it lives two grace periods): the seat is what is gone.
    refused(check_resume(lab.reg, "b", token, KEYS, WALL + GRACE), ResumeReason.NOT_SEATED)
    refused(check_resume(lab.reg, "b", token, KEYS, WALL + 2 * GRACE), ResumeReason.EXPIRED)


def test_a_replayed_token_and_a_second_resume_of_the_same_seat_are_refused() -> None:
    lab, lobby_id = seated()
    token = token_of(lab, "b", SECRET["b"])
    lab.disconnect("b")
    assert check_resume(lab.reg, "b", token, KEYS, WALL + 1) == lobby_id
    take_back(lab, "b", SECRET["b2"])
    # The same token again (a replay, or a second process started from the same state file).
    refused(check_resume(lab.reg, "b", token, KEYS, WALL + 2), ResumeReason.REPLAYED)
    # The new process's own token works (after it crashes in turn).
    newer = token_of(lab, "b", SECRET["b2"], WALL + 2)
    lab.disconnect("b")
    assert check_resume(lab.reg, "b", newer, KEYS, WALL + 3) == lobby_id
    take_back(lab, "b", SECRET["b3"])
    refused(check_resume(lab.reg, "b", newer, KEYS, WALL + 4), ResumeReason.REPLAYED)


def test_the_token_is_only_its_members_and_only_for_its_lobby() -> None:
    lab, _ = seated()
    token = token_of(lab, "b", SECRET["b"])
    refused(check_resume(lab.reg, "a", token, KEYS, WALL), ResumeReason.WRONG_MEMBER)
    # A token for another lobby than the member's seat takes nothing.
    other = lab.ok("x", CreateLobby(lab.rid(), "other", 4, False, {}), SECRET["x"])
    assert isinstance(other, LobbyJoined)
    stale = issue_resume_token(KEY, other.lobby_id, "b", SECRET["b"], WALL + 20)
    refused(check_resume(lab.reg, "b", stale, KEYS, WALL), ResumeReason.NOT_SEATED)


def test_a_half_open_session_is_superseded_not_the_new_one_refused() -> None:
    lab, lobby_id = seated()
    token = token_of(lab, "b", SECRET["b"])
    # The old process died, but the server has not noticed: b is still CONNECTED.
    assert seat_of(lab, lobby_id, "b")[0] is Presence.CONNECTED
    assert check_resume(lab.reg, "b", token, KEYS, WALL + 0.1) == lobby_id
    take_back(lab, "b", SECRET["b2"], half_open=True)
    assert seat_of(lab, lobby_id, "b") == (Presence.CONNECTED, True, {"team": "red"})
    refused(check_resume(lab.reg, "b", token, KEYS, WALL + 0.2), ResumeReason.REPLAYED)


def test_without_seat_tags_the_servers_bindings_hold_the_secret() -> None:
    # A registry without seat keys keeps no tags: the driver's bindings decide.
    lab = Lab(GRACEFUL)
    reply = lab.ok("b", CreateLobby(lab.rid(), "room", 4, False, {}), SECRET["b"])
    assert isinstance(reply, LobbyJoined)
    token = issue_resume_token(KEY, reply.lobby_id, "b", SECRET["b"], WALL + 20)
    bindings = SeatBindings()
    refused(check_resume(lab.reg, "b", token, KEYS, WALL), ResumeReason.REPLAYED)
    bindings.bind("b", reply.lobby_id, SECRET["b"])
    assert check_resume(lab.reg, "b", token, KEYS, WALL, bindings=bindings) == reply.lobby_id
    bindings.bind("b", reply.lobby_id, SECRET["b2"])
    refused(check_resume(lab.reg, "b", token, KEYS, WALL, bindings=bindings), ResumeReason.REPLAYED)


def test_a_token_from_the_dead_home_resumes_on_the_server_that_recreated_the_lobby() -> None:
    home, lobby_id = seated()
    token = token_of(home, "b", SECRET["b"])  # b's process dies with this token
    # The home dies too; a's copy re-creates the lobby on server B (same seat key).
    other = Lab(GRACEFUL, seats=SEATS)
    refused(check_resume(other.reg, "b", token, KEYS, WALL + 1), ResumeReason.NOT_SEATED)
    other.ok("a", home.replicas["a"].recreate_request(other.rid()), SECRET["a"])
    assert seat_of(other, lobby_id, "b") == (Presence.RECONNECTING, True, {"team": "red"})
    assert check_resume(other.reg, "b", token, KEYS, WALL + 2) == lobby_id
    take_back(other, "b", SECRET["b2"])
    assert seat_of(other, lobby_id, "b") == (Presence.CONNECTED, True, {"team": "red"})
    refused(check_resume(other.reg, "b", token, KEYS, WALL + 3), ResumeReason.REPLAYED)


def test_refusal_reasons_read_back_from_close_reasons() -> None:
    assert parse_refusal_reason("rejected by the server: no hello") is None
    assert parse_refusal_reason("resume refused: NOPE: x") is None
    for reason in ResumeReason:
        text = ResumeRefusal(reason, "why").close_reason()
        assert parse_refusal_reason(text) is reason


def test_renewals_fall_due_one_member_at_a_time_and_a_new_token_replaces_the_old_due() -> None:
    schedule: DueQueue[str] = DueQueue()
    assert schedule.next_due() is None and schedule.pop_due(100.0) == []
    schedule.add("ann", 10.0)
    schedule.add("bob", 12.0)
    schedule.add("cy", 15.0)
    assert len(schedule) == 3 and schedule.next_due() == 10.0
    assert schedule.pop_due(9.99) == []
    assert schedule.pop_due(12.0) == ["ann", "bob"]  # each when its own is due, not all
    assert len(schedule) == 1 and schedule.next_due() == 15.0
    schedule.add("cy", 20.0)  # seated again (a new token): its renewal moves with it
    assert schedule.next_due() == 20.0 and schedule.pop_due(15.0) == []
    schedule.add("ann", 21.0)  # renewed: back on the schedule
    schedule.discard("cy")  # left its seat
    assert len(schedule) == 1 and schedule.next_due() == 21.0
    assert schedule.pop_due(30.0) == ["ann"] and schedule.next_due() is None
