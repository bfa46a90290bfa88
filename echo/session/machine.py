"""The client's handshake as a pure state machine: HELLO, CONNECT, join (the io7m Aeron guide §4.4).

Sans-I/O in the style of aioquic: the machine owns no sockets, tasks or clock. The driver
(`echo.session.client.connect`) feeds it what the transport reports, each with ``now``, and
executes the returned actions in order:

=====================  ===================================================================
action                 what the driver does
=====================  ===================================================================
`OpenAllClients`       open the all-clients subscription (``control=<server>:<control port>|
                       control-mode=dynamic``) and publication (``endpoint=<server>:<port>``);
                       once both are connected: ``on_all_clients_connected(pub.session_id)``
`SendHello` (data)     send `data` on the all-clients publication
`CloseAllClients`      close the all-clients pub/sub (idempotent)
`OpenDuologue`         open the duologue pub/sub with the session id; once both are
                       connected: ``on_duologue_connected``
`Opened` (session id)  the handshake is done: hand the duologue to the application
`Failed` (failure)     close what is open and report `failure`
=====================  ===================================================================

Every wait is bounded by ``timeout``; ``next_deadline()`` says when ``on_timer`` is due.
Events that come late or twice are ignored (``[]``); calls only a driver bug explains raise
`LocalProtocolError`. The Echo client (`echo.client`) is this handshake followed by its
ECHO application (`echo.client.application`).

Pure module: no trio, no clock, no I/O.
"""

from __future__ import annotations

import enum
import math
from typing import Final, TypeAlias

import attrs

from echo.protocol import (
    ERROR_BAD_MESSAGE,
    INT32_MAX,
    INT32_MIN,
    RESERVED_SESSION_HIGH,
    RESERVED_SESSION_LOW,
    U32_MAX,
    AllClientsError,
    BadMessage,
    Connect,
    Hello,
    decrypt_session,
    format_message,
)
from echo.session.crypto import (
    ClientHandshake,
    HandshakeFailed,
    SessionKeys,
    Transcript,
    resume_secret,
)
from echo.session.keywire import ConnectKey, HelloKey, append_hello_key, split_connect_key
from echo.session.resume import (
    ResumableConnect,
    ResumableHello,
    Resume,
    Resumed,
    format_resumable_hello,
    format_resume,
    parse_server_reply_untrusted,
    resume_proof,
)

# Long server texts are cut in failure messages so a hostile server cannot flood a log line.
PREVIEW_CHARS: Final = 80


class LocalProtocolError(Exception):
    """The driver called the machine in a way no network behaviour can explain (a bug)."""


class HandshakeState(enum.Enum):
    IDLE = "idle"
    CONNECTING = "connecting"  # all-clients pub + sub opening
    AWAITING_CONNECT = "awaiting_connect"  # HELLO sent, waiting for our CONNECT / ERROR
    JOINING = "joining"  # duologue pub + sub opening
    OPEN = "open"  # handed to the application
    FAILED = "failed"


class FailureKind(enum.Enum):
    REJECTED = "rejected"  # the server answered ERROR on the all-clients channel
    TIMED_OUT = "timed_out"
    PROTOCOL = "protocol"  # a bad reply, or a session id outside the reserved range
    CONNECTION = "connection"  # a channel closed or a send gave up
    UNTRUSTED = "untrusted"  # the server did not prove the pinned key, or would not encrypt


@attrs.frozen
class Failure:
    kind: FailureKind
    message: str
    #: what the handshake was waiting for (TIMED_OUT, CONNECTION); the server's text (REJECTED)
    detail: str = ""
    #: the state the machine failed in (a `HandshakeState` or `ResumeState`), for programs
    phase: enum.Enum | None = None


@attrs.frozen
class OpenAllClients:
    pass


@attrs.frozen
class SendHello:
    data: bytes


@attrs.frozen
class CloseAllClients:
    pass


@attrs.frozen
class OpenDuologue:
    data_port: int
    control_port: int
    session_id: int


@attrs.frozen
class Opened:
    session_id: int
    data_port: int
    control_port: int
    #: the server's resume secret (None: this session cannot resume)
    resume_secret: int | None = None
    #: the session's keys (None: the session is in the clear)
    keys: SessionKeys | None = None


