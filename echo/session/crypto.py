"""Authenticated encryption of a session's messages: keys, sealing, replay window, key files.

Pure module: no trio, no clock, no sockets (key files are read and written by the two small
functions at the end, which the CLIs call; nothing else here touches a file). Every primitive
comes from the `cryptography` package; nothing cryptographic is written here.

Keys
    The server has a static X25519 key (a key file, `generate_key_file` / `load_key_file`);
    clients pin its public key, or the SHA-256 fingerprint of it (`Pin`). A client makes a
    fresh ephemeral X25519 key for every handshake and sends its public half in its HELLO; the
    server answers in its CONNECT with its static public key, 16 fresh random bytes and a
    confirmation tag. Both ends compute X25519(ephemeral, static) and derive, with HKDF-SHA256
    (salt: the SHA-256 of the handshake transcript, `Transcript`), three 32-byte keys: client
    to server, server to client, and the confirmation key. The transcript holds both public
    keys, the server's random bytes, the client's HELLO pad and all-clients session id, the
    duologue's session id and ports: keys are bound to this session and this handshake, and
    an attacker who changes any of it makes the two ends derive different keys.

Nonces never repeat under one key
    A message is sealed with ChaCha20-Poly1305 under its direction's key, the nonce being a
    64-bit counter of that direction (4 zero bytes, then the counter, big-endian) that starts
    at 0 and only grows (`Sealer`); it is sent in front of the ciphertext. A (key, nonce) pair
    could repeat only if one key were used by two sealers, or a sealer's counter went back.
    Neither happens: the key of a session is derived from the client's ephemeral key, which
    is made fresh for each handshake and never stored, and from the server's 16 fresh random
    bytes; so a restarted server, a client that connects again, or a second session of the
    same client, gets keys no earlier session had (both sides would have to repeat 16 and 32
    random bytes). A session that resumes on a new path keeps its keys and its `Sealer`s, so
    counters go on from where they were; what a resume sends again are the same sealed bytes
    (same key, nonce and plaintext), which the peer has not accepted before (it counts what it
    read), so nothing new is ever sealed under an old nonce. This is the mistake netcode 1.4.0
    fixed (a counter that started again after a server restart under a key that did not change).
    A `Sealer` refuses to go past 2**64 - 1 messages.

Replay window
    The receiving end keeps the highest counter it accepted and a bitmap of the
    `REPLAY_WINDOW` counters below it (as DTLS and netcode do). A counter already seen is
    `Replayed`; one older than the window is `TooOld`; anything that fails authentication is
    `Forged` (checked first, whatever its counter). Only an authentic message moves the
    window, so forgeries cannot push it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import stat
import struct
from collections.abc import Callable
from typing import Final

import attrs
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

#: what is bound into every derivation: change it and nothing interoperates by accident
PROTOCOL_LABEL: Final = b"echo session v1: X25519, HKDF-SHA256, ChaCha20-Poly1305"
KEY_BYTES: Final = 32
SERVER_NONCE_BYTES: Final = 16
CONFIRM_BYTES: Final = 16
COUNTER_BYTES: Final = 8
TAG_BYTES: Final = 16
#: bytes a sealed message is longer than its plaintext
OVERHEAD: Final = COUNTER_BYTES + TAG_BYTES
MAX_COUNTER: Final = 2**64 - 1
#: counters below the highest accepted one that may still arrive (once each)
REPLAY_WINDOW: Final = 1024
FINGERPRINT_HEX: Final = 64
SHORT_FINGERPRINT_HEX: Final = 16

_COUNTER: Final = struct.Struct(">Q")
_NONCE_PREFIX: Final = b"\x00\x00\x00\x00"


class CryptoError(Exception):
    """Base of everything this module raises."""


class BadKey(CryptoError):
    """A public key that cannot be used: wrong length, or one of low order (all-zero secret)."""


class KeyFileError(CryptoError):
    """A key file that cannot be read, written or trusted (its message says which and why)."""


class BadPin(CryptoError):
    """A `--server-key` value that is neither a public key nor a full fingerprint."""


class OpenError(CryptoError):
    """A received message that is refused; `reason` is what the session closes with."""

    reason = "message refused"

    def __init__(self, detail: str = "") -> None:
        super().__init__(f"{self.reason}: {detail}" if detail else self.reason)
        self.detail = detail


class Forged(OpenError):
    """Failed authentication: changed in flight, made up, or sealed under another key."""

    reason = "forged message"


class Replayed(OpenError):
    """Authentic, but its counter was accepted before."""

    reason = "replayed message"


class TooOld(OpenError):
    """Its counter is older than the replay window: reordered beyond it, or an old replay."""

    reason = "message older than the replay window"


class CounterExhausted(CryptoError):
    """A `Sealer` sealed 2**64 messages: the session must end (it never will in practice)."""


# ---------------------------------------------------------------- public keys and fingerprints


def check_public_key(public: bytes) -> bytes:
    """`public` if it is 32 bytes; raises BadKey otherwise."""
    if not isinstance(public, bytes | bytearray) or len(public) != KEY_BYTES:
        raise BadKey(f"an X25519 public key is {KEY_BYTES} bytes")
    return bytes(public)


def public_key_text(public: bytes) -> str:
    """The printable form of a public key: 52 characters of lowercase base32, no padding."""
    return base64.b32encode(check_public_key(public)).decode("ascii").rstrip("=").lower()


def fingerprint(public: bytes) -> str:
    """SHA-256 of the public key, 64 lowercase hex digits: what a client may pin."""
    return hashlib.sha256(check_public_key(public)).hexdigest()


def short_fingerprint(public: bytes) -> str:
    """The first 16 hex digits of `fingerprint`, for logs and eyes (too short to pin)."""
    return fingerprint(public)[:SHORT_FINGERPRINT_HEX]


@attrs.frozen
class Pin:
    """What a client trusts: the server's public key, or its full SHA-256 fingerprint."""

    fingerprint: str

    @classmethod
    def parse(cls, text: str) -> Pin:
        """From `public_key_text` (52 base32 characters) or `fingerprint` (64 hex digits),
        with or without a ``SHA256:`` prefix, any case; raises BadPin otherwise."""
        value = text.strip()
        if value[:7].upper() == "SHA256:":
            value = value[7:]
        lowered = value.lower()
        if len(lowered) == FINGERPRINT_HEX and all(c in "0123456789abcdef" for c in lowered):
            return cls(lowered)
        if len(value) == 52:
            try:
                public = base64.b32decode(value.upper() + "====")
            except (ValueError, binascii.Error):
                public = b""
            if len(public) == KEY_BYTES:
                return cls(fingerprint(public))
        if len(lowered) == SHORT_FINGERPRINT_HEX:
            raise BadPin(
                "that is the short fingerprint, too short to pin: give the public key "
                "(52 characters) or the full fingerprint (64 hex digits)"
            )
        raise BadPin(
            "a server key is its public key (52 base32 characters, as echo-server prints it) "
            "or its SHA-256 fingerprint (64 hex digits)"
        )

    def matches(self, public: bytes) -> bool:
        """Is `public` the pinned key? (Constant time; False for a malformed key.)"""
        try:
            actual = fingerprint(public)
        except BadKey:
            return False
        return hmac.compare_digest(actual, self.fingerprint)

    @property
    def short(self) -> str:
        return self.fingerprint[:SHORT_FINGERPRINT_HEX]


