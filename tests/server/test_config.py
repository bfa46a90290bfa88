"""ServerConfig defaults and validation (echo.session.config)."""

from __future__ import annotations

import attrs
import pytest

from echo.protocol import ECHO_STREAM_ID
from echo.session.config import ServerConfig


def test_defaults() -> None:
    c = ServerConfig()
    assert (c.address, c.port, c.control_port, c.clients_base_port) == (
        "127.0.0.1",
        9000,
        9001,
        9010,
    )
    assert (c.max_clients, c.max_per_ip, c.duologue_expiry, c.ipv6_prefix) == (16, 3, 10.0, 64)
    assert c.stream_id == ECHO_STREAM_ID
    assert c.clients_port_count == 32
    assert c.clients_port_range == range(9010, 9042)


def test_guide_example() -> None:
    # EchoServer /tmp/aeron-server 5.6.7.8 9000 9001 9010 4 (the io7m Aeron guide §4.7)
    c = ServerConfig(
        address="5.6.7.8", port=9000, control_port=9001, clients_base_port=9010, max_clients=4
    )
    assert c.clients_port_range == range(9010, 9018)


def test_frozen() -> None:
    c = ServerConfig()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        c.port = 1  # type: ignore[misc]


def test_ipv6_address_and_ports_below_base() -> None:
    c = ServerConfig(
        address="::", port=20000, control_port=20001, clients_base_port=100, max_clients=10
    )
    assert c.clients_port_range == range(100, 120)


def test_range_may_touch_but_not_contain_ports() -> None:
    ServerConfig(port=9000, control_port=9001, clients_base_port=9002, max_clients=1)
    ServerConfig(port=9004, control_port=9005, clients_base_port=9000, max_clients=2)
    ServerConfig(clients_base_port=65533, max_clients=1)  # 65533..65534
    ServerConfig(clients_base_port=65534, max_clients=1)  # 65534..65535


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [
        ({"port": 0}, "--port"),
        ({"port": 65536}, "--port"),
        ({"control_port": -1}, "--control-port"),
        ({"clients_base_port": 0}, "--clients-base-port"),
        ({"max_clients": 0}, "--max-clients"),
        ({"max_clients": True}, "--max-clients"),
        ({"max_per_ip": 0}, "--max-per-ip"),
        ({"duologue_expiry": 0.0}, "--duologue-expiry"),
        ({"duologue_expiry": -1.0}, "--duologue-expiry"),
        ({"duologue_expiry": float("inf")}, "--duologue-expiry"),
        ({"duologue_expiry": float("nan")}, "--duologue-expiry"),
        ({"ipv6_prefix": 129}, "--ipv6-prefix"),
        ({"ipv6_prefix": -1}, "--ipv6-prefix"),
        ({"address": "not-an-ip"}, "--address"),
        ({"port": "9000"}, "--port"),
        ({"port": 9001}, "--control-port"),  # equal to the control port
        ({"clients_base_port": 8995}, "--port"),  # 8995..9026 contains 9000
        ({"port": 7000, "clients_base_port": 8990, "max_clients": 6}, "--control-port"),
        ({"clients_base_port": 65535, "max_clients": 1}, "--clients-base-port"),  # up to 65536
        ({"clients_base_port": 65000, "max_clients": 300}, "--max-clients"),
        ({"stream_id": 2**31}, "stream_id"),
    ],
)
def test_invalid_names_the_option(kwargs: dict[str, object], flag: str) -> None:
    with pytest.raises(ValueError, match=flag):
        ServerConfig(**kwargs)  # type: ignore[arg-type]


def test_integer_expiry_accepted() -> None:
    assert ServerConfig(duologue_expiry=3).duologue_expiry == 3
