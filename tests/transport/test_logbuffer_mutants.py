"""Term log rules that mutation testing (./dev mutate logbuffer) showed no test held.

Each test names what a wrong version of the code would get past the existing tests.
"""

from __future__ import annotations

from typing import Any

import pytest

from echo.transport.core.frames import DATA_HEADER_STRUCT, iter_data_frames_untrusted
from echo.transport.core.logbuffer import (
    TERM_MIN_LENGTH,
    TermBuffers,
    append_message,
    check_term_length,
    compute_fragmented_length,
    int_view,
    scan_for_gap,
)


def test_term_length_errors_say_what_is_wrong() -> None:
    with pytest.raises(ValueError) as raised:
        check_term_length(1000)
    assert str(raised.value) == "term length 1000 outside [65536, 1073741824]"
    with pytest.raises(ValueError) as raised:
        check_term_length(3 * TERM_MIN_LENGTH)
    assert str(raised.value) == "term length 196608 is not a power of two"


def test_term_buffers_know_their_length() -> None:
    buffers = TermBuffers(TERM_MIN_LENGTH)
    try:
        assert buffers.term_length == TERM_MIN_LENGTH
        assert [len(term) for term in buffers.terms] == [TERM_MIN_LENGTH] * 3
    finally:
        buffers.close()


class _NoMadvise:
    """An mmap stand-in whose madvise fails, as on a system without MADV_DONTNEED."""

    def __init__(self, real: Any) -> None:
        self.real = real

    def madvise(self, _option: int) -> None:
        raise OSError("not supported here")

    def close(self) -> None:
        self.real.close()


def test_clean_falls_back_to_writing_zeros() -> None:
    buffers = TermBuffers(TERM_MIN_LENGTH)
    try:
        buffers.terms[1][:4] = b"\x01\x02\x03\x04"
        buffers.terms[1][-1] = 9
        buffers.maps[1] = _NoMadvise(buffers.maps[1])  # type: ignore[assignment]
        buffers.clean(1)
        assert bytes(buffers.terms[1]) == bytes(TERM_MIN_LENGTH)
    finally:
        buffers.close()


def test_fragments_of_an_unaligned_payload_size_are_each_aligned() -> None:
    # An MTU is a multiple of 32, so a fragment's frame length usually is too; with a payload
    # size of 33 it is 65 bytes, and the next fragment must start at 96, not at 64.
    term = memoryview(bytearray(TERM_MIN_LENGTH))
    tail = append_message(term, 0, bytes(range(100)), 33, session_id=1, stream_id=2, term_id=3)
    assert tail == compute_fragmented_length(100, 33)
    headers = list(iter_data_frames_untrusted(bytes(term[:tail])))
    assert [h.term_offset for h in headers] == [0, 96, 192, 288]
    assert [h.frame_length for h in headers] == [65, 65, 65, 33]


def test_a_gap_is_at_least_one_slot_even_next_to_stray_bytes() -> None:
    # The slot at the rebuild position has a zero length but a non-zero byte further into its
    # header: there is still a gap of one slot there, never a gap of zero bytes.
    term = memoryview(bytearray(TERM_MIN_LENGTH))
    DATA_HEADER_STRUCT.pack_into(term, 0, 64, 0, 0xC0, 1, 0, 1, 2, 3, 0)
    term[64 + 5] = 0xC0  # flags of an empty slot
    assert scan_for_gap(term, int_view(term, "i"), 0, 1024) == (64, 32)
