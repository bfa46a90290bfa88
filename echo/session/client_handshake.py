"""The client's handshake on the transport: the pure `HandshakeMachine`'s actions carried out
(the all-clients pair, the HELLO, the duologue's streams) and what it hears fed back, each with
``now``; and the stream helpers the session's resumes (`echo.session.client_path`) use too.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import attrs
import trio

from echo.session.client_hub import AllClientsView, open_view
from echo.session.machine import (
    Action,
    CloseAllClients,
    Failed,
    Failure,
    FailureKind,
    HandshakeMachine,
    HandshakeState,
    OpenAllClients,
    OpenDuologue,
    Opened,
    SendHello,
)
from echo.session.session import (
    HandshakeTimeout,
    LostContact,
    ProtocolViolation,
    Rejected,
    SessionError,
    Untrusted,
)
from echo.transport import Image, Message, Publication, SendError, Subscription, Transport

#: Messages read from the all-clients channel per poll: it carries every client's replies.
_READ_BATCH = 256


@attrs.frozen
class HandshakeStep:
    """Where a handshake got to, for `connect(on_step=...)`: CONNECTING (the all-clients
    channel is being opened), AWAITING_CONNECT (HELLO sent), JOINING (the server assigned the
    duologue on `data_port`/`control_port`, which is being opened)."""

    state: HandshakeState
    data_port: int | None = None
    control_port: int | None = None
    #: our all-clients publication's session id (AWAITING_CONNECT, JOINING)
    client_session: int | None = None
    #: the duologue's session id, decrypted (JOINING)
    session_id: int | None = None


def _host(server: str) -> str:
    return f"[{server}]" if ":" in server else server


def duologue_channels(
    host: str, data_port: int, control_port: int, session_id: int, shared: bool
) -> tuple[str, str]:
    """The client's duologue subscription and publication channels; the publication's has a
    `{registration_id}` field for the subscription's registration id.

    Per-client: an MDC subscription registering with the duologue's own control port (Echo
    2.0). Shared: a response channel (Aeron 1.48): the subscription waits for the server's
    RSP_SETUP, the publication's SETUPs ask for it (response-correlation-id).
    """
    if shared:
        return (
            f"aeron:udp?control-mode=response|control={host}:{control_port}"
            f"|session-id={session_id}",
            f"aeron:udp?endpoint={host}:{data_port}|session-id={session_id}"
            "|response-correlation-id={registration_id}",
        )
    return (
        f"aeron:udp?control={host}:{control_port}|control-mode=dynamic|session-id={session_id}",
        f"aeron:udp?endpoint={host}:{data_port}|session-id={session_id}",
    )


def failure_error(failure: Failure, timeout: float) -> SessionError:
    """The exception `connect` raises for a failed handshake."""
    if failure.kind is FailureKind.REJECTED:
        return Rejected(failure.detail)
    if failure.kind is FailureKind.TIMED_OUT:
        return HandshakeTimeout(failure.detail, timeout, failure.phase)
    if failure.kind is FailureKind.CONNECTION:
        return LostContact(failure.message)
    if failure.kind is FailureKind.UNTRUSTED:
        return Untrusted(failure.message)
    return ProtocolViolation(failure.message)


class _Pair:
    """A channel's publication + subscription, and whether its image went away."""

    def __init__(self) -> None:
        self.publication: Publication | None = None
        self.subscription: Subscription | AllClientsView | None = None
        self.lost = False

    @property
    def connected(self) -> bool:
        return (
            self.publication is not None
            and self.subscription is not None
            and self.publication.is_connected
            and bool(self.subscription.images)
        )

    def on_image_gone(self, image: Image) -> None:
        self.lost = True


async def _close_pair(pair: _Pair) -> None:
    if pair.subscription is not None:
        await pair.subscription.close()
    if pair.publication is not None and not pair.publication.is_closed:
        pair.publication.close_soon(timeout=0.5)  # lingers in the transport, not here


