"""Unit tests written to kill surviving mutants of echo/transport/core/uri.py (./dev mutate uri)."""

from __future__ import annotations

import attrs
import pytest

from echo.transport.core.uri import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    MAX_DURATION_NS,
    ChannelUri,
    ControlMode,
    FlowControlSpec,
    UriAddress,
    UriError,
    _int32_problem,
    _int64_problem,
    _optional,
    parse_channel_uri,
)


def error_of(text: str) -> str:
    with pytest.raises(UriError) as info:
        parse_channel_uri(text)
    return str(info.value)


def construct_error(make: object) -> str:
    assert callable(make)
    with pytest.raises(UriError) as info:
        make()
    return str(info.value)


# ---------------------------------------------------------------------------------------------
# The exact reason each malformed value gives


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "aeron:udp?endpoint=[fe80::1:9000",
            "aeron:udp?endpoint=[fe80::1:9000: bad endpoint '[fe80::1:9000':"
            " expected [ipv6]:port, missing ']'",
        ),
        (
            "aeron:udp?endpoint=[fe80::1]9000",
            "aeron:udp?endpoint=[fe80::1]9000: bad endpoint '[fe80::1]9000': expected [ipv6]:port",
        ),
        (
            # The first ']' closes the address: what follows it must be ':port'.
            "aeron:udp?endpoint=[fe80::1]]:9000",
            "aeron:udp?endpoint=[fe80::1]]:9000: bad endpoint '[fe80::1]]:9000':"
            " expected [ipv6]:port",
        ),
        (
            "aeron:udp?endpoint=[127.0.0.1]:9000",
            "aeron:udp?endpoint=[127.0.0.1]:9000: bad endpoint '[127.0.0.1]:9000':"
            " brackets are only for IPv6 addresses",
        ),
        (
            "aeron:udp?endpoint=fe80::1:9000",
            "aeron:udp?endpoint=fe80::1:9000: bad endpoint 'fe80::1:9000':"
            " an IPv6 address must be written in brackets: [addr]:port",
        ),
        (
            "aeron:udp?endpoint=[fe80::zz]:9000",
            "aeron:udp?endpoint=[fe80::zz]:9000: bad endpoint '[fe80::zz]:9000':"
            " bad host 'fe80::zz': not an IPv6 address",
        ),
        (
            "aeron:udp?endpoint=256.0.0.1:9000",
            "aeron:udp?endpoint=256.0.0.1:9000: bad endpoint '256.0.0.1:9000':"
            " bad host '256.0.0.1': not an IPv4 address",
        ),
        (
            "aeron:udp?control=-bad:9000",
            "aeron:udp?control=-bad:9000: bad control '-bad:9000':"
            " bad host '-bad': not a valid hostname",
        ),
        (
            # The first '=' splits key from value, so an '=' inside a value stays in the value.
            "aeron:udp?endpoint=a=b:9000",
            "aeron:udp?endpoint=a=b:9000: bad endpoint 'a=b:9000':"
            " bad host 'a=b': not a valid hostname",
        ),
        (
            "aeron:udp?reliable=yes",
            "aeron:udp?reliable=yes: bad reliable 'yes': expected true or false",
        ),
        (
            "aeron:udp?control-mode=foo",
            "aeron:udp?control-mode=foo: bad control-mode 'foo':"
            " expected dynamic, manual or response",
        ),
        (
            "aeron:udp?linger=5x",
            "aeron:udp?linger=5x: bad linger '5x':"
            " expected a duration like 5s, 100ms, 250us, 1000ns (bare number = ns)",
        ),
        (
            "aeron:udp?linger=1125899906842625",
            "aeron:udp?linger=1125899906842625: bad linger '1125899906842625':"
            " duration too long (max 1125899906842624 ns)",
        ),
        (
            "aeron:udp?mtu=abc",
            "aeron:udp?mtu=abc: bad mtu 'abc': expected a size like 1408, 64k, 16m, 1g",
        ),
        (
            "aeron:udp?term-length=32k",
            "aeron:udp?term-length=32k: bad term-length '32k': outside 64k..1g",
        ),
        (
            "aeron:udp?term-length=96k",
            "aeron:udp?term-length=96k: bad term-length '96k': not a power of two",
        ),
        (
            "aeron:udp?session-id=2147483648",
            "aeron:udp?session-id=2147483648: bad session-id '2147483648':"
            " outside -2147483648..2147483647 (int32)",
        ),
        (
            "aeron:udp?rcv-wnd=2g",
            "aeron:udp?rcv-wnd=2g: bad rcv-wnd '2g': must be in 1..2147483647",
        ),
        (
            "aeron:udp?foo=1",
            "aeron:udp?foo=1: unknown param 'foo'; supported: endpoint, control, control-mode,"
            " reliable, session-id, mtu, term-length, init-term-id, linger, rcv-wnd, nak-delay,"
            " fc, gtag, response-correlation-id",
        ),
        (
            # Checked by the parser, so the message names the URI as written, once.
            "aeron:udp?control-mode=dynamic",
            "aeron:udp?control-mode=dynamic: control-mode=dynamic needs control=host:port",
        ),
    ],
)
def test_bad_value_message(text: str, message: str) -> None:
    assert error_of(text) == message


