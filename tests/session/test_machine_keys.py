"""The handshake machine with a pinned server key, and the key tails on the wire (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from echo.protocol import (
    AllClientsError,
    BadMessage,
    Connect,
    Hello,
    encrypt_session,
    format_message,
)
from echo.session.crypto import (
    ClientHandshake,
    Pin,
    ServerKey,
    Transcript,
    server_session_keys,
)
from echo.session.keywire import (
    ConnectKey,
    HelloKey,
    append_connect_key,
    append_hello_key,
    split_connect_key,
    split_hello_key,
)
from echo.session.machine import (
    CloseAllClients,
    Failed,
    FailureKind,
    HandshakeMachine,
    OpenDuologue,
    Opened,
    SendHello,
)
from echo.session.resume import (
    ResumableConnect,
    ResumableHello,
    format_resumable_connect,
    parse_client_request_untrusted,
)

PAD = 0x1234ABCD
ME = 77
SESSION = 4242
SERVER = ServerKey.generate()


def started(
    client: ClientHandshake, resume_pad: int | None = None
) -> tuple[HandshakeMachine, bytes]:
    m = HandshakeMachine(pad=PAD, client_key=client, resume_pad=resume_pad)
    m.start(0.0)
    (send,) = m.on_all_clients_connected(ME, 1.0)
    assert isinstance(send, SendHello)
    return m, send.data


def server_reply(
    client_public: bytes, key: ServerKey = SERVER, *, nonce: bytes = b"\x05" * 16, client: int = ME
) -> bytes:
    """What a server with `key` answers to a HELLO carrying `client_public`."""
    connect = Connect(client, 9012, 9013, encrypt_session(SESSION, PAD))
    transcript = Transcript(client_public, key.public, nonce, PAD, client, SESSION, 9012, 9013)
    _, tag = server_session_keys(key, transcript)
    return append_connect_key(format_message(connect), ConnectKey(key.public, nonce, tag))


def test_the_hello_carries_the_ephemeral_key_and_the_connect_gives_keys() -> None:
    client = ClientHandshake(Pin(SERVER.fingerprint))
    m, hello = started(client)
    data, key = split_hello_key(hello)  # type: ignore[misc]
    assert data == format_message(Hello(PAD)) and key == HelloKey(client.public)
    actions = m.on_all_clients_message(server_reply(client.public), 2.0)
    assert actions == [CloseAllClients(), OpenDuologue(9012, 9013, SESSION)]
    (opened,) = m.on_duologue_connected(3.0)
    assert isinstance(opened, Opened) and opened.keys is not None
    # The server derived the mirror image.
    transcript = Transcript(
        client.public, SERVER.public, b"\x05" * 16, PAD, ME, SESSION, 9012, 9013
    )
    server_keys, _ = server_session_keys(SERVER, transcript)
    assert opened.keys.send == server_keys.receive and opened.keys.receive == server_keys.send


def test_a_resumable_encrypting_hello_has_both_tails_and_the_server_reads_them() -> None:
    client = ClientHandshake(Pin(SERVER.fingerprint))
    _, hello = started(client, resume_pad=7)
    data, key = split_hello_key(hello)  # type: ignore[misc]
    assert key == HelloKey(client.public)
    parsed = parse_client_request_untrusted(data, credentials=False)
    assert parsed == ResumableHello(Hello(PAD), 7)


def test_a_connect_in_the_clear_is_untrusted_never_a_fallback() -> None:
    client = ClientHandshake(Pin(SERVER.fingerprint))
    m, _ = started(client)
    plain = format_message(Connect(ME, 9012, 9013, encrypt_session(SESSION, PAD)))
    (*_, failed) = m.on_all_clients_message(plain, 2.0)
    assert isinstance(failed, Failed) and failed.failure.kind is FailureKind.UNTRUSTED
    assert "without encryption" in failed.failure.message


def test_another_servers_key_is_untrusted() -> None:
    client = ClientHandshake(Pin(SERVER.fingerprint))
    m, _ = started(client)
    (*_, failed) = m.on_all_clients_message(server_reply(client.public, ServerKey.generate()), 2.0)
    assert isinstance(failed, Failed) and failed.failure.kind is FailureKind.UNTRUSTED
    assert "not the pinned one" in failed.failure.message


def test_a_connect_made_for_another_client_is_untrusted() -> None:
    """A CONNECT (with its tag) replayed to a client whose HELLO had another key: the tag was
    made for the other key, so the confirmation fails."""
    client = ClientHandshake(Pin(SERVER.fingerprint))
    other = ClientHandshake(Pin(SERVER.fingerprint))
    m, _ = started(client)
    (*_, failed) = m.on_all_clients_message(server_reply(other.public), 2.0)
    assert isinstance(failed, Failed) and failed.failure.kind is FailureKind.UNTRUSTED
    assert "confirmation" in failed.failure.message


def test_a_server_that_cannot_read_the_key_is_a_rejection_with_a_hint() -> None:
    client = ClientHandshake(Pin(SERVER.fingerprint))
    m, _ = started(client)
    (*_, failed) = m.on_all_clients_message(format_message(AllClientsError(ME, "bad message")), 2.0)
    assert isinstance(failed, Failed) and failed.failure.kind is FailureKind.REJECTED
    assert "may not support encryption" in failed.failure.message


def test_a_resumable_encrypting_client_retries_without_resume_but_keeps_its_key() -> None:
    client = ClientHandshake(Pin(SERVER.fingerprint))
    m, first = started(client, resume_pad=7)
    (retry,) = m.on_all_clients_message(format_message(AllClientsError(ME, "bad message")), 2.0)
    assert isinstance(retry, SendHello) and retry.data != first
    assert split_hello_key(retry.data) == (format_message(Hello(PAD)), HelloKey(client.public))


def test_a_key_nobody_asked_for_is_a_protocol_failure() -> None:
    m = HandshakeMachine(pad=PAD)
    m.start(0.0)
    m.on_all_clients_connected(ME, 1.0)
    (*_, failed) = m.on_all_clients_message(server_reply(b"\x09" * 32), 2.0)
    assert isinstance(failed, Failed) and failed.failure.kind is FailureKind.PROTOCOL


def test_a_malformed_key_tail_is_a_protocol_failure() -> None:
    client = ClientHandshake(Pin(SERVER.fingerprint))
    m, _ = started(client)
    (*_, failed) = m.on_all_clients_message(b"77 CONNECT 9012 9013 1 +X 00", 2.0)
    assert isinstance(failed, Failed) and failed.failure.kind is FailureKind.PROTOCOL


# ---------------------------------------------------------------- the wire tails


def test_tails_round_trip_after_the_resume_extension() -> None:
    connect = Connect(ME, 9012, 9013, 1)
    resumable = format_resumable_connect(ResumableConnect(connect, 99))
    key = ConnectKey(b"\x01" * 32, b"\x02" * 16, b"\x03" * 16)
    data, parsed = split_connect_key(append_connect_key(resumable, key))  # type: ignore[misc]
    assert data == resumable and parsed == key


def test_messages_without_a_tail_pass_through_untouched() -> None:
    hello = format_message(Hello(5))
    assert split_hello_key(hello) == (hello, None)
    assert split_connect_key(b"1 CONNECT 2 3 4") == (b"1 CONNECT 2 3 4", None)


@pytest.mark.parametrize(
    "data",
    [
        b"HELLO 1 +X ",
        b"HELLO 1 +X " + b"0" * 63,
        b"HELLO 1 +X " + b"0" * 65,
        b"HELLO 1 +X " + b"g" * 64,
        b"HELLO 1 +X " + b"a" * 64,  # lowercase hex is not the canonical form
        b"HELLO 1 +X \xff",
        b"HELLO 1 +X " + b"0" * 64 + b" extra",
    ],
)
def test_malformed_hello_tails_are_bad_messages(data: bytes) -> None:
    assert isinstance(split_hello_key(data), BadMessage)


def test_formatting_refuses_wrong_sizes() -> None:
    with pytest.raises(ValueError):
        append_hello_key(b"HELLO 1", HelloKey(b"\0" * 31))
    with pytest.raises(ValueError):
        append_connect_key(b"1 CONNECT 2 3 4", ConnectKey(b"\0" * 32, b"\0" * 15, b"\0" * 16))
    with pytest.raises(ValueError, match="limit"):
        append_hello_key(b"HELLO 1 " + b"A" * 1000, HelloKey(b"\0" * 32))


@given(st.binary(max_size=1100))
def test_the_tail_parsers_never_raise(data: bytes) -> None:
    for split in (split_hello_key, split_connect_key):
        result = split(data)
        assert isinstance(result, BadMessage | tuple)
        result = split(b"HELLO 1 +X " + data)
        assert isinstance(result, BadMessage | tuple)


def test_an_encrypted_sessions_resume_secret_comes_from_the_keys_not_the_wire() -> None:
    """In the clear the secret crosses the wire padded with the HELLO's pad (an on-path reader
    has both); encrypted, both ends derive it from the keys and the CONNECT's field is noise."""
    from echo.session.crypto import resume_secret

    client = ClientHandshake(Pin(SERVER.fingerprint))
    m, _ = started(client, resume_pad=7)
    connect = Connect(ME, 9012, 9013, encrypt_session(SESSION, PAD))
    nonce = b"\x05" * 16
    transcript = Transcript(client.public, SERVER.public, nonce, PAD, ME, SESSION, 9012, 9013)
    server_keys, tag = server_session_keys(SERVER, transcript)
    noise = 0xABCDEF
    reply = append_connect_key(
        format_resumable_connect(ResumableConnect(connect, noise)),
        ConnectKey(SERVER.public, nonce, tag),
    )
    m.on_all_clients_message(reply, 2.0)
    (opened,) = m.on_duologue_connected(3.0)
    assert isinstance(opened, Opened)
    assert opened.resume_secret == resume_secret(server_keys)
    assert opened.resume_secret != noise ^ 7


