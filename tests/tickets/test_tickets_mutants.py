"""Tickets, seats and key files at their edges: each test here kills mutants of echo.tickets
that the behaviour tests let through (./dev mutate tickets; docs/mutation.md).

The bounds are checked on both sides of each edge, the refusals by their reason and their exact
words (what an operator reads in the log), and the seat tag against the layout its docstring
gives, computed here independently.
"""

from __future__ import annotations

import hashlib
import hmac
import struct

import pytest

from echo.tickets import KeyFileError, TicketError, TicketKey, TicketReason, issue, verify
from echo.tickets.core import (
    MAC_BYTES,
    MAX_EXPIRY_MILLIS,
    MAX_TICKET_BYTES,
    MIN_KEY_BYTES,
    MIN_TICKET_BYTES,
    SEAT_SERVER_ID,
    SEAT_TAG_BYTES,
    TicketClaims,
    TicketIssuer,
    TicketRefusal,
    TicketSeats,
    decode_ticket_untrusted,
)
from echo.tickets.keyfile import new_key_text, parse_key_text, read_key_file

KEY = TicketKey(7, bytes(range(32)))
NOW = 1_700_000_000.0


def _refusal(result: TicketClaims | TicketRefusal) -> TicketRefusal:
    assert isinstance(result, TicketRefusal), result
    return result


def _signed(body: bytes, secret: bytes = KEY.secret) -> bytes:
    return body + hmac.new(secret, body, hashlib.sha256).digest()


def _body(*ids: bytes, version: int = 1, key_id: int = 7, lobby: int = 5, millis: int = 9) -> bytes:
    return struct.pack(">BBQQ", version, key_id, lobby, millis) + b"".join(
        bytes((len(i),)) + i for i in ids
    )


# -- key files ------------------------------------------------------------------------------


def test_a_comment_may_hold_further_hashes() -> None:
    secret = "ab" * MIN_KEY_BYTES
    keys = parse_key_text(f"3 {secret}  # rotated # 2026-12\n")
    assert keys == [TicketKey(3, bytes.fromhex(secret))]


def test_a_new_key_file_holds_key_id_1_unless_told() -> None:
    (key,) = parse_key_text(new_key_text())
    assert key.key_id == 1 and len(key.secret) == 32
    assert parse_key_text(new_key_text(9))[0].key_id == 9


def test_an_empty_key_file_says_so() -> None:
    with pytest.raises(KeyFileError, match=r"^no key in the file$"):
        parse_key_text("# nothing here\n\n")


def test_a_key_file_that_names_one_key_id_twice_is_refused_by_line(tmp_path) -> None:
    path = tmp_path / "game.key"
    path.write_text(f"# keys\n4 {'11' * 16}\n\n4 {'22' * 16}\n", encoding="utf-8")
    with pytest.raises(KeyFileError, match=r"^line 4: key id 4 appears twice \(first on line 2\)$"):
        read_key_file(path)


def test_a_key_file_is_read_as_utf8_whatever_the_locale(tmp_path) -> None:
    path = tmp_path / "game.key"
    path.write_bytes(f"# clé de l'équipe ☃\n1 {'33' * 16}\n".encode())
    assert read_key_file(path) == [TicketKey(1, bytes.fromhex("33" * 16))]


# -- keys -----------------------------------------------------------------------------------


@pytest.mark.parametrize("key_id", [-1, 256])
def test_a_key_id_outside_a_u8_is_refused(key_id: int) -> None:
    with pytest.raises(ValueError, match=r"^a key id is a u8$"):
        TicketKey(key_id, bytes(MIN_KEY_BYTES))


def test_a_short_ticket_key_is_refused() -> None:
    with pytest.raises(ValueError, match=rf"^a ticket key has at least {MIN_KEY_BYTES} bytes$"):
        TicketKey(1, bytes(MIN_KEY_BYTES - 1))


# -- issuing --------------------------------------------------------------------------------


