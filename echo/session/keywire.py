"""The key exchange on the wire: the tails an encrypting HELLO and its CONNECT carry, pure.

Echo 2.0's messages stay byte for byte what they were; a client that encrypts appends its
ephemeral X25519 public key to its HELLO, and the server appends its static public key, its
fresh random bytes and the confirmation tag to the CONNECT (`echo.session.crypto` says what
they are for). Each tail comes last, after the resume extension's ``+R`` if there is one:

=================  =======================================================================
channel            wire form
=================  =======================================================================
all-clients C->S   ``HELLO <key>[ <credentials>][ +R <pad>] +X <client public: 64 hex>``
S-> all-clients    ``<session> CONNECT <port> <port> <u32 hex>[ +R <secret>]``
                   `` +X <server public: 64 hex> <server random: 32 hex> <tag: 32 hex>``
=================  =======================================================================

'+' is outside base64url, so the tail can never be mistaken for credentials; a server or
client that does not know ``+X`` refuses the message as malformed, and neither end ever falls
back to the clear by itself (the client refuses a CONNECT without the tail; see
`echo.session.machine`). The parsers take bytes from the network and never raise.

Pure module: no trio, no clock, no I/O.
"""

from __future__ import annotations

import re
from typing import Final

import attrs

from echo.protocol import MAX_MESSAGE_BYTES, BadMessage
from echo.session.crypto import CONFIRM_BYTES, KEY_BYTES, SERVER_NONCE_BYTES

KEY_TOKEN: Final = "+X"
_KEY_MARK: Final = b" +X "
_HELLO_TAIL: Final = re.compile(r"(.*) \+X ([0-9A-F]{64})", re.DOTALL)
_CONNECT_TAIL: Final = re.compile(
    r"(.*) \+X ([0-9A-F]{64}) ([0-9A-F]{32}) ([0-9A-F]{32})", re.DOTALL
)


@attrs.frozen
class HelloKey:
    client_public: bytes


@attrs.frozen
class ConnectKey:
    server_public: bytes
    server_nonce: bytes
    tag: bytes


def _bounded(text: str) -> bytes:
    data = text.encode("utf-8")
    if len(data) > MAX_MESSAGE_BYTES:
        raise ValueError(f"message is {len(data)} bytes; the limit is {MAX_MESSAGE_BYTES}")
    return data


def _hex(value: bytes, size: int, name: str) -> str:
    if not isinstance(value, bytes) or len(value) != size:
        raise ValueError(f"{name} must be {size} bytes")
    return value.hex().upper()


def append_hello_key(hello: bytes, key: HelloKey) -> bytes:
    """`hello` (any HELLO form) with the client's public key appended."""
    tail = _hex(key.client_public, KEY_BYTES, "client_public")
    return _bounded(f"{hello.decode('utf-8')} {KEY_TOKEN} {tail}")


def append_connect_key(connect: bytes, key: ConnectKey) -> bytes:
    """`connect` (a CONNECT, resumable or not) with the server's key tail appended."""
    public = _hex(key.server_public, KEY_BYTES, "server_public")
    nonce = _hex(key.server_nonce, SERVER_NONCE_BYTES, "server_nonce")
    tag = _hex(key.tag, CONFIRM_BYTES, "tag")
    return _bounded(f"{connect.decode('utf-8')} {KEY_TOKEN} {public} {nonce} {tag}")


def _text(data: bytes | bytearray | memoryview) -> str | None:
    if len(data) > MAX_MESSAGE_BYTES:
        return None
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError:
        return None


def split_hello_key(
    data: bytes | bytearray | memoryview,
) -> tuple[bytes | bytearray | memoryview, HelloKey | None] | BadMessage:
    """(the HELLO without the key tail, the client's key), or (data, None) without a tail."""
    if _KEY_MARK not in bytes(data[:MAX_MESSAGE_BYTES]):
        return data, None
    text = _text(data)
    match = None if text is None else _HELLO_TAIL.fullmatch(text)
    if match is None:
        return BadMessage("malformed key in HELLO")
    return match.group(1).encode("utf-8"), HelloKey(bytes.fromhex(match.group(2)))


def split_connect_key(
    data: bytes | bytearray | memoryview,
) -> tuple[bytes | bytearray | memoryview, ConnectKey | None] | BadMessage:
    """(the reply without the key tail, the server's key tail), or (data, None) without one."""
    if _KEY_MARK not in bytes(data[:MAX_MESSAGE_BYTES]):
        return data, None
    text = _text(data)
    match = None if text is None else _CONNECT_TAIL.fullmatch(text)
    if match is None:
        return BadMessage("malformed key in CONNECT")
    return match.group(1).encode("utf-8"), ConnectKey(
        bytes.fromhex(match.group(2)), bytes.fromhex(match.group(3)), bytes.fromhex(match.group(4))
    )
