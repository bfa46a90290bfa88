"""The pure handshake machine of connect() (echo.session.machine), with a scripted clock."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echo.protocol import (
    AllClientsError,
    BadMessage,
    Connect,
    Hello,
    encrypt_session,
    format_message,
    parse_all_clients_reply_untrusted,
    parse_hello_untrusted,
)
from echo.session import machine as machine_module
from echo.session.machine import (
    CloseAllClients,
    Failed,
    FailureKind,
    HandshakeMachine,
    HandshakeState,
    LocalProtocolError,
    OpenAllClients,
    OpenDuologue,
    Opened,
    SendHello,
    preview,
)

PAD = 0x1234ABCD
ME = 77


def connect_reply(session: int = 4242, client: int = ME) -> bytes:
    return format_message(Connect(client, 9012, 9013, encrypt_session(session, PAD)))


def awaiting(timeout: float = 10.0, credentials: bytes = b"") -> HandshakeMachine:
    m = HandshakeMachine(pad=PAD, timeout=timeout, credentials=credentials)
    assert m.start(0.0) == [OpenAllClients()]
    assert m.state is HandshakeState.CONNECTING and m.next_deadline() == timeout
    assert m.on_all_clients_connected(ME, 1.0) == [
        SendHello(format_message(Hello(PAD, credentials)))
    ]
    return m


def test_the_whole_handshake() -> None:
    m = awaiting()
    assert m.state is HandshakeState.AWAITING_CONNECT and m.client_session == ME
    assert m.next_deadline() == 11.0
    actions = m.on_all_clients_message(connect_reply(), 2.0)
    assert actions == [CloseAllClients(), OpenDuologue(9012, 9013, 4242)]
    assert m.state is HandshakeState.JOINING and m.session_id == 4242
    assert m.next_deadline() == 12.0
    assert m.on_duologue_connected(3.0) == [Opened(4242, 9012, 9013)]
    assert m.state is HandshakeState.OPEN and m.next_deadline() is None
    # Late events are ignored.
    assert m.on_duologue_connected(4.0) == []
    assert m.on_duologue_closed(4.0) == []
    assert m.on_all_clients_message(connect_reply(), 4.0) == []
    assert m.on_all_clients_closed(4.0) == []
    assert m.on_timer(100.0) == []
    assert m.on_send_failed("x", 100.0) == []


def test_credentials_travel_in_the_hello() -> None:
    m = HandshakeMachine(pad=PAD, credentials=b"ticket")
    m.start(0.0)
    (hello,) = m.on_all_clients_connected(ME, 0.0)
    assert isinstance(hello, SendHello)
    assert parse_hello_untrusted(hello.data, credentials=True) == Hello(PAD, b"ticket")
    plain = HandshakeMachine(pad=PAD)
    plain.start(0.0)
    assert plain.on_all_clients_connected(ME, 0.0) == [SendHello(b"HELLO 1234ABCD")]


def test_replies_to_others_are_ignored() -> None:
    m = awaiting()
    assert m.on_all_clients_message(connect_reply(client=ME + 1), 2.0) == []
    assert m.on_all_clients_message(b"770 CONNECT 1 2 3", 2.0) == []  # prefix "77" is not ours
    assert m.on_all_clients_message(b"78 ERROR server full", 2.0) == []
    assert m.state is HandshakeState.AWAITING_CONNECT


def test_a_rejection_fails_with_the_server_s_reason() -> None:
    m = awaiting()
    actions = m.on_all_clients_message(b"77 ERROR server full", 2.0)
    assert actions == [CloseAllClients(), Failed(m.failure)]  # type: ignore[arg-type]
    assert m.failure is not None
    assert m.failure.kind is FailureKind.REJECTED and m.failure.detail == "server full"
    assert m.state is HandshakeState.FAILED and m.next_deadline() is None


def test_a_bad_reply_for_us_is_a_protocol_failure() -> None:
    m = awaiting()
    actions = m.on_all_clients_message(b"77 CONNECT nonsense", 2.0)
    assert m.failure is not None and m.failure.kind is FailureKind.PROTOCOL
    assert "bad reply" in m.failure.message and "nonsense" in m.failure.message
    assert actions[0] == CloseAllClients()


def test_a_session_outside_the_reserved_range_is_refused() -> None:
    m = awaiting()
    m.on_all_clients_message(connect_reply(session=0), 2.0)
    assert m.failure is not None and m.failure.kind is FailureKind.PROTOCOL
    assert "outside the reserved range" in m.failure.message
    m = awaiting()
    m.on_all_clients_message(connect_reply(session=-5), 2.0)
    assert m.failure is not None and m.failure.kind is FailureKind.PROTOCOL
    m = awaiting()
    m.on_all_clients_message(connect_reply(session=1), 2.0)
    assert m.failure is None and m.session_id == 1


@pytest.mark.parametrize(
    ("steps", "waiting_for"),
    [
        (0, "the all-clients channel to connect"),
        (1, "CONNECT from the server"),
        (2, "the duologue to connect"),
    ],
)
def test_every_wait_times_out_saying_what_it_waited_for(steps: int, waiting_for: str) -> None:
    m = HandshakeMachine(pad=PAD, timeout=2.0)
    m.start(0.0)
    if steps >= 1:
        m.on_all_clients_connected(ME, 1.0)
    if steps >= 2:
        m.on_all_clients_message(connect_reply(), 1.5)
    deadline = m.next_deadline()
    assert deadline is not None
    assert m.on_timer(deadline - 0.001) == []
    actions = m.on_timer(deadline)
    assert m.failure is not None and m.failure.kind is FailureKind.TIMED_OUT
    assert m.failure.detail == waiting_for
    assert m.failure.message == f"timed out after 2.0 s waiting for {waiting_for}"
    assert (CloseAllClients() in actions) is (steps < 2)


def test_channels_closing_during_the_handshake() -> None:
    m = HandshakeMachine(pad=PAD)
    m.start(0.0)
    m.on_all_clients_closed(1.0)
    assert m.failure is not None and m.failure.kind is FailureKind.CONNECTION
    assert m.failure.detail == "the all-clients channel to connect"

    m = awaiting()
    m.on_all_clients_closed(2.0)
    assert m.failure is not None and m.failure.detail == "CONNECT from the server"

    m = awaiting()
    m.on_all_clients_message(connect_reply(), 2.0)
    assert m.on_all_clients_closed(2.5) == []  # we closed it ourselves
    actions = m.on_duologue_closed(3.0)
    assert m.failure is not None and m.failure.kind is FailureKind.CONNECTION
    assert m.failure.message == "the duologue closed before it connected"
    assert CloseAllClients() not in actions


def test_early_events_are_ignored_and_a_failed_send_fails() -> None:
    m = HandshakeMachine(pad=PAD)
    m.start(0.0)
    assert m.on_duologue_connected(0.1) == []
    assert m.on_all_clients_message(connect_reply(), 0.1) == []  # not awaiting yet
    m.on_all_clients_connected(ME, 0.2)
    assert m.on_all_clients_connected(ME, 0.3) == []  # a second "connected"
    actions = m.on_send_failed("could not send", 0.4)
    assert m.failure is not None and m.failure.kind is FailureKind.CONNECTION
    assert m.failure.message == "send failed: could not send"
    assert actions[0] == CloseAllClients()


def test_driver_bugs_raise() -> None:
    m = HandshakeMachine(pad=PAD)
    for call in (
        lambda: m.on_timer(0.0),
        lambda: m.on_all_clients_connected(1, 0.0),
        lambda: m.on_all_clients_message(b"", 0.0),
        lambda: m.on_all_clients_closed(0.0),
        lambda: m.on_duologue_connected(0.0),
        lambda: m.on_duologue_closed(0.0),
        lambda: m.on_send_failed("x", 0.0),
    ):
        with pytest.raises(LocalProtocolError):
            call()
    m.start(0.0)
    with pytest.raises(LocalProtocolError):
        m.start(0.0)
    for bad in (2**31, -(2**31) - 1, True, "1"):
        with pytest.raises(LocalProtocolError):
            m.on_all_clients_connected(bad, 0.0)  # type: ignore[arg-type]
    assert m.on_all_clients_connected(-(2**31), 0.0) != []


@pytest.mark.parametrize("pad", [-1, 2**32, True, 1.0])
def test_bad_pads_and_timeouts_are_refused(pad: object) -> None:
    with pytest.raises(ValueError):
        HandshakeMachine(pad=pad)  # type: ignore[arg-type]


@pytest.mark.parametrize("timeout", [0, -1, float("inf"), float("nan")])
def test_bad_timeouts_are_refused(timeout: float) -> None:
    with pytest.raises(ValueError):
        HandshakeMachine(pad=1, timeout=timeout)


def test_edges_of_pad_and_a_bounded_preview() -> None:
    assert HandshakeMachine(pad=0).state is HandshakeState.IDLE
    assert HandshakeMachine(pad=2**32 - 1, timeout=0.001).timeout == 0.001
    assert preview(b"x" * 200) == repr("x" * 80) + "..."
    assert preview(b"short") == repr("short")
    assert preview(b"\xff") == repr("\\xff")


def test_misuse_messages_say_what_was_wrong() -> None:
    m = HandshakeMachine(pad=PAD)
    with pytest.raises(LocalProtocolError, match=r"on_timer\(\) called before start\(\)"):
        m.on_timer(0.0)
    with pytest.raises(LocalProtocolError, match=r"on_send_failed\(\) called before start"):
        m.on_send_failed("x", 0.0)
    with pytest.raises(LocalProtocolError, match=r"on_all_clients_connected\(\) called before"):
        m.on_all_clients_connected(1, 0.0)
    with pytest.raises(LocalProtocolError, match=r"on_all_clients_message\(\) called before"):
        m.on_all_clients_message(b"", 0.0)
    with pytest.raises(LocalProtocolError, match=r"on_all_clients_closed\(\) called before"):
        m.on_all_clients_closed(0.0)
    with pytest.raises(LocalProtocolError, match=r"on_duologue_connected\(\) called before"):
        m.on_duologue_connected(0.0)
    with pytest.raises(LocalProtocolError, match=r"on_duologue_closed\(\) called before"):
        m.on_duologue_closed(0.0)
    m.start(0.0)
    with pytest.raises(LocalProtocolError, match=r"start\(\) called twice \(state CONNECTING\)"):
        m.start(0.0)
    with pytest.raises(LocalProtocolError, match="client_session must be an int32, got 2147483648"):
        m.on_all_clients_connected(2**31, 0.0)
    with pytest.raises(ValueError, match="pad must be a u32, got -1"):
        HandshakeMachine(pad=-1)
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds, got 0"):
        HandshakeMachine(pad=1, timeout=0)


def test_a_fresh_machine_has_no_deadline_or_ids() -> None:
    m = HandshakeMachine(pad=PAD, timeout=3.0)
    assert m.next_deadline() is None and m.session_id is None and m.client_session is None
    assert m.failure is None and m.timeout == 3.0


def test_the_edges_of_the_ranges_are_accepted() -> None:
    m = awaiting()
    m.on_all_clients_message(connect_reply(session=2**31 - 1), 2.0)
    assert m.failure is None and m.session_id == 2**31 - 1
    m = HandshakeMachine(pad=PAD)
    m.start(0.0)
    assert m.on_all_clients_connected(2**31 - 1, 0.0) != []
    assert m.client_session == 2**31 - 1


def test_failures_carry_their_messages() -> None:
    m = awaiting()
    m.on_all_clients_message(b"77 ERROR too many connections for IP address", 2.0)
    assert m.failure is not None
    assert m.failure.message == m.failure.detail == "too many connections for IP address"
    m = awaiting()
    m.on_all_clients_closed(2.0)
    assert m.failure is not None
    assert m.failure.message == (
        "the all-clients channel closed while waiting for CONNECT from the server"
    )
    m = awaiting()
    m.on_send_failed("gone", 2.0)
    assert m.failure is not None and m.failure.detail == "CONNECT from the server"
    m = awaiting()
    m.on_all_clients_message(connect_reply(), 2.0)
    m.on_duologue_closed(3.0)
    assert m.failure is not None and m.failure.detail == "the duologue to connect"


def test_a_timer_before_any_deadline_does_nothing_in_every_state() -> None:
    m = awaiting(timeout=5.0)  # deadline 6.0
    assert m.on_timer(5.999) == [] and m.failure is None
    m.on_all_clients_message(connect_reply(), 2.0)  # deadline 7.0
    assert m.on_timer(6.5) == [] and m.state is HandshakeState.JOINING


def test_preview_cuts_at_80_characters() -> None:
    assert preview(b"y" * 81) == repr("y" * 80) + "..."
    assert preview(b"y" * 80) == repr("y" * 80)


# ---- Echo 2.0's client handshake, as echo-client runs it (moved with the Echo client's own
# machine, echo/client/machine.py, when echo-client became an application on connect()) ------

# The io7m Aeron guide's trace (§4.7): pad 611786D9, client session -555798973,
# duologue 1938340545.
GUIDE_PAD = 0x611786D9
GUIDE_CLIENT = -555798973
GUIDE_DUOLOGUE = 1938340545
GUIDE_CONNECT = b"-555798973 CONNECT 9014 9011 129F3C18"


def guide_awaiting() -> HandshakeMachine:
    m = HandshakeMachine(pad=GUIDE_PAD)
    assert m.start(0.0) == [OpenAllClients()]
    assert m.on_all_clients_connected(GUIDE_CLIENT, 0.0) == [SendHello(b"HELLO 611786D9")]
    return m


def test_the_guide_s_trace() -> None:
    m = guide_awaiting()
    assert m.on_all_clients_message(GUIDE_CONNECT, 1.0) == [
        CloseAllClients(),
        OpenDuologue(9014, 9011, GUIDE_DUOLOGUE),
    ]
    assert m.session_id == GUIDE_DUOLOGUE


def test_other_sessions_replies_and_near_misses_are_ignored() -> None:
    m = guide_awaiting()
    others = [
        format_message(Connect(GUIDE_CLIENT + 1, 9000, 9001, 5)),
        format_message(AllClientsError(-55579897, "server full")),  # a prefix of ours
        format_message(Connect(5557989, 9000, 9001, 5)),
        b"12 CONNECT 0 0 zz",  # malformed, addressed to someone else
        b"-5557989730 ERROR x",  # our digits plus one: not ours
        b"total garbage",
        b"\xff\xfe",
        b"",
    ]
    for data in others:
        assert m.on_all_clients_message(data, 1.0) == []
        assert m.state is HandshakeState.AWAITING_CONNECT
    assert m.on_all_clients_message(GUIDE_CONNECT, 2.0)[1] == OpenDuologue(
        9014, 9011, GUIDE_DUOLOGUE
    )


def test_replies_to_others_are_not_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    # While N clients say HELLO at once each sees all N replies: only its own is parsed.
    parsed: list[bytes] = []
    real_parse = machine_module.parse_server_reply_untrusted

    def counting_parse(data: bytes) -> object:
        parsed.append(bytes(data))
        return real_parse(data)

    monkeypatch.setattr(machine_module, "parse_server_reply_untrusted", counting_parse)
    m = guide_awaiting()
    for session in range(1000):
        m.on_all_clients_message(format_message(Connect(session, 9000, 9001, 5)), 1.0)
    assert parsed == []
    assert m.on_all_clients_message(GUIDE_CONNECT, 2.0)[1] == OpenDuologue(
        9014, 9011, GUIDE_DUOLOGUE
    )
    assert parsed == [GUIDE_CONNECT]


def _reference_meaning(data: bytes) -> str:
    """What a reply on the all-clients channel means to the client (the guide §4.4), by parsing
    every one: the outcome the machine must reach however it gets there."""
    reply = parse_all_clients_reply_untrusted(data)
    if isinstance(reply, BadMessage):
        return "fail" if data.startswith(f"{GUIDE_CLIENT} ".encode()) else "ignore"
    if reply.client_session != GUIDE_CLIENT:
        return "ignore"
    return "fail" if isinstance(reply, AllClientsError) else "join"


_SESSIONS = st.sampled_from([GUIDE_CLIENT, -GUIDE_CLIENT, GUIDE_CLIENT // 10, 0, 1, -1]) | (
    st.integers(-(2**31), 2**31 - 1)
)
_REPLIES = st.one_of(
    st.builds(
        lambda s, d, c, k: format_message(Connect(s, d, c, k)),
        _SESSIONS,
        st.integers(1, 65535),
        st.integers(1, 65535),
        st.integers(0, 2**32 - 1),
    ),
    st.builds(lambda s, t: format_message(AllClientsError(s, t)), _SESSIONS, st.text("ab c")),
    # Near misses: our digits with more of them, a sign or zeros in front, a bad tail.
    st.builds(
        lambda head, s, tail: head + str(s).encode() + tail,
        st.sampled_from([b"", b"+", b"0", b"-", b" ", b"00"]),
        st.sampled_from([GUIDE_CLIENT, GUIDE_CLIENT * 10, -GUIDE_CLIENT, GUIDE_CLIENT // 10])
        | _SESSIONS,
        st.sampled_from([b" CONNECT 1 2 AB", b" ERROR x", b"0 ERROR x", b" CONNECT 1 2", b""])
        | st.binary(max_size=40),
    ),
    st.binary(max_size=60),
)


@given(data=_REPLIES)
@settings(max_examples=500, deadline=None)
def test_any_reply_means_what_parsing_it_says(data: bytes) -> None:
    m = guide_awaiting()
    actions = m.on_all_clients_message(data, 1.0)
    expected = _reference_meaning(data)
    if expected == "ignore":
        assert actions == [] and m.state is HandshakeState.AWAITING_CONNECT
    elif expected == "fail":
        assert len(actions) == 2 and actions[0] == CloseAllClients()
        assert isinstance(actions[1], Failed) and m.state is HandshakeState.FAILED
    else:  # our CONNECT: we join, or fail if its session is outside the reserved range
        assert actions[0] == CloseAllClients() and m.state is not HandshakeState.AWAITING_CONNECT


def test_decrypts_with_the_pad() -> None:
    pad = 0xDEADBEEF
    m = HandshakeMachine(pad=pad)
    m.start(0.0)
    assert m.on_all_clients_connected(-7, 0.0) == [SendHello(b"HELLO DEADBEEF")]
    reply = format_message(Connect(-7, 40000, 40001, encrypt_session(123456, pad)))
    assert m.on_all_clients_message(reply, 0.0) == [
        CloseAllClients(),
        OpenDuologue(40000, 40001, 123456),
    ]


@pytest.mark.parametrize(
    ("steps", "phase"),
    [
        (0, HandshakeState.CONNECTING),
        (1, HandshakeState.AWAITING_CONNECT),
        (2, HandshakeState.JOINING),
    ],
)
def test_a_timeout_says_in_which_phase(steps: int, phase: HandshakeState) -> None:
    # echo-client's hint about --duologue-ports rests on this (a JOINING timeout), not on text.
    m = HandshakeMachine(pad=GUIDE_PAD, timeout=10.0)
    m.start(0.0)
    if steps >= 1:
        m.on_all_clients_connected(GUIDE_CLIENT, 0.0)
    if steps >= 2:
        m.on_all_clients_message(GUIDE_CONNECT, 0.0)
    (*_, failed) = m.on_timer(10.0)
    assert isinstance(failed, Failed) and failed.failure.kind is FailureKind.TIMED_OUT
    assert failed.failure.phase is phase
