"""Unit tests written to kill surviving mutants (./dev mutate); see docs/mutation.md.

They pin what a driver of `echo.session.machine` sees: the exact `Failure` (kind, message,
detail, phase) and actions for every way `HandshakeMachine` and `ResumeMachine` fail, the
deadlines they set, the defaults they start with, the resumable HELLO with credentials, and
the fallback to Echo 2.0's HELLO (which must then refuse a resume secret it no longer asked for).
"""

from __future__ import annotations

import pytest

from echo.protocol import (
    ERROR_BAD_MESSAGE,
    AllClientsError,
    Connect,
    encrypt_session,
    format_message,
)
from echo.session.machine import (
    CloseAllClients,
    Failed,
    Failure,
    FailureKind,
    HandshakeMachine,
    HandshakeState,
    LocalProtocolError,
    OpenAllClients,
    OpenDuologue,
    Opened,
    ResumeDone,
    ResumeMachine,
    ResumeState,
    SendHello,
    SendResume,
)
from echo.session.resume import (
    ResumableConnect,
    Resume,
    format_resumable_connect,
    format_resume,
    resume_proof,
)

PAD = 0x1234ABCD
RESUME_PAD = 0xFEDCBA9876543210FEDCBA9876543210
SECRET = 0x0123456789ABCDEF0123456789ABCDEF
ME = -7

# ---------------------------------------------------------------- HandshakeMachine


def _awaiting(**kwargs: object) -> HandshakeMachine:
    m = HandshakeMachine(pad=PAD, **kwargs)  # type: ignore[arg-type]
    m.start(0.0)
    m.on_all_clients_connected(ME, 0.1)
    return m


def _resumable_connect(session: int = 42) -> bytes:
    connect = Connect(ME, 9010, 9011, encrypt_session(session, PAD))
    return format_resumable_connect(ResumableConnect(connect, SECRET ^ RESUME_PAD))


def test_a_handshake_waits_10_seconds_by_default_and_holds_no_secret_yet() -> None:
    m = HandshakeMachine(pad=PAD, resume_pad=RESUME_PAD)
    assert m.timeout == 10.0
    assert m.resume_secret is None
    assert m.start(5.0) == [OpenAllClients()]
    assert m.next_deadline() == 15.0


@pytest.mark.parametrize("pad", [True, 1.0])
def test_a_pad_that_is_not_an_int_is_refused_as_a_pad(pad: object) -> None:
    with pytest.raises(ValueError) as raised:
        HandshakeMachine(pad=pad)  # type: ignore[arg-type]
    assert str(raised.value) == f"pad must be a u32, got {pad!r}"


def test_a_resumable_hello_carries_the_credentials() -> None:
    m = HandshakeMachine(pad=PAD, credentials=b"ticket", resume_pad=RESUME_PAD)
    m.start(0.0)
    assert m.on_all_clients_connected(ME, 0.1) == [
        SendHello(b"HELLO 1234ABCD dGlja2V0 +R FEDCBA9876543210FEDCBA9876543210")
    ]


def test_a_plain_handshake_opens_without_a_secret() -> None:
    m = _awaiting()
    m.on_all_clients_message(format_message(Connect(ME, 9010, 9011, encrypt_session(42, PAD))), 1)
    assert m.resume_secret is None
    assert m.on_duologue_connected(2.0) == [Opened(42, 9010, 9011, None)]


def test_a_resumable_handshake_keeps_the_secret() -> None:
    m = _awaiting(resume_pad=RESUME_PAD)
    assert m.on_all_clients_message(_resumable_connect(), 1.0) == [
        CloseAllClients(),
        OpenDuologue(9010, 9011, 42),
    ]
    assert m.resume_secret == SECRET


def test_resumed_in_answer_to_a_hello_is_a_protocol_failure() -> None:
    m = _awaiting()
    actions = m.on_all_clients_message(b"-7 RESUMED 3", 1.0)
    failure = Failure(
        FailureKind.PROTOCOL,
        "bad reply from the server (RESUMED to a HELLO): '-7 RESUMED 3'",
        "",
        HandshakeState.AWAITING_CONNECT,
    )
    assert actions == [CloseAllClients(), Failed(failure)]
    assert m.failure == failure


