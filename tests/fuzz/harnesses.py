"""One fuzz harness per parser of untrusted bytes: ``harness(data: bytes) -> None``.

Each harness feeds `data` to its parsers and asserts their contract:

- the parser returns a value or raises its documented error type (a `CodecError` subclass,
  `FrameError`, ...); any other exception (IndexError, struct.error, UnicodeDecodeError,
  RecursionError, an AssertionError below) escapes and is a crash;
- where the codec has an encoder, a decoded value re-encodes, and the encoding decodes to the
  same value (round trip);
- where two parsers read the same bytes (a fast path and the general one), they agree.

The same functions run under atheris (`tests.fuzz.run`, coverage-guided) and in plain unit
tests (the corpus replay and the regression inputs of `tests/fuzz/test_harnesses.py`).
`HARNESSES` is the registry: name -> harness; the corpus directory of each is
``tests/fuzz/corpus/<name>/``.
"""

from __future__ import annotations

from collections.abc import Callable

from echo import protocol
from echo.channels import wire
from echo.lobby import games, hello, listings
from echo.lobby import protocol as lobby
from echo.lobby.web import jsonwire
from echo.session import keywire, resume
from echo.tickets import core as tickets
from echo.tickets import keyfile
from echo.topics import codec as topics
from echo.transport.core import frames
from tests.fuzz.registry import COVERS

Harness = Callable[[bytes], None]

# --- Echo 2.0 messages (echo.protocol): never raise, BadMessage for anything else --------------

_ECHO_PARSERS = (
    protocol.parse_server_message_untrusted,
    protocol.parse_all_clients_reply_untrusted,
    protocol.parse_duologue_request_untrusted,
    protocol.parse_duologue_reply_untrusted,
)


def _echo_reparse(message: protocol.Message, parser: Callable[[bytes], object]) -> None:
    again = parser(protocol.format_message(message))
    assert again == message, (message, again)


def echo_protocol(data: bytes) -> None:
    for parser in _ECHO_PARSERS:
        message = parser(data)
        if not isinstance(message, protocol.BadMessage):
            _echo_reparse(message, parser)
    for credentials in (False, True):
        got = protocol.parse_hello_untrusted(data, credentials=credentials)
        if isinstance(got, protocol.Hello):
            again = protocol.parse_hello_untrusted(
                protocol.format_message(got), credentials=credentials
            )
            assert again == got, (got, again)
            assert credentials or not got.credentials
        else:
            assert isinstance(got, protocol.BadMessage)


# --- the session handshake's key tails (echo.session.keywire): never raise ------------------


def session_handshake(data: bytes) -> None:
    """The client's key after its HELLO and the server's after its CONNECT: either no tail
    (the data back as it came), a BadMessage, or the message and a key of the exact sizes that
    append back to the same bytes."""
    for split, append in (
        (keywire.split_hello_key, keywire.append_hello_key),
        (keywire.split_connect_key, keywire.append_connect_key),
    ):
        got = split(data)
        if isinstance(got, protocol.BadMessage):
            continue
        message, key = got
        if key is None:
            assert bytes(message) == data
            continue
        if isinstance(key, keywire.HelloKey):
            assert len(key.client_public) == keywire.KEY_BYTES
        else:
            assert len(key.server_public) == keywire.KEY_BYTES
            assert len(key.server_nonce) == keywire.SERVER_NONCE_BYTES
            assert len(key.tag) == keywire.CONFIRM_BYTES
        again = append(bytes(message), key)  # type: ignore[arg-type]
        assert split(again) == (bytes(message), key), (data, again)


# --- the session's resume extension (echo.session.resume): never raise -------------------------


