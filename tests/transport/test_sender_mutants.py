"""SendEndpoint's rules that mutation testing found untested (./dev mutate sender).

A recording `send` stands for the socket; frames from receivers are handed to `on_datagram` as
bytes with their source address, at times the test picks. The rules are those of Aeron's
SendChannelEndpoint (dynamic MDC: SMs register their source as a destination, end-of-stream
SMs remove it) and of echo's address validation (validation.py: a stranger's registration is
answered with a cookie challenge no larger than it, and only an echoed cookie adds it).
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from echo.transport.core.counters import Counters
from echo.transport.core.flow_control import MaxMulticastFlowControl
from echo.transport.core.frames import (
    RTTM_REPLY_FLAG,
    SM_EOS_FLAG,
    SM_SETUP_FLAG,
    DataHeader,
    ErrorFrame,
    Nak,
    ResponseSetup,
    Rttm,
    Setup,
    StatusMessage,
    parse_datagram_untrusted,
)
from echo.transport.core.sender import WOULD_BLOCK, NetworkPublication, SendEndpoint, SendMode
from echo.transport.core.validation import SM_COOKIE_FLAG, CookieJar, RateLimiter

SESSION = 31
STREAM = 1001
TERM = 64 * 1024
A = ("10.0.0.1", 4000)
A2 = ("10.0.0.1", 4001)  # the same host, another port
B = ("10.0.0.2", 4000)
SECRET = b"k" * 32


class Wire:
    """The socket: what was sent, to where, as one datagram (segment 0) or a run."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, Any, int]] = []
        self.results: dict[Any, int] = {}  # per address: 0 (lost) or WOULD_BLOCK; else 1

    def send(self, datagram: bytes | memoryview, address: Any, segment: int = 0) -> int:
        result = self.results.get(address, 1)
        if result > 0:
            self.sent.append((bytes(datagram), address, segment))
        return result

    def to(self, address: Any) -> list[Any]:
        return [parse_datagram_untrusted(d) for d, a, _ in self.sent if a == address]

    def setups(self) -> list[tuple[int, Any]]:
        return [
            (frame.session_id, a)
            for d, a, _ in self.sent
            if isinstance(frame := parse_datagram_untrusted(d), Setup)
        ]

    def clear(self) -> None:
        self.sent.clear()


def publication(session_id: int = SESSION, counters: Counters | None = None) -> NetworkPublication:
    return NetworkPublication(
        session_id=session_id,
        stream_id=STREAM,
        initial_term_id=0,
        term_length=TERM,
        mtu=1408,
        flow_control=MaxMulticastFlowControl(),
        counters=counters or Counters(),
        now=0.0,
    )


def endpoint(mode: SendMode = SendMode.DYNAMIC, **kwargs: Any) -> SendEndpoint:
    return SendEndpoint(mode=mode, counters=Counters(), **kwargs)


def registration(receiver_id: int, cookie: tuple[int, int] = (0, 0)) -> bytes:
    return StatusMessage(0, 0, cookie[0], cookie[1], 0, receiver_id, flags=SM_SETUP_FLAG).encode()


def status(
    receiver_id: int, session_id: int = SESSION, flags: int = 0, cookie: tuple[int, int] = (0, 0)
) -> bytes:
    return StatusMessage(
        session_id, STREAM, cookie[0], cookie[1], TERM // 2, receiver_id, flags=flags
    ).encode()


def challenge(jar: CookieJar, address: Any, receiver_id: int, now: float) -> bytes:
    first, second = jar.make(address, receiver_id, now)
    return StatusMessage(0, 0, first, second, 0, receiver_id, flags=SM_COOKIE_FLAG).encode()


# ---------------------------------------------------------------- address validation


def test_a_strangers_registration_gets_one_cookie_challenge_and_no_destination() -> None:
    jar = CookieJar(SECRET)
    ep = endpoint(cookies=jar)
    ep.add(publication())
    wire = Wire()
    ep.on_datagram(registration(7), A, 1.0)
    assert ep.destinations == []
    assert ep.counters.unvalidated_drops == 1
    assert ep.next_deadline(1.0) == 1.0  # the challenge is due
    ep.poll(1.0, wire.send)
    # Exactly the SM it answers, in size: session 0, stream 0, the cookie, no window.
    assert wire.sent == [(challenge(jar, A, 7, 1.0), A, 0)]
    assert ep.counters.cookie_challenges_sent == 1
    assert ep.destinations == []
    wire.clear()
    ep.on_datagram(registration(7), A, 1.5)
    assert ep.counters.unvalidated_drops == 2
    ep.poll(1.5, wire.send)
    assert ep.counters.cookie_challenges_sent == 2
    assert ep.next_deadline(1.5) > 1.5  # replies are sent once, not kept


