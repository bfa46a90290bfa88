"""The topics wire format (the pub/sub note): %-encoded text lines packed into UDP datagrams. Pure.

Every datagram is a sequence of lines, each ended by ``\\n``. Fields are separated by one
space; %-encoding guarantees that no field contains a space or a newline, which is what lets
several lines share one datagram (the note: "which also allows us to pack several messages
together into a single UDP packet").

====================  ===============  ==========================================================
line                  direction        meaning
====================  ===============  ==========================================================
``TOPIC``             client->server   subscribe (or refresh) TOPIC at the datagram's source
``TOPIC MESSAGE``     both             publish; the server forwards the line to TOPIC's
                                       subscribers unchanged
``TOPIC MESSAGE ID``  both             publish with a message id, for deduplication by clients
``!cookie C D``       server->client   handshake step 2: the source's cookie C, work difficulty D
``!confirm C [W]``    client->server   handshake step 3: the cookie back, with proof of work W
``!life SECONDS``     server->client   subscriptions of this datagram confirmed; estimated life
``!pad XXXX``         client->server   ignored; makes an unconfirmed request as large as the
                                       cookie it asks for (no amplification)
====================  ===============  ==========================================================

A line that begins with ``!`` is a control line; ``!`` is never a literal in an encoded field
(``%21``), so no topic can be mistaken for one. Encoding is canonical: a byte is written as
itself exactly when it is in ``LITERAL``, else as ``%XX`` with upper-case hex. Each topic thus
has one spelling, and the server can match topics by their encoded bytes without decoding.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable, Iterator

import attrs

__all__ = [
    "LITERAL",
    "MAX_FIELD",
    "CodecError",
    "Confirm",
    "Cookie",
    "Life",
    "LineKind",
    "Malformed",
    "Pad",
    "Publish",
    "Subscribe",
    "check_work",
    "decode",
    "encode",
    "format_confirm",
    "format_cookie",
    "format_life",
    "format_pad",
    "format_publish",
    "format_subscribe",
    "is_canonical",
    "make_cookie",
    "new_message_id",
    "pack",
    "parse_datagram",
    "solve_work",
    "verify_cookie",
    "work_bits",
]

#: Bytes that stand for themselves in an encoded field: RFC 3986's unreserved characters plus
#: a few that make topics readable (``lobby/eu:1@x``). Everything else, ``!`` ``%`` space and
#: newline included, is %-encoded.
LITERAL = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~/:@")

#: Longest encoded topic, message id or control argument (a message is bounded by the
#: datagram size instead).
MAX_FIELD = 255

_ENCODE_TABLE = [chr(b).encode() if b in LITERAL else b"%%%02X" % b for b in range(256)]
_HEX = b"0123456789ABCDEF"
_LITERAL_RE = re.compile(rb"[A-Za-z0-9\-._~/:@]*")
_ID_RE = re.compile(rb"[A-Za-z0-9_\-]{1,32}")
_COOKIE_RE = re.compile(rb"[0-9]{1,20}\.[0-9a-f]{24}")
_NONCE_RE = re.compile(rb"[0-9a-f]{1,32}")
_SMALL_RE = re.compile(rb"[0-9]{1,3}")
_LIFE_RE = re.compile(rb"[0-9]{1,9}(\.[0-9]{1,6})?")


class CodecError(ValueError):
    """Bytes that are not a valid field, line or datagram of the topics protocol."""


def encode(data: bytes) -> bytes:
    """``data`` %-encoded canonically (no space, newline or ``!`` in the result)."""
    if _LITERAL_RE.fullmatch(data):
        return bytes(data)
    table = _ENCODE_TABLE
    return b"".join([table[b] for b in data])


def decode(field: bytes) -> bytes:
    """Decode one canonical %-encoded field (untrusted bytes; raises only CodecError)."""
    if _LITERAL_RE.fullmatch(field):
        return bytes(field)
    out = bytearray()
    i = 0
    n = len(field)
    while i < n:
        b = field[i]
        if b == 0x25:  # '%'
            pair = field[i + 1 : i + 3]
            if len(pair) != 2 or pair[0] not in _HEX or pair[1] not in _HEX:
                raise CodecError(f"bad escape at byte {i}")
            value = int(pair, 16)
            if value in LITERAL:
                # Two spellings of one topic would be two topics on the server.
                raise CodecError(f"byte {value:#04x} must not be escaped")
            out.append(value)
            i += 3
        elif b in LITERAL:
            out.append(b)
            i += 1
        else:
            raise CodecError(f"byte {b:#04x} must be %-encoded")
    return bytes(out)


def is_canonical(field: bytes) -> bool:
    """Whether ``field`` is a canonical encoding (what `encode` produces for some bytes)."""
    if _LITERAL_RE.fullmatch(field):
        return True
    try:
        decode(field)
    except CodecError:
        return False
    return True


# --------------------------------------------------------------------------------------------
# Lines


class LineKind(enum.Enum):
    SUBSCRIBE = "subscribe"
    PUBLISH = "publish"
    COOKIE = "cookie"
    CONFIRM = "confirm"
    LIFE = "life"
    PAD = "pad"
    MALFORMED = "malformed"


@attrs.frozen
class Subscribe:
    topic: bytes  # encoded


@attrs.frozen
class Publish:
    topic: bytes  # encoded
    message: bytes  # encoded
    message_id: bytes | None
    line: bytes  # the whole line with its newline, to forward unchanged


@attrs.frozen
class Cookie:
    cookie: bytes
    difficulty: int


@attrs.frozen
class Confirm:
    cookie: bytes
    work: bytes


@attrs.frozen
class Life:
    seconds: float


@attrs.frozen
class Pad:
    pass


@attrs.frozen
class Malformed:
    """A line that is not one of the protocol's; ``reason`` names the counter it goes to."""

    reason: str
    line: bytes


