"""Resume after a network change: the wire extension and its proofs, pure.

A client whose path breaks (its NAT mapping changes, it moves from Wi-Fi to mobile) keeps its
session if it proves, from its new address, that it holds the secret the server gave it in its
CONNECT. The proof is a MAC, never the secret, and each one carries a counter the server must
see grow, so a RESUME seen on the wire cannot be replayed from somewhere else.

Every byte of Echo 2.0's normal path stays as it was: only a client that announces it can
resume (``+R`` in its HELLO, which the Java client and `echo-client` never send) gets the
longer CONNECT, and RESUME is a new request on the all-clients channel.

=================  =================================================  ======================
channel            wire form                                          record
=================  =================================================  ======================
all-clients C->S   ``HELLO <key>[ <credentials>] +R <pad: 32 hex>``    `ResumableHello`
S-> all-clients    ``<session> CONNECT <port> <port> <u32 hex>``       `ResumableConnect`
                   `` +R <secret XOR pad: 32 hex>``
all-clients C->S   ``RESUME <duologue session> <n> <received>``        `Resume`
                   `` <proof: 32 hex>``
S-> all-clients    ``<session> RESUMED <received>``                    `Resumed`
S-> all-clients    ``<session> ERROR <reason>``                        (Echo 2.0's AllClientsError)
=================  =================================================  ======================

The all-clients channel is multicast: every client in its handshake sees every reply. So the
128-bit secret travels one-time-padded with a 128-bit pad that only the HELLO (client to server,
unicast) carried, as the io7m Aeron guide §4.3 pads the duologue session id with the HELLO's 32-bit
key. The proof is ``HMAC-SHA256(secret, "echo-resume|<session>|<n>|<received>")`` cut to 128 bits;
``n`` starts at 1 and the server accepts each value at most once, in increasing order.

``<received>`` (both ways) is how many messages of the peer's stream this end has read: each end
then sends again, on fresh streams, the messages the other has not (`Session` keeps the last
ones it sent for that), so a message in flight when the path broke is neither lost nor doubled.

The ``*_untrusted`` parsers take bytes from the network and never raise: anything else is
`BadMessage`. Pure module: no trio, no clock, no I/O.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from typing import Final

import attrs

from echo.protocol import (
    INT32_MAX,
    INT32_MIN,
    MAX_MESSAGE_BYTES,
    AllClientsError,
    BadMessage,
    Connect,
    Hello,
    format_message,
    parse_all_clients_reply_untrusted,
    parse_hello_untrusted,
)

#: secrets, pads and proofs are this many bits
RESUME_BITS: Final = 128
RESUME_MAX: Final = (1 << RESUME_BITS) - 1
#: the token that says "this client can resume" (HELLO) / "here is your secret" (CONNECT);
#: '+' is outside base64url, so it can never be mistaken for credentials
RESUME_TOKEN: Final = "+R"
#: what a refused RESUME hears (one reason for every cause: a prober learns nothing)
ERROR_RESUME_REFUSED: Final = "resume refused"

_HEX128: Final = r"([0-9A-F]{32})"
_SESSION: Final = r"(0|-?[1-9][0-9]{0,9})"
_RESUMABLE_TAIL: Final = re.compile(r"(.*) \+R " + _HEX128)
_COUNT: Final = r"(0|[1-9][0-9]{0,17})"
#: a RESUME's attempt counter: 1..999999999, the range `format_resume` writes
_RESUME_RE: Final = re.compile(
    r"RESUME " + _SESSION + r" ([1-9][0-9]{0,8}) " + _COUNT + " " + _HEX128
)
_RESUMED_RE: Final = re.compile(_SESSION + r" RESUMED " + _COUNT)
#: message counts on the wire stay below this (18 decimal digits)
MAX_COUNT: Final = 10**18 - 1


@attrs.frozen
class ResumableHello:
    """A HELLO from a client that can resume; `pad` one-time-pads the secret in the reply."""

    hello: Hello
    pad: int


@attrs.frozen
class ResumableConnect:
    """A CONNECT with the resume secret, padded with the HELLO's resume pad."""

    connect: Connect
    encrypted_secret: int


@attrs.frozen
class Resume:
    """Client -> server: give me `session_id` back at the address this came from."""

    session_id: int
    counter: int
    #: messages of the server's stream the client has read
    received: int
    proof: bytes


@attrs.frozen
class Resumed:
    """Server -> all clients: the client with `client_session` has its session back."""

    client_session: int
    #: messages of the client's stream the server has read
    received: int


def _hex128(value: int) -> str:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= RESUME_MAX:
        raise ValueError(f"expected a {RESUME_BITS}-bit unsigned int, got {value!r}")
    return f"{value:032X}"


def _bounded(text: str) -> bytes:
    data = text.encode("utf-8")
    if len(data) > MAX_MESSAGE_BYTES:
        raise ValueError(f"message is {len(data)} bytes; the limit is {MAX_MESSAGE_BYTES}")
    return data