def test_a_bad_reply_names_the_parser_s_reason() -> None:
    m = _awaiting()
    m.on_all_clients_message(b"-7 CONNECT nonsense", 1.0)
    assert m.failure == Failure(
        FailureKind.PROTOCOL,
        "bad reply from the server (not a CONNECT or ERROR reply): '-7 CONNECT nonsense'",
        "",
        HandshakeState.AWAITING_CONNECT,
    )


def test_a_plain_handshake_refuses_a_resume_secret_with_its_text() -> None:
    m = _awaiting()
    data = _resumable_connect()
    assert m.on_all_clients_message(data, 1.0)[-1] == Failed(
        Failure(
            FailureKind.PROTOCOL,
            f"a resume secret nobody asked for: {data.decode()!r}",
            "",
            HandshakeState.AWAITING_CONNECT,
        )
    )
    assert m.resume_secret is None and m.session_id is None


def test_after_falling_back_to_echo_2_a_resume_secret_is_refused() -> None:
    # The server said "bad message" to "+R": the plain HELLO that follows asked for no secret.
    m = _awaiting(resume_pad=RESUME_PAD, timeout=4.0)
    refusal = format_message(AllClientsError(ME, ERROR_BAD_MESSAGE))
    assert m.on_all_clients_message(refusal, 2.5) == [SendHello(b"HELLO 1234ABCD")]
    assert m.next_deadline() == 6.5  # a fresh wait for the second HELLO's reply
    assert m.state is HandshakeState.AWAITING_CONNECT
    data = _resumable_connect()
    assert m.on_all_clients_message(data, 3.0) == [
        CloseAllClients(),
        Failed(
            Failure(
                FailureKind.PROTOCOL,
                f"a resume secret nobody asked for: {data.decode()!r}",
                "",
                HandshakeState.AWAITING_CONNECT,
            )
        ),
    ]
    assert m.resume_secret is None


def test_the_fallback_hello_times_out_at_its_own_deadline() -> None:
    m = _awaiting(resume_pad=RESUME_PAD, timeout=4.0)  # first deadline 4.1
    m.on_all_clients_message(format_message(AllClientsError(ME, ERROR_BAD_MESSAGE)), 2.5)
    assert m.on_timer(4.1) == []
    assert m.on_timer(6.4) == []
    (*_, failed) = m.on_timer(6.5)
    assert failed == Failed(
        Failure(
            FailureKind.TIMED_OUT,
            "timed out after 4.0 s waiting for CONNECT from the server",
            "CONNECT from the server",
            HandshakeState.AWAITING_CONNECT,
        )
    )


# ---------------------------------------------------------------- ResumeMachine


def _resume(timeout: float = 2.0) -> ResumeMachine:
    return ResumeMachine(session_id=42, secret=SECRET, counter=3, received=9, timeout=timeout)


def _resume_awaiting() -> ResumeMachine:
    m = _resume()
    m.start(0.0)
    m.on_all_clients_connected(ME, 0.5)  # deadline 2.5
    return m


def test_a_fresh_resume_machine() -> None:
    m = ResumeMachine(session_id=42, secret=SECRET, counter=3, received=9)
    assert m.timeout == 10.0
    assert m.state is ResumeState.IDLE
    assert m.next_deadline() is None and m.failure is None
    assert m.on_timer(100.0) == []


def test_a_resume_machine_starts_once() -> None:
    m = _resume()
    assert m.start(1.0) == [OpenAllClients()]
    assert m.state is ResumeState.CONNECTING and m.next_deadline() == 3.0
    with pytest.raises(LocalProtocolError) as raised:
        m.start(1.5)
    assert str(raised.value) == "start() called twice"


def test_connected_sends_the_resume_and_waits_afresh() -> None:
    m = _resume()
    m.start(0.0)
    assert m.on_all_clients_connected(ME, 1.5) == [
        SendResume(format_resume(Resume(42, 3, 9, resume_proof(SECRET, 42, 3, 9))))
    ]
    assert m.state is ResumeState.AWAITING_RESUMED
    assert m.next_deadline() == 3.5
    assert m.on_timer(3.4) == []
    assert m.state is ResumeState.AWAITING_RESUMED
    assert m.on_all_clients_connected(ME, 1.6) == []  # a second "connected"


#: the resume machine's waits: (all-clients channel connected?, its state, what it waits for)
RESUME_WAITS = [
    (False, ResumeState.CONNECTING, "the all-clients channel to connect"),
    (True, ResumeState.AWAITING_RESUMED, "RESUMED from the server"),
]


