"""The ECHO application of echo-client as a pure machine, with a scripted clock
(echo.client.application). The handshake before it is the session library's
(tests/session/test_machine.py, which holds the Echo 2.0 handshake cases moved from here)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from echo.client.application import (
    Action,
    ClientState,
    CloseCause,
    EchoMachine,
    EchoReceived,
    Failure,
    FailureKind,
    LocalProtocolError,
    SendEcho,
    Stop,
    close_cause,
    exit_code,
    failure_of,
)
from echo.protocol import DuologueError, Echo, format_message
from echo.session import (
    HandshakeTimeout,
    LostContact,
    ProtocolViolation,
    Rejected,
    SessionClosed,
    Untrusted,
)
from echo.session.machine import HandshakeState
from echo.session.session import PeerClosed, SendFailed

DUOLOGUE = 1938340545


def texts(i: int) -> str:
    return f"msg-{i}"


def make(**kwargs: object) -> EchoMachine:
    args: dict[str, object] = {"message_factory": texts}
    args.update(kwargs)
    return EchoMachine(**args)  # type: ignore[arg-type]


def to_echoing(m: EchoMachine, now: float = 0.0) -> list[Action]:
    for state in (HandshakeState.CONNECTING, HandshakeState.AWAITING_CONNECT):
        m.on_handshake_step(state)
    m.on_handshake_step(HandshakeState.JOINING, session_id=DUOLOGUE)
    return list(m.on_open(DUOLOGUE, now))


def state_of(m: EchoMachine) -> ClientState:
    # A function call, so mypy does not narrow `m.state` from one assertion to the next.
    return m.state


def echo(text: str) -> bytes:
    return format_message(Echo(text))


# ---- happy path ------------------------------------------------------------------------------


def test_full_happy_path_with_exact_rtts() -> None:
    m = make(count=3, interval=1.0, timeout=10.0)
    assert state_of(m) is ClientState.IDLE and m.next_deadline() is None
    # The handshake's steps only show in the state: its timeouts are the session library's.
    m.on_handshake_step(HandshakeState.CONNECTING)
    assert state_of(m) is ClientState.CONNECTING and m.next_deadline() is None
    m.on_handshake_step(HandshakeState.AWAITING_CONNECT, client_session=-5)
    assert state_of(m) is ClientState.AWAITING_CONNECT and m.client_session == -5
    m.on_handshake_step(HandshakeState.JOINING, client_session=-5, session_id=DUOLOGUE)
    assert state_of(m) is ClientState.JOINING_DUOLOGUE and m.duologue_session == DUOLOGUE

    assert m.on_open(DUOLOGUE, 101.25) == [SendEcho(1, b"ECHO msg-1")]
    assert state_of(m) is ClientState.ECHOING
    assert m.next_deadline() == 111.25  # the echo's timeout

    assert m.on_message(echo("msg-1"), 101.5) == [EchoReceived(1, "msg-1", 0.25)]
    assert m.next_deadline() == 102.25  # next send `interval` after the last send
    assert m.on_timer(102.0) == []  # early wake-up: nothing due
    assert m.on_timer(102.25) == [SendEcho(2, b"ECHO msg-2")]
    assert m.next_deadline() == 112.25

    assert m.on_message(echo("msg-2"), 102.75) == [EchoReceived(2, "msg-2", 0.5)]
    assert m.on_timer(103.25) == [SendEcho(3, b"ECHO msg-3")]
    assert m.on_message(echo("msg-3"), 103.375) == [EchoReceived(3, "msg-3", 0.125), Stop()]
    assert state_of(m) is ClientState.CLOSED
    assert m.failure is None
    assert (m.sent, m.received) == (3, 3)
    assert m.rtts == [0.25, 0.5, 0.125]
    assert m.next_deadline() is None
    # Everything after the end is ignored.
    assert m.on_timer(200.0) == []
    assert m.on_message(echo("msg-3"), 200.0) == []
    assert m.on_closed(CloseCause.CLOSED, "", 200.0) == []
    assert m.on_open(DUOLOGUE, 200.0) == []
    m.on_handshake_step(HandshakeState.CONNECTING)
    assert state_of(m) is ClientState.CLOSED
    assert m.stop(200.0) == []


def test_rtts_is_a_copy() -> None:
    m = make(interval=0)
    to_echoing(m)
    m.on_message(echo("msg-1"), 0.5)
    m.rtts.append(99.0)
    assert m.rtts == [0.5]


def test_interval_zero_sends_immediately() -> None:
    m = make(interval=0, count=None)
    assert to_echoing(m, 5.0) == [SendEcho(1, b"ECHO msg-1")]
    actions = m.on_message(echo("msg-1"), 5.1)
    assert actions == [EchoReceived(1, "msg-1", 5.1 - 5.0), SendEcho(2, b"ECHO msg-2")]
    assert m.next_deadline() == pytest.approx(15.1)
    assert state_of(m) is ClientState.ECHOING


def test_count_none_runs_until_stopped() -> None:
    m = make(interval=0)
    to_echoing(m)
    now = 0.0
    for i in range(1, 51):
        now += 0.01
        actions = m.on_message(echo(f"msg-{i}"), now)
        assert actions[-1] == SendEcho(i + 1, f"ECHO msg-{i + 1}".encode())
    assert m.received == 50 and m.sent == 51
    assert m.stop(now) == [Stop()]
    assert state_of(m) is ClientState.CLOSED and m.failure is None


def test_count_one_stops_after_first_echo() -> None:
    m = make(count=1)
    to_echoing(m)
    assert m.on_message(echo("msg-1"), 2.0) == [EchoReceived(1, "msg-1", 2.0), Stop()]
    assert state_of(m) is ClientState.CLOSED


def test_count_zero_closes_once_connected() -> None:
    m = make(count=0)
    assert to_echoing(m) == [Stop()]
    assert state_of(m) is ClientState.CLOSED and m.sent == 0


def test_same_text_every_time() -> None:
    # `--message TEXT` repeats one text; one outstanding echo at a time keeps matching exact.
    m = make(message_factory=lambda i: "hi", interval=0, count=2)
    assert to_echoing(m) == [SendEcho(1, b"ECHO hi")]
    assert m.on_message(b"ECHO hi", 1.0) == [EchoReceived(1, "hi", 1.0), SendEcho(2, b"ECHO hi")]
    assert m.on_message(b"ECHO hi", 1.5)[0] == EchoReceived(2, "hi", 0.5)
    assert state_of(m) is ClientState.CLOSED


# ---- the handshake's outcome -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "failure"),
    [
        (
            Rejected("too many connections for IP address"),
            Failure(FailureKind.REJECTED, "too many connections for IP address"),
        ),
        (
            HandshakeTimeout("the duologue to connect", 10.0, HandshakeState.JOINING),
            Failure(
                FailureKind.TIMED_OUT,
                "timed out after 10.0 s waiting for the duologue to connect",
                HandshakeState.JOINING,
            ),
        ),
        (
            HandshakeTimeout("the all-clients channel to connect", 2.5, HandshakeState.CONNECTING),
            Failure(
                FailureKind.TIMED_OUT,
                "timed out after 2.5 s waiting for the all-clients channel to connect",
                HandshakeState.CONNECTING,
            ),
        ),
        (
            LostContact("the all-clients channel closed while waiting for CONNECT from the server"),
            Failure(
                FailureKind.CONNECTION,
                "the all-clients channel closed while waiting for CONNECT from the server",
            ),
        ),
        (
            ProtocolViolation("bad reply from the server (x): '...'"),
            Failure(FailureKind.PROTOCOL, "bad reply from the server (x): '...'"),
        ),
        (
            Untrusted("server key refused: not the pinned one"),
            Failure(FailureKind.UNTRUSTED, "server key refused: not the pinned one"),
        ),
    ],
)
def test_a_failed_handshake_is_the_client_s_failure(error: Exception, failure: Failure) -> None:
    m = make()
    m.on_handshake_step(HandshakeState.CONNECTING)
    assert failure_of(error) == failure  # type: ignore[arg-type]
    assert m.on_handshake_failed(failure_of(error), 1.0) == [Stop()]  # type: ignore[arg-type]
    assert state_of(m) is ClientState.FAILED and m.failure == failure
    assert m.next_deadline() is None and (m.sent, m.received) == (0, 0)


def test_exit_codes() -> None:
    assert {kind: exit_code(kind) for kind in FailureKind} == {
        FailureKind.REJECTED: 5,
        FailureKind.UNTRUSTED: 6,
        FailureKind.TIMED_OUT: 3,
        FailureKind.PROTOCOL: 4,
        FailureKind.CONNECTION: 4,
    }
    assert Failure(FailureKind.REJECTED, "x").exit_code == 5
    assert Failure(FailureKind.TIMED_OUT, "x").exit_code == 3
    # No answer at all (the all-clients channel never connected) is exit 1, as for every CLI;
    # silence after the server answered is still a timeout.
    connecting = Failure(FailureKind.TIMED_OUT, "x", HandshakeState.CONNECTING)
    assert connecting.no_answer and connecting.exit_code == 1
    for phase in (HandshakeState.AWAITING_CONNECT, HandshakeState.JOINING):
        later = Failure(FailureKind.TIMED_OUT, "x", phase)
        assert not later.no_answer and later.exit_code == 3
    assert not Failure(FailureKind.CONNECTION, "x", HandshakeState.CONNECTING).no_answer


# ---- timeouts --------------------------------------------------------------------------------


def test_timeout_waiting_for_echo_names_the_message() -> None:
    m = make(interval=0)
    to_echoing(m)
    m.on_message(echo("msg-1"), 1.0)
    m.on_message(echo("msg-2"), 2.0)  # message 3 sent at 2.0
    assert m.next_deadline() == 12.0
    assert m.on_timer(11.0) == []
    assert m.on_timer(12.0) == [Stop()]
    assert m.failure == Failure(
        FailureKind.TIMED_OUT, "timed out after 10.0 s waiting for the echo of message 3"
    )
    assert m.failure.exit_code == 3
    assert (m.sent, m.received) == (3, 2)


def test_the_cadence_is_the_sends_not_the_replies() -> None:
    # A slow reply does not shift the next ECHO's moment: clients answered late together would
    # otherwise send late together ever after (B4: CHANGELOG.md, 2026-11-28).
    m = make(interval=1.0, timeout=10.0, count=None)
    assert to_echoing(m, 10.0) == [SendEcho(1, b"ECHO msg-1")]
    m.on_message(echo("msg-1"), 10.3)
    assert m.next_deadline() == 11.0
    assert m.on_timer(11.0) == [SendEcho(2, b"ECHO msg-2")]
    # A reply later than the interval: the next ECHO goes at once, one outstanding at a time.
    m.on_message(echo("msg-2"), 12.5)
    assert m.next_deadline() == 12.5
    assert m.on_timer(12.5) == [SendEcho(3, b"ECHO msg-3")]
    # and the cadence goes on from that send
    m.on_message(echo("msg-3"), 12.6)
    assert m.next_deadline() == 13.5


def test_no_timeout_while_idle_between_echoes() -> None:
    m = make(interval=30.0, timeout=1.0)
    to_echoing(m)
    m.on_message(echo("msg-1"), 0.5)
    assert m.next_deadline() == 30.0  # 30 s after the first ECHO, sent at 0
    assert m.on_timer(20.0) == []  # waiting out the interval is not a timed-out wait
    assert state_of(m) is ClientState.ECHOING
    assert m.on_timer(30.0) == [SendEcho(2, b"ECHO msg-2")]
    assert m.next_deadline() == 31.0


# ---- failures on the session -----------------------------------------------------------------


def test_server_error_in_duologue() -> None:
    m = make()
    to_echoing(m)
    # The session takes "ERROR <reason>" itself and raises PeerClosed.
    cause = close_cause(PeerClosed("bad message"))
    assert cause == (CloseCause.PEER_ERROR, "bad message")
    assert m.on_closed(*cause, 1.0) == [Stop()]
    assert m.failure == Failure(FailureKind.PROTOCOL, "server error: bad message")
    assert m.failure.exit_code == 4


def test_a_bare_server_error_reaching_the_application_is_a_server_error_too() -> None:
    m = make()
    to_echoing(m)
    assert m.on_message(format_message(DuologueError("")), 1.0) == [Stop()]
    assert m.failure is not None and m.failure.kind is FailureKind.PROTOCOL
    assert m.failure.message.startswith("server error:")


def test_mismatched_echo_is_protocol_failure() -> None:
    m = make()
    to_echoing(m)
    assert m.on_message(echo("something else"), 1.0) == [Stop()]
    assert m.failure is not None and m.failure.kind is FailureKind.PROTOCOL
    assert "message 1" in m.failure.message
    assert m.received == 0 and m.rtts == []


def test_unsolicited_echo_between_sends_is_protocol_failure() -> None:
    m = make(interval=5.0)
    to_echoing(m)
    m.on_message(echo("msg-1"), 1.0)
    assert m.on_message(echo("msg-1"), 1.1) == [Stop()]
    assert m.failure is not None and m.failure.kind is FailureKind.PROTOCOL


def test_bad_duologue_message_is_protocol_failure() -> None:
    m = make()
    to_echoing(m)
    assert m.on_message(b"ECHO \xff", 1.0) == [Stop()]
    assert m.failure is not None and m.failure.kind is FailureKind.PROTOCOL
    assert "invalid UTF-8" in m.failure.message


def test_long_bad_message_is_truncated_in_failure() -> None:
    m = make()
    to_echoing(m)
    m.on_message(b"X" * 1000, 1.0)
    assert m.failure is not None and len(m.failure.message) < 200


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (SessionClosed("closed by the server"), "server closed the duologue"),
        (
            LostContact("lost contact with the server"),
            "lost contact with the server (nothing received for the liveness timeout)",
        ),
        (
            SendFailed("send failed", "BACK_PRESSURED"),
            "send failed: could not send to the server (BACK_PRESSURED)",
        ),
    ],
)
def test_the_session_closing_is_a_connection_failure(error: SessionClosed, message: str) -> None:
    m = make()
    to_echoing(m)
    assert m.on_closed(*close_cause(error), 1.0) == [Stop()]
    assert m.failure == Failure(FailureKind.CONNECTION, message)
    assert m.failure.exit_code == 4
    assert m.on_closed(*close_cause(error), 2.0) == []


# ---- stop and misuse -------------------------------------------------------------------------


@pytest.mark.parametrize("steps", [0, 1, 2, 3, 4])
def test_stop_finishes_as_closed_at_any_point(steps: int) -> None:
    m = make()
    script: list[Callable[[], object]] = [
        lambda: m.on_handshake_step(HandshakeState.CONNECTING),
        lambda: m.on_handshake_step(HandshakeState.AWAITING_CONNECT),
        lambda: m.on_handshake_step(HandshakeState.JOINING),
        lambda: m.on_open(DUOLOGUE, 0.0),
    ]
    for step in script[:steps]:
        step()
    assert m.stop(1.0) == [Stop()]
    assert state_of(m) is ClientState.CLOSED and m.failure is None
    assert m.next_deadline() is None
    # A handshake that fails after the stop (the cancelled connect) changes nothing.
    assert m.on_handshake_failed(Failure(FailureKind.TIMED_OUT, "x"), 2.0) == []
    assert state_of(m) is ClientState.CLOSED


def test_session_events_before_it_opened_raise() -> None:
    m = make()
    m.on_handshake_step(HandshakeState.JOINING)
    calls: list[Callable[[], list[Action]]] = [
        lambda: m.on_message(b"ECHO x", 0.0),
        lambda: m.on_closed(CloseCause.CLOSED, "", 0.0),
    ]
    for call in calls:
        with pytest.raises(LocalProtocolError):
            call()
    assert state_of(m) is ClientState.JOINING_DUOLOGUE
    assert m.on_timer(100.0) == []  # no timer before the session opened


def test_duplicate_open_ignored() -> None:
    m = make()
    to_echoing(m)
    assert m.on_open(DUOLOGUE, 1.0) == []
    assert m.sent == 1


def test_factory_text_that_cannot_be_sent_raises_value_error() -> None:
    m = make(message_factory=lambda i: "a\nb")
    with pytest.raises(ValueError):
        to_echoing(m)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"timeout": 0.0},
        {"timeout": float("inf")},
        {"interval": -1.0},
        {"count": -1},
    ],
)
def test_constructor_validates(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        make(**kwargs)