def session_resume(data: bytes) -> None:
    for credentials in (False, True):
        request = resume.parse_client_request_untrusted(data, credentials=credentials)
        again: object
        if isinstance(request, resume.Resume):
            again = resume.parse_client_request_untrusted(
                resume.format_resume(request), credentials=credentials
            )
            # A proof is checked in constant time, whatever its length.
            assert resume.check_proof(1, request.session_id, request.counter, 0, request.proof) in (
                True,
                False,
            )
        elif isinstance(request, resume.ResumableHello):
            again = resume.parse_client_request_untrusted(
                resume.format_resumable_hello(request), credentials=credentials
            )
        elif isinstance(request, protocol.Hello):
            again = resume.parse_client_request_untrusted(
                protocol.format_message(request), credentials=credentials
            )
        else:
            assert isinstance(request, protocol.BadMessage), request
            again = request
        assert again == request, (request, again)
    reply = resume.parse_server_reply_untrusted(data)
    if isinstance(reply, resume.ResumableConnect):
        encoded = resume.format_resumable_connect(reply)
    elif isinstance(reply, resume.Resumed):
        encoded = resume.format_resumed(reply)
    elif isinstance(reply, protocol.Connect | protocol.AllClientsError):
        encoded = protocol.format_message(reply)
    else:
        assert isinstance(reply, protocol.BadMessage), reply
        return
    assert resume.parse_server_reply_untrusted(encoded) == reply


# --- Aeron frames (echo.transport.core.frames): what the receiver applies to datagrams -----------


def _reencode(frame: frames.Frame, data: bytes) -> bytes:
    """The datagram `frame` was read from, made again by its encoder."""
    if isinstance(frame, frames.DataHeader):
        # The header is the first 32 bytes; the rest of the chain is carried as it was.
        return frame.encode() + data[frames.DATA_HEADER_LENGTH :]
    return frame.encode()


def aeron_frames(data: bytes) -> None:
    try:
        frame: frames.Frame | None = frames.parse_datagram_untrusted(data)
    except frames.FrameError as error:
        assert error.reason and error.reason.isidentifier(), error.reason
        frame = None
    # The receiver's fast path says the same as the general parser.
    try:
        fields = frames.parse_data_untrusted(data)
    except frames.FrameError:
        assert frame is None
        fields = None
    if fields is not None:
        assert isinstance(frame, frames.DataHeader), frame
        assert fields == (
            frame.frame_length,
            frame.flags,
            frame.type,
            frame.term_offset,
            frame.session_id,
            frame.stream_id,
            frame.term_id,
            frame.reserved_value,
        )
    elif isinstance(frame, frames.DataHeader):
        raise AssertionError("parse_data_untrusted refused a DATA/PAD datagram")
    if frame is not None:
        again = frames.parse_datagram_untrusted(_reencode(frame, data))
        assert again == frame, (frame, again)
        try:
            headers = list(frames.iter_data_frames_untrusted(data))
        except frames.FrameError as error:
            assert not isinstance(frame, frames.DataHeader) and error.reason == "not_data"
        else:
            assert headers[0] == frame
    # A run of GRO segments: any segment size, never raises; a run it accepts is datagrams that
    # each parse on their own, the first with the same header.
    for parts in (2, 3, 4):
        segment = len(data) // parts & ~31
        run = frames.parse_data_run_untrusted(data, segment)
        if run is not None:
            for start in range(0, len(data), segment):
                assert frames.parse_data_untrusted(data[start : start + segment]) is not None
            assert run == frames.parse_data_untrusted(data[:segment])


# --- the lobby protocol (echo.lobby.protocol) ----------------------------------------------------


def lobby_protocol(data: bytes) -> None:
    try:
        message = lobby.parse_message_untrusted(data)
    except lobby.LobbyProtocolError:
        message = None
    # The server's request parser and the client's reply/update parser split the messages.
    try:
        request = lobby.parse_request_untrusted(data)
    except lobby.LobbyProtocolError:
        request = None
    try:
        server_message = lobby.parse_server_message_untrusted(data)
    except lobby.LobbyProtocolError:
        server_message = None
    if message is None:
        assert request is None and server_message is None
        return
    assert (request is None) != (server_message is None)
    assert message in (request, server_message)
    assert lobby.parse_message_untrusted(lobby.encode(message)) == message