def format_resumable_hello(message: ResumableHello) -> bytes:
    return _bounded(
        f"{format_message(message.hello).decode()} {RESUME_TOKEN} {_hex128(message.pad)}"
    )


def format_resumable_connect(message: ResumableConnect) -> bytes:
    return _bounded(
        f"{format_message(message.connect).decode()} {RESUME_TOKEN} "
        f"{_hex128(message.encrypted_secret)}"
    )


def format_resume(message: Resume) -> bytes:
    if not INT32_MIN <= message.session_id <= INT32_MAX:
        raise ValueError(f"session id {message.session_id} is not an int32")
    if not 1 <= message.counter <= 999_999_999:
        raise ValueError(f"counter {message.counter} is out of range 1..999999999")
    if len(message.proof) != RESUME_BITS // 8:
        raise ValueError("a proof is 16 bytes")
    _check_count(message.received)
    return _bounded(
        f"RESUME {message.session_id} {message.counter} {message.received} "
        f"{message.proof.hex().upper()}"
    )


def _check_count(count: int) -> None:
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_COUNT:
        raise ValueError(f"message count {count!r} is out of range 0..{MAX_COUNT}")


def format_resumed(message: Resumed) -> bytes:
    if not INT32_MIN <= message.client_session <= INT32_MAX:
        raise ValueError(f"client session {message.client_session} is not an int32")
    _check_count(message.received)
    return f"{message.client_session} RESUMED {message.received}".encode()


def _text_untrusted(data: bytes | bytearray | memoryview) -> str | None:
    if len(data) > MAX_MESSAGE_BYTES:
        return None
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError:
        return None


def parse_client_request_untrusted(
    data: bytes | bytearray | memoryview, *, credentials: bool
) -> Hello | ResumableHello | Resume | BadMessage:
    """What a client sent on the all-clients channel (server side), with the resume extension.

    A HELLO without ``+R`` is parsed exactly as `parse_hello_untrusted` does. Never raises.
    """
    if data[:7] == b"RESUME ":
        text = _text_untrusted(data)
        match = None if text is None else _RESUME_RE.fullmatch(text)
        if match is None:
            return BadMessage("not a RESUME")
        session_id = int(match.group(1))
        if not INT32_MIN <= session_id <= INT32_MAX:
            return BadMessage("session id out of int32 range")
        return Resume(
            session_id, int(match.group(2)), int(match.group(3)), bytes.fromhex(match.group(4))
        )
    if b" +R " in data[:MAX_MESSAGE_BYTES]:
        text = _text_untrusted(data)
        tail = None if text is None else _RESUMABLE_TAIL.fullmatch(text)
        if tail is None:
            return BadMessage("not a HELLO")
        hello = parse_hello_untrusted(tail.group(1).encode(), credentials=credentials)
        if isinstance(hello, BadMessage):
            return hello
        return ResumableHello(hello, int(tail.group(2), 16))
    return parse_hello_untrusted(data, credentials=credentials)


def parse_server_reply_untrusted(
    data: bytes | bytearray | memoryview,
) -> ResumableConnect | Resumed | Connect | AllClientsError | BadMessage:
    """A server reply on the all-clients channel (client side), with the resume extension.

    Returns `ResumableConnect`, `Resumed`, or whatever `parse_all_clients_reply_untrusted`
    returns for Echo 2.0's forms (`Connect`, `AllClientsError`, `BadMessage`). Never raises.
    """
    if b" +R " in data[:MAX_MESSAGE_BYTES]:
        text = _text_untrusted(data)
        tail = None if text is None else _RESUMABLE_TAIL.fullmatch(text)
        if tail is None:
            return BadMessage("not a CONNECT or ERROR reply")
        connect = parse_all_clients_reply_untrusted(tail.group(1).encode())
        if not isinstance(connect, Connect):
            return BadMessage("only a CONNECT carries a resume secret")
        return ResumableConnect(connect, int(tail.group(2), 16))
    if b" RESUMED " in data[:40]:
        text = _text_untrusted(data)
        match = None if text is None else _RESUMED_RE.fullmatch(text)
        if match is None:
            return BadMessage("not a RESUMED reply")
        client_session = int(match.group(1))
        if not INT32_MIN <= client_session <= INT32_MAX:
            return BadMessage("session id out of int32 range")
        return Resumed(client_session, int(match.group(2)))
    return parse_all_clients_reply_untrusted(data)


def resume_proof(secret: int, session_id: int, counter: int, received: int) -> bytes:
    """The MAC a RESUME carries: proves the secret without sending it, bound to `counter` (so
    it works once) and to `received` (so a copy cannot ask for other messages)."""
    key = secret.to_bytes(RESUME_BITS // 8, "big")
    text = f"echo-resume|{session_id}|{counter}|{received}".encode()
    return hmac.new(key, text, hashlib.sha256).digest()[: RESUME_BITS // 8]


def check_proof(secret: int, session_id: int, counter: int, received: int, proof: bytes) -> bool:
    """Constant-time comparison of `proof` with the expected MAC."""
    return hmac.compare_digest(resume_proof(secret, session_id, counter, received), proof)
