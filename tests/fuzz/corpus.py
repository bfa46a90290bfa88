"""The seed corpus of every fuzz harness: valid inputs made by the encoders, a few per parser.

    python -m tests.fuzz.corpus          # (re)writes tests/fuzz/corpus/<name>/seed-*

Each seed is written as ``seed-<sha1 prefix>`` so a regeneration with the same encoders leaves
the tree unchanged. Inputs that once crashed a parser live beside them as ``regression-*``
files (`REGRESSIONS`); they are written by the same command and replayed by the test suite.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterable
from pathlib import Path

from echo import protocol
from echo.channels import wire
from echo.lobby import games, hello, listings
from echo.lobby import protocol as lobby
from echo.session import keywire, resume
from echo.tickets import core as tickets
from echo.topics import codec as topics
from echo.transport.core import frames
from tests.fuzz.harnesses import HARNESSES

CORPUS = Path(__file__).resolve().parent / "corpus"


def _echo_protocol() -> Iterable[bytes]:
    yield protocol.format_message(protocol.Hello(0xCAFE))
    yield protocol.format_message(protocol.Hello(1, b"\x00ticket\xff"))
    yield protocol.format_message(protocol.Connect(-5, 40001, 40002, 0xDEADBEEF))
    yield protocol.format_message(protocol.AllClientsError(7, protocol.ERROR_SERVER_FULL))
    yield protocol.format_message(protocol.Echo("hello ✌"))
    yield protocol.format_message(protocol.DuologueError(protocol.ERROR_BAD_MESSAGE))


def _session_handshake() -> Iterable[bytes]:
    client = keywire.HelloKey(bytes(range(keywire.KEY_BYTES)))
    server = keywire.ConnectKey(
        bytes(range(100, 100 + keywire.KEY_BYTES)),
        bytes(keywire.SERVER_NONCE_BYTES),
        b"\xaa" * keywire.CONFIRM_BYTES,
    )
    yield keywire.append_hello_key(protocol.format_message(protocol.Hello(0xAB)), client)
    yield keywire.append_connect_key(
        protocol.format_message(protocol.Connect(-5, 40001, 40002, 0xDEADBEEF)), server
    )


def _session_resume() -> Iterable[bytes]:
    pad = 0x0123456789ABCDEF0123456789ABCDEF
    yield resume.format_resumable_hello(resume.ResumableHello(protocol.Hello(0xAB), pad))
    yield resume.format_resumable_hello(resume.ResumableHello(protocol.Hello(2, b"cred"), pad))
    connect = protocol.Connect(-3, 40001, 40002, 0x1234)
    yield resume.format_resumable_connect(resume.ResumableConnect(connect, pad))
    yield resume.format_resume(resume.Resume(42, 1, 7, resume.resume_proof(pad, 42, 1, 7)))
    yield resume.format_resumed(resume.Resumed(-3, 12))
    yield protocol.format_message(protocol.Hello(0xAB))


def _aeron_frames() -> Iterable[bytes]:
    payload = b"ECHO hi"
    header = frames.DataHeader(32 + len(payload), 0xC0, 64, 5, 1001, 9)
    one = header.encode() + payload + bytes(-len(payload) % 32)
    yield one
    # a chain of two frames, as a sender batches them
    second = frames.DataHeader(32 + len(payload), 0xC0, 64 + len(one), 5, 1001, 9)
    yield one + second.encode() + payload + bytes(-len(payload) % 32)
    yield frames.DataHeader(0, 0xC0, 128, 5, 1001, 9).encode()  # heartbeat
    yield frames.DataHeader(4096, 0, 96, 5, 1001, 9, type=frames.FrameType.PAD).encode()
    yield frames.Setup(0, 5, 1001, 9, 9, 65536, 1408, 0).encode()
    yield frames.StatusMessage(5, 1001, 9, 64, 131072, 77).encode()
    yield frames.StatusMessage(5, 1001, 9, 64, 131072, 77, group_tag=3, flags=0x80).encode()
    yield frames.Nak(5, 1001, 9, 64, 1408).encode()
    yield frames.Rttm(5, 1001, 123456789, 0, 77, 0x80).encode()
    yield frames.ErrorFrame(5, 1001, 77, 1, "rejected", group_tag=4).encode()
    yield frames.ResponseSetup(5, 1001, 6).encode()


def _lobby_protocol() -> Iterable[bytes]:
    # The protocol tests' samples: every message type, and the edge values of the fields.
    from tests.lobby.test_protocol import EDGES, SAMPLES

    for message in [*SAMPLES, *EDGES]:
        yield lobby.encode(message)


def _lobby_hello() -> Iterable[bytes]:
    yield hello.encode_hello(hello.Hello("ålice"))
    yield hello.encode_hello(hello.Hello("bob", b"\x01seat", bytes(range(16))))
    yield hello.encode_welcome("lobby-a")


def _lobby_json() -> Iterable[bytes]:
    # The JSON form of every sample message, a hello, and a few texts just off the grammar.
    from echo.lobby.web import jsonwire
    from tests.lobby.test_protocol import SAMPLES

    for message in SAMPLES:
        yield jsonwire.dumps(jsonwire.dump_message(message)).encode()
    full = hello.Hello("ålice", b"\x01seat", bytes(range(16)), b"a.b.c", b"resume")
    yield jsonwire.dumps(jsonwire.dump_hello(full)).encode()
    yield b'{"type": "join_lobby", "request_id": 1, "lobby_id": "18446744073709551615"}'
    yield b'{"type": "set_metadata", "request_id": 2, "lobby_id": "3", "changes": {"a": null}}'
    yield b'[[[[{"type": "hello", "v": 1e400}]]]]'


def _lobby_games() -> Iterable[bytes]:
    yield games.encode_announcement(games.GameServerAnnouncement("game-1", "127.0.0.1:40123", 8))
    yield games.encode_announcement(games.GameServerAnnouncement("g", "[::1]:1", 0xFFFF))
    yield games.encode_announcement(
        games.GameServerAnnouncement(
            "eu-1", "10.0.0.1:7000", 8, 7001, "shared", {"region": "eu", "mode": "ctf"}
        )
    )
    yield bytes.fromhex("0106") + b"game-1" + bytes.fromhex("0f") + b"127.0.0.1:40123" + b"\x00\x08"


def _lobby_listings() -> Iterable[bytes]:
    listing = lobby.LobbyListing(77, "room", 3, 8, {"mode": "ffa", "skill": -3}, "lobby-b")
    yield listings.encode_listing_record(listing)
    yield listings.encode_listing_record(listings.ListingGone(77, "lobby-b"))


def _channels_wire() -> Iterable[bytes]:
    ref = wire.HandleRef(3, 5, True)
    yield wire.encode(wire.Data(0, b"hello"))
    yield wire.encode(wire.Data(200, b"x" * 200))
    yield wire.encode(wire.Data(1, b"refs", (ref, wire.HandleRef(4, 0, False))))
    yield wire.encode(wire.Bind(3, b"value"))
    yield b"".join(
        wire.encode(f)
        for f in (
            wire.Guarantee(1, 4096),
            wire.Absolve(1, 10),
            wire.Plead(1, 2048),
            wire.LimitSending(1, 2**40),
            wire.LimitReceiving(1, 0),
            wire.AnnounceDropping(2),
            wire.Apologise(2),
            wire.FreeHandle(3, 5, True),
        )
    )


def _topics_codec() -> Iterable[bytes]:
    cookie = topics.make_cookie(b"fuzz" * 8, 1, "127.0.0.1", 9)
    yield topics.format_subscribe(b"lobby/eu:1")
    yield topics.format_publish(b"lobby/eu", b"hello world!\n", b"id_1")
    yield topics.format_pad(40) + topics.format_subscribe(b"a b") + topics.format_confirm(cookie)
    yield topics.format_cookie(cookie, 8) + topics.format_life(30)
    yield topics.format_confirm(cookie, b"1f") + topics.format_publish(b"t", b"\x00\xff")
    yield cookie


def _tickets() -> Iterable[bytes]:
    key = tickets.TicketKey(1, bytes([1]) * 32)
    yield tickets.issue(key, 77, "ålice", "game-1", 1_800_000_030.0)
    yield tickets.issue(key, 2**64 - 1, "m" * 255, "s", 0.0)
    yield tickets.issue(key, 77, "ålice", "game-1", 1_800_000_030.0, version=1)
    yield tickets.issue(
        key,
        77,
        "ålice",
        "game-1",
        1_800_000_030.0,
        match_id=2**64 - 1,
        roster=(
            tickets.RosterEntry("ålice", {"team": "red", "skill": -5}),
            tickets.RosterEntry("bob", {}),
        ),
        metadata={"mode": "ctf", "round": 2**63 - 1},
    )
    seats = tickets.TicketSeats(key, ttl=60, clock=lambda: 1_800_000_000.0)
    yield seats.issue(7, "alice")
    yield seats.tag(7, "alice", b"s" * 16)


def _ticket_key_file() -> Iterable[bytes]:
    yield b"1 " + b"ab" * 32 + b"\n"
    yield b"# rotation: the new key signs\n2 " + b"cd" * 32 + b"\n1 " + b"ab" * 32 + b"  # old\n"
    yield b"00112233445566778899aabbccddeeff\n"


SEEDS = {
    "echo_protocol": _echo_protocol,
    "session_resume": _session_resume,
    "aeron_frames": _aeron_frames,
    "lobby_protocol": _lobby_protocol,
    "lobby_hello": _lobby_hello,
    "lobby_json": _lobby_json,
    "lobby_games": _lobby_games,
    "lobby_listings": _lobby_listings,
    "channels_wire": _channels_wire,
    "topics_codec": _topics_codec,
    "tickets": _tickets,
    "ticket_key_file": _ticket_key_file,
    "session_handshake": _session_handshake,
}

#: Inputs that crashed a parser once (found by the fuzzers), per harness: kept in the corpus so
#: that every run starts from them, and replayed by tests/fuzz/test_harnesses.py.
REGRESSIONS: dict[str, list[bytes]] = {
    # An expiry of 2**64 - 1.6e9 ms: its float seconds rounded, so the claims differed from
    # the signed bytes (tickets now carry at most MAX_EXPIRY_MILLIS).
    "tickets": [
        bytes.fromhex(
            "010100000000000000ffffffffa3185d3a6005616c6963650b006c6f6262792d736561743a9c9444"
            "a0de5aae2a63e39c24a4f362662edb30a286d5b05ab3d5870406a3b7"
        )
    ],
}


def _name(prefix: str, data: bytes) -> str:
    return f"{prefix}-{hashlib.sha1(data).hexdigest()[:16]}"


def files() -> dict[str, dict[str, bytes]]:
    """Harness -> file name -> bytes: what the corpus directory of each holds."""
    out: dict[str, dict[str, bytes]] = {}
    for name, seeds in SEEDS.items():
        out[name] = {_name("seed", data): data for data in seeds()}
        out[name].update({_name("regression", data): data for data in REGRESSIONS.get(name, [])})
    return out


def write() -> None:
    if set(SEEDS) != set(HARNESSES):
        raise SystemExit(f"seeds and harnesses differ: {set(SEEDS) ^ set(HARNESSES)}")
    for name, contents in files().items():
        directory = CORPUS / name
        directory.mkdir(parents=True, exist_ok=True)
        for stale in directory.iterdir():
            if stale.name not in contents:
                stale.unlink()
        for file_name, data in contents.items():
            (directory / file_name).write_bytes(data)
        print(f"{name}: {len(contents)} files", file=sys.stderr)


if __name__ == "__main__":
    write()