# ---------------------------------------------------------------- the server's static key


class ServerKey:
    """The server's static X25519 key pair."""

    def __init__(self, private: X25519PrivateKey) -> None:
        self._private = private
        self.public = private.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )

    @classmethod
    def generate(cls) -> ServerKey:
        return cls(X25519PrivateKey.generate())

    @classmethod
    def from_bytes(cls, data: bytes) -> ServerKey:
        """From a key file's contents: PKCS#8 PEM, or the raw 32-byte private key."""
        if data.lstrip().startswith(b"-----BEGIN"):
            try:
                key = serialization.load_pem_private_key(data, password=None)
            except (ValueError, TypeError) as error:
                raise KeyFileError(f"not a readable PEM private key ({error})") from None
            if not isinstance(key, X25519PrivateKey):
                raise KeyFileError(f"the PEM key is {type(key).__name__}, not an X25519 key")
            return cls(key)
        if len(data) == KEY_BYTES:
            return cls(X25519PrivateKey.from_private_bytes(data))
        raise KeyFileError(
            f"neither a PEM private key nor a raw {KEY_BYTES}-byte X25519 key ({len(data)} bytes)"
        )

    def to_pem(self) -> bytes:
        return self._private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    @property
    def public_text(self) -> str:
        return public_key_text(self.public)

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.public)

    @property
    def short_fingerprint(self) -> str:
        return short_fingerprint(self.public)

    def exchange(self, peer_public: bytes) -> bytes:
        return _exchange(self._private, peer_public)

    def __repr__(self) -> str:  # never the private half
        return f"ServerKey(fingerprint={self.short_fingerprint})"


