"""Which server key a lobby member pins, for every server it talks to, without typing one.

The lobby servers of the ring. A member encrypts its lobby session when it is given a key
(`echo.lobby.connect(server_key=...)`, `echo-lobby-client --server-key`). The ring shares one
key as it shares the seat key: every lobby server loads the same `--key` file, so one value
pins them all, and a member moved to another server of the ring (a failover, a lobby at home
elsewhere) pins that one too. A deployment that gives each server its own key passes a
mapping ``{"host:port": key}`` naming every server of the list instead.

The game servers. A game server's public key travels with its announcement on the games topic
(`echo.lobby.games`, `echo-lobby-announce --server-key`), and in each member's `GameStarting`
next to the ticket; `game_pin` turns it into the pin the member's session to the game server
uses (`echo.lobby.play.join_game`). A game server announced without a key is reached in the
clear, as before. What the member pins is what its lobby session told it, so that session
should be encrypted (a key learnt in the clear is a key an on-path attacker chose).

Pure module: no trio, no clock.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from typing import TypeAlias

from echo.session.crypto import KEY_BYTES, BadKey, BadPin, Pin, check_public_key, fingerprint

#: `server_key` of `echo.lobby.connect`: one key for the ring, one per server, or none
RingKeys: TypeAlias = Pin | str | Mapping[str, Pin | str] | None


def _pin(value: Pin | str) -> Pin:
    if isinstance(value, Pin):
        return value
    if isinstance(value, str):
        return Pin.parse(value)
    raise BadPin(f"a server key is a Pin or its text, not {type(value).__name__}")


def ring_pins(servers: Sequence[str], server_key: RingKeys) -> dict[str, Pin | None]:
    """The pin of each lobby server of `servers` (None: that session is not encrypted).

    Raises BadPin for a value that is not a key, and ValueError for a mapping that leaves a
    server of the list out or names one that is not on it (a typo would otherwise mean a
    session in the clear, or a key never used)."""
    if server_key is None:
        return {s: None for s in servers}
    if isinstance(server_key, Mapping):
        missing = [s for s in servers if s not in server_key]
        extra = sorted(set(server_key) - set(servers))
        if missing or extra:
            said = [f"no key for {', '.join(missing)}"] if missing else []
            said += [f"a key for {', '.join(extra)}, not on the list"] if extra else []
            raise ValueError("server keys: " + "; ".join(said))
        return {s: _pin(server_key[s]) for s in servers}
    pin = _pin(server_key)
    return {s: pin for s in servers}


def game_pin(public: bytes) -> Pin | None:
    """The pin for a game server's announced public key; None for no key (b"").

    Raises BadKey for bytes that are not an X25519 public key."""
    if not public:
        return None
    return Pin(fingerprint(public))


def parse_public_key(text: str) -> bytes:
    """A public key as echo-server and echo-keygen print it (52 base32 characters, any case).

    Raises BadKey otherwise (a fingerprint names a key but cannot be announced: the member
    needs the key itself to pin, and a game server's key is public)."""
    value = text.strip()
    public = b""
    if len(value) == 52:
        try:
            public = base64.b32decode(value.upper() + "====")
        except (ValueError, binascii.Error):
            public = b""
    if len(public) != KEY_BYTES:
        raise BadKey(
            "a game server's public key is 52 base32 characters, as echo-server and "
            "echo-keygen print it"
        )
    return check_public_key(public)
