"""Seeded random schedules (docs/architecture.md, Test layers): whatever the network does, every
message is delivered once, in order, intact.

Random loss (at least 20 %, in both directions, so SMs and NAKs are lost too), duplication and
reordering on a pure pair with a scripted clock; 64 KiB terms and messages up to the maximum of
term/8 = 8 KiB (so up to 6 fragments at mtu 1408) make the log rotate many times, and initial
term ids just below 2^31 - 1 make the term id wrap to -2^31 on the way.
"""

from __future__ import annotations

import random
import struct

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from echo.transport.core.frames import DATA_HEADER_STRUCT, FrameType, align
from echo.transport.core.logbuffer import compute_fragmented_length, i32
from echo.transport.core.receiver import ImageState
from tests.transport.pairlink import PairLink, seeded

KIB = 1024
TERM = 64 * KIB
MAX_MESSAGE = TERM // 8

sizes = st.one_of(
    st.integers(0, 200),
    st.integers(1300, 1500),  # around one frame's payload (1376)
    st.integers(1, MAX_MESSAGE),
    st.sampled_from([0, 1375, 1376, 1377, 2752, 2753, MAX_MESSAGE - 1, MAX_MESSAGE]),
)


def payload(index: int, size: int) -> bytes:
    """Distinct, self-describing content: a shifted or spliced delivery cannot pass."""
    head = struct.pack("<II", index, size)[:size]
    rng = random.Random(index * 7919 + size)
    return head + rng.randbytes(max(0, size - len(head)))


@settings(
    max_examples=30,
    deadline=None,
    # No "explain" phase: it replays a failing schedule hundreds of times (minutes).
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    message_sizes=st.lists(sizes, min_size=20, max_size=70),
    seed=st.integers(0, 2**32 - 1),
    loss=st.floats(0.2, 0.35),
    duplicate=st.floats(0.0, 0.15),
    reorder=st.floats(0.0, 0.25),
    initial_term_id=st.one_of(st.integers(2**31 - 4, 2**31 - 1), st.integers(-(2**31), 2**31 - 1)),
)
def test_every_message_once_in_order_intact(
    message_sizes: list[int],
    seed: int,
    loss: float,
    duplicate: float,
    reorder: float,
    initial_term_id: int,
) -> None:
    # At least three terms' worth, so the log rotates (and cleans a partition) every time.
    while sum(compute_fragmented_length(n, 1376) for n in message_sizes) < 3 * TERM:
        message_sizes = [*message_sizes, MAX_MESSAGE, 1377, 0]
    messages = [payload(i, n) for i, n in enumerate(message_sizes)]
    rng = random.Random(seed)
    pair = PairLink(
        term_length=TERM,
        mtu=1408,
        initial_term_id=initial_term_id,
        fate=seeded(rng, loss=loss, duplicate=duplicate, reorder=reorder),
        seed=seed,
    )
    pair.connect(max_time=10.0)
    pair.offer_all(messages, max_time=120.0)
    session = pair.publication.session_id
    pair.run_until(lambda: len(pair.received.get(session, [])) >= len(messages), max_time=60.0)
    got = pair.received[session]
    assert len(got) == len(messages)
    for index, (want, have) in enumerate(zip(messages, got, strict=True)):
        assert have == want, f"message {index} of {len(messages)} differs"
    publication = pair.publication
    terms_used = publication.position >> 16
    assert terms_used >= 3
    if initial_term_id >= 2**31 - 3:
        assert publication.active_term_id < 0 < initial_term_id  # the term id wrapped
        assert publication.active_term_id == i32(initial_term_id + terms_used)

    # Close: the stream ends cleanly on both sides despite the loss.
    publication.close(pair.now)
    pair.run_until(lambda: publication.is_done, max_time=10.0)
    pair.run_until(lambda: bool(pair.unavailable_images()), max_time=11.0)
    (event,) = pair.unavailable_images()
    assert event.reason is ImageState.END_OF_STREAM
    assert pair.received[session] == messages  # nothing more, nothing twice
    assert pair.misdirected == []
    check_wire_frames(pair)


def check_wire_frames(pair: PairLink) -> None:
    """Every data datagram is <= mtu and its frames' alignment padding is zeros, as Aeron's
    (the sender cleans a partition before reusing it, so no stale bytes of the term three back
    go on the wire)."""
    for sent in pair.sent("data"):
        data = sent.data
        assert len(data) <= 1408
        offset = 0
        while offset < len(data):
            frame_length, _, _, ftype, *_ = DATA_HEADER_STRUCT.unpack_from(data, offset)
            if ftype != FrameType.DATA or frame_length == 0:
                break  # PAD (header only), SETUP or heartbeat
            end = offset + align(frame_length)
            assert data[offset + frame_length : end] == bytes(end - offset - frame_length)
            offset = end
