"""Address keys and per-address counting (echo.session.limits)."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from echo.session.limits import AddressCounter, address_key


def test_ipv4_is_the_address() -> None:
    assert address_key("192.0.2.7") == "192.0.2.7"
    assert address_key(ipaddress.IPv4Address("10.10.0.1")) == "10.10.0.1"
    assert address_key("192.0.2.7") != address_key("192.0.2.8")


def test_ipv4_ignores_ipv6_prefix() -> None:
    assert address_key("192.0.2.7", ipv6_prefix=0) == "192.0.2.7"


@pytest.mark.parametrize("mapped", ["::ffff:192.0.2.7", "::FFFF:c000:0207"])
def test_ipv4_mapped_counts_as_ipv4(mapped: str) -> None:
    assert address_key(mapped) == "192.0.2.7"
    assert address_key(ipaddress.IPv6Address(mapped)) == "192.0.2.7"


def test_ipv6_grouped_by_64() -> None:
    a = address_key("2001:db8::1")
    b = address_key("2001:db8::ffff:ffff:ffff:ffff")
    c = address_key("2001:db8:0:1::1")
    assert a == b == "2001:db8::/64"
    assert c == "2001:db8:0:1::/64"
    assert a != c


def test_ipv6_prefix_48_configured() -> None:
    a = address_key("2001:db8:1:2::1", ipv6_prefix=48)
    b = address_key("2001:db8:1:ffff::9", ipv6_prefix=48)
    c = address_key("2001:db8:2::1", ipv6_prefix=48)
    assert a == b == "2001:db8:1::/48"
    assert c == "2001:db8:2::/48"


def test_ipv6_prefix_extremes() -> None:
    assert address_key("2001:db8::1", ipv6_prefix=128) == "2001:db8::1/128"
    assert address_key("2001:db8::2", ipv6_prefix=128) != address_key(
        "2001:db8::1", ipv6_prefix=128
    )
    assert address_key("2001:db8::1", ipv6_prefix=0) == "::/0"


def test_ipv6_object_and_scope_id() -> None:
    assert address_key(ipaddress.IPv6Address("2001:db8::5")) == "2001:db8::/64"
    assert address_key("fe80::1%eth0") == "fe80::/64"


def test_ipv6_loopback_is_its_own_network() -> None:
    assert address_key("::1") == "::/64"


@pytest.mark.parametrize(
    "bad", ["", "garbage", "256.0.0.1", "1.2.3", "[::1]", "::1::2", "1.2.3.4:80"]
)
def test_garbage_raises_value_error(bad: str) -> None:
    with pytest.raises(ValueError):
        address_key(bad)


@pytest.mark.parametrize("prefix", [-1, 129])
def test_bad_prefix_raises(prefix: int) -> None:
    with pytest.raises(ValueError):
        address_key("2001:db8::1", ipv6_prefix=prefix)


def test_non_address_type_raises_value_error() -> None:
    with pytest.raises(ValueError):
        address_key(12345)  # type: ignore[arg-type]


@given(st.integers(0, 2**128 - 1), st.integers(0, 128))
def test_ipv6_key_is_the_containing_network(value: int, prefix: int) -> None:
    addr = ipaddress.IPv6Address(value)
    key = address_key(addr, ipv6_prefix=prefix)
    if addr.ipv4_mapped is not None:
        assert key == str(addr.ipv4_mapped)
    else:
        network = ipaddress.IPv6Network(key)
        assert network.prefixlen == prefix
        assert addr in network


def test_counter_counts_and_removes_at_zero() -> None:
    c = AddressCounter()
    assert c.count("a") == 0 and len(c) == 0 and c.total == 0
    assert c.increment("a") == 1
    assert c.increment("a") == 2
    assert c.increment("b") == 1
    assert (c.count("a"), c.count("b"), len(c), c.total) == (2, 1, 2, 3)
    assert c.decrement("a") == 1
    assert c.decrement("a") == 0
    assert "a" not in c and len(c) == 1 and c.total == 1
    assert c.count("a") == 0


def test_counter_decrement_below_zero_raises() -> None:
    c = AddressCounter()
    with pytest.raises(ValueError):
        c.decrement("a")
    c.increment("a")
    c.decrement("a")
    with pytest.raises(ValueError):
        c.decrement("a")
    assert c.total == 0 and len(c) == 0


@given(st.lists(st.tuples(st.booleans(), st.sampled_from("abcd")), max_size=60))
def test_counter_matches_model(ops: list[tuple[bool, str]]) -> None:
    c = AddressCounter()
    model: dict[str, int] = {}
    for inc, key in ops:
        if inc:
            c.increment(key)
            model[key] = model.get(key, 0) + 1
        elif model.get(key, 0) == 0:
            with pytest.raises(ValueError):
                c.decrement(key)
        else:
            c.decrement(key)
            model[key] -= 1
            if model[key] == 0:
                del model[key]
        assert len(c) == len(model)
        assert c.total == sum(model.values())
        for k in "abcd":
            assert c.count(k) == model.get(k, 0)
