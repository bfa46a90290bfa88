"""The example backend (examples/auth_backend.py) as a module, and key sets made with it, for
the identity tests: the tokens the tests present are the ones a game's backend would issue."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

from echo.lobby.identity import IdentityKeys, IdentityVerifier, parse_key_set

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "auth_backend.py"
ISSUER = "https://game.example"


def load_backend() -> ModuleType:
    spec = importlib.util.spec_from_file_location("auth_backend", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


backend = load_backend()


def key_set(*signing: dict[str, Any]) -> IdentityKeys:
    """The lobby's key set for these signing keys (public halves, or the HMAC secrets)."""
    return parse_key_set(json.dumps({"keys": [backend.verification_key(k) for k in signing]}))


def verifier(*signing: dict[str, Any], **options: Any) -> IdentityVerifier:
    return IdentityVerifier(key_set(*signing), issuer=options.pop("issuer", ISSUER), **options)
