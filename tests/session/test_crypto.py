"""echo.session.crypto: keys, the handshake's key agreement, sealing, the replay window, key
files. Pure: no sockets."""

from __future__ import annotations

import os
import stat

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from echo.session import crypto
from echo.session.crypto import (
    OVERHEAD,
    REPLAY_WINDOW,
    BadKey,
    BadPin,
    ClientHandshake,
    CounterExhausted,
    Forged,
    HandshakeFailed,
    KeyFileError,
    Opener,
    Pin,
    Replayed,
    ReplayWindow,
    Sealer,
    ServerKey,
    TooOld,
    Transcript,
    server_session_keys,
)

KEY_A = bytes(range(32))
KEY_B = bytes(range(1, 33))

# Curve25519 points of small order (RFC 7748 §6.1 says to refuse the all-zero result).
LOW_ORDER = [
    bytes(32),
    bytes([1]) + bytes(31),
    bytes.fromhex("e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800"),
    bytes.fromhex("5f9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224eddd09f1157"),
    bytes.fromhex("ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f"),
]


def transcript_for(client: ClientHandshake, server: ServerKey, **changes: object) -> Transcript:
    fields: dict[str, object] = dict(
        client_public=client.public,
        server_public=server.public,
        server_nonce=b"\x07" * 16,
        hello_key=0xDEADBEEF,
        client_session=-5,
        session_id=123456,
        data_port=9010,
        control_port=9011,
    )
    fields.update(changes)
    return Transcript(**fields)  # type: ignore[arg-type]


def handshake(**changes: object) -> tuple[crypto.SessionKeys, crypto.SessionKeys]:
    server = ServerKey.generate()
    client = ClientHandshake(Pin.parse(server.public_text))
    transcript = transcript_for(client, server, **changes)
    server_keys, tag = server_session_keys(server, transcript)
    return client.complete(transcript, tag), server_keys


# ---------------------------------------------------------------- key agreement


def test_both_ends_derive_mirrored_keys() -> None:
    client_keys, server_keys = handshake()
    assert client_keys.send == server_keys.receive
    assert client_keys.receive == server_keys.send
    assert client_keys.send != client_keys.receive
    assert len({client_keys.send, client_keys.receive, client_keys.confirm}) == 3
    client, server = client_keys.cipher(), server_keys.cipher()
    assert server.open(client.seal(b"ECHO hi")) == b"ECHO hi"
    assert client.open(server.seal(b"ECHO back")) == b"ECHO back"


def test_every_transcript_field_changes_the_keys() -> None:
    server = ServerKey.generate()
    client = ClientHandshake(Pin(server.fingerprint))
    base = transcript_for(client, server)
    keys, _ = server_session_keys(server, base)
    for field, value in [
        ("server_nonce", b"\x08" * 16),
        ("hello_key", 1),
        ("client_session", 5),
        ("session_id", 123457),
        ("data_port", 9012),
        ("control_port", 9013),
    ]:
        other, _ = server_session_keys(server, transcript_for(client, server, **{field: value}))
        assert other.send != keys.send, field
        assert other.receive != keys.receive, field


def test_a_tampered_transcript_fails_the_confirmation() -> None:
    """A man in the middle who rewrites the server's random bytes (or any field) in the
    CONNECT: the client computes other keys, and the tag does not match."""
    server = ServerKey.generate()
    client = ClientHandshake(Pin(server.fingerprint))
    transcript = transcript_for(client, server)
    _, tag = server_session_keys(server, transcript)
    with pytest.raises(HandshakeFailed, match="confirmation"):
        client.complete(transcript_for(client, server, server_nonce=b"\x09" * 16), tag)
    flipped = bytes([tag[0] ^ 1]) + tag[1:]
    with pytest.raises(HandshakeFailed, match="confirmation"):
        client.complete(transcript, flipped)


def test_a_server_key_other_than_the_pinned_one_is_refused() -> None:
    real, impostor = ServerKey.generate(), ServerKey.generate()
    client = ClientHandshake(Pin(real.fingerprint))
    transcript = transcript_for(client, impostor)
    _, tag = server_session_keys(impostor, transcript)
    with pytest.raises(HandshakeFailed, match="not the pinned one") as caught:
        client.complete(transcript, tag)
    assert impostor.short_fingerprint in str(caught.value)
    assert real.short_fingerprint in str(caught.value)


