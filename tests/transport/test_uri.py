"""Channel URI parsing, building and publication/subscription rules (Aeron's Channel
Configuration page; the io7m Aeron guide §4.4)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from echo.transport.core.uri import (
    MAX_URI_LENGTH,
    SUPPORTED_PARAMS,
    ChannelUri,
    ControlMode,
    FlowControlSpec,
    UriAddress,
    UriError,
    parse_channel_uri,
    parse_flow_control,
)


def error_of(text: str) -> str:
    with pytest.raises(UriError) as info:
        parse_channel_uri(text)
    return str(info.value)


# ---------------------------------------------------------------------------------------------
# Every param


def test_minimal_uri_has_defaults() -> None:
    assert parse_channel_uri("aeron:udp") == ChannelUri()
    assert parse_channel_uri("aeron:udp?endpoint=127.0.0.1:9000") == ChannelUri(
        endpoint=UriAddress("127.0.0.1", 9000)
    )


def test_every_param() -> None:
    uri = parse_channel_uri(
        "aeron:udp?endpoint=10.0.0.1:9000|control=[fe80::1]:9001|control-mode=dynamic"
        "|reliable=false|session-id=-17|mtu=1408|term-length=16m|init-term-id=-2147483648"
        "|linger=250ms|rcv-wnd=128k|nak-delay=100us|fc=tagged,g:1001/3,t:2s|gtag=-9000000000"
    )
    assert uri == ChannelUri(
        endpoint=UriAddress("10.0.0.1", 9000),
        control=UriAddress("fe80::1", 9001),
        control_mode=ControlMode.DYNAMIC,
        reliable=False,
        session_id=-17,
        mtu=1408,
        term_length=16 * 1024 * 1024,
        init_term_id=-(2**31),
        linger=0.25,
        rcv_wnd=128 * 1024,
        nak_delay=0.0001,
        fc=FlowControlSpec("tagged", group_tag=1001, group_min_size=3, receiver_timeout=2.0),
        gtag=-9_000_000_000,
    )
    assert uri.is_multi_destination


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("5s", 5.0),
        ("100ms", 0.1),
        ("250us", 0.000250),
        ("1000ns", 0.000001),
        ("1000", 0.000001),
        ("0", 0.0),
        ("5S", 5.0),
        ("10MS", 0.01),
        ("3600s", 3600.0),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_channel_uri(f"aeron:udp?linger={text}").linger == seconds
    assert parse_channel_uri(f"aeron:udp?nak-delay={text}").nak_delay == seconds


@pytest.mark.parametrize(
    ("text", "size"),
    [("64k", 65536), ("64K", 65536), ("1m", 1 << 20), ("1G", 1 << 30), ("131072", 131072)],
)
def test_sizes(text: str, size: int) -> None:
    assert parse_channel_uri(f"aeron:udp?term-length={text}").term_length == size
    assert parse_channel_uri(f"aeron:udp?rcv-wnd={text}").rcv_wnd == size


@pytest.mark.parametrize("mtu", ["64", "1408", "65504", "1k", "8k"])
def test_valid_mtu(mtu: str) -> None:
    assert parse_channel_uri(f"aeron:udp?mtu={mtu}").mtu is not None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:0", UriAddress("127.0.0.1", 0)),
        ("0.0.0.0:65535", UriAddress("0.0.0.0", 65535)),
        ("[::1]:9000", UriAddress("::1", 9000)),
        ("[::]:0", UriAddress("::", 0)),
        ("[fe80::1%eth0]:40123", UriAddress("fe80::1%eth0", 40123)),
        ("localhost:9000", UriAddress("localhost", 9000)),
        ("echo-server.example.com:20121", UriAddress("echo-server.example.com", 20121)),
    ],
)
def test_addresses(text: str, expected: UriAddress) -> None:
    assert parse_channel_uri(f"aeron:udp?endpoint={text}").endpoint == expected
    assert parse_channel_uri(f"aeron:udp?control={text}").control == expected
    assert str(expected) == text


def test_address_str_brackets_ipv6_only() -> None:
    assert str(UriAddress("::1", 9000)) == "[::1]:9000"
    assert str(UriAddress("1.2.3.4", 5)) == "1.2.3.4:5"
    assert str(UriAddress("host", 5)) == "host:5"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("max", FlowControlSpec("max")),
        ("min", FlowControlSpec("min")),
        ("min,t:2s", FlowControlSpec("min", receiver_timeout=2.0)),
        ("min,g:/3", FlowControlSpec("min", group_min_size=3)),
        ("min,g:/3,t:500ms", FlowControlSpec("min", group_min_size=3, receiver_timeout=0.5)),
        ("tagged", FlowControlSpec("tagged")),
        ("tagged,g:1001/3", FlowControlSpec("tagged", group_tag=1001, group_min_size=3)),
        ("tagged,g:1001", FlowControlSpec("tagged", group_tag=1001)),
        ("tagged,g:-1", FlowControlSpec("tagged", group_tag=-1)),
        ("tagged,g:/2", FlowControlSpec("tagged", group_min_size=2)),
        (
            "tagged,g:1001,t:500ms",
            FlowControlSpec("tagged", group_tag=1001, receiver_timeout=0.5),
        ),
        (
            "tagged,t:500ms,g:1001/0",
            FlowControlSpec("tagged", group_tag=1001, receiver_timeout=0.5),
        ),
    ],
)
def test_flow_control_variants(text: str, expected: FlowControlSpec) -> None:
    assert parse_flow_control(text) == expected
    uri = parse_channel_uri(f"aeron:udp?control=1.2.3.4:5|control-mode=dynamic|fc={text}")
    assert uri.fc == expected
    assert parse_flow_control(expected.build()) == expected


def test_flow_control_canonical_text() -> None:
    assert FlowControlSpec("tagged", 1001, 3, 0.5).build() == "tagged,g:1001/3,t:500ms"
    assert FlowControlSpec("min", group_min_size=3).build() == "min,g:/3"
    assert str(FlowControlSpec("max")) == "max"


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("fastest", "unknown strategy 'fastest'"),
        ("max,t:1s", "fc=max takes no options"),
        ("max,g:/2", "fc=max takes no options"),
        ("min,g:5", "fc=min takes no group tag"),
        ("min,x:1", "bad option 'x:1'"),
        ("min,t", "bad option 't'"),
        ("min,t:soon", "bad receiver timeout 'soon'"),
        ("min,t:0s", "must be > 0"),
        ("min,t:1s,t:2s", "option t: given twice"),
        ("tagged,g:", "bad option 'g:'"),
        ("tagged,g:abc", "bad option 'g:abc'"),
        ("tagged,g:1/x", "bad option 'g:1/x'"),
        ("tagged,g:1/-1", "bad option 'g:1/-1'"),
        ("tagged,g:9223372036854775808", "int64"),
        ("min,", "bad option ''"),
    ],
)
def test_flow_control_errors(value: str, fragment: str) -> None:
    message = error_of(f"aeron:udp?control=1.2.3.4:5|control-mode=dynamic|fc={value}")
    assert f"bad fc '{value}'" in message
    assert fragment in message


# ---------------------------------------------------------------------------------------------
# Errors name the bad part


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        (
            "aeron:udp?endpoint=foo",
            ["aeron:udp?endpoint=foo: bad endpoint 'foo': expected host:port"],
        ),
        ("aeron:udp?endpoint=:9000", ["bad endpoint ':9000'", "expected host:port"]),
        ("aeron:udp?endpoint=host:", ["bad endpoint 'host:'", "bad port ''"]),
        ("aeron:udp?endpoint=host:65536", ["bad endpoint 'host:65536'", "0..65535"]),
        ("aeron:udp?endpoint=host:123456", ["bad port '123456'"]),
        ("aeron:udp?endpoint=host:-1", ["bad port '-1'"]),
        ("aeron:udp?endpoint=host:+80", ["bad port '+80'"]),
        ("aeron:udp?endpoint=::1:9000", ["bad endpoint '::1:9000'", "brackets"]),
        ("aeron:udp?endpoint=[::1:9000", ["missing ']'"]),
        ("aeron:udp?endpoint=[::1]9000", ["expected [ipv6]:port"]),
        ("aeron:udp?endpoint=[1.2.3.4]:9000", ["brackets are only for IPv6"]),
        ("aeron:udp?endpoint=[zz::1]:9000", ["bad host 'zz::1'", "IPv6"]),
        ("aeron:udp?endpoint=256.1.1.1:9000", ["bad host '256.1.1.1'", "IPv4"]),
        ("aeron:udp?endpoint=bad_-.host.:9000", ["bad host 'bad_-.host.'", "hostname"]),
        ("aeron:udp?control=a b:1", ["bad control 'a b:1'", "hostname"]),
        (
            "aeron:udp?control-mode=static",
            ["bad control-mode 'static'", "dynamic, manual or response"],
        ),
        ("aeron:udp?control-mode=Response", ["bad control-mode 'Response'"]),
        (
            "aeron:udp?response-correlation-id=9223372036854775808",
            ["bad response-correlation-id", "int64"],
        ),
        ("aeron:udp?response-correlation-id=0x10", ["bad response-correlation-id '0x10'"]),
        ("aeron:udp?response-correlation-id=", ["empty value for response-correlation-id"]),
        ("aeron:udp?control-mode=dynamic", ["control-mode=dynamic needs control"]),
        (
            "aeron:udp?endpoint=1.2.3.4:5|control-mode=dynamic",
            ["control-mode=dynamic needs control"],
        ),
        ("aeron:udp?reliable=yes", ["bad reliable 'yes'", "true or false"]),
        ("aeron:udp?reliable=TRUE", ["bad reliable 'TRUE'"]),
        ("aeron:udp?session-id=2147483648", ["bad session-id '2147483648'", "int32"]),
        ("aeron:udp?session-id=-2147483649", ["bad session-id '-2147483649'"]),
        ("aeron:udp?session-id=tag:1", ["bad session-id 'tag:1'", "integer"]),
        ("aeron:udp?session-id=1_000", ["bad session-id '1_000'"]),
        ("aeron:udp?session-id= 1", ["bad session-id ' 1'"]),
        ("aeron:udp?session-id=١٢", ["bad session-id"]),
        ("aeron:udp?init-term-id=4294967296", ["bad init-term-id", "int32"]),
        ("aeron:udp?gtag=9223372036854775808", ["bad gtag", "int64"]),
        ("aeron:udp?gtag=x", ["bad gtag 'x'"]),
        ("aeron:udp?mtu=32", ["bad mtu '32'", "> 32"]),
        ("aeron:udp?mtu=1400", ["bad mtu '1400'", "multiple of 32"]),
        ("aeron:udp?mtu=65536", ["bad mtu '65536'", "65504"]),
        ("aeron:udp?mtu=1.5k", ["bad mtu '1.5k'", "size"]),
        ("aeron:udp?term-length=32k", ["bad term-length '32k'", "64k..1g"]),
        ("aeron:udp?term-length=2g", ["bad term-length '2g'", "64k..1g"]),
        ("aeron:udp?term-length=100000", ["bad term-length '100000'", "power of two"]),
        ("aeron:udp?term-length=16mb", ["bad term-length '16mb'"]),
        ("aeron:udp?rcv-wnd=0", ["bad rcv-wnd '0'"]),
        ("aeron:udp?rcv-wnd=2g", ["bad rcv-wnd '2g'"]),
        ("aeron:udp?linger=5sec", ["bad linger '5sec'", "duration"]),
        ("aeron:udp?linger=-1s", ["bad linger '-1s'"]),
        ("aeron:udp?linger=1.5s", ["bad linger '1.5s'"]),
        ("aeron:udp?nak-delay=99999999999h", ["bad nak-delay"]),
        ("aeron:udp?linger=9999999999s", ["bad linger", "too long"]),
        ("aeron:udp?interface=eth0", ["unknown param 'interface'", "supported: endpoint"]),
        ("aeron:udp?ttl=4", ["unknown param 'ttl'", "gtag"]),
        ("aeron:udp?endpoint=a:1|endpoint=a:1", ["param 'endpoint' given twice"]),
        ("aeron:udp?endpoint=", ["empty value for endpoint"]),
        ("aeron:udp?reliable", ["bad param 'reliable'", "key=value"]),
        ("aeron:udp?=true", ["bad param '=true'"]),
        ("aeron:udp?endpoint=a:1|", ["bad param ''"]),
        ("aeron:udp?", ["bad param ''"]),
        ("aeron:udp?endpoint=a:1||reliable=true", ["bad param ''"]),
        ("aeron:ipc", ["aeron:ipc is not supported"]),
        ("aeron:ipc?term-length=64k", ["aeron:ipc is not supported"]),
        ("aeron:tcp?endpoint=a:1", ["unsupported media 'tcp'"]),
        ("aeron-spy:aeron:udp?endpoint=a:1", ["aeron-spy", "not supported"]),
        ("udp?endpoint=a:1", ["expected a URI starting with 'aeron:udp'"]),
        ("", ["expected a URI starting with 'aeron:udp'"]),
        ("AERON:UDP", ["expected a URI starting"]),
    ],
)
def test_errors_name_the_bad_part(text: str, fragments: list[str]) -> None:
    message = error_of(text)
    for fragment in fragments:
        assert fragment in message, message


def test_unknown_param_lists_supported_ones() -> None:
    message = error_of("aeron:udp?tags=1,2")
    assert all(key in message for key in SUPPORTED_PARAMS)


def test_max_length() -> None:
    ok = "aeron:udp?endpoint=" + "h" * 60 + ":1|gtag=1"
    assert parse_channel_uri(ok).gtag == 1
    too_long = "aeron:udp?endpoint=a:1|gtag=" + "1" * (MAX_URI_LENGTH - 27)
    assert len(too_long) == MAX_URI_LENGTH + 1
    message = error_of(too_long)
    assert f"max {MAX_URI_LENGTH}" in message
    assert len(message) < 300  # the message quotes only the start of a huge URI
    exactly = "aeron:udp?endpoint=" + "a" * (MAX_URI_LENGTH - 19 - 2) + ":1"
    assert len(exactly) == MAX_URI_LENGTH
    assert "hostname" in error_of(exactly)  # not rejected for its length


def test_parse_raises_only_uri_error_on_garbage() -> None:
    for text in [
        "aeron:udp?\x00=1",
        "aeron:udp?endpoint=\u00e9:1",
        "aeron:udp?fc=,,,",
        "aeron:udp?fc=tagged,g:/",
    ]:
        with pytest.raises(UriError):
            parse_channel_uri(text)


@given(st.text(max_size=200) | st.text(max_size=200).map(lambda tail: "aeron:udp?" + tail))
def test_fuzz_parse_raises_only_uri_error(text: str) -> None:
    try:
        uri = parse_channel_uri(text)
    except UriError:
        return
    assert parse_channel_uri(uri.build()) == uri


@given(
    st.lists(
        st.sampled_from(
            [
                "endpoint=1.2.3.4:5",
                "control=[::1]:0",
                "control-mode=dynamic",
                "control-mode=manual",
                "reliable=false",
                "session-id=-5",
                "mtu=1k",
                "term-length=64k",
                "fc=min,g:/2",
                "gtag=7",
                "linger=0",
                "nak-delay=1ms",
                "control-mode=response",
                "response-correlation-id=-1",
                "bogus=1",
                "mtu=33",
                "=",
                "",
            ]
        ),
        max_size=6,
    )
)
def test_fuzz_param_combinations(params: list[str]) -> None:
    text = "aeron:udp?" + "|".join(params)
    try:
        uri = parse_channel_uri(text)
    except UriError:
        return
    assert parse_channel_uri(uri.build()) == uri


# ---------------------------------------------------------------------------------------------
# Build and round trips

hosts = st.sampled_from(
    [
        "127.0.0.1",
        "0.0.0.0",
        "10.1.2.3",
        "::1",
        "::",
        "fe80::1",
        "2001:db8::7",
        "localhost",
        "echo.example.org",
    ]
)
addresses = st.builds(UriAddress, hosts, st.integers(0, 65535))
durations = st.integers(0, 10**12).map(lambda ns: ns / 1e9)
flow_controls = st.one_of(
    st.builds(FlowControlSpec, st.just("max")),
    st.builds(
        FlowControlSpec,
        st.just("min"),
        st.none(),
        st.integers(0, 2**31 - 1),
        st.none() | st.integers(1, 10**12).map(lambda ns: ns / 1e9),
    ),
    st.builds(
        FlowControlSpec,
        st.just("tagged"),
        st.none() | st.integers(-(2**63), 2**63 - 1),
        st.integers(0, 2**31 - 1),
        st.none() | st.integers(1, 10**12).map(lambda ns: ns / 1e9),
    ),
)


@st.composite
def channel_uris(draw: st.DrawFn) -> ChannelUri:
    control_mode = draw(st.none() | st.sampled_from(ControlMode))
    control = draw(addresses if control_mode is ControlMode.DYNAMIC else st.none() | addresses)
    return ChannelUri(
        endpoint=draw(st.none() | addresses),
        control=control,
        control_mode=control_mode,
        reliable=draw(st.booleans()),
        session_id=draw(st.none() | st.integers(-(2**31), 2**31 - 1)),
        mtu=draw(st.none() | st.integers(2, 2047).map(lambda n: n * 32)),
        term_length=draw(st.none() | st.integers(16, 30).map(lambda bits: 1 << bits)),
        init_term_id=draw(st.none() | st.integers(-(2**31), 2**31 - 1)),
        linger=draw(st.none() | durations),
        rcv_wnd=draw(st.none() | st.integers(1, 2**31 - 1)),
        nak_delay=draw(st.none() | durations),
        fc=draw(st.none() | flow_controls),
        gtag=draw(st.none() | st.integers(-(2**63), 2**63 - 1)),
        response_correlation_id=draw(st.none() | st.integers(-(2**63), 2**63 - 1)),
    )


@given(channel_uris())
def test_build_parse_round_trip(uri: ChannelUri) -> None:
    text = uri.build()
    assert text.startswith("aeron:udp?")
    assert len(text) <= MAX_URI_LENGTH
    assert parse_channel_uri(text) == uri
    assert parse_channel_uri(text).build() == text
    assert str(uri) == text


def test_build_is_canonical() -> None:
    uri = parse_channel_uri(
        "aeron:udp?gtag=5|nak-delay=1000000ns|rcv-wnd=131072|linger=5000ms|session-id=7"
        "|init-term-id=3|term-length=65536|mtu=1408|reliable=true|control=h:2|endpoint=[::1]:1"
    )
    assert uri.build() == (
        "aeron:udp?endpoint=[::1]:1|control=h:2|reliable=true|mtu=1408|term-length=64k"
        "|init-term-id=3|session-id=7|linger=5s|rcv-wnd=128k|nak-delay=1ms|gtag=5"
    )
    assert ChannelUri().build() == "aeron:udp?reliable=true"
    assert ChannelUri(linger=0.1).build() == "aeron:udp?reliable=true|linger=100ms"
    assert ChannelUri(nak_delay=1.5e-7).build() == "aeron:udp?reliable=true|nak-delay=150ns"
    assert ChannelUri(term_length=1 << 30).build() == "aeron:udp?reliable=true|term-length=1g"


def test_durations_snap_to_nanoseconds() -> None:
    assert ChannelUri(linger=5).linger == 5.0
    assert ChannelUri(linger=1e-10).linger == 0.0
    assert FlowControlSpec("min", receiver_timeout=2).receiver_timeout == 2.0


def test_direct_construction_is_validated() -> None:
    with pytest.raises(UriError, match="port"):
        UriAddress("1.2.3.4", 70000)
    with pytest.raises(UriError, match="host"):
        UriAddress("a|b", 1)
    with pytest.raises(UriError, match="host"):
        UriAddress("[::1]", 1)
    with pytest.raises(UriError, match="mtu"):
        ChannelUri(mtu=100)
    with pytest.raises(UriError, match="term_length"):
        ChannelUri(term_length=3 << 16)
    with pytest.raises(UriError, match="session_id"):
        ChannelUri(session_id=2**31)
    with pytest.raises(UriError, match="gtag"):
        ChannelUri(gtag=2**63)
    with pytest.raises(UriError, match="rcv_wnd"):
        ChannelUri(rcv_wnd=0)
    with pytest.raises(UriError, match="linger"):
        ChannelUri(linger=-1)
    with pytest.raises(UriError, match="control-mode=dynamic needs control"):
        ChannelUri(control_mode=ControlMode.DYNAMIC)
    with pytest.raises(UriError, match="strategy"):
        FlowControlSpec("fastest")
    with pytest.raises(UriError, match="group min size"):
        FlowControlSpec("min", group_min_size=-1)


# ---------------------------------------------------------------------------------------------
# Publication / subscription rules


@pytest.mark.parametrize(
    "text",
    [
        "aeron:udp?endpoint=127.0.0.1:9000",
        "aeron:udp?endpoint=127.0.0.1:9000|control=127.0.0.1:9100",  # control = local bind
        "aeron:udp?control=127.0.0.1:9001|control-mode=dynamic",
        "aeron:udp?control=127.0.0.1:9001|control-mode=dynamic|fc=min,g:/2",
        "aeron:udp?control-mode=manual",
        "aeron:udp?control-mode=manual|fc=max",
        # Response channels (Aeron 1.48): the client's request publication names its response
        # subscription; the server's response publication names the image it answers.
        "aeron:udp?endpoint=127.0.0.1:9000|response-correlation-id=17",
        "aeron:udp?control=127.0.0.1:9001|control-mode=response|response-correlation-id=42",
        "aeron:udp?control-mode=response|response-correlation-id=-9223372036854775808",
    ],
)
def test_valid_publications(text: str) -> None:
    parse_channel_uri(text).check_publication()


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("aeron:udp", "a publication needs endpoint=host:port"),
        ("aeron:udp?control=127.0.0.1:9001", "a publication needs endpoint=host:port"),
        (
            "aeron:udp?endpoint=127.0.0.1:9000|fc=min",
            "unsupported unicast flow control strategy: fc=min",
        ),
        (
            "aeron:udp?endpoint=127.0.0.1:9000|fc=max",
            "unsupported unicast flow control strategy: fc=max",
        ),
        ("aeron:udp?endpoint=127.0.0.1:9000|gtag=5", "gtag is a subscription param"),
        (
            "aeron:udp?control=127.0.0.1:9001|control-mode=response",
            "control-mode=response was specified, but no response-correlation-id set",
        ),
        (
            "aeron:udp?control-mode=response|response-correlation-id=1|fc=min",
            "a response publication has one receiver",
        ),
    ],
)
def test_invalid_publications(text: str, fragment: str) -> None:
    uri = parse_channel_uri(text)
    with pytest.raises(UriError) as info:
        uri.check_publication()
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    "text",
    [
        "aeron:udp?endpoint=127.0.0.1:9000",
        "aeron:udp?control=127.0.0.1:9001",
        "aeron:udp?control=127.0.0.1:9001|control-mode=dynamic",
        "aeron:udp?endpoint=127.0.0.1:20123|control=127.0.0.1:20122",
        "aeron:udp?endpoint=127.0.0.1:20125|gtag=77",
        # A client's response subscription (UdpChannel.parse: control-mode=response is enough).
        "aeron:udp?control=127.0.0.1:9001|control-mode=response",
        "aeron:udp?control-mode=response",
    ],
)
def test_valid_subscriptions(text: str) -> None:
    parse_channel_uri(text).check_subscription()


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("aeron:udp", "a subscription needs endpoint=host:port or control=host:port"),
        ("aeron:udp?control-mode=manual", "a subscription needs endpoint"),
        (
            "aeron:udp?endpoint=1.2.3.4:5|control-mode=manual",
            "control-mode=manual is for publications",
        ),
        ("aeron:udp?endpoint=1.2.3.4:5|fc=min", "fc is a publication param"),
        (
            "aeron:udp?control=1.2.3.4:5|control-mode=response|response-correlation-id=3",
            "response-correlation-id is a publication param",
        ),
    ],
)
def test_invalid_subscriptions(text: str, fragment: str) -> None:
    uri = parse_channel_uri(text)
    with pytest.raises(UriError) as info:
        uri.check_subscription()
    assert fragment in str(info.value)


def test_is_multi_destination() -> None:
    assert not parse_channel_uri("aeron:udp?endpoint=a:1").is_multi_destination
    assert parse_channel_uri("aeron:udp?control-mode=manual").is_multi_destination
    assert parse_channel_uri("aeron:udp?control=a:1|control-mode=dynamic").is_multi_destination
    response = parse_channel_uri("aeron:udp?control=a:1|control-mode=response")
    assert response.is_response and not response.is_multi_destination


def test_response_channel_params_round_trip() -> None:
    text = "aeron:udp?control=10.0.0.1:9001|control-mode=response|response-correlation-id=-7"
    uri = parse_channel_uri(text)
    assert uri.control_mode is ControlMode.RESPONSE
    assert uri.response_correlation_id == -7
    assert uri.build() == (
        "aeron:udp?control=10.0.0.1:9001|control-mode=response|reliable=true"
        "|response-correlation-id=-7"
    )


# ---------------------------------------------------------------------------------------------
# The Echo 2.0 channels (the io7m Aeron guide §4.4) and the captures' channels

ECHO_PUBLICATIONS = [
    "aeron:udp?control=5.6.7.8:9001|control-mode=dynamic|reliable=true",  # server all-clients
    "aeron:udp?endpoint=5.6.7.8:9000|reliable=true",  # client all-clients
    "aeron:udp?control=5.6.7.8:9011|control-mode=dynamic|reliable=true|session-id=1234567",
    "aeron:udp?endpoint=5.6.7.8:9010|reliable=true|session-id=1234567",  # duologue client
]
ECHO_SUBSCRIPTIONS = [
    "aeron:udp?endpoint=5.6.7.8:9000|reliable=true",  # server all-clients
    "aeron:udp?control=5.6.7.8:9001|control-mode=dynamic|reliable=true",  # client all-clients
    "aeron:udp?endpoint=5.6.7.8:9010|reliable=true|session-id=1234567",  # duologue server
    "aeron:udp?control=5.6.7.8:9011|control-mode=dynamic|reliable=true|session-id=1234567",
]


@pytest.mark.parametrize("text", ECHO_PUBLICATIONS)
def test_echo_publication_channels(text: str) -> None:
    uri = parse_channel_uri(text)
    uri.check_publication()
    assert uri.build() == text  # same param order as Aeron 1.8.2's ChannelUriStringBuilder
    assert uri.reliable


@pytest.mark.parametrize("text", ECHO_SUBSCRIPTIONS)
def test_echo_subscription_channels(text: str) -> None:
    uri = parse_channel_uri(text)
    uri.check_subscription()
    assert uri.build() == text
    assert uri.reliable


def test_echo_duologue_channel_fields() -> None:
    uri = parse_channel_uri(ECHO_SUBSCRIPTIONS[3])
    assert uri.control == UriAddress("5.6.7.8", 9011)
    assert uri.control_mode is ControlMode.DYNAMIC
    assert uri.endpoint is None  # ephemeral data port on the client
    assert uri.session_id == 1234567


@pytest.mark.parametrize(
    ("text", "role"),
    [
        ("aeron:udp?endpoint=127.0.0.1:20121", "both"),
        ("aeron:udp?control=127.0.0.1:20122|control-mode=dynamic", "pub"),
        ("aeron:udp?endpoint=127.0.0.1:20123|control=127.0.0.1:20122", "sub"),
        ("aeron:udp?endpoint=127.0.0.1:20121|term-length=65536", "both"),
        ("aeron:udp?endpoint=127.0.0.1:20125", "both"),
    ],
)
def test_capture_channels(text: str, role: str) -> None:
    uri = parse_channel_uri(text)
    if role in ("pub", "both"):
        uri.check_publication()
    if role in ("sub", "both"):
        uri.check_subscription()


async def test_the_transport_applies_aerons_response_channel_rules() -> None:
    # DriverConductor's checks, with its messages: a request publication names a response
    # subscription of this transport; a response publication names an image that asked for
    # a response channel (tests/transport/test_response.py serves the channels themselves).
    from echo.transport import open_transport

    async with open_transport() as transport:
        with pytest.raises(UriError, match="unable to find response subscription"):
            await transport.add_publication(
                "aeron:udp?endpoint=127.0.0.1:9|response-correlation-id=17", 1001
            )
        with pytest.raises(UriError, match=r"image.correlationId=4 not found"):
            await transport.add_publication(
                "aeron:udp?control=127.0.0.1:9|control-mode=response|response-correlation-id=4",
                1001,
            )
        with pytest.raises(UriError, match="needs control"):
            await transport.add_subscription("aeron:udp?control-mode=response", 1001)
