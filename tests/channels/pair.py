"""Two ChannelPeers joined by hand: the pure pair of the channel tests."""

from __future__ import annotations

from echo.channels.core import ChannelPeer, ChannelSpec


def peers(
    capacity: int, *, auto_issue: bool = False, handles: bool = False
) -> tuple[ChannelPeer, ChannelPeer]:
    """(client, server) sharing channel 0; only the server's direction has a buffer."""
    client = ChannelPeer([ChannelSpec(0, capacity=0, handles=handles)], auto_issue=auto_issue)
    server = ChannelPeer(
        [ChannelSpec(0, capacity=capacity, handles=handles)], auto_issue=auto_issue
    )
    return client, server


def step(src: ChannelPeer, dst: ChannelPeer, max_bytes: int = 1 << 20) -> bool:
    """Move one session message from src to dst; False when src had nothing to send."""
    data = src.data_to_send(max_bytes)
    if not data:
        return False
    dst.receive(data)
    return True


def one(src: ChannelPeer, dst: ChannelPeer) -> None:
    """Move exactly one frame (a data_to_send of at most one frame)."""
    assert step(src, dst, max_bytes=1)


def settle(a: ChannelPeer, b: ChannelPeer, limit: int = 10_000) -> None:
    """Exchange messages until both are quiet."""
    for _ in range(limit):
        moved = step(a, b) | step(b, a)
        if not moved:
            return
    raise AssertionError("peers never went quiet")


def state(server: ChannelPeer, channel: int = 0) -> tuple[int, int, int]:
    """(capacity, used, issuable) of the server's buffer."""
    ch = server.incoming[channel]
    return ch.capacity, ch.used, ch.issuable