def test_an_impostor_with_the_real_public_key_but_not_the_private_one_fails() -> None:
    """Someone replays the real server's public key but holds another private key: its tag
    comes from other keys."""
    real, impostor = ServerKey.generate(), ServerKey.generate()
    client = ClientHandshake(Pin(real.fingerprint))
    transcript = transcript_for(client, real)
    impostor_transcript = transcript_for(client, impostor)
    _, tag = server_session_keys(impostor, impostor_transcript)
    with pytest.raises(HandshakeFailed, match="confirmation"):
        client.complete(transcript, tag)


@pytest.mark.parametrize("point", LOW_ORDER)
def test_low_order_client_keys_are_refused(point: bytes) -> None:
    server = ServerKey.generate()
    transcript = Transcript(point, server.public, b"\0" * 16, 1, 1, 1, 1, 2)
    with pytest.raises(BadKey):
        server_session_keys(server, transcript)


@pytest.mark.parametrize("point", LOW_ORDER)
def test_a_low_order_server_key_fails_the_client(point: bytes) -> None:
    client = ClientHandshake(Pin(crypto.fingerprint(point)))
    with pytest.raises(HandshakeFailed, match="unusable"):
        client.complete(transcript_for_point(client, point), b"\0" * 16)


def transcript_for_point(client: ClientHandshake, point: bytes) -> Transcript:
    return Transcript(client.public, point, b"\0" * 16, 1, 1, 1, 1, 2)


@pytest.mark.parametrize("length", [0, 31, 33])
def test_wrong_length_keys_are_refused(length: int) -> None:
    server = ServerKey.generate()
    with pytest.raises(BadKey):
        server_session_keys(server, Transcript(b"\1" * length, server.public, b"\0" * 16,
                                               1, 1, 1, 1, 2))  # fmt: skip


def test_the_server_refuses_a_transcript_naming_another_server_key() -> None:
    server, other = ServerKey.generate(), ServerKey.generate()
    client = ClientHandshake(Pin(server.fingerprint))
    with pytest.raises(BadKey, match="another server key"):
        server_session_keys(server, transcript_for(client, other))


def test_ephemeral_keys_are_fresh_per_handshake() -> None:
    pin = Pin(ServerKey.generate().fingerprint)
    assert len({ClientHandshake(pin).public for _ in range(20)}) == 20


# ---------------------------------------------------------------- pins and fingerprints


def test_pin_accepts_the_public_key_or_the_full_fingerprint() -> None:
    key = ServerKey.generate()
    assert len(key.public_text) == 52
    for text in [
        key.public_text,
        key.public_text.upper(),
        f"  {key.public_text}\n",
        key.fingerprint,
        key.fingerprint.upper(),
        "SHA256:" + key.fingerprint,
    ]:
        pin = Pin.parse(text)
        assert pin.matches(key.public), text
        assert not pin.matches(ServerKey.generate().public)
        assert pin.short == key.short_fingerprint


@pytest.mark.parametrize("text", ["", "xyz", "0" * 63, "g" * 64, "a" * 51, "1" * 52])
def test_pin_refuses_anything_else(text: str) -> None:
    with pytest.raises(BadPin, match=r"52 base32 characters.*SHA-256 fingerprint \(64 hex"):
        Pin.parse(text)


def test_pin_refuses_the_short_fingerprint_with_a_reason() -> None:
    with pytest.raises(BadPin, match="too short to pin"):
        Pin.parse(ServerKey.generate().short_fingerprint)


def test_pin_match_of_malformed_keys_is_false() -> None:
    pin = Pin(ServerKey.generate().fingerprint)
    assert not pin.matches(b"")
    assert not pin.matches(b"\0" * 31)


def test_fingerprint_is_sha256_of_the_raw_public_key() -> None:
    import hashlib

    key = ServerKey.generate()
    assert key.fingerprint == hashlib.sha256(key.public).hexdigest()
    assert key.short_fingerprint == key.fingerprint[:16]
    assert key.fingerprint[:16] in repr(key)
    assert key.to_pem().decode() not in repr(key)


# ---------------------------------------------------------------- sealing


def test_sealed_layout_is_counter_then_ciphertext_and_tag() -> None:
    sealer = Sealer(KEY_A)
    first, second = sealer.seal(b"hello"), sealer.seal(b"hello")
    assert len(first) == len(b"hello") + OVERHEAD
    assert first[:8] == (0).to_bytes(8, "big")
    assert second[:8] == (1).to_bytes(8, "big")
    assert b"hello" not in first
    assert first[8:] != second[8:]  # same plaintext, other nonce


def test_messages_under_another_key_are_forged() -> None:
    with pytest.raises(Forged):
        Opener(KEY_B).open(Sealer(KEY_A).seal(b"x"))