@pytest.mark.parametrize(("connected", "state", "waiting_for"), RESUME_WAITS)
def test_every_resume_wait_times_out_saying_what_it_waited_for(
    connected: bool, state: ResumeState, waiting_for: str
) -> None:
    m = _resume(timeout=2.0)
    m.start(0.0)
    if connected:
        m.on_all_clients_connected(ME, 0.0)
    failure = Failure(
        FailureKind.TIMED_OUT,
        f"timed out after 2.0 s waiting for {waiting_for}",
        waiting_for,
        state,
    )
    assert m.on_timer(2.0) == [CloseAllClients(), Failed(failure)]
    assert m.failure == failure
    assert m.state is ResumeState.FAILED and m.next_deadline() is None
    assert m.on_timer(5.0) == []


@pytest.mark.parametrize(("connected", "state", "waiting_for"), RESUME_WAITS)
def test_a_failed_send_or_a_closed_channel_fails_the_resume(
    connected: bool, state: ResumeState, waiting_for: str
) -> None:
    m = _resume()
    m.start(0.0)
    if connected:
        m.on_all_clients_connected(ME, 0.0)
    failure = Failure(FailureKind.CONNECTION, "send failed: gone", waiting_for, state)
    assert m.on_send_failed("gone", 1.0) == [CloseAllClients(), Failed(failure)]
    assert m.failure == failure and m.state is ResumeState.FAILED
    assert m.next_deadline() is None
    assert m.on_send_failed("again", 1.1) == []
    assert m.on_all_clients_closed(1.2) == []

    m = _resume()
    m.start(0.0)
    if connected:
        m.on_all_clients_connected(ME, 0.0)
    failure = Failure(
        FailureKind.CONNECTION,
        f"the all-clients channel closed while waiting for {waiting_for}",
        waiting_for,
        state,
    )
    assert m.on_all_clients_closed(1.0) == [CloseAllClients(), Failed(failure)]
    assert m.failure == failure and m.state is ResumeState.FAILED
    assert m.on_all_clients_closed(1.1) == []


def test_before_start_and_after_resumed_nothing_fails() -> None:
    m = _resume()
    assert m.on_send_failed("x", 0.0) == [] and m.on_all_clients_closed(0.0) == []
    assert m.state is ResumeState.IDLE and m.failure is None
    m = _resume_awaiting()
    assert m.on_all_clients_message(b"-7 RESUMED 4", 1.0) == [CloseAllClients(), ResumeDone(4)]
    assert m.state is ResumeState.DONE and m.next_deadline() is None
    assert m.on_timer(100.0) == []
    assert m.on_send_failed("x", 1.0) == []
    assert m.on_all_clients_closed(1.0) == []
    assert m.on_all_clients_message(b"-7 ERROR resume refused", 1.0) == []
    assert m.state is ResumeState.DONE and m.failure is None


def test_a_refused_resume_reports_the_server_s_reason() -> None:
    m = _resume_awaiting()
    failure = Failure(
        FailureKind.REJECTED, "resume refused", "resume refused", ResumeState.AWAITING_RESUMED
    )
    assert m.on_all_clients_message(b"-7 ERROR resume refused", 1.0) == [
        CloseAllClients(),
        Failed(failure),
    ]
    assert m.failure == failure
    assert m.state is ResumeState.FAILED and m.next_deadline() is None


def test_a_malformed_reply_to_resume_names_the_parser_s_reason() -> None:
    m = _resume_awaiting()
    failure = Failure(
        FailureKind.PROTOCOL,
        "bad reply from the server (not a RESUMED reply): '-7 RESUMED x'",
        "",
        ResumeState.AWAITING_RESUMED,
    )
    assert m.on_all_clients_message(b"-7 RESUMED x", 1.0) == [CloseAllClients(), Failed(failure)]
    assert m.failure == failure and m.state is ResumeState.FAILED


def test_a_connect_in_answer_to_resume_is_not_a_reply_to_it() -> None:
    m = _resume_awaiting()
    failure = Failure(
        FailureKind.PROTOCOL,
        "not a reply to RESUME: '-7 CONNECT 9010 9011 1F'",
        "",
        ResumeState.AWAITING_RESUMED,
    )
    assert m.on_all_clients_message(b"-7 CONNECT 9010 9011 1F", 1.0) == [
        CloseAllClients(),
        Failed(failure),
    ]
    assert m.failure == failure and m.state is ResumeState.FAILED
    assert m.next_deadline() is None
