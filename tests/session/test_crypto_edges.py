"""The session encryption's refusals in their exact words: what `echo-client --server-key`,
`echo-server --key` and a failed handshake tell the person who has to act on them. These kill
mutants of echo.session.crypto that the behaviour tests in test_crypto.py let through
(./dev mutate crypto; docs/mutation.md)."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from echo.session.crypto import (
    MAX_COUNTER,
    BadKey,
    BadPin,
    ClientHandshake,
    CounterExhausted,
    KeyFileError,
    Pin,
    Sealer,
    ServerKey,
    Transcript,
    generate_key_file,
    server_nonce,
    server_session_keys,
)

SERVER = ServerKey.generate()


def _transcript(client_public: bytes, server_public: bytes = SERVER.public) -> Transcript:
    return Transcript(client_public, server_public, server_nonce(), 7, 8, 9, 10, 11)


def _words(error: pytest.ExceptionInfo[BaseException]) -> str:
    return str(error.value)


@pytest.mark.parametrize("text", ["", "abc", "1" * 52, "g" * 64])
def test_a_pin_that_is_not_a_key_says_what_a_key_is(text: str) -> None:
    with pytest.raises(BadPin) as caught:
        Pin.parse(text)
    assert _words(caught) == (
        "a server key is its public key (52 base32 characters, as echo-server prints it) "
        "or its SHA-256 fingerprint (64 hex digits)"
    )


def test_a_short_fingerprint_is_refused_as_too_short_to_pin() -> None:
    with pytest.raises(BadPin) as caught:
        Pin.parse(SERVER.short_fingerprint)
    assert _words(caught) == (
        "that is the short fingerprint, too short to pin: give the public key "
        "(52 characters) or the full fingerprint (64 hex digits)"
    )


def test_a_pem_key_of_another_kind_is_named() -> None:
    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    with pytest.raises(KeyFileError) as caught:
        ServerKey.from_bytes(pem)
    assert _words(caught) == "the PEM key is Ed25519PrivateKey, not an X25519 key"


def test_a_key_file_that_cannot_be_created_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "missing" / "server.key"
    with pytest.raises(KeyFileError) as caught:
        generate_key_file(path)
    assert _words(caught) == f"cannot create {path}: No such file or directory"


def test_a_transcript_for_another_server_key_is_refused() -> None:
    client = ClientHandshake(Pin.parse(SERVER.public_text))
    other = ServerKey.generate()
    with pytest.raises(BadKey) as caught:
        server_session_keys(SERVER, _transcript(client.public, other.public))
    assert _words(caught) == "the transcript names another server key"


def test_the_client_refuses_a_transcript_of_another_key_or_a_wrong_tag() -> None:
    client = ClientHandshake(Pin.parse(SERVER.public_text))
    transcript = _transcript(client.public)
    _, tag = server_session_keys(SERVER, transcript)
    stranger = ClientHandshake(Pin.parse(SERVER.public_text))
    with pytest.raises(Exception) as caught:
        client.complete(attrs.evolve(transcript, client_public=stranger.public), tag)
    assert _words(caught) == "the transcript names another client key"
    with pytest.raises(Exception) as caught:
        client.complete(transcript, bytes(len(tag)))
    assert _words(caught) == (
        "the server did not prove it holds the pinned key (confirmation tag mismatch)"
    )
    assert client.complete(transcript, tag).send  # the right tag completes it


def test_a_sealer_refuses_to_reuse_a_nonce_past_the_last_counter() -> None:
    sealer = Sealer(bytes(32))
    sealer.counter = MAX_COUNTER
    assert sealer.seal(b"last")[:8] == MAX_COUNTER.to_bytes(8, "big")
    with pytest.raises(CounterExhausted) as caught:
        sealer.seal(b"one more")
    assert _words(caught) == "2**64 messages sealed under one key"