@pytest.mark.parametrize(
    ("fc", "reason"),
    [
        ("foo", "unknown strategy 'foo': expected one of max, min, tagged"),
        ("min,g:", "bad option 'g:': expected g:TAG, g:/N or g:TAG/N"),
        ("tagged,g:abc", "bad option 'g:abc': expected an integer (group tag, int64)"),
        ("min,g:/x", "bad option 'g:/x': expected an integer (group min size)"),
        ("min,g:/2147483648", "bad option 'g:/2147483648': outside 0..2147483647 (group min size)"),
        (
            # The first ':' splits option from argument.
            "min,t:1:2",
            "bad receiver timeout '1:2':"
            " expected a duration like 5s, 100ms, 250us, 1000ns (bare number = ns)",
        ),
    ],
)
def test_bad_fc_message(fc: str, reason: str) -> None:
    assert error_of(f"aeron:udp?fc={fc}") == f"aeron:udp?fc={fc}: bad fc {fc!r}: {reason}"


# ---------------------------------------------------------------------------------------------
# Boundaries that are accepted


def test_largest_values_are_accepted() -> None:
    uri = parse_channel_uri(
        "aeron:udp?session-id=2147483647|init-term-id=2147483647|rcv-wnd=2147483647"
        "|gtag=9223372036854775807|linger=1125899906842624|nak-delay=1125899906842624ns"
        "|response-correlation-id=9223372036854775807"
    )
    assert uri == ChannelUri(
        session_id=INT32_MAX,
        init_term_id=INT32_MAX,
        rcv_wnd=INT32_MAX,
        gtag=INT64_MAX,
        linger=MAX_DURATION_NS / 1e9,
        nak_delay=MAX_DURATION_NS / 1e9,
        response_correlation_id=INT64_MAX,
    )
    assert uri.build() == (
        "aeron:udp?reliable=true|init-term-id=2147483647|session-id=2147483647"
        "|linger=1125899906842624ns|rcv-wnd=2147483647|nak-delay=1125899906842624ns"
        "|gtag=9223372036854775807|response-correlation-id=9223372036854775807"
    )


def test_largest_fc_group_min_size_is_accepted() -> None:
    fc = parse_channel_uri("aeron:udp?fc=min,g:/2147483647").fc
    assert fc == FlowControlSpec("min", group_min_size=INT32_MAX)


def test_int_fields_at_their_limits_construct() -> None:
    uri = ChannelUri(
        session_id=INT32_MAX,
        init_term_id=INT32_MIN,
        gtag=INT64_MAX,
        response_correlation_id=INT64_MIN,
    )
    assert (uri.session_id, uri.init_term_id, uri.gtag, uri.response_correlation_id) == (
        INT32_MAX,
        INT32_MIN,
        INT64_MAX,
        INT64_MIN,
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"session_id": 2**31}, "bad session_id 2147483648: not an int32"),
        ({"init_term_id": -(2**31) - 1}, "bad init_term_id -2147483649: not an int32"),
        ({"gtag": 2**63}, "bad gtag 9223372036854775808: not an int64"),
        (
            {"response_correlation_id": -(2**63) - 1},
            "bad response_correlation_id -9223372036854775809: not an int64",
        ),
        (
            {"linger": 2**51 / 1e9},
            "bad linger 2251799.813685248: outside 0..1125899906842624 ns",
        ),
        ({"nak_delay": -1.0}, "bad nak_delay -1.0: outside 0..1125899906842624 ns"),
    ],
)
def test_constructor_range_messages(kwargs: dict[str, object], message: str) -> None:
    assert construct_error(lambda: ChannelUri(**kwargs)) == message  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["session_id", "init_term_id"])
def test_optional_int32_validator(field: str) -> None:
    validate = _optional(_int32_problem)
    attribute = getattr(attrs.fields(ChannelUri), field)
    validate(None, attribute, None)
    validate(None, attribute, INT32_MIN)
    validate(None, attribute, INT32_MAX)
    with pytest.raises(UriError) as info:
        validate(None, attribute, INT32_MAX + 1)
    assert str(info.value) == f"bad {field} 2147483648: not an int32"


