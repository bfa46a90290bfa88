"""The Echo 2.0 server on trio (seeds/000 §4.4-§4.5, reference §7), with the guide's bugs fixed.

One task reads the all-clients subscription and answers HELLOs on the all-clients MDC
publication; each duologue is one task that echoes, refuses strangers and expires. All state
lives in this one trio thread, so there are no locks and no executor (the guide's §3.3.5).

Fixed relative to the guide (reference §7.9): the owner of a duologue is the source address of
the message that carried the HELLO (no race with image callbacks); IPv6 clients are limited per
prefix, not all counted as loopback; ports, session and per-IP slot are freed exactly once on
every path, exceptions included; an image from the wrong address is rejected, not just logged;
the expiry is configurable.
"""

from __future__ import annotations

import functools
import itertools
import secrets
from typing import Any, Protocol

import attrs
import structlog
import trio

from echo.protocol import (
    ERROR_BAD_MESSAGE,
    ERROR_SERVER_FULL,
    ERROR_SHUTTING_DOWN,
    ERROR_TOO_MANY_FOR_IP,
    RESERVED_SESSION_HIGH,
    RESERVED_SESSION_LOW,
    AllClientsError,
    BadMessage,
    Connect,
    DuologueError,
    Echo,
    Hello,
    encrypt_session,
    format_message,
    parse_duologue_request_untrusted,
    parse_server_message_untrusted,
)
from echo.server.allocators import AllocationError, PortAllocator, SessionAllocator
from echo.server.config import ServerConfig
from echo.server.limits import AddressCounter, address_key
from echo.timers import echo_timers
from echo.transport import (
    Image,
    Message,
    Publication,
    SendError,
    Subscription,
    Transport,
    TransportConfig,
    open_transport,
)

log = structlog.get_logger("echo.server")

# Port pairs tried before a HELLO is refused because no duologue could be opened.
_OPEN_ATTEMPTS = 8
# A duologue younger than this is not evicted: its client may be joining right now.
_EVICTION_GRACE = 0.5
# Messages a duologue reads per poll (a client has one echo outstanding at a time).
_DUOLOGUE_BATCH = 10


class EventSink(Protocol):
    def emit(self, event: str, **fields: Any) -> None: ...


class _LogOnly:
    def emit(self, event: str, **fields: Any) -> None:
        log.info(event, **fields)


def server_transport_config(base: TransportConfig | None = None) -> TransportConfig:
    """Transport settings for a server: auto session ids stay out of the duologue range.

    With no `base`, the timers are the Echo defaults of `echo_timers` rather than Aeron's.
    """
    return attrs.evolve(
        base or echo_timers(),
        reserved_session_low=RESERVED_SESSION_LOW,
        reserved_session_high=RESERVED_SESSION_HIGH,
    )


def _url_host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


class Duologue:
    """One client's publication + subscription pair (§4.3)."""

    def __init__(
        self,
        *,
        duologue_id: int,
        session_id: int,
        owner_ip: str,
        owner_key: str,
        client_session: int,
        data_port: int,
        control_port: int,
        created: float,
    ) -> None:
        self.duologue_id = duologue_id
        self.session_id = session_id
        self.owner_ip = owner_ip
        self.owner_key = owner_key
        self.client_session = client_session
        self.data_port = data_port
        self.control_port = control_port
        self.created = created
        self.publication: Publication | None = None
        self.subscription: Subscription | None = None
        self.image: Image | None = None
        self.ever_connected = False
        self.messages = 0
        self.freed = False
        self.close_reason: str | None = None
        self.cancel_scope = trio.CancelScope()


