"""The Echo 2.0 client on trio: runs the pure `ClientMachine` over the transport.

The machine decides; this module only executes its actions (open/close channels, send) and feeds
it what the transport reports, each with `now = trio.current_time()`.
"""

from __future__ import annotations

import contextlib
import functools
import math
import secrets
from collections import deque
from collections.abc import Callable
from typing import Any

import attrs
import structlog
import trio

from echo.client.machine import (
    Action,
    ClientMachine,
    CloseAllClients,
    CloseDuologue,
    EchoReceived,
    OpenAllClients,
    OpenDuologue,
    SendEcho,
    SendHello,
    Stop,
)
from echo.protocol import ECHO_STREAM_ID, RESERVED_SESSION_HIGH, RESERVED_SESSION_LOW
from echo.timers import echo_timers
from echo.transport import (
    Publication,
    SendError,
    Subscription,
    Transport,
    TransportConfig,
    open_transport,
)

log = structlog.get_logger("echo.client")

Input = Callable[[float], list[Action]]


@attrs.frozen
class ClientConfig:
    server: str = "127.0.0.1"
    port: int = 9000
    control_port: int = 9001
    count: int | None = None
    interval: float = 1.0
    message: str | None = None
    timeout: float = 10.0
    stream_id: int = ECHO_STREAM_ID


def client_transport_config(base: TransportConfig | None = None) -> TransportConfig:
    """Auto session ids of a client stay out of the duologue range, as on the server."""
    return attrs.evolve(
        base or echo_timers(),
        reserved_session_low=RESERVED_SESSION_LOW,
        reserved_session_high=RESERVED_SESSION_HIGH,
    )


def _host(server: str) -> str:
    return f"[{server}]" if ":" in server else server


class _Channels:
    """A publication + subscription pair and the tasks that feed the machine from them."""

    def __init__(self) -> None:
        self.publication: Publication | None = None
        self.subscription: Subscription | None = None
        self.scope = trio.CancelScope()

    async def close(self) -> None:
        self.scope.cancel()
        if self.subscription is not None:
            await self.subscription.close()
            self.subscription = None
        if self.publication is not None:
            if not self.publication.is_closed:
                await self.publication.close(timeout=0.5)
            self.publication = None