@pytest.mark.parametrize("lobby_id", [0, 2**64 - 1])
def test_every_u64_is_a_lobby_id(lobby_id: int) -> None:
    claims = verify(issue(KEY, lobby_id, "m", "s", NOW + 5), KEY, "s", NOW)
    assert isinstance(claims, TicketClaims) and claims.lobby_id == lobby_id


@pytest.mark.parametrize("lobby_id", [-1, 2**64])
def test_a_lobby_id_outside_a_u64_is_refused(lobby_id: int) -> None:
    with pytest.raises(TicketError, match=r"^a lobby id is a u64$"):
        issue(KEY, lobby_id, "m", "s", NOW)


@pytest.mark.parametrize("expiry", [float("inf"), float("nan")])
def test_an_infinite_expiry_is_refused(expiry: float) -> None:
    with pytest.raises(TicketError, match=r"^the expiry is not a finite time$"):
        issue(KEY, 1, "m", "s", expiry)


@pytest.mark.parametrize("millis", [0, MAX_EXPIRY_MILLIS])
def test_every_expiry_in_range_is_signed_exactly(millis: int) -> None:
    claims, _ = decode_ticket_untrusted(issue(KEY, 1, "m", "s", millis / 1000))
    assert claims.expires_at == millis / 1000


@pytest.mark.parametrize("millis", [-1, MAX_EXPIRY_MILLIS + 1])
def test_an_expiry_out_of_range_is_refused(millis: int) -> None:
    with pytest.raises(TicketError, match=rf"^the expiry is not 0..{MAX_EXPIRY_MILLIS} millisec"):
        issue(KEY, 1, "m", "s", millis / 1000)


def test_ids_of_255_bytes_fit_and_256_do_not() -> None:
    longest = "é" * 127 + "x"  # 255 bytes of UTF-8
    claims, _ = decode_ticket_untrusted(issue(KEY, 1, longest, longest, NOW))
    assert (claims.member_id, claims.server_id) == (longest, longest)
    with pytest.raises(TicketError, match=r"^member and server ids are 1..255 bytes of UTF-8$"):
        issue(KEY, 1, longest + "x", "s", NOW)
    with pytest.raises(TicketError, match=r"^member and server ids are 1..255 bytes of UTF-8$"):
        issue(KEY, 1, "m", "", NOW)


def test_an_id_that_is_not_encodable_is_refused_with_the_reason() -> None:
    with pytest.raises(TicketError, match=r"^an id is not encodable as UTF-8: surrogates not allo"):
        issue(KEY, 1, "\udcff", "s", NOW)


def test_the_issuers_refuse_a_lifetime_of_zero() -> None:
    with pytest.raises(ValueError, match=r"^a ticket lives a positive time$"):
        TicketIssuer(KEY, ttl=0, clock=lambda: NOW)
    with pytest.raises(ValueError, match=r"^a seat lives a positive time$"):
        TicketSeats(KEY, ttl=0, clock=lambda: NOW)


def test_the_issuers_take_a_lifetime_under_a_second() -> None:
    ticket = TicketIssuer(KEY, ttl=0.5, clock=lambda: NOW).issue(9, "m", "s")
    assert decode_ticket_untrusted(ticket)[0].expires_at == NOW + 0.5
    seat = TicketSeats(KEY, ttl=0.5, clock=lambda: NOW).issue(9, "m")
    assert decode_ticket_untrusted(seat)[0].expires_at == NOW + 0.5


def test_an_issuer_signs_for_its_lifetime_from_its_clock() -> None:
    ticket = TicketIssuer(KEY, ttl=30, clock=lambda: NOW).issue(9, "m", "s")
    claims = verify(ticket, KEY, "s", NOW + 29.9)
    assert claims == TicketClaims(9, "m", "s", NOW + 30, KEY.key_id)
    assert _refusal(verify(ticket, KEY, "s", NOW + 30)).reason is TicketReason.EXPIRED