def test_an_echoed_cookie_adds_the_destination_and_gets_its_setup_at_once() -> None:
    jar = CookieJar(SECRET)
    ep = endpoint(cookies=jar, limiter=RateLimiter(rate=0.0, burst=1.0))
    pub = publication()
    ep.add(pub)
    wire = Wire()
    ep.on_datagram(registration(7), A, 1.0)  # the challenge takes A's only token
    ep.on_datagram(registration(7, jar.make(A, 7, 1.0)), A, 1.1)
    assert ep.destinations == [A]
    assert ep.counters.destinations_added == 1
    ep.poll(1.1, wire.send)
    # A validated destination's SETUP is not rate-limited: it has shown it receives at A.
    assert (SESSION, A) in wire.setups()
    assert ep.counters.rate_limited == 0
    # From now on its SMs are taken without a cookie.
    ep.on_datagram(status(7), A, 1.2)
    assert pub.is_connected(1.2)
    assert ep.counters.unvalidated_drops == 1  # the first registration only


def test_a_cookie_counts_only_for_the_address_and_receiver_it_was_made_for() -> None:
    jar = CookieJar(SECRET)
    ep = endpoint(cookies=jar)
    cookie = jar.make(A, 7, 1.0)
    ep.on_datagram(registration(7, cookie), A2, 1.0)
    ep.on_datagram(registration(8, cookie), A, 1.0)
    assert ep.destinations == []
    assert ep.counters.unvalidated_drops == 2


def test_only_a_registration_from_a_stranger_is_challenged_or_admitted() -> None:
    # A registration is session 0, stream 0 and setup-eliciting; any other SM from an
    # unvalidated address is dropped without a reply, even carrying a valid cookie.
    jar = CookieJar(SECRET)
    ep = endpoint(cookies=jar)
    pub = publication()
    ep.add(pub)
    wire = Wire()
    cookie = jar.make(A, 7, 1.0)
    for session_id, stream_id, flags in ((SESSION, STREAM, SM_SETUP_FLAG), (0, STREAM,
            SM_SETUP_FLAG), (SESSION, 0, SM_SETUP_FLAG), (0, 0, 0)):  # fmt: skip
        sm = StatusMessage(session_id, stream_id, cookie[0], cookie[1], 0, 7, flags=flags)
        ep.on_datagram(sm.encode(), A, 1.0)
    assert ep.counters.unvalidated_drops == 4
    assert ep.destinations == []
    assert not pub.is_connected(1.0)
    ep.poll(1.0, wire.send)
    assert wire.sent == []
    assert ep.counters.rate_limited == 0


def test_challenges_to_one_host_are_rate_limited_per_host() -> None:
    jar = CookieJar(SECRET)
    ep = endpoint(cookies=jar, limiter=RateLimiter(rate=0.0, burst=2.0))
    wire = Wire()
    ep.on_datagram(registration(1), A, 1.0)
    ep.on_datagram(registration(2), A2, 1.0)  # another port of the same host: same bucket
    ep.on_datagram(registration(3), A2, 1.0)
    ep.on_datagram(registration(4), A, 1.0)
    ep.on_datagram(registration(5), B, 1.0)  # another host has its own
    ep.poll(1.0, wire.send)
    assert [a for _, a, _ in wire.sent] == [A, A2, B]
    assert ep.counters.rate_limited == 2
    assert ep.counters.cookie_challenges_sent == 3