@attrs.frozen
class SendResume:
    data: bytes


@attrs.frozen
class ResumeDone:
    #: messages of our stream the server has read (we send the rest again)
    peer_received: int


@attrs.frozen
class Failed:
    failure: Failure


Action: TypeAlias = (
    OpenAllClients
    | SendHello
    | CloseAllClients
    | OpenDuologue
    | Opened
    | Failed
    | SendResume
    | ResumeDone
)

WAITING_FOR: Final = {
    HandshakeState.CONNECTING: "the all-clients channel to connect",
    HandshakeState.AWAITING_CONNECT: "CONNECT from the server",
    HandshakeState.JOINING: "the duologue to connect",
}


class HandshakeMachine:
    """One handshake: see the module docstring."""

    def __init__(
        self,
        *,
        pad: int,
        timeout: float = 10.0,
        credentials: bytes = b"",
        resume_pad: int | None = None,
        client_key: ClientHandshake | None = None,
    ) -> None:
        if isinstance(pad, bool) or not isinstance(pad, int) or not 0 <= pad <= U32_MAX:
            raise ValueError(f"pad must be a u32, got {pad!r}")
        _check_timeout(timeout)
        # Refused here, not after the all-clients channel connected: a local mistake.
        self._plain_hello = format_message(Hello(pad, credentials))
        #: with a resume pad, the HELLO says "+R" and the CONNECT may carry a resume secret
        self._resume_pad = resume_pad
        self._hello = (
            self._plain_hello
            if resume_pad is None
            else format_resumable_hello(ResumableHello(Hello(pad, credentials), resume_pad))
        )
        #: with a client key, every HELLO carries its public half and the CONNECT must prove
        #: the pinned server key (echo.session.keywire); never a fallback to the clear
        self._client_key = client_key
        if client_key is not None:
            tail = HelloKey(client_key.public)
            resumable = self._hello is not self._plain_hello
            self._plain_hello = append_hello_key(self._plain_hello, tail)
            self._hello = append_hello_key(self._hello, tail) if resumable else self._plain_hello
        self.keys: SessionKeys | None = None
        self.resume_secret: int | None = None
        self._pad = pad
        self._timeout = float(timeout)
        self._state = HandshakeState.IDLE
        self._deadline: float | None = None
        self._client_session: int | None = None
        self._prefix = b""
        self._connect: Connect | None = None
        self._session_id: int | None = None
        self.failure: Failure | None = None

    @property
    def state(self) -> HandshakeState:
        return self._state

    @property
    def timeout(self) -> float:
        return self._timeout

    @property
    def session_id(self) -> int | None:
        """The decrypted duologue session id, once the CONNECT arrived."""
        return self._session_id

    @property
    def client_session(self) -> int | None:
        return self._client_session

    def next_deadline(self) -> float | None:
        return self._deadline

    # ---- local inputs

    def start(self, now: float) -> list[Action]:
        if self._state is not HandshakeState.IDLE:
            raise LocalProtocolError(f"start() called twice (state {self._state.name})")
        self._state = HandshakeState.CONNECTING
        self._deadline = now + self._timeout
        return [OpenAllClients()]

    def on_timer(self, now: float) -> list[Action]:
        self._require_started("on_timer")
        state = self._state
        if state not in WAITING_FOR or self._deadline is None or now < self._deadline:
            return []
        waiting_for = WAITING_FOR[state]
        return self._fail(
            FailureKind.TIMED_OUT,
            f"timed out after {self._timeout} s waiting for {waiting_for}",
            waiting_for,
        )

    def on_send_failed(self, reason: str, now: float) -> list[Action]:
        self._require_started("on_send_failed")
        if self._state not in WAITING_FOR:
            return []
        return self._fail(
            FailureKind.CONNECTION, f"send failed: {reason}", WAITING_FOR[self._state]
        )

    # ---- all-clients channel

    def on_all_clients_connected(self, client_session: int, now: float) -> list[Action]:
        self._require_started("on_all_clients_connected")
        if self._state is not HandshakeState.CONNECTING:
            return []
        if (
            isinstance(client_session, bool)
            or not isinstance(client_session, int)
            or not INT32_MIN <= client_session <= INT32_MAX
        ):
            raise LocalProtocolError(f"client_session must be an int32, got {client_session!r}")
        self._client_session = client_session
        # Replies to every client share the channel; ours start with "<our session> " (guide §4.4).
        self._prefix = f"{client_session} ".encode()
        self._state = HandshakeState.AWAITING_CONNECT
        self._deadline = now + self._timeout
        return [SendHello(self._hello)]

    def on_all_clients_message(self, data: bytes, now: float) -> list[Action]:
        """A message on the all-clients subscription (bytes from the network, untrusted)."""
        self._require_started("on_all_clients_message")
        if self._state is not HandshakeState.AWAITING_CONNECT:
            return []
        if data[: len(self._prefix)] != self._prefix:
            return []  # a reply to another client: checked before parsing (N clients, N replies)
        split = split_connect_key(data)
        if isinstance(split, BadMessage):
            return self._fail(
                FailureKind.PROTOCOL, f"bad reply from the server ({split.reason}): {preview(data)}"
            )
        parsed = parse_server_reply_untrusted(split[0])
        connect_key = split[1]
        if connect_key is not None and self._client_key is None:
            return self._fail(
                FailureKind.PROTOCOL, f"a server key nobody asked for: {preview(data)}"
            )
        if isinstance(parsed, BadMessage | Resumed):
            reason = parsed.reason if isinstance(parsed, BadMessage) else "RESUMED to a HELLO"
            return self._fail(
                FailureKind.PROTOCOL, f"bad reply from the server ({reason}): {preview(data)}"
            )
        secret: int | None = None
        if isinstance(parsed, ResumableConnect):
            if self._resume_pad is None or self._hello is self._plain_hello:
                return self._fail(
                    FailureKind.PROTOCOL, f"a resume secret nobody asked for: {preview(data)}"
                )
            secret = parsed.encrypted_secret  # unpadded once the keys are known
            reply: Connect | AllClientsError = parsed.connect
        else:
            reply = parsed
        if reply.client_session != self._client_session:
            return []
        if isinstance(reply, AllClientsError):
            return self._on_refusal(reply, connect_key is not None, data, now)
        return self._on_connect(reply, secret, connect_key, now)

    def _on_refusal(
        self, reply: AllClientsError, keyed: bool, data: bytes, now: float
    ) -> list[Action]:
        """Our HELLO refused: the failure, or (a server without the resume extension) the
        HELLO again the Echo 2.0 way."""
        if keyed:
            return self._fail(FailureKind.PROTOCOL, f"a key on an ERROR: {preview(data)}")
        if reply.message == ERROR_BAD_MESSAGE and self._hello is not self._plain_hello:
            # A server without the resume extension (Echo 2.0's own, say) refuses the
            # "+R" HELLO as malformed: ask again the Echo 2.0 way, without resume.
            self._hello = self._plain_hello
            self._deadline = now + self._timeout
            return [SendHello(self._hello)]
        if reply.message == ERROR_BAD_MESSAGE and self._client_key is not None:
            # Echo 2.0's own server (or one before encryption) cannot read the key.
            detail = f"{ERROR_BAD_MESSAGE} (the server may not support encryption)"
            return self._fail(FailureKind.REJECTED, detail, reply.message)
        return self._fail(FailureKind.REJECTED, reply.message, reply.message)

    def _on_connect(
        self, reply: Connect, secret: int | None, connect_key: ConnectKey | None, now: float
    ) -> list[Action]:
        """Our CONNECT: check the duologue's session id (and the server's key), then join."""
        session = decrypt_session(reply.encrypted_session, self._pad)
        if not RESERVED_SESSION_LOW <= session <= RESERVED_SESSION_HIGH:
            # Duologue ids come from the reserved range; anything else would collide with the
            # transport's automatic session ids (the guide §4.5).
            return self._fail(
                FailureKind.PROTOCOL,
                f"server assigned duologue session {session}, outside the reserved range "
                f"{RESERVED_SESSION_LOW}..{RESERVED_SESSION_HIGH}",
            )
        if self._client_key is not None:
            failed = self._agree(reply, session, connect_key)
            if failed:
                return failed
        self._connect = reply
        self._session_id = session
        self.resume_secret = None if secret is None else self._secret_of(secret)
        self._state = HandshakeState.JOINING
        self._deadline = now + self._timeout
        return [CloseAllClients(), OpenDuologue(reply.data_port, reply.control_port, session)]

    def on_all_clients_closed(self, now: float) -> list[Action]:
        self._require_started("on_all_clients_closed")
        if self._state not in (HandshakeState.CONNECTING, HandshakeState.AWAITING_CONNECT):
            return []
        waiting_for = WAITING_FOR[self._state]
        return self._fail(
            FailureKind.CONNECTION,
            f"the all-clients channel closed while waiting for {waiting_for}",
            waiting_for,
        )

    # ---- duologue

    def on_duologue_connected(self, now: float) -> list[Action]:
        self._require_started("on_duologue_connected")
        if self._state is not HandshakeState.JOINING:
            return []
        assert self._connect is not None and self._session_id is not None
        self._state = HandshakeState.OPEN
        self._deadline = None
        return [
            Opened(
                self._session_id,
                self._connect.data_port,
                self._connect.control_port,
                self.resume_secret,
                self.keys,
            )
        ]

    def _agree(self, reply: Connect, session: int, key: ConnectKey | None) -> list[Action] | None:
        """Check the CONNECT's key tail against the pin and derive the keys; None if good,
        else the failure (a CONNECT without a tail is a server that would talk in the clear)."""
        assert self._client_key is not None and self._client_session is not None
        if not isinstance(key, ConnectKey):
            return self._fail(
                FailureKind.UNTRUSTED,
                "the server answered without encryption; a pinned server key needs a server "
                "with --encryption optional or required",
                "no encryption",
            )
        transcript = Transcript(
            client_public=self._client_key.public,
            server_public=key.server_public,
            server_nonce=key.server_nonce,
            hello_key=self._pad,
            client_session=self._client_session,
            session_id=session,
            data_port=reply.data_port,
            control_port=reply.control_port,
        )
        try:
            self.keys = self._client_key.complete(transcript, key.tag)
        except HandshakeFailed as error:
            return self._fail(FailureKind.UNTRUSTED, f"server key refused: {error}", str(error))
        return None

    def _secret_of(self, padded: int) -> int:
        """The resume secret: from the keys when encrypted (the CONNECT's field is noise)."""
        assert self._resume_pad is not None
        return padded ^ self._resume_pad if self.keys is None else resume_secret(self.keys)

    def on_duologue_closed(self, now: float) -> list[Action]:
        self._require_started("on_duologue_closed")
        if self._state is not HandshakeState.JOINING:
            return []  # once open, a closed duologue is the session's business
        return self._fail(
            FailureKind.CONNECTION,
            "the duologue closed before it connected",
            WAITING_FOR[HandshakeState.JOINING],
        )

    # ---- internals

    def _fail(self, kind: FailureKind, message: str, detail: str = "") -> list[Action]:
        closes: list[Action] = []
        if self._state in (HandshakeState.CONNECTING, HandshakeState.AWAITING_CONNECT):
            closes.append(CloseAllClients())
        self.failure = Failure(kind, message, detail, self._state)
        self._state = HandshakeState.FAILED
        self._deadline = None
        return [*closes, Failed(self.failure)]

    def _require_started(self, method: str) -> None:
        if self._state is HandshakeState.IDLE:
            raise LocalProtocolError(f"{method}() called before start()")


