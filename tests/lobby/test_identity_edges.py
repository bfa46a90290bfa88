"""Identity tokens and key sets at their edges: each refusal's exact words (what the member's
client shows and the operator's log keeps), the token's size bound on both sides, the times
with their details. These kill mutants of echo.lobby.identity that the behaviour tests in
test_identity.py let through (./dev mutate lobby; docs/mutation.md)."""

from __future__ import annotations

import base64
import json
from typing import Any

import jwt
import pytest

from echo.lobby.hello import MAX_TOKEN_BYTES
from echo.lobby.identity import (
    DEFAULT_AUDIENCE,
    IdentityKeyError,
    IdentityRefused,
    close_reason,
    parse_close_reason,
    parse_key_set,
    token_subject,
)
from tests.lobby.auth import ISSUER, backend, verifier

NOW = 1_800_000_000.0
ED = backend.new_signing_key("ed-1", "ed25519")
HS = backend.new_signing_key("hs-1", "hs256")
PUBLIC = backend.verification_key(ED)
BASE = {"iss": ISSUER, "aud": DEFAULT_AUDIENCE, "sub": "alice", "exp": int(NOW + 600)}


def _forge(signing: dict[str, Any], claims: dict[str, Any], **headers: Any) -> bytes:
    key = jwt.PyJWK(signing)
    return jwt.encode(
        claims, key.key, algorithm=key.algorithm_name, headers={"kid": signing["kid"], **headers}
    ).encode()


def _refusal(token: bytes, member: str = "alice", now: float = NOW, **options: Any) -> str:
    with pytest.raises(IdentityRefused) as caught:
        verifier(ED, HS, **options).verify(token, member, now)
    assert str(caught.value) == f"{caught.value.reason}: {caught.value.detail}"
    return str(caught.value)


def _jwks(*entries: Any) -> str:
    return json.dumps({"keys": list(entries)})


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[]", 'not a JWK Set: an object {"keys": [...]} is expected'),
        ('{"keys": {}}', 'not a JWK Set: an object {"keys": [...]} is expected'),
        (_jwks(PUBLIC, "x"), "key 2 is not a JSON object"),
        (_jwks(PUBLIC, {"kty": "OKP"}), "key 2 has no kid (every key needs one, for rotation)"),
        (
            _jwks(PUBLIC, {**PUBLIC, "kid": 5}),
            "key 2 has no kid (every key needs one, for rotation)",
        ),
        (_jwks(PUBLIC, PUBLIC), "kid 'ed-1' is named twice"),
        (_jwks(), "the key set holds no key"),
        (_jwks({**PUBLIC, "kty": 3}), "kid 'ed-1': kty 3: only 'OKP' (Ed25519) or 'oct'"),
        (_jwks({**PUBLIC, "kty": "EC"}), "kid 'ed-1': kty 'EC': only 'OKP' (Ed25519) or 'oct'"),
        (_jwks({**PUBLIC, "crv": "X25519"}), "kid 'ed-1': an OKP key must be crv 'Ed25519'"),
        (_jwks({**PUBLIC, "alg": "HS256"}), "kid 'ed-1': a OKP key is alg 'EdDSA'"),
        (
            _jwks(ED),
            "kid 'ed-1' is a private key: the lobby needs only the public one (drop 'd')",
        ),
        (
            _jwks({"kty": "oct", "kid": "k", "k": "A" * 42}),
            "kid 'k': an HS256 secret is at least 32 bytes",
        ),
    ],
)
def test_a_key_set_is_refused_in_exact_words(text: str, words: str) -> None:
    with pytest.raises(IdentityKeyError) as caught:
        parse_key_set(text)
    assert str(caught.value) == words


def test_a_key_set_member_named_twice_and_bad_json_say_so() -> None:
    with pytest.raises(IdentityKeyError) as caught:
        parse_key_set('{"keys": [], "keys": []}')
    assert str(caught.value) == ("not a JWK Set (JSON): member 'keys' is named twice in one object")
    with pytest.raises(IdentityKeyError, match=r"^not a JWK Set \(JSON\): Expecting value"):
        parse_key_set("nope")


def test_keys_of_exactly_32_bytes_and_the_right_alg_are_accepted() -> None:
    secret = {"kty": "oct", "kid": "k", "k": "A" * 43, "alg": "HS256"}  # 32 bytes
    explicit = {**PUBLIC, "alg": "EdDSA"}
    keys = parse_key_set(_jwks(secret, explicit))
    assert len(keys) == 2
    assert keys.keys["k"].algorithm_name == "HS256"
    assert keys.keys["ed-1"].algorithm_name == "EdDSA"


def test_a_token_of_the_largest_size_is_checked_and_one_byte_more_is_not() -> None:
    assert _refusal(b"x" * (MAX_TOKEN_BYTES + 1)) == (
        f"malformed: a token of more than {MAX_TOKEN_BYTES} bytes"
    )
    assert _refusal(b"x" * MAX_TOKEN_BYTES).startswith("malformed: Not enough segments")


