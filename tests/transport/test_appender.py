"""Unit tests of appender.py: what the publication's log appender writes is what Aeron writes."""

from __future__ import annotations

import pytest

from echo.transport.core import appender as appender_module
from echo.transport.core.appender import LogAppender
from echo.transport.core.frames import UNFRAGMENTED_FLAGS, FrameType
from echo.transport.core.logbuffer import TermBuffers, append_message, write_frame, write_pad

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


def test_an_mtu_up_to_the_maximum_message_length_is_accepted_and_a_longer_one_refused() -> None:
    longest = LogAppender(**IDS, initial_term_id=0, term_length=TERM, mtu=TERM // 8)
    assert longest.max_payload == TERM // 8 - 32
    with pytest.raises(ValueError, match="mtu 8224 is larger than the maximum message length"):
        LogAppender(**IDS, initial_term_id=0, term_length=TERM, mtu=TERM // 8 + 32)


def test_each_rotation_moves_to_the_next_term_with_the_next_id() -> None:
    log = appender()
    for count in range(1, 5):
        log.pad_and_rotate()
        assert (log.term_count, log.tail_offset) == (count, 0)
        assert log.active_term_id == -(2**31) + count - 1
        # append returns the new tail as a position: the terms before count in full.
        assert log.append(b"x") == log.position == count * TERM + 64


def test_a_message_that_fills_the_rest_of_the_term_exactly_fits() -> None:
    log = appender()
    while log.tail_offset + log.required(1000) < TERM:
        log.append(bytes(1000))
    last = TERM - log.tail_offset - 32  # the payload whose frame ends at the term's end
    assert log.fits(log.required(last))
    log.append(b"e" * last)
    assert log.tail_offset == TERM and not log.fits(32)
    # No room is left for a PAD: the next message simply starts the next term.
    log.pad_and_rotate()
    assert (log.term_count, log.tail_offset) == (1, 0)
    assert bytes(log.log.terms[0][TERM - last :]) == b"e" * last


def test_the_partition_a_fourth_term_reuses_is_clean() -> None:
    log = appender()
    for _ in range(20):
        log.append(bytes(range(200)))
    for _ in range(3):
        log.pad_and_rotate()
    # Term 3 is in partition 0 again: nothing of term 0 is left in it.
    assert log.log.terms[0][: 20 * 256] == bytes(20 * 256)
    log.append(b"new")
    assert bytes(log.log.terms[0]) == expected_term([b"new"], term_id=-(2**31) + 2)


def test_a_moved_tail_appends_in_its_terms_partition_with_its_term_id() -> None:
    log = appender()
    log.set_tail(5, 96)
    assert log.position == 5 * TERM + 96 and log.active_term_id == -(2**31) + 4
    assert log.append(b"late") == 5 * TERM + 160
    reference = TermBuffers(TERM)
    append_message(reference.terms[0], 96, b"late", 1376, **IDS, term_id=-(2**31) + 4)
    assert bytes(log.log.terms[2]) == bytes(reference.terms[0])  # 5 % 3
    reference.close()


def test_the_cache_of_packings_keeps_each_new_length_until_it_is_full(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if not appender_module.__file__.endswith(".py"):
        pytest.skip("the compiled module's constants cannot be patched")
    cache: dict[int, object] = {}
    monkeypatch.setattr(appender_module, "_PACKINGS", cache)
    monkeypatch.setattr(appender_module, "_MAX_PACKINGS", 2)
    log = appender()
    messages = [b"a", b"bb", b"ccc", b"a", b"dddd", b"ccc"]
    for message in messages:
        log.append(message)
    assert sorted(cache) == [1, 2]  # bounded: lengths 3 and 4 were written in two steps
    assert bytes(log.log.terms[0]) == expected_term(messages)