def _exchange(private: X25519PrivateKey, peer_public: bytes) -> bytes:
    try:
        peer = X25519PublicKey.from_public_bytes(check_public_key(peer_public))
        # cryptography refuses a low-order point (the shared secret would be all zeros).
        return private.exchange(peer)
    except ValueError as error:
        raise BadKey(f"unusable X25519 public key ({error})") from None


# ---------------------------------------------------------------- the handshake


@attrs.frozen
class Transcript:
    """Everything the two ends agreed on in the handshake; the keys are bound to all of it."""

    client_public: bytes
    server_public: bytes
    server_nonce: bytes
    hello_key: int  # the HELLO's u32 pad
    client_session: int  # the client's all-clients publication's session id (int32)
    session_id: int  # the duologue's session id (int32)
    data_port: int
    control_port: int

    def digest(self) -> bytes:
        """SHA-256 of a fixed-layout encoding (lengths are fixed, so it is unambiguous)."""
        check_public_key(self.client_public)
        check_public_key(self.server_public)
        if len(self.server_nonce) != SERVER_NONCE_BYTES:
            raise BadKey(f"the server's random bytes are {SERVER_NONCE_BYTES} bytes")
        fields = struct.pack(
            ">IiiHH",
            self.hello_key,
            self.client_session,
            self.session_id,
            self.data_port,
            self.control_port,
        )
        return hashlib.sha256(
            PROTOCOL_LABEL + self.client_public + self.server_public + self.server_nonce + fields
        ).digest()


@attrs.frozen
class SessionKeys:
    """One end's keys: `send` seals what it sends, `receive` opens what it receives."""

    send: bytes = attrs.field(repr=False)
    receive: bytes = attrs.field(repr=False)
    confirm: bytes = attrs.field(repr=False)

    def cipher(self) -> SessionCipher:
        return SessionCipher(Sealer(self.send), Opener(self.receive))


def _derive(shared: bytes, transcript: Transcript) -> tuple[bytes, bytes, bytes]:
    """(client->server, server->client, confirmation) keys."""
    okm = HKDF(
        algorithm=hashes.SHA256(),
        length=3 * KEY_BYTES,
        salt=transcript.digest(),
        info=PROTOCOL_LABEL,
    ).derive(shared)
    return okm[:KEY_BYTES], okm[KEY_BYTES : 2 * KEY_BYTES], okm[2 * KEY_BYTES :]


def confirmation(confirm_key: bytes, transcript: Transcript) -> bytes:
    """The tag in the CONNECT: proves the server computed the same keys (so holds its key)."""
    mac = hmac.new(confirm_key, b"server confirms " + transcript.digest(), hashlib.sha256)
    return mac.digest()[:CONFIRM_BYTES]


def server_nonce() -> bytes:
    """The server's fresh random bytes for one handshake (the OS's CSPRNG)."""
    return os.urandom(SERVER_NONCE_BYTES)