Line = Subscribe | Publish | Cookie | Confirm | Life | Pad | Malformed

#: Reasons a line is malformed (each is a counter on the server and on the client).
MALFORMED_REASONS = (
    "unterminated",
    "empty",
    "bad_topic",
    "bad_message",
    "bad_message_id",
    "too_many_fields",
    "bad_control",
    "unknown_control",
)


def _parse_control(line: bytes, whole: bytes) -> Line:
    fields = line.split(b" ")
    verb = fields[0]
    args = fields[1:]
    if verb == b"!confirm":
        if len(args) in (1, 2):
            work = args[1] if len(args) == 2 else b""
            if _COOKIE_RE.fullmatch(args[0]) and (not work or _NONCE_RE.fullmatch(work)):
                return Confirm(args[0], work)
    elif verb == b"!cookie":
        if len(args) == 2 and _COOKIE_RE.fullmatch(args[0]) and _SMALL_RE.fullmatch(args[1]):
            return Cookie(args[0], int(args[1]))
    elif verb == b"!life":
        if len(args) == 1 and _LIFE_RE.fullmatch(args[0]):
            return Life(float(args[0]))
    elif verb == b"!pad":
        if len(args) <= 1:
            return Pad()
    else:
        return Malformed("unknown_control", whole)
    return Malformed("bad_control", whole)


def parse_line(line: bytes) -> Line:
    """One line without its newline (untrusted bytes; never raises)."""
    whole = line + b"\n"
    if not line:
        return Malformed("empty", whole)
    if line[0] == 0x21:  # '!'
        return _parse_control(line, whole)
    fields = line.split(b" ")
    topic = fields[0]
    if len(topic) > MAX_FIELD or not topic or not is_canonical(topic):
        return Malformed("bad_topic", whole)
    if len(fields) == 1:
        return Subscribe(topic)
    if len(fields) > 3:
        return Malformed("too_many_fields", whole)
    message = fields[1]
    if not is_canonical(message):
        return Malformed("bad_message", whole)
    message_id = fields[2] if len(fields) == 3 else None
    if message_id is not None and not _ID_RE.fullmatch(message_id):
        return Malformed("bad_message_id", whole)
    return Publish(topic, message, message_id, whole)


def parse_datagram(data: bytes) -> Iterator[Line]:
    """The lines of one datagram (untrusted bytes; never raises). O(len(data))."""
    lines = bytes(data).split(b"\n")
    last = lines.pop()
    for line in lines:
        yield parse_line(line)
    if last:
        yield Malformed("unterminated", last)


def format_subscribe(topic: bytes) -> bytes:
    """A subscribe line for the raw topic ``topic`` (encoded here)."""
    encoded = encode(topic)
    _check_topic(encoded)
    return encoded + b"\n"


