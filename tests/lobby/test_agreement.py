"""The lobby's logical channels hand credit back by the quarter buffer, not per message, and
never leave a sender short of its largest message (echo.lobby.agreement).

Pure: the two peers of a member's session (`ChannelPeer` with the server's and the member's
specs) exchange batches directly, as the session would carry them."""

from __future__ import annotations

from echo.channels.core import ChannelPeer
from echo.lobby.agreement import CHAT_MAX_MESSAGE, lobby_channel_specs
from echo.lobby.protocol import MAX_MESSAGE_BYTES, Channel
from tests.channels.pair import settle


def session() -> tuple[ChannelPeer, ChannelPeer]:
    server = ChannelPeer(lobby_channel_specs(server=True))
    member = ChannelPeer(lobby_channel_specs(server=False))
    settle(server, member)
    return server, member


def deliver(sender: ChannelPeer, receiver: ChannelPeer, channel: int, size: int) -> int:
    """`sender` sends one message of `size` bytes, `receiver` reads and processes it; the
    number of batches (datagrams of the session) the receiver sends back for it."""
    sender.send(channel, b"u" * size)
    batch = sender.data_to_send(1 << 20)
    assert batch  # it went at once: the sender held guarantees for it
    receiver.receive(batch)
    delivery = receiver.take(channel)
    assert delivery is not None and delivery.size == size
    receiver.release(delivery)
    back = receiver.data_to_send(1 << 20)
    if back:
        sender.receive(back)
    return 1 if back else 0


def test_a_member_hands_back_credit_for_updates_and_replies_by_the_quarter_buffer() -> None:
    # 300 updates of 200 bytes (members joining, leaving, getting ready) and 300 replies:
    # before, each sent the server a GUARANTEE of its own (with its probe heartbeat and the
    # status message that answered it).
    server, member = session()
    for channel in (Channel.UPDATES, Channel.REQUESTS):
        backs = sum(deliver(server, member, channel, 200) for _ in range(300))
        assert backs == 0  # 60 KB read: under a quarter of the member's two largest messages
        # ... and the server can still send a largest message (a lobby snapshot) at once.
        assert server.guarantees(channel) >= MAX_MESSAGE_BYTES


def test_a_member_never_leaves_the_server_short_of_a_largest_message() -> None:
    # Messages of every size up to the largest, each read at once: the member tops the server
    # up whenever it holds less than one largest message, so nothing ever waits.
    server, member = session()
    sizes = [MAX_MESSAGE_BYTES, 1, MAX_MESSAGE_BYTES // 2, MAX_MESSAGE_BYTES, 7000] * 4
    backs = sum(deliver(server, member, Channel.UPDATES, size) for size in sizes)
    assert 0 < backs < len(sizes)
    assert server.guarantees(Channel.UPDATES) >= MAX_MESSAGE_BYTES
    assert member.counters["messages_dropped"] == 0


def test_the_server_credits_each_request_and_chat_line_at_once() -> None:
    # The server's buffers are one largest request and one largest chat line: they bound what
    # a member can make the server hold, so each message read is credited back at once (in
    # the same session message as its reply or its echo), and a member always holds enough
    # for its largest message.
    server, member = session()
    largest_of = {Channel.REQUESTS: MAX_MESSAGE_BYTES, Channel.CHAT: CHAT_MAX_MESSAGE}
    for channel, largest in largest_of.items():
        assert [deliver(member, server, channel, 100) for _ in range(3)] == [1, 1, 1]
        assert member.guarantees(channel) == largest