@pytest.mark.parametrize("length", [0, 1, 8, OVERHEAD - 1])
def test_short_messages_are_forged(length: int) -> None:
    with pytest.raises(Forged, match="shorter"):
        Opener(KEY_A).open(b"\0" * length)


def test_an_empty_plaintext_round_trips() -> None:
    assert Opener(KEY_A).open(Sealer(KEY_A).seal(b"")) == b""


def test_a_sealer_refuses_to_wrap_its_counter() -> None:
    sealer = Sealer(KEY_A)
    sealer.counter = crypto.MAX_COUNTER
    last = sealer.seal(b"last")
    assert last[:8] == b"\xff" * 8
    with pytest.raises(CounterExhausted, match="2\\*\\*64 messages"):
        sealer.seal(b"one too many")
    with pytest.raises(CounterExhausted):
        sealer.seal(b"still not")


def test_a_forgery_does_not_move_the_window() -> None:
    sealer, opener = Sealer(KEY_A), Opener(KEY_A)
    forged = (5000).to_bytes(8, "big") + b"\0" * 20
    with pytest.raises(Forged):
        opener.open(forged)
    assert opener.window.highest == -1
    assert opener.open(sealer.seal(b"first")) == b"first"


def test_replayed_and_too_old_messages_are_refused_with_their_reason() -> None:
    sealer, opener = Sealer(KEY_A), Opener(KEY_A)
    sealed = [sealer.seal(b"%d" % i) for i in range(REPLAY_WINDOW + 2)]
    opener.open(sealed[0])
    with pytest.raises(Replayed) as replayed:
        opener.open(sealed[0])
    assert replayed.value.reason == "replayed message"
    opener.open(sealed[REPLAY_WINDOW + 1])
    # sealed[1] is now REPLAY_WINDOW behind the highest: beyond the window.
    with pytest.raises(TooOld) as old:
        opener.open(sealed[1])
    assert "replay window" in old.value.reason
    # sealed[2] is REPLAY_WINDOW - 1 behind: still inside, accepted once.
    assert opener.open(sealed[2]) == b"2"
    with pytest.raises(Replayed):
        opener.open(sealed[2])


# ---------------------------------------------------------------- properties


@given(st.lists(st.binary(max_size=1100), min_size=1, max_size=20))
def test_round_trip(messages: list[bytes]) -> None:
    sealer, opener = Sealer(KEY_A), Opener(KEY_A)
    assert [opener.open(sealer.seal(m)) for m in messages] == messages


