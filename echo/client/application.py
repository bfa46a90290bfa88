"""The ECHO application, client side, as a pure state machine (the io7m guide §4.4, "The client").

`echo-client` is this application on a session of `echo.session.connect()`: the session library
runs the handshake (HELLO, CONNECT, the duologue) and hands over a `Session`; this machine
decides what to send on it and what the replies mean. The driver (`echo.client.client`) feeds
it, each with ``now`` (seconds, from ``trio.current_time()``), what the session library reports,
and executes the returned actions **in list order**:

=====================  =======================================================================
action                 what the driver does
=====================  =======================================================================
`SendEcho` (data)      ``session.send(data)``
`EchoReceived`         report only (print the round trip); nothing to send
`Stop`                 the run is over: leave the session (its stream ends). ``state`` is
                       CLOSED or FAILED; ``failure`` says why (`exit_code` for the CLI)
=====================  =======================================================================

Inputs: ``on_handshake_step`` as `connect(on_step=...)` reports the handshake's progress (the
state only mirrors it), ``on_handshake_failed`` with `failure_of(error)` if `connect` raised,
``on_open`` once the session is open, ``on_message`` for each message `receive` returns,
``on_closed`` with `close_cause(error)` if a send or receive raised `SessionClosed`, and
``on_timer`` when ``next_deadline()`` passed. Ctrl-C -> ``stop(now)``.

Echo messages are numbered from 1; ``message_factory(i)`` gives the text of message ``i``. One
echo is outstanding at a time; echoes are sent on a fixed cadence, ``interval`` seconds after
the previous one was *sent*, or as soon as its reply arrives when that took longer than
``interval`` (immediately when ``interval == 0``), as ``ping -i`` and a game's tick do. A cadence
clocked by the reply instead (the next ``interval`` after the reply) lets a server's slow moment
gather clients into step: every client answered late sends late next time, together, and the
bursts grow (B4: CHANGELOG.md). Waiting for a reply is bounded by ``timeout``.

Events that come late (a message after the end, a second open) are ignored and return ``[]``;
calls only a driver bug explains (a message before the session opened) raise
`LocalProtocolError`.

Pure module: no trio, no clock, no I/O.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from typing import Final, TypeAlias

import attrs

from echo.protocol import (
    DuologueError,
    Echo,
    format_message,
    parse_duologue_reply_untrusted,
)
from echo.session.machine import FailureKind, HandshakeState, LocalProtocolError, preview
from echo.session.session import (
    HandshakeTimeout,
    LostContact,
    PeerClosed,
    ProtocolViolation,
    Rejected,
    SendFailed,
    SessionClosed,
    SessionError,
    Untrusted,
)

__all__ = [
    "Action",
    "ClientState",
    "CloseCause",
    "EchoMachine",
    "EchoReceived",
    "Failure",
    "FailureKind",
    "LocalProtocolError",
    "SendEcho",
    "Stop",
    "close_cause",
    "exit_code",
    "failure_of",
]

_PREVIEW_CHARS: Final = 80


class ClientState(enum.Enum):
    IDLE = "idle"  # constructed, the handshake not started
    CONNECTING = "connecting"  # all-clients pub + sub opening
    AWAITING_CONNECT = "awaiting_connect"  # HELLO sent, waiting for our CONNECT / ERROR
    JOINING_DUOLOGUE = "joining_duologue"  # duologue pub + sub opening
    ECHOING = "echoing"
    CLOSED = "closed"  # finished normally: count reached or stop()
    FAILED = "failed"  # see `failure`


_FROM_HANDSHAKE: Final = {
    HandshakeState.CONNECTING: ClientState.CONNECTING,
    HandshakeState.AWAITING_CONNECT: ClientState.AWAITING_CONNECT,
    HandshakeState.JOINING: ClientState.JOINING_DUOLOGUE,
}
_HANDSHAKING: Final = frozenset(
    {ClientState.IDLE, ClientState.CONNECTING, ClientState.AWAITING_CONNECT}
    | {ClientState.JOINING_DUOLOGUE}
)
_FINISHED: Final = frozenset({ClientState.CLOSED, ClientState.FAILED})

#: `echo-client`'s own exit statuses (0, 1 and 2 mean what they mean for every echo CLI:
#: done, a runtime failure such as no server answering, a bad command line)
_EXIT_CODES: Final = {
    FailureKind.TIMED_OUT: 3,
    FailureKind.PROTOCOL: 4,
    FailureKind.CONNECTION: 4,
    FailureKind.REJECTED: 5,
    FailureKind.UNTRUSTED: 6,
}
#: nobody answered at all: the runtime failure every echo CLI exits 1 for
NO_ANSWER_EXIT_CODE: Final = 1


def exit_code(kind: FailureKind) -> int:
    """The `echo-client` exit status for this kind of failure (see `Failure.exit_code`)."""
    return _EXIT_CODES[kind]


@attrs.frozen
class Failure:
    kind: FailureKind
    message: str
    #: the handshake state a handshake failure happened in (None: after the session opened)
    phase: HandshakeState | None = None

    @property
    def no_answer(self) -> bool:
        """The all-clients channel never connected: no server answered at that address."""
        return self.kind is FailureKind.TIMED_OUT and self.phase is HandshakeState.CONNECTING

    @property
    def exit_code(self) -> int:
        return NO_ANSWER_EXIT_CODE if self.no_answer else exit_code(self.kind)


class CloseCause(enum.Enum):
    """Why the session closed under the application (from the exception `SessionClosed`)."""

    PEER_ERROR = "peer_error"  # the server's ERROR <reason> (PeerClosed)
    LOST_CONTACT = "lost_contact"  # nothing heard for the liveness / connection timeout
    SEND_FAILED = "send_failed"  # a send gave up (SendFailed)
    CLOSED = "closed"  # the server ended the stream


def close_cause(error: SessionClosed) -> tuple[CloseCause, str]:
    """The cause of a session's close and its detail (the server's reason, the send error)."""
    if isinstance(error, PeerClosed):
        return CloseCause.PEER_ERROR, error.reason
    if isinstance(error, LostContact):
        return CloseCause.LOST_CONTACT, error.reason
    if isinstance(error, SendFailed):
        return CloseCause.SEND_FAILED, error.error_name
    return CloseCause.CLOSED, error.reason


def failure_of(error: SessionError) -> Failure:
    """What a failed `connect` means to the client, from the session library's exception."""
    if isinstance(error, Rejected):
        return Failure(FailureKind.REJECTED, error.reason)
    if isinstance(error, HandshakeTimeout):
        phase = error.phase if isinstance(error.phase, HandshakeState) else None
        return Failure(FailureKind.TIMED_OUT, str(error), phase)
    if isinstance(error, ProtocolViolation):
        return Failure(FailureKind.PROTOCOL, str(error))
    if isinstance(error, Untrusted):
        return Failure(FailureKind.UNTRUSTED, str(error))
    # LostContact (the all-clients channel went away, a HELLO that could not be sent) and
    # anything else the library may add.
    return Failure(FailureKind.CONNECTION, str(error))


