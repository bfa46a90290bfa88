"""Unit tests of appender.py: what the publication's log appender writes is what Aeron writes."""

from __future__ import annotations

import pytest

from echo.transport import appender as appender_module
from echo.transport.appender import LogAppender
from echo.transport.frames import UNFRAGMENTED_FLAGS, FrameType
from echo.transport.logbuffer import TermBuffers, append_message, write_frame, write_pad

TERM = 64 * 1024
IDS = {"session_id": -123456789, "stream_id": 1001}
INITIAL_TERM_ID = 0x7FFFFFFF  # the next term id wraps to -2^31


def appender() -> LogAppender:
    return LogAppender(**IDS, initial_term_id=INITIAL_TERM_ID, term_length=TERM, mtu=1408)


def expected_term(messages: list[bytes], term_id: int = INITIAL_TERM_ID) -> bytes:
    """The term as logbuffer's reference appender writes `messages`."""
    log = TermBuffers(TERM)
    offset = 0
    for message in messages:
        offset = append_message(log.terms[0], offset, message, 1376, **IDS, term_id=term_id)
    data = bytes(log.terms[0])
    log.close()
    return data


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_every_kind_of_payload_is_written_as_the_reference_appender_writes_it(
    kind: type,
) -> None:
    messages = [b"", b"a", bytes(range(64)), bytes(200), bytes(range(256)) * 5, b"z" * 1376]
    log = appender()
    positions = [log.append(kind(message)) for message in messages]
    assert positions[-1] == log.position == log.tail_offset
    assert bytes(log.log.terms[0]) == expected_term(messages)


def test_fragmented_messages_are_the_reference_appenders_fragments() -> None:
    messages = [bytes(range(256)) * 20, b"after"]
    log = appender()
    for message in messages:
        log.append(message)
    assert bytes(log.log.terms[0]) == expected_term(messages)


def test_past_the_cache_of_packers_frames_are_written_in_two_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Interpreted, the cache is an ordinary dict: full, a new length takes the two-step way.
    if not appender_module.__file__.endswith(".py"):
        pytest.skip("the compiled module's constants cannot be patched")
    monkeypatch.setattr(appender_module, "_PACKINGS", {})
    monkeypatch.setattr(appender_module, "_MAX_PACKINGS", 0)
    log = appender()
    log.append(b"q" * 77)
    assert bytes(log.log.terms[0]) == expected_term([b"q" * 77])


def test_a_message_that_does_not_fit_pads_the_term_and_the_next_term_has_the_next_id() -> None:
    log = appender()
    while log.fits(log.required(1000)):
        log.append(bytes(1000))
    tail = log.tail_offset
    assert not log.fits(log.required(1000))
    log.pad_and_rotate()
    assert (log.term_count, log.tail_offset, log.active_term_id) == (1, 0, -(2**31))
    reference = TermBuffers(TERM)
    write_pad(reference.terms[0], tail, **IDS, term_id=INITIAL_TERM_ID)
    assert bytes(log.log.terms[0][tail : tail + 32]) == bytes(reference.terms[0][tail : tail + 32])
    log.append(b"next")
    assert bytes(log.log.terms[1][:64]) == expected_term([b"next"], term_id=-(2**31))[:64]
    assert log.position == TERM + 64
    reference.close()


def test_required_is_the_aligned_frame_and_refuses_a_message_too_long() -> None:
    log = appender()
    assert log.required(0) == 32 and log.required(1) == 64 and log.required(1376) == 1408
    assert log.required(1377) == 1408 + 64
    assert log.required(TERM // 8) > 0
    with pytest.raises(ValueError, match="exceeds the maximum message length 8192"):
        log.required(TERM // 8 + 1)


def test_a_heartbeat_header_names_the_position_it_is_at() -> None:
    log = appender()
    scratch = memoryview(bytearray(32))
    write_frame(
        scratch,
        0,
        flags=UNFRAGMENTED_FLAGS,
        frame_type=FrameType.DATA,
        **IDS,
        term_id=-(2**31),
        payload=b"",
    )
    expected = bytearray(scratch)
    expected[0:4] = bytes(4)  # a heartbeat's frame length is 0
    expected[8:12] = (96).to_bytes(4, "little")  # its term offset
    assert log.data_header(TERM + 96, UNFRAGMENTED_FLAGS) == bytes(expected)