def server_session_keys(key: ServerKey, transcript: Transcript) -> tuple[SessionKeys, bytes]:
    """The server's keys for the session and the confirmation tag for its CONNECT.

    Raises BadKey for a client key that is malformed or of low order.
    """
    if not hmac.compare_digest(transcript.server_public, key.public):
        raise BadKey("the transcript names another server key")
    return server_keys_from_shared(key.exchange(transcript.client_public), transcript)


def server_keys_from_shared(shared: bytes, transcript: Transcript) -> tuple[SessionKeys, bytes]:
    """`server_session_keys` once the X25519 exchange is done (the server does it before it
    allocates anything, so that a bad key is refused first)."""
    c2s, s2c, confirm = _derive(shared, transcript)
    return SessionKeys(send=s2c, receive=c2s, confirm=confirm), confirmation(confirm, transcript)


def resume_secret(keys: SessionKeys) -> int:
    """The resume secret of an encrypted session (echo.session.resume), from its keys.

    In the clear the server sends the secret one-time-padded with a pad from the HELLO, which
    an on-path reader sees both halves of; in an encrypted session both ends derive it instead
    (HMAC-SHA256 of the confirmation key, 128 bits), so it never crosses the wire.
    """
    mac = hmac.new(keys.confirm, b"echo resume secret", hashlib.sha256).digest()
    return int.from_bytes(mac[:16], "big")


class HandshakeFailed(CryptoError):
    """The server's answer does not prove the pinned key (its message says how)."""


class ClientHandshake:
    """The client's half: a fresh ephemeral key for one handshake, and the pinned server key."""

    def __init__(self, pin: Pin, private: X25519PrivateKey | None = None) -> None:
        self.pin = pin
        self._private = private if private is not None else X25519PrivateKey.generate()
        self.public = self._private.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )

    def complete(self, transcript: Transcript, tag: bytes) -> SessionKeys:
        """The client's keys, once the CONNECT's key, random bytes and tag check out.

        Raises HandshakeFailed for a server key other than the pinned one, or a tag that does
        not match (someone in the middle, or a server without the private key).
        """
        if not hmac.compare_digest(transcript.client_public, self.public):
            raise HandshakeFailed("the transcript names another client key")
        if not self.pin.matches(transcript.server_public):
            raise HandshakeFailed(
                f"the server's key (fingerprint {short_fingerprint(transcript.server_public)}) "
                f"is not the pinned one ({self.pin.short})"
            )
        try:
            shared = _exchange(self._private, transcript.server_public)
        except BadKey as error:
            raise HandshakeFailed(str(error)) from None
        c2s, s2c, confirm = _derive(shared, transcript)
        if not hmac.compare_digest(confirmation(confirm, transcript), tag):
            raise HandshakeFailed(
                "the server did not prove it holds the pinned key (confirmation tag mismatch)"
            )
        return SessionKeys(send=c2s, receive=s2c, confirm=confirm)


# ---------------------------------------------------------------- sealing and opening


class Sealer:
    """Seals one direction's messages; its counter is the nonce and never goes back."""

    __slots__ = ("_aead", "counter")

    def __init__(self, key: bytes) -> None:
        self._aead = ChaCha20Poly1305(key)
        #: the counter the next message gets
        self.counter = 0

    def seal(self, plaintext: bytes) -> bytes:
        """counter (8 bytes, big-endian) + ChaCha20-Poly1305 ciphertext and tag."""
        counter = self.counter
        if counter > MAX_COUNTER:
            raise CounterExhausted("2**64 messages sealed under one key")
        self.counter = counter + 1
        head = _COUNTER.pack(counter)
        return head + self._aead.encrypt(_NONCE_PREFIX + head, plaintext, None)


