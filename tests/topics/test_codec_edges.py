"""The topics codec at its edges: each bound on both sides (a field's 255 bytes, a datagram's
size, a pad's length, the control lines' argument counts), the cookie's exact form, and the
words of each refusal. These kill mutants of echo.topics.codec that the behaviour tests let
through (./dev mutate codec; docs/mutation.md). The proof of work's bit count has tests of its
own."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from echo.topics.codec import (
    MAX_FIELD,
    CodecError,
    Confirm,
    Cookie,
    Life,
    Malformed,
    Pad,
    Publish,
    Subscribe,
    decode,
    encode,
    format_confirm,
    format_life,
    format_pad,
    format_publish,
    format_subscribe,
    is_canonical,
    make_cookie,
    new_message_id,
    pack,
    parse_datagram,
    solve_work,
    verify_cookie,
)

COOKIE = b"12." + b"0123456789abcdef01234567"


def _parse(line: bytes) -> object:
    (parsed,) = parse_datagram(line + b"\n")
    return parsed


def test_decoding_names_each_fault_by_its_byte() -> None:
    with pytest.raises(CodecError, match=r"^bad escape at byte 2$"):
        decode(b"ab%4")
    with pytest.raises(CodecError, match=r"^bad escape at byte 0$"):
        decode(b"%4g")
    with pytest.raises(CodecError, match=r"^bad escape at byte 1$"):
        decode(b"a%g4")
    with pytest.raises(CodecError, match=r"^byte 0x41 must not be escaped$"):
        decode(b"%41")
    with pytest.raises(CodecError, match=r"^byte 0x20 must be %-encoded$"):
        decode(b"a b")
    assert decode(b"%20a~%FF") == b" a~\xff"
    assert decode(b"%25%0A%21") == b"%\n!"


def test_encoding_escapes_all_but_the_literal_bytes() -> None:
    assert encode(b"a b\n%!~") == b"a%20b%0A%25%21~"
    assert encode(bytes([0, 255])) == b"%00%FF"
    assert is_canonical(b"a%20b") and not is_canonical(b"a%41") and not is_canonical(b"a b")


def test_a_topic_of_255_encoded_bytes_is_the_longest() -> None:
    longest = b"t" * MAX_FIELD
    assert format_subscribe(longest) == longest + b"\n"
    assert _parse(longest) == Subscribe(longest)
    assert _parse(longest + b"t") == Malformed("bad_topic", longest + b"t\n")
    with pytest.raises(CodecError, match=rf"^a topic is at most {MAX_FIELD} bytes once %-encoded$"):
        format_subscribe(b"t" * 253 + b" ")  # 256 once encoded
    with pytest.raises(CodecError, match=r"^a topic must not be empty$"):
        format_publish(b"", b"m")


def test_publish_lines_and_their_faults() -> None:
    assert format_publish(b"t", b"a b", b"id_1-") == b"t a%20b id_1-\n"
    assert _parse(b"t m id") == Publish(b"t", b"m", b"id", b"t m id\n")
    assert _parse(b"t m") == Publish(b"t", b"m", None, b"t m\n")
    assert _parse(b"t m i d") == Malformed("too_many_fields", b"t m i d\n")
    assert _parse(b"t %41") == Malformed("bad_message", b"t %41\n")
    assert _parse(b"t m " + b"i" * 33) == Malformed("bad_message_id", b"t m " + b"i" * 33 + b"\n")
    assert _parse(b"t m " + b"i" * 32) == Publish(
        b"t", b"m", b"i" * 32, b"t m " + b"i" * 32 + b"\n"
    )
    with pytest.raises(CodecError, match=r"^a message id is 1-32 characters of A-Z a-z 0-9 _ -$"):
        format_publish(b"t", b"m", b"")
    assert _parse(b"") == Malformed("empty", b"\n")
    assert list(parse_datagram(b"t\nu")) == [Subscribe(b"t"), Malformed("unterminated", b"u")]


def test_control_lines_by_their_argument_counts() -> None:
    assert _parse(b"!confirm " + COOKIE) == Confirm(COOKIE, b"")
    assert _parse(b"!confirm " + COOKIE + b" 0f") == Confirm(COOKIE, b"0f")
    assert _parse(b"!confirm " + COOKIE + b" 0f 1") == Malformed(
        "bad_control", b"!confirm " + COOKIE + b" 0f 1\n"
    )
    assert _parse(b"!confirm") == Malformed("bad_control", b"!confirm\n")
    assert _parse(b"!confirm " + COOKIE + b" 0F") == Malformed(
        "bad_control", b"!confirm " + COOKIE + b" 0F\n"
    )
    assert _parse(b"!cookie " + COOKIE + b" 999") == Cookie(COOKIE, 999)
    assert _parse(b"!cookie " + COOKIE + b" 1000") == Malformed(
        "bad_control", b"!cookie " + COOKIE + b" 1000\n"
    )
    assert _parse(b"!cookie " + COOKIE) == Malformed("bad_control", b"!cookie " + COOKIE + b"\n")
    assert _parse(b"!life 2.5") == Life(2.5)
    assert _parse(b"!life 2 3") == Malformed("bad_control", b"!life 2 3\n")
    assert _parse(b"!pad") == Pad()
    assert _parse(b"!pad xx") == Pad()
    assert _parse(b"!pad x x") == Malformed("bad_control", b"!pad x x\n")
    assert _parse(b"!pad  x") == Malformed("bad_control", b"!pad  x\n")  # fields split at 1 space
    assert _parse(b"!nope") == Malformed("unknown_control", b"!nope\n")


def test_formatted_control_lines() -> None:
    assert format_confirm(COOKIE) == b"!confirm " + COOKIE + b"\n"
    assert format_confirm(COOKIE, b"ab") == b"!confirm " + COOKIE + b" ab\n"
    assert format_life(-3) == b"!life 0\n"
    assert format_life(2.9) == b"!life 2\n"
    for size in (0, 5):
        assert format_pad(size) == b"!pad\n"
    assert format_pad(6) == b"!pad \n"
    assert format_pad(9) == b"!pad xxx\n"
    assert _parse(format_pad(9)[:-1]) == Pad()


def test_packing_fills_each_datagram_up_to_its_size() -> None:
    lines = [b"aa\n", b"bb\n", b"c\n"]
    assert pack(lines, 6) == [b"aa\nbb\n", b"c\n"]
    assert pack(lines, 5) == [b"aa\n", b"bb\nc\n"]
    assert pack([], 5) == []
    assert pack([b"abc\n"], 4) == [b"abc\n"]
    with pytest.raises(CodecError, match=r"^a line of 5 bytes does not fit a 4-byte datagram$"):
        pack([b"abcd\n"], 4)


def test_a_cookie_is_its_epoch_and_a_keyed_mac_of_the_source() -> None:
    secret = b"k" * 32
    mac = hmac.new(secret, b"7|127.0.0.1|4000", hashlib.blake2b).hexdigest()[:24]
    cookie = make_cookie(secret, 7, "127.0.0.1", 4000)
    assert cookie == b"7." + mac.encode()
    assert verify_cookie(secret, cookie, [6, 7], "127.0.0.1", 4000) == 7
    assert verify_cookie(secret, cookie, [6], "127.0.0.1", 4000) == -1
    assert verify_cookie(secret, cookie, [7], "127.0.0.1", 4001) == -1
    assert verify_cookie(secret, b"x." + mac.encode(), [7], "127.0.0.1", 4000) == -1
    assert verify_cookie(secret, b"7" + cookie[1:] + b"0", [7], "127.0.0.1", 4000) == -1


def test_a_message_id_is_96_random_bits_in_lower_hex() -> None:
    first, second = new_message_id(), new_message_id()
    assert len(first) == 24 and first != second
    assert _parse(b"t m " + first) == Publish(b"t", b"m", first, b"t m " + first + b"\n")


def test_work_for_no_difficulty_is_empty_and_any_work_is_a_confirm_line() -> None:
    assert solve_work(COOKIE, 0) == b""
    assert _parse(format_confirm(COOKIE, solve_work(COOKIE, 0))[:-1]) == Confirm(COOKIE, b"")
    # the nonce is lower-case hex, the only form a confirm line may carry
    work = solve_work(COOKIE, 6, start=0xABC)
    assert work == work.lower() != work.upper()
    assert _parse(format_confirm(COOKIE, work)[:-1]) == Confirm(COOKIE, work)