# -- decoding -------------------------------------------------------------------------------


def test_the_shortest_and_longest_tickets_decode() -> None:
    # the size bound lets the shortest structure through to the parser, which names its fault
    shortest = _signed(_body(b"", b""))
    assert len(shortest) == MIN_TICKET_BYTES
    with pytest.raises(TicketError, match=r"^an id is empty$"):
        decode_ticket_untrusted(shortest)
    # the longest version 1 ticket (ids of 255 bytes) is within the bound that version 2's
    # roster and metadata set (600 bytes), and decodes
    longest = _signed(_body(b"m" * 255, b"s" * 255))
    assert len(longest) <= MAX_TICKET_BYTES
    assert decode_ticket_untrusted(longest)[0].server_id == "s" * 255


@pytest.mark.parametrize("size", [MIN_TICKET_BYTES - 1, MAX_TICKET_BYTES + 1])
def test_a_ticket_of_the_wrong_size_is_refused(size: int) -> None:
    with pytest.raises(
        TicketError, match=rf"^a ticket has {MIN_TICKET_BYTES}..{MAX_TICKET_BYTES} bytes$"
    ):
        decode_ticket_untrusted(bytes([1]) * size)


def test_decoding_names_each_fault() -> None:
    with pytest.raises(TicketError, match=r"^an id is empty$"):
        decode_ticket_untrusted(_signed(_body(b"", b"ss")))
    with pytest.raises(TicketError, match=r"^an id is not UTF-8$"):
        decode_ticket_untrusted(_signed(_body(b"\xff", b"s")))
    with pytest.raises(TicketError, match=r"^trailing bytes before the MAC$"):
        decode_ticket_untrusted(_signed(_body(b"m", b"s") + b".."))
    with pytest.raises(TicketError, match=r"^unknown ticket version 3$"):
        decode_ticket_untrusted(_signed(_body(b"m", b"s", version=3)))
    with pytest.raises(TicketError, match=rf"^an expiry of {2**50} ms is beyond"):
        decode_ticket_untrusted(_signed(_body(b"m", b"s", millis=2**50)))


# -- verifying ------------------------------------------------------------------------------


def test_a_two_byte_ticket_of_another_version_is_named_by_its_version() -> None:
    refusal = _refusal(verify(bytes([9, 7]), KEY, "s", NOW))
    assert refusal == TicketRefusal(TicketReason.UNKNOWN_VERSION, "ticket version 9")