def lobby_json(data: bytes) -> None:
    """The WebSocket door's JSON (`echo.lobby.web.jsonwire`): a frame's text is a request, a
    server message, a hello, or a JsonProtocolError, nothing else (deep nesting, huge numbers,
    NaN, duplicate keys, lone surrogates included). What loads dumps and loads back to the
    same message, and a request's binary form is the same message or a LobbyProtocolError
    (a JSON string within its field's limit can still make a message over the binary size)."""
    try:
        text = data.decode("utf-8")  # (the door gets text frames, UTF-8 checked by wsproto)
    except UnicodeDecodeError:
        return
    try:
        obj = jsonwire.loads(text)
    except jsonwire.JsonProtocolError:
        return
    loaded = 0
    for load in (jsonwire.load_request, jsonwire.load_server_message):
        try:
            message = load(obj)
        except jsonwire.JsonProtocolError:
            continue
        loaded += 1
        again = load(jsonwire.loads(jsonwire.dumps(jsonwire.dump_message(message))))
        assert again == message, (message, again)
        try:
            binary = lobby.encode(message)
        except lobby.LobbyProtocolError:
            continue
        assert lobby.parse_message_untrusted(binary) == message
    assert loaded <= 1  # the two sides' types are apart
    try:
        greeting = jsonwire.load_hello(obj)
    except jsonwire.JsonProtocolError:
        return
    assert jsonwire.load_hello(jsonwire.dump_hello(greeting)) == greeting


def lobby_hello(data: bytes) -> None:
    try:
        got = hello.parse_hello_untrusted(data)
    except hello.HelloError:
        pass
    else:
        assert hello.parse_hello_untrusted(hello.encode_hello(got)) == got
    server_id = hello.parse_welcome_untrusted(data)
    if server_id is not None:
        assert hello.parse_welcome_untrusted(hello.encode_welcome(server_id)) == server_id


def lobby_games(data: bytes) -> None:
    try:
        announcement = games.parse_announcement_untrusted(data)
    except lobby.LobbyProtocolError:
        return
    encoded = games.encode_announcement(announcement)
    assert games.parse_announcement_untrusted(encoded) == announcement


def lobby_listings(data: bytes) -> None:
    try:
        record = listings.parse_listing_record_untrusted(data)
    except lobby.LobbyProtocolError:
        return
    encoded = listings.encode_listing_record(record)
    assert listings.parse_listing_record_untrusted(encoded) == record


# --- the logical channels' frames (echo.channels.wire) ------------------------------------------


def channels_wire(data: bytes) -> None:
    try:
        decoded = wire.decode_frames(data)
    except wire.WireError:
        try:
            wire.decode_frames_raw(data)
        except wire.WireError:
            return
        raise AssertionError("decode_frames_raw accepted what decode_frames refused") from None
    raw = wire.decode_frames_raw(data)
    assert [wire.Data(*f) if isinstance(f, tuple) else f for f in raw] == decoded
    encoded = b"".join(wire.encode(f) for f in decoded)
    assert wire.decode_frames(encoded) == decoded


# --- the topics codec (echo.topics.codec) --------------------------------------------------------

_COOKIE_SECRET = b"fuzz" * 8


def _topics_line(line: topics.Line) -> None:
    if isinstance(line, topics.Subscribe):
        again = topics.parse_line(topics.format_subscribe(topics.decode(line.topic))[:-1])
    elif isinstance(line, topics.Publish):
        encoded = topics.format_publish(
            topics.decode(line.topic), topics.decode(line.message), line.message_id
        )
        # Canonical fields: the line a server forwards is the line a publisher makes.
        assert encoded == line.line, (encoded, line.line)
        again = topics.parse_line(encoded[:-1])
    elif isinstance(line, topics.Cookie):
        again = topics.parse_line(topics.format_cookie(line.cookie, line.difficulty)[:-1])
    elif isinstance(line, topics.Confirm):
        again = topics.parse_line(topics.format_confirm(line.cookie, line.work)[:-1])
        assert topics.verify_cookie(_COOKIE_SECRET, line.cookie, (0, 1), "127.0.0.1", 9) in (
            -1,
            0,
            1,
        )
        assert 0 <= topics.work_bits(line.cookie, line.work) <= 256
    elif isinstance(line, topics.Life):
        assert 0 <= line.seconds < 1e9
        again = line  # format_life writes whole seconds: not a round trip
    elif isinstance(line, topics.Pad):
        again = line
    else:
        assert isinstance(line, topics.Malformed) and line.reason in topics.MALFORMED_REASONS
        again = line
    assert again == line, (line, again)


