"""Runs of datagrams in one system call (UDP GSO) and coalesced reads (UDP GRO).

What must hold: the datagrams a run stands for are byte for byte the ones the sender makes
one at a time (Aeron's TermScanner packing), a coalesced read is handled as the datagrams it
holds, and a route that refuses runs falls back to one datagram per call without losing any.
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Callable

import pytest
import trio
from hypothesis import example, given, settings
from hypothesis import strategies as st

from echo.transport import TransportConfig, open_transport
from echo.transport.core.counters import Counters
from echo.transport.core.flow_control import UnicastFlowControl
from echo.transport.core.frames import (
    DataHeader,
    parse_data_run_untrusted,
    parse_data_untrusted,
)
from echo.transport.core.sender import NetworkPublication
from tests.netlab.fixtures import fresh_netns  # noqa: F401  (fixture)

STREAM = 1001


def publication(mtu: int, run_segments: int) -> NetworkPublication:
    state = NetworkPublication(
        session_id=7,
        stream_id=STREAM,
        initial_term_id=0,
        term_length=1 << 20,
        mtu=mtu,
        flow_control=UnicastFlowControl(),
        counters=Counters(),
        now=0.0,
    )
    state.run_segments = run_segments
    # Open the window (as an SM would) without going through the connection handshake.
    state.sender_limit = 1 << 19
    state.liveness.newest_sm = 0.0
    return state


def datagrams_sent(state: NetworkPublication, messages: list[bytes]) -> list[bytes]:
    """The datagrams `state` puts on the wire for `messages`, runs cut at their segments."""
    out: list[bytes] = []

    def emit(datagram: bytes | memoryview, segment: int = 0) -> bool:
        data = bytes(datagram)
        if not segment:
            out.append(data)
            return True
        assert len(data) > segment, "a run is more than one datagram"
        out.extend(data[start : start + segment] for start in range(0, len(data), segment))
        return True

    for message in messages:
        assert state.offer(message, 0.0) > 0
    while state.send_pending(0.0, emit):
        pass
    return out


@settings(max_examples=150, deadline=None)
# A frame that fills a datagram alone only because the next one is too big, then a frame of
# the same length that does share its datagram: runs must not assume one frame per datagram.
@example(mtu=1408, sizes=[768, 768, 64, 768, 768, 64])
@given(
    mtu=st.sampled_from([96, 512, 1408, 8192]),
    sizes=st.lists(st.integers(min_value=0, max_value=20_000), min_size=1, max_size=30),
)
def test_runs_stand_for_exactly_the_datagrams_sent_one_by_one(mtu: int, sizes: list[int]) -> None:
    messages = [bytes([i % 251]) * size for i, size in enumerate(sizes)]
    one_by_one = datagrams_sent(publication(mtu, run_segments=0), messages)
    in_runs = datagrams_sent(publication(mtu, run_segments=64), messages)
    assert in_runs == one_by_one
    assert all(len(datagram) <= mtu for datagram in in_runs)


def test_a_big_message_goes_as_one_run_of_full_datagrams() -> None:
    runs: list[tuple[int, int]] = []

    def emit(datagram: bytes | memoryview, segment: int = 0) -> bool:
        runs.append((len(datagram), segment))
        return True

    state = publication(1408, run_segments=64)
    assert state.offer(bytes(16384), 0.0) > 0
    assert state.send_pending(0.0, emit)
    # 16,384 bytes in fragments of 1,376 payload bytes: 11 full frames of 1,408 and the rest.
    assert runs == [(11 * 1408 + 1280, 1408)]


def test_a_coalesced_run_parses_only_if_it_is_one_contiguous_chain() -> None:
    state = publication(1408, run_segments=0)
    datagrams = datagrams_sent(state, [bytes(5000)])
    assert [len(d) for d in datagrams] == [1408, 1408, 1408, 928]
    run = b"".join(datagrams)
    fields = parse_data_run_untrusted(run, 1408)
    assert fields == parse_data_untrusted(datagrams[0])
    # A datagram missing from the middle, another session, a frame across a datagram's end
    # (a segment size that cuts frames), a lone datagram: not one chain, so each goes alone.
    assert parse_data_run_untrusted(datagrams[0] + datagrams[2], 1408) is None
    other = bytearray(datagrams[1])
    other[12:16] = (8).to_bytes(4, "little")  # session id
    assert parse_data_run_untrusted(datagrams[0] + bytes(other), 1408) is None
    assert parse_data_run_untrusted(run, 1376) is None
    assert parse_data_run_untrusted(datagrams[0], 1408) is None
    header = DataHeader(
        frame_length=0, flags=0xC0, term_offset=0, session_id=7, stream_id=STREAM, term_id=0
    ).encode()
    assert parse_data_run_untrusted(header + header, 32) is None  # heartbeats never run


async def _one_way(config: TransportConfig, channel: str, count: int) -> tuple[Counters, Counters]:
    async with open_transport(config) as sender, open_transport(config) as receiver:
        sub = await receiver.add_subscription(channel, STREAM)
        pub = await sender.add_publication(channel, STREAM)
        await pub.wait_connected(timeout=5)
        messages = [bytes([i]) * (16384 + i) for i in range(count)]
        got: list[bytes] = []
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:

                async def consume() -> None:
                    while len(got) < count:
                        got.append((await sub.receive()).data)

                nursery.start_soon(consume)
                for message in messages:
                    await pub.send(message, timeout=5)
        assert got == messages
        return sender.counters, receiver.counters


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_big_messages_go_in_runs_and_arrive_coalesced_over_loopback() -> None:
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_port()}"
    sent, received = await _one_way(TransportConfig(), channel, 50)
    assert sent.gso_runs_sent >= 50
    assert received.gro_batches_received >= 1
    # Counted as the datagrams they stand for: at least 12 per 16 KiB message.
    assert sent.datagrams_sent >= 50 * 12
    assert received.datagrams_received >= 50 * 12


async def test_with_gso_off_every_datagram_is_its_own_system_call() -> None:
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_port()}"
    sent, received = await _one_way(TransportConfig(gso=False), channel, 20)
    assert sent.gso_runs_sent == 0
    assert received.gro_batches_received == 0


@pytest.mark.netns
async def test_a_route_that_refuses_runs_falls_back_to_single_datagrams(
    fresh_netns: Callable[[], int],  # noqa: F811
) -> None:
    # Datagrams of 8 KiB (mtu=8192) on a link of 1,500 bytes: the kernel refuses a run of
    # segments larger than the path MTU (EINVAL); sent one by one they are fragmented by IP
    # and arrive all the same.
    # From this thread, which is the one in the test's namespace (trio.run_process may spawn
    # from a worker thread still in the host's namespace, and change the host's loopback).
    subprocess.run(["ip", "link", "set", "lo", "mtu", "1500"], check=True)  # noqa: ASYNC221
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_port()}|mtu=8192"
    sent, _ = await _one_way(TransportConfig(), channel, 20)
    assert sent.gso_disabled == 1
    assert sent.send_errors == 0