@pytest.mark.parametrize("size", [MIN_TICKET_BYTES - 1, MAX_TICKET_BYTES + 1])
def test_verify_refuses_a_ticket_of_the_wrong_size(size: int) -> None:
    refusal = _refusal(verify(bytes([1, 7]) * (size // 2) + bytes(size % 2), KEY, "s", NOW))
    assert refusal == TicketRefusal(TicketReason.MALFORMED, f"a ticket of {size} bytes")


def test_verify_reaches_the_mac_at_both_size_limits() -> None:
    for body in (_body(b"", b""), _body(b"m" * 255, b"s" * 255)):
        raw = body + bytes(MAC_BYTES)
        assert MIN_TICKET_BYTES <= len(raw) <= MAX_TICKET_BYTES
        assert _refusal(verify(raw, KEY, "s", NOW)).reason is TicketReason.BAD_SIGNATURE


def test_verify_names_each_refusal() -> None:
    good = issue(KEY, 1, "m", "s", NOW + 5)
    other = TicketKey(8, bytes(32))
    assert _refusal(verify(good, other, "s", NOW)) == TicketRefusal(
        TicketReason.UNKNOWN_KEY, "key id 7 is not held here"
    )
    forged = good[:-1] + bytes([good[-1] ^ 1])
    assert _refusal(verify(forged, KEY, "s", NOW)) == TicketRefusal(
        TicketReason.BAD_SIGNATURE, "the signature does not match"
    )
    assert _refusal(verify(good, KEY, "t", NOW)) == TicketRefusal(
        TicketReason.WRONG_SERVER, "the ticket is for another game server"
    )
    assert _refusal(verify(good, KEY, "s", NOW + 5)) == TicketRefusal(
        TicketReason.EXPIRED, "the ticket has expired"
    )
    garbage = _signed(_body(b"", b"ss"))
    assert _refusal(verify(garbage, KEY, "s", NOW)) == TicketRefusal(
        TicketReason.MALFORMED, "an id is empty"
    )


# -- seats and seat tags --------------------------------------------------------------------


def _tag_by_hand(secret_key: bytes, lobby: int, member: str, secret: bytes) -> bytes:
    data = member.encode("utf-8", "surrogatepass")
    body = (
        b"echo-lobby seat tag 1\x00"
        + struct.pack(">QH", lobby, len(data))
        + data
        + struct.pack(">H", len(secret))
        + secret
    )
    return hmac.new(secret_key, body, hashlib.sha256).digest()[:16]


@pytest.mark.parametrize("member", ["m", "ünï", "\udcff"])
def test_a_seat_tag_is_the_key_id_and_the_documented_mac(member: str) -> None:
    seats = TicketSeats(KEY, ttl=60, clock=lambda: NOW)
    tag = seats.tag(2**40 + 3, member, b"s" * 16)
    assert len(tag) == SEAT_TAG_BYTES
    assert tag == bytes([KEY.key_id]) + _tag_by_hand(KEY.secret, 2**40 + 3, member, b"s" * 16)
    assert seats.tag_matches(tag, 2**40 + 3, member, b"s" * 16)


def test_a_seat_tag_matches_only_its_own_seat_and_secret() -> None:
    seats = TicketSeats(KEY, ttl=60, clock=lambda: NOW)
    tag = seats.tag(1, "m", b"secret")
    assert not seats.tag_matches(tag, 2, "m", b"secret")
    assert not seats.tag_matches(tag, 1, "n", b"secret")
    assert not seats.tag_matches(tag, 1, "m", b"secreT")
    assert not seats.tag_matches(tag, 1, "m", b"")
    assert not seats.tag_matches(tag[:-1], 1, "m", b"secret")
    assert not seats.tag_matches(tag + b"\x00", 1, "m", b"secret")
    assert not seats.tag_matches(bytes([8]) + tag[1:], 1, "m", b"secret")


def test_no_tag_matches_an_empty_secret_even_its_own() -> None:
    # a client without a hello secret must never be given a seat back by its tag
    seats = TicketSeats(KEY, ttl=60, clock=lambda: NOW)
    assert not seats.tag_matches(seats.tag(1, "m", b""), 1, "m", b"")


def test_a_tag_made_before_a_rotation_still_matches_with_the_retired_key() -> None:
    old = TicketKey(3, b"o" * 32)
    tag = TicketSeats(old, ttl=60, clock=lambda: NOW).tag(1, "m", b"secret")
    rotated = TicketSeats(KEY, ttl=60, clock=lambda: NOW, retired={3: old.secret})
    assert rotated.tag_matches(tag, 1, "m", b"secret")
    assert not TicketSeats(KEY, ttl=60, clock=lambda: NOW).tag_matches(tag, 1, "m", b"secret")


def test_a_seat_is_checked_for_its_lobby_member_and_lifetime() -> None:
    clock = [NOW]
    seats = TicketSeats(KEY, ttl=60, clock=lambda: clock[0])
    seat = seats.issue(4, "m")
    assert decode_ticket_untrusted(seat)[0].server_id == SEAT_SERVER_ID
    assert seats.check(seat, 4, "m")
    assert not seats.check(seat, 5, "m")
    assert not seats.check(seat, 4, "n")
    clock[0] = NOW + 60
    assert not seats.check(seat, 4, "m")
