"""The pure parts of resume: its wire forms, the proof, admission's verdicts, the machines."""

from __future__ import annotations

import random

import pytest

from echo.protocol import (
    ERROR_BAD_MESSAGE,
    AllClientsError,
    BadMessage,
    Connect,
    Hello,
    encrypt_session,
    format_message,
)
from echo.session.admission import Admission, ResumeVerdict
from echo.session.config import ServerConfig
from echo.session.machine import (
    CloseAllClients,
    Failed,
    FailureKind,
    HandshakeMachine,
    OpenAllClients,
    OpenDuologue,
    Opened,
    ResumeDone,
    ResumeMachine,
    SendHello,
    SendResume,
)
from echo.session.resume import (
    RESUME_MAX,
    ResumableConnect,
    ResumableHello,
    Resume,
    Resumed,
    check_proof,
    format_resumable_connect,
    format_resumable_hello,
    format_resume,
    format_resumed,
    parse_client_request_untrusted,
    parse_server_reply_untrusted,
    resume_proof,
)

SECRET = 0x0123456789ABCDEF0123456789ABCDEF
PAD = 0xFEDCBA9876543210FEDCBA9876543210

# ---------------------------------------------------------------- wire


def test_the_wire_forms_round_trip_and_look_as_documented() -> None:
    hello = ResumableHello(Hello(0xAB), PAD)
    assert format_resumable_hello(hello) == b"HELLO AB +R FEDCBA9876543210FEDCBA9876543210"
    assert parse_client_request_untrusted(format_resumable_hello(hello), credentials=False) == hello
    with_creds = ResumableHello(Hello(0xAB, b"ticket"), PAD)
    data = format_resumable_hello(with_creds)
    assert parse_client_request_untrusted(data, credentials=True) == with_creds
    # Credentials need a server with an admission hook, "+R" or not (Echo 2.0's grammar).
    assert isinstance(parse_client_request_untrusted(data, credentials=False), BadMessage)

    connect = ResumableConnect(Connect(-5, 9010, 9011, 0x1234), SECRET ^ PAD)
    data = format_resumable_connect(connect)
    assert data.startswith(b"-5 CONNECT 9010 9011 1234 +R ")
    assert parse_server_reply_untrusted(data) == connect

    proof = resume_proof(SECRET, 77, 3, 12)
    resume = Resume(77, 3, 12, proof)
    assert format_resume(resume) == f"RESUME 77 3 12 {proof.hex().upper()}".encode()
    assert parse_client_request_untrusted(format_resume(resume), credentials=False) == resume
    assert format_resumed(Resumed(-5, 40)) == b"-5 RESUMED 40"
    assert parse_server_reply_untrusted(b"-5 RESUMED 40") == Resumed(-5, 40)


def test_echo_2_forms_parse_exactly_as_before() -> None:
    plain = format_message(Hello(0x1F))
    assert parse_client_request_untrusted(plain, credentials=False) == Hello(0x1F)
    connect = Connect(3, 9010, 9011, encrypt_session(99, 0x1F))
    assert parse_server_reply_untrusted(format_message(connect)) == connect
    error = AllClientsError(3, "server full")
    assert parse_server_reply_untrusted(format_message(error)) == error


@pytest.mark.parametrize(
    "data",
    [
        b"RESUME",
        b"RESUME 1 0 0 " + b"0" * 32,  # counter 0 is never valid
        b"RESUME 1 1 0 " + b"0" * 31,
        b"RESUME 01 1 0 " + b"0" * 32,
        b"RESUME 1 1 -1 " + b"0" * 32,
        b"RESUME 1 1 0 " + b"g" * 32,
        b"RESUME 99999999999 1 0 " + b"0" * 32,  # not an int32
        b"HELLO AB +R " + b"0" * 31,
        b"HELLO AB +R " + b"0" * 33,
        b"HELLO +R " + b"0" * 32,
        b"HELLO AB +R " + b"0" * 32 + b" +R " + b"0" * 32,
        b"\xff\xfe +R ",
        b"RESUME " + b"1" * 2000,
    ],
)
def test_malformed_requests_are_bad_messages(data: bytes) -> None:
    assert isinstance(parse_client_request_untrusted(data, credentials=True), BadMessage)


@pytest.mark.parametrize(
    "data",
    [
        b"5 RESUMED",
        b"5 RESUMED x",
        b"05 RESUMED 1",
        b"5 ERROR x +R " + b"0" * 32,  # only a CONNECT carries a secret
        b"5 CONNECT 1 2 3 +R " + b"0" * 30,
    ],
)
def test_malformed_replies_are_bad_messages(data: bytes) -> None:
    assert isinstance(parse_server_reply_untrusted(data), BadMessage)


