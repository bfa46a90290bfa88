"""echo.lobby.identity, the pure core: the key set's parser and the token check, with `now`
passed in (the times at their boundaries), every refusal by its reason."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any

import jwt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echo.lobby.identity import (
    DEFAULT_AUDIENCE,
    DEFAULT_LEEWAY,
    REASONS,
    IdentityKeyError,
    IdentityRefused,
    close_reason,
    parse_close_reason,
    parse_key_set,
    token_subject,
)
from tests.lobby.auth import ISSUER, backend, key_set, verifier

NOW = 1_800_000_000.0
ED = backend.new_signing_key("ed-1", "ed25519")
HS = backend.new_signing_key("hs-1", "hs256")


def token(signing: dict[str, Any] = ED, member: str = "alice", **options: Any) -> bytes:
    options.setdefault("issuer", ISSUER)
    options.setdefault("now", NOW)
    return backend.issue_token(signing, member, **options).encode()


def refused(reason: str, check: Any, *args: Any) -> IdentityRefused:
    with pytest.raises(IdentityRefused) as caught:
        check(*args)
    assert caught.value.reason == reason, caught.value
    return caught.value


# ------------------------------------------------------------------------------ the key set


def test_a_key_set_of_both_kinds_is_read_by_kid() -> None:
    keys = key_set(ED, HS)
    assert sorted(keys.keys) == ["ed-1", "hs-1"]
    assert keys.keys["ed-1"].algorithm_name == "EdDSA"
    assert keys.keys["hs-1"].algorithm_name == "HS256"


def _jwks(*entries: dict[str, Any]) -> str:
    return json.dumps({"keys": list(entries)})


PUBLIC = backend.verification_key(ED)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (_jwks(PUBLIC, {**backend.verification_key(HS), "kid": "ed-1"}), "named twice"),
        (_jwks(PUBLIC, PUBLIC), "'ed-1' is named twice"),
        ('{"keys": [], "keys": []}', "named twice in one object"),
        (_jwks({k: v for k, v in PUBLIC.items() if k != "kid"}), "has no kid"),
        (_jwks({**PUBLIC, "kid": ""}), "has no kid"),
        (_jwks({"kty": "RSA", "kid": "r", "n": "AQAB", "e": "AQAB"}), "only 'OKP'"),
        (_jwks({**PUBLIC, "crv": "X25519"}), "crv 'Ed25519'"),
        (_jwks({**PUBLIC, "alg": "HS256"}), "is alg 'EdDSA'"),
        (_jwks(ED), "private key"),
        (_jwks({"kty": "oct", "kid": "short", "k": "c2hvcnQ"}), "at least 32 bytes"),
        (_jwks({**PUBLIC, "x": "!!"}), "ed-1"),
        (_jwks(), "no key"),
        ('{"keys": {}}', "JWK Set"),
        ("[]", "JWK Set"),
        ("not json", "JSON"),
        (b"\xff\xfe", "JSON"),
        (_jwks("a string"), "not a JSON object"),
    ],
)
def test_a_key_set_that_cannot_be_used_is_refused_with_why(text: str, why: str) -> None:
    with pytest.raises(IdentityKeyError, match=why):
        parse_key_set(text)


@settings(max_examples=200)
@given(st.binary(max_size=300))
def test_random_key_files_raise_only_the_key_error(data: bytes) -> None:
    try:
        parse_key_set(data)
    except IdentityKeyError:
        pass


# ------------------------------------------------------------------------------ tokens


@pytest.mark.parametrize("signing", [ED, HS], ids=["EdDSA", "HS256"])
def test_a_valid_token_proves_its_subject(signing: dict[str, Any]) -> None:
    claims = verifier(ED, HS).verify(token(signing), "alice", NOW)
    assert claims["sub"] == "alice" and claims["iss"] == ISSUER
    assert claims["aud"] == DEFAULT_AUDIENCE


def test_expiry_at_its_boundary_with_the_leeway() -> None:
    check = verifier(ED).verify
    tok = token(ttl=600)  # exp = NOW + 600
    last_valid = NOW + 600 + DEFAULT_LEEWAY - 0.001
    assert check(tok, "alice", last_valid)["exp"] == NOW + 600
    refused("expired", check, tok, "alice", NOW + 600 + DEFAULT_LEEWAY)
    strict = verifier(ED, leeway=0).verify
    assert strict(tok, "alice", NOW + 599.999)
    refused("expired", strict, tok, "alice", NOW + 600)


def test_not_before_at_its_boundary_with_the_leeway() -> None:
    check = verifier(ED).verify
    tok = token(not_before=NOW + 100)
    refused("not_yet_valid", check, tok, "alice", NOW + 100 - DEFAULT_LEEWAY - 0.001)
    assert check(tok, "alice", NOW + 100 - DEFAULT_LEEWAY)
    strict = verifier(ED, leeway=0).verify
    refused("not_yet_valid", strict, tok, "alice", NOW + 99.999)
    assert strict(tok, "alice", NOW + 100)


def test_a_token_replayed_after_its_expiry_is_refused() -> None:
    check = verifier(ED).verify
    tok = token(ttl=60)
    assert check(tok, "alice", NOW + 30)  # used once
    error = refused("expired", check, tok, "alice", NOW + 3600)
    assert str(int(NOW + 60)) in str(error)


def _forge(signing: dict[str, Any], claims: dict[str, Any], **headers: Any) -> bytes:
    key = jwt.PyJWK(signing)
    return jwt.encode(
        claims, key.key, algorithm=key.algorithm_name, headers={"kid": signing["kid"], **headers}
    ).encode()


BASE = {"iss": ISSUER, "aud": DEFAULT_AUDIENCE, "sub": "alice", "exp": int(NOW + 600)}


def test_each_bad_token_is_refused_with_its_reason() -> None:
    check = verifier(ED, HS).verify
    other = backend.new_signing_key("ed-1", "ed25519")  # same kid, another key: forged
    refused("bad_signature", check, token(other), "alice", NOW)
    refused("bad_signature", check, token({**HS, "k": HS["k"][::-1]}), "alice", NOW)
    refused("unknown_kid", check, token(backend.new_signing_key("ed-9", "ed25519")), "alice", NOW)
    refused("wrong_audience", check, token(audience="another-game"), "alice", NOW)
    refused("wrong_issuer", check, token(issuer="https://evil.example"), "alice", NOW)
    refused("wrong_member", check, token(member="bob"), "alice", NOW)
    refused("missing", check, b"", "alice", NOW)
    refused("malformed", check, b"not.a.token", "alice", NOW)
    refused("malformed", check, b"x" * 5000, "alice", NOW)
    refused("missing_claim", check, _forge(ED, {k: v for k, v in BASE.items() if k != "exp"}),
            "alice", NOW)  # fmt: skip
    refused("missing_claim", check, _forge(ED, {k: v for k, v in BASE.items() if k != "sub"}),
            "alice", NOW)  # fmt: skip
    refused("malformed", check, _forge(ED, {**BASE, "exp": "tomorrow"}), "alice", NOW)
    refused("malformed", check, _forge(ED, {**BASE, "exp": True}), "alice", NOW)
    refused("malformed", check, _forge(ED, {**BASE, "nbf": [1]}), "alice", NOW)
    refused("malformed", check, _forge(ED, {**BASE, "sub": 7}), "7", NOW)


def test_a_token_without_a_kid_is_refused() -> None:
    key = jwt.PyJWK(ED)
    bare = jwt.encode(BASE, key.key, algorithm="EdDSA").encode()
    refused("unknown_kid", verifier(ED).verify, bare, "alice", NOW)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def test_algorithm_confusion_and_none_are_refused() -> None:
    check = verifier(ED, HS).verify
    # HS256 "signed" with the Ed25519 public key as the secret, under the Ed25519 kid.
    public = base64.urlsafe_b64decode(PUBLIC["x"] + "=")
    header = {"alg": "HS256", "kid": "ed-1", "typ": "JWT"}
    body = _b64(json.dumps(header).encode()) + "." + _b64(json.dumps(BASE).encode())
    mac = hmac.new(public, body.encode(), hashlib.sha256).digest()
    refused("wrong_algorithm", check, (body + "." + _b64(mac)).encode(), "alice", NOW)
    none = _b64(json.dumps({"alg": "none", "kid": "ed-1"}).encode())
    unsigned = none + "." + _b64(json.dumps(BASE).encode()) + "."
    refused("wrong_algorithm", check, unsigned.encode(), "alice", NOW)
    # An EdDSA token (a valid Ed25519 signature) under the HS256 key's kid.
    refused("wrong_algorithm", check, _forge(ED, BASE, kid="hs-1"), "alice", NOW)


def test_audience_default_and_configured() -> None:
    assert verifier(ED).verify(token(), "alice", NOW)
    mine = verifier(ED, audience="my-lobby").verify
    refused("wrong_audience", mine, token(), "alice", NOW)
    assert mine(token(audience="my-lobby"), "alice", NOW)


@settings(max_examples=300)
@given(st.binary(max_size=600))
def test_random_tokens_raise_only_the_refusal(data: bytes) -> None:
    try:
        verifier(ED, HS).verify(data, "alice", NOW)
    except IdentityRefused as error:
        assert error.reason in REASONS


@settings(max_examples=200)
@given(st.integers(0, 200), st.integers(0, 255))
def test_a_token_with_one_byte_changed_never_passes(at: int, byte: int) -> None:
    tok = bytearray(token())
    at %= len(tok)
    if tok[at] == byte:
        return
    tok[at] = byte
    try:
        claims = verifier(ED).verify(bytes(tok), "alice", NOW)
    except IdentityRefused:
        return
    # (base64url's last character carries spare bits: a change there may decode the same)
    assert claims == jwt.decode(token(), options={"verify_signature": False})


# ------------------------------------------------------------------------------ the wire


def test_the_close_reason_round_trips_and_stays_printable() -> None:
    error = IdentityRefused("expired", "at 5\nnow 9" + "x" * 500)
    text = close_reason(error)
    assert text.isprintable() and len(text) < 260
    assert parse_close_reason(text) == ("expired", "at 5?now 9" + "x" * 190)
    assert parse_close_reason("server full") is None
    assert parse_close_reason("identity refused: nonsense: x") is None


def test_the_subject_is_read_without_checking_for_the_client() -> None:
    assert token_subject(token(member="zoë")) == "zoë"
    assert token_subject(token(member="bob").decode()) == "bob"
    with pytest.raises(ValueError, match="no 'sub'"):
        token_subject(_forge(ED, {k: v for k, v in BASE.items() if k != "sub"}))
    with pytest.raises(ValueError, match="not an identity token"):
        token_subject(b"garbage")