async def _handshake(
    transport: Transport,
    machine: HandshakeMachine,
    server: str,
    port: int,
    control_port: int,
    stream_id: int,
    all_clients: _Pair,
    duologue: _Pair,
    nursery: trio.Nursery,
    shared: bool = False,
    on_step: Callable[[HandshakeStep], None] | None = None,
) -> Opened:
    host = _host(server)
    pending: list[Action] = machine.start(trio.current_time())
    while True:
        while pending:
            action = pending.pop(0)
            if isinstance(action, OpenAllClients):
                if on_step is not None:
                    on_step(HandshakeStep(HandshakeState.CONNECTING))
                await _open_all_clients(transport, host, port, control_port, stream_id, all_clients)
            elif isinstance(action, SendHello):
                assert all_clients.publication is not None
                if on_step is not None:
                    on_step(
                        HandshakeStep(
                            HandshakeState.AWAITING_CONNECT, client_session=machine.client_session
                        )
                    )
                try:
                    await all_clients.publication.send(action.data, timeout=1.0)
                except SendError as error:
                    pending += machine.on_send_failed(
                        f"could not send to the server ({error.name})", trio.current_time()
                    )
            elif isinstance(action, CloseAllClients):
                await _close_all_clients(all_clients, nursery)
            elif isinstance(action, OpenDuologue):
                if on_step is not None:
                    on_step(
                        HandshakeStep(
                            HandshakeState.JOINING,
                            action.data_port,
                            action.control_port,
                            machine.client_session,
                            action.session_id,
                        )
                    )
                await _open_duologue(transport, host, action, stream_id, duologue, shared)
            elif isinstance(action, Opened):
                return action
            elif isinstance(action, Failed):
                raise failure_error(action.failure, machine.timeout)
        deadline = machine.next_deadline()
        with trio.move_on_at(math.inf if deadline is None else deadline):
            pending += await _next_event(machine, all_clients, duologue)
        if not pending and deadline is not None and trio.current_time() >= deadline:
            pending += machine.on_timer(trio.current_time())


async def _open_all_clients(
    transport: Transport,
    host: str,
    port: int,
    control_port: int,
    stream_id: int,
    pair: _Pair,
    *,
    share: bool = True,
) -> None:
    """Open the all-clients pair: our MDC subscription registering with the server's control
    port (with `share`, the one this transport's handshakes to that server share:
    `echo.session.client_hub`), our publication to its HELLO port."""
    if share:
        view = await open_view(transport, host, control_port, stream_id, pair.on_image_gone)
        pair.subscription = view
    else:
        pair.subscription = await transport.add_subscription(
            f"aeron:udp?control={host}:{control_port}|control-mode=dynamic",
            stream_id,
            on_image_unavailable=pair.on_image_gone,
        )
    pair.publication = await transport.add_publication(
        f"aeron:udp?endpoint={host}:{port}", stream_id
    )
    if share:
        # The server's replies to our HELLO start with this publication's session id.
        view.expect(pair.publication.session_id)


async def _close_all_clients(all_clients: _Pair, nursery: trio.Nursery) -> None:
    """The subscription at once (its end-of-stream SM removes us from the server's MDC
    destinations, so we stop receiving everyone's replies); the publication says goodbye in
    the background."""
    pair_sub, all_clients.subscription = all_clients.subscription, None
    pair_pub, all_clients.publication = all_clients.publication, None
    if pair_sub is not None:
        await pair_sub.close()
    if pair_pub is not None:
        nursery.start_soon(_close_publication, pair_pub)


async def _open_duologue(
    transport: Transport,
    host: str,
    action: OpenDuologue,
    stream_id: int,
    duologue: _Pair,
    shared: bool,
) -> None:
    """Open the duologue the server assigned (`duologue_channels`)."""
    sub_channel, pub_channel = duologue_channels(
        host, action.data_port, action.control_port, action.session_id, shared
    )
    duologue.subscription = await transport.add_subscription(
        sub_channel, stream_id, on_image_unavailable=duologue.on_image_gone
    )
    duologue.publication = await transport.add_publication(
        pub_channel.format(registration_id=duologue.subscription.registration_id),
        stream_id,
    )


async def _next_event(
    machine: HandshakeMachine, all_clients: _Pair, duologue: _Pair
) -> list[Action]:
    """Wait for what the machine needs to hear next (the caller bounds the wait)."""
    state = machine.state
    pair = duologue if state is HandshakeState.JOINING else all_clients
    if pair.lost:
        now = trio.current_time()
        if state is HandshakeState.JOINING:
            return machine.on_duologue_closed(now)
        return machine.on_all_clients_closed(now)
    publication, subscription = pair.publication, pair.subscription
    assert publication is not None and subscription is not None
    if state is HandshakeState.AWAITING_CONNECT:
        received: list[Message] = []
        subscription.poll(received.append, fragment_limit=_READ_BATCH)
        actions: list[Action] = []
        for message in received:
            actions += machine.on_all_clients_message(message.data, trio.current_time())
            if actions:
                return actions
        if len(received) < _READ_BATCH:
            await subscription.wait_activity()
        return []
    if pair.connected:
        now = trio.current_time()
        if state is HandshakeState.CONNECTING:
            return machine.on_all_clients_connected(publication.session_id, now)
        return machine.on_duologue_connected(now)
    if not publication.is_connected:
        try:
            await publication.wait_connected()
        except trio.ClosedResourceError:
            await trio.sleep_forever()
    else:
        await subscription.wait_activity()
    return []


async def _close_publication(publication: Publication) -> None:
    if not publication.is_closed:
        await publication.close(timeout=0.5)