def test_a_nak_or_rttm_from_an_unvalidated_address_is_dropped() -> None:
    jar = CookieJar(SECRET)
    ep = endpoint(cookies=jar)
    pub = publication()
    ep.add(pub)
    ep.on_datagram(registration(7, jar.make(A, 7, 1.0)), A, 1.0)
    ep.on_datagram(Nak(SESSION, STREAM, 0, 0, 1024).encode(), B, 1.0)
    ep.on_datagram(Rttm(SESSION, STREAM, 5, 0, 8, flags=RTTM_REPLY_FLAG).encode(), B, 1.0)
    assert ep.counters.unvalidated_drops == 2
    assert ep.counters.naks_received == 1
    ep.on_datagram(Nak(SESSION, STREAM, 0, 0, 1024).encode(), A, 1.0)  # the destination's own
    assert ep.counters.unvalidated_drops == 2
    wire = Wire()
    ep.on_datagram(Rttm(SESSION, STREAM, 6, 0, 7, flags=RTTM_REPLY_FLAG).encode(), A, 1.0)
    ep.poll(1.0, wire.send)
    rttms = [f for f in wire.to(A) if isinstance(f, Rttm)]
    assert [r.echo_timestamp_ns for r in rttms] == [6]  # the destination's own is answered


# ---------------------------------------------------------------- dynamic destinations


def test_without_validation_setup_replies_to_strangers_are_rate_limited_per_host() -> None:
    ep = endpoint(limiter=RateLimiter(rate=0.0, burst=1.0))
    ep.add(publication())
    wire = Wire()
    ep.on_datagram(registration(1), A, 1.0)
    ep.on_datagram(registration(2), A2, 1.0)
    ep.on_datagram(registration(3), A2, 1.0)
    ep.on_datagram(registration(4), B, 1.0)
    assert ep.destinations == [A, A2, B]  # added all the same: they are in the table
    ep.poll(1.0, wire.send)
    setups = [a for _, a in wire.setups()]
    # The replies: A and B once each; the publication's own SETUP round goes to all three.
    assert ep.counters.rate_limited == 2
    assert setups.count(A) == 2 and setups.count(B) == 2 and setups.count(A2) == 1


def test_destinations_added_refused_and_removed_are_counted() -> None:
    ep = endpoint(max_destinations=2)
    pub = publication()
    ep.add(pub)
    ep.on_datagram(registration(1), A, 1.0)
    ep.on_datagram(registration(1), A, 1.1)  # refreshed: not added again
    ep.on_datagram(registration(2), B, 1.1)
    assert ep.counters.destinations_added == 2
    ep.on_datagram(status(3), A2, 1.2)  # the table is full
    ep.on_datagram(status(4), A2, 1.2)
    assert ep.counters.destinations_refused == 2
    assert not pub.is_connected(1.2)  # a refused receiver's SM goes no further
    ep.on_datagram(status(1, flags=SM_EOS_FLAG), A, 1.3)
    assert ep.destinations == [B]
    ep.on_datagram(status(2, flags=SM_EOS_FLAG), B, 1.3)
    assert ep.destinations == []
    assert ep.counters.destinations_removed == 2
    ep.on_datagram(status(9, flags=SM_EOS_FLAG), B, 1.4)  # added, and gone at once
    assert ep.counters.destinations_removed == 3
    assert ep.counters.destinations_added == 3


def test_a_registration_gets_every_publications_setup_and_a_session_sm_only_its_own() -> None:
    ep = endpoint()
    first, second, closed = publication(1), publication(2), publication(3)
    for pub in (first, second, closed):
        ep.add(pub)
    closed.abort()
    wire = Wire()
    for pub, receiver in ((first, 1), (second, 1)):  # connected: no SETUP rounds of their own
        ep.on_datagram(status(receiver, session_id=pub.session_id), A, 0.5)
    ep.poll(0.5, wire.send)
    wire.clear()
    ep.on_datagram(registration(9), B, 1.0)
    ep.poll(1.0, wire.send)
    assert sorted(wire.setups()) == [(1, B), (2, B)]  # to the newcomer alone
    wire.clear()
    ep.on_datagram(status(9, session_id=2, flags=SM_SETUP_FLAG), B, 1.1)
    ep.on_datagram(status(9, session_id=77, flags=SM_SETUP_FLAG), B, 1.1)  # no such session
    ep.on_datagram(status(9, session_id=0, flags=SM_SETUP_FLAG), B, 1.1)  # session 0 alone
    ep.poll(1.1, wire.send)
    assert wire.setups() == [(2, B)]
    assert ep.counters.setups_sent == 3


