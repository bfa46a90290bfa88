"""How the driver wires response channels (response.py): which image a response publication
answers, the server's shared control socket, and how an RSP_SETUP heard by a request
publication reaches the client's response subscription (DriverConductor.responseSetup).

The rules of DriverConductor (aeron-io/aeron 1.48+), with its messages:
- a publication with control-mode=response needs response-correlation-id, naming an image of
  this transport whose SETUP carried SETUP_SEND_RESPONSE_FLAG;
- a request publication's response-correlation-id must name a subscription of this transport
  (validateResponseSubscription);
- response publications on one control address share its socket, demultiplexed by session.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any, Protocol

from echo.transport.core.config import TransportConfig
from echo.transport.core.counters import Counters
from echo.transport.core.response import (
    RequestPublication,
    ResponsePublication,
    ResponseSendEndpoint,
)
from echo.transport.core.uri import ChannelUri, UriError
from echo.transport.core.validation import RateLimiter
from echo.transport.driver.channels import ChannelDriver, ImageLink, SubscriptionChannel
from echo.transport.driver.sockets import DriverSocket, SendSocket


class ResponseDriver(ChannelDriver, Protocol):
    """What response wiring asks of the driver (loop.Driver is one). A protocol, so that this
    module does not import the driver, which builds on it."""

    now: Callable[[], float]
    endpoints: dict[Any, DriverSocket]
    response_subscriptions: dict[int, SubscriptionChannel]

    @property
    def config(self) -> TransportConfig: ...

    @property
    def counters(self) -> Counters: ...

    @property
    def limiter(self) -> RateLimiter: ...

    def subscriptions(self) -> list[SubscriptionChannel]: ...

    def open_socket(self, bind: tuple[str, int], family: int) -> socket.socket: ...

    def register(self, udp: DriverSocket) -> None: ...


def find_request_image(driver: ResponseDriver, uri: ChannelUri) -> ImageLink:
    """The image a response publication on `uri` answers (findResponsePublicationImage)."""
    correlation_id = uri.response_correlation_id
    if correlation_id is None:
        raise UriError(
            f"{uri.build()}: control-mode=response was specified, but no"
            " response-correlation-id set"
        )
    for subscription in driver.subscriptions():
        for link in subscription.images:
            if link.correlation_id == correlation_id:
                if not link.requested_response:
                    raise UriError(
                        f"image.correlationId={correlation_id} did not request a response channel"
                    )
                return link
    raise UriError(f"image.correlationId={correlation_id} not found")


def check_response_subscription(driver: ResponseDriver, uri: ChannelUri) -> None:
    """A request publication names a response subscription of this transport."""
    correlation_id = uri.response_correlation_id
    if correlation_id not in driver.response_subscriptions:
        raise UriError(
            f"unable to find response subscription for response-correlation-id={correlation_id}"
        )


def response_socket(driver: ResponseDriver, bind: tuple[str, int], family: int) -> SendSocket:
    """The server's control socket of a response channel, shared by its response publications."""
    key = ("pub-response", bind)
    udp = driver.endpoints.get(key)
    if isinstance(udp, SendSocket):
        return udp
    sock = driver.open_socket(bind, family)
    endpoint = ResponseSendEndpoint(
        counters=driver.counters,
        destination_timeout=driver.config.destination_timeout,
        limiter=driver.limiter,
    )
    udp = SendSocket(sock, key, endpoint)
    driver.register(udp)
    return udp


def start_answering(driver: ResponseDriver, state: ResponsePublication, link: ImageLink) -> None:
    """The image sends RSP_SETUP from now on, at once (requestNextSmDeadlineReset)."""
    state.answer(driver.now())
    udp = link.subscription_socket
    udp.endpoint.touch(link.session_id, link.stream_id)
    driver.wake(udp)


def stop_answering(state: object) -> None:
    """A response publication goes: its image stops sending RSP_SETUP for it."""
    if isinstance(state, ResponsePublication):
        state.connected()


def route_response_setups(driver: ResponseDriver, state: RequestPublication) -> None:
    """An RSP_SETUP for `state` arms the response subscription it names."""

    def on_response_setup(correlation_id: int, response_session_id: int) -> None:
        subscription = driver.response_subscriptions.get(correlation_id)
        if subscription is None or subscription.closed:
            return
        udp = subscription.socket
        udp.endpoint.on_response_setup(subscription.stream_id, response_session_id, driver.now())
        driver.wake(udp)

    state.on_response_setup = on_response_setup


def register_response_subscription(
    driver: ResponseDriver, subscription: SubscriptionChannel
) -> None:
    driver.response_subscriptions[subscription.registration_id] = subscription


def forget_response_subscription(driver: ResponseDriver, subscription: SubscriptionChannel) -> None:
    driver.response_subscriptions.pop(subscription.registration_id, None)