# ---- actions ---------------------------------------------------------------------------------


@attrs.frozen
class SendEcho:
    index: int
    data: bytes


@attrs.frozen
class EchoReceived:
    index: int
    text: str
    rtt: float  # seconds between the SendEcho and the reply


@attrs.frozen
class Stop:
    pass


Action: TypeAlias = SendEcho | EchoReceived | Stop


@attrs.define
class _Outstanding:
    index: int
    text: str
    sent_at: float


class EchoMachine:
    """One `echo-client` run: the handshake's outcome, then echoes. See the module docstring."""

    def __init__(
        self,
        *,
        message_factory: Callable[[int], str],
        timeout: float = 10.0,
        count: int | None = None,
        interval: float = 1.0,
    ) -> None:
        if not (math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if not (math.isfinite(interval) and interval >= 0):
            raise ValueError(f"interval must be >= 0 seconds, got {interval!r}")
        if count is not None and (isinstance(count, bool) or count < 0):
            raise ValueError(f"count must be >= 0 or None, got {count!r}")
        self._timeout = float(timeout)
        self._count = count
        self._interval = float(interval)
        self._factory = message_factory

        self._state = ClientState.IDLE
        self._failure: Failure | None = None
        self._deadline: float | None = None  # the outstanding echo's timeout
        self._next_send_at: float | None = None  # between a reply and the next send
        self._outstanding: _Outstanding | None = None
        self._client_session: int | None = None
        self._duologue_session: int | None = None
        self._sent = 0
        self._received = 0
        self._rtts: list[float] = []

    # ---- read-only view ------------------------------------------------------------------

    @property
    def state(self) -> ClientState:
        return self._state

    @property
    def failure(self) -> Failure | None:
        return self._failure

    @property
    def finished(self) -> bool:
        return self._state in _FINISHED

    @property
    def sent(self) -> int:
        """Echo messages sent."""
        return self._sent

    @property
    def received(self) -> int:
        """Echo replies received (and matched)."""
        return self._received

    @property
    def rtts(self) -> list[float]:
        """Round-trip time of every received echo, seconds, in order (a copy)."""
        return list(self._rtts)

    @property
    def client_session(self) -> int | None:
        """Our all-clients publication's session id, once the HELLO went out."""
        return self._client_session

    @property
    def duologue_session(self) -> int | None:
        """The duologue's session id, once the server assigned it."""
        return self._duologue_session

    def next_deadline(self) -> float | None:
        """When `on_timer` must next be called; None when no timer is pending."""
        if self._state is ClientState.ECHOING and self._outstanding is None:
            return self._next_send_at
        return self._deadline

    # ---- the handshake (run by the session library) --------------------------------------

    def on_handshake_step(
        self,
        state: HandshakeState,
        *,
        client_session: int | None = None,
        session_id: int | None = None,
    ) -> None:
        """The handshake got to `state` (connect's `on_step`): mirrored in `state`."""
        if self._state not in _HANDSHAKING or state not in _FROM_HANDSHAKE:
            return
        self._state = _FROM_HANDSHAKE[state]
        if client_session is not None:
            self._client_session = client_session
        if session_id is not None:
            self._duologue_session = session_id

    def on_handshake_failed(self, failure: Failure, now: float) -> list[Action]:
        if self._state not in _HANDSHAKING:
            return []
        return self._fail(failure)

    def on_open(self, session_id: int, now: float) -> list[Action]:
        """The session is open: echo on it."""
        if self._state not in _HANDSHAKING:
            return []  # stopped meanwhile, or a second open
        self._duologue_session = session_id
        self._state = ClientState.ECHOING
        if self._count == 0:
            return self._close_normally()
        return self._send_next(now)

    # ---- local inputs --------------------------------------------------------------------

    def stop(self, now: float) -> list[Action]:
        """User interrupt: finish as CLOSED (no-op once finished)."""
        if self._state in _FINISHED:
            return []
        return self._close_normally()

    def on_timer(self, now: float) -> list[Action]:
        if self._state is not ClientState.ECHOING:
            return []
        if self._outstanding is None:
            if self._next_send_at is not None and now >= self._next_send_at:
                return self._send_next(now)
            return []
        if self._deadline is not None and now >= self._deadline:
            return self._fail(
                Failure(
                    FailureKind.TIMED_OUT,
                    f"timed out after {self._timeout} s waiting for the echo of message "
                    f"{self._outstanding.index}",
                )
            )
        return []

    # ---- the session ---------------------------------------------------------------------

    def on_message(self, data: bytes, now: float) -> list[Action]:
        """A message from the server (bytes from the network, untrusted)."""
        self._require_open("on_message")
        if self._state in _FINISHED:
            return []
        reply = parse_duologue_reply_untrusted(data)
        if not isinstance(reply, Echo):
            if isinstance(reply, DuologueError):
                # (The session takes "ERROR <reason>" itself, as PeerClosed; a bare "ERROR"
                # reaches us.)
                return self._on_server_error(reply.message)
            return self._fail(
                Failure(
                    FailureKind.PROTOCOL,
                    f"bad message from the server ({reply.reason}): {preview(data)}",
                )
            )
        outstanding = self._outstanding
        if outstanding is None:
            # The stream is reliable and ordered, so an echo nobody asked for is the server's bug.
            return self._fail(
                Failure(
                    FailureKind.PROTOCOL,
                    f"unexpected echo {_preview_text(reply.text)} with no message outstanding",
                )
            )
        if reply.text != outstanding.text:
            return self._fail(
                Failure(
                    FailureKind.PROTOCOL,
                    f"echo {_preview_text(reply.text)} does not match message "
                    f"{outstanding.index} {_preview_text(outstanding.text)}",
                )
            )
        rtt = now - outstanding.sent_at
        self._outstanding = None
        self._deadline = None
        self._received += 1
        self._rtts.append(rtt)
        actions: list[Action] = [EchoReceived(outstanding.index, outstanding.text, rtt)]
        if self._count is not None and self._received >= self._count:
            actions += self._close_normally()
        elif self._interval == 0:
            actions += self._send_next(now)
        else:
            # The cadence is the send's, not the reply's (module docstring).
            self._next_send_at = max(now, outstanding.sent_at + self._interval)
        return actions

    def on_closed(self, cause: CloseCause, detail: str, now: float) -> list[Action]:
        """The session closed under us (a send or receive raised SessionClosed)."""
        self._require_open("on_closed")
        if self._state in _FINISHED:
            return []
        if cause is CloseCause.PEER_ERROR:
            return self._on_server_error(detail)
        if cause is CloseCause.LOST_CONTACT:
            message = "lost contact with the server (nothing received for the liveness timeout)"
        elif cause is CloseCause.SEND_FAILED:
            message = f"send failed: could not send to the server ({detail})"
        else:
            message = "server closed the duologue"
        return self._fail(Failure(FailureKind.CONNECTION, message))

    # ---- internals -----------------------------------------------------------------------

    def _on_server_error(self, text: str) -> list[Action]:
        return self._fail(Failure(FailureKind.PROTOCOL, f"server error: {text}"))

    def _send_next(self, now: float) -> list[Action]:
        index = self._sent + 1
        text = self._factory(index)
        # Raises ValueError for text the protocol cannot carry: the factory is local code.
        data = format_message(Echo(text))
        self._sent = index
        self._outstanding = _Outstanding(index, text, now)
        self._next_send_at = None
        self._deadline = now + self._timeout
        return [SendEcho(index, data)]

    def _close_normally(self) -> list[Action]:
        self._finish(ClientState.CLOSED)
        return [Stop()]

    def _fail(self, failure: Failure) -> list[Action]:
        self._failure = failure
        self._finish(ClientState.FAILED)
        return [Stop()]

    def _finish(self, state: ClientState) -> None:
        self._state = state
        self._deadline = None
        self._next_send_at = None
        self._outstanding = None

    def _require_open(self, method: str) -> None:
        if self._state in _HANDSHAKING:
            raise LocalProtocolError(f"{method}() called before the session opened")


def _preview_text(text: str) -> str:
    if len(text) > _PREVIEW_CHARS:
        return repr(text[:_PREVIEW_CHARS]) + "..."
    return repr(text)
