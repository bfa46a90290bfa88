"""Unit tests written to kill surviving mutants (./dev mutate); see docs/mutation.md.

They pin what `echo.session.resume` promises at its edges: the exact wire bytes at the largest
and smallest valid session ids, counters and message counts, the 1024-byte message limit both
ways, the exact ValueError a caller gets for a record that would not parse back, and the exact
`BadMessage` reason (it reaches the client's failure message) for each malformed field.
"""

from __future__ import annotations

import pytest

from echo.protocol import (
    INT32_MAX,
    INT32_MIN,
    AllClientsError,
    BadMessage,
    Hello,
    format_message,
)
from echo.session.resume import (
    MAX_COUNT,
    ResumableHello,
    Resume,
    Resumed,
    format_resumable_hello,
    format_resume,
    format_resumed,
    parse_client_request_untrusted,
    parse_server_reply_untrusted,
)

PROOF = bytes(range(16))
PROOF_HEX = "000102030405060708090A0B0C0D0E0F"
PAD = 0xFEDCBA9876543210FEDCBA9876543210

# ---------------------------------------------------------------- format_resume


@pytest.mark.parametrize("session_id", [INT32_MIN, INT32_MAX])
def test_format_resume_takes_every_int32_session(session_id: int) -> None:
    assert format_resume(Resume(session_id, 1, 0, PROOF)) == (
        f"RESUME {session_id} 1 0 {PROOF_HEX}".encode()
    )


@pytest.mark.parametrize("session_id", [INT32_MIN - 1, INT32_MAX + 1])
def test_format_resume_refuses_a_session_outside_int32(session_id: int) -> None:
    with pytest.raises(ValueError) as raised:
        format_resume(Resume(session_id, 1, 0, PROOF))
    assert str(raised.value) == f"session id {session_id} is not an int32"


@pytest.mark.parametrize("counter", [1, 999_999_999])
def test_format_resume_takes_the_first_and_the_last_counter(counter: int) -> None:
    assert format_resume(Resume(7, counter, 0, PROOF)) == (
        f"RESUME 7 {counter} 0 {PROOF_HEX}".encode()
    )


@pytest.mark.parametrize("counter", [0, 1_000_000_000])
def test_format_resume_refuses_a_counter_out_of_range(counter: int) -> None:
    with pytest.raises(ValueError) as raised:
        format_resume(Resume(7, counter, 0, PROOF))
    assert str(raised.value) == f"counter {counter} is out of range 1..999999999"


@pytest.mark.parametrize("proof", [bytes(15), bytes(17), b""])
def test_format_resume_refuses_a_proof_that_is_not_16_bytes(proof: bytes) -> None:
    with pytest.raises(ValueError) as raised:
        format_resume(Resume(7, 1, 0, proof))
    assert str(raised.value) == "a proof is 16 bytes"


def test_format_resume_takes_the_largest_message_count() -> None:
    assert format_resume(Resume(7, 2, MAX_COUNT, PROOF)) == (
        f"RESUME 7 2 999999999999999999 {PROOF_HEX}".encode()
    )
    data = format_resume(Resume(7, 2, MAX_COUNT, PROOF))
    assert parse_client_request_untrusted(data, credentials=False) == Resume(7, 2, MAX_COUNT, PROOF)


@pytest.mark.parametrize("count", [MAX_COUNT + 1, -1, True, 1.5])
def test_a_message_count_must_be_an_int_in_range(count: object) -> None:
    with pytest.raises(ValueError) as raised:
        format_resume(Resume(7, 1, count, PROOF))  # type: ignore[arg-type]
    assert str(raised.value) == f"message count {count!r} is out of range 0..{MAX_COUNT}"
    with pytest.raises(ValueError) as raised:
        format_resumed(Resumed(7, count))  # type: ignore[arg-type]
    assert str(raised.value) == f"message count {count!r} is out of range 0..{MAX_COUNT}"


# ---------------------------------------------------------------- format_resumed


@pytest.mark.parametrize("client_session", [INT32_MIN, INT32_MAX])
def test_format_resumed_takes_every_int32_session(client_session: int) -> None:
    data = format_resumed(Resumed(client_session, MAX_COUNT))
    assert data == f"{client_session} RESUMED 999999999999999999".encode()
    assert parse_server_reply_untrusted(data) == Resumed(client_session, MAX_COUNT)


@pytest.mark.parametrize("client_session", [INT32_MIN - 1, INT32_MAX + 1])
def test_format_resumed_refuses_a_session_outside_int32(client_session: int) -> None:
    with pytest.raises(ValueError) as raised:
        format_resumed(Resumed(client_session, 0))
    assert str(raised.value) == f"client session {client_session} is not an int32"


# ---------------------------------------------------------------- the resumable HELLO


@pytest.mark.parametrize("pad", [True, -1, 1 << 128, 1.0])
def test_a_resume_pad_must_be_a_128_bit_unsigned_int(pad: object) -> None:
    with pytest.raises(ValueError) as raised:
        format_resumable_hello(ResumableHello(Hello(0xAB), pad))  # type: ignore[arg-type]
    assert str(raised.value) == f"expected a 128-bit unsigned int, got {pad!r}"


def _hello_with_credentials(size: int) -> ResumableHello:
    return ResumableHello(Hello(0xAB, b"\x00" * size), PAD)