def test_the_parsers_never_raise_on_noise() -> None:
    rng = random.Random(14)
    pieces = [b"RESUME ", b"HELLO ", b" +R ", b" RESUMED ", b"CONNECT ", b"1", b"-", b"A", b" "]
    for _ in range(3000):
        data = b"".join(rng.choice(pieces) for _ in range(rng.randrange(8)))
        data += bytes(rng.randrange(256) for _ in range(rng.randrange(40)))
        parse_client_request_untrusted(data, credentials=rng.random() < 0.5)
        parse_server_reply_untrusted(data)


def test_a_proof_is_bound_to_its_secret_session_counter_and_count() -> None:
    proof = resume_proof(SECRET, 7, 1, 0)
    assert len(proof) == 16
    assert check_proof(SECRET, 7, 1, 0, proof)
    assert not check_proof(SECRET ^ 1, 7, 1, 0, proof)
    assert not check_proof(SECRET, 8, 1, 0, proof)
    assert not check_proof(SECRET, 7, 2, 0, proof)
    assert not check_proof(SECRET, 7, 1, 1, proof)


def test_format_refuses_what_would_not_parse() -> None:
    with pytest.raises(ValueError):
        format_resumable_hello(ResumableHello(Hello(1), RESUME_MAX + 1))
    with pytest.raises(ValueError):
        format_resume(Resume(1, 0, 0, bytes(16)))
    with pytest.raises(ValueError):
        format_resume(Resume(1, 1, -1, bytes(16)))
    with pytest.raises(ValueError):
        format_resume(Resume(1, 1, 0, bytes(15)))


# ---------------------------------------------------------------- admission


def _joined(admission: Admission, ip: str, now: float = 0.0) -> int:
    key = admission.key_of(ip)
    slot = admission.reserve(ip, key, 1, now)
    assert slot is not None
    admission.commit(slot)
    slot.resume_secret = SECRET
    assert admission.join(slot, ip, has_stream=False).value == "accept"
    return slot.session_id


def test_admission_gives_the_session_to_the_new_address_only_with_a_fresh_valid_proof() -> None:
    admission = Admission(ServerConfig(max_per_ip=2), random.Random(1))
    sid = _joined(admission, "198.51.100.1")

    def ask(counter: int, received: int, proof: bytes, ip: str) -> ResumeVerdict:
        verdict, _ = admission.resume(sid, counter, received, proof, ip, admission.key_of(ip))
        return verdict

    assert ask(1, 0, resume_proof(SECRET ^ 1, sid, 1, 0), "203.0.113.9") is ResumeVerdict.BAD_PROOF
    assert admission.by_session[sid].owner_ip == "198.51.100.1"
    assert ask(1, 0, resume_proof(SECRET, sid, 1, 0), "203.0.113.9") is ResumeVerdict.ACCEPT
    slot = admission.by_session[sid]
    assert slot.owner_ip == "203.0.113.9" and slot.resumes == 1
    # The per-address slot moved with it.
    assert admission.per_ip.count("198.51.100.1") == 0
    assert admission.per_ip.count("203.0.113.9") == 1
    # Only the new address may join from now on.
    assert admission.join(slot, "198.51.100.1", has_stream=False).value == "wrong address"
    # The same proof again (a copy off the wire), and an older counter: replays.
    assert ask(1, 0, resume_proof(SECRET, sid, 1, 0), "192.0.2.66") is ResumeVerdict.REPLAYED
    assert ask(2, 0, resume_proof(SECRET, sid, 2, 0), "203.0.113.9") is ResumeVerdict.ACCEPT
    assert ask(2, 0, resume_proof(SECRET, sid, 2, 0), "203.0.113.9") is ResumeVerdict.REPLAYED
    assert admission.by_session[sid].owner_ip == "203.0.113.9"


def test_admission_refuses_unknown_unresumable_unjoined_and_released_sessions() -> None:
    admission = Admission(ServerConfig(), random.Random(2))
    sid = _joined(admission, "198.51.100.1")
    proof = resume_proof(SECRET, sid + 1, 1, 0)
    verdict, _ = admission.resume(sid + 1, 1, 0, proof, "198.51.100.1", "198.51.100.1")
    assert verdict is ResumeVerdict.UNKNOWN_SESSION
    # Not joined yet: nothing to resume.
    slot = admission.reserve("198.51.100.2", "198.51.100.2", 2, 0.0)
    assert slot is not None
    admission.commit(slot)
    slot.resume_secret = SECRET
    proof = resume_proof(SECRET, slot.session_id, 1, 0)
    verdict, _ = admission.resume(slot.session_id, 1, 0, proof, "198.51.100.2", "198.51.100.2")
    assert verdict is ResumeVerdict.NOT_RESUMABLE
    # No secret was given out (the client did not ask).
    admission.by_session[sid].resume_secret = None
    verdict, _ = admission.resume(sid, 1, 0, resume_proof(SECRET, sid, 1, 0), "x", "x")
    assert verdict is ResumeVerdict.NOT_RESUMABLE
    # Released: gone from the table, its id unknown again.
    admission.release(admission.by_session[sid])
    verdict, _ = admission.resume(sid, 1, 0, resume_proof(SECRET, sid, 1, 0), "x", "x")
    assert verdict is ResumeVerdict.UNKNOWN_SESSION


