"""The Echo 2.0 server: the ECHO application on the session library (io7m Aeron guide §4.4-§4.5).

Admission, duologues, allocators, limits, expiry and goodbyes are `echo.session`'s; what is
Echo here is the application alone: every valid ``ECHO <text>`` is sent back, anything else
gets ``ERROR bad message`` and the duologue is closed.
"""

from __future__ import annotations

from typing import Any

from echo.protocol import ERROR_BAD_MESSAGE, Echo, parse_duologue_request_untrusted
from echo.session.config import ServerConfig
from echo.session.server import (
    Duologue,
    EventSink,
    SessionServer,
    server_transport_config,
)
from echo.session.session import Session
from echo.transport import TransportConfig

__all__ = ["Duologue", "EchoServer", "EventSink", "echo_application", "server_transport_config"]


async def echo_application(session: Session) -> None:
    """ECHO: answer each valid request with itself; close on anything else."""
    async for data in session:
        if isinstance(parse_duologue_request_untrusted(data), Echo):
            # A valid ECHO is, byte for byte, its own reply (`ECHO <text>` both ways, strict
            # UTF-8): send it back rather than format it anew.
            await session.send(data)
        else:
            await session.close(ERROR_BAD_MESSAGE)
            return


class EchoServer(SessionServer):
    """`SessionServer` running `echo_application`: what `echo-server` runs."""

    def __init__(
        self,
        config: ServerConfig,
        *,
        transport_config: TransportConfig | None = None,
        events: EventSink | None = None,
        rng: Any = None,
    ) -> None:
        super().__init__(
            config, echo_application, transport_config=transport_config, events=events, rng=rng
        )
