"""The keys a lobby member pins: the ring's, and the game servers' carried in announcements and
GameStarting (pure: wire forms and the pin rules)."""

from __future__ import annotations

import attrs
import pytest

from echo.lobby.games import (
    GameServerAnnouncement,
    encode_announcement,
    parse_announcement_untrusted,
)
from echo.lobby.keys import game_pin, parse_public_key, ring_pins
from echo.lobby.protocol import (
    GameDetails,
    GameStarting,
    LobbyProtocolError,
    encode,
    parse_server_message_untrusted,
)
from echo.session.crypto import BadKey, BadPin, Pin, ServerKey, fingerprint

KEY = ServerKey.generate()


def test_an_announcement_without_a_key_carries_none_and_version_1_still_parses() -> None:
    plain = GameServerAnnouncement("g1", "10.0.0.1:9000", 8, 9001, "shared", {"region": "eu"})
    data = encode_announcement(plain)
    assert parse_announcement_untrusted(data) == plain
    assert parse_announcement_untrusted(data).public_key == b""
    # What lobby servers from before tags and keys sent: no tags, no key.
    old = parse_announcement_untrusted(b"\x01\x02g1\x0d10.0.0.1:9000\x00\x08")
    assert old == GameServerAnnouncement("g1", "10.0.0.1:9000", 8)


def test_an_announcement_with_a_key_ends_with_it_and_round_trips() -> None:
    plain = GameServerAnnouncement("g1", "10.0.0.1:9000", 8, 9001, "shared", {"region": "eu"})
    keyed = attrs.evolve(plain, public_key=KEY.public)
    data = encode_announcement(keyed)
    assert data == encode_announcement(plain) + KEY.public
    assert parse_announcement_untrusted(data) == keyed
    with pytest.raises(LobbyProtocolError):
        parse_announcement_untrusted(data[:-1])  # a key one byte short
    with pytest.raises(LobbyProtocolError):
        parse_announcement_untrusted(data + b"\x00")
    with pytest.raises(LobbyProtocolError):
        encode_announcement(attrs.evolve(plain, public_key=b"\x01" * 31))


def test_game_starting_carries_the_key_as_the_details_trailing_field() -> None:
    details = GameDetails(7, 9001, "shared")
    plain = GameStarting(5, "g1", "10.0.0.1:9000", b"ticket", details)
    keyed = GameStarting(
        5, "g1", "10.0.0.1:9000", b"ticket", attrs.evolve(details, server_key=KEY.public)
    )
    assert keyed.server_key == KEY.public and plain.server_key == b""
    assert encode(keyed) == encode(plain) + b"\x20" + KEY.public
    assert parse_server_message_untrusted(encode(plain)) == plain
    assert parse_server_message_untrusted(encode(keyed)) == keyed
    with pytest.raises(LobbyProtocolError, match="31 bytes"):
        parse_server_message_untrusted(encode(plain) + b"\x1f" + KEY.public[:31])
    with pytest.raises(LobbyProtocolError):
        bad = attrs.evolve(details, server_key=b"\x01" * 33)
        encode(GameStarting(5, "g1", "a:1", b"t", bad))


def test_game_pin_pins_the_announced_key() -> None:
    assert game_pin(b"") is None
    pin = game_pin(KEY.public)
    assert pin is not None and pin.matches(KEY.public)
    assert not pin.matches(ServerKey.generate().public)
    with pytest.raises(BadKey):
        game_pin(b"\x01" * 16)


def test_parse_public_key_takes_the_printed_key_only() -> None:
    assert parse_public_key(KEY.public_text) == KEY.public
    assert parse_public_key(KEY.public_text.upper() + "\n") == KEY.public
    for bad in (KEY.fingerprint, KEY.public_text[:-1], "!" * 52, ""):
        with pytest.raises(BadKey):
            parse_public_key(bad)


def test_ring_pins_one_key_for_all_or_one_per_server() -> None:
    ring = ["a:1", "b:1"]
    assert ring_pins(ring, None) == {"a:1": None, "b:1": None}
    one = ring_pins(ring, KEY.public_text)
    assert one["a:1"] == one["b:1"] == Pin(fingerprint(KEY.public))
    other = ServerKey.generate()
    each = ring_pins(ring, {"a:1": KEY.public_text, "b:1": Pin(other.fingerprint)})
    assert each["a:1"] is not None and each["a:1"].matches(KEY.public)
    assert each["b:1"] is not None and each["b:1"].matches(other.public)
    with pytest.raises(ValueError, match="no key for b:1"):
        ring_pins(ring, {"a:1": KEY.public_text})
    with pytest.raises(ValueError, match="c:1, not on the list"):
        ring_pins(ring, {"a:1": KEY.public_text, "b:1": KEY.public_text, "c:1": "x"})
    with pytest.raises(BadPin):
        ring_pins(ring, "not a key")
