"""close() against a receiver that behaves as a current Aeron (1.4x to 1.52) does.

Such a receiver reports a new position only once its subscriber has consumed a quarter of its
window; on its SM timer (200 ms) it repeats the last position it reported. Its proof that a
short stream arrived whole is its answer to end-of-stream: an SM with the end-of-stream flag,
sent once its conductor has seen the image complete, which it looks at on a 1 s timer. So the
answer comes up to about 1.2 s after the first end-of-stream heartbeat. With `linger=1.0` echo
announced end-of-stream after two stale SMs (0.4 s) and gave up at 1.0 s: close() said "not
delivered" in every one of 20 runs against Aeron 1.52's C driver, which had every message.
Here a hand-played receiver on the in-memory network does exactly that, in virtual time.
"""

from __future__ import annotations

import trio
import trio.testing

from echo.transport import TransportConfig, open_transport
from echo.transport.core.frames import StatusMessage, parse_datagram_untrusted
from echo.transport.core.wireformat import EOS_FLAG, SM_EOS_FLAG, DataHeader, Setup
from echo.transport.testing import MemoryNetwork, MemorySocket

PORT = 40124
STREAM = 1001
SM_INTERVAL = 0.2
CONDUCTOR_CHECK = 1.0  # Aeron's timer interval: when it notices the image is complete


async def current_aeron_receiver(sock: MemorySocket) -> None:
    """Answers as Aeron 1.52's receiver does: stale timer SMs, end-of-stream answered late."""
    setup: Setup | None = None
    sender = None
    answer_at = float("inf")
    next_sm = 0.0
    while True:
        with trio.move_on_at(min(next_sm, answer_at) if setup else float("inf")):
            await trio.lowlevel.wait_readable(sock)
            payload, sender = sock.recvfrom(65536)
            frame = parse_datagram_untrusted(payload)
            if isinstance(frame, Setup) and setup is None:
                setup = frame
                next_sm = trio.current_time()
            elif (
                isinstance(frame, DataHeader)
                and frame.frame_length == 0
                and frame.flags & EOS_FLAG
                and answer_at == float("inf")
            ):
                # The image is complete at the heartbeat; the conductor sees it on its timer.
                answer_at = trio.current_time() + CONDUCTOR_CHECK
            continue
        assert setup is not None and sender is not None
        now = trio.current_time()
        eos = now >= answer_at
        sock.sendto(
            StatusMessage(
                session_id=setup.session_id,
                stream_id=setup.stream_id,
                consumption_term_id=setup.initial_term_id,
                consumption_term_offset=0,  # the stale position: never a quarter window consumed
                receiver_window=setup.term_length // 2,
                receiver_id=99,
                flags=SM_EOS_FLAG if eos else 0,
            ).encode(),
            sender,
        )
        if eos:
            return
        next_sm = now + SM_INTERVAL


async def test_close_is_true_when_a_current_aeron_answers_end_of_stream_after_its_timer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    net = MemoryNetwork()
    config = TransportConfig(validate_addresses=False, linger=1.0)
    async with open_transport(config, socket_factory=net) as transport:
        with net.open_socket(("127.0.0.1", PORT)) as receiver:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(current_aeron_receiver, receiver)
                publication = await transport.add_publication(
                    f"aeron:udp?endpoint=127.0.0.1:{PORT}|term-length=64k", STREAM
                )
                await publication.wait_connected(timeout=5)
                for index in range(5):
                    await publication.send(bytes([index]) * 200)
                start = trio.current_time()
                delivered = await publication.close()
                took = trio.current_time() - start
                nursery.cancel_scope.cancel()
    assert delivered is True
    # The answer came after the linger time (1.0 s) and within its bound (0.5 + 1.3 s).
    assert 1.0 < took <= 1.8
