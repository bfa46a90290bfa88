"""How the driver wires a stream: a channel URI becomes a socket, an endpoint, the pure state
and the channel object the api holds (channels.py).

Streams whose URIs name the same local address share a socket and its endpoint (Aeron's send
and receive channel endpoints): a socket's key says which. Closing the last stream of a socket
closes it.
"""

from __future__ import annotations

import ipaddress
import random
import socket
from typing import Any, Protocol

import attrs
import trio

from echo.transport.core.config import TransportConfig
from echo.transport.core.flow_control import make_flow_control
from echo.transport.core.logbuffer import check_term_length
from echo.transport.core.receiver import ReceiveEndpoint, StreamInterest
from echo.transport.core.response import RequestPublication, ResponsePublication
from echo.transport.core.sender import NetworkPublication, SendEndpoint, SendMode
from echo.transport.core.uri import (
    ChannelUri,
    ControlMode,
    UriAddress,
    UriError,
    parse_channel_uri,
)
from echo.transport.core.validation import CookieJar
from echo.transport.driver import response_wiring
from echo.transport.driver.channels import ImageLink, PublicationChannel, SubscriptionChannel
from echo.transport.driver.response_wiring import ResponseDriver
from echo.transport.driver.sockets import DriverSocket, ReceiveSocket, SendSocket

#: candidates `next_session_id` tries before it declares the id space full
_SESSION_ID_TRIES = 1 << 16
#: receiver ids are positive i64 (Aeron's correlation ids)
_I64_POSITIVE = 0x7FFFFFFFFFFFFFFF
_I32_MIN = -(2**31)
_I32_MAX = 2**31 - 1


class StreamIds:
    """Session ids for publications, receiver ids for receive endpoints, initial term ids.

    It also knows which session ids the transport's open publications use: a count per id,
    kept as publications are opened and released, so that neither a new publication's id nor
    the check of an explicit `session-id=` looks at every publication (at 4,000 members a
    lobby server's duologue opens spent 3 % of their CPU collecting those ids).
    """

    def __init__(self, config: TransportConfig, rng: random.Random) -> None:
        self._rng = rng
        self._low = config.reserved_session_low
        self._high = config.reserved_session_high
        self._next_session = self._random_unreserved()
        self._receiver_id_base = rng.getrandbits(63)
        self._receiver_ids = 0
        #: session id -> how many open publications use it
        self._sessions: dict[int, int] = {}

    def session_in_use(self, session_id: int) -> bool:
        return session_id in self._sessions

    def claim_session(self, session_id: int) -> None:
        """A publication with `session_id` is open (wiring.open_publication)."""
        self._sessions[session_id] = self._sessions.get(session_id, 0) + 1

    def release_session(self, session_id: int) -> None:
        """A publication with `session_id` is gone for good: its id is free once no other
        open publication uses it."""
        left = self._sessions.get(session_id, 0) - 1
        if left > 0:
            self._sessions[session_id] = left
        else:
            self._sessions.pop(session_id, None)

    def release_all_sessions(self) -> None:
        """Every publication is gone at once (the transport shuts down)."""
        self._sessions.clear()

    def next_session_id(self) -> int:
        """A session id outside the reserved range, not used by another publication here.

        Aeron jumps to `high + 1` when its counter enters the reserved range, so with Echo's
        range [1, 2^31 - 1] every such client got -2^31 and two of them clashed on the server.
        Here a counter that enters the reserved range restarts at a random allowed value.
        """
        low, high = self._low, self._high
        for _ in range(_SESSION_ID_TRIES):
            candidate = self._next_session
            self._next_session = ((candidate + 1 - _I32_MIN) % 2**32) + _I32_MIN
            if low <= candidate <= high:
                self._next_session = self._random_unreserved()
                continue
            if candidate not in self._sessions:
                return candidate
        raise RuntimeError("no free session id outside the reserved range")

    def _random_unreserved(self) -> int:
        low, high = self._low, self._high
        below = max(0, low - _I32_MIN)  # how many ids lie under the range
        above = max(0, _I32_MAX - high)
        pick = self._rng.randrange(below + above)
        return _I32_MIN + pick if pick < below else high + 1 + (pick - below)

    def next_receiver_id(self) -> int:
        self._receiver_ids += 1
        return (self._receiver_id_base + self._receiver_ids) & _I64_POSITIVE

    def initial_term_id(self) -> int:
        return self._rng.randrange(_I32_MIN, _I32_MAX + 1)


async def _resolve(address: UriAddress) -> tuple[int, tuple[str, int]]:  # family, sockaddr
    host = address.host
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        try:
            infos = await trio.socket.getaddrinfo(host, address.port, type=socket.SOCK_DGRAM)
        except OSError as error:
            raise UriError(f"cannot resolve host {host!r}: {error}") from None
        family, _, _, _, sockaddr = infos[0]
        return family, (str(sockaddr[0]), int(sockaddr[1]))
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    return family, (str(ip), address.port)