class ReplayWindow:
    """Which counters were accepted: the highest, and a bitmap of the `size` below it."""

    __slots__ = ("_mask", "bitmap", "highest", "size")

    def __init__(self, size: int = REPLAY_WINDOW) -> None:
        if size < 1:
            raise ValueError(f"a replay window holds at least 1 counter, got {size}")
        self.size = size
        self._mask = (1 << size) - 1
        #: the highest counter accepted, -1 before the first
        self.highest = -1
        #: bit i set: counter `highest - i` was accepted
        self.bitmap = 0

    def check(self, counter: int) -> None:
        """Raises Replayed or TooOld if `counter` may not be accepted now (changes nothing)."""
        behind = self.highest - counter
        if behind < 0:
            return
        if behind >= self.size:
            raise TooOld(f"counter {counter}, {behind} behind the highest")
        if (self.bitmap >> behind) & 1:
            raise Replayed(f"counter {counter}")

    def accept(self, counter: int) -> None:
        """Record `counter` (call `check` first, and only for an authentic message)."""
        ahead = counter - self.highest
        if ahead > 0:
            self.bitmap = ((self.bitmap << ahead) | 1) & self._mask
            self.highest = counter
        else:
            self.bitmap |= 1 << -ahead


class Opener:
    """Opens one direction's messages: authenticates, then refuses what the window has seen."""

    __slots__ = ("_aead", "window")

    def __init__(self, key: bytes, window: int = REPLAY_WINDOW) -> None:
        self._aead = ChaCha20Poly1305(key)
        self.window = ReplayWindow(window)

    def open(self, data: bytes | bytearray | memoryview) -> bytes:
        """The plaintext of a sealed message; raises Forged, Replayed or TooOld."""
        if len(data) < OVERHEAD:
            raise Forged(f"{len(data)} bytes, shorter than a sealed message")
        if type(data) is not bytes:
            data = bytes(data)
        head = data[:COUNTER_BYTES]
        # Authenticate first, so that the reason is right: made-up bytes with an old counter
        # are Forged, not Replayed (DTLS checks the window first to save the work; a session
        # closes at its first refusal, so there is no work to save here).
        try:
            plaintext = self._aead.decrypt(_NONCE_PREFIX + head, data[COUNTER_BYTES:], None)
        except InvalidTag:
            raise Forged(f"counter {int.from_bytes(head, 'big')}") from None
        counter = int.from_bytes(head, "big")
        window = self.window
        if counter > window.highest:  # the common case, in order: nothing to check
            window.accept(counter)
        else:
            window.check(counter)
            window.accept(counter)
        return plaintext


class SessionCipher:
    """Both directions of one end of a session: `seal` and `open` are its sealer's and its
    opener's own (bound once, not wrapped: they run once a message)."""

    __slots__ = ("open", "opener", "seal", "sealer")

    def __init__(self, sealer: Sealer, opener: Opener) -> None:
        self.sealer = sealer
        self.opener = opener
        self.seal: Callable[[bytes], bytes] = sealer.seal
        self.open: Callable[[bytes | bytearray | memoryview], bytes] = opener.open


# ---------------------------------------------------------------- key files


def generate_key_file(path: str | os.PathLike[str]) -> ServerKey:
    """Write a new server key to `path` (PKCS#8 PEM, mode 0600); refuses to overwrite."""
    key = ServerKey.generate()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise KeyFileError(f"{os.fspath(path)} exists; not overwriting a key") from None
    except OSError as error:
        raise KeyFileError(f"cannot create {os.fspath(path)}: {error.strerror}") from None
    with os.fdopen(fd, "wb") as handle:
        os.fchmod(handle.fileno(), 0o600)  # whatever the umask said
        handle.write(key.to_pem())
    return key


def load_key_file(path: str | os.PathLike[str]) -> ServerKey:
    """The server key in `path`; refuses a file that others than its owner may read or write
    (as ssh does: a private key readable by others is not private)."""
    name = os.fspath(path)
    try:
        with open(name, "rb") as handle:
            mode = os.fstat(handle.fileno()).st_mode
            data = handle.read(64 * 1024)
    except OSError as error:
        raise KeyFileError(f"cannot read key file {name}: {error.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyFileError(
            f"key file {name} is accessible by others (mode {stat.S_IMODE(mode):04o}); "
            f"run: chmod 600 {name}"
        )
    try:
        return ServerKey.from_bytes(data)
    except KeyFileError as error:
        raise KeyFileError(f"key file {name}: {error}") from None
