"""Unit tests of assembly.py: messages out of a term, whole, fragmented, padded, joined late."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echo.transport.compiled import loaded_compiled
from echo.transport.core.assembly import _CHUNK, FragmentAssembler
from echo.transport.core.frames import DATA_HEADER_STRUCT, UNFRAGMENTED_FLAGS, FrameType
from echo.transport.core.logbuffer import TermBuffers, append_message, write_pad

TERM = 64 * 1024
MAX_PAYLOAD = 96  # small fragments: a 250-byte message is three of them
IDS = {"session_id": 1, "stream_id": 2, "term_id": 0}


def term_of(messages: list[bytes]) -> tuple[TermBuffers, list[int]]:
    """A log whose first term holds `messages` back to back, and where each one starts."""
    log = TermBuffers(TERM)
    offsets = [0]
    for message in messages:
        offsets.append(append_message(log.terms[0], offsets[-1], message, MAX_PAYLOAD, **IDS))
    return log, offsets


def pad_over(log: TermBuffers, offset: int, length: int) -> None:
    """A gap of `length` bytes at `offset` given up on and padded over, as an image of a
    reliable=false stream does (Aeron's tryFillGap): a PAD header, the rest left as it was."""
    DATA_HEADER_STRUCT.pack_into(
        log.terms[0], offset, length, 0, UNFRAGMENTED_FLAGS, FrameType.PAD, offset, 1, 2, 0, 0
    )


def poll_all(
    assembler: FragmentAssembler, log: TermBuffers, start: int, end: int, limit: int = 100
) -> tuple[list[bytes], int, int]:
    got: list[bytes] = []
    offset, fragments = assembler.poll(log, 0, start, end, limit, got.append)
    return got, offset, fragments


def test_whole_and_fragmented_messages_come_out_intact_and_in_order() -> None:
    messages = [b"a" * 10, bytes(range(250)), b"c" * 96, b"d" * 97]
    log, offsets = term_of(messages)
    got, offset, fragments = poll_all(FragmentAssembler(), log, 0, offsets[-1])
    assert got == messages
    assert offset == offsets[-1]
    assert fragments == 1 + 3 + 1 + 2  # every fragment counts, one message or many


def test_the_fragment_limit_stops_between_fragments_and_the_message_completes_later() -> None:
    message = bytes(range(250))
    log, offsets = term_of([message])
    assembler = FragmentAssembler()
    got, offset, fragments = poll_all(assembler, log, 0, offsets[-1], limit=2)
    assert got == [] and fragments == 2 and assembler.in_progress
    got, offset, fragments = poll_all(assembler, log, offset, offsets[-1])
    assert got == [message] and fragments == 1 and offset == offsets[-1]
    assert not assembler.in_progress


def test_a_subscriber_that_joins_mid_message_drops_it_and_takes_the_next() -> None:
    log, offsets = term_of([bytes(range(250)), b"next"])
    second_fragment = offsets[0] + 128  # 32-byte header + 96 payload: one aligned frame
    got, offset, fragments = poll_all(FragmentAssembler(), log, second_fragment, offsets[-1])
    assert offset == offsets[-1]
    assert got == [b"next"]
    assert fragments == 3  # two orphan fragments consumed, then the whole message


def test_pad_frames_are_skipped_and_not_counted() -> None:
    log = TermBuffers(TERM)
    tail = append_message(log.terms[0], 0, b"before", MAX_PAYLOAD, **IDS)
    write_pad(log.terms[0], tail, **IDS)  # pads out the rest of the term
    got, offset, fragments = poll_all(FragmentAssembler(), log, 0, TERM)
    assert got == [b"before"] and fragments == 1 and offset == TERM


def test_the_end_bounds_what_is_read() -> None:
    log, offsets = term_of([b"one", b"two", b"three"])
    got, offset, _ = poll_all(FragmentAssembler(), log, 0, offsets[2])
    assert got == [b"one", b"two"] and offset == offsets[2]


def test_poll_messages_hands_the_handler_messages_with_their_origin() -> None:
    from echo.transport.core.message import Message

    messages = [b"a" * 10, bytes(range(250)), b"c" * 96]
    log, offsets = term_of(messages)
    origin = (7, 1001, "10.0.0.1:4000", "10.0.0.1", 4000)
    got: list[Message] = []
    assembler = FragmentAssembler()
    # The fragment limit stops inside the fragmented message, as `poll` does.
    offset, fragments = assembler.poll_messages(log, 0, 0, offsets[-1], 2, got.append, origin)
    assert [m.data for m in got] == [messages[0]] and fragments == 2
    offset, fragments = assembler.poll_messages(
        log, 0, offset, offsets[-1], 100, got.append, origin
    )
    assert offset == offsets[-1] and fragments == 3
    assert got == [Message(data, *origin) for data in messages]
    assert all(type(m) is Message for m in got)
    assert (got[1].session_id, got[1].source, got[1].source_port) == (7, "10.0.0.1:4000", 4000)


def test_a_new_assembler_has_no_message_in_progress() -> None:
    assert not FragmentAssembler().in_progress


def test_a_gap_padded_over_mid_term_is_skipped_and_what_follows_comes_in_the_same_poll() -> None:
    messages = [b"a" * 10, b"lost" * 20, b"b" * 10]
    log, offsets = term_of(messages)
    pad_over(log, offsets[1], offsets[2] - offsets[1])
    got, offset, fragments = poll_all(FragmentAssembler(), log, 0, offsets[-1])
    assert got == [messages[0], messages[2]]
    assert offset == offsets[-1] and fragments == 2


def test_a_message_with_a_fragment_padded_over_is_dropped_not_delivered_with_a_hole() -> None:
    # Three fragments of 128, 128 and 96 bytes; the middle one was lost and padded over: the
    # END does not follow the BEGIN kept, so the message is dropped.
    log, offsets = term_of([bytes(range(250)), b"next"])
    pad_over(log, 128, 128)
    assembler = FragmentAssembler()
    got, offset, fragments = poll_all(assembler, log, 0, offsets[-1])
    assert got == [b"next"]
    assert offset == offsets[-1] and fragments == 3  # BEGIN, the orphan END, the next message
    assert not assembler.in_progress


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 40_000), min_size=1, max_size=40),
    limits=st.lists(st.integers(1, 12), min_size=1, max_size=8),
    payload=st.integers(32, 9000),
)
def test_any_mix_of_sizes_comes_out_whole_whatever_the_fragment_limits(
    sizes: list[int], limits: list[int], payload: int
) -> None:
    # Whole messages are sliced out of chunks of the frames ahead (sized by the fragment limit
    # and the first message's size, within _CHUNK): messages of other sizes, bigger than a
    # chunk, fragmented, or polled a few at a time, cross chunk boundaries anywhere.
    log = TermBuffers(TERM * 16)
    messages: list[bytes] = []
    offset = 0
    for n, size in enumerate(sizes):
        message = bytes((n + i) & 0xFF for i in range(size))
        if offset + size + 32 * (size // payload + 2) > TERM * 16:
            break
        offset = append_message(log.terms[0], offset, message, payload, **IDS)
        messages.append(message)
    end = offset
    assembler = FragmentAssembler()
    got: list[bytes] = []
    position = 0
    polls = 0
    while position < end:
        limit = limits[polls % len(limits)]
        position, fragments = assembler.poll(log, 0, position, end, limit, got.append)
        assert 0 < fragments <= limit
        polls += 1
    assert got == messages


class RecordingMap:
    """A term's mmap that records the size of every copy sliced out of it."""

    def __init__(self, whole: object) -> None:
        self.whole = whole
        self.copied: list[int] = []

    def __getitem__(self, span: slice) -> bytes:
        data: bytes = self.whole[span]  # type: ignore[index]
        self.copied.append(len(data))
        return data


@pytest.mark.skipif(
    bool(loaded_compiled().get("echo.transport.core.assembly")),
    reason="compiled, the term must be a real mmap: the copies are counted interpreted",
)
def test_a_poll_copies_little_more_than_it_delivers() -> None:
    # 64-byte messages are 96-byte frames, 32-byte ones 64, empty ones 32
    messages = [bytes([i]) * 64 for i in range(6)] + [b"s" * 32, b"b" * 96, b"b" * 96, b"b" * 96]
    messages += [b"x" * 64, b""] + [bytes([i]) * 64 for i in range(200)]
    log, offsets = term_of(messages)
    recording = RecordingMap(log.maps[0])
    log.maps[0] = recording  # type: ignore[call-overload]

    def poll(start: int, limit: int, end: int = offsets[-1]) -> tuple[list[bytes], int]:
        recording.copied.clear()
        got, offset, _ = poll_all(FragmentAssembler(), log, start, end, limit)
        return got, offset

    # One message a poll (an echo): sliced on its own, no chunk.
    got, offset = poll(0, 1)
    assert got == messages[:1] and recording.copied == [64]
    # Five: one chunk of exactly their five frames, each message sliced out of it.
    got, offset = poll(offset, 5)
    assert got == messages[1:6] and recording.copied == [5 * 96]
    # Sizes change: the chunk is sized by the frame that starts it and the fragments left, so
    # a 64-byte frame then 128-byte ones need a second chunk, for the two left.
    got, offset = poll(offset, 4)
    assert got == messages[6:10] and recording.copied == [4 * 64, 2 * 128]
    # A frame and an empty message, two fragments, the end of what has arrived: a chunk of
    # exactly 96 + 32 bytes, the two frames (the least a chunk holds).
    got, offset = poll(offset, 2, end=offsets[12])
    assert got == messages[10:12] and recording.copied == [96 + 32]
    # Many: no copy bigger than _CHUNK, and little more copied than delivered.
    got, offset = poll(offset, 1000)
    assert got == messages[12:] and offset == offsets[-1]
    assert max(recording.copied) == _CHUNK
    assert sum(recording.copied) <= 200 * 96 + 96 * len(recording.copied)
