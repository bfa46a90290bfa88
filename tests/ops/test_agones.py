"""echo.ops.agones, the pure state machine of the Agones SDK client: which call, when, and what
a failure or an answer does, with `now` passed in."""

from __future__ import annotations

import json

import pytest

from echo.ops.agones import (
    DEFAULT_HTTP_PORT,
    Agones,
    Backoff,
    Verdict,
    parse_watch_line,
    reserve_call,
    sidecar_port,
)


def drain(machine: Agones, now: float, status: int | None = 200) -> list[str]:
    """Make every call due at `now`, each answered with `status`; their names."""
    made = []
    while (call := machine.next_call(now)) is not None:
        made.append(call.name)
        machine.completed(call, status, b"{}", now)
        if status is None or status >= 300:
            break
    return made


def test_listening_sends_ready_then_the_gameserver_then_pings_health() -> None:
    machine = Agones(health_period=4)
    assert machine.next_call(0) is None and machine.wake_at() is None
    machine.listening(0)
    assert drain(machine, 0) == ["ready", "gameserver", "health"]
    assert machine.ready and machine.wake_at() == 2.0  # half the period
    assert drain(machine, 1.9) == []
    assert drain(machine, 2.0) == ["health"]


def test_the_gameservers_health_spec_sets_the_period_or_turns_pings_off() -> None:
    machine = Agones()
    machine.listening(0)
    spec = {"spec": {"health": {"period_seconds": 1}}, "status": {"state": "Scheduled"}}
    assert machine.gameserver_seen(spec, 0) == (None, "Scheduled")
    assert machine.health_interval == 0.5
    machine.gameserver_seen({"spec": {"health": {"periodSeconds": "8"}}}, 0)
    assert machine.health_period == 8.0
    for nonsense in ("inf", "nan", -1, 0, [5], "five"):
        machine.gameserver_seen({"spec": {"health": {"period_seconds": nonsense}}}, 0)
        assert machine.health_period == 8.0
    machine.gameserver_seen({"spec": {"health": {"disabled": True}}}, 0)
    assert drain(machine, 100) == ["ready", "gameserver"]  # and no health at all


def test_a_sidecar_that_does_not_answer_is_retried_with_a_doubling_backoff() -> None:
    machine = Agones(backoff_first=0.25, backoff_max=1.0)
    machine.listening(0)
    retries = []
    now = 0.0
    for _ in range(5):
        call = machine.next_call(now)
        assert call is not None and call.name == "ready"
        assert machine.completed(call, None, b"", now) is Verdict.RETRY
        retries.append(machine._retry_at - now)
        # A due health ping goes out meanwhile (it is not queued behind the call).
        ping = machine.next_call(now)
        if ping is not None:
            assert ping.name == "health"
            assert machine.completed(ping, None, b"", now) is Verdict.MISSED
        now = machine._retry_at
    assert retries == [0.25, 0.5, 1.0, 1.0, 1.0]
    assert drain(machine, now) == ["ready", "gameserver"]
    # A success resets the backoff.
    assert machine._backoff.failures == 0


def test_an_error_answer_retries_a_lifecycle_call_but_gives_up_a_player_call() -> None:
    machine = Agones(allocate_on_first_player=False)
    machine.listening(0)
    drain(machine, 0)
    machine.session_opened("p1", 0)
    call = machine.next_call(10)
    assert call is not None and call.name == "player_connect"
    assert json.loads(call.body or b"") == {"playerID": "p1"}
    assert machine.completed(call, 500, b"at capacity", 10) is Verdict.GIVEN_UP
    machine.request_shutdown(10)
    call = machine.next_call(10)
    assert call is not None and call.name == "shutdown"
    assert machine.completed(call, 503, b"", 10) is Verdict.RETRY
    assert not machine.shut_down
    assert drain(machine, 20) == ["shutdown"]  # (no health ping: the server is shut down)
    assert machine.shut_down
    assert drain(machine, 1000) == []  # no pings after the shutdown


