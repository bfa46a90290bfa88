"""ServerConfig's validation at its edges (echo.session.config), beside tests/server/test_config.py.

Every check is pinned at both sides of its boundary, for the wrong types (a bool is not an
integer, a string is not a number) and for the message, which must name the flag to change.

The per-flag validators are made by factories called in the class body (`_port("--port")`):
they run once, when the module is imported. `fresh` builds the module again inside the test,
so that what the factories return is what the test exercises (a mutation tool that switches
mutants on after import would otherwise never see them).
"""

from __future__ import annotations

import importlib.util
import re
from types import ModuleType
from typing import Any

import pytest

import echo.session.config as config_module
from echo.session.crypto import ServerKey

KEY = ServerKey.generate()


@pytest.fixture
def fresh() -> ModuleType:
    spec = importlib.util.spec_from_file_location(config_module.__name__, config_module.__file__)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def refused(module: ModuleType, message: str, **kwargs: Any) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        module.ServerConfig(**kwargs)


# --- ports -------------------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["port", "control_port"])
def test_ports_at_both_ends_of_the_range(fresh: ModuleType, flag: str) -> None:
    assert getattr(fresh.ServerConfig(**{flag: 1}), flag) == 1
    assert getattr(fresh.ServerConfig(**{flag: 65535}), flag) == 65535


def test_a_port_outside_the_range_names_its_flag(fresh: ModuleType) -> None:
    refused(fresh, "--port must be within 1..65535, got 0", port=0)
    refused(fresh, "--port must be within 1..65535, got 65536", port=65536)
    refused(fresh, "--control-port must be within 1..65535, got -1", control_port=-1)
    refused(fresh, "--clients-base-port must be within 1..65535, got 0", clients_base_port=0)


@pytest.mark.parametrize(
    ("field", "flag"),
    [
        ("port", "--port"),
        ("control_port", "--control-port"),
        ("clients_base_port", "--clients-base-port"),
        ("max_clients", "--max-clients"),
        ("max_per_ip", "--max-per-ip"),
        ("ipv6_prefix", "--ipv6-prefix"),
        ("stream_id", "stream_id"),
    ],
)
@pytest.mark.parametrize("value", [True, False, "9", 9.0, None])
def test_an_integer_option_refuses_what_is_not_an_int(
    fresh: ModuleType, field: str, flag: str, value: object
) -> None:
    refused(fresh, f"{flag} must be an integer, got {value!r}", **{field: value})


# --- counts ------------------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["max_clients", "max_per_ip"])
def test_one_is_enough(fresh: ModuleType, flag: str) -> None:
    assert getattr(fresh.ServerConfig(**{flag: 1}), flag) == 1
    assert getattr(fresh.ServerConfig(**{flag: 2}), flag) == 2


def test_zero_names_the_flag_and_the_bound(fresh: ModuleType) -> None:
    refused(fresh, "--max-clients must be at least 1, got 0", max_clients=0)
    refused(fresh, "--max-per-ip must be at least 1, got -3", max_per_ip=-3)


def test_one_client_has_two_ports_and_shared_ports_two_in_all(fresh: ModuleType) -> None:
    one = fresh.ServerConfig(max_clients=1)
    assert one.clients_port_range == range(9010, 9012)
    shared = fresh.ServerConfig(max_clients=1000, duologue_ports="shared")
    assert shared.shared is True
    assert shared.clients_port_count == 2
    assert shared.clients_port_range == range(9010, 9012)
    assert one.shared is False


# --- expiry ------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0.5, 1, 1.0, 1e-6, 3600])
def test_any_positive_expiry_is_accepted(fresh: ModuleType, value: float) -> None:
    assert fresh.ServerConfig(duologue_expiry=value).duologue_expiry == value


@pytest.mark.parametrize("value", [True, False, "10", None, 0, -0.5, float("inf"), float("nan")])
def test_an_expiry_that_is_not_a_positive_number_is_refused(
    fresh: ModuleType, value: object
) -> None:
    refused(
        fresh,
        f"--duologue-expiry must be a positive number of seconds, got {value!r}",
        duologue_expiry=value,
    )


# --- the IPv6 prefix and the stream id ---------------------------------------------------


@pytest.mark.parametrize("value", [0, 1, 64, 128])
def test_every_ipv6_prefix_length_is_accepted(fresh: ModuleType, value: int) -> None:
    assert fresh.ServerConfig(ipv6_prefix=value).ipv6_prefix == value


