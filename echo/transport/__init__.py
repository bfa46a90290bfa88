"""echo.transport: the Aeron UDP wire protocol on trio, in pure Python.

Knows nothing of Echo 2.0: `echo.server` and `echo.client` build on it, never the reverse.
"""

from echo.transport.api import (
    ADMIN_ACTION,
    BACK_PRESSURED,
    CLOSED,
    MAX_POSITION_EXCEEDED,
    NOT_CONNECTED,
    Image,
    Message,
    Publication,
    SendError,
    Subscription,
    Transport,
    open_transport,
)
from echo.transport.config import TransportConfig
from echo.transport.uri import UriError

__all__ = [
    "ADMIN_ACTION",
    "BACK_PRESSURED",
    "CLOSED",
    "MAX_POSITION_EXCEEDED",
    "NOT_CONNECTED",
    "Image",
    "Message",
    "Publication",
    "SendError",
    "Subscription",
    "Transport",
    "TransportConfig",
    "UriError",
    "open_transport",
]
