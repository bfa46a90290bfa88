"""Echo 2.0 message codecs: the guide's lines, strict rejections, round trips (echo.protocol)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from echo.protocol import (
    ECHO_STREAM_ID,
    ERROR_BAD_MESSAGE,
    ERROR_TOO_MANY_FOR_IP,
    MAX_MESSAGE_BYTES,
    RESERVED_SESSION_HIGH,
    RESERVED_SESSION_LOW,
    AllClientsError,
    BadMessage,
    Connect,
    DuologueError,
    Echo,
    Hello,
    decrypt_session,
    encrypt_session,
    format_message,
    parse_all_clients_reply_untrusted,
    parse_duologue_reply_untrusted,
    parse_duologue_request_untrusted,
    parse_server_message_untrusted,
)

INT32 = st.integers(-(2**31), 2**31 - 1)
U32 = st.integers(0, 2**32 - 1)
PORT = st.integers(1, 65535)
LINE_TERMINATORS = ["\n", "\r", "\u0085", "\u2028", "\u2029"]
# Text the wire can carry: any code point except surrogates and Java's line terminators.
LINE_TEXT = st.text(
    alphabet=st.characters(
        blacklist_categories=["Cs"], blacklist_characters="".join(LINE_TERMINATORS)
    ),
    max_size=200,
)


def test_constants() -> None:
    assert ECHO_STREAM_ID == 541388802
    assert (RESERVED_SESSION_LOW, RESERVED_SESSION_HIGH) == (1, 2**31 - 1)
    assert MAX_MESSAGE_BYTES == 1024


# ---- the guide's example lines (io7m Aeron guide §4.7) ----------------------------------------


def test_guide_hello() -> None:
    assert parse_server_message_untrusted(b"HELLO 611786D9") == Hello(0x611786D9)
    assert format_message(Hello(0x611786D9)) == b"HELLO 611786D9"


def test_guide_connect() -> None:
    line = b"-555798973 CONNECT 9014 9011 129F3C18"
    msg = Connect(-555798973, 9014, 9011, 0x129F3C18)
    assert parse_all_clients_reply_untrusted(line) == msg
    assert format_message(msg) == line
    # The guide logs "(encrypted 312425496)" and the duologue session 1938340545.
    assert msg.encrypted_session == 312425496
    assert decrypt_session(msg.encrypted_session, 0x611786D9) == 1938340545
    assert encrypt_session(1938340545, 0x611786D9) == 0x129F3C18


def test_guide_all_clients_error() -> None:
    line = b"-2147483648 ERROR too many connections for IP address"
    msg = AllClientsError(-(2**31), ERROR_TOO_MANY_FOR_IP)
    assert parse_all_clients_reply_untrusted(line) == msg
    assert format_message(msg) == line


def test_guide_echo() -> None:
    line = b"ECHO 12cbcf2e9c84b2f0"
    assert parse_duologue_request_untrusted(line) == Echo("12cbcf2e9c84b2f0")
    assert parse_duologue_reply_untrusted(line) == Echo("12cbcf2e9c84b2f0")
    assert format_message(Echo("12cbcf2e9c84b2f0")) == line


def test_duologue_error() -> None:
    assert parse_duologue_reply_untrusted(b"ERROR bad message") == DuologueError(ERROR_BAD_MESSAGE)
    assert format_message(DuologueError(ERROR_BAD_MESSAGE)) == b"ERROR bad message"


# ---- formatting details ----------------------------------------------------------------------


def test_hello_is_uppercase_without_padding() -> None:
    assert format_message(Hello(0xA)) == b"HELLO A"
    assert format_message(Hello(0)) == b"HELLO 0"
    assert format_message(Hello(0xFFFFFFFF)) == b"HELLO FFFFFFFF"


def test_connect_encrypted_is_unsigned_uppercase_hex() -> None:
    assert format_message(Connect(0, 1, 65535, 0xDEADBEEF)) == b"0 CONNECT 1 65535 DEADBEEF"


def test_empty_texts_allowed() -> None:
    # Java `(.*)` matches the empty string.
    assert parse_duologue_request_untrusted(b"ECHO ") == Echo("")
    assert parse_duologue_reply_untrusted(b"ERROR ") == DuologueError("")
    assert parse_all_clients_reply_untrusted(b"5 ERROR ") == AllClientsError(5, "")
    assert format_message(Echo("")) == b"ECHO "


@pytest.mark.parametrize(
    "msg",
    [
        Hello(-1),
        Hello(2**32),
        Connect(2**31, 1, 1, 0),
        Connect(-(2**31) - 1, 1, 1, 0),
        Connect(1, 0, 1, 0),
        Connect(1, 1, 65536, 0),
        Connect(1, 1, 1, 2**32),
        Connect(1, 1, 1, -1),
        AllClientsError(2**31, "x"),
        AllClientsError(1, "a\nb"),
        Echo("a\rb"),
        Echo("\u2028"),
        DuologueError("\u0085"),
        Echo("\ud800"),  # lone surrogate: not encodable as UTF-8
        Echo("x" * (MAX_MESSAGE_BYTES - 4)),  # "ECHO " + 1020 = 1025 bytes
        Echo("é" * 510),  # 5 + 1020 bytes: the limit is in bytes, not characters
    ],
)
def test_format_refuses(msg: Hello | Connect | AllClientsError | Echo | DuologueError) -> None:
    with pytest.raises(ValueError):
        format_message(msg)


def test_format_accepts_exactly_max_bytes() -> None:
    data = format_message(Echo("x" * (MAX_MESSAGE_BYTES - 5)))
    assert len(data) == MAX_MESSAGE_BYTES
    assert parse_duologue_request_untrusted(data) == Echo("x" * (MAX_MESSAGE_BYTES - 5))
    assert isinstance(parse_duologue_request_untrusted(data + b"x"), BadMessage)


def test_format_refuses_non_message() -> None:
    with pytest.raises(TypeError):
        format_message("HELLO 1")  # type: ignore[arg-type]


# ---- strict rejections -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b"HELLO 611786d9",  # lowercase hex: the guide's regex is [0-9A-F]
        b"HELLO 1FFFFFFFF",  # 9 hex digits / > 0xFFFFFFFF: the guide's parseUnsignedInt threw
        b"HELLO 000000001",  # 9 digits even though the value fits
        b"HELLO ",
        b"HELLO",
        b"HELLO 12 ",  # trailing space
        b" HELLO 12",
        b"HELLO  12",
        b"HELLO 12\n",  # trailing newline: matches() needs the whole string
        b"HELLO -1",
        b"HELLO +1",
        b"hello 12",
        b"HELLO 0x12",
        b"HELLO \xd9\xa1",  # Arabic-Indic digit one: not [0-9A-F]
        b"ECHO 12",
        b"",
        b"\xff\xfe",
        b"HELLO 1" + b" " * MAX_MESSAGE_BYTES,
    ],
)
def test_server_rejects(data: bytes) -> None:
    assert isinstance(parse_server_message_untrusted(data), BadMessage)


@pytest.mark.parametrize(
    "data",
    [
        b"5 CONNECT 9014 9011 129f3c18",  # lowercase hex
        b"5 CONNECT 9014 9011 1129F3C18",  # 9 hex digits
        b"5 CONNECT 0 9011 1",  # port 0
        b"5 CONNECT 9014 65536 1",  # port > 65535
        b"5 CONNECT 9014 123456 1",
        b"5 CONNECT 9014 9011 1 ",  # trailing space
        b"5  CONNECT 9014 9011 1",
        b"5 CONNECT 9014 9011",
        b"5 CONNECT -9014 9011 1",
        b"2147483648 CONNECT 9014 9011 1",  # session beyond int32
        b"-2147483649 ERROR x",
        b"-0 ERROR x",  # not Integer.toString's form
        b"05 ERROR x",
        b"+5 ERROR x",
        b"12345678901 ERROR x",
        b"5 ERROR a\nb",  # newline inside the message
        b"5 ERROR x\r",
        b"5 ERROR",
        b"5 HELLO 1",
        b"CONNECT 9014 9011 1",  # no session prefix
        b"ERROR x",
        b"5 ERROR \xc3",  # invalid UTF-8
        b"5 ERROR " + b"x" * MAX_MESSAGE_BYTES,
    ],
)
def test_all_clients_reply_rejects(data: bytes) -> None:
    assert isinstance(parse_all_clients_reply_untrusted(data), BadMessage)


@pytest.mark.parametrize("term", LINE_TERMINATORS)
def test_echo_rejects_line_terminators(term: str) -> None:
    data = f"ECHO a{term}b".encode()
    assert isinstance(parse_duologue_request_untrusted(data), BadMessage)
    assert isinstance(parse_duologue_reply_untrusted(data), BadMessage)
    assert isinstance(parse_duologue_reply_untrusted(f"ERROR a{term}".encode()), BadMessage)
    assert isinstance(parse_duologue_request_untrusted(f"ECHO {term}".encode()), BadMessage)


@pytest.mark.parametrize(
    "data",
    [
        b"ECHO",
        b"ECHO\t1",
        b"echo 1",
        b" ECHO 1",
        b"ERROR bad message",  # the server side never accepts ERROR
        b"ECHO \xed\xa0\x80",  # UTF-8-encoded surrogate: invalid UTF-8
        b"ECHO \xc0\xaf",  # overlong encoding
        b"ECHO " + b"x" * MAX_MESSAGE_BYTES,
    ],
)
def test_duologue_request_rejects(data: bytes) -> None:
    assert isinstance(parse_duologue_request_untrusted(data), BadMessage)


@pytest.mark.parametrize("data", [b"ERROR", b"ECHO", b"HELLO 1", b"5 ERROR x", b"\x80"])
def test_duologue_reply_rejects(data: bytes) -> None:
    assert isinstance(parse_duologue_reply_untrusted(data), BadMessage)


def test_echo_keeps_other_characters() -> None:
    # Java `.` matches NUL, tabs, trailing spaces and non-BMP characters; so do we.
    text = "\x00\t  x 🎮 "
    data = format_message(Echo(text))
    assert parse_duologue_request_untrusted(data) == Echo(text)


def test_parsers_accept_bytearray_and_memoryview() -> None:
    assert parse_server_message_untrusted(bytearray(b"HELLO 1")) == Hello(1)
    assert parse_duologue_reply_untrusted(memoryview(b"ECHO x")) == Echo("x")


@given(st.binary(max_size=MAX_MESSAGE_BYTES + 64))
def test_parsers_never_raise(data: bytes) -> None:
    for parse in (
        parse_server_message_untrusted,
        parse_all_clients_reply_untrusted,
        parse_duologue_request_untrusted,
        parse_duologue_reply_untrusted,
    ):
        result = parse(data)
        if not isinstance(result, BadMessage):
            # Whatever parses is canonical: formatting gives back the same bytes.
            assert format_message(result) == data


# ---- round trips -----------------------------------------------------------------------------


@given(U32)
def test_hello_round_trip(key: int) -> None:
    assert parse_server_message_untrusted(format_message(Hello(key))) == Hello(key)


@given(INT32, PORT, PORT, U32)
def test_connect_round_trip(session: int, data_port: int, control_port: int, enc: int) -> None:
    msg = Connect(session, data_port, control_port, enc)
    assert parse_all_clients_reply_untrusted(format_message(msg)) == msg


@given(INT32, LINE_TEXT)
def test_all_clients_error_round_trip(session: int, text: str) -> None:
    msg = AllClientsError(session, text)
    assert parse_all_clients_reply_untrusted(format_message(msg)) == msg


@given(LINE_TEXT)
def test_echo_and_error_round_trip(text: str) -> None:
    assert parse_duologue_request_untrusted(format_message(Echo(text))) == Echo(text)
    assert parse_duologue_reply_untrusted(format_message(Echo(text))) == Echo(text)
    assert parse_duologue_reply_untrusted(format_message(DuologueError(text))) == DuologueError(
        text
    )


# ---- one-time pad ----------------------------------------------------------------------------


@given(INT32, U32)
def test_session_pad_round_trip(session: int, pad: int) -> None:
    enc = encrypt_session(session, pad)
    assert 0 <= enc <= 2**32 - 1
    assert decrypt_session(enc, pad) == session


@pytest.mark.parametrize("session", [-(2**31), -1, 0, 1, 2**31 - 1])
@pytest.mark.parametrize("pad", [0, 1, 0x611786D9, 0x80000000, 0xFFFFFFFF])
def test_session_pad_edges(session: int, pad: int) -> None:
    enc = encrypt_session(session, pad)
    assert enc == (session % 2**32) ^ pad
    assert decrypt_session(enc, pad) == session


def test_pad_zero_is_identity_as_u32() -> None:
    assert encrypt_session(-1, 0) == 0xFFFFFFFF
    assert decrypt_session(0xFFFFFFFF, 0) == -1
    assert decrypt_session(0x80000000, 0) == -(2**31)


@pytest.mark.parametrize(("session", "pad"), [(2**31, 0), (-(2**31) - 1, 0), (0, -1), (0, 2**32)])
def test_encrypt_refuses_out_of_range(session: int, pad: int) -> None:
    with pytest.raises(ValueError):
        encrypt_session(session, pad)


@pytest.mark.parametrize(("enc", "pad"), [(-1, 0), (2**32, 0), (0, 2**32)])
def test_decrypt_refuses_out_of_range(enc: int, pad: int) -> None:
    with pytest.raises(ValueError):
        decrypt_session(enc, pad)