def _wildcard(family: int) -> tuple[str, int]:
    return ("::", 0) if family == socket.AF_INET6 else ("0.0.0.0", 0)


async def _send_socket(driver: WiringDriver, uri: ChannelUri) -> tuple[SendSocket, bool]:
    """The send socket a publication on `uri` goes out of (shared by key), and whether the
    channel is multi-destination."""
    if uri.control_mode is ControlMode.DYNAMIC:
        assert uri.control is not None
        family, bind = await _resolve(uri.control)
        key: object = ("pub-mdc", bind)
        mode = SendMode.DYNAMIC
        remote = None
    elif uri.control_mode is ControlMode.MANUAL:
        if uri.control is not None:
            family, bind = await _resolve(uri.control)
            key = ("pub-mdc", bind)
        else:
            family, bind = socket.AF_INET, ("0.0.0.0", 0)
            key = ("pub-manual", object())
        mode = SendMode.MANUAL
        remote = None
    else:
        assert uri.endpoint is not None
        family, remote = await _resolve(uri.endpoint)
        bind = _wildcard(family)
        key = ("pub", remote)
        if uri.response_correlation_id is not None:
            # A request publication goes out of a socket of its own, as a per-client duologue
            # does, though Aeron's would share one with every publication to the same
            # endpoint: a bot farm's thousand sessions to one server port would then make
            # every SM or NAK for one of them a poll of all (SendEndpoint.poll), and an idle
            # session cost its client 3 x the CPU per datagram (bench.idle --ports shared).
            # The wire is the same; the server sees one more source port per session.
            key = ("pub-request", remote, uri.response_correlation_id)
        mode = SendMode.UNICAST
    udp = driver.endpoints.get(key)
    if not isinstance(udp, SendSocket):
        config = driver.config
        sock = driver.open_socket(bind, family)
        endpoint = SendEndpoint(
            mode=mode,
            counters=driver.counters,
            remote=remote,
            destination_timeout=config.destination_timeout,
            max_destinations=config.max_destinations,
            cookies=driver.cookies,
            limiter=driver.limiter,
        )
        udp = SendSocket(sock, key, endpoint)
        driver.register(udp)
    return udp, uri.control_mode is not None


async def _publication_socket(
    driver: WiringDriver, uri: ChannelUri, channel: str
) -> tuple[SendSocket, bool, ImageLink | None]:
    """The socket a publication goes out of, whether it is multi-destination, and for a
    response publication (control-mode=response) the image it answers."""
    if not uri.is_response:
        if uri.response_correlation_id is not None:
            response_wiring.check_response_subscription(driver, uri)
        udp, multi = await _send_socket(driver, uri)
        return udp, multi, None
    request_image = response_wiring.find_request_image(driver, uri)
    if uri.control is None:
        raise UriError(f"{channel}: a response publication needs control=host:port")
    family, bind = await _resolve(uri.control)
    return response_wiring.response_socket(driver, bind, family), False, request_image


def _session_id(ids: StreamIds, uri: ChannelUri, channel: str) -> int:
    """The URI's `session-id=` if no open publication uses it, else a free automatic one."""
    if uri.session_id is None:
        return ids.next_session_id()
    if ids.session_in_use(uri.session_id):
        raise UriError(
            f"{channel}: existing publication has clashing session-id {uri.session_id}"
        )
    return uri.session_id


def _publication_state(
    driver: WiringDriver,
    uri: ChannelUri,
    stream_id: int,
    session_id: int,
    multi: bool,
    request_image: ImageLink | None,
) -> NetworkPublication:
    """The pure publication: a plain one, a response publication answering `request_image`,
    or a request publication that asks for a response channel."""
    config = driver.config
    term_length = uri.term_length or config.term_length
    timers = config.sender_timers()
    if uri.linger is not None:
        timers = attrs.evolve(timers, linger=uri.linger)
    kind: type[NetworkPublication] = NetworkPublication
    extra: dict[str, Any] = {}
    if request_image is not None:
        kind = ResponsePublication
        extra = {"image": request_image.image, "expected_host": request_image.source_ip}
    elif uri.response_correlation_id is not None:
        kind = RequestPublication
        extra = {"response_correlation_id": uri.response_correlation_id}
    return kind(
        **extra,
        session_id=session_id,
        stream_id=stream_id,
        initial_term_id=(
            uri.init_term_id if uri.init_term_id is not None else driver.ids.initial_term_id()
        ),
        term_length=term_length,
        mtu=uri.mtu or config.mtu,
        flow_control=make_flow_control(uri.fc, multi_destination=multi),
        counters=driver.counters,
        now=driver.now(),
        is_group=multi,
        timers=timers,
        max_retransmits=config.max_retransmits,
        ttl=0,
    )