class EchoServer:
    def __init__(
        self,
        config: ServerConfig,
        *,
        transport_config: TransportConfig | None = None,
        events: EventSink | None = None,
        rng: Any = None,
    ) -> None:
        self.config = config
        self.transport_config = server_transport_config(transport_config)
        self.events: EventSink = events or _LogOnly()
        rng = rng or secrets.SystemRandom()
        self.ports = PortAllocator(config.clients_base_port, config.clients_port_count, rng)
        self.sessions = SessionAllocator(RESERVED_SESSION_LOW, RESERVED_SESSION_HIGH, rng)
        self.per_ip = AddressCounter()
        self.duologues: dict[int, Duologue] = {}
        self._ids = itertools.count(1)
        self.transport: Transport | None = None
        self.all_clients_pub: Publication | None = None
        self.all_clients_sub: Subscription | None = None
        self._nursery: trio.Nursery | None = None
        self._stopping = False
        self.hellos = 0
        self.unvalidated_hellos = 0

    # ---------------------------------------------------------------- life cycle

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; `stop()` ends it gracefully."""
        config = self.config
        host = _url_host(config.address)
        async with open_transport(self.transport_config) as transport:
            self.transport = transport
            self.all_clients_pub = await transport.add_publication(
                f"aeron:udp?control={host}:{config.control_port}|control-mode=dynamic",
                config.stream_id,
            )
            self.all_clients_sub = await transport.add_subscription(
                f"aeron:udp?endpoint={host}:{config.port}", config.stream_id
            )
            self.events.emit(
                "server_started",
                address=config.address,
                port=config.port,
                control_port=config.control_port,
                clients_base_port=config.clients_base_port,
                max_clients=config.max_clients,
                max_per_ip=config.max_per_ip,
            )
            try:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    task_status.started(self)
                    nursery.start_soon(self._serve_all_clients)
            finally:
                self._nursery = None

    async def stop(self, reason: str = "signal") -> None:
        """Tell every connected client the server is going, close everything, return."""
        if self._stopping:
            return
        self._stopping = True
        open_before = len(self.duologues)
        with trio.move_on_after(2.0) as scope:
            scope.shield = True
            async with trio.open_nursery() as nursery:
                for duologue in list(self.duologues.values()):
                    nursery.start_soon(self._say_goodbye, duologue)
        for duologue in list(self.duologues.values()):
            await self._delete(duologue, "server shutting down")
        self.events.emit("server_stopped", reason=reason, duologues_open=open_before)
        if self.transport is not None:
            counters = {k: v for k, v in self.transport.counters.snapshot().items() if v}
            log.info("transport_counters", **counters)
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    async def _say_goodbye(self, duologue: Duologue) -> None:
        publication = duologue.publication
        if publication is None or not duologue.ever_connected:
            return
        # Whatever was offered to this client (the echoes in flight, then the goodbye) is
        # delivered or reported here as not delivered, never dropped in silence.
        problem: str | None = None
        try:
            await publication.send(format_message(DuologueError(ERROR_SHUTTING_DOWN)), timeout=0.5)
            if not await publication.close(timeout=1.0):
                problem = "not acknowledged by the client"
        except SendError as error:
            problem = f"could not send: {error.name}"
        except trio.ClosedResourceError:
            problem = "stream already closed"
        if problem is not None:
            log.warning(
                "goodbye_undelivered",
                duologue_id=duologue.duologue_id,
                source_ip=duologue.owner_ip,
                problem=problem,
            )

    # ---------------------------------------------------------------- all-clients channel

    async def _serve_all_clients(self) -> None:
        assert self.all_clients_sub is not None
        async for message in self.all_clients_sub:
            if self._stopping:
                return
            await self._on_hello(message)

    async def _reply(self, text: bytes, client_session: int) -> None:
        """Answer on the all-clients channel without holding up the next HELLO.

        Every datagram on this channel goes to every client still in its handshake, so the
        cost is datagrams x destinations: replies offered together share datagrams (the
        HELLOs that queued up while the last batch went out are answered in one batch).
        """
        assert self.all_clients_pub is not None and self._nursery is not None
        result = self.all_clients_pub.offer(text, flush=False)
        if result > 0:
            return
        # Not connected (the client's SM was lost, it is a validated address so it is there),
        # back pressure or a term rotation: retry in the background, bounded, as the guide's
        # sendMessage did, but without serialising every other client behind this one.
        self._nursery.start_soon(self._send_later, text, client_session)

    async def _send_later(self, text: bytes, client_session: int) -> None:
        assert self.all_clients_pub is not None
        try:
            await self.all_clients_pub.send(text, timeout=2.0)
        except SendError as error:
            log.warning("reply_failed", client_session=client_session, error=error.name)

    async def _on_hello(self, message: Message) -> None:
        config = self.config
        self.hellos += 1
        client_session = message.session_id
        source_ip = message.source_ip
        try:
            key = address_key(source_ip, ipv6_prefix=config.ipv6_prefix)
        except ValueError:
            key = source_ip
        fields = {"client_session": client_session, "source_ip": source_ip, "source_prefix": key}
        assert self.all_clients_pub is not None
        if self.transport_config.validate_addresses and not (
            self.all_clients_pub.has_destination_host(source_ip)
        ):
            # A HELLO from an address that never proved, by the MDC cookie exchange, that it
            # can receive our replies: most likely forged (seed §4.3's spoofer). Drop it
            # silently: a reply could not reach it anyway, and a duologue would only hold the
            # victim's per-IP slots.
            self.unvalidated_hellos += 1
            self.events.emit("hello_rejected", reason="unvalidated address", **fields)
            return
        self.events.emit("hello_received", **fields)
        request = parse_server_message_untrusted(message.data)
        reason: str | None = None
        if isinstance(request, BadMessage):
            reason = ERROR_BAD_MESSAGE
        elif len(self.duologues) >= config.max_clients and not await self._evict(None):
            reason = ERROR_SERVER_FULL
        elif self.per_ip.count(key) >= config.max_per_ip and not await self._evict(key):
            reason = ERROR_TOO_MANY_FOR_IP
        if reason is not None or not isinstance(request, Hello):
            reason = reason or ERROR_BAD_MESSAGE
            self.events.emit("hello_rejected", reason=reason, **fields)
            await self._reply(
                format_message(AllClientsError(client_session, reason)), client_session
            )
            return
        duologue = await self._allocate(request, message, key)
        if duologue is None:
            self.events.emit("hello_rejected", reason=ERROR_SERVER_FULL, **fields)
            await self._reply(
                format_message(AllClientsError(client_session, ERROR_SERVER_FULL)), client_session
            )
            return
        reply = Connect(
            client_session=client_session,
            data_port=duologue.data_port,
            control_port=duologue.control_port,
            encrypted_session=encrypt_session(duologue.session_id, request.key),
        )
        await self._reply(format_message(reply), client_session)

    async def _evict(self, key: str | None) -> bool:
        """Free the oldest duologue nobody has joined (of this address key, or of anyone).

        A duologue that was never joined is most likely the work of a spoofer; a real client
        joins within milliseconds. Evicting it lets the real client in at once instead of after
        the expiry (seed §4.3's lock-out attack); joined duologues are never evicted.
        """
        candidates = [
            d
            for d in self.duologues.values()
            if not d.ever_connected
            and (key is None or d.owner_key == key)
            and trio.current_time() - d.created > _EVICTION_GRACE
        ]
        if not candidates:
            return False
        oldest = min(candidates, key=lambda d: d.created)
        await self._delete(oldest, "evicted")
        return True

    async def _allocate(self, hello: Hello, message: Message, key: str) -> Duologue | None:
        """Reserve ports and a session, open the streams, then take the per-IP slot.

        All or nothing. A port that another program holds (an ephemeral port of some client on
        this host, say) fails to bind: that pair goes back and another is tried.
        """
        assert self.transport is not None and self._nursery is not None
        config = self.config
        host = _url_host(config.address)
        for _ in range(_OPEN_ATTEMPTS):
            try:
                data_port, control_port = self.ports.allocate_pair()
            except AllocationError:
                return None
            try:
                session_id = self.sessions.allocate()
            except AllocationError:
                self.ports.free(data_port)
                self.ports.free(control_port)
                return None
            duologue = Duologue(
                duologue_id=next(self._ids),
                session_id=session_id,
                owner_ip=message.source_ip,
                owner_key=key,
                client_session=message.session_id,
                data_port=data_port,
                control_port=control_port,
                created=trio.current_time(),
            )
            try:
                duologue.publication = await self.transport.add_publication(
                    f"aeron:udp?control={host}:{control_port}|control-mode=dynamic"
                    f"|session-id={session_id}",
                    config.stream_id,
                )
                duologue.subscription = await self.transport.add_subscription(
                    f"aeron:udp?endpoint={host}:{data_port}|session-id={session_id}",
                    config.stream_id,
                    on_image_available=functools.partial(self._on_image, duologue),
                    on_image_unavailable=functools.partial(self._on_image_gone, duologue),
                )
            except OSError as error:
                log.warning(
                    "duologue_ports_unavailable",
                    data_port=data_port,
                    control_port=control_port,
                    error=str(error),
                )
                if duologue.publication is not None:
                    await duologue.publication.close(timeout=0)
                self.ports.free(data_port)
                self.ports.free(control_port)
                self.sessions.free(session_id)
                continue
            break
        else:
            return None
        self.per_ip.increment(key)
        self.duologues[duologue.duologue_id] = duologue
        self.events.emit(
            "duologue_created",
            duologue_id=duologue.duologue_id,
            client_session=duologue.client_session,
            source_ip=duologue.owner_ip,
            source_prefix=key,
            data_port=data_port,
            control_port=control_port,
        )
        self._nursery.start_soon(self._run_duologue, duologue)
        return duologue

    # ---------------------------------------------------------------- duologues

    def _on_image(self, duologue: Duologue, image: Image) -> None:
        if image.source_ip != duologue.owner_ip or duologue.image is not None:
            # Someone who is not the client that asked (spoofed or guessed the session):
            # refuse the stream, so it can neither talk nor keep the duologue from expiring.
            self.events.emit(
                "image_refused",
                duologue_id=duologue.duologue_id,
                source_ip=image.source_ip,
                reason="wrong address" if image.source_ip != duologue.owner_ip else "second image",
            )
            image.reject()
            return
        duologue.image = image
        duologue.ever_connected = True
        self.events.emit(
            "duologue_connected",
            duologue_id=duologue.duologue_id,
            source_ip=image.source_ip,
            source_port=image.source_port,
        )

    def _on_image_gone(self, duologue: Duologue, image: Image) -> None:
        if duologue.image is image:
            duologue.image = None

    async def _run_duologue(self, duologue: Duologue) -> None:
        reason = "client gone"
        try:
            with duologue.cancel_scope:
                reason = await self._duologue_loop(duologue)
        finally:
            with trio.CancelScope(shield=True):
                await self._delete(duologue, reason)

    async def _duologue_loop(self, duologue: Duologue) -> str:
        subscription = duologue.subscription
        publication = duologue.publication
        assert subscription is not None and publication is not None
        expires = duologue.created + self.config.duologue_expiry
        # Whether a poll may find something the last one did not: after a wake-up, after a
        # full batch, or after this task yielded (other tasks may then have read the socket).
        # A poll that returned less than a batch, followed by work that did not yield, leaves
        # nothing behind: wait for the socket at once instead of polling twice per message.
        more = True
        received: list[Message] = []
        while True:
            if duologue.image is None:
                if duologue.ever_connected:
                    return "client gone"
                # Nobody joined yet: wait for a join or the expiry (§4.3: spoofed HELLOs die here).
                if trio.current_time() >= expires:
                    return "expired"
                with trio.move_on_at(expires):
                    await subscription.wait_activity()
                more = True
                continue
            if not more:
                await subscription.wait_activity()
            received.clear()
            more = subscription.poll(received.append, fragment_limit=_DUOLOGUE_BATCH) >= (
                _DUOLOGUE_BATCH
            )
            for message in received:
                if message.source_ip != duologue.owner_ip:
                    continue
                request = parse_duologue_request_untrusted(message.data)
                try:
                    if isinstance(request, Echo):
                        # A valid ECHO is, byte for byte, its own reply (`ECHO <text>` both
                        # ways, strict UTF-8): send it back rather than format it anew.
                        reply = message.data
                        if publication.offer(reply) <= 0:
                            # Back pressure or a term rotation: retry (and so yield) a while.
                            await publication.send(reply, timeout=0.5)
                            more = True
                        duologue.messages += 1
                    else:
                        await publication.send(format_message(DuologueError(ERROR_BAD_MESSAGE)))
                        await publication.close(timeout=1.0)
                        return "bad message"
                except SendError:
                    return "send failed"

    async def _delete(self, duologue: Duologue, reason: str) -> None:
        """Free everything the duologue holds, exactly once, whatever path got us here."""
        if duologue.freed:
            return
        duologue.freed = True
        duologue.close_reason = reason
        self.duologues.pop(duologue.duologue_id, None)
        self.ports.free(duologue.data_port)
        self.ports.free(duologue.control_port)
        self.sessions.free(duologue.session_id)
        self.per_ip.decrement(duologue.owner_key)
        duologue.cancel_scope.cancel()
        lifetime = trio.current_time() - duologue.created
        if reason == "expired":
            self.events.emit(
                "duologue_expired",
                duologue_id=duologue.duologue_id,
                source_ip=duologue.owner_ip,
                source_prefix=duologue.owner_key,
                age_s=round(lifetime, 6),
            )
        self.events.emit(
            "duologue_closed",
            duologue_id=duologue.duologue_id,
            source_ip=duologue.owner_ip,
            source_prefix=duologue.owner_key,
            reason=reason,
            lifetime_s=round(lifetime, 6),
            messages=duologue.messages,
        )
        for stream in (duologue.subscription, duologue.publication):
            if stream is None:
                continue
            try:
                if isinstance(stream, Publication):
                    if not stream.is_closed:
                        await stream.close(timeout=0.0)
                else:
                    await stream.close()
            except (trio.ClosedResourceError, OSError):
                pass
        # The subscription's image callbacks hold the duologue, which holds the subscription:
        # without this the pair (with its sockets and term buffers) waits for a full pass of
        # the cyclic collector, which takes 100-200 ms with 1,000 duologues open.
        duologue.subscription = None
        duologue.publication = None
        duologue.image = None