def topics_codec(data: bytes) -> None:
    for line in topics.parse_datagram(data):
        _topics_line(line)
    # One field: decoded only if canonical, and the canonical encoding is the only spelling.
    try:
        field = topics.decode(data)
    except topics.CodecError:
        assert not topics.is_canonical(data)
    else:
        assert topics.is_canonical(data)
        assert topics.encode(field) == data
    assert topics.decode(topics.encode(data)) == data
    # A cookie straight from a datagram: valid for a source, or -1; never raises.
    assert topics.verify_cookie(_COOKIE_SECRET, data, (0, 1), "127.0.0.1", 9) == -1 or (
        data == topics.make_cookie(_COOKIE_SECRET, int(data.split(b".")[0]), "127.0.0.1", 9)
    )


# --- game tickets and seat tags (echo.tickets) ---------------------------------------------------

_TICKET_KEYS = {key_id: bytes([key_id]) * 32 for key_id in (1, 2)}


def tickets_codec(data: bytes) -> None:
    try:
        claims, body = tickets.decode_ticket_untrusted(data)
    except tickets.TicketError:
        claims = None
    else:
        # The claims re-issue to the same body, under any key.
        key = tickets.TicketKey(claims.key_id, b"k" * 32)
        reissued = tickets.issue(
            key,
            claims.lobby_id,
            claims.member_id,
            claims.server_id,
            claims.expires_at,
            match_id=claims.match_id,
            roster=claims.roster,
            metadata=claims.metadata,
            version=claims.version,
        )
        assert reissued[: -tickets.MAC_BYTES] == body, (reissued, body)
        assert tickets.decode_ticket_untrusted(reissued)[0] == claims
    verdict = tickets.verify(data, _TICKET_KEYS, "game-1", 1_800_000_000.0)
    if isinstance(verdict, tickets.TicketClaims):
        assert verdict == claims
    else:
        assert isinstance(verdict, tickets.TicketRefusal)
        assert verdict.reason in tickets.TicketReason
    seats = tickets.TicketSeats(
        tickets.TicketKey(1, _TICKET_KEYS[1]), ttl=60, clock=lambda: 1_800_000_000.0
    )
    assert seats.check(data, 7, "alice") in (True, False)
    assert seats.tag_matches(data, 7, "alice", b"s" * 16) in (True, False)


def ticket_key_file(data: bytes) -> None:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return  # read_key_file refuses the file before parsing (KeyFileError)
    try:
        keys = keyfile.parse_key_text(text)
    except keyfile.KeyFileError:
        return
    assert keys and len({key.key_id for key in keys}) == len(keys)
    written = "".join(f"{key.key_id} {key.secret.hex()}\n" for key in keys)
    assert keyfile.parse_key_text(written) == keys


# The registry: name -> harness. The corpus of each is tests/fuzz/corpus/<name>/.
HARNESSES: dict[str, Harness] = {
    "echo_protocol": echo_protocol,
    "session_resume": session_resume,
    "aeron_frames": aeron_frames,
    "lobby_protocol": lobby_protocol,
    "lobby_hello": lobby_hello,
    "lobby_json": lobby_json,
    "lobby_games": lobby_games,
    "lobby_listings": lobby_listings,
    "channels_wire": channels_wire,
    "topics_codec": topics_codec,
    "tickets": tickets_codec,
    "ticket_key_file": ticket_key_file,
    # --- session encryption: the handshake's key messages (to come) -------------------------
    "session_handshake": session_handshake,
}
if set(HARNESSES) != set(COVERS):  # pragma: no cover - a harness added in one place only
    raise TypeError(f"harnesses and their COVERS differ: {set(HARNESSES) ^ set(COVERS)}")
