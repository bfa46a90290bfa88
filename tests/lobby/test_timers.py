"""The lobby's idle cadence keeps the promises its intervals were chosen for (echo.lobby.timers)."""

from __future__ import annotations

import pytest

from echo.lobby import timers
from echo.lobby.timers import lobby_client_timers, lobby_server_timers
from echo.session.timers import echo_timers

RECREATE_LIMIT_S = 5.0  # members re-create a lost home's lobby within 5 s


def test_a_dead_home_is_noticed_and_left_within_the_failover_budget() -> None:
    server, client = lobby_server_timers(), lobby_client_timers()
    # At least three of the home's heartbeats fit the member's liveness: one lost heartbeat
    # is not a dead home.
    assert 3 * server.heartbeat_interval <= client.image_liveness_timeout
    # Silence, one retry of the home, and the next server's handshake and re-creation (half
    # a second on a working network) fit the 5 s failover bound.
    assert client.image_liveness_timeout + timers.RETRY_TIMEOUT + 0.5 < RECREATE_LIMIT_S


def test_members_are_kept_alive_and_publications_stay_connected() -> None:
    server, client = lobby_server_timers(), lobby_client_timers()
    # The server's liveness of a member (presence RECONNECTING) sees several of its heartbeats.
    assert 3 * client.heartbeat_interval <= server.image_liveness_timeout
    # Each side's publication hears several status messages within its connection timeout.
    assert 3 * client.status_message_interval <= server.publication_connection_timeout
    assert 3 * server.status_message_interval <= client.publication_connection_timeout
    # A lost last message is repaired at once, not after an idle interval.
    assert server.probe_after_data and client.probe_after_data


def test_the_idle_traffic_is_lower_than_echo_timers() -> None:
    def per_member(server: object, client: object) -> float:
        """Idle datagrams a second the server sends and receives for one member."""
        sent = 1 / server.heartbeat_interval + 1 / server.status_message_interval  # type: ignore[attr-defined]
        got = 1 / client.heartbeat_interval + 1 / client.status_message_interval  # type: ignore[attr-defined]
        return sent + got

    echo = echo_timers()
    # Two thirds: a member's heartbeats now come as often as its home's (a dropped member,
    # and a lobby left with nobody connected, noticed within 2.5 s), the status messages
    # still half as often as echo_timers'.
    assert per_member(lobby_server_timers(), lobby_client_timers()) < 0.67 * per_member(echo, echo)


def test_a_dropped_member_is_noticed_within_the_liveness_bound() -> None:
    # The same bound both ways: a member notices a dead home, and a home a dead member (and
    # takes the lobby it leaves with nobody connected out of search), within 2.5 s.
    server, client = lobby_server_timers(), lobby_client_timers()
    assert server.image_liveness_timeout == client.image_liveness_timeout == 2.5


def test_overrides_and_liveness() -> None:
    assert lobby_client_timers(liveness=10.0).image_liveness_timeout == 10.0
    assert lobby_server_timers(image_liveness_timeout=4.0).image_liveness_timeout == 4.0
    assert lobby_server_timers(heartbeat_interval=0.2).heartbeat_interval == 0.2
    with pytest.raises(TypeError):
        lobby_server_timers(no_such_timer=1.0)


def test_a_lobby_servers_terms_are_small_and_still_carry_the_largest_message() -> None:
    from echo.lobby.protocol import MAX_MESSAGE_BYTES
    from echo.transport.core.logbuffer import compute_max_message_length

    term = lobby_server_timers().term_length
    assert term == timers.LOBBY_TERM_LENGTH < echo_timers().term_length
    # The largest lobby message and its channel framing fit (Aeron's term / 8 limit) ...
    assert compute_max_message_length(term) >= MAX_MESSAGE_BYTES + 1024
    # ... where half the term would not: the bound is not loose by a factor of two.
    assert compute_max_message_length(term // 4) < MAX_MESSAGE_BYTES