def test_a_resumable_hello_of_exactly_1024_bytes_is_sent_and_accepted() -> None:
    hello = _hello_with_credentials(734)  # 979 base64url characters: 1024 bytes in all
    data = format_resumable_hello(hello)
    assert len(data) == 1024
    assert data.endswith(b" +R FEDCBA9876543210FEDCBA9876543210")
    assert parse_client_request_untrusted(data, credentials=True) == hello


def test_a_resumable_hello_over_1024_bytes_is_refused_both_ways() -> None:
    with pytest.raises(ValueError) as raised:
        format_resumable_hello(_hello_with_credentials(735))
    assert str(raised.value) == "message is 1025 bytes; the limit is 1024"
    data = format_resumable_hello(_hello_with_credentials(734)) + b"0"
    assert parse_client_request_untrusted(data, credentials=True) == BadMessage("not a HELLO")


def test_a_plain_hello_keeps_its_credentials() -> None:
    data = format_message(Hello(0xAB, b"ticket"))
    assert parse_client_request_untrusted(data, credentials=True) == Hello(0xAB, b"ticket")
    assert parse_client_request_untrusted(data, credentials=False) == BadMessage("not a HELLO")


@pytest.mark.parametrize(
    "data",
    [
        b"HELLO AB +R " + b"0" * 31,
        b"HELLO AB +R " + b"a" * 32,  # lower-case hex is not the wire form
        b"\xff +R " + b"0" * 32,
    ],
)
def test_a_malformed_resumable_hello_is_not_a_hello(data: bytes) -> None:
    assert parse_client_request_untrusted(data, credentials=True) == BadMessage("not a HELLO")


# ---------------------------------------------------------------- RESUME, server side


@pytest.mark.parametrize("session_id", [INT32_MIN, INT32_MAX])
def test_a_resume_for_every_int32_session_parses(session_id: int) -> None:
    data = f"RESUME {session_id} 999999999 0 {PROOF_HEX}".encode()
    assert parse_client_request_untrusted(data, credentials=False) == Resume(
        session_id, 999_999_999, 0, PROOF
    )


@pytest.mark.parametrize("session_id", [INT32_MIN - 1, INT32_MAX + 1])
def test_a_resume_outside_int32_says_so(session_id: int) -> None:
    data = f"RESUME {session_id} 1 0 {PROOF_HEX}".encode()
    assert parse_client_request_untrusted(data, credentials=False) == BadMessage(
        "session id out of int32 range"
    )


@pytest.mark.parametrize(
    "data",
    [
        b"RESUME 7 1 0 " + PROOF_HEX.lower().encode(),
        b"RESUME 7 01 0 " + PROOF_HEX.encode(),
        b"RESUME 7 1 1000000000000000000 " + PROOF_HEX.encode(),  # nineteen digits
        b"RESUME 7 1000000000 0 " + PROOF_HEX.encode(),  # a counter format_resume refuses
        b"RESUME \xff",
        b"RESUME " + b"1" * 1100,
    ],
)
def test_a_malformed_resume_is_not_a_resume(data: bytes) -> None:
    assert parse_client_request_untrusted(data, credentials=True) == BadMessage("not a RESUME")


# ---------------------------------------------------------------- replies, client side


@pytest.mark.parametrize("client_session", [INT32_MIN - 1, INT32_MAX + 1])
def test_a_resumed_outside_int32_says_so(client_session: int) -> None:
    data = f"{client_session} RESUMED 1".encode()
    assert parse_server_reply_untrusted(data) == BadMessage("session id out of int32 range")


@pytest.mark.parametrize(
    "data", [b"5 RESUMED ", b"5 RESUMED -1", b"5 RESUMED 1000000000000000000", b"\xff RESUMED 1"]
)
def test_a_malformed_resumed_is_not_a_resumed_reply(data: bytes) -> None:
    assert parse_server_reply_untrusted(data) == BadMessage("not a RESUMED reply")


def test_an_error_that_mentions_resumed_past_its_first_40_bytes_stays_an_error() -> None:
    # Only the first 40 bytes are searched for " RESUMED " (a RESUMED reply is shorter).
    text = "x" * 24 + " RESUMED 1"
    data = b"5 ERROR " + text.encode()
    assert data.index(b" RESUMED ") + len(b" RESUMED ") == 41
    assert parse_server_reply_untrusted(data) == AllClientsError(5, text)


@pytest.mark.parametrize(
    "data",
    [
        b"5 CONNECT 1 2 3 +R " + b"0" * 31,
        b"5 CONNECT 1 2 3 +R " + b"0" * 33,
        b"\xff +R " + b"0" * 32,
    ],
)
def test_a_malformed_resumable_connect_is_not_a_reply(data: bytes) -> None:
    assert parse_server_reply_untrusted(data) == BadMessage("not a CONNECT or ERROR reply")


@pytest.mark.parametrize(
    "data",
    [
        b"5 ERROR server full +R " + b"0" * 32,
        b"5 CONNECT 0 2 3 +R " + b"0" * 32,  # port 0: not a CONNECT
        b"HELLO AB +R " + b"0" * 32,
    ],
)
def test_only_a_connect_carries_a_resume_secret(data: bytes) -> None:
    assert parse_server_reply_untrusted(data) == BadMessage(
        "only a CONNECT carries a resume secret"
    )
