"""The sessions' idle cadence as a pure function (echo.session.timers.echo_timers).

The networked behaviour (heartbeats that pay for the status messages, a probe that repairs a
lost last message) is in test_idle_cadence.py; these tests pin what `echo_timers` returns for
each kind of input, so that a mistake in how it combines `base`, the liveness timeout and the
overrides fails here in milliseconds.
"""

from __future__ import annotations

import attrs
import pytest

from echo.session.timers import (
    ECHO_HEARTBEAT_INTERVAL,
    ECHO_STATUS_MESSAGE_INTERVAL,
    HEARTBEATS_PER_LIVENESS,
    MAX_BUDGETED_HEARTBEAT_RATIO,
    echo_timers,
)
from echo.transport.core.config import TransportConfig
from echo.transport.core.frames import DATA_HEADER_LENGTH, SM_LENGTH
from echo.transport.core.image import AMPLIFICATION_FACTOR


def test_without_a_base_it_is_aerons_defaults_with_the_sessions_cadence() -> None:
    config = echo_timers()
    assert isinstance(config, TransportConfig)
    assert config.heartbeat_interval == 0.5
    assert config.status_message_interval == 1.0
    assert config.probe_after_data is True
    # everything else is Aeron's default, untouched
    expected = attrs.evolve(
        TransportConfig(),
        heartbeat_interval=0.5,
        status_message_interval=1.0,
        probe_after_data=True,
    )
    assert config == expected


def test_the_constants_keep_the_budget_they_document() -> None:
    assert (ECHO_HEARTBEAT_INTERVAL, ECHO_STATUS_MESSAGE_INTERVAL) == (0.5, 1.0)
    assert HEARTBEATS_PER_LIVENESS == 3
    assert MAX_BUDGETED_HEARTBEAT_RATIO == AMPLIFICATION_FACTOR * DATA_HEADER_LENGTH / SM_LENGTH
    assert ECHO_HEARTBEAT_INTERVAL <= MAX_BUDGETED_HEARTBEAT_RATIO * ECHO_STATUS_MESSAGE_INTERVAL


def test_a_base_keeps_its_other_settings_and_gets_the_cadence() -> None:
    base = TransportConfig(mtu=1200, linger=2.0, status_message_interval=0.3)
    config = echo_timers(base)
    assert (config.mtu, config.linger) == (1200, 2.0)
    # the base's own status interval is Aeron's cadence for a plain transport: replaced
    assert config.status_message_interval == 1.0
    assert config.heartbeat_interval == 0.5
    assert config.probe_after_data is True
    assert base.probe_after_data is False  # the base itself is not changed


def test_the_heartbeat_follows_the_bases_liveness_timeout() -> None:
    config = echo_timers(TransportConfig(image_liveness_timeout=0.9))
    assert config.heartbeat_interval == pytest.approx(0.3)
    assert config.image_liveness_timeout == 0.9


def test_the_heartbeat_follows_an_overridden_liveness_timeout() -> None:
    base = TransportConfig(image_liveness_timeout=30.0)
    config = echo_timers(base, image_liveness_timeout=0.6)
    assert config.heartbeat_interval == pytest.approx(0.2)
    assert config.image_liveness_timeout == 0.6
    # a liveness timeout long enough leaves the cadence's own 0.5 s
    assert echo_timers(image_liveness_timeout=1.5).heartbeat_interval == 0.5
    assert echo_timers(image_liveness_timeout=60.0).heartbeat_interval == 0.5


@pytest.mark.parametrize(
    ("status", "heartbeat"), [(2.0, 1.0), (0.5, 0.25), (0.1, 0.05), (3.0, 1.5)]
)
def test_an_overridden_status_interval_takes_the_heartbeat_along(
    status: float, heartbeat: float
) -> None:
    config = echo_timers(status_message_interval=status)
    assert config.status_message_interval == status
    assert config.heartbeat_interval == pytest.approx(heartbeat)


def test_the_shorter_of_the_two_bounds_wins() -> None:
    # a slow status interval with a short liveness: liveness / 3
    config = echo_timers(status_message_interval=4.0, image_liveness_timeout=1.5)
    assert config.heartbeat_interval == pytest.approx(0.5)
    # a fast status interval with a long liveness: the status interval's half
    config = echo_timers(status_message_interval=0.2, image_liveness_timeout=30.0)
    assert config.heartbeat_interval == pytest.approx(0.1)


def test_explicit_overrides_win_over_everything() -> None:
    config = echo_timers(
        TransportConfig(image_liveness_timeout=0.3),
        heartbeat_interval=0.7,
        probe_after_data=False,
        mtu=1000,
    )
    assert config.heartbeat_interval == 0.7
    assert config.probe_after_data is False
    assert config.mtu == 1000
    assert config.status_message_interval == 1.0


def test_an_unknown_override_is_refused() -> None:
    with pytest.raises(TypeError):
        echo_timers(no_such_setting=1)
