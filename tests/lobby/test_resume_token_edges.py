"""Resume tokens at their edges: each bound on both sides, each refusal by its reason and its
exact words (the close reason a member's client shows), and the MAC against the documented
layout computed here independently. These kill mutants of echo.lobby.resume that the behaviour
tests in test_resume.py let through (./dev mutate lobby; docs/mutation.md)."""

from __future__ import annotations

import hashlib
import hmac
import struct

import pytest

from echo.lobby.resume import (
    MAX_SECRET_BYTES,
    MAX_TOKEN_BYTES,
    MIN_SECRET_BYTES,
    MIN_TOKEN_BYTES,
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
from echo.tickets import TicketKey

KEY = TicketKey(9, bytes(range(100, 132)))
KEYS = {KEY.key_id: KEY.secret}
NOW = 1_700_000_000.0
SECRET = b"s" * MIN_SECRET_BYTES


def _body(member: bytes, secret: bytes, *, version: int = RESUME_VERSION, millis: int = 0) -> bytes:
    head = struct.pack(">BBQQ", version, KEY.key_id, 3, millis)
    return head + bytes((len(member),)) + member + bytes((len(secret),)) + secret


def _signed(body: bytes) -> bytes:
    mac = hmac.new(KEY.secret, b"echo-lobby resume token 1\x00" + body, hashlib.sha256)
    return body + mac.digest()


def test_a_token_is_the_documented_body_and_mac() -> None:
    token = issue_resume_token(KEY, 3, "m", SECRET, 0.0)
    assert token == _signed(_body(b"m", SECRET))


def test_a_token_lives_two_grace_periods() -> None:
    assert token_ttl(7.5) == 15.0


@pytest.mark.parametrize("lobby_id", [0, 2**64 - 1])
def test_every_u64_is_a_lobby_id(lobby_id: int) -> None:
    token = issue_resume_token(KEY, lobby_id, "m", SECRET, NOW + 1)
    claims = verify_resume_token(token, KEYS, NOW)
    assert isinstance(claims, ResumeClaims) and claims.lobby_id == lobby_id


@pytest.mark.parametrize("lobby_id", [-1, 2**64])
def test_a_lobby_id_outside_a_u64_is_refused(lobby_id: int) -> None:
    with pytest.raises(ResumeTokenError, match=r"^a lobby id is a u64$"):
        issue_resume_token(KEY, lobby_id, "m", SECRET, NOW)


@pytest.mark.parametrize("expiry", [float("inf"), float("nan"), -0.001, 2**64 / 1000])
def test_an_expiry_that_does_not_fit_is_refused(expiry: float) -> None:
    with pytest.raises(ResumeTokenError, match=r"^the expiry does not fit a u64 of milliseconds$"):
        issue_resume_token(KEY, 1, "m", SECRET, expiry)


def test_the_first_and_last_expiry_fit() -> None:
    for millis in (0, 2**53):
        claims = decode_resume_token_untrusted(
            issue_resume_token(KEY, 1, "m", SECRET, millis / 1000)
        )
        assert claims.expires_at == millis / 1000


@pytest.mark.parametrize("size", [MIN_SECRET_BYTES, MAX_SECRET_BYTES])
def test_secrets_of_16_to_64_bytes_fit(size: int) -> None:
    claims = decode_resume_token_untrusted(issue_resume_token(KEY, 1, "m", b"x" * size, NOW))
    assert claims.secret == b"x" * size


@pytest.mark.parametrize("size", [MIN_SECRET_BYTES - 1, MAX_SECRET_BYTES + 1])
def test_secrets_of_other_sizes_are_refused_both_ways(size: int) -> None:
    why = rf"^a seat secret is {MIN_SECRET_BYTES}..{MAX_SECRET_BYTES} bytes$"
    with pytest.raises(ResumeTokenError, match=why):
        issue_resume_token(KEY, 1, "m", b"x" * size, NOW)
    with pytest.raises(ResumeTokenError, match=why):
        decode_resume_token_untrusted(_signed(_body(b"m", b"x" * size)))


def test_member_ids_of_1_to_255_bytes_fit() -> None:
    longest = "é" * 127 + "x"
    token = issue_resume_token(KEY, 1, longest, b"x" * MAX_SECRET_BYTES, NOW)
    assert len(token) == MAX_TOKEN_BYTES
    assert decode_resume_token_untrusted(token).member_id == longest
    for member in (longest + "x", ""):
        with pytest.raises(ResumeTokenError, match=r"^a member id is 1..255 bytes of UTF-8$"):
            issue_resume_token(KEY, 1, member, SECRET, NOW)
    with pytest.raises(ResumeTokenError, match=r"^a member id is not UTF-8: surrogates not al"):
        issue_resume_token(KEY, 1, "\udcff", SECRET, NOW)


@pytest.mark.parametrize("size", [MIN_TOKEN_BYTES - 1, MAX_TOKEN_BYTES + 1])
def test_a_token_of_the_wrong_size_is_refused(size: int) -> None:
    raw = bytes([RESUME_VERSION, KEY.key_id]) + bytes(size - 2)
    why = rf"^a resume token has {MIN_TOKEN_BYTES}..{MAX_TOKEN_BYTES} bytes$"
    with pytest.raises(ResumeTokenError, match=why):
        decode_resume_token_untrusted(raw)
    assert verify_resume_token(raw, KEYS, NOW) == ResumeRefusal(
        ResumeReason.MALFORMED, "not a resume token"
    )


def test_the_shortest_token_reaches_the_parser() -> None:
    raw = _signed(_body(b"", b"x"))
    assert len(raw) == MIN_TOKEN_BYTES
    with pytest.raises(ResumeTokenError, match=r"^an empty member id$"):
        decode_resume_token_untrusted(raw)
    assert verify_resume_token(raw, KEYS, NOW) == ResumeRefusal(
        ResumeReason.MALFORMED, "an empty member id"
    )


def test_decoding_names_each_fault() -> None:
    with pytest.raises(ResumeTokenError, match=r"^not a resume token \(version byte 0x01\)$"):
        decode_resume_token_untrusted(_signed(_body(b"m", SECRET, version=1)))
    with pytest.raises(ResumeTokenError, match=r"^trailing bytes before the MAC$"):
        decode_resume_token_untrusted(_signed(_body(b"m", SECRET) + b"."))
    with pytest.raises(ResumeTokenError, match=r"^a member id is not UTF-8$"):
        decode_resume_token_untrusted(_signed(_body(b"\xff", SECRET)))


def test_verify_names_each_refusal() -> None:
    token = issue_resume_token(KEY, 3, "m", SECRET, NOW + 1)
    assert verify_resume_token(token, {8: KEY.secret}, NOW) == ResumeRefusal(
        ResumeReason.UNKNOWN_KEY, "key id 9 is not held here"
    )
    forged = token[:-1] + bytes([token[-1] ^ 0x80])
    assert verify_resume_token(forged, KEYS, NOW) == ResumeRefusal(
        ResumeReason.FORGED, "the signature does not match"
    )
    assert verify_resume_token(token, KEYS, NOW + 1) == ResumeRefusal(
        ResumeReason.EXPIRED, "the token has expired"
    )
    other_version = bytes([1]) + token[1:]
    assert verify_resume_token(other_version, KEYS, NOW) == ResumeRefusal(
        ResumeReason.MALFORMED, "not a resume token"
    )
    claims = verify_resume_token(token, KEYS, NOW + 0.999)
    assert claims == ResumeClaims(3, "m", SECRET, NOW + 1, KEY.key_id)


class _Registry:
    def __init__(self, lobby: int | None, secret: bytes) -> None:
        self.lobby, self.secret = lobby, secret

    def lobby_of(self, member_id: str) -> int | None:
        return self.lobby if member_id == "m" else None

    def holds_secret(self, member_id: str, secret: bytes) -> bool:
        return member_id == "m" and secret == self.secret


def test_check_resume_names_each_refusal() -> None:
    token = issue_resume_token(KEY, 3, "m", SECRET, NOW + 1)
    assert check_resume(_Registry(3, SECRET), "m", token, KEYS, NOW) == 3
    assert check_resume(_Registry(3, SECRET), "n", token, KEYS, NOW) == ResumeRefusal(
        ResumeReason.WRONG_MEMBER, "the token is another member's"
    )
    assert check_resume(_Registry(4, SECRET), "m", token, KEYS, NOW) == ResumeRefusal(
        ResumeReason.NOT_SEATED,
        "no seat of this member in lobby 3 here (its grace period is over, or the lobby lives"
        " on another server)",
    )
    assert check_resume(_Registry(3, b"t" * 16), "m", token, KEYS, NOW) == ResumeRefusal(
        ResumeReason.REPLAYED,
        "the seat was already taken back (this token was used, or a newer client holds it)",
    )


def test_a_close_reason_names_its_refusal() -> None:
    refusal = ResumeRefusal(ResumeReason.EXPIRED, "the token has expired")
    assert refusal.close_reason() == "resume refused: EXPIRED: the token has expired"
    assert parse_refusal_reason("lobby: " + refusal.close_reason()) is ResumeReason.EXPIRED
    assert parse_refusal_reason("resume refused:  REPLAYED : x") is ResumeReason.REPLAYED
    assert parse_refusal_reason("resume refused: NOPE: x") is None
    assert parse_refusal_reason("refused: EXPIRED: x") is None


def test_a_token_of_the_largest_size_verifies() -> None:
    longest = "é" * 127 + "x"
    token = issue_resume_token(KEY, 1, longest, b"x" * MAX_SECRET_BYTES, NOW + 1)
    assert len(token) == MAX_TOKEN_BYTES
    claims = verify_resume_token(token, KEYS, NOW)
    assert isinstance(claims, ResumeClaims) and claims.member_id == longest


def test_a_far_expiry_that_fits_is_signed() -> None:
    # 1.844e19 ms is just under 2**64: it fits, and nothing but the milliseconds is counted
    token = issue_resume_token(KEY, 1, "m", SECRET, 1.844e16)
    assert decode_resume_token_untrusted(token).expires_at == 1.844e16


def test_a_length_that_runs_past_the_body_is_a_token_error() -> None:
    body = _body(b"m", SECRET)
    claims_more = body[:18] + bytes([200]) + body[19:]
    with pytest.raises(ResumeTokenError, match=r"^truncated at byte 19: a field of 200 bytes"):
        decode_resume_token_untrusted(_signed(claims_more))


def test_the_reason_is_read_from_the_first_marker_up_to_its_colon() -> None:
    assert parse_refusal_reason("resume refused: EXPIRED: at 5: now 9") is ResumeReason.EXPIRED
    text = "resume refused: FORGED: after resume refused: EXPIRED: x"
    assert parse_refusal_reason(text) is ResumeReason.FORGED