def test_expired_destinations_are_counted_and_the_endpoint_wakes_just_after_expiry() -> None:
    ep = endpoint(destination_timeout=3.0)
    wire = Wire()
    ep.on_datagram(registration(1), A, 1.0)
    ep.on_datagram(registration(2), B, 2.0)
    deadline = ep.next_deadline(2.0)
    assert 4.0 < deadline == math.nextafter(4.0, math.inf)
    ep.poll(deadline, wire.send)
    assert ep.destinations == [B]
    assert ep.counters.destinations_removed == 1
    ep.poll(5.5, wire.send)
    assert ep.counters.destinations_removed == 2
    assert ep.next_deadline(5.5) == math.inf


# ---------------------------------------------------------------- sending


def test_emit_to_all_sends_to_every_destination_and_passes_a_run_on() -> None:
    ep = endpoint(SendMode.MANUAL)
    assert ep.manual is not None
    ep.manual.add(A)
    ep.manual.add(B)
    wire = Wire()
    assert ep.emit_to_all(b"x" * 64, 32, send=wire.send) == 2
    assert wire.sent == [(b"x" * 64, A, 32), (b"x" * 64, B, 32)]
    wire.results[A] = 0  # a send error: A's copy is lost, B's still counts
    assert ep.emit_to_all(b"y", send=wire.send) == 1
    wire.results[A] = WOULD_BLOCK
    assert ep.emit_to_all(b"z", send=wire.send) == WOULD_BLOCK
    assert endpoint(SendMode.MANUAL).emit_to_all(b"q", send=wire.send) == 0


