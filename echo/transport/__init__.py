"""echo.transport: the Aeron UDP wire protocol on trio, in pure Python.

Knows nothing of Echo 2.0: `echo.server` and `echo.client` build on it, never the reverse.
The protocol is `echo.transport.core` (pure: no trio, no clock, no socket), its trio side
`echo.transport.driver`; this package's names are the public api (docs/architecture.md, "The
transport's seam").
"""

# Before anything imports a compiled module: an extension built from an older source must
# fail loudly here, not shadow the edited source (see echo.transport.compiled).
import os as _os

from echo.transport.compiled import check_not_stale as _check_not_stale
from echo.transport.compiled import prefer_sources as _prefer_sources

if _os.environ.get("ECHO_INTERPRETED") == "1":
    _prefer_sources()
else:
    _check_not_stale()

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
from echo.transport.core.config import TransportConfig
from echo.transport.core.uri import UriError

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