def test_optional_int64_validator() -> None:
    validate = _optional(_int64_problem)
    attribute = attrs.fields(ChannelUri).gtag
    validate(None, attribute, None)
    validate(None, attribute, INT64_MAX)
    with pytest.raises(UriError) as info:
        validate(None, attribute, INT64_MIN - 1)
    assert str(info.value) == "bad gtag -9223372036854775809: not an int64"


# ---------------------------------------------------------------------------------------------
# Hosts


def test_hostname_of_253_characters_is_accepted_254_is_not() -> None:
    host = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 61])
    assert len(host) == 253
    assert UriAddress(host, 1).host == host
    longer = host + "d"
    assert (
        construct_error(lambda: UriAddress(longer, 1))
        == f"bad host {longer!r}: hostname longer than 253 characters"
    )


def test_empty_host_message() -> None:
    assert construct_error(lambda: UriAddress("", 1)) == "bad host '': empty host"


# ---------------------------------------------------------------------------------------------
# How a long URI is shortened in a message


def test_uri_of_120_characters_is_quoted_whole() -> None:
    text = "aeron:udp?foo=" + "x" * (120 - len("aeron:udp?foo="))
    assert len(text) == 120
    assert error_of(text).startswith(f"{text}: unknown param 'foo'; ")


def test_uri_of_121_characters_is_cut_to_117_and_dots() -> None:
    text = "aeron:udp?foo=" + "x" * (121 - len("aeron:udp?foo="))
    assert len(text) == 121
    assert error_of(text).startswith(f"{text[:117]}...: unknown param 'foo'; ")


# ---------------------------------------------------------------------------------------------
# Publication and subscription rules


def test_publication_without_endpoint_or_control_mode_message() -> None:
    assert construct_error(ChannelUri().check_publication) == (
        "aeron:udp?reliable=true: a publication needs endpoint=host:port, or"
        " control=host:port|control-mode=dynamic, or control-mode=manual"
    )


def test_publication_with_gtag_message() -> None:
    uri = ChannelUri(endpoint=UriAddress("127.0.0.1", 9000), gtag=7)
    assert construct_error(uri.check_publication) == (
        "aeron:udp?endpoint=127.0.0.1:9000|reliable=true|gtag=7: gtag is a subscription param"
        " (a publication selects tagged receivers with fc=tagged,g:TAG)"
    )


def test_subscription_with_response_correlation_id_message() -> None:
    uri = ChannelUri(endpoint=UriAddress("127.0.0.1", 9000), response_correlation_id=5)
    assert construct_error(uri.check_subscription) == (
        "aeron:udp?endpoint=127.0.0.1:9000|reliable=true|response-correlation-id=5:"
        " response-correlation-id is a publication param, not a subscription one"
    )


# ---------------------------------------------------------------------------------------------
# Flow control spec


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: FlowControlSpec("foo"),
            "bad fc strategy 'foo': expected one of max, min, tagged",
        ),
        (
            lambda: FlowControlSpec("max", group_min_size=1),
            "fc=max takes no options: it tracks no receivers",
        ),
        (
            lambda: FlowControlSpec("tagged", group_tag=2**63),
            "bad fc group tag 9223372036854775808: not an int64",
        ),
        (
            lambda: FlowControlSpec("min", group_min_size=2**31),
            "bad fc group min size 2147483648: outside 0..2147483647",
        ),
    ],
)
def test_flow_control_spec_messages(make: object, message: str) -> None:
    assert construct_error(make) == message


def test_flow_control_spec_limits() -> None:
    assert FlowControlSpec("tagged", group_tag=INT64_MIN).build() == (
        "tagged,g:-9223372036854775808"
    )
    assert FlowControlSpec("tagged", group_tag=INT64_MAX).build() == (
        "tagged,g:9223372036854775807"
    )
    assert FlowControlSpec("min", group_min_size=INT32_MAX).build() == "min,g:/2147483647"


def test_flow_control_tag_without_size_builds_without_slash() -> None:
    assert FlowControlSpec("tagged", group_tag=5).build() == "tagged,g:5"
    assert str(FlowControlSpec("tagged", group_tag=5, group_min_size=2)) == "tagged,g:5/2"


def test_control_mode_dynamic_needs_control_even_when_constructed() -> None:
    assert construct_error(lambda: ChannelUri(control_mode=ControlMode.DYNAMIC)) == (
        "aeron:udp?control-mode=dynamic|reliable=true: control-mode=dynamic needs control=host:port"
    )