def test_the_first_player_allocates_and_the_last_to_leave_ends_the_game() -> None:
    machine = Agones()
    machine.listening(0)
    machine.gameserver_seen({"status": {"state": "Ready"}}, 0)
    drain(machine, 0)
    machine.session_opened("a", 1)
    machine.session_opened("b", 1)
    machine.session_opened("a", 1)  # reported twice: once
    assert drain(machine, 1) == ["allocate", "player_connect", "player_connect"]
    assert machine.allocated and machine.played
    machine.session_closed("a", 2)
    machine.session_closed("nobody", 2)  # never opened: nothing
    assert drain(machine, 2) == ["player_disconnect"]
    assert not machine.shutdown_requested
    machine.session_closed("b", 3)
    assert drain(machine, 3) == ["player_disconnect", "shutdown"]
    assert machine.shut_down
    machine.session_opened("late", 4)  # after the shutdown: nothing more is said
    assert drain(machine, 4) == []


def test_an_allocation_seen_on_the_watch_needs_no_allocate() -> None:
    machine = Agones()
    machine.listening(0)
    drain(machine, 0)
    assert machine.gameserver_seen({"status": {"state": "Allocated"}}, 1) == (None, "Allocated")
    machine.session_opened("p", 2)
    assert drain(machine, 2) == ["player_connect"]
    machine.session_closed("p", 3)
    assert drain(machine, 3) == ["player_disconnect", "shutdown"]


def test_an_allocated_server_nobody_played_on_is_not_shut_down_and_reserve_is_sent() -> None:
    machine = Agones(shutdown_when_empty=True)
    machine.listening(0)
    drain(machine, 0)
    machine.reserve(30, 1)
    call = machine.next_call(1)
    assert call == reserve_call(30)
    assert call is not None and json.loads(call.body or b"") == {"seconds": "30"}
    machine.completed(call, 200, b"{}", 1)
    machine.gameserver_seen({"status": {"state": "Reserved"}}, 2)
    machine.gameserver_seen({"status": {"state": "Allocated"}}, 3)
    assert not machine.shutdown_requested
    with pytest.raises(ValueError, match="seconds must be >= 0"):
        machine.reserve(-1, 4)


def test_a_player_who_came_and_went_while_the_sidecar_was_down_is_never_announced() -> None:
    machine = Agones(allocate_on_first_player=False)
    machine.listening(0)
    call = machine.next_call(0)
    assert call is not None
    machine.completed(call, None, b"", 0)  # ready: no answer
    machine.session_opened("p", 0.1)
    machine.session_closed("p", 0.2)
    machine.session_opened("q", 0.3)
    assert drain(machine, 60) == ["ready", "gameserver", "player_connect", "health"]
    assert machine.players == {"q"}


def test_a_disconnect_follows_a_connect_already_in_flight() -> None:
    machine = Agones(allocate_on_first_player=False)
    machine.listening(0)
    drain(machine, 0)
    machine.session_opened("p", 1)
    call = machine.next_call(1)
    assert call is not None and call.name == "player_connect"
    machine.session_closed("p", 1)  # while the connect is being sent
    machine.completed(call, 200, b'{"bool": true}', 1)
    assert drain(machine, 1) == ["player_disconnect"]


def test_give_up_shutdown_stops_everything() -> None:
    machine = Agones()
    machine.listening(0)
    machine.give_up_shutdown()
    assert machine.shut_down and machine.idle and drain(machine, 100) == []


def test_the_port_comes_from_the_environment() -> None:
    assert sidecar_port({}) == DEFAULT_HTTP_PORT == 9358
    assert sidecar_port({"AGONES_SDK_HTTP_PORT": " 59358 "}) == 59358
    for bad in ("0", "65536", "http", "-1"):
        with pytest.raises(ValueError, match="is not a port number"):
            sidecar_port({"AGONES_SDK_HTTP_PORT": bad})


def test_watch_lines() -> None:
    line = b'{"result":{"status":{"state":"Ready"}}}'
    assert parse_watch_line(line) == {"status": {"state": "Ready"}}
    for bad in (b"", b"not json", b'{"error":{"code":14}}', b"[1]", b'{"result": 3}', b"\xff"):
        assert parse_watch_line(bad) is None


def test_backoff() -> None:
    backoff = Backoff(first=1, most=5)
    assert [backoff.next_delay() for _ in range(5)] == [1, 2, 4, 5, 5]
    backoff.reset()
    assert backoff.next_delay() == 1
