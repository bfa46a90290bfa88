"""The Echo 2.0 client on trio: runs the pure `ClientMachine` over the transport.

The machine decides; this module only executes its actions (open/close channels, send) and feeds
it what the transport reports, each with `now = trio.current_time()`.

One task does it all: it waits on the open channel's subscription (the transport lends it the
socket, so a reply wakes it directly), reads what arrived into the machine, executes the actions
and checks the publication, all under the machine's next deadline. Many clients share a process
(a game's bots, a load test), so no wake-up is spent on relaying: no task per channel that
forwards each message, no task woken by every event of the publication just to see that it is
still connected, no polling while a channel connects.
"""

from __future__ import annotations

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
from echo.protocol import (
    ECHO_STREAM_ID,
    Echo,
    format_message,
)
from echo.session.client import client_transport_config, duologue_channels
from echo.transport import (
    Image,
    Publication,
    SendError,
    Subscription,
    Transport,
    TransportConfig,
    open_transport,
)

log = structlog.get_logger("echo.client")

Input = Callable[[float], list[Action]]

#: Messages read from a subscription per pass; the all-clients channel carries every client's
#: reply, and each pass hands them to the machine one by one (most are ignored at once).
_READ_BATCH = 256
#: While a channel is connected and nothing else would wake us sooner, look at the
#: publication this often: it loses its receiver (the server went away) 5 s after the last
#: status message, without any event the client waits on.
CONNECTION_CHECK_INTERVAL = 1.0


def _check_message(instance: object, attribute: attrs.Attribute[Any], value: str | None) -> None:
    # Refused here rather than when the first ECHO is due, after the whole handshake.
    if value is not None:
        format_message(Echo(value))  # ValueError: a line break, not UTF-8, too long


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


def _host(server: str) -> str:
    return f"[{server}]" if ":" in server else server


