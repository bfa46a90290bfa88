"""Multi-destination-cast and multicast flow control: one test over real loopback sockets, the
rest on the in-memory network (echo.transport.testing) in virtual time, where flow-control
and destination timeouts cost no real seconds and forged peers are memory sockets."""

from __future__ import annotations

import inspect
import socket

import pytest
import trio
import trio.testing

from echo.transport import Subscription, TransportConfig, UriError, open_transport
from echo.transport.core.destinations import DynamicDestinations
from echo.transport.core.frames import StatusMessage
from echo.transport.testing import Link, MemoryNetwork

STREAM = 1001
#: the publication's control port on a memory network (nothing else is bound there)
PORT = 40123


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def mdc_pub(port: int, extra: str = "") -> str:
    return f"aeron:udp?control=127.0.0.1:{port}|control-mode=dynamic|term-length=64k{extra}"


def mdc_sub(port: int, extra: str = "") -> str:
    return f"aeron:udp?control=127.0.0.1:{port}|control-mode=dynamic{extra}"


async def wait_for(predicate, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    # Destination tables and flow-control receivers have no change notification in the public
    # API (they are internal state), so these checks poll, bounded by `timeout`.
    with trio.move_on_after(timeout):
        while not predicate():  # noqa: ASYNC110
            await trio.sleep(0.005)  # the polling interval of a bounded wait, not a guess
        return
    try:
        what = inspect.getsource(predicate).strip()
    except (OSError, TypeError):
        what = repr(predicate)
    raise AssertionError(f"not true after {timeout} s: {what}")


async def wait_for_image(subscription: Subscription, timeout: float = 5.0) -> None:
    """Until `subscription` has an image (the publication's SETUP reached it)."""
    with trio.fail_after(timeout):
        while not subscription.images:
            await subscription.wait_activity()


def test_removal_keeps_the_live_destination_between_idle_ones() -> None:
    # Aeron's own removal once dropped a live destination sitting between two idle ones.
    destinations = DynamicDestinations(timeout=5.0)
    destinations.on_status_message(1, ("10.0.0.1", 1), now=0.0)
    destinations.on_status_message(2, ("10.0.0.2", 2), now=0.0)
    destinations.on_status_message(3, ("10.0.0.3", 3), now=0.0)
    destinations.on_status_message(2, ("10.0.0.2", 2), now=4.0)  # only the middle one stays live
    assert destinations.expire(now=6.0) == 2
    assert destinations.addresses == [("10.0.0.2", 2)]


def test_destinations_are_matched_by_receiver_id_and_address_and_bounded() -> None:
    destinations = DynamicDestinations(timeout=5.0, max_destinations=2)
    assert destinations.on_status_message(1, ("a", 1), 0.0) == "added"
    assert destinations.on_status_message(1, ("a", 1), 1.0) == "refreshed"
    # Same receiver id from another address (a NAT re-mapping or a forger) is another entry.
    assert destinations.on_status_message(1, ("b", 1), 1.0) == "added"
    assert destinations.on_status_message(2, ("c", 1), 1.0) == "refused"
    assert len(destinations) == 2


async def test_dynamic_mdc_reaches_every_subscriber_in_order() -> None:
    port = free_port()
    async with (
        open_transport() as server,
        open_transport() as client_a,
        open_transport() as client_b,
    ):
        # fc=min: with the default (max) a subscriber starved of CPU may fall out of the
        # retransmit window and lose data by design; min holds the publisher for everyone.
        pub = await server.add_publication(mdc_pub(port, "|fc=min,g:/2"), STREAM)
        sub_a = await client_a.add_subscription(mdc_sub(port), STREAM)
        sub_b = await client_b.add_subscription(mdc_sub(port), STREAM)
        await wait_for(lambda: len(pub.destinations) == 2 and bool(sub_a.images and sub_b.images))
        await pub.wait_connected(timeout=5)
        messages = [f"message {i}".encode() * (1 + i % 50) for i in range(500)]

        async def produce() -> None:
            for message in messages:
                await pub.send(message, timeout=5)

        async def consume(sub) -> None:  # type: ignore[no-untyped-def]
            for expected in messages:
                with trio.fail_after(5):
                    assert (await sub.receive()).data == expected

        async with trio.open_nursery() as nursery:
            nursery.start_soon(produce)
            nursery.start_soon(consume, sub_a)
            nursery.start_soon(consume, sub_b)
        # The data came from the control port: that is what passes a NAT.
        assert sub_a.images[0].source_port == port
        assert server.counters.destinations_added == 2
        # SETUPs to an MDC group carry the group flag, so receivers use group NAK timing.
        assert sub_a.images[0]._link.image.is_group


async def test_unicast_publication_with_flow_control_is_refused() -> None:
    async with open_transport() as transport:
        with pytest.raises(UriError, match="unsupported unicast flow control"):
            await transport.add_publication("aeron:udp?endpoint=127.0.0.1:9|fc=min", STREAM)


async def _slow_and_fast(  # type: ignore[no-untyped-def]
    fc: str,
    *,
    slow_tag: int | None = None,
    fast_tag: int | None = None,
    duration: float = 0.3,
):
    """One publication, a fast subscriber that polls and a slow one that never does, for
    `duration` of virtual time on a network with a 1 ms one-way delay.

    Returns (fast messages received, slow image's rebuilt position, messages offered).
    """
    config = TransportConfig(rcv_wnd=32 * 1024)
    net = MemoryNetwork(link=Link(delay=0.001))
    async with (
        open_transport(config, socket_factory=net) as server,
        open_transport(config, socket_factory=net) as fast_side,
        open_transport(config, socket_factory=net) as slow_side,
    ):
        pub = await server.add_publication(mdc_pub(PORT, f"|fc={fc}"), STREAM)
        fast = await fast_side.add_subscription(
            mdc_sub(PORT, f"|gtag={fast_tag}" if fast_tag is not None else ""), STREAM
        )
        slow = await slow_side.add_subscription(
            mdc_sub(PORT, f"|gtag={slow_tag}" if slow_tag is not None else ""), STREAM
        )
        await wait_for(lambda: bool(fast.images and slow.images) and pub.is_connected)
        offered = 0
        received = 0
        payload = bytes(1000)
        with trio.move_on_after(duration):
            while True:
                result = pub.offer(payload)
                if result > 0:
                    offered += 1
                got: list[object] = []
                fast.poll(got.append, fragment_limit=100)
                received += len(got)
                # Pacing: a game loop's tick when back-pressured (virtual time; the status
                # messages that open the window come in meanwhile).
                await trio.sleep(0 if result > 0 else 0.002)
        slow_image = slow.images[0]._link.image
        return received, slow_image.rebuild_position, offered


async def test_min_flow_control_holds_the_publisher_to_the_slow_receiver(
    autojump_clock: trio.testing.MockClock,
) -> None:
    received, slow_rebuilt, offered = await _slow_and_fast("min")
    # The slow receiver never consumes: it can hold at most its window (32 KiB) plus one
    # datagram, so the publisher stops there, and the fast receiver with it. Nobody lost data.
    assert slow_rebuilt <= 32 * 1024 + 1408
    assert received * 1024 <= 32 * 1024 + 1408
    assert received <= offered


async def test_min_flow_control_keeps_a_slow_but_live_receiver_past_its_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The slow receiver consumes nothing but keeps sending status messages: it is live, so the
    # 300 ms receiver timeout never drops it and it holds the publisher for 3 s (ten timeouts).
    received, slow_rebuilt, _ = await _slow_and_fast("min,t:300ms", duration=3.0)
    assert slow_rebuilt <= 32 * 1024 + 1408
    assert received * 1024 <= 32 * 1024 + 1408


async def test_max_flow_control_lets_the_publisher_run_ahead(
    autojump_clock: trio.testing.MockClock,
) -> None:
    received, slow_rebuilt, _ = await _slow_and_fast("max")
    assert slow_rebuilt <= 32 * 1024 + 1408
    # The fast receiver is far past the slow one's window.
    assert received * 1024 > 10 * 32 * 1024


async def test_tagged_flow_control_only_counts_tagged_receivers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The slow receiver is untagged: it does not hold the publisher back.
    received, _, _ = await _slow_and_fast("tagged,g:7", fast_tag=7)
    assert received * 1024 > 10 * 32 * 1024
    # Now the slow one carries the tag: it does.
    received, _, _ = await _slow_and_fast("tagged,g:7", slow_tag=7, fast_tag=7)
    assert received * 1024 <= 32 * 1024 + 1408


async def test_a_vanished_receiver_is_dropped_after_the_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    config = TransportConfig(rcv_wnd=32 * 1024)
    net = MemoryNetwork()
    async with (
        open_transport(config, socket_factory=net) as server,
        open_transport(config, socket_factory=net) as fast_side,
    ):
        pub = await server.add_publication(mdc_pub(PORT, "|fc=min,t:300ms"), STREAM)
        fast = await fast_side.add_subscription(mdc_sub(PORT), STREAM)
        async with open_transport(config, socket_factory=net) as slow_side:
            slow = await slow_side.add_subscription(mdc_sub(PORT), STREAM)
            await wait_for(lambda: bool(fast.images and slow.images) and pub.is_connected)
            flow = pub._channel.state.flow_control
            await wait_for(lambda: len(flow.receivers) == 2)  # type: ignore[attr-defined]
            # The slow side goes away without a word: no end-of-stream SM reaches the sender.
            slow_side._driver.close()
            vanished = trio.current_time()
        await wait_for(lambda: len(flow.receivers) == 1, timeout=3)  # type: ignore[attr-defined]
        # Dropped once its 300 ms ran out (since its last SM, at most an SM interval before
        # it vanished), not before: virtual time makes the bound exact.
        assert 0.3 - 0.2 <= trio.current_time() - vanished <= 0.3 + 0.2
        # With only the fast receiver left the publisher moves on.
        sent = 0
        with trio.fail_after(5):
            while sent < 200:
                if pub.offer(bytes(1000)) > 0:
                    sent += 1
                else:
                    await trio.sleep(0.001)  # back-pressured: a game loop's next tick
                fast.poll(lambda m: None, fragment_limit=100)


async def test_minimum_group_size_gates_is_connected(
    autojump_clock: trio.testing.MockClock,
) -> None:
    net = MemoryNetwork()
    async with (
        open_transport(socket_factory=net) as server,
        open_transport(socket_factory=net) as a,
        open_transport(socket_factory=net) as b,
    ):
        pub = await server.add_publication(mdc_pub(PORT, "|fc=min,g:/2"), STREAM)
        sub_a = await a.add_subscription(mdc_sub(PORT), STREAM)
        await wait_for(lambda: bool(sub_a.images))
        # Deliberately let 300 ms of virtual time pass (several SMs from the one receiver):
        # what is tested is that nothing happens.
        await trio.sleep(0.3)
        assert not pub.is_connected
        sub_b = await b.add_subscription(mdc_sub(PORT), STREAM)
        await wait_for(lambda: bool(sub_b.images))
        await pub.wait_connected(timeout=5)
        assert pub.is_connected


async def test_manual_destinations(autojump_clock: trio.testing.MockClock) -> None:
    net = MemoryNetwork()
    async with (
        open_transport(socket_factory=net) as server,
        open_transport(socket_factory=net) as client,
    ):
        sub = await client.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{PORT}", STREAM)
        pub = await server.add_publication("aeron:udp?control-mode=manual", STREAM)
        with trio.move_on_after(0.3):
            await pub.wait_connected()
        assert not pub.is_connected
        pub.add_destination(f"aeron:udp?endpoint=127.0.0.1:{PORT}")
        await pub.wait_connected(timeout=5)
        await pub.send(b"to a manual destination")
        with trio.fail_after(5):
            assert (await sub.receive()).data == b"to a manual destination"
        pub.remove_destination(f"aeron:udp?endpoint=127.0.0.1:{PORT}")
        assert pub.destinations == []


async def test_destination_table_is_bounded_and_refusals_counted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    config = TransportConfig(max_destinations=1, validate_addresses=False)
    net = MemoryNetwork()
    async with open_transport(config, socket_factory=net) as server:
        await server.add_publication(mdc_pub(PORT), STREAM)
        with net.open_socket() as forger:
            for receiver_id in (1, 2, 3):
                forger.sendto(registration(receiver_id), ("127.0.0.1", PORT))
            await wait_for(lambda: server.counters.destinations_refused == 2)
        assert server.counters.destinations_added == 1


def registration(receiver_id: int, cookie: tuple[int, int] = (0, 0)) -> bytes:
    return StatusMessage(
        session_id=0,
        stream_id=0,
        consumption_term_id=cookie[0],
        consumption_term_offset=cookie[1],
        receiver_window=0,
        receiver_id=receiver_id,
        flags=0x80,
    ).encode()


async def _reflected_bytes(validate: bool) -> tuple[int, int]:
    """Send forged registrations to a dynamic-MDC publication that is streaming; count what the
    'victim' socket (the forged source) gets back. Returns (bytes sent to it, bytes it sent)."""
    config = TransportConfig(validate_addresses=validate)
    net = MemoryNetwork()
    async with (
        open_transport(config, socket_factory=net) as server,
        open_transport(config, socket_factory=net) as client,
    ):
        pub = await server.add_publication(mdc_pub(PORT), STREAM)
        sub = await client.add_subscription(mdc_sub(PORT), STREAM)
        await pub.wait_connected(timeout=5)
        with net.open_socket() as victim:
            sent = received = 0
            for _ in range(10):
                datagram = registration(0x5EED)
                victim.sendto(datagram, ("127.0.0.1", PORT))
                sent += len(datagram)
                for _ in range(20):  # the publication keeps streaming meanwhile
                    await pub.send(b"x" * 100)
                    sub.poll(lambda m: None, fragment_limit=100)
                    await trio.sleep(0.005)  # pacing (virtual): a stream over 100 ms
                while True:
                    try:
                        received += len(victim.recvfrom(65536)[0])
                    except BlockingIOError:
                        break
        return received, sent


async def test_forged_registrations_get_one_small_challenge_with_validation(
    autojump_clock: trio.testing.MockClock,
) -> None:
    reflected, forged = await _reflected_bytes(validate=True)
    # At most one 36-byte challenge per 36-byte forged SM: amplification factor <= 1.
    assert 0 < reflected <= forged


async def test_without_validation_a_forged_registration_is_a_reflection_vector(
    autojump_clock: trio.testing.MockClock,
) -> None:
    reflected, forged = await _reflected_bytes(validate=False)
    assert reflected > 10 * forged  # the victim gets the stream: what validation prevents


async def test_cookie_exchange_registers_a_real_subscriber(
    autojump_clock: trio.testing.MockClock,
) -> None:
    net = MemoryNetwork()
    async with (
        open_transport(socket_factory=net) as server,
        open_transport(socket_factory=net) as client,
    ):
        pub = await server.add_publication(mdc_pub(PORT), STREAM)
        sub = await client.add_subscription(mdc_sub(PORT), STREAM)
        await pub.wait_connected(timeout=5)
        await pub.send(b"validated")
        with trio.fail_after(5):
            assert (await sub.receive()).data == b"validated"
        assert server.counters.cookie_challenges_sent >= 1
        assert client.counters.cookies_received >= 1


async def test_setup_elicitations_towards_one_host_are_rate_limited(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from echo.transport.core.frames import DataHeader

    config = TransportConfig(unvalidated_reply_rate=10.0, unvalidated_reply_burst=5.0)
    net = MemoryNetwork()
    async with open_transport(config, socket_factory=net) as transport:
        await transport.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{PORT}", STREAM)
        with net.open_socket() as forger:
            for session in range(200):  # data of 200 sessions nobody announced
                frame = DataHeader(
                    frame_length=64,
                    flags=0xC0,
                    term_offset=0,
                    session_id=session,
                    stream_id=STREAM,
                    term_id=1,
                ).encode()
                forger.sendto(frame + bytes(32), ("127.0.0.1", PORT))
            await wait_for(lambda: transport.counters.rate_limited > 150)
        assert transport.counters.setup_elicitations_sent <= 10


async def _retransmits_after_forged_nak(validate: bool) -> tuple[int, int]:
    """A stranger sends a NAK for data a dynamic-MDC publication has sent; returns the
    publication's (retransmits sent, unvalidated drops) afterwards."""
    from echo.transport.core.frames import Nak

    config = TransportConfig(validate_addresses=validate)
    net = MemoryNetwork()
    async with (
        open_transport(config, socket_factory=net) as server,
        open_transport(config, socket_factory=net) as client,
    ):
        pub = await server.add_publication(mdc_pub(PORT), STREAM)
        sub = await client.add_subscription(mdc_sub(PORT), STREAM)
        await pub.wait_connected(timeout=5)
        await pub.send(b"x" * 1000)
        with trio.fail_after(5):
            await sub.receive()
        before = server.counters.retransmits_sent
        nak = Nak(
            session_id=pub.session_id,
            stream_id=STREAM,
            term_id=pub._channel.state.initial_term_id,
            term_offset=0,
            # the whole first frame (1000 bytes + header): a NAK that ends inside a frame
            # resends nothing, and retransmits_sent counts only what left
            length=2048,
        ).encode()
        with net.open_socket() as forger:
            forger.sendto(nak, ("127.0.0.1", PORT))
            await wait_for(lambda: server.counters.naks_received >= 1)
        # The retransmit, if any, goes out on the driver's next pass: let it run.
        await trio.testing.wait_all_tasks_blocked()
        return server.counters.retransmits_sent - before, server.counters.unvalidated_drops


async def test_a_nak_from_an_unvalidated_address_resends_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    retransmits, dropped = await _retransmits_after_forged_nak(validate=True)
    assert retransmits == 0
    assert dropped >= 1


async def test_without_validation_a_strangers_nak_is_honoured(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The same forged NAK is acted on when validation is off: what the check above prevents.
    retransmits, _ = await _retransmits_after_forged_nak(validate=False)
    assert retransmits == 1


async def test_a_new_destination_gets_its_setup_at_once_and_alone(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Aeron marks every publication for a SETUP to every destination at the next 100 ms tick;
    # here the newcomer's registration is answered to its address alone, at once.
    net = MemoryNetwork(link=Link(delay=0.005))
    async with (
        open_transport(socket_factory=net) as server,
        open_transport(socket_factory=net) as first,
        open_transport(socket_factory=net) as late,
    ):
        pub = await server.add_publication(mdc_pub(PORT), STREAM)
        sub_a = await first.add_subscription(mdc_sub(PORT), STREAM)
        await pub.wait_connected(timeout=5)
        await wait_for_image(sub_a)
        setups_at_a = first.counters.setups_received
        started = trio.current_time()
        sub_b = await late.add_subscription(mdc_sub(PORT), STREAM)
        await wait_for_image(sub_b)
        joined = trio.current_time() - started
        await pub.send(b"both")
        with trio.fail_after(5):
            assert (await sub_a.receive()).data == b"both"
            assert (await sub_b.receive()).data == b"both"
        assert first.counters.setups_received == setups_at_a  # none of B's SETUPs went to A
        # Registration, cookie challenge, registration with the cookie, SETUP: four one-way
        # trips of 5 ms, in virtual time exactly, not the 100 ms SETUP interval.
        assert joined == pytest.approx(4 * 0.005), joined


async def test_an_mdc_subscriber_stops_registering_once_it_has_its_image(
    autojump_clock: trio.testing.MockClock,
) -> None:
    config = TransportConfig(mdc_registration_interval=0.02)
    net = MemoryNetwork()
    async with (
        open_transport(config, socket_factory=net) as server,
        open_transport(config, socket_factory=net) as client,
    ):
        pub = await server.add_publication(mdc_pub(PORT), STREAM)
        sub = await client.add_subscription(mdc_sub(PORT), STREAM)
        await pub.wait_connected(timeout=5)
        await wait_for_image(sub)
        registrations = client.counters.setup_elicitations_sent
        # Deliberately let fifteen registration intervals of virtual time pass: what is tested
        # is that no registration is sent in them.
        await trio.sleep(0.3)
        assert client.counters.setup_elicitations_sent == registrations
        # ...and its image's SMs keep it a destination: the stream still flows.
        await pub.send(b"still here")
        with trio.fail_after(5):
            assert (await sub.receive()).data == b"still here"
        assert pub.destinations


async def test_an_mdc_subscriber_with_its_image_has_no_registration_timer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Once every stream has its image, the registration timer does not wake the socket to
    # find nothing to send (an idle lobby member's socket woke once a second for it); when the
    # image goes, registrations start again at once.
    config = TransportConfig(mdc_registration_interval=0.02, image_liveness_timeout=0.5)
    net = MemoryNetwork()
    async with (
        open_transport(config, socket_factory=net) as server,
        open_transport(config, socket_factory=net) as client,
    ):
        pub = await server.add_publication(mdc_pub(PORT), STREAM)
        sub = await client.add_subscription(mdc_sub(PORT), STREAM)
        await pub.wait_connected(timeout=5)
        await wait_for_image(sub)
        await trio.sleep(0.1)
        endpoint = sub._channel.socket.endpoint
        now = trio.current_time()
        # The image's own timers (its status messages, its liveness) are all that is due.
        (image,) = endpoint.images.values()
        assert endpoint.next_deadline(now) == image.next_deadline(now)
        assert endpoint._next_registration < now
        registrations = client.counters.setup_elicitations_sent
        await pub.close()
        with trio.fail_after(5):
            while sub.images:
                await sub.wait_activity()
        await trio.sleep(0.1)
        assert client.counters.setup_elicitations_sent >= registrations + 3
