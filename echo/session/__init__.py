"""echo.session: the duologue machinery of Echo 2.0 as a library for any application.

Server side: `SessionServer(config, app)` (or `serve(config, app)`) runs the all-clients
channel, HELLO / CONNECT / ERROR admission with every check of the Echo server (validated
addresses, malformed HELLOs, full server, per-IP and per-IPv6-prefix limits, eviction of
never-joined duologues, an optional `admit(peer, credentials)` hook), the port and session
allocators, expiry and shutdown goodbyes, and calls `app(session)` once per joined session.

Client side: `async with connect(server, port, control_port) as session:` runs the handshake
and gives the same `Session` shape. With `resume=True` (the default) the session survives a
change of network path: a RESUME proves a secret from the CONNECT (`echo.session.resume`).

Encryption (`echo.session.crypto`): with a server key (`ServerConfig(key=...,
encryption=...)`) and a client that pins it (`connect(..., server_key=...)`), every message of
the session is sealed with ChaCha20-Poly1305 under keys agreed in the HELLO / CONNECT.

Pure parts (no trio, no clock): `admission`, `allocators`, `limits`, `config`, `machine`,
`resume`, `crypto`, `keywire`.
Layering: imports only `echo.transport` and `echo.protocol` (and stdlib, attrs, structlog, trio).
"""

from echo.session.admission import Admission, Decision, JoinVerdict, Slot
from echo.session.client import connect
from echo.session.config import DuologuePorts, Encryption, ServerConfig
from echo.session.crypto import Pin, ServerKey
from echo.session.server import (
    Admit,
    Admitted,
    Application,
    SessionServer,
    serve,
    server_transport_config,
)
from echo.session.session import (
    HandshakeTimeout,
    LostContact,
    PeerClosed,
    ProtocolViolation,
    Rejected,
    Session,
    SessionClosed,
    SessionCounters,
    SessionError,
    Untrusted,
)

__all__ = [
    "Admission",
    "Admit",
    "Admitted",
    "Application",
    "Decision",
    "DuologuePorts",
    "Encryption",
    "HandshakeTimeout",
    "JoinVerdict",
    "LostContact",
    "PeerClosed",
    "Pin",
    "ProtocolViolation",
    "Rejected",
    "ServerConfig",
    "ServerKey",
    "Session",
    "SessionClosed",
    "SessionCounters",
    "SessionError",
    "SessionServer",
    "Slot",
    "Untrusted",
    "connect",
    "serve",
    "server_transport_config",
]
