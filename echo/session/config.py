"""Echo 2.0 server configuration (the io7m Aeron guide's EchoServerConfiguration).

Validation happens at construction so a bad command line fails before any socket is bound, with
a message naming the CLI flag to change. The guide hard-coded the per-address limit (3) and the
duologue expiry (10 s) in its code; both are options here.
"""

from __future__ import annotations

import enum
import ipaddress
import math
from typing import Any

import attrs

from echo.protocol import ECHO_STREAM_ID
from echo.session.crypto import ServerKey


def _port(flag: str) -> Any:
    def check(_inst: object, _attr: attrs.Attribute[int], value: int) -> None:
        _require_int(flag, value)
        if not 1 <= value <= 65535:
            raise ValueError(f"{flag} must be within 1..65535, got {value}")

    return check


def _at_least_one(flag: str) -> Any:
    def check(_inst: object, _attr: attrs.Attribute[int], value: int) -> None:
        _require_int(flag, value)
        if value < 1:
            raise ValueError(f"{flag} must be at least 1, got {value}")

    return check


def _require_int(flag: str, value: object) -> None:
    # bool is an int subclass; `--max-clients True` is a bug, not 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{flag} must be an integer, got {value!r}")


def _check_address(_inst: object, _attr: attrs.Attribute[str], value: str) -> None:
    # A literal, not a host name: it is both the bind address and (through NAT) the address
    # clients are told to use, and resolving names is the driver's business, not the config's.
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise ValueError(f"--address must be an IP address literal, got {value!r}") from None


def _check_expiry(_inst: object, _attr: attrs.Attribute[float], value: float) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"--duologue-expiry must be a positive number of seconds, got {value!r}")


def _check_ipv6_prefix(_inst: object, _attr: attrs.Attribute[int], value: int) -> None:
    _require_int("--ipv6-prefix", value)
    if not 0 <= value <= 128:
        raise ValueError(f"--ipv6-prefix must be within 0..128, got {value}")


def _check_stream_id(_inst: object, _attr: attrs.Attribute[int], value: int) -> None:
    _require_int("stream_id", value)
    if not -(2**31) <= value <= 2**31 - 1:
        raise ValueError(f"stream_id must be an int32, got {value}")


class DuologuePorts(enum.Enum):
    """Where duologues live (--duologue-ports).

    PER_CLIENT: two ports of its own per duologue, from --clients-base-port (Echo 2.0 as the
    guide built it: what the Java Echo client and plain Aeron MDC peers speak).
    SHARED: every duologue on the same two ports, --clients-base-port (requests) and the one
    after it (responses), told apart by session id: Aeron 1.48's response channels. Needs a
    client that opens its duologue as a response channel (echo-client, echo.session.connect
    with duologue_ports="shared").
    """

    SHARED = "shared"
    PER_CLIENT = "per-client"


def _duologue_ports(value: object) -> DuologuePorts:
    try:
        return DuologuePorts(value)
    except ValueError:
        raise ValueError(
            f"--duologue-ports must be 'shared' or 'per-client', got {value!r}"
        ) from None


class Encryption(enum.Enum):
    """Which clients a server serves (--encryption; see echo.session.crypto).

    REQUIRED: only clients that encrypt (a plain HELLO hears "encryption required").
    OPTIONAL: both; a client that sends its key gets an encrypted session, Echo 2.0's plain
    clients (the guide's Java client, plain Aeron peers) a session in the clear.
    OFF: every session in the clear; a HELLO with a key hears "encryption not offered".
    """

    REQUIRED = "required"
    OPTIONAL = "optional"
    OFF = "off"


def _encryption(value: object) -> Encryption | None:
    if value is None:
        return None
    try:
        return Encryption(value)
    except ValueError:
        raise ValueError(
            f"--encryption must be 'required', 'optional' or 'off', got {value!r}"
        ) from None