@given(st.binary(max_size=200), st.data())
def test_any_bit_flip_fails(message: bytes, data: st.DataObject) -> None:
    sealed = Sealer(KEY_A).seal(message)
    bit = data.draw(st.integers(0, 8 * len(sealed) - 1))
    flipped = bytearray(sealed)
    flipped[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(Forged):
        Opener(KEY_A).open(bytes(flipped))


@given(st.binary(max_size=64), st.integers(1, OVERHEAD + 64))
def test_truncation_fails(message: bytes, cut: int) -> None:
    sealed = Sealer(KEY_A).seal(message)
    with pytest.raises(Forged):
        Opener(KEY_A).open(sealed[: max(0, len(sealed) - cut)])


@given(st.integers(1, 300))
def test_nonces_never_repeat_under_one_key(count: int) -> None:
    sealer = Sealer(KEY_A)
    heads = [sealer.seal(b"")[:8] for _ in range(count)]
    assert len(set(heads)) == count
    assert [int.from_bytes(h, "big") for h in heads] == list(range(count))


@settings(max_examples=200)
@given(st.permutations(list(range(40))), st.lists(st.integers(0, 39), max_size=20))
def test_reorder_within_the_window_is_accepted_once(order: list[int], again: list[int]) -> None:
    """Any order of 40 messages (all within the window) opens each exactly once; every second
    delivery of one is Replayed."""
    sealer, opener = Sealer(KEY_A), Opener(KEY_A)
    sealed = [sealer.seal(b"%d" % i) for i in range(40)]
    seen = [opener.open(sealed[i]) for i in order]
    assert sorted(seen, key=int) == [b"%d" % i for i in range(40)]
    for i in again:
        with pytest.raises(Replayed):
            opener.open(sealed[i])


@settings(max_examples=200)
@given(st.lists(st.integers(0, 3000), min_size=1, max_size=60), st.integers(1, 200))
def test_window_against_a_model(counters: list[int], size: int) -> None:
    """The bitmap window agrees with the obvious model: a set of accepted counters and the
    highest; accepted iff new and less than `size` behind the highest."""
    window = ReplayWindow(size)
    accepted: set[int] = set()
    for counter in counters:
        highest = max(accepted, default=-1)
        if counter in accepted and highest - counter < size:
            expected: type[Exception] | None = Replayed
        elif highest - counter >= size:
            expected = TooOld
        else:
            expected = None
        if expected is None:
            window.check(counter)
            window.accept(counter)
            accepted.add(counter)
        else:
            with pytest.raises(expected):
                window.check(counter)
        assert window.highest == max(accepted, default=-1)


def test_window_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1 counter, got 0"):
        ReplayWindow(0)


def test_window_of_one_accepts_only_increasing_counters() -> None:
    window = ReplayWindow(1)
    window.accept(5)
    with pytest.raises(Replayed):
        window.check(5)
    with pytest.raises(TooOld):
        window.check(4)
    window.check(6)


# ---------------------------------------------------------------- key files


def test_generate_writes_a_0600_pem_that_loads_back(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "server.key")
    old = os.umask(0)
    try:
        key = crypto.generate_key_file(path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert open(path, "rb").read().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert crypto.load_key_file(path).public == key.public


def test_generate_refuses_to_overwrite(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "server.key")
    first = crypto.generate_key_file(path)
    with pytest.raises(KeyFileError, match="not overwriting"):
        crypto.generate_key_file(path)
    assert crypto.load_key_file(path).public == first.public


def test_a_raw_32_byte_key_loads(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "raw.key")
    with open(path, "wb") as f:
        f.write(KEY_A)
    os.chmod(path, 0o600)
    expected = X25519PrivateKey.from_private_bytes(KEY_A).public_key().public_bytes_raw()
    assert crypto.load_key_file(path).public == expected


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o644])
def test_a_key_file_others_can_read_is_refused(tmp_path: os.PathLike[str], mode: int) -> None:
    path = os.path.join(tmp_path, "server.key")
    crypto.generate_key_file(path)
    os.chmod(path, mode)
    with pytest.raises(KeyFileError, match="chmod 600"):
        crypto.load_key_file(path)


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"", "neither a PEM"),
        (b"\0" * 31, "neither a PEM"),
        (b"-----BEGIN PRIVATE KEY-----\nnonsense\n-----END PRIVATE KEY-----\n", "PEM"),
    ],
)
def test_bad_key_files_are_refused(tmp_path: os.PathLike[str], content: bytes, match: str) -> None:
    path = os.path.join(tmp_path, "bad.key")
    with open(path, "wb") as f:
        f.write(content)
    os.chmod(path, 0o600)
    with pytest.raises(KeyFileError, match=match):
        crypto.load_key_file(path)


def test_a_pem_key_of_another_type_is_refused(tmp_path: os.PathLike[str]) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    path = os.path.join(tmp_path, "ed.key")
    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    with open(path, "wb") as f:
        f.write(pem)
    os.chmod(path, 0o600)
    with pytest.raises(KeyFileError, match="not an X25519 key"):
        crypto.load_key_file(path)


def test_a_missing_key_file_is_a_clear_error(tmp_path: os.PathLike[str]) -> None:
    with pytest.raises(KeyFileError, match="cannot read key file"):
        crypto.load_key_file(os.path.join(tmp_path, "absent.key"))


def test_made_up_bytes_with_a_seen_counter_are_forged_not_replayed() -> None:
    sealer, opener = Sealer(KEY_A), Opener(KEY_A)
    opener.open(sealer.seal(b"first"))
    with pytest.raises(Forged):
        opener.open((0).to_bytes(8, "big") + b"\0" * 30)
    with pytest.raises(Forged):
        opener.open((0).to_bytes(8, "big") + Sealer(KEY_B).seal(b"first")[8:])


# ---------------------------------------------------------------- the construction, as documented


