"""A lossy network for driver-level tests, behind the driver's socket factory.

`LossyNetwork(loss, seed)` is a `socket_factory` for `open_transport`: each socket it opens
loses `loss` of the datagrams it receives, at random (one seeded generator per network). The
datagrams are dropped after the kernel delivered them, before the driver sees them: on the wire
(and in a capture) they are there, to the transport they are lost, as on a lossy path. UDP GRO
is refused, so every datagram meets its own fate.
"""

from __future__ import annotations

import errno
import random
import socket
from typing import Any

from echo.transport.driver.sockets import SOL_UDP, UDP_GRO, open_udp_socket


class LossySocket(socket.socket):
    def __init__(self, family: int, network: LossyNetwork) -> None:
        super().__init__(family, socket.SOCK_DGRAM)
        self._network = network

    def recvfrom_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> tuple[int, Any]:
        network = self._network
        while True:
            result = super().recvfrom_into(buffer, nbytes, flags)  # BlockingIOError ends it
            if network.rng.random() >= network.loss:
                return result
            network.dropped += 1

    def setsockopt(self, level: int, option: int, value: Any, *rest: Any) -> None:
        if (level, option) == (SOL_UDP, UDP_GRO):
            raise OSError(errno.ENOPROTOOPT, "no GRO on a lossy test socket")
        super().setsockopt(level, option, value, *rest)


class LossyNetwork:
    """A socket factory whose sockets lose `loss` of what they receive."""

    def __init__(self, loss: float, seed: int) -> None:
        self.loss = loss
        self.rng = random.Random(seed)
        #: datagrams lost so far, over every socket of this network
        self.dropped = 0

    def __call__(
        self, bind: tuple[str, int], family: int, rcvbuf: int, sndbuf: int
    ) -> socket.socket:
        return open_udp_socket(bind, family, rcvbuf, sndbuf, LossySocket(family, self))
