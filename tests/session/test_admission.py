"""The pure admission and lifecycle core (echo.session.admission), with plain numbers for time."""

from __future__ import annotations

import random
from typing import Any

import pytest

from echo.protocol import ERROR_SERVER_FULL, ERROR_TOO_MANY_FOR_IP
from echo.session.admission import EVICTION_GRACE, Admission, Decision, JoinVerdict, Slot
from echo.session.allocators import AllocationError, SessionAllocator
from echo.session.config import ServerConfig


def admission(**overrides: Any) -> Admission:
    values: dict[str, Any] = {"max_clients": 4, "max_per_ip": 2, "duologue_expiry": 10.0}
    values.update(overrides)
    return Admission(ServerConfig(**values), random.Random(1))


def admit(a: Admission, ip: str, now: float, client_session: int = 7) -> Slot:
    key = a.key_of(ip)
    decision = a.decide(key, now)
    assert decision.reason is None, decision
    for victim in decision.evict:
        assert a.release(victim)
    slot = a.reserve(ip, key, client_session, now)
    assert slot is not None
    a.commit(slot)
    return slot


def held(a: Admission) -> tuple[int, int, int, int]:
    return a.ports.in_use, len(a.sessions), a.per_ip.total, len(a.slots)


def test_a_hello_is_admitted_while_there_is_room() -> None:
    a = admission()
    assert a.decide("192.0.2.1", 0.0) == Decision(None, ())
    slot = admit(a, "192.0.2.1", 0.0)
    assert held(a) == (2, 1, 1, 1)
    assert slot.data_port != slot.control_port
    assert {slot.data_port, slot.control_port} <= set(a.config.clients_port_range)
    assert slot.owner_key == "192.0.2.1" and slot.client_session == 7 and slot.created == 0.0
    assert a.slots == {slot.slot_id: slot}


def test_slot_ids_are_distinct() -> None:
    a = admission()
    first = admit(a, "192.0.2.1", 0.0)
    second = admit(a, "192.0.2.2", 0.0)
    assert first.slot_id != second.slot_id
    assert first.session_id != second.session_id


def test_a_full_server_refuses_when_every_duologue_is_joined() -> None:
    a = admission(max_clients=2, max_per_ip=5)
    for ip in ("192.0.2.1", "192.0.2.2"):
        slot = admit(a, ip, 0.0)
        assert a.join(slot, ip, has_stream=False) is JoinVerdict.ACCEPT
    assert a.decide("192.0.2.3", 100.0) == Decision(ERROR_SERVER_FULL)


def test_a_full_server_evicts_the_oldest_never_joined_duologue() -> None:
    a = admission(max_clients=3, max_per_ip=5)
    old = admit(a, "192.0.2.1", 0.0)
    joined = admit(a, "192.0.2.2", 0.5)
    a.join(joined, "192.0.2.2", has_stream=False)
    admit(a, "192.0.2.3", 1.0)
    decision = a.decide("192.0.2.4", 2.0)
    assert decision == Decision(None, (old,))


def test_eviction_spares_duologues_within_the_grace() -> None:
    a = admission(max_clients=1)
    slot = admit(a, "192.0.2.1", 0.0)
    # Exactly at the grace the client may still be joining: not evicted.
    assert a.decide("192.0.2.2", EVICTION_GRACE) == Decision(ERROR_SERVER_FULL)
    assert a.decide("192.0.2.2", EVICTION_GRACE + 0.01) == Decision(None, (slot,))


def test_the_per_address_limit_refuses_when_the_address_has_only_joined_duologues() -> None:
    a = admission(max_per_ip=2)
    for _ in range(2):
        slot = admit(a, "192.0.2.1", 0.0)
        a.join(slot, "192.0.2.1", has_stream=False)
    assert a.decide("192.0.2.1", 50.0) == Decision(ERROR_TOO_MANY_FOR_IP)
    # Another address is not affected.
    assert a.decide("192.0.2.9", 50.0) == Decision(None, ())


def test_the_per_address_limit_evicts_that_address_s_oldest_unjoined_duologue() -> None:
    a = admission(max_per_ip=2, max_clients=10)
    other = admit(a, "192.0.2.9", 0.0)  # older, unjoined, but another address: never chosen
    first = admit(a, "192.0.2.1", 1.0)
    admit(a, "192.0.2.1", 2.0)
    decision = a.decide("192.0.2.1", 5.0)
    assert decision == Decision(None, (first,))
    assert other not in decision.evict


def test_a_full_eviction_of_the_same_address_also_makes_room_under_its_limit() -> None:
    a = admission(max_clients=2, max_per_ip=2)
    first = admit(a, "192.0.2.1", 0.0)
    admit(a, "192.0.2.1", 0.1)
    # Full: the oldest unjoined (ours) goes, and that already brings us under our limit.
    assert a.decide("192.0.2.1", 5.0) == Decision(None, (first,))