def test_an_ipv6_prefix_beyond_the_address_is_refused(fresh: ModuleType) -> None:
    refused(fresh, "--ipv6-prefix must be within 0..128, got 129", ipv6_prefix=129)
    refused(fresh, "--ipv6-prefix must be within 0..128, got -1", ipv6_prefix=-1)


@pytest.mark.parametrize("value", [-(2**31), -1, 0, 2**31 - 1])
def test_every_int32_stream_id_is_accepted(fresh: ModuleType, value: int) -> None:
    assert fresh.ServerConfig(stream_id=value).stream_id == value


@pytest.mark.parametrize("value", [-(2**31) - 1, 2**31, -(2**32), 2**32])
def test_a_stream_id_beyond_int32_is_refused(fresh: ModuleType, value: int) -> None:
    refused(fresh, f"stream_id must be an int32, got {value}", stream_id=value)


# --- the address, the duologue ports and encryption ---------------------------------------


def test_a_host_name_is_refused_with_its_value(fresh: ModuleType) -> None:
    refused(fresh, "--address must be an IP address literal, got 'localhost'", address="localhost")
    assert fresh.ServerConfig(address="::1").address == "::1"


def test_duologue_ports_by_name_or_member(fresh: ModuleType) -> None:
    ports = fresh.DuologuePorts
    assert fresh.ServerConfig(duologue_ports="per-client").duologue_ports is ports.PER_CLIENT
    assert fresh.ServerConfig(duologue_ports=ports.SHARED).duologue_ports is ports.SHARED
    refused(
        fresh,
        "--duologue-ports must be 'shared' or 'per-client', got 'both'",
        duologue_ports="both",
    )


def test_encryption_by_name_or_member_and_its_mode(fresh: ModuleType) -> None:
    mode = fresh.Encryption
    assert fresh.ServerConfig().encryption is None
    assert fresh.ServerConfig().encryption_mode is mode.OFF
    assert fresh.ServerConfig(key=KEY).encryption_mode is mode.OPTIONAL
    assert fresh.ServerConfig(encryption="off", key=KEY).encryption_mode is mode.OFF
    assert fresh.ServerConfig(encryption="off").encryption is mode.OFF
    assert fresh.ServerConfig(encryption=mode.REQUIRED, key=KEY).encryption is mode.REQUIRED
    assert fresh.ServerConfig(encryption="optional", key=KEY).encryption_mode is mode.OPTIONAL
    refused(
        fresh,
        "--encryption must be 'required', 'optional' or 'off', got 'on'",
        encryption="on",
    )


@pytest.mark.parametrize("value", ["required", "optional"])
def test_encryption_without_a_key_says_how_to_make_one(fresh: ModuleType, value: str) -> None:
    refused(
        fresh,
        f"--encryption {value} needs --key FILE (make one with: echo-keygen FILE)",
        encryption=value,
    )


def test_a_key_that_is_not_a_server_key_is_refused(fresh: ModuleType) -> None:
    with pytest.raises(ValueError, match=r"^key must be a ServerKey \(echo.session.crypto\)"):
        fresh.ServerConfig(key=KEY.to_pem())


# --- the ports together ------------------------------------------------------------------


def test_equal_ports_are_refused_with_the_port(fresh: ModuleType) -> None:
    refused(
        fresh,
        "--port and --control-port must differ (both are 7000)",
        port=7000,
        control_port=7000,
    )


def test_a_range_past_65535_names_its_last_port(fresh: ModuleType) -> None:
    refused(
        fresh,
        "--clients-base-port 65530 with --max-clients 4 needs ports up to 65537, beyond 65535",
        clients_base_port=65530,
        max_clients=4,
    )
    # the range ending exactly at 65535 is fine; shared ports need two in all
    assert fresh.ServerConfig(clients_base_port=65528, max_clients=4).clients_port_range[-1] == (
        65535
    )
    fresh.ServerConfig(clients_base_port=65534, max_clients=500, duologue_ports="shared")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"port": 9010, "control_port": 8000},
            "--port 9010 lies inside the duologue port range 9010..9041"
            " (--clients-base-port, --max-clients)",
        ),
        (
            {"port": 8000, "control_port": 9041},
            "--control-port 9041 lies inside the duologue port range 9010..9041"
            " (--clients-base-port, --max-clients)",
        ),
    ],
)
def test_a_port_inside_the_duologue_range_is_refused_at_either_end(
    fresh: ModuleType, kwargs: dict[str, int], message: str
) -> None:
    refused(fresh, message, **kwargs)


def test_ports_just_outside_the_duologue_range_are_accepted(fresh: ModuleType) -> None:
    fresh.ServerConfig(port=9009, control_port=9042)
    fresh.ServerConfig(port=9042, control_port=9009)
