"""The lobby hello (echo.lobby.hello): its bytes with and without the client's secret, hostile
bytes, and the seat bindings that let the client that was seated take its seat back."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echo.lobby.hello import (
    MAX_HELLO_BYTES,
    MAX_RESUME_BYTES,
    MAX_TOKEN_BYTES,
    Hello,
    HelloError,
    SeatBindings,
    encode_hello,
    parse_hello_untrusted,
)

SECRET = bytes(range(16))


def test_a_hello_without_a_secret_keeps_its_old_bytes() -> None:
    old = b"LOBBY1\x05alice\x00\x03abc"
    assert encode_hello(Hello("alice", b"abc")) == old
    assert parse_hello_untrusted(old) == Hello("alice", b"abc", b"")
    assert parse_hello_untrusted(b"LOBBY1\x01m\x00\x00") == Hello("m")


def test_the_secret_is_a_trailing_u8_length_and_its_bytes() -> None:
    data = encode_hello(Hello("alice", b"", SECRET))
    # LOBBY1, str8 "alice", bytes16 seat (empty), u8 16 + the secret
    assert data.hex() == (
        "4c4f42425931" + "05616c696365" + "0000" + "10" + "000102030405060708090a0b0c0d0e0f"
    )
    assert parse_hello_untrusted(data) == Hello("alice", b"", SECRET)
    seated = Hello("bob", b"\x01seat", b"s" * 64)
    assert parse_hello_untrusted(encode_hello(seated)) == seated
    longest = Hello(
        "m" * 255, b"x" * 4096, b"s" * 64, b"t" * MAX_TOKEN_BYTES, b"r" * MAX_RESUME_BYTES
    )
    assert len(encode_hello(longest)) == MAX_HELLO_BYTES
    assert parse_hello_untrusted(encode_hello(longest)) == longest


def test_a_resume_token_trails_the_secret_and_the_identity_token_and_needs_a_secret() -> None:
    data = encode_hello(Hello("alice", b"", SECRET, resume=b"token"))
    # no identity token: its field is empty (u16 0), then the resume token
    assert data == encode_hello(Hello("alice", b"", SECRET)) + b"\x00\x00\x00\x05token"
    assert parse_hello_untrusted(data) == Hello("alice", b"", SECRET, resume=b"token")
    both = encode_hello(Hello("alice", b"", SECRET, b"a.b.c", b"token"))
    assert both == encode_hello(Hello("alice", b"", SECRET)) + b"\x00\x05a.b.c\x00\x05token"
    assert parse_hello_untrusted(both) == Hello("alice", b"", SECRET, b"a.b.c", b"token")
    with pytest.raises(HelloError, match="carries a secret"):
        encode_hello(Hello("alice", resume=b"token"))
    for bad in (data[:-1], data + b"x", encode_hello(Hello("alice", b"", SECRET)) + b"\x00\x00"):
        with pytest.raises(HelloError, match="resume token"):
            parse_hello_untrusted(bad)


@pytest.mark.parametrize("secret", [b"s" * 15, b"s" * 65])
def test_a_secret_of_the_wrong_size_is_not_encoded(secret: bytes) -> None:
    with pytest.raises(HelloError, match="secret"):
        encode_hello(Hello("alice", b"", secret))


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"LOBBY1\x05alice\x00\x00\x00", "secret is 16..64"),  # an empty secret, spelled out
        (b"LOBBY1\x05alice\x00\x00\x0f" + b"s" * 15, "secret is 16..64"),
        (b"LOBBY1\x05alice\x00\x00\x41" + b"s" * 65, "secret is 16..64"),
        (b"LOBBY1\x05alice\x00\x00\x10" + b"s" * 15, "truncated secret"),
        (b"LOBBY1\x05alice\x00\x00\x10" + b"s" * 17, "trailing"),
        (b"LOBBY1\x05alice\x00\x00\x10" + b"s" * 16 + b"\x00\x00", "empty token"),
        (b"LOBBY1\x05alice\x00\x00\x10" + b"s" * 16 + b"\x00\x03ab", "truncated token"),
        (b"LOBBY1\x05alice\x00\x00\x10" + b"s" * 16 + b"\x00\x01ab", "trailing"),
        (b"LOBBY1\x05alice\x00\x00\x10" + b"s" * 16 + b"\x10\x01" + b"t" * 4097, "1..4096"),
        (b"LOBBY1\x05alice\x00\x05abc", "truncated seat"),
        (b"LOBBY1\x05ali", "truncated member"),
        (b"LOBBY2\x05alice\x00\x00", "not a lobby hello"),
    ],
)
def test_hostile_hellos_are_refused(data: bytes, why: str) -> None:
    with pytest.raises(HelloError, match=why):
        parse_hello_untrusted(data)


HELLO = encode_hello(Hello("bob", b"\x01seat", SECRET, b"a.b.c"))


def test_the_token_is_a_trailing_u16_length_and_its_bytes_after_the_secret() -> None:
    data = encode_hello(Hello("alice", b"", SECRET, b"eyJ.x.y"))
    assert data == encode_hello(Hello("alice", b"", SECRET)) + b"\x00\x07eyJ.x.y"
    assert parse_hello_untrusted(data) == Hello("alice", b"", SECRET, b"eyJ.x.y")


def test_a_token_is_not_encoded_without_a_secret_or_beyond_its_limit() -> None:
    with pytest.raises(HelloError, match="after a secret"):
        encode_hello(Hello("alice", b"", b"", b"a.b.c"))
    with pytest.raises(HelloError, match="token of more than"):
        encode_hello(Hello("alice", b"", SECRET, b"t" * (MAX_TOKEN_BYTES + 1)))


def test_every_truncation_but_the_ones_without_the_optional_fields_is_refused() -> None:
    without_secret = len(encode_hello(Hello("bob", b"\x01seat")))
    without_token = len(encode_hello(Hello("bob", b"\x01seat", SECRET)))
    for cut in range(len(HELLO)):
        if cut == without_secret:  # the secret is optional: that is the hello without it
            assert parse_hello_untrusted(HELLO[:cut]) == Hello("bob", b"\x01seat")
            continue
        if cut == without_token:  # and so is the token
            assert parse_hello_untrusted(HELLO[:cut]) == Hello("bob", b"\x01seat", SECRET)
            continue
        with pytest.raises(HelloError):
            parse_hello_untrusted(HELLO[:cut])


@settings(max_examples=500)
@given(st.lists(st.tuples(st.integers(0, len(HELLO) - 1), st.integers(0, 255)), max_size=4))
def test_a_mutated_hello_is_refused_or_is_its_own_bytes(changes: list[tuple[int, int]]) -> None:
    mutated = bytearray(HELLO)
    for at, byte in changes:
        mutated[at] = byte
    with contextlib.suppress(HelloError):  # refused; or one hello, one form:
        assert encode_hello(parse_hello_untrusted(bytes(mutated))) == bytes(mutated)


@settings(max_examples=300)
@given(st.binary(max_size=400))
def test_random_bytes_raise_only_the_hello_error(data: bytes) -> None:
    try:
        parse_hello_untrusted(b"LOBBY1" + data)
    except HelloError:
        pass


def test_a_seat_is_taken_back_only_with_the_secret_it_was_bound_to() -> None:
    bindings = SeatBindings()
    bindings.bind("bob", 7, SECRET)
    assert bindings.holds("bob", 7, SECRET)
    assert not bindings.holds("bob", 7, b"x" * 16)  # another client naming bob
    assert not bindings.holds("bob", 8, SECRET)  # another lobby
    assert not bindings.holds("alice", 7, SECRET)
    bindings.forget("bob", 8)  # (left another lobby: not this binding)
    assert bindings.holds("bob", 7, SECRET)
    bindings.forget("bob", 7)
    assert not bindings.holds("bob", 7, SECRET) and len(bindings) == 0


def test_a_client_without_a_secret_binds_nothing() -> None:
    bindings = SeatBindings()
    bindings.bind("bob", 7, SECRET)
    bindings.bind("bob", 7, b"")  # its seat was taken by a client from before secrets
    assert not bindings.holds("bob", 7, SECRET)
    assert not bindings.holds("bob", 7, b"")
    assert len(bindings) == 0