def test_full_and_over_the_limit_evicts_two() -> None:
    a = admission(max_clients=3, max_per_ip=2)
    stranger = admit(a, "192.0.2.9", 0.0)
    ours = admit(a, "192.0.2.1", 1.0)
    admit(a, "192.0.2.1", 2.0)
    assert a.decide("192.0.2.1", 5.0) == Decision(None, (stranger, ours))


def test_full_with_an_evictable_stranger_but_our_address_all_joined_is_refused() -> None:
    a = admission(max_clients=3, max_per_ip=2)
    admit(a, "192.0.2.9", 0.0)
    for _ in range(2):
        slot = admit(a, "192.0.2.1", 0.0)
        a.join(slot, "192.0.2.1", has_stream=False)
    assert a.decide("192.0.2.1", 5.0) == Decision(ERROR_TOO_MANY_FOR_IP)


def test_ipv6_clients_are_counted_per_configured_prefix() -> None:
    # /48: two hosts in different /64s of one /48 share a budget.
    a = admission(ipv6_prefix=48, max_per_ip=2)
    assert a.key_of("2001:db8:1:1::5") == "2001:db8:1::/48"
    admit(a, "2001:db8:1:1::5", 0.0)
    admit(a, "2001:db8:1:2::5", 0.0)
    assert a.decide(a.key_of("2001:db8:1:3::5"), 0.1) == Decision(ERROR_TOO_MANY_FOR_IP)
    assert a.decide(a.key_of("2001:db8:2::5"), 0.1) == Decision(None, ())
    # /128: every address is its own budget.
    b = admission(ipv6_prefix=128, max_per_ip=1)
    admit(b, "2001:db8::1", 0.0)
    assert b.decide(b.key_of("2001:db8::2"), 0.1) == Decision(None, ())
    assert b.key_of("2001:db8::2") == "2001:db8::2/128"
    # The default /64 would have put these two together.
    assert admission().key_of("2001:db8::1") == admission().key_of("2001:db8::2")


def test_ipv4_and_unparsable_keys() -> None:
    a = admission()
    assert a.key_of("192.0.2.7") == "192.0.2.7"
    assert a.key_of("::ffff:192.0.2.7") == "192.0.2.7"
    assert a.key_of("not an address") == "not an address"


def test_a_failed_bind_gives_the_reservation_back() -> None:
    a = admission(max_clients=1)
    slot = a.reserve("192.0.2.1", "192.0.2.1", 7, 0.0)
    assert slot is not None
    assert held(a) == (2, 1, 0, 0)  # reserved, not yet counted nor in the table
    a.unreserve(slot)
    assert held(a) == (0, 0, 0, 0)
    assert slot.released and not slot.committed
    # The only pair is free again: without the give-back this would be "server full".
    again = a.reserve("192.0.2.1", "192.0.2.1", 7, 0.0)
    assert again is not None
    with pytest.raises(ValueError):
        a.unreserve(slot)


def test_reserve_returns_none_when_ports_or_sessions_run_out() -> None:
    a = admission(max_clients=1)
    assert a.reserve("192.0.2.1", "192.0.2.1", 1, 0.0) is not None
    assert a.reserve("192.0.2.1", "192.0.2.1", 1, 0.0) is None
    assert held(a)[0] == 2

    b = admission(max_clients=2)
    b.sessions = SessionAllocator(1, 1)  # a one-id range, so that it can run out here
    b.sessions.allocate()
    assert b.reserve("192.0.2.1", "192.0.2.1", 1, 0.0) is None
    assert b.ports.in_use == 0  # the pair went back


def test_release_frees_everything_exactly_once() -> None:
    a = admission()
    slot = admit(a, "192.0.2.1", 0.0)
    assert a.release(slot) is True
    assert held(a) == (0, 0, 0, 0)
    assert a.release(slot) is False
    assert held(a) == (0, 0, 0, 0)


def test_release_of_an_uncommitted_reservation_unreserves_it() -> None:
    a = admission()
    slot = a.reserve("192.0.2.1", "192.0.2.1", 1, 0.0)
    assert slot is not None
    assert a.release(slot) is True
    assert held(a) == (0, 0, 0, 0)
    assert a.release(slot) is False


def test_commit_twice_or_after_release_is_refused() -> None:
    a = admission()
    slot = admit(a, "192.0.2.1", 0.0)
    with pytest.raises(ValueError):
        a.commit(slot)
    a.release(slot)
    with pytest.raises(ValueError):
        a.commit(slot)
    with pytest.raises(ValueError):
        a.unreserve(slot)


