"""The key tails of HELLO and CONNECT at their edges: the message size limit on both sides, each
field's size, the mark beyond the limit, bytes that are not UTF-8, and the words of each
refusal. These kill mutants of echo.session.keywire that the handshake tests let through
(./dev mutate keywire; docs/mutation.md)."""

from __future__ import annotations

import pytest

from echo.protocol import MAX_MESSAGE_BYTES, BadMessage
from echo.session.keywire import (
    ConnectKey,
    HelloKey,
    append_connect_key,
    append_hello_key,
    split_connect_key,
    split_hello_key,
)

PUBLIC = bytes(range(32))
NONCE = bytes(range(100, 116))
TAG = bytes(range(200, 216))
CONNECT = ConnectKey(PUBLIC, NONCE, TAG)
HELLO_TAIL = len(" +X ") + 64
CONNECT_TAIL = len(" +X ") + 64 + 1 + 32 + 1 + 32


def test_the_tails_are_upper_case_hex_after_the_mark() -> None:
    assert (
        append_hello_key(b"HELLO k", HelloKey(PUBLIC))
        == b"HELLO k +X " + PUBLIC.hex().upper().encode()
    )
    assert append_connect_key(b"1 CONNECT 2 3 4", CONNECT) == (
        b"1 CONNECT 2 3 4 +X "
        + PUBLIC.hex().upper().encode()
        + b" "
        + NONCE.hex().upper().encode()
        + b" "
        + TAG.hex().upper().encode()
    )


@pytest.mark.parametrize(
    ("key", "words"),
    [
        (ConnectKey(PUBLIC[:-1], NONCE, TAG), "server_public must be 32 bytes"),
        (ConnectKey(PUBLIC, NONCE + b"x", TAG), "server_nonce must be 16 bytes"),
        (ConnectKey(PUBLIC, NONCE, TAG[:-1]), "tag must be 16 bytes"),
        (ConnectKey(bytearray(PUBLIC), NONCE, TAG), "server_public must be 32 bytes"),  # type: ignore[arg-type]
    ],
)
def test_a_connect_tail_of_the_wrong_sizes_is_refused_in_words(key: ConnectKey, words: str) -> None:
    with pytest.raises(ValueError) as caught:
        append_connect_key(b"1 CONNECT 2 3 4", key)
    assert str(caught.value) == words


def test_a_hello_key_of_the_wrong_size_is_refused_in_words() -> None:
    with pytest.raises(ValueError) as caught:
        append_hello_key(b"HELLO k", HelloKey(PUBLIC + b"x"))
    assert str(caught.value) == "client_public must be 32 bytes"


def test_a_message_of_the_limit_fits_and_one_byte_more_does_not() -> None:
    hello = b"HELLO " + b"k" * (MAX_MESSAGE_BYTES - HELLO_TAIL - 6)
    longest = append_hello_key(hello, HelloKey(PUBLIC))
    assert len(longest) == MAX_MESSAGE_BYTES
    assert split_hello_key(longest) == (hello, HelloKey(PUBLIC))
    with pytest.raises(ValueError) as caught:
        append_hello_key(hello + b"k", HelloKey(PUBLIC))
    assert str(caught.value) == (
        f"message is {MAX_MESSAGE_BYTES + 1} bytes; the limit is {MAX_MESSAGE_BYTES}"
    )
    connect = b"1 CONNECT 2 3 " + b"4" * (MAX_MESSAGE_BYTES - CONNECT_TAIL - 14)
    longest = append_connect_key(connect, CONNECT)
    assert len(longest) == MAX_MESSAGE_BYTES
    assert split_connect_key(longest) == (connect, CONNECT)
    with pytest.raises(ValueError, match=r"^message is 1025 bytes; the limit is 1024$"):
        append_connect_key(connect + b"4", CONNECT)


def test_a_message_over_the_limit_with_a_tail_is_malformed() -> None:
    hello = append_hello_key(b"HELLO k", HelloKey(PUBLIC))
    padded = b"HELLO " + b"k" * (MAX_MESSAGE_BYTES - len(hello)) + hello[5:]
    assert len(padded) == MAX_MESSAGE_BYTES + 1
    assert split_hello_key(padded) == BadMessage("malformed key in HELLO")
    connect = append_connect_key(b"1 CONNECT 2 3 4", CONNECT)
    padded = b"1 CONNECT 2 3 " + b"4" * (MAX_MESSAGE_BYTES + 1 - len(connect)) + connect[14:]
    assert len(padded) == MAX_MESSAGE_BYTES + 1
    assert split_connect_key(padded) == BadMessage("malformed key in CONNECT")


def test_a_mark_beyond_the_limit_is_no_tail() -> None:
    data = b"HELLO " + b"k" * (MAX_MESSAGE_BYTES - 6) + b" +X " + b"A" * 64
    assert split_hello_key(data) == (data, None)
    assert split_connect_key(data) == (data, None)


def test_a_tail_in_bytes_that_are_not_utf8_or_not_upper_hex_is_malformed() -> None:
    good = append_hello_key(b"HELLO k", HelloKey(PUBLIC))
    assert split_hello_key(b"\xff" + good) == BadMessage("malformed key in HELLO")
    assert split_hello_key(good[:11] + good[11:].lower()) == BadMessage("malformed key in HELLO")
    connect = append_connect_key(b"1 CONNECT 2 3 4", CONNECT)
    assert split_connect_key(b"\xff" + connect) == BadMessage("malformed key in CONNECT")
    assert split_connect_key(connect[:-1]) == BadMessage("malformed key in CONNECT")


def test_the_parsers_take_any_buffer() -> None:
    good = append_hello_key("HELLO é".encode(), HelloKey(PUBLIC))
    assert split_hello_key(memoryview(good)) == ("HELLO é".encode(), HelloKey(PUBLIC))
    connect = append_connect_key(b"1 CONNECT 2 3 4", CONNECT)
    assert split_connect_key(bytearray(connect)) == (b"1 CONNECT 2 3 4", CONNECT)
