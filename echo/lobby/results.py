"""Game results: what a game server tells the lobby when its game ends, signed with its ticket
key, on the results topic (`echo.lobby.server.report_game_result` publishes it).

The lobby server that holds the lobby checks the signature with its ticket keys (the ones its
tickets are signed with: a game server that can admit the lobby's players can end their game,
and nobody else), then ends the game (`echo.lobby.gameloop`): the lobby unlocks, ready states
are reset, and the members get a `GameEnded` carrying ``result``. A report whose signature
does not verify is ignored and counted (``game_results_refused``); a repeat of a result
already applied, or one for a game that is not running, is ignored too.

Where the lobby is does not concern the game server: every lobby server subscribes to the
results topic. If the lobby's home died while the game ran, its members re-create it, game
included, on the next server of the ring (`echo.lobby.gameloop`), and that server ends the
game; a result that reaches it before the members' copies do is held there for
`LobbyConfig.result_hold` seconds (``game_results_held``) and ends the game as they arrive.

Record wire form (big-endian):

======  ==========  =========================================================================
offset  field       meaning
======  ==========  =========================================================================
0       u8          format version, 1
1       u8          key id: which ticket key signed it
2       u64         lobby id (the ticket's)
10      u64         match id (the ticket's)
18      str8        game server id (the one the tickets named)
.       values      the result: u8 count + count x (str8 key, u8 tag + body: 0 = str16,
                    1 = i64), keys unique
.       32 bytes    HMAC-SHA256 under the key `key id` names, over a domain string
                    ("echo-lobby game result 1" and a zero byte) and every byte before it
======  ==========  =========================================================================

Pure module: no trio, no clock.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Final

import attrs

from echo.codec import Buffer, CodecError
from echo.tickets.core import TicketKey, _pull_values, _push_values

RESULT_VERSION: Final = 1
MAX_RESULT_RECORD_BYTES: Final = 4096
_DOMAIN: Final = b"echo-lobby game result 1\x00"
_MAC_BYTES: Final = 32


class ResultError(CodecError):
    """A game result that cannot be encoded (a field that does not fit)."""


@attrs.frozen
class GameResult:
    """The end of one game, as its game server reports it: the ``lobby_id`` and ``match_id``
    of the tickets it admitted (`TicketClaims`), its own ``server_id``, and ``result``: string
    or integer values (``{"winner": "alice", "turns": 9}``) that the members receive as is."""

    lobby_id: int
    match_id: int
    server_id: str
    result: Mapping[str, str | int] = attrs.field(factory=dict)


def _mac(secret: bytes, body: bytes) -> bytes:
    return hmac.new(secret, _DOMAIN + body, hashlib.sha256).digest()


def sign_result(key: TicketKey, result: GameResult) -> bytes:
    """The signed record of `result` under `key` (the game server's ticket key: the first of
    its key file). Raises ResultError for fields that do not fit."""
    buf = Buffer(error=ResultError)
    try:
        buf.push_uint8(RESULT_VERSION)
        buf.push_uint8(key.key_id)
        buf.push_uint64(result.lobby_id)
        buf.push_uint64(result.match_id)
        if not 1 <= len(result.server_id.encode("utf-8", "surrogatepass")) <= 255:
            raise ResultError("a server id is 1..255 bytes")
        buf.push_str8(result.server_id)
        _push_values(buf, result.result)
    except CodecError as error:
        raise ResultError(str(error)) from None
    body = buf.data
    if len(body) + _MAC_BYTES > MAX_RESULT_RECORD_BYTES:
        raise ResultError(f"a result record is at most {MAX_RESULT_RECORD_BYTES} bytes")
    return body + _mac(key.secret, body)


def verify_result(
    data: bytes | bytearray | memoryview, keys: TicketKey | Mapping[int, bytes]
) -> GameResult | str:
    """The result a record reports, if its signature verifies under `keys`; else why not
    ("malformed", "unknown_version", "unknown_key", "bad_signature"). Never raises."""
    raw = bytes(data)
    if not 2 + _MAC_BYTES <= len(raw) <= MAX_RESULT_RECORD_BYTES:
        return "malformed"
    if raw[0] != RESULT_VERSION:
        return "unknown_version"
    keyring = {keys.key_id: keys.secret} if isinstance(keys, TicketKey) else keys
    secret = keyring.get(raw[1])
    if secret is None:
        return "unknown_key"
    body = raw[:-_MAC_BYTES]
    # The MAC first: nothing of a forged report is parsed, let alone believed.
    if not hmac.compare_digest(_mac(secret, body), raw[-_MAC_BYTES:]):
        return "bad_signature"
    buf = Buffer(body, error=ResultError)
    try:
        buf.pull_uint8()
        buf.pull_uint8()
        lobby_id = buf.pull_uint64()
        match_id = buf.pull_uint64()
        server_id = buf.pull_str8()
        values = _pull_values(buf)
        buf.check_end()
    except CodecError:
        return "malformed"
    if not server_id:
        return "malformed"
    return GameResult(lobby_id, match_id, server_id, values)
