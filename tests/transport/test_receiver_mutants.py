"""The receive endpoint (Aeron's ReceiveChannelEndpoint and DataPacketDispatcher) rule by rule,
with hand-moved datagrams: what mutation testing (./dev mutate receiver) showed the pure pair's
tests did not hold.

SETUP checks and image creation, session-specific and all-sessions subscriptions on one
stream, SETUP elicitation and its rate limits, the cool-down and linger of finished images,
multi-destination registration with its cookie, response channels' registration, the GRO
fast path, and which images a poll looks at.
"""

from __future__ import annotations

import random

import pytest

from echo.transport.core.config import ReceiverTimers
from echo.transport.core.counters import Counters
from echo.transport.core.frames import (
    BEGIN_END_AND_EOS_FLAGS,
    DATA_HEADER_LENGTH,
    DATA_HEADER_STRUCT,
    MAX_UDP_PAYLOAD_LENGTH,
    SETUP_GROUP_FLAG,
    SETUP_LENGTH,
    SETUP_SEND_RESPONSE_FLAG,
    SM_EOS_FLAG,
    SM_GTAG_LENGTH,
    SM_SETUP_FLAG,
    UNFRAGMENTED_FLAGS,
    FrameType,
    Nak,
    Setup,
    StatusMessage,
    parse_datagram_untrusted,
)
from echo.transport.core.loss import group_nak_delay
from echo.transport.core.receiver import (
    ImageState,
    ImageUnavailable,
    ReceiveEndpoint,
    StreamInterest,
)
from echo.transport.core.validation import SM_COOKIE_FLAG, RateLimiter

TERM = 64 * 1024
MTU = 1408
STREAM, OTHER_STREAM = 1001, 2002
INITIAL = 5
RID = 0x5EED
SOURCE = ("198.18.0.7", 40001)
CONTROL = ("198.18.0.1", 9000)
FRAME = 1024
NAK_DELAY = ReceiverTimers().nak_delay


class Wire:
    def __init__(self) -> None:
        self.sent: list[tuple[bytes, object]] = []

    def __call__(self, datagram: bytes | memoryview, address: object) -> int:
        self.sent.append((bytes(datagram), address))
        return 1

    def sms(self, to: object = None) -> list[StatusMessage]:
        return [
            f
            for data, where in self.sent
            if to is None or where == to
            for f in [parse_datagram_untrusted(data)]
            if isinstance(f, StatusMessage)
        ]

    def elicitations(self, to: object = None) -> list[StatusMessage]:
        return [sm for sm in self.sms(to) if sm.flags & SM_SETUP_FLAG]

    def naks(self) -> list[Nak]:
        frames = [parse_datagram_untrusted(data) for data, _ in self.sent]
        return [f for f in frames if isinstance(f, Nak)]


def endpoint(*interests: StreamInterest, **kwargs: object) -> ReceiveEndpoint:
    options: dict[str, object] = {"counters": Counters(), "receiver_id": RID, "now": 0.0}
    options.update(kwargs)
    ep = ReceiveEndpoint(**options)  # type: ignore[arg-type]
    for interest in interests:
        ep.add_interest(interest, 0.0)
    return ep


def setup(
    session: int,
    stream: int = STREAM,
    *,
    flags: int = 0,
    term_length: int = TERM,
    mtu: int = MTU,
    term_offset: int = 0,
    active: int = INITIAL,
) -> bytes:
    return Setup(
        term_offset=term_offset,
        session_id=session,
        stream_id=stream,
        initial_term_id=INITIAL,
        active_term_id=active,
        term_length=term_length,
        mtu=mtu,
        flags=flags,
    ).encode()


def data(session: int, position: int, stream: int = STREAM, size: int = FRAME) -> bytes:
    header = DATA_HEADER_STRUCT.pack(
        size, 0, UNFRAGMENTED_FLAGS, FrameType.DATA, position % TERM, session, stream,
        INITIAL + position // TERM, 0,
    )  # fmt: skip
    return header + bytes(size - DATA_HEADER_LENGTH)


def heartbeat(session: int, position: int, flags: int = UNFRAGMENTED_FLAGS) -> bytes:
    return DATA_HEADER_STRUCT.pack(
        0, 0, flags, FrameType.DATA, position % TERM, session, STREAM, INITIAL + position // TERM, 0
    )


ALL = StreamInterest(stream_id=STREAM)


# ----------------------------------------------------------------------- SETUP checks


def _refusal(frame: bytes, interest: StreamInterest = ALL) -> str | None:
    ep = endpoint(interest)
    ep.on_datagram(frame, SOURCE, 0.0)
    if ep.images:
        return None
    (reason,) = ep.counters.invalid_by_reason
    return reason


