"""Aeron channel URIs for UDP (Aeron's Channel Configuration page; its flow control for `fc=`).

    aeron:udp?endpoint=127.0.0.1:9000|reliable=true|session-id=-17

The grammar is Aeron's `ChannelUri.parse`; the accepted keys are the subset this transport
implements, and anything else is an error rather than silently ignored. Values use Aeron's
syntax: durations `5s`, `100ms`, `250us`, `1000ns` (bare = ns) and sizes `64k`, `1m`, `1g`
(bare = bytes). Hostnames are not resolved here (the driver does). Pure module.

`parse_channel_uri` takes untrusted text and raises only `UriError`.
"""

from __future__ import annotations

import enum
import ipaddress
import re
from collections.abc import Callable
from typing import Final

import attrs

MAX_URI_LENGTH: Final = 4095
URI_PREFIX: Final = "aeron:"
MEDIA_UDP: Final = "udp"

TERM_MIN_LENGTH: Final = 64 * 1024
TERM_MAX_LENGTH: Final = 1024 * 1024 * 1024
FRAME_ALIGNMENT: Final = 32
MAX_UDP_PAYLOAD_LENGTH: Final = 65504
INT32_MIN: Final = -(2**31)
INT32_MAX: Final = 2**31 - 1
INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1
# Durations are stored as float seconds; keeping them below 2^50 ns (about 13 days) keeps every
# whole-nanosecond value exact through float and back, so parse(build(uri)) == uri.
MAX_DURATION_NS: Final = 2**50

_NS_PER_SECOND: Final = 1_000_000_000
_DURATION_UNITS: Final = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}
_SIZE_UNITS: Final = {"g": 1024**3, "m": 1024**2, "k": 1024, "": 1}
_DURATION_RE: Final = re.compile(r"([0-9]{1,20})(s|ms|us|ns)?", re.ASCII | re.IGNORECASE)
_SIZE_RE: Final = re.compile(r"([0-9]{1,20})([kmg]?)", re.ASCII | re.IGNORECASE)
_INT_RE: Final = re.compile(r"[-+]?[0-9]{1,20}", re.ASCII)
_PORT_RE: Final = re.compile(r"[0-9]{1,5}", re.ASCII)
_HOST_LABEL_RE: Final = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)", re.ASCII)
_IPV4_LIKE_RE: Final = re.compile(r"[0-9.]+", re.ASCII)


class UriError(ValueError):
    """A channel URI that is malformed, unsupported, or wrong for its use. Names the bad part."""


class ControlMode(enum.Enum):
    DYNAMIC = "dynamic"
    MANUAL = "manual"
    #: response channels (Aeron 1.44+; CommonContext.CONTROL_MODE_RESPONSE): a client's
    #: response subscription, or a server's response publication answering one image
    RESPONSE = "response"