def test_each_refusal_in_exact_words() -> None:
    assert _refusal(b"") == "missing: this lobby needs an identity token"
    other = backend.new_signing_key("ed-9", "ed25519")
    assert _refusal(_forge(other, BASE)) == "unknown_kid: no key 'ed-9' here"
    forged = backend.new_signing_key("ed-1", "ed25519")
    assert _refusal(_forge(forged, BASE)) == "bad_signature: the signature does not verify"
    assert _refusal(_forge(ED, BASE, kid="hs-1")) == (
        "wrong_algorithm: key 'hs-1' verifies only HS256"
    )
    assert _refusal(_forge(ED, {**BASE, "iss": "x"})) == (
        f"wrong_issuer: the issuer is not {ISSUER!r}"
    )
    assert _refusal(_forge(ED, {**BASE, "aud": "x"})) == (
        "wrong_audience: the audience is not 'echo-lobby'"
    )
    no_exp = {k: v for k, v in BASE.items() if k != "exp"}
    assert _refusal(_forge(ED, no_exp)) == "missing_claim: no 'exp' claim"
    assert _refusal(_forge(ED, {**BASE, "sub": "b" * 100})) == (
        f"wrong_member: the token is for {'b' * 64!r}, the hello claims 'alice'"
    )
    assert _refusal(_forge(ED, {**BASE, "exp": float("inf")})).startswith("malformed: ")
    assert _refusal(_forge(ED, {**BASE, "nbf": "soon"})) == (
        "malformed: the 'nbf' claim is not a finite number"
    )


def test_the_times_in_exact_words() -> None:
    assert _refusal(_forge(ED, BASE), now=NOW + 700) == (
        f"expired: the token expired at {NOW + 600:.0f} (now {NOW + 700:.0f})"
    )
    early = _forge(ED, {**BASE, "nbf": NOW + 100})
    assert _refusal(early, now=NOW) == (
        f"not_yet_valid: the token is valid from {NOW + 100:.0f} (now {NOW:.0f})"
    )
    late = _forge(ED, {**BASE, "nbf": NOW - 100.5})
    assert verifier(ED, leeway=0).verify(late, "alice", NOW - 100.5)["nbf"] == NOW - 100.5


def test_a_number_claim_of_each_kind() -> None:
    check = verifier(ED).verify
    assert check(_forge(ED, {**BASE, "exp": NOW + 0.5}), "alice", NOW)["exp"] == NOW + 0.5
    assert check(_forge(ED, {**BASE, "nbf": None}), "alice", NOW)["nbf"] is None
    assert _refusal(_forge(ED, {**BASE, "exp": False})) == (
        "malformed: the 'exp' claim is not a finite number"
    )


def test_the_close_reason_keeps_200_printable_characters() -> None:
    refused = IdentityRefused("expired", "é\t" + "x" * 300)
    text = close_reason(refused)
    assert text == "identity refused: expired: é?" + "x" * 198
    assert parse_close_reason(text) == ("expired", "é?" + "x" * 198)
    assert parse_close_reason("identity refused: expired") == ("expired", "")
    assert parse_close_reason("Identity refused: expired: x") is None


def test_the_subject_read_for_the_client_in_exact_words() -> None:
    with pytest.raises(ValueError, match=r"^not an identity token: Not enough segments$"):
        token_subject(b"garbage")
    empty = _forge(ED, {**BASE, "sub": ""})
    with pytest.raises(ValueError) as caught:
        token_subject(empty)
    assert str(caught.value) == "the identity token has no 'sub' (the member id)"
    assert token_subject(_forge(ED, BASE)) == "alice"


def test_a_key_type_or_kid_that_is_not_a_string_is_refused_not_a_crash() -> None:
    # a JSON list is unhashable: looked up as it is, it would raise TypeError, not the refusal
    with pytest.raises(IdentityKeyError) as caught:
        parse_key_set(_jwks({**PUBLIC, "kty": ["OKP"]}))
    assert str(caught.value) == "kid 'ed-1': kty ['OKP']: only 'OKP' (Ed25519) or 'oct'"
    # (a kid of another type never gets that far: PyJWT refuses the header itself)
    header = base64.urlsafe_b64encode(b'{"alg": "EdDSA", "kid": ["ed-1"]}').rstrip(b"=")
    listed = header + b".e30." + b"A" * 86
    assert _refusal(listed) == "malformed: Key ID header parameter must be a string"


def test_a_signed_payload_that_is_not_claims_is_malformed_in_its_words() -> None:
    key = jwt.PyJWK(ED)
    text = jwt.api_jws.encode(b"[1, 2]", key.key, algorithm="EdDSA", headers={"kid": "ed-1"})
    assert _refusal(text.encode()) == "malformed: Invalid payload string: must be a json object"
