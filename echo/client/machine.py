"""The Echo 2.0 client as a pure state machine (seed 000 §4.4 "The client", reference §7.8).

Sans-I/O in the style of aioquic's ``QuicConnection``: the machine owns no sockets, tasks or
clock. A driver (the trio client) feeds it events, each carrying ``now`` (seconds, from
``trio.current_time()``), and executes the returned actions **in list order**.

Driver contract
---------------
Call ``start(now)`` once, then loop: sleep until ``next_deadline()`` (``None`` = no timer) or
the next transport event, whichever is first; on wake-up call ``on_timer(now)`` and/or the
matching ``on_*`` method, and execute the actions. Stop the loop after executing a `Stop`.

==========================  ============================================================
action                      what the driver does
==========================  ============================================================
`OpenAllClients`            open the all-clients subscription (``control=<server>:<control
                            port>|control-mode=dynamic``) and publication (``endpoint=
                            <server>:<port>``); when *both* are connected call
                            ``on_all_clients_connected(pub.session_id, now)``
`SendHello` (data)          send `data` on the all-clients publication
`CloseAllClients`           close whatever of the all-clients pub/sub is open (idempotent)
`OpenDuologue` (ports, id)  open the duologue subscription (``control=<server>:
                            <control_port>|control-mode=dynamic|session-id=<id>``) and
                            publication (``endpoint=<server>:<data_port>|session-id=<id>``);
                            when both are connected call ``on_duologue_connected(now)``
`SendEcho` (index, data)    send `data` on the duologue publication
`EchoReceived`              report only (print / log the round trip); nothing to send
`CloseDuologue`             close whatever of the duologue pub/sub is open (idempotent)
`Stop`                      the run is over: leave the loop. ``state`` is CLOSED or FAILED;
                            ``failure`` says why (``failure.kind.exit_code`` for the CLI)
==========================  ============================================================

Inputs from the transport: every message on the all-clients subscription goes to
``on_all_clients_message``, every message on the duologue subscription to
``on_duologue_message``; losing the all-clients image or publication before the CONNECT
arrives -> ``on_all_clients_closed``; losing the duologue image or publication ->
``on_duologue_closed``; a send that gives up (e.g. ``SendError``) -> ``on_send_failed``.
Ctrl-C -> ``stop(now)``.

Events that can come from the network late or out of order (a message after we moved on, a
second "connected", a close after we finished) are ignored and return ``[]``. Calls that can
only be a driver bug (any event before ``start``, ``start`` twice, a duologue event before
`OpenDuologue` was issued) raise `LocalProtocolError`.

Echo messages are numbered from 1; ``message_factory(i)`` gives the text of message ``i``.
One echo is outstanding at a time; the next is sent ``interval`` seconds after the previous
reply arrives (immediately when ``interval == 0``). Every wait is bounded by ``timeout``.

Pure module: no trio, no clock, no I/O.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from typing import Final, TypeAlias

import attrs

from echo.protocol import (
    INT32_MAX,
    INT32_MIN,
    RESERVED_SESSION_HIGH,
    RESERVED_SESSION_LOW,
    U32_MAX,
    AllClientsError,
    BadMessage,
    Connect,
    DuologueError,
    Echo,
    Hello,
    decrypt_session,
    format_message,
    parse_all_clients_reply_untrusted,
    parse_duologue_reply_untrusted,
)

# Long server texts are cut in failure messages so a hostile server cannot flood the log line.
_PREVIEW_CHARS: Final = 80


class LocalProtocolError(Exception):
    """The driver called the machine in a way no network behaviour can explain (a bug)."""


class ClientState(enum.Enum):
    IDLE = "idle"  # constructed, start() not called yet
    CONNECTING = "connecting"  # all-clients pub + sub opening
    AWAITING_CONNECT = "awaiting_connect"  # HELLO sent, waiting for our CONNECT / ERROR
    JOINING_DUOLOGUE = "joining_duologue"  # duologue pub + sub opening
    ECHOING = "echoing"
    CLOSED = "closed"  # finished normally: count reached or stop()
    FAILED = "failed"  # see `failure`


class FailureKind(enum.Enum):
    REJECTED = "rejected"  # the server answered ERROR on the all-clients channel
    TIMED_OUT = "timed_out"
    PROTOCOL = "protocol"  # bad / unexpected message, or ERROR on the duologue
    CONNECTION = "connection"  # a channel closed or a send gave up

    @property
    def exit_code(self) -> int:
        """The `echo-client` exit status for this kind of failure."""
        return _EXIT_CODES[self]


_EXIT_CODES: Final = {
    FailureKind.REJECTED: 2,
    FailureKind.TIMED_OUT: 3,
    FailureKind.PROTOCOL: 4,
    FailureKind.CONNECTION: 4,
}


@attrs.frozen
class Failure:
    kind: FailureKind
    message: str


# ---- actions ---------------------------------------------------------------------------------


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
    session_id: int  # already decrypted with the pad


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
class CloseDuologue:
    pass


@attrs.frozen
class Stop:
    pass


Action: TypeAlias = (
    OpenAllClients
    | SendHello
    | CloseAllClients
    | OpenDuologue
    | SendEcho
    | EchoReceived
    | CloseDuologue
    | Stop
)

_FINISHED: Final = frozenset({ClientState.CLOSED, ClientState.FAILED})
_WAITING_FOR: Final = {
    ClientState.CONNECTING: "the all-clients channel to connect",
    ClientState.AWAITING_CONNECT: "CONNECT from the server",
    ClientState.JOINING_DUOLOGUE: "the duologue to connect",
}


@attrs.define
class _Outstanding:
    index: int
    text: str
    sent_at: float


class ClientMachine:
    """One Echo 2.0 client run: HELLO, CONNECT, duologue, echoes. See the module docstring."""

    def __init__(
        self,
        *,
        pad: int,
        message_factory: Callable[[int], str],
        timeout: float = 10.0,
        count: int | None = None,
        interval: float = 1.0,
    ) -> None:
        if isinstance(pad, bool) or not isinstance(pad, int) or not 0 <= pad <= U32_MAX:
            raise ValueError(f"pad must be a u32, got {pad!r}")
        if not (math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if not (math.isfinite(interval) and interval >= 0):
            raise ValueError(f"interval must be >= 0 seconds, got {interval!r}")
        if count is not None and (isinstance(count, bool) or count < 0):
            raise ValueError(f"count must be >= 0 or None, got {count!r}")
        self._pad = pad
        self._timeout = float(timeout)
        self._count = count
        self._interval = float(interval)
        self._factory = message_factory

        self._state = ClientState.IDLE
        self._failure: Failure | None = None
        self._deadline: float | None = None  # timeout of the current wait
        self._next_send_at: float | None = None  # ECHOING, between a reply and the next send
        self._outstanding: _Outstanding | None = None
        self._client_session: int | None = None
        self._session_prefix = b""
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
        """Our all-clients publication's session id, once connected."""
        return self._client_session

    @property
    def duologue_session(self) -> int | None:
        """The decrypted duologue session id, once the CONNECT arrived."""
        return self._duologue_session

    def next_deadline(self) -> float | None:
        """When `on_timer` must next be called; None when no timer is pending."""
        if self._state is ClientState.ECHOING and self._outstanding is None:
            return self._next_send_at
        return self._deadline

    # ---- local inputs --------------------------------------------------------------------

    def start(self, now: float) -> list[Action]:
        if self._state is not ClientState.IDLE:
            raise LocalProtocolError(f"start() called twice (state {self._state.name})")
        self._state = ClientState.CONNECTING
        self._deadline = now + self._timeout
        return [OpenAllClients()]

    def stop(self, now: float) -> list[Action]:
        """User interrupt: close what is open and finish as CLOSED (no-op once finished)."""
        if self._state in _FINISHED:
            return []
        closes = self._closes()
        self._finish(ClientState.CLOSED)
        return [*closes, Stop()]

    def on_timer(self, now: float) -> list[Action]:
        self._require_started("on_timer")
        state = self._state
        if state in _FINISHED:
            return []
        if state is ClientState.ECHOING:
            if self._outstanding is None:
                if self._next_send_at is not None and now >= self._next_send_at:
                    return self._send_next(now)
                return []
            if self._deadline is not None and now >= self._deadline:
                return self._fail(
                    FailureKind.TIMED_OUT,
                    f"timed out after {self._timeout} s waiting for the echo of message "
                    f"{self._outstanding.index}",
                )
            return []
        if self._deadline is not None and now >= self._deadline:
            return self._fail(
                FailureKind.TIMED_OUT,
                f"timed out after {self._timeout} s waiting for {_WAITING_FOR[state]}",
            )
        return []

    def on_send_failed(self, reason: str, now: float) -> list[Action]:
        self._require_started("on_send_failed")
        if self._state in _FINISHED:
            return []
        return self._fail(FailureKind.CONNECTION, f"send failed: {reason}")

    # ---- all-clients channel -------------------------------------------------------------

    def on_all_clients_connected(self, client_session: int, now: float) -> list[Action]:
        """Both all-clients publication and subscription are connected."""
        self._require_started("on_all_clients_connected")
        if self._state is not ClientState.CONNECTING:
            return []  # a reconnect notice after we moved on
        if (
            isinstance(client_session, bool)
            or not isinstance(client_session, int)
            or not INT32_MIN <= client_session <= INT32_MAX
        ):
            raise LocalProtocolError(f"client_session must be an int32, got {client_session!r}")
        self._client_session = client_session
        # Replies to every client share the channel; ours start with "<our session> " (§4.4).
        self._session_prefix = f"{client_session} ".encode()
        self._state = ClientState.AWAITING_CONNECT
        self._deadline = now + self._timeout
        return [SendHello(format_message(Hello(self._pad)))]

    def on_all_clients_message(self, data: bytes, now: float) -> list[Action]:
        """A message on the all-clients subscription (bytes from the network, untrusted)."""
        self._require_started("on_all_clients_message")
        if self._state is not ClientState.AWAITING_CONNECT:
            return []  # replies to others, or late ones after we left the channel
        prefix = self._session_prefix
        if data[: len(prefix)] != prefix:
            # Not addressed to us: a reply to another client (ours starts "<our session> ",
            # and the grammar allows one spelling of a number), or unreadable and then another
            # client's problem. Checked before parsing: while N clients say HELLO at once,
            # each of them sees all N replies.
            return []
        reply = parse_all_clients_reply_untrusted(data)
        if isinstance(reply, BadMessage):
            return self._fail(
                FailureKind.PROTOCOL,
                f"bad reply from the server ({reply.reason}): {_preview(data)}",
            )
        if reply.client_session != self._client_session:
            return []
        if isinstance(reply, AllClientsError):
            return self._fail(FailureKind.REJECTED, reply.message)
        assert isinstance(reply, Connect)
        session = decrypt_session(reply.encrypted_session, self._pad)
        if not RESERVED_SESSION_LOW <= session <= RESERVED_SESSION_HIGH:
            # Duologue ids come from the reserved range; anything else would collide with the
            # transport's automatic session ids (seed §4.5).
            return self._fail(
                FailureKind.PROTOCOL,
                f"server assigned duologue session {session}, outside the reserved range "
                f"{RESERVED_SESSION_LOW}..{RESERVED_SESSION_HIGH}",
            )
        self._duologue_session = session
        self._state = ClientState.JOINING_DUOLOGUE
        self._deadline = now + self._timeout
        return [
            CloseAllClients(),
            OpenDuologue(reply.data_port, reply.control_port, session),
        ]

    def on_all_clients_closed(self, now: float, *, timed_out: bool = False) -> list[Action]:
        """The all-clients channel went away (image or publication lost)."""
        self._require_started("on_all_clients_closed")
        if self._state not in (ClientState.CONNECTING, ClientState.AWAITING_CONNECT):
            return []  # we closed it ourselves after the CONNECT, or we are done
        return self._fail(
            FailureKind.CONNECTION,
            f"the all-clients channel closed while waiting for {_WAITING_FOR[self._state]}",
        )

    # ---- duologue ------------------------------------------------------------------------

    def on_duologue_connected(self, now: float) -> list[Action]:
        """Both duologue publication and subscription are connected."""
        self._require_duologue("on_duologue_connected")
        if self._state is not ClientState.JOINING_DUOLOGUE:
            return []
        self._state = ClientState.ECHOING
        self._deadline = None
        if self._count == 0:
            return self._close_normally()
        return self._send_next(now)

    def on_duologue_message(self, data: bytes, now: float) -> list[Action]:
        """A message on the duologue subscription (bytes from the network, untrusted)."""
        self._require_duologue("on_duologue_message")
        if self._state in _FINISHED:
            return []
        reply = parse_duologue_reply_untrusted(data)
        if isinstance(reply, BadMessage):
            return self._fail(
                FailureKind.PROTOCOL,
                f"bad message from the server ({reply.reason}): {_preview(data)}",
            )
        if isinstance(reply, DuologueError):
            return self._fail(FailureKind.PROTOCOL, f"server error: {reply.message}")
        assert isinstance(reply, Echo)
        outstanding = self._outstanding
        if outstanding is None:
            # The stream is reliable and ordered, so an echo nobody asked for is the server's bug.
            return self._fail(
                FailureKind.PROTOCOL,
                f"unexpected echo {_preview_text(reply.text)} with no message outstanding",
            )
        if reply.text != outstanding.text:
            return self._fail(
                FailureKind.PROTOCOL,
                f"echo {_preview_text(reply.text)} does not match message {outstanding.index} "
                f"{_preview_text(outstanding.text)}",
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
            self._next_send_at = now + self._interval
        return actions

    def on_duologue_closed(self, now: float, *, timed_out: bool = False) -> list[Action]:
        """The duologue went away (image or publication lost, e.g. the server closed it).

        `timed_out`: the transport heard nothing from the server for its liveness timeout
        (the server died or the network went away), rather than an orderly close.
        """
        self._require_duologue("on_duologue_closed")
        if self._state in _FINISHED:
            return []
        if timed_out:
            message = "lost contact with the server (nothing received for the liveness timeout)"
        elif self._state is ClientState.JOINING_DUOLOGUE:
            message = "the duologue closed before it connected"
        else:
            message = "server closed the duologue"
        return self._fail(FailureKind.CONNECTION, message)

    # ---- internals -----------------------------------------------------------------------

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

    def _closes(self) -> list[Action]:
        if self._state in (ClientState.CONNECTING, ClientState.AWAITING_CONNECT):
            return [CloseAllClients()]
        if self._state in (ClientState.JOINING_DUOLOGUE, ClientState.ECHOING):
            return [CloseDuologue()]
        return []

    def _close_normally(self) -> list[Action]:
        closes = self._closes()
        self._finish(ClientState.CLOSED)
        return [*closes, Stop()]

    def _fail(self, kind: FailureKind, message: str) -> list[Action]:
        closes = self._closes()
        self._failure = Failure(kind, message)
        self._finish(ClientState.FAILED)
        return [*closes, Stop()]

    def _finish(self, state: ClientState) -> None:
        self._state = state
        self._deadline = None
        self._next_send_at = None
        self._outstanding = None

    def _require_started(self, method: str) -> None:
        if self._state is ClientState.IDLE:
            raise LocalProtocolError(f"{method}() called before start()")

    def _require_duologue(self, method: str) -> None:
        self._require_started(method)
        if self._state in (ClientState.CONNECTING, ClientState.AWAITING_CONNECT):
            raise LocalProtocolError(f"{method}() called before OpenDuologue was issued")


def _preview_text(text: str) -> str:
    if len(text) > _PREVIEW_CHARS:
        return repr(text[:_PREVIEW_CHARS]) + "..."
    return repr(text)


def _preview(data: bytes | bytearray | memoryview) -> str:
    raw = bytes(data[: _PREVIEW_CHARS + 1])
    text = raw[:_PREVIEW_CHARS].decode("utf-8", "backslashreplace")
    return repr(text) + ("..." if len(raw) > _PREVIEW_CHARS else "")
