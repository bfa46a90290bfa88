"""A server's duologue ports, held from its start to its stop.

A server binds its two all-clients ports at start; its duologue ports are bound by the
transport only while a duologue uses them. Without more, a second server given the same
duologue range (or another program) would start without complaint and take them, and the
first would refuse its clients as "server full" the moment it needed one. So a server binds
every duologue port at start, with a placeholder socket of its own, and fails there, naming the
port, if one is taken. The transport's socket factory lets the placeholder go just before it
binds the port itself, and once the transport has closed that socket again (`returned`,
`sweep`) a new placeholder holds the port.

A placeholder is never read. Its receive buffer is made as small as the kernel allows, so that
datagrams sent to an idle port cost little.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable

import structlog

from echo.transport.driver.sockets import SocketFactory, open_udp_socket

log = structlog.get_logger("echo.session")


class HeldPorts:
    """The ports `ports` of `address`, bound from `hold()` to `close()`.

    `socket_factory` is the transport's (sockets.SocketFactory): for a held port it closes the
    placeholder and has `inner` bind the port at once. `returned(ports)`: the server is done
    with those ports (a duologue ended); `sweep()` holds again each of them whose transport
    socket is closed by now.
    """

    def __init__(
        self,
        address: str,
        ports: Iterable[int],
        inner: SocketFactory = open_udp_socket,
        describe: str = "a duologue port",
    ) -> None:
        self.address = address
        self.family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self.ports = tuple(ports)
        self._range = frozenset(self.ports)
        self.inner = inner
        self.describe = describe
        #: the placeholders of the ports no transport socket uses now
        self.idle: dict[int, socket.socket] = {}
        #: the transport's socket on each held port it bound
        self.lent: dict[int, socket.socket] = {}
        #: ports the server is done with, held again once the transport's socket is closed
        self.pending: set[int] = set()
        self._closed = False

    def hold(self) -> None:
        """Bind every port now; an OSError naming the first one that is taken (and nothing
        held) if any is."""
        for port in self.ports:
            try:
                self.idle[port] = self._bind(port)
            except OSError as error:
                self.close()
                host = f"[{self.address}]" if ":" in self.address else self.address
                raise OSError(
                    error.errno,
                    f"cannot bind UDP {host}:{port} ({self.describe}): {error.strerror}",
                ) from None

    def _bind(self, port: int) -> socket.socket:
        sock = socket.socket(self.family, socket.SOCK_DGRAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)  # the kernel's least
            sock.bind((self.address, port))
        except OSError:
            sock.close()
            raise
        return sock

    def socket_factory(
        self, bind: tuple[str, int], family: int, rcvbuf: int, sndbuf: int
    ) -> socket.socket:
        """The transport's socket factory: `inner`'s socket, the placeholder let go first."""
        port = bind[1]
        placeholder = self.idle.pop(port, None)
        if placeholder is not None:
            placeholder.close()
        try:
            sock = self.inner(bind, family, rcvbuf, sndbuf)
        except OSError:
            if placeholder is not None:
                self._hold_again(port)
            raise
        if port in self._range:
            self.lent[port] = sock
            self.pending.discard(port)
        return sock

    def returned(self, ports: Iterable[int]) -> None:
        """The server no longer uses `ports`; hold those the transport has let go already."""
        self.pending.update(port for port in ports if port in self.lent)
        self.sweep()

    def sweep(self) -> None:
        """Hold again every returned port whose transport socket is closed by now."""
        for port in [p for p in self.pending if self.lent[p].fileno() == -1]:
            self.pending.discard(port)
            del self.lent[port]
            self._hold_again(port)

    def _hold_again(self, port: int) -> None:
        if self._closed or port in self.idle:
            return
        try:
            self.idle[port] = self._bind(port)
        except OSError as error:
            # Somebody took it in the instant between: the port is bound on demand again
            # (a duologue that cannot bind it tries another pair).
            log.warning("duologue_port_not_held", port=port, error=str(error))

    def close(self) -> None:
        """Let every port go (the transport's own sockets are the transport's to close)."""
        self._closed = True
        for sock in self.idle.values():
            sock.close()
        self.idle = {}
        self.pending = set()
