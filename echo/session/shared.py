"""--duologue-ports shared: every duologue on the server's two duologue ports.

The ports: the first carries every client's requests (one session-specific subscription per
duologue, all on one socket, told apart by session id); the second is the control port of the
response publications, one per joined duologue, each answering its client's request image as
an Aeron 1.48 response channel (echo.transport.core.response), so that it reaches that client alone,
through the hole the client's own status messages punched in its NAT.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from echo.session.allocators import AllocationError, PortAllocator

if TYPE_CHECKING:
    from echo.transport import Image


class SharedPorts(PortAllocator):
    """--duologue-ports shared: every duologue gets the same pair, the server's request port
    and response control port; what limits duologues is --max-clients, not ports."""

    def __init__(self, data_port: int, control_port: int) -> None:
        super().__init__(data_port, 2)
        self.pair = (data_port, control_port)
        self.holders = 0

    @property
    def available(self) -> int:
        return 2

    @property
    def in_use(self) -> int:
        return 2 * self.holders

    def __contains__(self, port: object) -> bool:
        return self.holders > 0 and port in self.pair

    def allocate(self) -> int:
        raise AllocationError("shared duologue ports are handed out in pairs")

    def allocate_pair(self) -> tuple[int, int]:
        self.holders += 1
        return self.pair

    def free(self, port: int) -> None:
        if port not in self.pair or self.holders <= 0:
            raise AllocationError(f"port {port} is not held (double free?)")
        if port == self.pair[1]:
            self.holders -= 1  # a pair is freed data port first, then control port


def response_channel(host: str, control_port: int, image: Image, session_id: int) -> str:
    """The server's answer to a client's request image on the shared ports: a response
    channel (Aeron 1.48) that reaches that client alone."""
    return (
        f"aeron:udp?control-mode=response|control={host}:{control_port}"
        f"|response-correlation-id={image.correlation_id}|session-id={session_id}"
    )