# ---------------------------------------------------------------- machines


def _to_awaiting_connect(machine: HandshakeMachine) -> list[object]:
    assert machine.start(0.0) == [OpenAllClients()]
    return list(machine.on_all_clients_connected(-7, 0.1))


def test_a_resumable_handshake_decrypts_its_secret() -> None:
    machine = HandshakeMachine(pad=0x1F, resume_pad=PAD)
    (hello,) = _to_awaiting_connect(machine)
    assert hello == SendHello(format_resumable_hello(ResumableHello(Hello(0x1F), PAD)))
    reply = ResumableConnect(Connect(-7, 9010, 9011, encrypt_session(42, 0x1F)), SECRET ^ PAD)
    actions = machine.on_all_clients_message(format_resumable_connect(reply), 0.2)
    assert actions == [CloseAllClients(), OpenDuologue(9010, 9011, 42)]
    assert machine.on_duologue_connected(0.3) == [Opened(42, 9010, 9011, SECRET)]


def test_a_server_without_the_extension_is_asked_again_the_echo_2_way() -> None:
    machine = HandshakeMachine(pad=0x1F, resume_pad=PAD)
    _to_awaiting_connect(machine)
    refusal = format_message(AllClientsError(-7, ERROR_BAD_MESSAGE))
    assert machine.on_all_clients_message(refusal, 0.2) == [SendHello(b"HELLO 1F")]
    connect = format_message(Connect(-7, 9010, 9011, encrypt_session(42, 0x1F)))
    assert machine.on_all_clients_message(connect, 0.3)[-1] == OpenDuologue(9010, 9011, 42)
    assert machine.on_duologue_connected(0.4) == [Opened(42, 9010, 9011, None)]
    # A second "bad message" is a real refusal.
    again = HandshakeMachine(pad=0x1F, resume_pad=PAD)
    _to_awaiting_connect(again)
    again.on_all_clients_message(refusal, 0.2)
    (failed,) = again.on_all_clients_message(refusal, 0.3)[-1:]
    assert isinstance(failed, Failed) and failed.failure.kind is FailureKind.REJECTED


def test_a_plain_handshake_sends_echo_2_bytes_and_refuses_an_unasked_secret() -> None:
    machine = HandshakeMachine(pad=0x1F)
    assert _to_awaiting_connect(machine) == [SendHello(b"HELLO 1F")]
    reply = ResumableConnect(Connect(-7, 9010, 9011, 0), 0)
    (*_, failed) = machine.on_all_clients_message(format_resumable_connect(reply), 0.2)
    assert isinstance(failed, Failed) and failed.failure.kind is FailureKind.PROTOCOL


def test_the_resume_machine() -> None:
    machine = ResumeMachine(session_id=42, secret=SECRET, counter=3, received=9, timeout=2.0)
    assert machine.start(0.0) == [OpenAllClients()]
    (send,) = machine.on_all_clients_connected(-7, 0.5)
    assert send == SendResume(format_resume(Resume(42, 3, 9, resume_proof(SECRET, 42, 3, 9))))
    assert machine.on_all_clients_message(b"-8 RESUMED 1", 0.6) == []  # someone else's
    assert machine.on_all_clients_message(b"-7 RESUMED 4", 0.7) == [
        CloseAllClients(),
        ResumeDone(4),
    ]
    refused = ResumeMachine(session_id=42, secret=SECRET, counter=4, received=0)
    refused.start(0.0)
    refused.on_all_clients_connected(-7, 0.1)
    (*_, failed) = refused.on_all_clients_message(b"-7 ERROR resume refused", 0.2)
    assert isinstance(failed, Failed) and failed.failure.kind is FailureKind.REJECTED
    slow = ResumeMachine(session_id=42, secret=SECRET, counter=5, received=0, timeout=2.0)
    slow.start(0.0)
    assert slow.on_timer(1.9) == []
    (*_, failed) = slow.on_timer(2.0)
    assert isinstance(failed, Failed) and failed.failure.kind is FailureKind.TIMED_OUT
