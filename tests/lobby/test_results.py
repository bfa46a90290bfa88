"""Game results signed with the ticket key: what verifies, and what must not."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echo.lobby.results import GameResult, ResultError, sign_result, verify_result
from echo.tickets import TicketKey

KEY = TicketKey(7, b"g" * 32)
OLD = TicketKey(6, b"o" * 32)
RESULT = GameResult(2**63 + 5, 2**64 - 1, "10.0.0.1:7000", {"winner": "ålice", "turns": -9})


def test_a_signed_result_verifies_under_any_key_of_the_ring() -> None:
    record = sign_result(KEY, RESULT)
    assert verify_result(record, KEY) == RESULT
    assert verify_result(record, {6: OLD.secret, 7: KEY.secret}) == RESULT
    assert verify_result(sign_result(OLD, RESULT), {6: OLD.secret, 7: KEY.secret}) == RESULT


def test_forged_tampered_and_unknown_results_are_refused_with_a_reason() -> None:
    record = sign_result(KEY, RESULT)
    forged = sign_result(TicketKey(7, b"f" * 32), RESULT)
    assert verify_result(forged, KEY) == "bad_signature"
    for i in range(2, len(record)):
        tampered = bytearray(record)
        tampered[i] ^= 0x01
        assert verify_result(bytes(tampered), KEY) == "bad_signature", i
    assert verify_result(record, OLD) == "unknown_key"
    assert verify_result(b"\x02" + record[1:], KEY) == "unknown_version"
    assert verify_result(record[:20], KEY) == "malformed"
    assert verify_result(b"", KEY) == "malformed"


def test_a_ticket_is_never_a_result() -> None:
    # Domain-separated: the MAC of a ticket's bytes is not the MAC of a result.
    from echo.tickets import issue

    ticket = issue(KEY, 5, "alice", "10.0.0.1:7000", 4e9)
    assert isinstance(verify_result(ticket, KEY), str)


@pytest.mark.parametrize(
    "bad",
    [
        GameResult(-1, 1, "s", {}),
        GameResult(1, 2**64, "s", {}),
        GameResult(1, 1, "", {}),
        GameResult(1, 1, "s", {"k": 1.5}),
        GameResult(1, 1, "s", {"k": "x" * 5000}),
    ],
)
def test_what_does_not_fit_is_refused_at_signing(bad: GameResult) -> None:
    with pytest.raises(ResultError):
        sign_result(KEY, bad)


@settings(max_examples=300)
@given(st.binary(max_size=5000))
def test_hostile_bytes_never_raise(data: bytes) -> None:
    assert isinstance(verify_result(data, KEY), str)