def _host_problem(host: str) -> str | None:
    """Why `host` is not an IPv4 literal, a bare IPv6 literal or a hostname; None if it is."""
    if not host:
        return "empty host"
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return "not an IPv6 address"
        return None
    if _IPV4_LIKE_RE.fullmatch(host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return "not an IPv4 address"
        return None
    if len(host) > 253:
        return "hostname longer than 253 characters"
    if not all(_HOST_LABEL_RE.fullmatch(label) for label in host.split(".")):
        return "not a valid hostname"
    return None


def _check_host(_instance: object, _attribute: object, host: str) -> None:
    problem = _host_problem(host)
    if problem is not None:
        raise UriError(f"bad host {host!r}: {problem}")


def _check_port(_instance: object, _attribute: object, port: int) -> None:
    if not 0 <= port <= 65535:
        raise UriError(f"bad port {port}: outside 0..65535")


@attrs.frozen
class UriAddress:
    """A UDP address as written in a URI. IPv6 hosts are stored without brackets; port 0 means
    an ephemeral port (a subscription with no endpoint binds one)."""

    host: str = attrs.field(validator=_check_host)
    port: int = attrs.field(validator=_check_port)

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def _duration_to_seconds(value: float | None) -> float | None:
    # Snap to whole nanoseconds, Aeron's unit, so build() can write the value exactly.
    if value is None:
        return None
    return round(value * _NS_PER_SECOND) / _NS_PER_SECOND


def _check_duration(
    _instance: object, attribute: attrs.Attribute[float | None], value: float | None
) -> None:
    if value is None:
        return
    if not 0 <= value * _NS_PER_SECOND <= MAX_DURATION_NS:
        raise UriError(f"bad {attribute.name} {value}: outside 0..{MAX_DURATION_NS} ns")


def _format_duration(seconds: float) -> str:
    ns = round(seconds * _NS_PER_SECOND)
    for unit, scale in _DURATION_UNITS.items():
        if ns % scale == 0:
            return f"{ns // scale}{unit}"
    raise AssertionError("unreachable: every integer is a whole number of ns")


def _format_size(size: int) -> str:
    for unit, scale in _SIZE_UNITS.items():
        if size % scale == 0:
            return f"{size // scale}{unit}"
    raise AssertionError("unreachable: every integer is a whole number of bytes")


FC_STRATEGIES: Final = ("max", "min", "tagged")


def _check_group_min_size(
    instance: FlowControlSpec, _attribute: object, group_min_size: int
) -> None:
    if not 0 <= group_min_size <= INT32_MAX:
        raise UriError(f"bad fc group min size {group_min_size}: outside 0..{INT32_MAX}")


@attrs.frozen
class FlowControlSpec:
    """`fc=` of an MDC publication (as Aeron's): max, min[,g:/N][,t:T], tagged[,g:TAG[/N]][,t:T].

    `group_tag` None with "tagged" means the driver's default tag; `receiver_timeout` None
    means the default (5 s)."""

    strategy: str
    group_tag: int | None = None
    group_min_size: int = attrs.field(default=0, validator=_check_group_min_size)
    receiver_timeout: float | None = attrs.field(
        default=None, converter=_duration_to_seconds, validator=_check_duration
    )

    def __attrs_post_init__(self) -> None:
        if self.strategy not in FC_STRATEGIES:
            raise UriError(
                f"bad fc strategy {self.strategy!r}: expected one of {', '.join(FC_STRATEGIES)}"
            )
        if self.strategy == "max" and (self.group_min_size or self.receiver_timeout is not None):
            raise UriError("fc=max takes no options: it tracks no receivers")
        if self.group_tag is not None:
            if self.strategy != "tagged":
                raise UriError(f"fc={self.strategy} takes no group tag; use fc=tagged,g:TAG")
            if not INT64_MIN <= self.group_tag <= INT64_MAX:
                raise UriError(f"bad fc group tag {self.group_tag}: not an int64")
        if self.receiver_timeout is not None and self.receiver_timeout <= 0:
            raise UriError(f"bad fc receiver timeout {self.receiver_timeout}: must be > 0")

    def build(self) -> str:
        parts = [self.strategy]
        if self.group_tag is not None or self.group_min_size:
            tag = "" if self.group_tag is None else str(self.group_tag)
            size = f"/{self.group_min_size}" if self.group_min_size else ""
            parts.append(f"g:{tag}{size}")
        if self.receiver_timeout is not None:
            parts.append(f"t:{_format_duration(self.receiver_timeout)}")
        return ",".join(parts)

    def __str__(self) -> str:
        return self.build()


def _optional(
    check: Callable[[int], str | None],
) -> Callable[[object, attrs.Attribute[int | None], int | None], None]:
    def validate(
        _instance: object, attribute: attrs.Attribute[int | None], value: int | None
    ) -> None:
        if value is None:
            return
        problem = check(value)
        if problem is not None:
            raise UriError(f"bad {attribute.name} {value}: {problem}")

    return validate


def _int32_problem(value: int) -> str | None:
    return None if INT32_MIN <= value <= INT32_MAX else "not an int32"


def _int64_problem(value: int) -> str | None:
    return None if INT64_MIN <= value <= INT64_MAX else "not an int64"


def _mtu_problem(value: int) -> str | None:
    # Aeron's Configuration.validateMtuLength.
    if value <= FRAME_ALIGNMENT or value > MAX_UDP_PAYLOAD_LENGTH:
        return f"must be > {FRAME_ALIGNMENT} and <= {MAX_UDP_PAYLOAD_LENGTH}"
    if value % FRAME_ALIGNMENT:
        return f"not a multiple of {FRAME_ALIGNMENT}"
    return None


def _term_length_problem(value: int) -> str | None:
    # Aeron's LogBufferDescriptor.checkTermLength.
    if not TERM_MIN_LENGTH <= value <= TERM_MAX_LENGTH:
        return "outside 64k..1g"
    if value & (value - 1):
        return "not a power of two"
    return None


def _rcv_wnd_problem(value: int) -> str | None:
    return None if 0 < value <= INT32_MAX else f"must be in 1..{INT32_MAX}"


@attrs.frozen
class ChannelUri:
    """A parsed `aeron:udp?...` channel. Durations are float seconds, sizes bytes.

    Construct it directly or with `parse_channel_uri`; values are range-checked either way, so
    `parse_channel_uri(uri.build()) == uri` for every instance."""

    endpoint: UriAddress | None = None
    control: UriAddress | None = None
    control_mode: ControlMode | None = None
    reliable: bool = True
    session_id: int | None = attrs.field(default=None, validator=_optional(_int32_problem))
    mtu: int | None = attrs.field(default=None, validator=_optional(_mtu_problem))
    term_length: int | None = attrs.field(default=None, validator=_optional(_term_length_problem))
    init_term_id: int | None = attrs.field(default=None, validator=_optional(_int32_problem))
    linger: float | None = attrs.field(
        default=None, converter=_duration_to_seconds, validator=_check_duration
    )
    rcv_wnd: int | None = attrs.field(default=None, validator=_optional(_rcv_wnd_problem))
    nak_delay: float | None = attrs.field(
        default=None, converter=_duration_to_seconds, validator=_check_duration
    )
    fc: FlowControlSpec | None = None
    gtag: int | None = attrs.field(default=None, validator=_optional(_int64_problem))
    #: a publication's link to a response channel (CommonContext
    #: RESPONSE_CORRELATION_ID_PARAM_NAME, an int64): on a request publication the
    #: registration id of the client's response subscription, which makes its SETUPs carry
    #: SETUP_SEND_RESPONSE_FLAG; on a control-mode=response publication the correlation id of
    #: the image it answers
    response_correlation_id: int | None = attrs.field(
        default=None, validator=_optional(_int64_problem)
    )

    def __attrs_post_init__(self) -> None:
        if self.control_mode is ControlMode.DYNAMIC and self.control is None:
            # UdpChannel.parse: "explicit control expected with dynamic control mode".
            raise UriError(f"{self.build()}: control-mode=dynamic needs control=host:port")

    @property
    def is_multi_destination(self) -> bool:
        return self.control_mode in (ControlMode.DYNAMIC, ControlMode.MANUAL)

    @property
    def is_response(self) -> bool:
        return self.control_mode is ControlMode.RESPONSE

    def build(self) -> str:
        """Canonical text, in the param order of Aeron 1.8.2's ChannelUriStringBuilder."""
        params: list[tuple[str, str]] = []
        if self.endpoint is not None:
            params.append(("endpoint", str(self.endpoint)))
        if self.control is not None:
            params.append(("control", str(self.control)))
        if self.control_mode is not None:
            params.append(("control-mode", self.control_mode.value))
        params.append(("reliable", "true" if self.reliable else "false"))
        if self.mtu is not None:
            params.append(("mtu", _format_size(self.mtu)))
        if self.term_length is not None:
            params.append(("term-length", _format_size(self.term_length)))
        if self.init_term_id is not None:
            params.append(("init-term-id", str(self.init_term_id)))
        if self.session_id is not None:
            params.append(("session-id", str(self.session_id)))
        if self.linger is not None:
            params.append(("linger", _format_duration(self.linger)))
        if self.rcv_wnd is not None:
            params.append(("rcv-wnd", _format_size(self.rcv_wnd)))
        if self.nak_delay is not None:
            params.append(("nak-delay", _format_duration(self.nak_delay)))
        if self.fc is not None:
            params.append(("fc", self.fc.build()))
        if self.gtag is not None:
            params.append(("gtag", str(self.gtag)))
        if self.response_correlation_id is not None:
            params.append(("response-correlation-id", str(self.response_correlation_id)))
        return f"{URI_PREFIX}{MEDIA_UDP}?" + "|".join(f"{k}={v}" for k, v in params)

    def __str__(self) -> str:
        return self.build()

    def check_publication(self) -> None:
        """Raise UriError unless this channel can be a publication (UdpChannel.parse rules).

        Unicast needs endpoint (control, if given, is the local bind address, as in Aeron);
        MDC needs control-mode=dynamic with control, or control-mode=manual; a response
        publication needs the response-correlation-id of the image it answers."""
        if self.control_mode is ControlMode.RESPONSE:
            if self.response_correlation_id is None:
                # DriverConductor.findResponsePublicationImage (and the C driver's
                # aeron_driver_conductor_find_response_publication_image), word for word.
                raise UriError(
                    f"{self.build()}: control-mode=response was specified, but no"
                    " response-correlation-id set"
                )
            if self.fc is not None:
                raise UriError(f"{self.build()}: a response publication has one receiver: no fc")
        if self.control_mode is None:
            if self.endpoint is None:
                raise UriError(
                    f"{self.build()}: a publication needs endpoint=host:port, or"
                    " control=host:port|control-mode=dynamic, or control-mode=manual"
                )
            if self.fc is not None:
                # DefaultUnicastFlowControlSupplier rejects any fc= (Aeron).
                raise UriError(
                    f"{self.build()}: unsupported unicast flow control strategy: fc={self.fc}"
                )
        if self.gtag is not None:
            raise UriError(
                f"{self.build()}: gtag is a subscription param (a publication selects"
                " tagged receivers with fc=tagged,g:TAG)"
            )

    def check_subscription(self) -> None:
        """Raise UriError unless this channel can be a subscription."""
        # UdpChannel.parse: a response subscription may name neither (control-mode=response
        # is its distinguishing characteristic).
        if self.endpoint is None and self.control is None and not self.is_response:
            raise UriError(
                f"{self.build()}: a subscription needs endpoint=host:port or control=host:port"
            )
        if self.control_mode is ControlMode.MANUAL:
            raise UriError(
                f"{self.build()}: control-mode=manual is for publications, not subscriptions"
            )
        if self.response_correlation_id is not None:
            # Only PublicationParams reads it (SubscriptionParams has no such field): a
            # response subscription is found by its registration id, named by the publication.
            raise UriError(
                f"{self.build()}: response-correlation-id is a publication param, not a"
                " subscription one"
            )
        if self.fc is not None:
            raise UriError(f"{self.build()}: fc is a publication param, not a subscription one")


def _shorten(text: str) -> str:
    return text if len(text) <= 120 else text[:117] + "..."


def _parse_address(value: str) -> UriAddress:
    """host:port, [ipv6]:port. Raises UriError with the reason only (caller adds context)."""
    if value.startswith("["):
        close = value.find("]")
        if close < 0:
            raise UriError("expected [ipv6]:port, missing ']'")
        host, rest = value[1:close], value[close + 1 :]
        if not rest.startswith(":"):
            raise UriError("expected [ipv6]:port")
        port_text = rest[1:]
        if ":" not in host:
            raise UriError("brackets are only for IPv6 addresses")
    else:
        host, colon, port_text = value.rpartition(":")
        if not colon or not host:
            raise UriError("expected host:port")
        if ":" in host:
            raise UriError("an IPv6 address must be written in brackets: [addr]:port")
    if not _PORT_RE.fullmatch(port_text):
        raise UriError(f"bad port {port_text!r}: expected 0..65535")
    problem = _host_problem(host)
    if problem is not None:
        raise UriError(f"bad host {host!r}: {problem}")
    return UriAddress(host, int(port_text))


def _parse_int(value: str, low: int, high: int, what: str) -> int:
    if not _INT_RE.fullmatch(value):
        raise UriError(f"expected an integer ({what})")
    number = int(value)
    if not low <= number <= high:
        raise UriError(f"outside {low}..{high} ({what})")
    return number


def _parse_duration_ns(value: str) -> int:
    match = _DURATION_RE.fullmatch(value)
    if match is None:
        raise UriError("expected a duration like 5s, 100ms, 250us, 1000ns (bare number = ns)")
    ns = int(match.group(1)) * _DURATION_UNITS[(match.group(2) or "ns").lower()]
    if ns > MAX_DURATION_NS:
        raise UriError(f"duration too long (max {MAX_DURATION_NS} ns)")
    return ns


def _parse_duration(value: str) -> float:
    return _parse_duration_ns(value) / _NS_PER_SECOND


def _parse_size(value: str) -> int:
    match = _SIZE_RE.fullmatch(value)
    if match is None:
        raise UriError("expected a size like 1408, 64k, 16m, 1g")
    return int(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]


def _parse_bool(value: str) -> bool:
    if value == "true":
        return True
    if value == "false":
        return False
    raise UriError("expected true or false")


def _parse_control_mode(value: str) -> ControlMode:
    for mode in ControlMode:
        if value == mode.value:
            return mode
    raise UriError("expected dynamic, manual or response")


def parse_flow_control(value: str) -> FlowControlSpec:
    """Parse an `fc=` value (Aeron's syntax). Raises UriError."""
    strategy, *options = value.split(",")
    if strategy not in FC_STRATEGIES:
        raise UriError(f"unknown strategy {strategy!r}: expected one of {', '.join(FC_STRATEGIES)}")
    group_tag: int | None = None
    group_min_size = 0
    timeout: float | None = None
    seen: set[str] = set()
    for option in options:
        key, colon, arg = option.partition(":")
        if not colon or key not in ("g", "t"):
            raise UriError(f"bad option {option!r}: expected g:TAG/N or t:DURATION")
        if key in seen:
            raise UriError(f"option {key}: given twice")
        seen.add(key)
        if key == "t":
            try:
                timeout = _parse_duration(arg)
            except UriError as exc:
                raise UriError(f"bad receiver timeout {arg!r}: {exc}") from None
        else:
            tag_text, slash, size_text = arg.partition("/")
            if not tag_text and not slash:
                raise UriError("bad option 'g:': expected g:TAG, g:/N or g:TAG/N")
            try:
                if tag_text:
                    group_tag = _parse_int(tag_text, INT64_MIN, INT64_MAX, "group tag, int64")
                if slash:
                    group_min_size = _parse_int(size_text, 0, INT32_MAX, "group min size")
            except UriError as exc:
                raise UriError(f"bad option {option!r}: {exc}") from None
    return FlowControlSpec(strategy, group_tag, group_min_size, timeout)


_PARSERS: Final[dict[str, tuple[str, Callable[[str], object]]]] = {
    "endpoint": ("endpoint", _parse_address),
    "control": ("control", _parse_address),
    "control-mode": ("control_mode", _parse_control_mode),
    "reliable": ("reliable", _parse_bool),
    "session-id": (
        "session_id",
        lambda v: _parse_int(v, INT32_MIN, INT32_MAX, "int32"),
    ),
    "mtu": ("mtu", _parse_size),
    "term-length": ("term_length", _parse_size),
    "init-term-id": (
        "init_term_id",
        lambda v: _parse_int(v, INT32_MIN, INT32_MAX, "int32"),
    ),
    "linger": ("linger", _parse_duration),
    "rcv-wnd": ("rcv_wnd", _parse_size),
    "nak-delay": ("nak_delay", _parse_duration),
    "fc": ("fc", parse_flow_control),
    "gtag": ("gtag", lambda v: _parse_int(v, INT64_MIN, INT64_MAX, "int64")),
    # Decimal, as Java's Long.parseLong in PublicationParams (the C driver's strtoll also takes
    # 0x.. and 0.. forms; decimal is what both accept).
    "response-correlation-id": (
        "response_correlation_id",
        lambda v: _parse_int(v, INT64_MIN, INT64_MAX, "int64"),
    ),
}
SUPPORTED_PARAMS: Final = tuple(_PARSERS)

# Checked once all params are in, so the message names the param rather than the field.
_RANGE_CHECKS: Final[dict[str, Callable[[int], str | None]]] = {
    "mtu": _mtu_problem,
    "term-length": _term_length_problem,
    "rcv-wnd": _rcv_wnd_problem,
}


def parse_channel_uri(text: str) -> ChannelUri:
    """Parse an untrusted `aeron:udp?key=value|...` string. Raises only UriError."""
    where = _shorten(text)
    if len(text) > MAX_URI_LENGTH:
        raise UriError(f"{where}: URI of {len(text)} characters, max {MAX_URI_LENGTH}")
    if text.startswith("aeron-spy:"):
        raise UriError(f"{where}: aeron-spy: URIs are not supported (only aeron:udp)")
    if not text.startswith(URI_PREFIX):
        raise UriError(f"{where}: expected a URI starting with 'aeron:udp'")
    media, question, query = text[len(URI_PREFIX) :].partition("?")
    if media != MEDIA_UDP:
        if media == "ipc":
            raise UriError(f"{where}: aeron:ipc is not supported, only aeron:udp")
        raise UriError(f"{where}: unsupported media {media!r}, only aeron:udp")
    fields: dict[str, object] = {}
    seen: set[str] = set()
    if question:
        for param in query.split("|"):
            key, equals, value = param.partition("=")
            if not equals or not key:
                raise UriError(f"{where}: bad param {param!r}: expected key=value")
            if key not in _PARSERS:
                raise UriError(
                    f"{where}: unknown param {key!r}; supported: {', '.join(SUPPORTED_PARAMS)}"
                )
            if key in seen:
                raise UriError(f"{where}: param {key!r} given twice")
            seen.add(key)
            if not value:
                raise UriError(f"{where}: empty value for {key}")
            field, parser = _PARSERS[key]
            try:
                parsed = parser(value)
            except UriError as exc:
                raise UriError(f"{where}: bad {key} {value!r}: {exc}") from None
            check = _RANGE_CHECKS.get(key)
            if check is not None:
                assert isinstance(parsed, int)
                problem = check(parsed)
                if problem is not None:
                    raise UriError(f"{where}: bad {key} {value!r}: {problem}")
            fields[field] = parsed
    if "control_mode" in fields and fields["control_mode"] is ControlMode.DYNAMIC:
        if "control" not in fields:
            raise UriError(f"{where}: control-mode=dynamic needs control=host:port")
    try:
        return ChannelUri(**fields)  # type: ignore[arg-type]
    except UriError as exc:
        # Every range is checked above; this only guards against a check added to ChannelUri
        # but not to the parser, so untrusted text still gets a UriError that names the URI.
        raise UriError(f"{where}: {exc}") from None