def format_publish(topic: bytes, message: bytes, message_id: bytes | None = None) -> bytes:
    encoded = encode(topic)
    _check_topic(encoded)
    if message_id is not None and not _ID_RE.fullmatch(message_id):
        raise CodecError("a message id is 1-32 characters of A-Z a-z 0-9 _ -")
    line = encoded + b" " + encode(message)
    if message_id is not None:
        line += b" " + message_id
    return line + b"\n"


def _check_topic(encoded: bytes) -> None:
    if not encoded:
        raise CodecError("a topic must not be empty")
    if len(encoded) > MAX_FIELD:
        raise CodecError(f"a topic is at most {MAX_FIELD} bytes once %-encoded")


def format_cookie(cookie: bytes, difficulty: int) -> bytes:
    return b"!cookie %s %d\n" % (cookie, difficulty)


def format_confirm(cookie: bytes, work: bytes = b"") -> bytes:
    return b"!confirm %s %s\n" % (cookie, work) if work else b"!confirm %s\n" % cookie


def format_life(seconds: float) -> bytes:
    return b"!life %d\n" % max(0, int(seconds))


def format_pad(size: int) -> bytes:
    """A pad line of exactly ``size`` bytes (at least 5: ``!pad\\n``)."""
    if size <= 5:
        return b"!pad\n"
    return b"!pad " + b"x" * (size - 6) + b"\n"


def new_message_id() -> bytes:
    """A random message id (96 bits: collisions among deduplicated messages are negligible)."""
    return secrets.token_hex(12).encode()


def pack(lines: Iterable[bytes], max_size: int) -> list[bytes]:
    """Lines (each ending in a newline) packed in order into datagrams of at most ``max_size``.

    A line longer than ``max_size`` cannot be sent and raises CodecError: the caller (a local
    publisher) must shorten its message.
    """
    datagrams: list[bytes] = []
    current: list[bytes] = []
    size = 0
    for line in lines:
        if len(line) > max_size:
            raise CodecError(f"a line of {len(line)} bytes does not fit a {max_size}-byte datagram")
        if size + len(line) > max_size:
            datagrams.append(b"".join(current))
            current, size = [], 0
        current.append(line)
        size += len(line)
    if current:
        datagrams.append(b"".join(current))
    return datagrams


# --------------------------------------------------------------------------------------------
# Handshake: stateless cookies (the note's first fix) and proof of work (second fix)


def make_cookie(secret: bytes, epoch: int, host: str, port: int) -> bytes:
    """The cookie of source ``host:port`` in ``epoch``: ``EPOCH.MAC``.

    Keyed by the server's secret, so only the server makes or checks it and it keeps no
    state per source; bound to the source address, so only whoever receives at that address
    can confirm (a forger who does not see the victim's traffic cannot).
    """
    mac = hmac.new(secret, b"%d|%s|%d" % (epoch, host.encode(), port), hashlib.blake2b)
    return b"%d.%s" % (epoch, mac.hexdigest()[:24].encode())


def verify_cookie(secret: bytes, cookie: bytes, epochs: Iterable[int], host: str, port: int) -> int:
    """The epoch of a valid ``cookie`` for the source, or -1."""
    epoch_text = cookie.split(b".", 1)[0]
    if not epoch_text.isdigit():
        return -1
    epoch = int(epoch_text)
    if epoch not in set(epochs):
        return -1
    expected = make_cookie(secret, epoch, host, port)
    return epoch if hmac.compare_digest(expected, cookie) else -1


def work_bits(cookie: bytes, work: bytes) -> int:
    """Leading zero bits of SHA-256(cookie ' ' work): the work a confirm proves."""
    digest = hashlib.sha256(cookie + b" " + work).digest()
    value = int.from_bytes(digest, "big")
    return 256 - value.bit_length()


def check_work(cookie: bytes, work: bytes, difficulty: int) -> bool:
    return difficulty <= 0 or work_bits(cookie, work) >= difficulty


def solve_work(cookie: bytes, difficulty: int, start: int = 0) -> bytes:
    """A proof of work for ``cookie``: about 2**difficulty hashes (a partial hash collision)."""
    if difficulty <= 0:
        return b""
    nonce = start
    while True:
        work = b"%x" % nonce
        if work_bits(cookie, work) >= difficulty:
            return work
        nonce += 1