class _Channel:
    """A publication + subscription pair and how the machine hears of them."""

    def __init__(
        self,
        publication: Publication,
        subscription: Subscription,
        on_message: Callable[[bytes, float], list[Action]],
        on_connected: Input,
        on_closed: Callable[..., list[Action]],
    ) -> None:
        self.publication = publication
        self.subscription = subscription
        self.on_message = on_message
        self.on_connected = on_connected
        self.on_closed = on_closed
        #: both ends connected and the machine told (messages are read from then on)
        self.connected = False
        #: the machine was told the channel closed (it is told once)
        self.lost = False
        self.check_at = math.inf


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
        # Inputs that do not come through the subscription being read (Ctrl-C, an image going
        # away): queued here, and the loop's wait is cut short.
        self._inputs: deque[Input] = deque()
        self._waiting: trio.CancelScope | None = None
        #: messages read from a subscription, not yet given to the machine
        self._batch: deque[tuple[Callable[[bytes, float], list[Action]], bytes]] = deque()
        self._all_clients: _Channel | None = None
        self._duologue: _Channel | None = None
        self._transport: Transport | None = None
        self._nursery: trio.Nursery | None = None

    def stop(self) -> None:
        """Ask the run to end after the current step (Ctrl-C)."""
        self._input(self.machine.stop)

    def _input(self, step: Input) -> None:
        self._inputs.append(step)
        if self._waiting is not None:
            self._waiting.cancel()

    async def run(self) -> ClientMachine:
        async with (
            open_transport(self.transport_config) as transport,
            trio.open_nursery() as nursery,
        ):
            # The nursery holds publications that are closing (their linger) while we go on.
            self._transport = transport
            self._nursery = nursery
            try:
                await self._loop()
            finally:
                with trio.CancelScope(shield=True):
                    await self._close_all_clients(wait=True)
                    await self._close_duologue()
        return self.machine

    async def _loop(self) -> None:
        machine = self.machine
        inputs = self._inputs
        batch = self._batch
        pending: deque[Action] = deque(machine.start(trio.current_time()))
        while True:
            while pending:
                action = pending.popleft()
                if isinstance(action, Stop):
                    return
                pending.extend(await self._execute(action))
            if batch:
                # One message at a time, each acted on before the next, as if it came alone.
                on_message, data = batch.popleft()
                pending.extend(on_message(data, trio.current_time()))
                continue
            if inputs:
                pending.extend(inputs.popleft()(trio.current_time()))
                continue
            channel = self._duologue or self._all_clients
            if channel is not None and not channel.lost:
                self._observe(channel, pending)
                if pending or batch:
                    continue
            # Nothing has arrived: the machine's timers, then wait for the next thing.
            deadline = machine.next_deadline()
            if deadline is not None and trio.current_time() >= deadline:
                pending.extend(machine.on_timer(trio.current_time()))
                continue
            wake_at = math.inf if deadline is None else deadline
            if channel is not None and channel.connected and channel.check_at < wake_at:
                wake_at = channel.check_at
            with trio.CancelScope(deadline=wake_at) as self._waiting:
                await self._wait(channel)
            self._waiting = None

    def _observe(self, channel: _Channel, pending: deque[Action]) -> None:
        """What the channel has for the machine: connected, messages, connection lost."""
        publication = channel.publication
        subscription = channel.subscription
        if not channel.connected:
            if publication.is_connected and subscription.images:
                channel.connected = True
                now = trio.current_time()
                channel.check_at = now + CONNECTION_CHECK_INTERVAL
                pending.extend(channel.on_connected(now))
            return
        on_message = channel.on_message
        batch = self._batch
        if subscription.poll(
            lambda message: batch.append((on_message, message.data)), fragment_limit=_READ_BATCH
        ):
            return
        now = trio.current_time()
        if not publication.is_connected:
            # The server stopped answering (killed, cable pulled): our publication loses its
            # receiver after the 5 s connection timeout, before the image's 10 s liveness and
            # before a reply's timeout, so the client says what happened.
            channel.lost = True
            pending.extend(channel.on_closed(now, timed_out=True))
            return
        channel.check_at = now + CONNECTION_CHECK_INTERVAL

    async def _wait(self, channel: _Channel | None) -> None:
        """Until the channel may have something for the machine (the caller's scope bounds it)."""
        if channel is None or channel.lost:
            await trio.sleep_forever()
            return
        if not channel.connected and not channel.publication.is_connected:
            try:
                await channel.publication.wait_connected()
            except trio.ClosedResourceError:
                await trio.sleep_forever()
            return
        await channel.subscription.wait_activity()

    # ---------------------------------------------------------------- actions

    async def _execute(self, action: Action) -> list[Action]:
        machine = self.machine
        config = self.config
        host = _host(config.server)
        if isinstance(action, OpenAllClients):
            self._state("connecting", server=config.server, port=config.port)
            self._all_clients = await self._open(
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
            await self._close_all_clients()
        elif isinstance(action, OpenDuologue):
            self._state(
                "joining_duologue", data_port=action.data_port, control_port=action.control_port
            )
            sub_channel, pub_channel = duologue_channels(
                host,
                action.data_port,
                action.control_port,
                action.session_id,
                config.duologue_ports == "shared",
            )
            self._duologue = await self._open(
                sub_channel,
                pub_channel,
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
            await self._close_duologue()
        return []

    def _state(self, name: str, **fields: Any) -> None:
        log.debug(name, **fields)
        if self.on_state is not None:
            self.on_state(name, fields)

    async def _transmit(self, channel: _Channel | None, data: bytes) -> list[Action]:
        now = trio.current_time()
        if channel is None:
            return self.machine.on_send_failed("channel is not open", now)
        try:
            await channel.publication.send(data, timeout=self.config.timeout)
        except SendError as error:
            return self.machine.on_send_failed(
                f"could not send to the server ({error.name})", trio.current_time()
            )
        return []

    async def _open(
        self,
        sub_channel: str,
        pub_channel: str,
        *,
        on_message: Callable[[bytes, float], list[Action]],
        on_connected: Callable[[Publication], Input],
        on_closed: Callable[..., list[Action]],
    ) -> _Channel:
        assert self._transport is not None
        config = self.config
        channel: _Channel | None = None

        def image_gone(image: Image) -> None:
            if channel is not None and not channel.lost:
                channel.lost = True
                timed_out = image.close_reason == "timed_out"
                self._input(lambda now: on_closed(now, timed_out=timed_out))

        subscription = await self._transport.add_subscription(
            sub_channel, config.stream_id, on_image_unavailable=image_gone
        )
        publication = await self._transport.add_publication(
            # A response channel's request names its subscription (duologue_channels).
            pub_channel.replace("{registration_id}", str(subscription.registration_id)),
            config.stream_id,
        )
        channel = _Channel(
            publication, subscription, on_message, on_connected(publication), on_closed
        )
        return channel

    async def _close_all_clients(self, *, wait: bool = False) -> None:
        """Leave the all-clients channel: at once for the subscription, so that the server
        stops sending it everyone's replies (its end-of-stream status message removes us as a
        destination); the publication drains and says goodbye in the background unless `wait`."""
        channel, self._all_clients = self._all_clients, None
        if channel is None:
            return
        channel.lost = True
        await channel.subscription.close()
        if wait or self._nursery is None:
            await _close_publication(channel.publication)
        else:
            self._nursery.start_soon(_close_publication, channel.publication)

    async def _close_duologue(self) -> None:
        channel, self._duologue = self._duologue, None
        if channel is None:
            return
        channel.lost = True
        await channel.subscription.close()
        await _close_publication(channel.publication)


async def _close_publication(publication: Publication) -> None:
    if not publication.is_closed:
        await publication.close(timeout=0.5)