def test_keys_tag_and_resume_secret_follow_the_documented_construction() -> None:
    """Recomputed here from the description in docs (not from the module's helpers), with
    fixed keys: both ends of any implementation must derive exactly these bytes."""
    import hashlib
    import hmac
    import struct

    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    client_private = X25519PrivateKey.from_private_bytes(bytes(range(32, 64)))
    server = ServerKey.from_bytes(bytes(range(64, 96)))
    client = ClientHandshake(Pin(server.fingerprint), client_private)
    assert client.public == client_private.public_key().public_bytes_raw()
    transcript = Transcript(client.public, server.public, b"\x11" * 16, 0xCAFE, -3, 77, 9010, 9011)
    label = b"echo session v1: X25519, HKDF-SHA256, ChaCha20-Poly1305"
    digest = hashlib.sha256(
        label
        + client.public
        + server.public
        + b"\x11" * 16
        + struct.pack(">IiiHH", 0xCAFE, -3, 77, 9010, 9011)
    ).digest()
    assert transcript.digest() == digest
    shared = client_private.exchange(
        X25519PrivateKey.from_private_bytes(bytes(range(64, 96))).public_key()
    )
    okm = HKDF(algorithm=hashes.SHA256(), length=96, salt=digest, info=label).derive(shared)
    tag = hmac.new(okm[64:], b"server confirms " + digest, hashlib.sha256).digest()[:16]
    server_keys, server_tag = server_session_keys(server, transcript)
    assert server_tag == tag
    assert (server_keys.receive, server_keys.send, server_keys.confirm) == (
        okm[:32],
        okm[32:64],
        okm[64:],
    )
    client_keys = client.complete(transcript, tag)
    assert (client_keys.send, client_keys.receive) == (okm[:32], okm[32:64])
    expected_secret = hmac.new(okm[64:], b"echo resume secret", hashlib.sha256).digest()[:16]
    assert crypto.resume_secret(client_keys) == int.from_bytes(expected_secret, "big")
    assert crypto.resume_secret(server_keys) == crypto.resume_secret(client_keys)
    # A sealed message: counter, then ChaCha20-Poly1305 under nonce 0000 || counter.
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

    sealed = client_keys.cipher().seal(b"ECHO hi")
    assert sealed == bytes(8) + ChaCha20Poly1305(okm[:32]).encrypt(bytes(12), b"ECHO hi", None)


def test_error_texts_name_what_is_wrong() -> None:
    assert str(Forged()) == "forged message"
    assert str(Replayed("counter 3")) == "replayed message: counter 3"
    assert Replayed("counter 3").detail == "counter 3" and Forged().detail == ""
    opener = Opener(KEY_A)
    with pytest.raises(Forged, match="forged message: counter 7"):
        opener.open((7).to_bytes(8, "big") + b"\0" * 16)
    sealed = Sealer(KEY_A).seal(b"m")
    opener.open(sealed)
    with pytest.raises(Replayed, match="replayed message: counter 0"):
        opener.open(sealed)
    with pytest.raises(BadKey, match="32 bytes"):
        crypto.fingerprint(b"x" * 31)
    with pytest.raises(BadKey, match="32 bytes"):
        crypto.public_key_text(b"x" * 33)
    with pytest.raises(BadKey, match="random bytes are 16 bytes"):
        Transcript(b"\1" * 32, b"\2" * 32, b"\3" * 15, 1, 1, 1, 1, 2).digest()
    server = ServerKey.generate()
    client = ClientHandshake(Pin(server.fingerprint))
    other = ClientHandshake(Pin(server.fingerprint))
    with pytest.raises(HandshakeFailed, match="another client key"):
        client.complete(transcript_for(other, server), b"\0" * 16)
    window = ReplayWindow(8)
    window.accept(20)
    with pytest.raises(TooOld, match="counter 1, 19 behind"):
        window.check(1)


def test_public_key_text_is_lowercase_base32_without_padding() -> None:
    key = ServerKey.generate()
    text = key.public_text
    assert text == text.lower() and "=" not in text
    import base64

    assert base64.b32decode(text.upper() + "====") == key.public


def test_the_window_bitmap_stays_bounded() -> None:
    window = ReplayWindow(16)
    assert window.bitmap == 0
    window.accept(3)
    assert window.bitmap == 1
    window.accept(10**6)
    window.accept(10**6 - 5)
    window.accept(10**6 - 15)  # the oldest the window holds
    assert window.bitmap == (1 << 15) | 0b100001
    window.accept(10**6 + 1)  # ... and now it falls out
    assert window.bitmap == 0b1000011


def test_a_pem_key_file_with_leading_blank_lines_loads(tmp_path: os.PathLike[str]) -> None:
    key = ServerKey.generate()
    path = os.path.join(tmp_path, "indented.key")
    with open(path, "wb") as f:
        f.write(b"\n\n" + key.to_pem())
    os.chmod(path, 0o600)
    assert crypto.load_key_file(path).public == key.public


def test_pin_refuses_64_characters_that_are_not_hex() -> None:
    for text in ["x" * 64, "X" * 64, "0" * 62 + "xx"]:
        with pytest.raises(BadPin):
            Pin.parse(text)


def test_server_random_bytes_are_fresh() -> None:
    first, second = crypto.server_nonce(), crypto.server_nonce()
    assert len(first) == len(second) == 16 and first != second