def test_flush_sends_through_the_send_it_is_given() -> None:
    ep = endpoint(SendMode.UNICAST, remote=A)
    pub = publication()
    ep.add(pub)
    pub.on_status_message(StatusMessage(SESSION, STREAM, 0, 0, TERM // 2, 1), 0.0)
    first, second = Wire(), Wire()
    assert pub.offer(b"a" * 100, 0.0) > 0
    ep.flush(pub, 0.0, first.send)
    assert pub.offer(b"b" * 100, 0.0) > 0
    ep.flush(pub, 0.0, second.send)
    assert [f.term_offset for f in first.to(A) if isinstance(f, DataHeader)] == [0]
    assert [f.term_offset for f in second.to(A) if isinstance(f, DataHeader)] == [160]
    assert {a for _, a, _ in first.sent + second.sent} == {A}


def test_a_removed_publication_is_gone_and_removing_it_again_is_harmless() -> None:
    ep = endpoint(SendMode.UNICAST, remote=A)
    pub = publication()
    ep.add(pub)
    with pytest.raises(ValueError, match=f"session-id {SESSION} on stream {STREAM} already"):
        ep.add(publication())
    ep.remove(pub)
    ep.remove(pub)
    assert ep.publications == {}
    ep.on_datagram(status(1), A, 0.0)
    assert ep.counters.unknown_session_drops == 1
    ep.add(pub)  # the key is free again


# ---------------------------------------------------------------- frames from receivers


def test_frames_from_receivers_reach_only_their_own_publication() -> None:
    ep = endpoint(SendMode.UNICAST, remote=A)
    pub = publication()
    ep.add(pub)
    ep.on_datagram(status(1), A, 0.0)
    assert pub.is_connected(0.0)
    assert ep.counters.status_messages_received == 1
    for _ in range(2):
        ep.on_datagram(status(1, session_id=99), A, 0.0)
        ep.on_datagram(Nak(99, STREAM, 0, 0, 64).encode(), A, 0.0)
    assert ep.counters.unknown_session_drops == 4
    assert ep.counters.naks_received == 2
    # Session 0 (or stream 0) alone is no wildcard: only both at 0 speak to every stream.
    ep.on_datagram(StatusMessage(SESSION, 0, 0, 0, 0, 1).encode(), A, 0.0)
    ep.on_datagram(StatusMessage(0, STREAM, 0, 0, 0, 1).encode(), A, 0.0)
    assert ep.counters.unknown_session_drops == 6
    for _ in range(2):  # an RSP_SETUP for no request publication of this endpoint
        ep.on_datagram(ResponseSetup(SESSION, STREAM, 5).encode(), A, 0.0)
    assert ep.counters.response_setups_received == 2
    assert ep.counters.unknown_session_drops == 8
    ep.on_datagram(ErrorFrame(99, STREAM, 1, 1, "no").encode(), A, 0.0)
    assert pub.is_connected(0.0)
    ep.on_datagram(ErrorFrame(SESSION, STREAM, 1, 1, "no").encode(), A, 0.0)
    assert not pub.is_connected(0.0)  # the receiver refused the stream


def test_data_or_garbage_on_a_send_channel_is_counted_invalid() -> None:
    ep = endpoint(SendMode.UNICAST, remote=A)
    ep.add(publication())
    data = DataHeader(32, 0xC0, 0, SESSION, STREAM, 0).encode()
    ep.on_datagram(data, A, 0.0)
    ep.on_datagram(b"\x01\x02", A, 0.0)
    assert ep.counters.invalid_by_reason["unexpected_on_send_channel"] == 1
    assert ep.counters.invalid_by_reason["too_short"] == 1
    assert ep.counters.invalid_frames == 2


def test_a_setup_eliciting_sm_for_all_sessions_triggers_every_publications_setup() -> None:
    ep = endpoint(SendMode.UNICAST, remote=A)
    pubs = [publication(1), publication(2)]
    wire = Wire()
    for pub in pubs:
        ep.add(pub)
        pub.on_status_message(StatusMessage(pub.session_id, STREAM, 0, 0, TERM // 2, 1), 0.0)
    ep.poll(0.5, wire.send)
    assert wire.setups() == []
    ep.on_datagram(StatusMessage(0, 0, 0, 0, 0, 1).encode(), A, 0.6)  # not eliciting
    ep.poll(0.6, wire.send)
    assert wire.setups() == []
    ep.on_datagram(registration(1), A, 0.7)
    ep.poll(0.7, wire.send)
    assert sorted(wire.setups()) == [(1, A), (2, A)]


def test_replies_count_only_datagrams_that_left() -> None:
    jar = CookieJar(SECRET)
    ep = endpoint(cookies=jar)
    wire = Wire()
    wire.results[A] = 0
    ep.on_datagram(registration(7), A, 1.0)
    ep.on_datagram(registration(8), B, 1.0)
    ep.poll(1.0, wire.send)
    assert ep.counters.cookie_challenges_sent == 1
    assert [a for _, a, _ in wire.sent] == [B]


def test_run_segments_reach_every_publication_old_and_new() -> None:
    ep = endpoint(SendMode.UNICAST, remote=A, run_segments=8)
    old = publication(1)
    ep.add(old)
    assert old.run_segments == 8
    ep.set_run_segments(0)
    new = publication(2)
    ep.add(new)
    assert old.run_segments == new.run_segments == 0


def test_a_unicast_endpoint_sends_to_its_remote_alone_even_its_end_of_stream() -> None:
    ep = endpoint(SendMode.UNICAST, remote=A)
    assert ep.destinations == [A]
    assert endpoint(SendMode.UNICAST).destinations == []
    pub = publication()
    ep.add(pub)
    wire = Wire()
    ep.announce_end(pub, wire.send)
    [eos] = wire.to(A)
    assert isinstance(eos, DataHeader) and eos.is_end_of_stream
    assert pub.is_done


def test_a_strangers_registration_makes_no_publication_send_to_the_destinations() -> None:
    # Only a challenge goes back, to the stranger: no SETUP round to every destination.
    jar = CookieJar(SECRET)
    ep = endpoint(cookies=jar)
    pub = publication()
    ep.add(pub)
    wire = Wire()
    ep.on_datagram(registration(1, jar.make(A, 1, 0.0)), A, 0.0)
    ep.on_datagram(status(1), A, 0.0)  # connected: no SETUPs of its own
    ep.poll(0.5, wire.send)
    wire.clear()
    ep.on_datagram(registration(2), B, 0.55)
    ep.poll(0.55, wire.send)  # (before the next heartbeat, due at 0.6)
    assert [a for _, a, _ in wire.sent] == [B]
    assert wire.setups() == []


def test_the_emitter_is_made_once_per_send() -> None:
    ep = endpoint(SendMode.UNICAST, remote=A)
    send = Wire().send  # (one bound method: each `wire.send` is a new one)
    emit = ep.emitter(send)
    assert ep.emitter(send) is emit
    assert ep.emitter(Wire().send) is not emit