def test_setup_mtu_must_hold_more_than_a_header_and_fit_a_datagram_and_a_message() -> None:
    assert _refusal(setup(1, mtu=DATA_HEADER_LENGTH)) == "bad_setup_mtu"
    assert _refusal(setup(1, mtu=2 * DATA_HEADER_LENGTH)) is None
    big_term = 1 << 20  # its longest message (128 KiB) is more than a datagram
    assert _refusal(setup(1, term_length=big_term, mtu=MAX_UDP_PAYLOAD_LENGTH)) is None
    too_big = MAX_UDP_PAYLOAD_LENGTH + 32
    assert _refusal(setup(1, term_length=big_term, mtu=too_big)) == "bad_setup_mtu"
    assert _refusal(setup(1, mtu=TERM // 8)) is None  # exactly the longest message
    assert _refusal(setup(1, mtu=TERM // 8 + 32)) == "bad_setup_mtu"


def test_setup_term_offset_must_be_aligned_and_inside_the_term() -> None:
    assert _refusal(setup(1, term_offset=TERM - 32)) is None
    assert _refusal(setup(1, term_offset=TERM)) == "bad_setup_offset"
    assert _refusal(setup(1, term_offset=48)) == "bad_setup_offset"
    assert _refusal(setup(1, term_offset=-32)) == "bad_setup_offset"


def test_setup_active_term_must_not_precede_the_initial_one() -> None:
    assert _refusal(setup(1, active=INITIAL - 1)) == "bad_setup_term_id"


def test_setup_term_length_up_to_the_subscriptions_maximum() -> None:
    interest = StreamInterest(stream_id=STREAM, max_term_length=TERM)
    assert _refusal(setup(1), interest) is None
    assert _refusal(setup(1, term_length=2 * TERM), interest) == "setup_term_too_long"


def test_a_full_endpoint_refuses_more_images() -> None:
    ep = endpoint(ALL, max_images=1)
    ep.on_datagram(setup(1), SOURCE, 0.0)
    ep.on_datagram(setup(2), SOURCE, 0.0)
    assert list(ep.images) == [(1, STREAM)]
    assert ep.counters.invalid_by_reason["too_many_images"] == 1


# ----------------------------------------------------------------------- images from SETUPs


def test_setups_and_images_are_counted_one_each() -> None:
    ep = endpoint(ALL)
    ep.on_datagram(setup(1), SOURCE, 0.0)
    ep.on_datagram(setup(2), SOURCE, 0.0)
    assert ep.counters.setups_received == 2
    assert ep.counters.images_created == 2


def test_a_repeated_setup_keeps_the_image_and_is_answered_at_once() -> None:
    ep, wire = endpoint(ALL), Wire()
    ep.on_datagram(setup(1), SOURCE, 0.0)
    image = ep.images[(1, STREAM)]
    ep.poll(0.0, wire)
    ep.on_datagram(data(1, 0), SOURCE, 0.01)
    ep.poll(0.01, wire)
    ep.on_datagram(setup(1), SOURCE, 0.05)  # our SM was lost
    assert ep.images[(1, STREAM)] is image
    assert image.hwm == FRAME  # not a new image: what it received is still there
    assert len(ep.take_events()) == 1
    assert ep.next_deadline(0.05) == 0.05
    ep.poll(0.05, wire)
    assert len(wire.sms()) == 2


def test_an_image_takes_the_group_flag_and_the_endpoints_rng_and_timers() -> None:
    seed = 3
    timers = ReceiverTimers(liveness_timeout=0.5)
    ep, wire = endpoint(ALL, rng=random.Random(seed), timers=timers), Wire()
    ep.on_datagram(setup(1, flags=SETUP_GROUP_FLAG), SOURCE, 0.0)
    ep.poll(0.0, wire)
    ep.on_datagram(data(1, 0), SOURCE, 0.0)
    ep.on_datagram(data(1, 2 * FRAME), SOURCE, 0.0)
    ep.poll(0.0, wire)
    delay = group_nak_delay(random.Random(seed), timers.group_nak_max_backoff, 10)
    assert ep.next_deadline(0.0) == delay
    ep.poll(delay, wire)
    assert [n.term_offset for n in wire.naks()] == [FRAME]
    ep.poll(0.5, wire)  # the endpoint's liveness timeout, not the default 10 s
    assert (1, STREAM) not in ep.images


def test_sms_carry_the_subscriptions_group_tag_else_the_endpoints() -> None:
    tagged = StreamInterest(stream_id=OTHER_STREAM, group_tag=0x77)
    # (budgeted: a 40-byte SETUP pays for a 44-byte tagged SM, AMPLIFICATION_FACTOR)
    ep, wire = endpoint(ALL, tagged, group_tag=0x55), Wire()
    ep.on_datagram(setup(1), SOURCE, 0.0)
    ep.on_datagram(setup(2, OTHER_STREAM), SOURCE, 0.0)
    ep.poll(0.0, wire)
    assert sorted((sm.stream_id, sm.group_tag) for sm in wire.sms()) == [
        (STREAM, 0x55),
        (OTHER_STREAM, 0x77),
    ]
    assert [len(datagram) for datagram, _ in wire.sent] == [SM_GTAG_LENGTH] * 2
    assert ep.counters.amplification_limited == 0


def test_an_image_is_a_request_image_only_if_its_setup_says_so() -> None:
    ep = endpoint(ALL)
    ep.on_datagram(setup(1), SOURCE, 0.0)
    ep.on_datagram(setup(2, flags=SETUP_SEND_RESPONSE_FLAG), SOURCE, 0.0)
    assert ep.images[(1, STREAM)].requested_response is False
    assert ep.images[(2, STREAM)].requested_response is True


# ----------------------------------------------------------------------- subscriptions


def test_subscribing_a_stream_twice_on_one_endpoint_is_refused() -> None:
    ep = endpoint(ALL)
    with pytest.raises(ValueError, match=f"stream {STREAM} already has a subscription"):
        ep.add_interest(StreamInterest(stream_id=STREAM), 0.0)
    ep.add_interest(StreamInterest(stream_id=STREAM, session_id=9), 0.0)  # this one may


def test_a_filtered_out_session_counts_as_such_until_the_last_subscription_goes() -> None:
    ep, wire = (
        endpoint(
            StreamInterest(stream_id=STREAM, session_id=1),
            StreamInterest(stream_id=STREAM, session_id=2),
        ),
        Wire(),
    )
    ep.on_datagram(data(3, 0), SOURCE, 0.0)
    assert ep.counters.session_filter_drops == 1
    ep.remove_interest(STREAM, wire, session_id=1)
    ep.on_datagram(data(3, 0), SOURCE, 0.0)
    assert ep.counters.session_filter_drops == 2
    ep.remove_interest(STREAM, wire, session_id=2)
    ep.on_datagram(data(3, 0), SOURCE, 0.0)
    ep.on_datagram(data(3, 0), SOURCE, 0.0)
    assert ep.counters.session_filter_drops == 2
    assert ep.counters.unknown_session_drops == 2
    ep.remove_interest(STREAM, wire, session_id=2)  # gone already: nothing happens


def test_removing_one_subscription_leaves_the_others_and_their_images() -> None:
    only_7 = StreamInterest(stream_id=STREAM, session_id=7)
    ep, wire = endpoint(ALL, only_7, StreamInterest(stream_id=OTHER_STREAM)), Wire()
    # (the other stream's and the session-specific image first: passed over, not the end)
    for session, stream in [(3, OTHER_STREAM), (7, STREAM), (1, STREAM), (2, STREAM)]:
        ep.on_datagram(setup(session, stream), SOURCE, 0.0)
    ep.take_events()
    ep.remove_interest(STREAM, wire)  # the all-sessions subscription of STREAM
    assert sorted(ep.images) == [(3, OTHER_STREAM), (7, STREAM)]
    events = ep.take_events()
    assert sorted((e.image.session_id, e.reason) for e in events) == [  # type: ignore[union-attr]
        (1, ImageState.CLOSED),
        (2, ImageState.CLOSED),
    ]
    assert [sm.flags for sm in wire.sms()] == [SM_EOS_FLAG, SM_EOS_FLAG]
    assert (STREAM, 7) in ep.interests
    ep.remove_interest(STREAM, wire, session_id=7)
    assert sorted(ep.images) == [(3, OTHER_STREAM)]
    assert list(ep.interests) == [(OTHER_STREAM, None)]


def test_closing_the_endpoint_says_goodbye_to_every_image() -> None:
    ep, wire = endpoint(ALL), Wire()
    ep.on_datagram(setup(1), SOURCE, 0.0)
    ep.on_datagram(setup(2), SOURCE, 0.0)
    ep.take_events()
    ep.close(wire)
    assert ep.images == {}
    assert [sm.flags for sm in wire.sms()] == [SM_EOS_FLAG, SM_EOS_FLAG]
    events = ep.take_events()
    assert all(isinstance(e, ImageUnavailable) for e in events)
    assert sorted((e.image.session_id, e.reason) for e in events) == [  # type: ignore[union-attr]
        (1, ImageState.CLOSED),
        (2, ImageState.CLOSED),
    ]
    assert ep.counters.images_closed == 2


# ----------------------------------------------------------------------- rejected and finished


def test_a_rejected_image_says_goodbye_and_its_session_cools_down() -> None:
    # Budgeted: one 40-byte SETUP pays for the first SM and the goodbye (72 <= 3 * 40).
    ep, wire = endpoint(ALL), Wire()
    ep.on_datagram(setup(1), SOURCE, 0.0)
    ep.poll(0.0, wire)
    ep.take_events()
    image = ep.images[(1, STREAM)]
    ep.reject_image(1, STREAM, 0.1, wire)
    assert ep.images == {}
    assert [(type(e), e.image, e.reason) for e in ep.take_events()] == [  # type: ignore[union-attr]
        (ImageUnavailable, image, ImageState.CLOSED)
    ]
    assert [sm.flags for sm in wire.sms()] == [0, SM_EOS_FLAG]
    assert ep.counters.amplification_limited == 0
    cooldown = ReceiverTimers().cooldown
    ep.on_datagram(setup(1), SOURCE, 0.2)
    ep.on_datagram(data(1, 0, size=64), SOURCE, 0.3)  # no SETUP elicited either
    ep.poll(0.3, wire)
    assert ep.images == {} and wire.elicitations() == []
    ep.on_datagram(setup(1), SOURCE, 0.1 + cooldown)  # the cool-down is over
    assert list(ep.images) == [(1, STREAM)]
    ep.reject_image(9, STREAM, 0.1 + cooldown, wire)  # no such image: nothing


def test_a_timed_out_session_cools_down_too() -> None:
    timers = ReceiverTimers(liveness_timeout=0.5)
    ep, wire = endpoint(ALL, timers=timers), Wire()
    ep.on_datagram(setup(1), SOURCE, 0.0)
    ep.poll(0.0, wire)
    ep.poll(0.5, wire)
    assert ep.images == {}
    ep.on_datagram(data(1, 0, size=64), SOURCE, 0.6)
    ep.poll(0.6, wire)
    assert wire.elicitations() == []
    end = 0.5 + ReceiverTimers().cooldown
    ep.on_datagram(data(1, 0, size=64), SOURCE, end)  # cooled down: ask for its SETUP
    ep.poll(end, wire)
    assert len(wire.elicitations()) == 1


def test_a_finished_image_answers_only_end_of_stream_heartbeats_even_after_clean_ups() -> None:
    # Budgeted: each 32-byte end-of-stream heartbeat pays for a 36-byte goodbye (3 * 32).
    ep, wire = endpoint(ALL), Wire()
    ep.on_datagram(setup(1), SOURCE, 0.0)
    ep.poll(0.0, wire)
    ep.on_datagram(heartbeat(1, 0, BEGIN_END_AND_EOS_FLAGS), SOURCE, 0.01)
    ep.poll(0.01, wire)
    assert ep.images == {}
    assert [e.reason for e in ep.take_events()[1:]] == [  # type: ignore[union-attr]
        ImageState.END_OF_STREAM
    ]
    eos_sms = len(wire.sms())
    ep.poll(1.5, wire)  # a clean-up: the finished image is kept while it cools down
    ep.on_datagram(heartbeat(1, 0), SOURCE, 1.6)  # not the end: no goodbye
    assert ep.next_deadline(1.6) > 1.6
    ep.poll(1.6, wire)
    assert len(wire.sms()) == eos_sms
    ep.take_events()
    assert ep.quiet()
    ep.on_datagram(heartbeat(1, 0, BEGIN_END_AND_EOS_FLAGS), SOURCE, 1.7)
    assert not ep.quiet()  # a goodbye to say
    assert ep.next_deadline(1.7) == 1.7
    ep.poll(1.7, wire)
    assert [sm.flags for sm in wire.sms()][eos_sms:] == [SM_EOS_FLAG]
    assert ep.counters.amplification_limited == 0


def test_a_finished_image_gives_its_terms_back_at_once() -> None:
    # Its three mapped terms would otherwise live through the cool-down: under churn that
    # was thousands of maps, and most of a server's RSS growth.
    ep, wire = endpoint(ALL), Wire()
    ep.on_datagram(setup(1), SOURCE, 0.0)
    ep.poll(0.0, wire)
    maps = ep.images[(1, STREAM)].log.maps
    assert len(maps) == 3 and not any(m.closed for m in maps)
    ep.on_datagram(heartbeat(1, 0, BEGIN_END_AND_EOS_FLAGS), SOURCE, 0.01)
    ep.poll(0.01, wire)
    assert ep.images == {} and all(m.closed for m in maps)
    ep.on_datagram(heartbeat(1, 0, BEGIN_END_AND_EOS_FLAGS), SOURCE, 0.02)
    ep.poll(0.02, wire)  # still answered, without its terms
    assert wire.sms()[-1].flags == SM_EOS_FLAG


# ----------------------------------------------------------------------- elicitation


def test_data_of_an_unsubscribed_stream_elicits_nothing_and_is_counted() -> None:
    ep, wire = endpoint(ALL), Wire()
    ep.on_datagram(data(1, 0, OTHER_STREAM), SOURCE, 0.0)
    ep.on_datagram(data(1, 0, OTHER_STREAM), SOURCE, 0.0)
    ep.poll(0.0, wire)
    assert wire.sent == []
    assert ep.counters.unknown_session_drops == 2


def test_elicitation_sms_and_their_interval_and_count() -> None:
    ep, wire = endpoint(ALL, group_tag=0x31), Wire()
    interval = ReceiverTimers().setup_elicit_interval
    ep.on_datagram(data(1, 0), SOURCE, 0.0)
    assert not ep.quiet() and ep.next_deadline(0.0) == 0.0
    ep.poll(0.0, wire)
    assert ep.quiet()
    assert ep.next_deadline(0.0) == 1.0  # only the clean-up of the elicitation record
    ep.on_datagram(data(1, 0), SOURCE, interval * 0.99)
    ep.on_datagram(data(1, 0), SOURCE, interval)  # the interval is over
    ep.poll(interval, wire)
    sms = wire.elicitations(SOURCE)
    assert len(sms) == 2 and ep.counters.setup_elicitations_sent == 2
    sm = sms[0]
    assert (sm.session_id, sm.stream_id, sm.receiver_window, sm.receiver_id) == (1, STREAM, 0, RID)
    assert (sm.consumption_term_id, sm.consumption_term_offset, sm.group_tag) == (0, 0, 0x31)


def test_elicitations_are_rate_limited_per_source_host() -> None:
    limiter = RateLimiter(rate=1.0, burst=1.0)
    ep, wire = endpoint(ALL, limiter=limiter), Wire()
    ep.on_datagram(data(1, 0), ("198.18.0.7", 1), 0.0)
    ep.on_datagram(data(2, 0), ("198.18.0.7", 2), 0.0)  # same host, other port: limited
    ep.on_datagram(data(3, 0), ("198.18.0.7", 3), 0.0)
    ep.on_datagram(data(4, 0), ("198.18.0.8", 1), 0.0)  # another host has its own budget
    ep.poll(0.0, wire)
    assert sorted(sm.session_id for sm in wire.elicitations()) == [1, 4]
    assert ep.counters.rate_limited == 2


# ----------------------------------------------------------------------- data in


def test_data_but_not_heartbeats_is_news_for_the_subscriptions() -> None:
    ep, wire = endpoint(ALL), Wire()
    ep.on_datagram(setup(1), SOURCE, 0.0)
    ep.poll(0.0, wire)
    ep.take_events()
    ep.on_datagram(heartbeat(1, 0), SOURCE, 0.001)
    assert ep.fresh == set() and ep.data_received == 0
    ep.poll(0.001, wire)
    ep.on_datagram(data(1, 0), SOURCE, 0.002)
    ep.on_datagram(data(1, FRAME), SOURCE, 0.002)
    assert ep.fresh == {(1, STREAM)} and ep.data_received == 2
    assert ep.quiet()  # in-order data: nothing to do before the next timer


def test_a_gro_run_goes_to_its_image_in_one_call() -> None:
    ep, wire = endpoint(ALL), Wire()
    ep.on_datagram(setup(1), SOURCE, 0.0)
    ep.poll(0.0, wire)
    ep.take_events()
    run = data(1, 0) + data(1, FRAME) + data(1, 2 * FRAME)
    assert ep.on_datagram_run(run, FRAME, SOURCE, 0.001) == 3
    image = ep.images[(1, STREAM)]
    assert image.rebuild_position == 3 * FRAME
    assert ep.fresh == {(1, STREAM)} and ep.data_received == 1
    assert ep.quiet()
    # one leaving a gap: the image is polled and NAKs it
    run = data(1, 4 * FRAME) + data(1, 5 * FRAME)
    assert ep.on_datagram_run(run, FRAME, SOURCE, 0.002) == 2
    assert ep.data_received == 2
    assert not ep.quiet()
    ep.poll(0.002, wire)
    ep.poll(0.002 + NAK_DELAY, wire)
    assert [(n.term_offset, n.length) for n in wire.naks()] == [(3 * FRAME, FRAME)]
    # not a run of an image we have, or no run at all: the caller goes datagram by datagram
    assert ep.on_datagram_run(data(2, 0) + data(2, FRAME), FRAME, SOURCE, 0.003) == 0
    assert ep.on_datagram_run(data(1, 6 * FRAME) + heartbeat(1, 0), FRAME, SOURCE, 0.003) == 0


def test_a_gro_run_credits_a_starved_image_which_then_answers() -> None:
    ep, wire = endpoint(ALL), Wire()
    ep.on_datagram(setup(1), SOURCE, 0.0)
    image = ep.images[(1, STREAM)]
    image.budget = 10
    ep.poll(0.0, wire)
    assert image.starved and wire.sent == []
    run = data(1, 0) + data(1, FRAME)
    ep.on_datagram_run(run, FRAME, SOURCE, 0.001)
    assert image.budget == 10 + 3 * 2 * FRAME and not image.starved
    assert not ep.quiet()
    ep.poll(0.001, wire)
    assert len(wire.sms()) == 1
    assert image.budget == 10 + 3 * 2 * FRAME - len(wire.sent[0][0])


def test_a_datagram_credits_its_image_three_times_its_size() -> None:
    ep = endpoint(ALL)
    ep.on_datagram(setup(1), SOURCE, 0.0)
    image = ep.images[(1, STREAM)]
    assert image.budget == 3 * SETUP_LENGTH
    image.budget = 0
    ep.on_datagram(heartbeat(1, 0), SOURCE, 0.001)
    assert image.budget == 3 * DATA_HEADER_LENGTH
    ep.on_datagram(data(1, 0, size=64), SOURCE, 0.002)
    assert image.budget == 3 * (DATA_HEADER_LENGTH + 64)
    ep.on_datagram(setup(1), SOURCE, 0.003)
    assert image.budget == 3 * (DATA_HEADER_LENGTH + 64 + SETUP_LENGTH)


def test_a_plain_sm_on_the_receive_channel_is_invalid_even_from_the_control_host() -> None:
    ep = endpoint(ALL, control=CONTROL)
    sm = StatusMessage(
        session_id=0,
        stream_id=0,
        consumption_term_id=1,
        consumption_term_offset=2,
        receiver_window=0,
        receiver_id=1,
    ).encode()
    ep.on_datagram(sm, CONTROL, 0.0)
    nak = Nak(
        session_id=1, stream_id=STREAM, term_id=1, term_offset=0, length=32, flags=SM_COOKIE_FLAG
    )
    ep.on_datagram(nak.encode(), CONTROL, 0.0)
    assert ep.counters.invalid_by_reason["unexpected_on_receive_channel"] == 2
    assert ep.counters.cookies_received == 0


# ----------------------------------------------------------------------- MDC registration


def _cookie(term_id: int, offset: int) -> bytes:
    return StatusMessage(
        session_id=0,
        stream_id=0,
        consumption_term_id=term_id,
        consumption_term_offset=offset,
        receiver_window=0,
        receiver_id=1,
        flags=SM_COOKIE_FLAG,
    ).encode()


def test_mdc_registration_repeats_each_interval_until_every_stream_has_its_image() -> None:
    ep, wire = endpoint(ALL, control=CONTROL, group_tag=0x42), Wire()
    ep.poll(0.0, wire)
    ep.poll(0.5, wire)
    assert ep.next_deadline(0.5) == 1.0
    ep.poll(1.0, wire)
    sms = wire.elicitations(CONTROL)
    assert len(sms) == 2 and ep.counters.setup_elicitations_sent == 2
    sm = sms[0]
    assert (sm.session_id, sm.stream_id, sm.receiver_window, sm.receiver_id) == (0, 0, 0, RID)
    assert (sm.consumption_term_id, sm.consumption_term_offset, sm.group_tag) == (0, 0, 0x42)
    ep.on_datagram(setup(1), CONTROL, 1.1)
    ep.poll(1.1, wire)
    ep.poll(2.0, wire)
    assert len(wire.elicitations(CONTROL)) == 2  # every stream has its image: no more


def test_mdc_registration_is_not_a_wake_up_once_every_stream_has_its_image() -> None:
    timers = ReceiverTimers(status_message_interval=5.0, liveness_timeout=20.0)
    ep, wire = endpoint(ALL, control=CONTROL, timers=timers), Wire()
    ep.poll(0.0, wire)
    ep.on_datagram(setup(1), CONTROL, 0.1)
    ep.poll(0.1, wire)
    ep.poll(1.0, wire)
    assert ep.next_deadline(1.0) == 5.1  # the image's SM, not a registration each second


def test_mdc_registration_resumes_when_an_image_goes() -> None:
    timers = ReceiverTimers(liveness_timeout=3.0)
    ep, wire = endpoint(ALL, control=CONTROL, timers=timers), Wire()
    ep.poll(0.0, wire)
    ep.on_datagram(setup(1), CONTROL, 0.1)
    ep.poll(0.1, wire)
    ep.poll(1.0, wire)
    ep.poll(3.1, wire)  # the image times out
    assert ep.images == {}
    ep.poll(3.2, wire)
    assert len(wire.elicitations(CONTROL)) == 2


def test_mdc_registration_waits_for_the_image_of_each_session_specific_subscription() -> None:
    ep, wire = (
        endpoint(ALL, StreamInterest(stream_id=STREAM, session_id=7), control=CONTROL),
        Wire(),
    )
    ep.poll(0.0, wire)
    ep.on_datagram(setup(1), CONTROL, 0.1)
    ep.on_datagram(setup(2), CONTROL, 0.1)  # two images of the stream, neither session 7
    ep.poll(1.0, wire)
    assert len(wire.elicitations(CONTROL)) == 2
    ep.on_datagram(setup(7), CONTROL, 1.1)
    ep.poll(2.0, wire)
    assert len(wire.elicitations(CONTROL)) == 2


def test_two_streams_need_two_images_before_registration_stops() -> None:
    ep, wire = endpoint(ALL, StreamInterest(stream_id=OTHER_STREAM), control=CONTROL), Wire()
    ep.poll(0.0, wire)
    ep.on_datagram(setup(1), CONTROL, 0.1)
    ep.poll(1.0, wire)
    assert len(wire.elicitations(CONTROL)) == 2


def test_a_cookie_from_the_control_address_is_echoed_at_once() -> None:
    ep, wire = endpoint(ALL, control=CONTROL), Wire()
    ep.poll(0.0, wire)
    ep.on_datagram(_cookie(0x1234, 0x5678), ("198.18.0.99", CONTROL[1]), 0.2)  # other host
    ep.on_datagram(_cookie(0x1234, 0x5678), (CONTROL[0], 40000), 0.2)  # other port
    assert ep.counters.cookies_received == 0
    assert ep.counters.invalid_by_reason["unexpected_on_receive_channel"] == 2
    ep.on_datagram(_cookie(0x1234, 0x5678), CONTROL, 0.3)
    assert ep.counters.cookies_received == 1
    ep.poll(0.3, wire)
    sms = wire.elicitations(CONTROL)
    assert [(sm.consumption_term_id, sm.consumption_term_offset) for sm in sms] == [
        (0, 0),
        (0x1234, 0x5678),
    ]
    ep.on_datagram(_cookie(1, 2), CONTROL, 0.4)
    assert ep.counters.cookies_received == 2


def test_a_cookie_from_an_ipv6_control_is_matched_on_host_and_port() -> None:
    control = ("2001:db8::1", 9000, 0, 0)
    ep, wire = endpoint(ALL, control=control), Wire()
    ep.poll(0.0, wire)
    ep.on_datagram(_cookie(3, 4), ("2001:db8::1", 9000, 0, 0), 0.2)
    assert ep.counters.cookies_received == 1


# ----------------------------------------------------------------------- response channels


def test_a_response_subscription_registers_for_its_session_until_its_image_comes() -> None:
    timers = ReceiverTimers(status_message_interval=5.0, liveness_timeout=20.0)
    ep, wire = endpoint(control=CONTROL, response=True, timers=timers), Wire()
    ep.add_interest(ALL, 0.0)
    with pytest.raises(ValueError):
        ep.add_interest(ALL, 0.0)  # pending counts as subscribed
    ep.poll(0.0, wire)
    assert wire.sent == []  # waits for RSP_SETUP
    ep.on_response_setup(STREAM, 0x44, 0.1)
    ep.poll(0.1, wire)
    ep.poll(1.1, wire)
    sms = wire.elicitations(CONTROL)
    assert [(sm.session_id, sm.stream_id) for sm in sms] == [(0x44, STREAM)] * 2
    assert [(sm.consumption_term_id, sm.consumption_term_offset) for sm in sms] == [(0, 0)] * 2
    assert ep.counters.setup_elicitations_sent == 2
    ep.on_datagram(setup(0x44), CONTROL, 1.2)
    ep.poll(1.2, wire)
    ep.poll(2.1, wire)
    ep.poll(3.1, wire)
    assert len(wire.elicitations(CONTROL)) == 2
    assert ep.next_deadline(3.1) > 5.0  # the image's SMs, no registration wake-ups


def test_a_repeated_rsp_setup_elicits_again_at_once() -> None:
    ep, wire = endpoint(control=CONTROL, response=True), Wire()
    ep.add_interest(ALL, 0.0)
    ep.on_response_setup(STREAM, 0x44, 0.0)
    ep.poll(0.0, wire)
    ep.on_response_setup(STREAM, 0x44, 0.3)  # Receiver.onRequestSetup
    assert ep.next_deadline(0.3) == 0.3
    ep.poll(0.3, wire)
    assert len(wire.elicitations(CONTROL)) == 2
    ep.on_response_setup(OTHER_STREAM, 0x45, 0.4)  # not ours: nothing
    assert ep.next_deadline(0.4) > 0.4


def test_removing_a_response_subscription_removes_its_armed_interest_and_image() -> None:
    ep, wire = endpoint(control=CONTROL, response=True), Wire()
    ep.add_interest(ALL, 0.0)
    ep.on_response_setup(STREAM, 0x44, 0.0)
    ep.on_datagram(setup(0x44), CONTROL, 0.1)
    assert list(ep.images) == [(0x44, STREAM)]
    ep.remove_interest(STREAM, wire)
    assert ep.interests == {} and ep.images == {}
    ep.add_interest(ALL, 0.2)  # subscribed again: pending once more
    ep.remove_interest(STREAM, wire)
    ep.add_interest(ALL, 0.3)


# ----------------------------------------------------------------------- polling images


def test_two_images_timing_out_together_both_go() -> None:
    timers = ReceiverTimers(liveness_timeout=0.5)
    ep, wire = endpoint(ALL, timers=timers), Wire()
    for session in range(1, 6):
        ep.on_datagram(setup(session), SOURCE, 0.0)
    ep.poll(0.0, wire)
    ep.poll(0.5, wire)
    assert ep.images == {}
    assert ep.counters.images_closed == 5


def test_a_touch_for_an_image_that_is_gone_is_harmless() -> None:
    ep, wire = endpoint(ALL), Wire()
    for session in range(1, 6):
        ep.on_datagram(setup(session), SOURCE, 0.0)
    for session in range(10, 20):
        ep.touch(session, STREAM)
    ep.poll(0.0, wire)
    assert len(wire.sms()) == 5  # every image with its first SM, whatever came before it


def test_the_deadline_heap_drops_stale_entries_past_twice_the_live_ones_plus_64() -> None:
    timers = ReceiverTimers(liveness_timeout=0.05)
    ep, wire = endpoint(ALL, timers=timers), Wire()
    ep.on_datagram(setup(1), SOURCE, 0.0)
    sizes = []
    for i in range(200):
        now = i * 0.0001
        ep.on_datagram(setup(1), SOURCE, now)  # each moves the liveness deadline
        ep.poll(now, wire)
        sizes.append(len(ep._deadline_heap))
    assert max(sizes) == 2 * 1 + 64  # one more, and it is rebuilt
    assert 1 in sizes[1:]


def test_an_empty_endpoint_never_needs_waking() -> None:
    ep = endpoint(ALL)
    assert ep.next_deadline(0.0) == float("inf")
    ep.on_datagram(setup(1), SOURCE, 0.0)
    wire = Wire()
    ep.poll(0.0, wire)
    ep.remove_interest(STREAM, wire)
    assert ep.next_deadline(0.0) == float("inf")  # the image's timers went with it


def test_an_image_made_for_an_elicitation_leaves_no_clean_up_wake_up() -> None:
    timers = ReceiverTimers(status_message_interval=5.0, liveness_timeout=20.0)
    ep, wire = endpoint(ALL, timers=timers, limit_amplification=False), Wire()
    ep.on_datagram(data(1, 0), SOURCE, 0.0)
    ep.poll(0.0, wire)
    ep.on_datagram(setup(1), SOURCE, 0.1)  # the answer: the elicitation is done with
    ep.poll(0.1, wire)
    assert ep.next_deadline(0.1) == 5.1


def test_a_window_update_too_soon_after_the_last_sm_is_scheduled_for_its_gap() -> None:
    ep, wire = endpoint(ALL, limit_amplification=False), Wire()
    ep.on_datagram(setup(1), SOURCE, 0.0)
    ep.poll(0.0, wire)
    for position in range(0, TERM // 2 - FRAME, FRAME):  # the sender is at the window's edge
        ep.on_datagram(data(1, position), SOURCE, 0.0)
    ep.poll(0.0, wire)
    image = ep.images[(1, STREAM)]
    assert image.poll_messages(lambda data: None, 1) == 1
    ep.touch(1, STREAM)
    ep.poll(0.0005, wire)  # an SM went at 0: the next window update waits 1 ms
    assert len(wire.sms()) == 1
    assert ep.next_deadline(0.0005) == 0.001