class EchoClient:
    def __init__(
        self,
        config: ClientConfig,
        *,
        transport_config: TransportConfig | None = None,
        on_echo: Callable[[EchoReceived], None] | None = None,
        on_state: Callable[[str, dict[str, Any]], None] | None = None,
        pad: int | None = None,
    ) -> None:
        self.config = config
        self.transport_config = client_transport_config(transport_config)
        self.on_echo = on_echo
        self.on_state = on_state
        pad = secrets.randbits(32) if pad is None else pad
        message = config.message

        def factory(index: int) -> str:
            return message if message is not None else f"{secrets.randbits(64):x}"

        self.machine = ClientMachine(
            pad=pad,
            message_factory=factory,
            timeout=config.timeout,
            count=config.count,
            interval=config.interval,
        )
        self._send, self._inputs = trio.open_memory_channel[Input](math.inf)
        self._all_clients = _Channels()
        self._duologue = _Channels()
        self._transport: Transport | None = None
        self._nursery: trio.Nursery | None = None

    def stop(self) -> None:
        """Ask the run to end after the current step (Ctrl-C)."""
        self._send.send_nowait(self.machine.stop)

    async def run(self) -> ClientMachine:
        async with (
            open_transport(self.transport_config) as transport,
            trio.open_nursery() as nursery,
        ):
            self._transport = transport
            self._nursery = nursery
            try:
                await self._loop()
            finally:
                with trio.CancelScope(shield=True):
                    await self._all_clients.close()
                    await self._duologue.close()
                nursery.cancel_scope.cancel()
        return self.machine

    async def _loop(self) -> None:
        machine = self.machine
        pending: deque[Action] = deque(machine.start(trio.current_time()))
        while True:
            while pending:
                action = pending.popleft()
                if isinstance(action, Stop):
                    return
                pending.extend(await self._execute(action))
            deadline = machine.next_deadline()
            with trio.move_on_at(math.inf if deadline is None else deadline):
                step = await self._inputs.receive()
                pending.extend(step(trio.current_time()))
                continue
            pending.extend(machine.on_timer(trio.current_time()))

    # ---------------------------------------------------------------- actions

    async def _execute(self, action: Action) -> list[Action]:
        machine = self.machine
        config = self.config
        host = _host(config.server)
        if isinstance(action, OpenAllClients):
            self._state("connecting", server=config.server, port=config.port)
            await self._open(
                self._all_clients,
                f"aeron:udp?control={host}:{config.control_port}|control-mode=dynamic",
                f"aeron:udp?endpoint={host}:{config.port}",
                on_message=machine.on_all_clients_message,
                on_connected=lambda pub: (
                    lambda now: machine.on_all_clients_connected(pub.session_id, now)
                ),
                on_closed=machine.on_all_clients_closed,
            )
        elif isinstance(action, SendHello):
            self._state("hello_sent")
            return await self._transmit(self._all_clients, action.data)
        elif isinstance(action, CloseAllClients):
            await self._all_clients.close()
        elif isinstance(action, OpenDuologue):
            self._state(
                "joining_duologue", data_port=action.data_port, control_port=action.control_port
            )
            session = action.session_id
            await self._open(
                self._duologue,
                f"aeron:udp?control={host}:{action.control_port}|control-mode=dynamic"
                f"|session-id={session}",
                f"aeron:udp?endpoint={host}:{action.data_port}|session-id={session}",
                on_message=machine.on_duologue_message,
                on_connected=lambda pub: machine.on_duologue_connected,
                on_closed=machine.on_duologue_closed,
            )
        elif isinstance(action, SendEcho):
            return await self._transmit(self._duologue, action.data)
        elif isinstance(action, EchoReceived):
            if self.on_echo is not None:
                self.on_echo(action)
        elif isinstance(action, CloseDuologue):
            await self._duologue.close()
        return []

    def _state(self, name: str, **fields: Any) -> None:
        log.debug(name, **fields)
        if self.on_state is not None:
            self.on_state(name, fields)

    async def _transmit(self, channels: _Channels, data: bytes) -> list[Action]:
        publication = channels.publication
        now = trio.current_time()
        if publication is None:
            return self.machine.on_send_failed("channel is not open", now)
        try:
            await publication.send(data, timeout=self.config.timeout)
        except SendError as error:
            return self.machine.on_send_failed(
                f"could not send to the server ({error.name})", trio.current_time()
            )
        return []

    async def _open(
        self,
        channels: _Channels,
        sub_channel: str,
        pub_channel: str,
        *,
        on_message: Callable[[bytes, float], list[Action]],
        on_connected: Callable[[Publication], Input],
        on_closed: Callable[..., list[Action]],
    ) -> None:
        assert self._transport is not None and self._nursery is not None
        send = self._send
        config = self.config
        channels.scope = trio.CancelScope()
        channels.subscription = await self._transport.add_subscription(
            sub_channel,
            config.stream_id,
            on_image_unavailable=lambda image: send.send_nowait(
                functools.partial(on_closed, timed_out=image.close_reason == "timed_out")
            ),
        )
        channels.publication = await self._transport.add_publication(pub_channel, config.stream_id)
        subscription = channels.subscription
        publication = channels.publication

        async def pump() -> None:
            with channels.scope, contextlib.suppress(trio.ClosedResourceError):
                # ClosedResourceError: the machine closed these channels (a timeout, a
                # rejection) while we were still waiting on them; nothing left to report.
                while not subscription.images or not publication.is_connected:
                    if publication.is_connected:
                        await subscription.wait_activity()
                    else:
                        with trio.move_on_after(0.05):
                            await publication.wait_connected()
                send.send_nowait(on_connected(publication))
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(watch_connection)
                    async for message in subscription:
                        send.send_nowait(functools.partial(_deliver, on_message, message.data))

        async def watch_connection() -> None:
            # The server stopped answering (killed, cable pulled): our publication loses its
            # receiver after the 5 s connection timeout, before the image's 10 s liveness and
            # before a reply's timeout, so the client says what happened.
            await publication.wait_disconnected()
            send.send_nowait(functools.partial(on_closed, timed_out=True))

        self._nursery.start_soon(pump)


def _deliver(
    on_message: Callable[[bytes, float], list[Action]], data: bytes, now: float
) -> list[Action]:
    return on_message(data, now)