@attrs.frozen
class ServerConfig:
    """Everything `echo-server` needs to know.

    address            IP the server binds and clients reach (--address)
    port               all-clients subscription data port; clients send HELLO here (--port)
    control_port       all-clients publication MDC control port (--control-port)
    clients_base_port  duologue ports are [base, base + 2 * max_clients) (--clients-base-port)
    max_clients        live duologues at most; beyond that "server full" (--max-clients)
    max_per_ip         live duologues per address key (--max-per-ip)
    duologue_expiry    seconds a duologue may wait for its client (--duologue-expiry)
    ipv6_prefix        IPv6 clients are counted per network of this many bits (--ipv6-prefix)
    stream_id          the stream id of every channel (the guide's 0x2044F002)
    duologue_ports     per-client (two ports per duologue) or shared (two for all)
                       (--duologue-ports; see DuologuePorts)
    key                the server's static key (--key FILE; echo.session.crypto)
    encryption         required, optional or off (--encryption; see Encryption); None, the
                       default, means optional with a key and off without one
    """

    address: str = attrs.field(default="127.0.0.1", validator=_check_address)
    port: int = attrs.field(default=9000, validator=_port("--port"))
    control_port: int = attrs.field(default=9001, validator=_port("--control-port"))
    clients_base_port: int = attrs.field(default=9010, validator=_port("--clients-base-port"))
    max_clients: int = attrs.field(default=16, validator=_at_least_one("--max-clients"))
    max_per_ip: int = attrs.field(default=3, validator=_at_least_one("--max-per-ip"))
    duologue_expiry: float = attrs.field(default=10.0, validator=_check_expiry)
    ipv6_prefix: int = attrs.field(default=64, validator=_check_ipv6_prefix)
    stream_id: int = attrs.field(default=ECHO_STREAM_ID, validator=_check_stream_id)
    duologue_ports: DuologuePorts = attrs.field(
        default=DuologuePorts.PER_CLIENT, converter=_duologue_ports
    )
    #: give a resume secret to clients that ask ("+R" in their HELLO; echo.session.resume);
    #: per-client duologue ports only (with shared ports no secret is given out)
    resume: bool = True
    key: ServerKey | None = attrs.field(default=None, repr=False)
    encryption: Encryption | None = attrs.field(default=None, converter=_encryption)

    def __attrs_post_init__(self) -> None:
        if self.key is not None and not isinstance(self.key, ServerKey):
            raise ValueError(f"key must be a ServerKey (echo.session.crypto), got {self.key!r}")
        if self.encryption in (Encryption.REQUIRED, Encryption.OPTIONAL) and self.key is None:
            raise ValueError(
                f"--encryption {self.encryption.value} needs --key FILE "
                "(make one with: echo-keygen FILE)"
            )
        # Cross-field checks: the two all-clients ports and the duologue range must be disjoint,
        # or the server would try to bind one port twice.
        if self.port == self.control_port:
            raise ValueError(f"--port and --control-port must differ (both are {self.port})")
        last = self.clients_base_port + self.clients_port_count - 1
        if last > 65535:
            raise ValueError(
                f"--clients-base-port {self.clients_base_port} with --max-clients "
                f"{self.max_clients} needs ports up to {last}, beyond 65535"
            )
        for flag, value in (("--port", self.port), ("--control-port", self.control_port)):
            if self.clients_base_port <= value <= last:
                raise ValueError(
                    f"{flag} {value} lies inside the duologue port range "
                    f"{self.clients_base_port}..{last} (--clients-base-port, --max-clients)"
                )

    @property
    def encryption_mode(self) -> Encryption:
        """The mode in force: `encryption`, or (None) optional with a key, off without."""
        if self.encryption is not None:
            return self.encryption
        return Encryption.OFF if self.key is None else Encryption.OPTIONAL

    @property
    def shared(self) -> bool:
        return self.duologue_ports is DuologuePorts.SHARED

    @property
    def clients_port_count(self) -> int:
        """Two ports per duologue: data and control (the guide §4.5); two in all when shared."""
        return 2 if self.shared else 2 * self.max_clients

    @property
    def clients_port_range(self) -> range:
        return range(self.clients_base_port, self.clients_base_port + self.clients_port_count)
