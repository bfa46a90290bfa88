"""A game's backend, the smallest there is: it holds the signing key and issues the identity
tokens that a lobby with ``echo-lobby --auth-key`` checks (docs/security.md, "Verified
identities").

    # once: a signing key, and the lobby's key set (a JWK Set, public keys only for Ed25519)
    python examples/auth_backend.py keygen --kid 2026-12 --signing backend.jwk --jwks lobby.jwks
    echo-lobby --auth-key lobby.jwks --auth-issuer https://game.example

    # per login (your backend does this after it has checked the player's password, its
    # platform account, ...): a token for the member id, valid for --ttl seconds
    python examples/auth_backend.py issue --signing backend.jwk --member alice \\
        --issuer https://game.example > alice.token
    echo-lobby-client --token @alice.token

    # rotation: a new key next to the old one; restart the lobbies with the grown key set,
    # then sign with the new key; drop the old kid from lobby.jwks after the longest --ttl
    python examples/auth_backend.py keygen --kid 2027-01 --signing backend-2027.jwk \\
        --jwks lobby.jwks

``--alg hs256`` makes a shared HMAC-SHA256 secret instead: then the lobby's key set holds the
secret too (it is written mode 0600, and the lobby refuses it readable by others). Ed25519 is
the better choice: a lobby server that is broken into cannot mint tokens.

A real backend serves `issue_token` behind its login endpoint; nothing here is echo-specific
but the audience, which is the lobby's (``--auth-audience``, default ``echo-lobby``).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import time
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from jwt.algorithms import HMACAlgorithm, OKPAlgorithm


def new_signing_key(kid: str, alg: str) -> dict[str, Any]:
    """A new private JWK: an Ed25519 key pair, or a 32-byte HMAC secret."""
    if alg == "ed25519":
        jwk = OKPAlgorithm.to_jwk(Ed25519PrivateKey.generate(), as_dict=True)
        return {**jwk, "kid": kid, "alg": "EdDSA", "use": "sig"}
    if alg == "hs256":
        jwk = HMACAlgorithm.to_jwk(secrets.token_bytes(32), as_dict=True)
        return {**jwk, "kid": kid, "alg": "HS256", "use": "sig"}
    raise ValueError(f"--alg is ed25519 or hs256, not {alg!r}")


def verification_key(signing: dict[str, Any]) -> dict[str, Any]:
    """What the lobby needs of a signing key: the public half (Ed25519), the secret (HS256)."""
    return {k: v for k, v in signing.items() if k != "d"}


def issue_token(
    signing: dict[str, Any],
    member: str,
    *,
    issuer: str,
    audience: str = "echo-lobby",
    ttl: float = 600.0,
    now: float | None = None,
    not_before: float | None = None,
) -> str:
    """A token proving `member`, valid from `not_before` (default: now) for `ttl` seconds."""
    now = time.time() if now is None else now
    key = jwt.PyJWK(signing)
    claims: dict[str, Any] = {
        "iss": issuer,
        "aud": audience,
        "sub": member,
        "iat": int(now),
        "exp": int(now + ttl),
    }
    if not_before is not None:
        claims["nbf"] = int(not_before)
    headers = {"kid": signing["kid"]}
    return jwt.encode(claims, key.key, algorithm=key.algorithm_name, headers=headers)


def _write_private(path: Path, text: str, *, new: bool) -> None:
    flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if new else os.O_TRUNC)
    fd = os.open(path, flags, 0o600)
    with os.fdopen(fd, "w") as handle:
        os.fchmod(handle.fileno(), 0o600)
        handle.write(text)


def keygen(args: argparse.Namespace) -> int:
    signing_path, jwks_path = Path(args.signing), Path(args.jwks)
    if signing_path.exists():
        print(f"auth_backend: {signing_path} exists (never overwritten)", file=sys.stderr)
        return 1
    key_set: dict[str, Any] = {"keys": []}
    if jwks_path.exists():
        key_set = json.loads(jwks_path.read_text())
    if any(key.get("kid") == args.kid for key in key_set["keys"]):
        print(f"auth_backend: kid {args.kid!r} is already in {jwks_path}", file=sys.stderr)
        return 1
    signing = new_signing_key(args.kid, args.alg)
    _write_private(signing_path, json.dumps(signing, indent=2) + "\n", new=True)
    key_set["keys"].append(verification_key(signing))
    _write_private(jwks_path, json.dumps(key_set, indent=2) + "\n", new=False)
    print(f"kid {args.kid}: signing key {signing_path}, lobby key set {jwks_path}")
    return 0


def issue(args: argparse.Namespace) -> int:
    signing = json.loads(Path(args.signing).read_text())
    now = time.time()
    not_before = None if args.not_before is None else now + args.not_before
    token = issue_token(
        signing,
        args.member,
        issuer=args.issuer,
        audience=args.audience,
        ttl=args.ttl,
        now=now,
        not_before=not_before,
    )
    print(token)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Issue identity tokens for echo-lobby.")
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("keygen", help="a new signing key, its kid added to the key set")
    gen.add_argument("--kid", required=True, help="the key's id (e.g. the month it starts)")
    gen.add_argument("--alg", choices=("ed25519", "hs256"), default="ed25519")
    gen.add_argument("--signing", required=True, help="the backend's signing key (JWK) to write")
    gen.add_argument("--jwks", required=True, help="the lobby's key set (created or grown)")
    gen.set_defaults(run=keygen)
    tok = commands.add_parser("issue", help="print a token for --member")
    tok.add_argument("--signing", required=True)
    tok.add_argument("--member", required=True)
    tok.add_argument("--issuer", required=True)
    tok.add_argument("--audience", default="echo-lobby")
    tok.add_argument("--ttl", type=float, default=600.0, help="seconds (default 600)")
    tok.add_argument("--not-before", type=float, default=None, help="valid only from now + SECONDS")
    tok.set_defaults(run=issue)
    args = parser.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
