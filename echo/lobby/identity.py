"""Verified identities: a member proves its id with a token from the game's own backend.

The token is a JWT (RFC 7519) in compact form, signed with Ed25519 (``"alg": "EdDSA"``) or
HMAC-SHA256 (``"HS256"``) under one key of the lobby's key set, named by the token header's
``kid``. PyJWT checks the signature, the algorithm against the key's, the issuer and the
audience; this module checks the times itself against the `now` it is given (PyJWT would read
the wall clock), so that the rules are testable at their boundaries:

- ``exp`` is required: valid while ``now < exp + leeway``;
- ``nbf``, if present: valid from ``now >= nbf - leeway``;
- ``sub`` is required: the member id, and it must equal the id the member's hello claims.

The key set is a JWK Set (RFC 7517): ``{"keys": [{...}, ...]}``, every key with a distinct
``kid``; an ``OKP``/``Ed25519`` public key (``x``) or an ``oct`` secret (``k``, at least 32
bytes: RFC 7518 §3.2). A key's ``alg``, if present, must be the one its type implies. Rotation:
publish a new kid next to the old one, let the backend sign with the new one, and drop the old
one after the longest token lifetime (docs/security.md, "Verified identities").

Pure module: no trio, no clock, no files. Raises only `IdentityRefused` (from `verify`) and
`IdentityKeyError` (from `parse_key_set`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, Final

import attrs
import jwt

from echo.lobby.hello import MAX_TOKEN_BYTES

#: The audience a token must name when the lobby is not told another one (`--auth-audience`):
#: the lobby service's name, the same on every lobby server of a ring (a token is good on
#: whichever server the member's walk reaches).
DEFAULT_AUDIENCE: Final = "echo-lobby"
#: Seconds of clock difference between the game's backend and a lobby server forgiven at
#: either end of a token's validity.
DEFAULT_LEEWAY: Final = 10.0
MIN_HMAC_KEY_BYTES: Final = 32

#: Every reason a token is refused (the metric's label values, the close reason's tag).
REASONS: Final = (
    "missing",  # a lobby with --auth-key got a hello without a token
    "malformed",  # not a compact JWT, or a claim of the wrong type
    "unknown_kid",  # no kid in the header, or one the key set does not hold
    "wrong_algorithm",  # the header's alg is not the kid's key's
    "bad_signature",
    "wrong_issuer",
    "wrong_audience",
    "missing_claim",  # no sub or no exp
    "expired",
    "not_yet_valid",
    "wrong_member",  # sub is not the member id of the hello
)

_ALGORITHMS: Final = {"oct": "HS256", "OKP": "EdDSA"}


class IdentityRefused(Exception):
    """A token that does not prove the member's id; `reason` is one of `REASONS`."""

    def __init__(self, reason: str, detail: str) -> None:
        assert reason in REASONS, reason
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class IdentityKeyError(ValueError):
    """A key set that cannot be used (a key named twice, of a type not allowed, ...)."""


@attrs.frozen
class IdentityKeys:
    """The verification keys by kid (`parse_key_set`)."""

    keys: Mapping[str, jwt.PyJWK]

    def __len__(self) -> int:
        return len(self.keys)


def parse_key_set(text: str | bytes) -> IdentityKeys:
    """A JWK Set: ``{"keys": [...]}``. Raises only `IdentityKeyError`."""
    try:
        document = json.loads(text, object_pairs_hook=_no_duplicate_members)
    except (ValueError, UnicodeDecodeError) as error:
        raise IdentityKeyError(f"not a JWK Set (JSON): {error}") from None
    if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
        raise IdentityKeyError('not a JWK Set: an object {"keys": [...]} is expected')
    keys: dict[str, jwt.PyJWK] = {}
    for n, entry in enumerate(document["keys"], 1):
        if not isinstance(entry, dict):
            raise IdentityKeyError(f"key {n} is not a JSON object")
        kid = entry.get("kid")
        if not isinstance(kid, str) or not kid:
            raise IdentityKeyError(f"key {n} has no kid (every key needs one, for rotation)")
        if kid in keys:
            raise IdentityKeyError(f"kid {kid!r} is named twice")
        keys[kid] = _one_key(kid, entry)
    if not keys:
        raise IdentityKeyError("the key set holds no key")
    return IdentityKeys(keys)


def _no_duplicate_members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in pairs:
        if name in out:
            raise ValueError(f"member {name!r} is named twice in one object")
        out[name] = value
    return out


def _one_key(kid: str, entry: dict[str, Any]) -> jwt.PyJWK:
    kty = entry.get("kty")
    algorithm = _ALGORITHMS.get(kty) if isinstance(kty, str) else None
    if algorithm is None:
        raise IdentityKeyError(f"kid {kid!r}: kty {kty!r}: only 'OKP' (Ed25519) or 'oct'")
    if kty == "OKP" and entry.get("crv") != "Ed25519":
        raise IdentityKeyError(f"kid {kid!r}: an OKP key must be crv 'Ed25519'")
    if entry.get("alg", algorithm) != algorithm:
        raise IdentityKeyError(f"kid {kid!r}: a {kty} key is alg {algorithm!r}")
    if kty == "OKP" and "d" in entry:
        raise IdentityKeyError(
            f"kid {kid!r} is a private key: the lobby needs only the public one (drop 'd')"
        )
    try:
        key = jwt.PyJWK(entry, algorithm)
    except (jwt.PyJWKError, jwt.InvalidKeyError, ValueError, TypeError) as error:
        raise IdentityKeyError(f"kid {kid!r}: {error}") from None
    if kty == "oct" and len(key.key) < MIN_HMAC_KEY_BYTES:
        raise IdentityKeyError(f"kid {kid!r}: an HS256 secret is at least 32 bytes")
    return key


