"""The Echo 2.0 client on trio: the ECHO application (`echo.client.application`) on a session
of `echo.session.connect()`, as `echo-server` is the ECHO application on `echo.session`'s server.

The session library runs the handshake (HELLO, CONNECT, the duologue) and reports its steps;
the pure `EchoMachine` decides what to send and what replies mean; this module only carries
what one says to the other, each input with ``now = trio.current_time()``.

One task does it all: it waits in `session.receive()` (the transport lends it the socket, so a
reply wakes it directly) under the machine's next deadline, feeds the machine and executes its
actions. Many clients share a process (a game's bots, a load test), so no wake-up is spent on
relaying. The session says when the server is gone (LostContact, within
`echo.session.client.lost_contact_bound`), before an echo's own timeout.

The wire bytes are Echo 2.0's: the session does not ask to resume (no "+R" in the HELLO).
"""

from __future__ import annotations

import ipaddress
import secrets
import socket
from collections import deque
from collections.abc import Callable
from typing import Any

import attrs
import structlog
import trio

from echo.client.application import (
    Action,
    EchoMachine,
    EchoReceived,
    SendEcho,
    Stop,
    close_cause,
    failure_of,
)
from echo.protocol import ECHO_STREAM_ID, Echo, format_message
from echo.session.client import HandshakeStep, client_transport_config, connect
from echo.session.crypto import BadPin, Pin
from echo.session.machine import HandshakeState
from echo.session.session import Session, SessionClosed, SessionError
from echo.transport import Transport, TransportConfig, open_transport
from echo.transport.driver.sockets import SocketFactory, open_udp_socket

log = structlog.get_logger("echo.client")

_STEP_NAMES = {
    HandshakeState.CONNECTING: "connecting",
    HandshakeState.AWAITING_CONNECT: "hello_sent",
    HandshakeState.JOINING: "joining_duologue",
}


def _check_message(instance: object, attribute: attrs.Attribute[Any], value: str | None) -> None:
    # Refused here rather than when the first ECHO is due, after the whole handshake.
    if value is not None:
        format_message(Echo(value))  # ValueError: a line break, not UTF-8, too long


def _check_source(instance: object, attribute: attrs.Attribute[Any], value: str | None) -> None:
    if value is not None:
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise ValueError(f"source must be an IP address of this host, got {value!r}") from None


def _check_server_key(instance: object, attribute: attrs.Attribute[Any], value: str | None) -> None:
    if value is not None:
        try:
            Pin.parse(value)
        except BadPin as error:
            raise ValueError(str(error)) from None


def bound_to(source: str) -> SocketFactory:
    """A socket factory whose sockets send from `source` (one of this host's addresses): every
    socket the transport would bind to the wildcard address binds to `source` instead."""
    wildcard = {"0.0.0.0", "::", ""}
    source_family = socket.AF_INET6 if ":" in source else socket.AF_INET

    def factory(bind: tuple[str, int], family: int, rcvbuf: int, sndbuf: int) -> socket.socket:
        if bind[0] in wildcard and family == source_family:
            bind = (source, bind[1])
        return open_udp_socket(bind, family, rcvbuf, sndbuf)

    return factory


@attrs.frozen
class ClientConfig:
    server: str = "127.0.0.1"
    port: int = 9000
    control_port: int = 9001
    count: int | None = None
    interval: float = 1.0
    message: str | None = attrs.field(default=None, validator=_check_message)
    timeout: float = 10.0
    stream_id: int = ECHO_STREAM_ID
    #: the server's --duologue-ports: "shared" opens the duologue as a response channel
    duologue_ports: str = attrs.field(
        default="per-client", validator=attrs.validators.in_(("shared", "per-client"))
    )
    #: the local address to send from (a host with several); None: the system's choice
    source: str | None = attrs.field(default=None, validator=_check_source)
    #: the server's key (public key or full fingerprint) to encrypt to; None: in the clear
    server_key: str | None = attrs.field(default=None, validator=_check_server_key)


