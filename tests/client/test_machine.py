"""The pure Echo 2.0 client state machine, driven with a scripted clock (echo.client.machine)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echo.client import machine as machine_module
from echo.client.machine import (
    Action,
    ClientMachine,
    ClientState,
    CloseAllClients,
    CloseDuologue,
    EchoReceived,
    Failure,
    FailureKind,
    LocalProtocolError,
    OpenAllClients,
    OpenDuologue,
    SendEcho,
    SendHello,
    Stop,
)
from echo.protocol import (
    AllClientsError,
    BadMessage,
    Connect,
    DuologueError,
    Echo,
    encrypt_session,
    format_message,
    parse_all_clients_reply_untrusted,
)

# The guide's trace (seed §4.7): pad 611786D9, client session -555798973, duologue 1938340545.
PAD = 0x611786D9
CLIENT = -555798973
DUOLOGUE = 1938340545
GUIDE_CONNECT = b"-555798973 CONNECT 9014 9011 129F3C18"


def texts(i: int) -> str:
    return f"msg-{i}"


def make(**kwargs: object) -> ClientMachine:
    args: dict[str, object] = {"pad": PAD, "message_factory": texts}
    args.update(kwargs)
    return ClientMachine(**args)  # type: ignore[arg-type]


def to_awaiting(m: ClientMachine, now: float = 0.0) -> None:
    assert m.start(now) == [OpenAllClients()]
    assert m.on_all_clients_connected(CLIENT, now) == [SendHello(b"HELLO 611786D9")]


def to_echoing(m: ClientMachine, now: float = 0.0) -> list[object]:
    to_awaiting(m, now)
    m.on_all_clients_message(GUIDE_CONNECT, now)
    return list(m.on_duologue_connected(now))


def state_of(m: ClientMachine) -> ClientState:
    # A function call, so mypy does not narrow `m.state` from one assertion to the next.
    return m.state


def echo(text: str) -> bytes:
    return format_message(Echo(text))


# ---- happy path ------------------------------------------------------------------------------


def test_full_happy_path_with_exact_rtts() -> None:
    m = make(count=3, interval=1.0, timeout=10.0)
    assert state_of(m) is ClientState.IDLE and m.next_deadline() is None

    assert m.start(100.0) == [OpenAllClients()]
    assert state_of(m) is ClientState.CONNECTING
    assert m.next_deadline() == 110.0

    assert m.on_all_clients_connected(CLIENT, 100.5) == [SendHello(b"HELLO 611786D9")]
    assert state_of(m) is ClientState.AWAITING_CONNECT
    assert m.client_session == CLIENT
    assert m.next_deadline() == 110.5

    actions = m.on_all_clients_message(GUIDE_CONNECT, 101.0)
    assert actions == [CloseAllClients(), OpenDuologue(9014, 9011, DUOLOGUE)]
    assert state_of(m) is ClientState.JOINING_DUOLOGUE
    assert m.duologue_session == DUOLOGUE
    assert m.next_deadline() == 111.0

    assert m.on_duologue_connected(101.25) == [SendEcho(1, b"ECHO msg-1")]
    assert state_of(m) is ClientState.ECHOING
    assert m.next_deadline() == 111.25  # the echo's timeout

    assert m.on_duologue_message(echo("msg-1"), 101.5) == [EchoReceived(1, "msg-1", 0.25)]
    assert m.next_deadline() == 102.5  # next send after `interval`
    assert m.on_timer(102.0) == []  # early wake-up: nothing due
    assert m.on_timer(102.5) == [SendEcho(2, b"ECHO msg-2")]
    assert m.next_deadline() == 112.5

    assert m.on_duologue_message(echo("msg-2"), 103.0) == [EchoReceived(2, "msg-2", 0.5)]
    assert m.on_timer(104.0) == [SendEcho(3, b"ECHO msg-3")]
    assert m.on_duologue_message(echo("msg-3"), 104.125) == [
        EchoReceived(3, "msg-3", 0.125),
        CloseDuologue(),
        Stop(),
    ]
    assert state_of(m) is ClientState.CLOSED
    assert m.failure is None
    assert (m.sent, m.received) == (3, 3)
    assert m.rtts == [0.25, 0.5, 0.125]
    assert m.next_deadline() is None
    # Everything after the end is ignored.
    assert m.on_timer(200.0) == []
    assert m.on_duologue_message(echo("msg-3"), 200.0) == []
    assert m.on_duologue_closed(200.0) == []
    assert m.stop(200.0) == []


def test_rtts_is_a_copy() -> None:
    m = make(interval=0)
    to_echoing(m)
    m.on_duologue_message(echo("msg-1"), 0.5)
    m.rtts.append(99.0)
    assert m.rtts == [0.5]


def test_interval_zero_sends_immediately() -> None:
    m = make(interval=0, count=None)
    assert to_echoing(m, 5.0) == [SendEcho(1, b"ECHO msg-1")]
    actions = m.on_duologue_message(echo("msg-1"), 5.1)
    assert actions == [EchoReceived(1, "msg-1", 5.1 - 5.0), SendEcho(2, b"ECHO msg-2")]
    assert m.next_deadline() == pytest.approx(15.1)
    assert state_of(m) is ClientState.ECHOING


def test_count_none_runs_until_stopped() -> None:
    m = make(interval=0)
    to_echoing(m)
    now = 0.0
    for i in range(1, 51):
        now += 0.01
        actions = m.on_duologue_message(echo(f"msg-{i}"), now)
        assert actions[-1] == SendEcho(i + 1, f"ECHO msg-{i + 1}".encode())
    assert m.received == 50 and m.sent == 51
    assert m.stop(now) == [CloseDuologue(), Stop()]
    assert state_of(m) is ClientState.CLOSED and m.failure is None


def test_count_one_stops_after_first_echo() -> None:
    m = make(count=1)
    to_echoing(m)
    assert m.on_duologue_message(echo("msg-1"), 2.0) == [
        EchoReceived(1, "msg-1", 2.0),
        CloseDuologue(),
        Stop(),
    ]
    assert state_of(m) is ClientState.CLOSED


def test_count_zero_closes_once_connected() -> None:
    m = make(count=0)
    assert to_echoing(m) == [CloseDuologue(), Stop()]
    assert state_of(m) is ClientState.CLOSED and m.sent == 0


def test_same_text_every_time() -> None:
    # `--message TEXT` repeats one text; one outstanding echo at a time keeps matching exact.
    m = make(message_factory=lambda i: "hi", interval=0, count=2)
    assert to_echoing(m) == [SendEcho(1, b"ECHO hi")]
    assert m.on_duologue_message(b"ECHO hi", 1.0) == [
        EchoReceived(1, "hi", 1.0),
        SendEcho(2, b"ECHO hi"),
    ]
    assert m.on_duologue_message(b"ECHO hi", 1.5)[0] == EchoReceived(2, "hi", 0.5)
    assert state_of(m) is ClientState.CLOSED


# ---- the all-clients channel -----------------------------------------------------------------


def test_ignores_other_sessions_connect_and_error() -> None:
    m = make()
    to_awaiting(m)
    others = [
        format_message(Connect(CLIENT + 1, 9000, 9001, 5)),
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
        assert state_of(m) is ClientState.AWAITING_CONNECT
    assert m.on_all_clients_message(GUIDE_CONNECT, 2.0)[1] == OpenDuologue(9014, 9011, DUOLOGUE)


def test_replies_to_others_are_not_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    # While N clients say HELLO at once each sees all N replies: only its own is parsed.
    parsed: list[bytes] = []
    real_parse = machine_module.parse_all_clients_reply_untrusted

    def counting_parse(data: bytes) -> object:
        parsed.append(bytes(data))
        return real_parse(data)

    monkeypatch.setattr(machine_module, "parse_all_clients_reply_untrusted", counting_parse)
    m = make()
    to_awaiting(m)
    for session in range(1000):
        m.on_all_clients_message(format_message(Connect(session, 9000, 9001, 5)), 1.0)
    assert parsed == []
    assert m.on_all_clients_message(GUIDE_CONNECT, 2.0)[1] == OpenDuologue(9014, 9011, DUOLOGUE)
    assert parsed == [GUIDE_CONNECT]


def _reference_on_all_clients_message(m: ClientMachine, data: bytes) -> str:
    """What a reply on the all-clients channel means to the client (seed §4.4), by parsing
    every one: the outcome the machine must reach however it gets there."""
    reply = parse_all_clients_reply_untrusted(data)
    if isinstance(reply, BadMessage):
        return "fail" if data.startswith(f"{CLIENT} ".encode()) else "ignore"
    if reply.client_session != CLIENT:
        return "ignore"
    return "fail" if isinstance(reply, AllClientsError) else "join"


_SESSIONS = st.sampled_from([CLIENT, -CLIENT, CLIENT // 10, 0, 1, -1]) | st.integers(
    -(2**31), 2**31 - 1
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
        st.sampled_from([CLIENT, CLIENT * 10, -CLIENT, CLIENT // 10]) | _SESSIONS,
        st.sampled_from([b" CONNECT 1 2 AB", b" ERROR x", b"0 ERROR x", b" CONNECT 1 2", b""])
        | st.binary(max_size=40),
    ),
    st.binary(max_size=60),
)


@given(data=_REPLIES)
@settings(max_examples=500, deadline=None)
def test_any_reply_means_what_parsing_it_says(data: bytes) -> None:
    m = make()
    to_awaiting(m)
    actions = m.on_all_clients_message(data, 1.0)
    expected = _reference_on_all_clients_message(m, data)
    if expected == "ignore":
        assert actions == [] and state_of(m) is ClientState.AWAITING_CONNECT
    elif expected == "fail":
        assert actions == [CloseAllClients(), Stop()] and state_of(m) is ClientState.FAILED
    else:  # our CONNECT: we join, or fail if its session is outside the reserved range
        assert actions[0] == CloseAllClients() and state_of(m) is not ClientState.AWAITING_CONNECT


def test_decrypts_with_the_pad() -> None:
    pad = 0xDEADBEEF
    m = make(pad=pad)
    m.start(0.0)
    assert m.on_all_clients_connected(-7, 0.0) == [SendHello(b"HELLO DEADBEEF")]
    reply = format_message(Connect(-7, 40000, 40001, encrypt_session(123456, pad)))
    assert m.on_all_clients_message(reply, 0.0) == [
        CloseAllClients(),
        OpenDuologue(40000, 40001, 123456),
    ]


def test_rejection() -> None:
    m = make()
    to_awaiting(m)
    reply = format_message(AllClientsError(CLIENT, "too many connections for IP address"))
    assert m.on_all_clients_message(reply, 1.0) == [CloseAllClients(), Stop()]
    assert state_of(m) is ClientState.FAILED
    assert m.failure == Failure(FailureKind.REJECTED, "too many connections for IP address")
    assert m.failure.kind.exit_code == 2
    # Late messages after the end are ignored.
    assert m.on_all_clients_message(GUIDE_CONNECT, 2.0) == []


def test_bad_reply_addressed_to_us_is_protocol_failure() -> None:
    m = make()
    to_awaiting(m)
    assert m.on_all_clients_message(b"-555798973 CONNECT 0 9011 1", 1.0) == [
        CloseAllClients(),
        Stop(),
    ]
    assert m.failure is not None and m.failure.kind is FailureKind.PROTOCOL
    assert m.failure.kind.exit_code == 4


def test_connect_with_session_outside_reserved_range_is_protocol_failure() -> None:
    m = make()
    to_awaiting(m)
    reply = format_message(Connect(CLIENT, 9014, 9011, encrypt_session(-3, PAD)))
    assert m.on_all_clients_message(reply, 1.0) == [CloseAllClients(), Stop()]
    assert m.failure is not None and m.failure.kind is FailureKind.PROTOCOL
    assert "-3" in m.failure.message


def test_all_clients_messages_before_hello_ignored() -> None:
    m = make()
    m.start(0.0)
    assert m.on_all_clients_message(GUIDE_CONNECT, 0.5) == []
    assert state_of(m) is ClientState.CONNECTING


def test_all_clients_closed_while_waiting() -> None:
    m = make()
    to_awaiting(m)
    assert m.on_all_clients_closed(1.0) == [CloseAllClients(), Stop()]
    assert m.failure == Failure(
        FailureKind.CONNECTION,
        "the all-clients channel closed while waiting for CONNECT from the server",
    )


def test_all_clients_closed_after_connect_is_ignored() -> None:
    m = make()
    to_echoing(m)
    assert m.on_all_clients_closed(1.0) == []
    assert m.on_all_clients_connected(CLIENT, 1.0) == []
    assert state_of(m) is ClientState.ECHOING


# ---- timeouts --------------------------------------------------------------------------------


def test_timeout_connecting() -> None:
    m = make(timeout=10.0)
    m.start(0.0)
    assert m.on_timer(9.999) == []
    assert m.on_timer(10.0) == [CloseAllClients(), Stop()]
    assert m.failure == Failure(
        FailureKind.TIMED_OUT,
        "timed out after 10.0 s waiting for the all-clients channel to connect",
    )
    assert m.failure.kind.exit_code == 3


def test_timeout_awaiting_connect() -> None:
    m = make(timeout=2.5)
    m.start(0.0)
    m.on_all_clients_connected(CLIENT, 1.0)
    # The clock restarted at the HELLO: the old deadline (2.5) is not the one that counts.
    assert m.on_timer(3.0) == []
    # Other clients' replies do not extend the wait.
    m.on_all_clients_message(format_message(AllClientsError(1, "server full")), 3.2)
    assert m.next_deadline() == 3.5
    assert m.on_timer(3.5) == [CloseAllClients(), Stop()]
    assert m.failure == Failure(
        FailureKind.TIMED_OUT, "timed out after 2.5 s waiting for CONNECT from the server"
    )


def test_timeout_joining_duologue() -> None:
    m = make()
    to_awaiting(m)
    m.on_all_clients_message(GUIDE_CONNECT, 1.0)
    assert m.on_timer(10.9) == []
    assert m.on_timer(11.0) == [CloseDuologue(), Stop()]
    assert m.failure == Failure(
        FailureKind.TIMED_OUT, "timed out after 10.0 s waiting for the duologue to connect"
    )


def test_timeout_waiting_for_echo_names_the_message() -> None:
    m = make(interval=0)
    to_echoing(m)
    m.on_duologue_message(echo("msg-1"), 1.0)
    m.on_duologue_message(echo("msg-2"), 2.0)  # message 3 sent at 2.0
    assert m.next_deadline() == 12.0
    assert m.on_timer(11.0) == []
    assert m.on_timer(12.0) == [CloseDuologue(), Stop()]
    assert m.failure == Failure(
        FailureKind.TIMED_OUT, "timed out after 10.0 s waiting for the echo of message 3"
    )
    assert (m.sent, m.received) == (3, 2)


def test_no_timeout_while_idle_between_echoes() -> None:
    m = make(interval=30.0, timeout=1.0)
    to_echoing(m)
    m.on_duologue_message(echo("msg-1"), 0.5)
    assert m.next_deadline() == 30.5
    assert m.on_timer(20.0) == []  # waiting out the interval is not a timed-out wait
    assert state_of(m) is ClientState.ECHOING
    assert m.on_timer(30.5) == [SendEcho(2, b"ECHO msg-2")]
    assert m.next_deadline() == 31.5


# ---- duologue failures -----------------------------------------------------------------------


def test_server_error_in_duologue() -> None:
    m = make()
    to_echoing(m)
    assert m.on_duologue_message(format_message(DuologueError("bad message")), 1.0) == [
        CloseDuologue(),
        Stop(),
    ]
    assert m.failure == Failure(FailureKind.PROTOCOL, "server error: bad message")
    assert m.failure.kind.exit_code == 4


def test_mismatched_echo_is_protocol_failure() -> None:
    m = make()
    to_echoing(m)
    assert m.on_duologue_message(echo("something else"), 1.0) == [CloseDuologue(), Stop()]
    assert m.failure is not None and m.failure.kind is FailureKind.PROTOCOL
    assert "message 1" in m.failure.message
    assert m.received == 0 and m.rtts == []


def test_unsolicited_echo_between_sends_is_protocol_failure() -> None:
    m = make(interval=5.0)
    to_echoing(m)
    m.on_duologue_message(echo("msg-1"), 1.0)
    assert m.on_duologue_message(echo("msg-1"), 1.1) == [CloseDuologue(), Stop()]
    assert m.failure is not None and m.failure.kind is FailureKind.PROTOCOL


def test_bad_duologue_message_is_protocol_failure() -> None:
    m = make()
    to_echoing(m)
    assert m.on_duologue_message(b"ECHO \xff", 1.0) == [CloseDuologue(), Stop()]
    assert m.failure is not None and m.failure.kind is FailureKind.PROTOCOL
    assert "invalid UTF-8" in m.failure.message


def test_long_bad_message_is_truncated_in_failure() -> None:
    m = make()
    to_echoing(m)
    m.on_duologue_message(b"X" * 1000, 1.0)
    assert m.failure is not None and len(m.failure.message) < 200


def test_duologue_closed_by_server() -> None:
    m = make()
    to_echoing(m)
    assert m.on_duologue_closed(1.0) == [CloseDuologue(), Stop()]
    assert m.failure == Failure(FailureKind.CONNECTION, "server closed the duologue")
    assert m.failure.kind.exit_code == 4


def test_duologue_closed_while_joining() -> None:
    m = make()
    to_awaiting(m)
    m.on_all_clients_message(GUIDE_CONNECT, 1.0)
    assert m.on_duologue_closed(1.5) == [CloseDuologue(), Stop()]
    assert m.failure is not None and m.failure.kind is FailureKind.CONNECTION


def test_send_failed() -> None:
    m = make()
    to_echoing(m)
    assert m.on_send_failed("Not connected", 1.0) == [CloseDuologue(), Stop()]
    assert m.failure == Failure(FailureKind.CONNECTION, "send failed: Not connected")
    assert m.on_send_failed("again", 2.0) == []


def test_send_failed_for_hello() -> None:
    m = make()
    to_awaiting(m)
    assert m.on_send_failed("Back pressured", 1.0) == [CloseAllClients(), Stop()]
    assert m.failure is not None and m.failure.kind is FailureKind.CONNECTION


# ---- stop and misuse -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("steps", "closes"),
    [
        (0, []),
        (1, [CloseAllClients()]),
        (2, [CloseAllClients()]),
        (3, [CloseDuologue()]),
        (4, [CloseDuologue()]),
    ],
)
def test_stop_closes_what_is_open(steps: int, closes: list[object]) -> None:
    m = make()
    script: list[Callable[[], list[Action]]] = [
        lambda: m.start(0.0),
        lambda: m.on_all_clients_connected(CLIENT, 0.0),
        lambda: m.on_all_clients_message(GUIDE_CONNECT, 0.0),
        lambda: m.on_duologue_connected(0.0),
    ]
    for step in script[:steps]:
        step()
    assert m.stop(1.0) == [*closes, Stop()]
    assert state_of(m) is ClientState.CLOSED and m.failure is None
    assert m.next_deadline() is None


def test_calls_before_start_raise() -> None:
    m = make()
    calls: list[Callable[[], list[Action]]] = [
        lambda: m.on_timer(0.0),
        lambda: m.on_all_clients_connected(1, 0.0),
        lambda: m.on_all_clients_message(b"x", 0.0),
        lambda: m.on_all_clients_closed(0.0),
        lambda: m.on_duologue_connected(0.0),
        lambda: m.on_duologue_message(b"x", 0.0),
        lambda: m.on_duologue_closed(0.0),
        lambda: m.on_send_failed("x", 0.0),
    ]
    for call in calls:
        with pytest.raises(LocalProtocolError):
            call()
    assert state_of(m) is ClientState.IDLE


def test_start_twice_raises() -> None:
    m = make()
    m.start(0.0)
    with pytest.raises(LocalProtocolError):
        m.start(0.0)


def test_duologue_events_before_open_duologue_raise() -> None:
    m = make()
    to_awaiting(m)
    with pytest.raises(LocalProtocolError):
        m.on_duologue_connected(0.0)
    with pytest.raises(LocalProtocolError):
        m.on_duologue_message(b"ECHO x", 0.0)
    with pytest.raises(LocalProtocolError):
        m.on_duologue_closed(0.0)
    assert state_of(m) is ClientState.AWAITING_CONNECT


def test_bad_client_session_raises() -> None:
    m = make()
    m.start(0.0)
    with pytest.raises(LocalProtocolError):
        m.on_all_clients_connected(2**31, 0.0)


def test_duplicate_connected_events_ignored() -> None:
    m = make()
    to_echoing(m)
    assert m.on_duologue_connected(1.0) == []
    assert m.sent == 1


def test_factory_text_that_cannot_be_sent_raises_value_error() -> None:
    m = make(message_factory=lambda i: "a\nb")
    to_awaiting(m)
    m.on_all_clients_message(GUIDE_CONNECT, 0.0)
    with pytest.raises(ValueError):
        m.on_duologue_connected(0.0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"pad": -1},
        {"pad": 2**32},
        {"timeout": 0.0},
        {"timeout": float("inf")},
        {"interval": -1.0},
        {"count": -1},
    ],
)
def test_constructor_validates(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        make(**kwargs)