def preview(data: bytes | bytearray | memoryview) -> str:
    raw = bytes(data[: PREVIEW_CHARS + 1])
    text = raw[:PREVIEW_CHARS].decode("utf-8", "backslashreplace")
    return repr(text) + ("..." if len(raw) > PREVIEW_CHARS else "")


def _check_timeout(timeout: float) -> None:
    if not (isinstance(timeout, int | float) and math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")


class ResumeState(enum.Enum):
    IDLE = "idle"
    CONNECTING = "connecting"  # a fresh all-clients pub + sub opening (from the new path)
    AWAITING_RESUMED = "awaiting_resumed"  # RESUME sent
    DONE = "done"
    FAILED = "failed"


RESUME_WAITING_FOR: Final = {
    ResumeState.CONNECTING: "the all-clients channel to connect",
    ResumeState.AWAITING_RESUMED: "RESUMED from the server",
}


class ResumeMachine:
    """One attempt to take an open session to a new path (see `echo.session.resume`).

    Driven like `HandshakeMachine`: `OpenAllClients`, then `SendResume` once connected, then
    `CloseAllClients` and `ResumeDone` on the server's RESUMED, or `Failed` (REJECTED: the
    server refused; TIMED_OUT; CONNECTION). `counter` must grow from attempt to attempt (the
    server accepts each value once); the driver keeps it.
    """

    def __init__(
        self,
        *,
        session_id: int,
        secret: int,
        counter: int,
        received: int,
        timeout: float = 10.0,
    ) -> None:
        _check_timeout(timeout)
        proof = resume_proof(secret, session_id, counter, received)
        self._request = format_resume(Resume(session_id, counter, received, proof))
        self._timeout = float(timeout)
        self._state = ResumeState.IDLE
        self._deadline: float | None = None
        self._client_session: int | None = None
        self._prefix = b""
        self.failure: Failure | None = None

    @property
    def state(self) -> ResumeState:
        return self._state

    @property
    def timeout(self) -> float:
        return self._timeout

    def next_deadline(self) -> float | None:
        return self._deadline

    def start(self, now: float) -> list[Action]:
        if self._state is not ResumeState.IDLE:
            raise LocalProtocolError("start() called twice")
        self._state = ResumeState.CONNECTING
        self._deadline = now + self._timeout
        return [OpenAllClients()]

    def on_timer(self, now: float) -> list[Action]:
        if self._state not in RESUME_WAITING_FOR or self._deadline is None or now < self._deadline:
            return []
        waiting_for = RESUME_WAITING_FOR[self._state]
        return self._fail(
            FailureKind.TIMED_OUT,
            f"timed out after {self._timeout} s waiting for {waiting_for}",
            waiting_for,
        )

    def on_send_failed(self, reason: str, now: float) -> list[Action]:
        if self._state not in RESUME_WAITING_FOR:
            return []
        waiting_for = RESUME_WAITING_FOR[self._state]
        return self._fail(FailureKind.CONNECTION, f"send failed: {reason}", waiting_for)

    def on_all_clients_connected(self, client_session: int, now: float) -> list[Action]:
        if self._state is not ResumeState.CONNECTING:
            return []
        self._client_session = client_session
        self._prefix = f"{client_session} ".encode()
        self._state = ResumeState.AWAITING_RESUMED
        self._deadline = now + self._timeout
        return [SendResume(self._request)]

    def on_all_clients_message(self, data: bytes, now: float) -> list[Action]:
        """A message on the all-clients subscription (untrusted)."""
        if self._state is not ResumeState.AWAITING_RESUMED:
            return []
        if data[: len(self._prefix)] != self._prefix:
            return []  # another client's reply
        reply = parse_server_reply_untrusted(data)
        if isinstance(reply, Resumed) and reply.client_session == self._client_session:
            self._state = ResumeState.DONE
            self._deadline = None
            return [CloseAllClients(), ResumeDone(reply.received)]
        if isinstance(reply, AllClientsError) and reply.client_session == self._client_session:
            return self._fail(FailureKind.REJECTED, reply.message, reply.message)
        if isinstance(reply, BadMessage):
            return self._fail(
                FailureKind.PROTOCOL, f"bad reply from the server ({reply.reason}): {preview(data)}"
            )
        return self._fail(FailureKind.PROTOCOL, f"not a reply to RESUME: {preview(data)}")

    def on_all_clients_closed(self, now: float) -> list[Action]:
        if self._state not in RESUME_WAITING_FOR:
            return []
        waiting_for = RESUME_WAITING_FOR[self._state]
        return self._fail(
            FailureKind.CONNECTION,
            f"the all-clients channel closed while waiting for {waiting_for}",
            waiting_for,
        )

    def _fail(self, kind: FailureKind, message: str, detail: str = "") -> list[Action]:
        closes: list[Action] = []
        if self._state in RESUME_WAITING_FOR:
            closes.append(CloseAllClients())
        self.failure = Failure(kind, message, detail, self._state)
        self._state = ResumeState.FAILED
        self._deadline = None
        return [*closes, Failed(self.failure)]
