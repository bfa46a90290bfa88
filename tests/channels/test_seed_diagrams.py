"""Every diagram of the resource-management note, replayed with its exact numbers (sizes are
payload bytes)."""

from __future__ import annotations

from echo.channels.core import OutState
from tests.channels.pair import one, peers, settle, state, step


def buffered_sizes(server, channel=0):
    return [d.size for d in server.incoming[channel].buffer]


def test_sending_spends_guarantees():
    """Six slots, four guaranteed, two unissued; a three-byte message leaves the client one."""
    client, server = peers(6)
    server.issue(0, 4)
    step(server, client)
    assert state(server) == (6, 0, 2)
    assert client.guarantees(0) == 4
    client.send(0, b"abc")
    step(client, server)
    assert client.guarantees(0) == 1
    assert state(server) == (6, 3, 2)  # buffered; issuable unchanged
    assert buffered_sizes(server) == [3]


def test_capacity_increase_then_issue():
    client, server = peers(0)
    assert state(server) == (0, 0, 0) and client.guarantees(0) == 0
    server.resize(0, 5)
    assert state(server) == (5, 0, 5)
    server.issue(0)
    step(server, client)
    assert state(server) == (5, 0, 0)
    assert client.guarantees(0) == 5


def test_processing_then_aggregated_guarantees():
    """Two free, messages 2, 1, 2: process two of them, then issue the three freed bytes."""
    client, server = peers(7)
    server.issue(0)
    step(server, client)
    for payload in (b"aa", b"b", b"cc"):
        client.send(0, payload)
    settle(client, server)
    assert state(server) == (7, 5, 0) and client.guarantees(0) == 2
    server.release(server.take(0))
    assert state(server) == (7, 3, 2)
    server.release(server.take(0))
    assert state(server) == (7, 2, 3)
    assert buffered_sizes(server) == [2]
    server.issue(0)
    step(server, client)
    assert state(server) == (7, 2, 0)
    assert client.guarantees(0) == 5


def test_shrinking_by_processing_without_issuing():
    client, server = peers(6)
    server.issue(0)
    step(server, client)
    client.send(0, b"aa")
    client.send(0, b"bb")
    settle(client, server)
    assert state(server) == (6, 4, 0) and client.guarantees(0) == 2
    server.resize(0, 4)
    assert not server.control  # buffered bytes suffice: no plea
    server.release(server.take(0))
    assert state(server) == (4, 2, 0)
    assert client.guarantees(0) == 2


def test_plead_and_absolve():
    """Seven free slots; plead down to three; the client absolves four; the buffer shrinks."""
    client, server = peers(7)
    server.issue(0)
    step(server, client)
    assert client.guarantees(0) == 7
    server.resize(0, 3)
    step(server, client)  # the PLEAD(3)
    assert client.guarantees(0) == 3
    step(client, server)  # the ABSOLVE(4)
    assert state(server) == (3, 0, 0)


def test_concurrent_plead_and_send():
    """Nine slots, two used, client seven; plead to four while the client sends one byte."""
    client, server = peers(9)
    server.issue(0, 9)
    step(server, client)
    client.send(0, b"xx")
    step(client, server)
    assert state(server) == (9, 2, 0) and client.guarantees(0) == 7
    server.plead(0, 4)
    client.send(0, b"y")
    plea = server.data_to_send()
    message = client.data_to_send()  # both in flight at once
    server.receive(message)
    assert state(server) == (9, 3, 0)
    client.receive(plea)
    assert client.guarantees(0) == 6 - 2 == 4
    step(client, server)  # ABSOLVE(2)
    assert state(server) == (7, 3, 0)
    assert buffered_sizes(server) == [2, 1]


def test_optimistic_message_that_fits():
    client, server = peers(7)
    server.issue(0, 6)
    step(server, client)
    client.send(0, b"4444")
    client.send(0, b"22")
    settle(client, server)
    assert state(server) == (7, 6, 1) and client.guarantees(0) == 0
    server.release(server.take(0))  # the four-byte message
    assert state(server) == (7, 2, 5)
    assert client.guarantees(0) == 0
    client.send(0, b"333", optimistic=True)
    step(client, server)
    assert client.guarantees(0) == -3
    assert state(server) == (7, 5, 5)  # buffered; issuable unchanged, two slots free
    server.issue(0)
    step(server, client)
    assert state(server) == (7, 5, 0)
    assert client.guarantees(0) == 2


def test_dropping_until_apology():
    """One free slot beside a six-byte message; a 3-byte then a 1-byte optimistic message."""
    client, server = peers(7)
    server.issue(0)
    step(server, client)
    client.send(0, b"666666")
    step(client, server)
    assert state(server) == (7, 6, 0) and client.guarantees(0) == 1
    client.send(0, b"333", optimistic=True)
    step(client, server)
    assert client.guarantees(0) == -2
    assert server.incoming[0].dropping and state(server) == (7, 6, 0)
    client.send(0, b"1", optimistic=True)
    notice = server.data_to_send()  # ANNOUNCE_DROPPING, not yet at the client
    step(client, server)
    assert client.guarantees(0) == -3
    assert state(server) == (7, 6, 0) and buffered_sizes(server) == [6]
    client.receive(notice)
    assert client.guarantees(0) == 1
    one(client, server)  # the APOLOGISE alone
    assert not server.incoming[0].dropping
    # Transparent retransmission, in order, before anything newer.
    assert [m.frame.payload for m in client.outgoing[0].queue] == [b"333", b"1"]


def test_guarantees_precede_the_announcement():
    """The note's widest diagram: a partly optimistic 2-byte message survives, a 3-byte one not."""
    client, server = peers(7)
    server.issue(0, 4)
    step(server, client)
    client.send(0, b"ccc")
    step(client, server)
    assert state(server) == (7, 3, 3) and client.guarantees(0) == 1
    two = client.send(0, b"22", optimistic=True)
    step(client, server)
    assert client.guarantees(0) == -1
    assert [(m.size, m.uncovered) for m in client.outgoing[0].unconfirmed] == [(2, 1)]
    assert state(server) == (7, 5, 3) and not server.incoming[0].dropping
    three = client.send(0, b"333", optimistic=True)
    step(client, server)
    assert client.guarantees(0) == -4
    assert server.incoming[0].dropping
    assert state(server) == (7, 5, 2)  # one guarantee issued to cover the buffered optimistic byte
    cover, notice = server.control
    assert cover.amount == 1 and notice.channel == 0
    one(server, client)  # the GUARANTEE(1)
    assert client.guarantees(0) == -3
    assert two.state is OutState.SETTLED
    assert list(client.outgoing[0].unconfirmed) == [three]
    one(server, client)  # the ANNOUNCE_DROPPING
    assert client.guarantees(0) == 0
    assert not client.outgoing[0].unconfirmed
    one(client, server)  # the APOLOGISE
    assert not server.incoming[0].dropping
    assert state(server) == (7, 5, 2)
    assert buffered_sizes(server) == [3, 2]
    assert client.guarantees(0) == 0
    assert list(client.outgoing[0].queue) == [three]  # kept to retransmit