class EchoClient:
    """One Echo 2.0 client: the handshake, then an ECHO every `interval` until `count` or stop().

    By default each run opens a transport of its own (its sockets, its driver's tasks and
    timers). Clients of one program (a game's bots, a load generator) can share one instead,
    opened by the caller with the client's settings, which costs each client only its
    session's own streams::

        async with open_transport(client_transport_config()) as transport:
            async with trio.open_nursery() as nursery:
                for _ in range(100):
                    nursery.start_soon(EchoClient(ClientConfig(), transport=transport).run)

    The clients of one transport send from the same address (to send from another, open the
    transport with ``socket_factory=bound_to(address)``); the server counts them against its
    per-address limits together, as it does clients behind one NAT.
    """

    def __init__(
        self,
        config: ClientConfig,
        *,
        transport_config: TransportConfig | None = None,
        on_echo: Callable[[EchoReceived], None] | None = None,
        on_state: Callable[[str, dict[str, Any]], None] | None = None,
        pad: int | None = None,
        transport: Transport | None = None,
    ) -> None:
        if transport is not None and config.source is not None:
            raise ValueError(
                "source and a shared transport do not go together: open the transport with "
                "socket_factory=bound_to(source) instead"
            )
        if transport is not None and transport_config is not None:
            raise ValueError("transport_config is for the client's own transport, not a shared one")
        self.config = config
        self.transport_config = client_transport_config(transport_config)
        #: a transport the caller opened and shares between clients; None: the run opens its own
        self._shared = transport
        self.on_echo = on_echo
        self.on_state = on_state
        self.pad = secrets.randbits(32) if pad is None else pad
        message = config.message

        def factory(index: int) -> str:
            return message if message is not None else f"{secrets.randbits(64):016x}"

        self.machine = EchoMachine(
            message_factory=factory,
            timeout=config.timeout,
            count=config.count,
            interval=config.interval,
        )
        self._transport: Transport | None = None
        self._scope: trio.CancelScope | None = None
        self._stopping = False

    @property
    def transport(self) -> Transport | None:
        """The transport the client runs on, while it runs (its own, or the shared one)."""
        return self._transport

    def stop(self) -> None:
        """Ask the run to end (Ctrl-C): it finishes as CLOSED, leaving the session cleanly."""
        self._stopping = True
        if self._scope is not None:
            self._scope.cancel()

    async def run(self) -> EchoMachine:
        if self._shared is not None:
            await self._run_on(self._shared)
        else:
            config = self.config
            opened = (
                open_transport(self.transport_config)
                if config.source is None
                else open_transport(self.transport_config, socket_factory=bound_to(config.source))
            )
            async with opened as transport:
                await self._run_on(transport)
        if self._stopping:
            self.machine.stop(trio.current_time())
        return self.machine

    async def _run_on(self, transport: Transport) -> None:
        config = self.config
        machine = self.machine
        self._transport = transport
        try:
            with trio.CancelScope() as self._scope:
                if self._stopping:
                    self._scope.cancel()
                try:
                    async with connect(
                        config.server,
                        config.port,
                        config.control_port,
                        timeout=config.timeout,
                        stream_id=config.stream_id,
                        transport=transport,
                        send_timeout=config.timeout,
                        pad=self.pad,
                        duologue_ports=config.duologue_ports,
                        resume=False,  # Echo 2.0's HELLO, byte for byte
                        on_step=self._on_step,
                        server_key=config.server_key,
                    ) as session:
                        await self._echo(session)
                except SessionError as error:
                    machine.on_handshake_failed(failure_of(error), trio.current_time())
        finally:
            self._scope = None

    def _on_step(self, step: HandshakeStep) -> None:
        self.machine.on_handshake_step(
            step.state, client_session=step.client_session, session_id=step.session_id
        )
        name = _STEP_NAMES[step.state]
        config = self.config
        if step.state is HandshakeState.CONNECTING:
            self._state(name, server=config.server, port=config.port)
        elif step.state is HandshakeState.JOINING:
            self._state(name, data_port=step.data_port, control_port=step.control_port)
        else:
            self._state(name)

    def _state(self, name: str, **fields: Any) -> None:
        log.debug(name, **fields)
        if self.on_state is not None:
            self.on_state(name, fields)

    async def _echo(self, session: Session) -> None:
        """The ECHO application on the open session, until the machine says Stop."""
        machine = self.machine
        on_echo = self.on_echo
        pending: deque[Action] = deque(machine.on_open(session.session_id, trio.current_time()))
        while True:
            while pending:
                action = pending.popleft()
                if isinstance(action, SendEcho):
                    try:
                        await session.send(action.data)
                    except SessionClosed as error:
                        pending.extend(machine.on_closed(*close_cause(error), trio.current_time()))
                elif isinstance(action, EchoReceived):
                    if on_echo is not None:
                        on_echo(action)
                elif isinstance(action, Stop):
                    return
            deadline = machine.next_deadline()
            received: bytes | None = None
            try:
                if deadline is None:
                    received = await session.receive()
                else:
                    with trio.move_on_at(deadline):
                        received = await session.receive()
            except SessionClosed as error:
                pending.extend(machine.on_closed(*close_cause(error), trio.current_time()))
                continue
            if received is None:
                pending.extend(machine.on_timer(trio.current_time()))
            else:
                pending.extend(machine.on_message(received, trio.current_time()))