def test_a_key_tail_that_fills_the_message_exactly_parses() -> None:
    tail = b" +X " + b"A" * 64
    head = b"HELLO 1 " + b"a" * (1024 - 8 - len(tail))
    data = head + tail
    assert len(data) == 1024
    assert split_hello_key(data) == (head, HelloKey(b"\xaa" * 32))
    assert isinstance(split_hello_key(data + b"A"), BadMessage)
    assert split_hello_key(b"HELLO 1 +X zz") == BadMessage("malformed key in HELLO")
    assert split_connect_key(b"1 CONNECT 2 3 4 +X zz") == BadMessage("malformed key in CONNECT")


def test_formatting_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match="client_public must be 32 bytes"):
        append_hello_key(b"HELLO 1", HelloKey(b"\0" * 31))
    with pytest.raises(ValueError, match="server_public must be 32 bytes"):
        append_connect_key(b"1 CONNECT 2 3 4", ConnectKey(b"\0" * 3, b"\0" * 16, b"\0" * 16))
    with pytest.raises(ValueError, match="server_nonce must be 16 bytes"):
        append_connect_key(b"1 CONNECT 2 3 4", ConnectKey(b"\0" * 32, b"\0" * 3, b"\0" * 16))
    head = b"HELLO 1 " + b"a" * (1024 - 8 - 68)
    assert len(append_hello_key(head, HelloKey(b"\0" * 32))) == 1024  # exactly the limit
    with pytest.raises(ValueError, match="tag must be 16 bytes"):
        append_connect_key(b"1 CONNECT 2 3 4", ConnectKey(b"\0" * 32, b"\0" * 16, b"\0" * 3))
