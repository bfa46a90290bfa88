"""The topics codec: %-encoding, lines, packing, cookies and proof of work (pub/sub note)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from echo.topics.codec import (
    LITERAL,
    CodecError,
    Confirm,
    Cookie,
    Life,
    Malformed,
    Pad,
    Publish,
    Subscribe,
    check_work,
    decode,
    encode,
    format_confirm,
    format_cookie,
    format_life,
    format_pad,
    format_publish,
    format_subscribe,
    is_canonical,
    make_cookie,
    pack,
    parse_datagram,
    parse_line,
    solve_work,
    verify_cookie,
    work_bits,
)


@given(st.binary(max_size=300))
def test_encode_decode_round_trip_and_the_encoding_has_no_separator(data: bytes) -> None:
    encoded = encode(data)
    assert decode(encoded) == data
    assert b" " not in encoded and b"\n" not in encoded and b"!" not in encoded
    assert is_canonical(encoded)


@given(st.binary(min_size=1, max_size=50))
def test_each_topic_has_one_spelling(data: bytes) -> None:
    # Escaping a literal byte is refused: "%61" and "a" must not be two topics on a server.
    encoded = encode(data)
    literal = [i for i, b in enumerate(data) if b in LITERAL]
    if literal:
        i = literal[0]
        other = encode(data[:i]) + b"%%%02X" % data[i] + encode(data[i + 1 :])
        with pytest.raises(CodecError):
            decode(other)
    assert encode(decode(encoded)) == encoded


@pytest.mark.parametrize(
    "field", [b"%", b"%4", b"%zz", b"%0a", b"a b", b"a\n", b"a!", b"\xff", b"%41"]
)
def test_decode_refuses_what_encode_never_writes(field: bytes) -> None:
    with pytest.raises(CodecError):
        decode(field)
    assert not is_canonical(field)


def test_the_seeds_two_lines() -> None:
    assert format_subscribe(b"lobby/eu") == b"lobby/eu\n"
    assert format_publish(b"lobby/eu", b"room 1") == b"lobby/eu room%201\n"
    assert parse_line(b"lobby/eu") == Subscribe(b"lobby/eu")
    line = parse_line(b"lobby/eu room%201 abc-1")
    assert line == Publish(b"lobby/eu", b"room%201", b"abc-1", b"lobby/eu room%201 abc-1\n")
    # An empty message is an empty field.
    assert parse_line(b"t ") == Publish(b"t", b"", None, b"t \n")


@given(st.binary(min_size=1, max_size=100), st.binary(max_size=200), st.booleans())
def test_publish_lines_round_trip(topic: bytes, message: bytes, with_id: bool) -> None:
    message_id = b"id_1-x" if with_id else None
    line = format_publish(topic, message, message_id)
    parsed = parse_line(line[:-1])
    assert isinstance(parsed, Publish)
    assert decode(parsed.topic) == topic and decode(parsed.message) == message
    assert parsed.message_id == message_id and parsed.line == line


def test_control_lines_round_trip() -> None:
    cookie = make_cookie(b"k" * 32, 7, "10.0.0.1", 4000)
    assert parse_line(format_cookie(cookie, 12)[:-1]) == Cookie(cookie, 12)
    assert parse_line(format_confirm(cookie)[:-1]) == Confirm(cookie, b"")
    assert parse_line(format_confirm(cookie, b"1f")[:-1]) == Confirm(cookie, b"1f")
    assert parse_line(format_life(29.7)[:-1]) == Life(29.0)
    for size in (5, 6, 40):
        pad = format_pad(size)
        assert len(pad) == size and parse_line(pad[:-1]) == Pad()


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b"", "empty"),
        (b"a b c d", "too_many_fields"),
        (b"%zz", "bad_topic"),
        (b"x" * 256, "bad_topic"),
        (b"t %zz", "bad_message"),
        (b"t m bad!id", "bad_message_id"),
        (b"t m " + b"i" * 33, "bad_message_id"),
        (b"!hello", "unknown_control"),
        (b"!confirm", "bad_control"),
        (b"!confirm notacookie", "bad_control"),
        (b"!cookie 1.abc 3", "bad_control"),
        (b"!life x", "bad_control"),
        (b"!pad a b", "bad_control"),
    ],
)
def test_malformed_lines_name_their_reason(line: bytes, reason: str) -> None:
    assert parse_line(line) == Malformed(reason, line + b"\n")


@given(st.binary(max_size=2000))
def test_any_datagram_parses_without_raising_and_accounts_for_every_line(data: bytes) -> None:
    lines = list(parse_datagram(data))
    expected = data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1)
    assert len(lines) == expected
    if data and not data.endswith(b"\n"):
        assert lines[-1] == Malformed("unterminated", data.rsplit(b"\n", 1)[-1])


@given(st.lists(st.binary(min_size=1, max_size=60), max_size=40), st.integers(64, 400))
def test_pack_keeps_order_and_fits_every_datagram(topics: list[bytes], size: int) -> None:
    lines = [format_publish(t, b"m") for t in topics]
    lines = [line for line in lines if len(line) <= size]
    datagrams = pack(lines, size)
    assert all(len(d) <= size for d in datagrams)
    assert b"".join(datagrams) == b"".join(lines)
    # Greedy: two neighbouring datagrams could not have been one.
    for first, second in itertools.pairwise(datagrams):
        assert len(first) + len(second.split(b"\n", 1)[0]) + 1 > size


def test_pack_refuses_a_line_longer_than_a_datagram() -> None:
    with pytest.raises(CodecError):
        pack([b"t " + b"m" * 100 + b"\n"], 64)


def test_cookies_are_bound_to_address_epoch_and_secret() -> None:
    secret = b"s" * 32
    cookie = make_cookie(secret, 5, "10.0.0.1", 4000)
    assert verify_cookie(secret, cookie, (5, 4), "10.0.0.1", 4000) == 5
    assert verify_cookie(secret, cookie, (6, 5), "10.0.0.1", 4000) == 5
    assert verify_cookie(secret, cookie, (7, 6), "10.0.0.1", 4000) == -1  # too old
    assert verify_cookie(secret, cookie, (5,), "10.0.0.2", 4000) == -1
    assert verify_cookie(secret, cookie, (5,), "10.0.0.1", 4001) == -1
    assert verify_cookie(b"t" * 32, cookie, (5,), "10.0.0.1", 4000) == -1
    assert verify_cookie(secret, b"x.y", (5,), "10.0.0.1", 4000) == -1


@pytest.mark.parametrize("difficulty", [0, 1, 8, 12])
def test_proof_of_work(difficulty: int) -> None:
    cookie = make_cookie(b"s" * 32, 1, "10.0.0.1", 4000)
    work = solve_work(cookie, difficulty)
    assert check_work(cookie, work, difficulty)
    assert work_bits(cookie, work) >= difficulty
    if difficulty:
        # The proof is for this cookie: another address's cookie needs its own.
        other = make_cookie(b"s" * 32, 1, "10.0.0.2", 4000)
        found = solve_work(other, difficulty)
        assert check_work(other, found, difficulty)
    assert not check_work(cookie, b"", 20) or work_bits(cookie, b"") >= 20