def test_only_the_owner_joins_and_only_once_at_a_time() -> None:
    a = admission()
    slot = admit(a, "192.0.2.1", 0.0)
    assert a.join(slot, "192.0.2.66", has_stream=False) is JoinVerdict.WRONG_ADDRESS
    assert not slot.joined
    assert a.join(slot, "192.0.2.1", has_stream=True) is JoinVerdict.SECOND_IMAGE
    assert not slot.joined
    assert a.join(slot, "192.0.2.1", has_stream=False) is JoinVerdict.ACCEPT
    assert slot.joined
    # A stranger is refused even with no stream open.
    assert a.join(slot, "192.0.2.66", has_stream=False) is JoinVerdict.WRONG_ADDRESS


def test_expiry_applies_to_unjoined_duologues_only() -> None:
    a = admission(duologue_expiry=3.0)
    slot = admit(a, "192.0.2.1", 10.0)
    assert a.expires_at(slot) == 13.0
    assert not a.is_expired(slot, 12.99)
    assert a.is_expired(slot, 13.0)
    a.join(slot, "192.0.2.1", has_stream=False)
    assert not a.is_expired(slot, 100.0)


def test_oldest_unjoined_respects_exclude_and_key() -> None:
    a = admission(max_per_ip=5)
    first = admit(a, "192.0.2.1", 0.0)
    second = admit(a, "192.0.2.1", 1.0)
    third = admit(a, "192.0.2.2", 2.0)
    assert a.oldest_unjoined(None, 10.0) is first
    assert a.oldest_unjoined(None, 10.0, exclude=[first]) is second
    assert a.oldest_unjoined("192.0.2.2", 10.0) is third
    assert a.oldest_unjoined("192.0.2.3", 10.0) is None


def test_churn_in_random_order_leaves_nothing_behind() -> None:
    rng = random.Random(5)
    a = admission(max_clients=50, max_per_ip=50)
    live: list[Slot] = []
    now = 0.0
    for _ in range(2000):
        now += 0.01
        if live and (len(live) >= 50 or rng.random() < 0.5):
            victim = live.pop(rng.randrange(len(live)))
            assert a.release(victim)
        else:
            live.append(admit(a, f"192.0.2.{rng.randrange(1, 4)}", now))
        assert held(a) == (2 * len(live), len(live), len(live), len(live))
    for slot in live:
        a.release(slot)
    assert held(a) == (0, 0, 0, 0)
    with pytest.raises(AllocationError):
        a.ports.free(a.config.clients_base_port)


def test_the_injected_rng_decides_ports_and_sessions() -> None:
    picks = []
    for _ in range(2):
        a = Admission(ServerConfig(max_clients=8), random.Random(99))
        slots = [a.reserve("192.0.2.1", "192.0.2.1", 1, 0.0) for _ in range(4)]
        picks.append([(s.data_port, s.control_port, s.session_id) for s in slots if s])
    assert picks[0] == picks[1] and len(picks[0]) == 4


def test_slot_ids_count_up_from_one() -> None:
    a = admission()
    ids = [admit(a, f"192.0.2.{i}", 0.0).slot_id for i in range(1, 4)]
    assert ids == [1, 2, 3]
    assert a.eviction_grace == EVICTION_GRACE == 0.5


def test_a_young_duologue_is_spared_whenever_it_was_created() -> None:
    a = admission(max_clients=1)
    slot = admit(a, "192.0.2.1", 100.0)
    assert a.decide("192.0.2.2", 100.2) == Decision(ERROR_SERVER_FULL)
    assert a.decide("192.0.2.2", 100.6) == Decision(None, (slot,))


def test_a_joined_oldest_is_skipped_not_the_end_of_the_search() -> None:
    a = admission(max_clients=2, max_per_ip=5)
    joined = admit(a, "192.0.2.1", 0.0)
    a.join(joined, "192.0.2.1", has_stream=False)
    unjoined = admit(a, "192.0.2.2", 1.0)
    assert a.oldest_unjoined(None, 10.0) is unjoined
    assert a.decide("192.0.2.3", 10.0) == Decision(None, (unjoined,))


def test_over_the_limit_after_a_full_eviction_evicts_a_second_distinct_one() -> None:
    # Three unjoined duologues of one address under a limit of two (the limit was lowered, say):
    # the full server's eviction takes one of ours, and we are still at the limit, so a second,
    # different one of ours goes too.
    a = admission(max_clients=3, max_per_ip=2)
    slots = []
    for t in (0.0, 1.0, 2.0):
        slot = a.reserve("192.0.2.1", "192.0.2.1", 1, t)
        assert slot is not None
        a.commit(slot)
        slots.append(slot)
    assert a.decide("192.0.2.1", 10.0) == Decision(None, (slots[0], slots[1]))


def test_misuse_messages_name_the_slot() -> None:
    a = admission()
    slot = admit(a, "192.0.2.1", 0.0)
    with pytest.raises(ValueError, match="slot 1 is committed or already released"):
        a.unreserve(slot)  # committed, not released
    with pytest.raises(ValueError, match="slot 1 is already committed or released"):
        a.commit(slot)
