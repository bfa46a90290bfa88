"""Echo 2.0 messages: parse and format (the io7m Aeron guide §4.4 and its example code).

Every message is one UTF-8 string carried as one transport message. The grammar is the io7m
guide's Java regexes applied with ``Matcher.matches()`` (the whole string must match), made
strict where the guide's code was lax or crashed:

================  ============================================  =====================
channel           wire form                                     record
================  ============================================  =====================
all-clients ->S   ``HELLO <key: u32 uppercase hex, 1-8 digits>``  `Hello`
all-clients ->S   ``HELLO <key> <credentials: base64url>``      `Hello` (session extension)
S-> all-clients   ``<session> CONNECT <port> <port> <u32 hex>``   `Connect`
S-> all-clients   ``<session> ERROR <message>``                   `AllClientsError`
duologue (both)   ``ECHO <text>``                                 `Echo`
duologue S->C     ``ERROR <message>``                             `DuologueError`
================  ============================================  =====================

``<session>`` is a signed int32 in canonical decimal (Java ``Integer.toString``); ports are
1..65535; ``<text>`` and ``<message>`` may hold any character Java's ``.`` matches, i.e. anything
but ``\\n \\r \\u0085 \\u2028 \\u2029``. A message longer than `MAX_MESSAGE_BYTES` (the guide's
1024-byte send buffer, which it never bounds-checked) is bad; `format_message` refuses to make one.

The ``parse_*_untrusted`` functions take bytes straight from the network. They never raise:
anything that is not exactly one of the accepted forms comes back as a `BadMessage` value, and
they cost O(len(data)) (the length check comes first, and every regex is linear).

The session library (`echo.session`) extends HELLO for servers that check credentials at
admission: ``HELLO <key> <credentials>``, the opaque credential bytes in unpadded base64url
(RFC 4648 §5). A client without credentials sends the Echo 2.0 form byte for byte, and a server
without an admission hook parses HELLO exactly as Echo 2.0 does (`parse_server_message_untrusted`);
only `parse_hello_untrusted(..., credentials=True)` accepts the extension.

Pure module: no trio, no clock, no I/O.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Final, TypeAlias

import attrs

# The stream id the guide's code uses for every channel.
ECHO_STREAM_ID: Final = 0x2044F002
# Duologue session ids are chosen by the server from this range; the transport's automatically
# assigned session ids must stay outside it (i.e. <= 0) so they never collide (the guide §4.5).
RESERVED_SESSION_LOW: Final = 1
RESERVED_SESSION_HIGH: Final = 2147483647
# The guide's send buffer (its code's constant); we bound both directions by it.
MAX_MESSAGE_BYTES: Final = 1024

ERROR_BAD_MESSAGE: Final = "bad message"
ERROR_SERVER_FULL: Final = "server full"
ERROR_TOO_MANY_FOR_IP: Final = "too many connections for IP address"
ERROR_SHUTTING_DOWN: Final = "server shutting down"

INT32_MIN: Final = -(2**31)
INT32_MAX: Final = 2**31 - 1
U32_MAX: Final = 2**32 - 1

# Java's `.` without DOTALL/UNIX_LINES: every code point except these line terminators.
_JAVA_DOT: Final = "[^\n\r\u0085\u2028\u2029]"
# Canonical Integer.toString form; at most 10 digits keeps int() cheap before the range check.
_SESSION: Final = r"(0|-?[1-9][0-9]{0,9})"
_PORT: Final = r"([0-9]{1,5})"
_U32_HEX: Final = r"([0-9A-F]{1,8})"

_HELLO_RE: Final = re.compile(r"HELLO " + _U32_HEX)
# Unpadded base64url: what a credential (a signed ticket, a token) looks like on the wire.
_HELLO_CREDENTIALS_RE: Final = re.compile(r"HELLO " + _U32_HEX + r" ([A-Za-z0-9_-]+)")
_ECHO_RE: Final = re.compile(r"ECHO (" + _JAVA_DOT + r"*)")
_ERROR_RE: Final = re.compile(r"ERROR (" + _JAVA_DOT + r"*)")
_CONNECT_RE: Final = re.compile(_SESSION + r" CONNECT " + _PORT + " " + _PORT + " " + _U32_HEX)
_ALL_CLIENTS_ERROR_RE: Final = re.compile(_SESSION + r" ERROR (" + _JAVA_DOT + r"*)")
_LINE_TERMINATORS: Final = re.compile("[\n\r\u0085\u2028\u2029]")


@attrs.frozen
class Hello:
    """Client -> server on the all-clients channel: introduces the client and carries its pad."""

    key: int  # u32 one-time pad (the guide §4.3); fresh per connection attempt
    #: opaque bytes for the server's admission hook (session extension); empty in Echo 2.0
    credentials: bytes = b""


@attrs.frozen
class Connect:
    """Server -> all clients: the client with `client_session` should open this duologue."""

    client_session: int  # int32: session id of the client's all-clients publication
    data_port: int  # the duologue subscription's port (client publishes here)
    control_port: int  # the duologue publication's MDC control port (client subscribes here)
    encrypted_session: int  # u32: duologue session id XOR the client's pad


@attrs.frozen
class AllClientsError:
    """Server -> all clients: the client with `client_session` was refused."""

    client_session: int
    message: str


@attrs.frozen
class Echo:
    """Duologue message in either direction; the server sends `text` back unchanged."""

    text: str


@attrs.frozen
class DuologueError:
    """Server -> client on a duologue; the server closes the duologue after sending it."""

    message: str


@attrs.frozen
class BadMessage:
    """What a parser returns for input that is not an accepted message; `reason` is for logs."""

    reason: str


Message: TypeAlias = Hello | Connect | AllClientsError | Echo | DuologueError


def encrypt_session(session: int, pad: int) -> int:
    """One-time-pad a duologue session id (the guide §4.3): the int32 `session` as u32, XOR `pad`.

    Raises ValueError if `session` is not an int32 or `pad` not a u32.
    """
    _check_range("session", session, INT32_MIN, INT32_MAX)
    _check_range("pad", pad, 0, U32_MAX)
    return (session & U32_MAX) ^ pad


def decrypt_session(encrypted: int, pad: int) -> int:
    """Undo `encrypt_session`: returns the signed int32 session id.

    Raises ValueError if either argument is not a u32.
    """
    _check_range("encrypted", encrypted, 0, U32_MAX)
    _check_range("pad", pad, 0, U32_MAX)
    return _to_int32(encrypted ^ pad)


def format_message(msg: Message) -> bytes:
    """The UTF-8 wire form of `msg`.

    Raises ValueError for a record that would not parse back as itself: out-of-range numbers,
    a line terminator in text, text that cannot be encoded as UTF-8 (lone surrogates), or an
    encoding longer than MAX_MESSAGE_BYTES.
    """
    if isinstance(msg, Hello):
        _check_range("key", msg.key, 0, U32_MAX)
        text = f"HELLO {msg.key:X}"
        if msg.credentials:
            if not isinstance(msg.credentials, bytes):
                raise ValueError("credentials must be bytes")
            text += " " + base64.urlsafe_b64encode(msg.credentials).decode("ascii").rstrip("=")
    elif isinstance(msg, Connect):
        _check_range("client_session", msg.client_session, INT32_MIN, INT32_MAX)
        _check_range("data_port", msg.data_port, 1, 65535)
        _check_range("control_port", msg.control_port, 1, 65535)
        _check_range("encrypted_session", msg.encrypted_session, 0, U32_MAX)
        text = (
            f"{msg.client_session} CONNECT {msg.data_port} {msg.control_port} "
            f"{msg.encrypted_session:X}"
        )
    elif isinstance(msg, AllClientsError):
        _check_range("client_session", msg.client_session, INT32_MIN, INT32_MAX)
        _check_line("message", msg.message)
        text = f"{msg.client_session} ERROR {msg.message}"
    elif isinstance(msg, Echo):
        _check_line("text", msg.text)
        text = f"ECHO {msg.text}"
    elif isinstance(msg, DuologueError):
        _check_line("message", msg.message)
        text = f"ERROR {msg.message}"
    else:
        raise TypeError(f"not an Echo 2.0 message: {msg!r}")
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"message is not encodable as UTF-8: {exc.reason}") from None
    if len(data) > MAX_MESSAGE_BYTES:
        raise ValueError(f"message is {len(data)} bytes; the limit is {MAX_MESSAGE_BYTES}")
    return data


def parse_server_message_untrusted(data: bytes | bytearray | memoryview) -> Hello | BadMessage:
    """Parse what a client sent on the all-clients channel (server side). Never raises."""
    text = _decode(data)
    if isinstance(text, BadMessage):
        return text
    m = _HELLO_RE.fullmatch(text)
    if m is None:
        return BadMessage("not a HELLO")
    # At most 8 hex digits, so the value is always <= 0xFFFFFFFF: the guide's parseUnsignedInt
    # overflow exception (in the guide's code) cannot happen here.
    return Hello(int(m.group(1), 16))


def parse_hello_untrusted(
    data: bytes | bytearray | memoryview, *, credentials: bool
) -> Hello | BadMessage:
    """Parse a HELLO (server side), with the credentials extension if `credentials`. Never raises.

    With `credentials=False` this is `parse_server_message_untrusted`: Echo 2.0's grammar only.
    """
    if not credentials:
        return parse_server_message_untrusted(data)
    text = _decode(data)
    if isinstance(text, BadMessage):
        return text
    m = _HELLO_RE.fullmatch(text)
    if m is not None:
        return Hello(int(m.group(1), 16))
    m = _HELLO_CREDENTIALS_RE.fullmatch(text)
    if m is None:
        return BadMessage("not a HELLO")
    encoded = m.group(2)
    if len(encoded) % 4 == 1:
        return BadMessage("credentials are not base64url")
    try:
        raw = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
    except (binascii.Error, ValueError):  # pragma: no cover - the regex admits only the alphabet
        return BadMessage("credentials are not base64url")
    return Hello(int(m.group(1), 16), raw)


def parse_all_clients_reply_untrusted(
    data: bytes | bytearray | memoryview,
) -> Connect | AllClientsError | BadMessage:
    """Parse a server reply on the all-clients channel (client side). Never raises.

    The caller still has to compare `client_session` with its own session: replies to every
    client are broadcast on this channel (the guide §4.3).
    """
    text = _decode(data)
    if isinstance(text, BadMessage):
        return text
    m = _CONNECT_RE.fullmatch(text)
    if m is not None:
        session = int(m.group(1))
        data_port = int(m.group(2))
        control_port = int(m.group(3))
        if not INT32_MIN <= session <= INT32_MAX:
            return BadMessage("session id out of int32 range")
        if not (1 <= data_port <= 65535 and 1 <= control_port <= 65535):
            return BadMessage("port out of range 1..65535")
        return Connect(session, data_port, control_port, int(m.group(4), 16))
    m = _ALL_CLIENTS_ERROR_RE.fullmatch(text)
    if m is not None:
        session = int(m.group(1))
        if not INT32_MIN <= session <= INT32_MAX:
            return BadMessage("session id out of int32 range")
        return AllClientsError(session, m.group(2))
    return BadMessage("not a CONNECT or ERROR reply")


def parse_duologue_request_untrusted(data: bytes | bytearray | memoryview) -> Echo | BadMessage:
    """Parse what a client sent on its duologue (server side). Never raises."""
    text = _decode(data)
    if isinstance(text, BadMessage):
        return text
    m = _ECHO_RE.fullmatch(text)
    if m is None:
        return BadMessage("not an ECHO")
    return Echo(m.group(1))


def parse_duologue_reply_untrusted(
    data: bytes | bytearray | memoryview,
) -> Echo | DuologueError | BadMessage:
    """Parse what the server sent on a duologue (client side). Never raises."""
    text = _decode(data)
    if isinstance(text, BadMessage):
        return text
    m = _ECHO_RE.fullmatch(text)
    if m is not None:
        return Echo(m.group(1))
    m = _ERROR_RE.fullmatch(text)
    if m is not None:
        return DuologueError(m.group(1))
    return BadMessage("not an ECHO or ERROR")


def _decode(data: bytes | bytearray | memoryview) -> str | BadMessage:
    # Length first, so a hostile datagram costs at most MAX_MESSAGE_BYTES of decoding.
    if len(data) > MAX_MESSAGE_BYTES:
        return BadMessage(f"longer than {MAX_MESSAGE_BYTES} bytes")
    try:
        # Strict: Java would have substituted U+FFFD; we refuse rather than echo mangled text.
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError:
        return BadMessage("invalid UTF-8")


def _to_int32(value: int) -> int:
    return value - 2**32 if value > INT32_MAX else value


def _check_range(name: str, value: int, low: int, high: int) -> None:
    # bool is an int subclass; True as a port is a caller bug, not port 1.
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an int, not {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{name} {value} is out of range {low}..{high}")


def _check_line(name: str, value: str) -> None:
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a str, not {type(value).__name__}")
    if _LINE_TERMINATORS.search(value) is not None:
        raise ValueError(f"{name} must not contain a line terminator (the wire regex uses `.`)")