@attrs.frozen
class IdentityVerifier:
    """Checks members' tokens against `keys`, for `issuer` and `audience`."""

    keys: IdentityKeys
    issuer: str
    audience: str = DEFAULT_AUDIENCE
    leeway: float = DEFAULT_LEEWAY

    def verify(self, token: bytes, member_id: str, now: float) -> dict[str, Any]:
        """The token's claims if it proves `member_id` at `now` (seconds since the epoch);
        otherwise raises `IdentityRefused` (and nothing else)."""
        if not token:
            raise IdentityRefused("missing", "this lobby needs an identity token")
        if len(token) > MAX_TOKEN_BYTES:
            raise IdentityRefused("malformed", f"a token of more than {MAX_TOKEN_BYTES} bytes")
        claims = self._checked(token)
        subject = claims["sub"]
        if subject != member_id:
            raise IdentityRefused(
                "wrong_member", f"the token is for {subject[:64]!r}, the hello claims {member_id!r}"
            )
        _check_times(claims, now, self.leeway)
        return claims

    def _checked(self, token: bytes) -> dict[str, Any]:
        """Signature, algorithm, issuer, audience, the claims present (not the times)."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as error:
            raise IdentityRefused("malformed", str(error)) from None
        kid = header.get("kid")
        key = self.keys.keys.get(kid) if isinstance(kid, str) else None
        if key is None:
            raise IdentityRefused("unknown_kid", f"no key {kid!r} here")
        try:
            return jwt.decode(
                token,
                key,
                algorithms=[key.algorithm_name],
                audience=self.audience,
                issuer=self.issuer,
                options={
                    "verify_exp": False,  # checked against `now` below
                    "verify_nbf": False,
                    "verify_iat": False,
                    "require": ["sub", "exp"],
                },
            )
        except jwt.InvalidSignatureError:
            raise IdentityRefused("bad_signature", "the signature does not verify") from None
        except jwt.InvalidAlgorithmError:
            raise IdentityRefused(
                "wrong_algorithm", f"key {kid!r} verifies only {key.algorithm_name}"
            ) from None
        except jwt.InvalidIssuerError:
            raise IdentityRefused("wrong_issuer", f"the issuer is not {self.issuer!r}") from None
        except jwt.InvalidAudienceError:
            raise IdentityRefused(
                "wrong_audience", f"the audience is not {self.audience!r}"
            ) from None
        except jwt.MissingRequiredClaimError as error:
            raise IdentityRefused("missing_claim", f"no {error.claim!r} claim") from None
        except jwt.PyJWTError as error:
            raise IdentityRefused("malformed", str(error)) from None


def _check_times(claims: dict[str, Any], now: float, leeway: float) -> None:
    exp = _number(claims, "exp")
    if exp is None:
        raise IdentityRefused("missing_claim", "no 'exp' claim")
    if not now < exp + leeway:
        raise IdentityRefused("expired", f"the token expired at {exp:.0f} (now {now:.0f})")
    nbf = _number(claims, "nbf")
    if nbf is not None and now < nbf - leeway:
        raise IdentityRefused("not_yet_valid", f"the token is valid from {nbf:.0f} (now {now:.0f})")


def _number(claims: dict[str, Any], name: str) -> float | None:
    value = claims.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise IdentityRefused("malformed", f"the {name!r} claim is not a finite number")
    return float(value)


def close_reason(refused: IdentityRefused) -> str:
    """What the lobby tells the member when it closes the session (the client parses it back
    with `parse_close_reason`)."""
    detail = "".join(c if c.isprintable() else "?" for c in refused.detail[:200])
    return f"{CLOSE_PREFIX}{refused.reason}: {detail}"


CLOSE_PREFIX: Final = "identity refused: "


def parse_close_reason(text: str) -> tuple[str, str] | None:
    """(reason, detail) of a lobby's identity refusal, or None if `text` is not one."""
    if not text.startswith(CLOSE_PREFIX):
        return None
    reason, _, detail = text[len(CLOSE_PREFIX) :].partition(": ")
    return (reason, detail) if reason in REASONS else None


def token_subject(token: str | bytes) -> str:
    """The ``sub`` of `token`, read WITHOUT checking anything: what a member's client takes
    for its own id when it is given only its token. Raises ValueError if there is none."""
    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError as error:
        raise ValueError(f"not an identity token: {error}") from None
    subject = claims.get("sub")
    if not isinstance(subject, str) or not subject:
        raise ValueError("the identity token has no 'sub' (the member id)")
    return subject