class WiringDriver(ResponseDriver, Protocol):
    """What wiring asks of the driver (loop.Driver is one): its sockets by key, the clock, ids
    and the generator, and the socket services. A protocol, so that this module does not
    import the driver, which builds on it."""

    @property
    def ids(self) -> StreamIds: ...

    @property
    def rng(self) -> random.Random: ...

    @property
    def cookies(self) -> CookieJar | None: ...

    @property
    def sockets(self) -> list[DriverSocket]: ...

    def unregister(self, udp: DriverSocket) -> None: ...

    def service(self, udp: DriverSocket, now: float) -> None: ...

    def close(self) -> None: ...


async def open_publication(
    driver: WiringDriver, channel: str, stream_id: int
) -> PublicationChannel:
    uri = parse_channel_uri(channel)
    uri.check_publication()
    check_term_length(uri.term_length or driver.config.term_length)
    udp, multi, request_image = await _publication_socket(driver, uri, channel)
    session_id = _session_id(driver.ids, uri, channel)
    state = _publication_state(driver, uri, stream_id, session_id, multi, request_image)
    udp.endpoint.add(state)
    publication = PublicationChannel(driver, udp, state, channel)
    udp.channels.append(publication)
    driver.ids.claim_session(session_id)
    if isinstance(state, ResponsePublication) and request_image is not None:
        response_wiring.start_answering(driver, state, request_image)
    elif isinstance(state, RequestPublication):
        response_wiring.route_response_setups(driver, state)
    driver.wake(udp)
    return publication


async def _receive_socket(driver: WiringDriver, uri: ChannelUri) -> ReceiveSocket:
    """The receive socket a subscription on `uri` reads (shared by key: the same endpoint
    and control address, or a response channel's)."""
    control: tuple[str, int] | None = None
    family: int = socket.AF_INET
    if uri.control is not None:
        family, control = await _resolve(uri.control)
    if uri.endpoint is not None:
        family, bind = await _resolve(uri.endpoint)
        key: object = ("sub-response" if uri.is_response else "sub", bind, control)
    else:
        bind = _wildcard(family)
        key = ("sub", object(), control)
    udp = driver.endpoints.get(key)
    if isinstance(udp, ReceiveSocket):
        return udp
    config = driver.config
    sock = driver.open_socket(bind, family)
    endpoint = ReceiveEndpoint(
        counters=driver.counters,
        receiver_id=driver.ids.next_receiver_id(),
        now=driver.now(),
        control=control,
        group_tag=uri.gtag,
        timers=config.receiver_timers(uri.nak_delay),
        rng=driver.rng,
        limit_amplification=config.validate_addresses,
        max_images=config.max_images,
        limiter=driver.limiter,
        response=uri.is_response,
    )
    udp = ReceiveSocket(sock, key, endpoint)
    driver.register(udp)
    return udp


async def open_subscription(
    driver: WiringDriver, channel: str, stream_id: int
) -> SubscriptionChannel:
    uri = parse_channel_uri(channel)
    uri.check_subscription()
    if uri.is_response and uri.control is None:
        raise UriError(f"{channel}: a response subscription needs control=host:port")
    udp = await _receive_socket(driver, uri)
    config = driver.config
    interest = StreamInterest(
        stream_id=stream_id,
        session_id=uri.session_id,
        reliable=uri.reliable,
        rcv_wnd=uri.rcv_wnd or config.rcv_wnd,
        group_tag=uri.gtag,
        max_term_length=config.max_receiver_term_length,
    )
    udp.endpoint.add_interest(interest, driver.now())
    subscription = SubscriptionChannel(
        driver,
        udp,
        stream_id,
        channel,
        session_id=uri.session_id,
        registration_id=driver.ids.next_receiver_id(),
    )
    udp.subscriptions[(stream_id, uri.session_id)] = subscription
    if uri.is_response:
        response_wiring.register_response_subscription(driver, subscription)
    driver.wake(udp)
    return subscription


def release_publication(driver: WiringDriver, publication: PublicationChannel) -> None:
    udp = publication.socket
    response_wiring.stop_answering(publication.state)
    udp.endpoint.remove(publication.state)
    if publication in udp.channels:
        udp.channels.remove(publication)
        driver.ids.release_session(publication.session_id)
    if not udp.channels:
        driver.unregister(udp)


def release_subscription(driver: WiringDriver, subscription: SubscriptionChannel) -> None:
    udp = subscription.socket
    udp.endpoint.remove_interest(subscription.stream_id, udp.send, subscription.session_id)
    response_wiring.forget_response_subscription(driver, subscription)
    driver.service(udp, driver.now())
    subscriptions = udp.subscriptions
    subscriptions.pop((subscription.stream_id, subscription.session_id), None)
    if not subscriptions:
        driver.unregister(udp)


def shut_down(driver: WiringDriver) -> None:
    """Close everything at once, telling peers: EOS heartbeats and EOS status messages."""
    for udp in driver.sockets:
        if isinstance(udp, SendSocket):
            endpoint = udp.endpoint
            for publication in udp.channels:
                endpoint.announce_end(publication.state, udp.send)
        elif isinstance(udp, ReceiveSocket):
            udp.endpoint.close(udp.send)
    driver.ids.release_all_sessions()
    driver.close()
