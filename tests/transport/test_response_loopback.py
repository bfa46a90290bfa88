"""Response channels over real loopback sockets: many clients, one server port pair.

The server subscribes once on its request port; each client's request image is answered by a
response publication on the server's control port that reaches that client alone. Timing
comes from awaited conditions (wait_connected, receive), never from sleeps.
"""

from __future__ import annotations

import socket

import trio
import trio.lowlevel
import trio.testing

from echo.transport import Image, Publication, TransportConfig, open_transport
from echo.transport.core.frames import SM_SETUP_FLAG, StatusMessage

STREAM = 1001
CLIENTS = 5


def _free_ports() -> tuple[int, int]:
    found = []
    for _ in range(2):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.bind(("127.0.0.1", 0))
            found.append(probe.getsockname()[1])
    return found[0], found[1]


class Arrivals:
    """An `on_image_available` that keeps the images and says when `count` have come."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.images: list[Image] = []
        self.all_in = trio.Event()

    def __call__(self, image: Image) -> None:
        self.images.append(image)
        if len(self.images) >= self.count:
            self.all_in.set()


async def test_many_clients_share_two_server_ports_and_hear_only_their_answers() -> None:
    port, control = _free_ports()
    config = TransportConfig()
    async with open_transport(config) as server:
        arrivals = Arrivals(CLIENTS)
        requests_in = await server.add_subscription(
            f"aeron:udp?endpoint=127.0.0.1:{port}", STREAM, on_image_available=arrivals
        )
        async with trio.open_nursery() as nursery:
            clients = []
            for _ in range(CLIENTS):
                transport = await nursery.start(_client_transport)
                response_in = await transport.add_subscription(
                    f"aeron:udp?control-mode=response|control=127.0.0.1:{control}", STREAM
                )
                request_out = await transport.add_publication(
                    f"aeron:udp?endpoint=127.0.0.1:{port}"
                    f"|response-correlation-id={response_in.registration_id}",
                    STREAM,
                )
                clients.append((transport, response_in, request_out))
            with trio.fail_after(20):
                await arrivals.all_in.wait()
            answers: dict[int, Publication] = {}
            for image in arrivals.images:
                assert image.requested_response
                answers[image.session_id] = await server.add_publication(
                    f"aeron:udp?control-mode=response|control=127.0.0.1:{control}"
                    f"|response-correlation-id={image.correlation_id}",
                    STREAM,
                )
            with trio.fail_after(20):
                for publication in answers.values():
                    await publication.wait_connected()
                for _, _, request_out in clients:
                    await request_out.send(b"ask %d" % request_out.session_id)
                for _ in range(CLIENTS):
                    message = await requests_in.receive()
                    answer = answers[message.session_id]
                    await answer.send(b"answer to %d" % message.session_id)
                for _, response_in, request_out in clients:
                    reply = await response_in.receive()
                    assert reply.data == b"answer to %d" % request_out.session_id
                    assert reply.source_port == control
            # Two sockets on the server for every client, and no stranger's data anywhere.
            local = {s.local_address for s in server._driver.sockets}
            assert len(local) == 2
            for _, response_in, _ in clients:
                assert len(response_in.images) == 1
                assert response_in._channel.poll(lambda m: None, 10) == 0
            assert server.counters.response_setups_sent >= CLIENTS
            nursery.cancel_scope.cancel()


async def _client_transport(
    task_status: trio.TaskStatus[object] = trio.TASK_STATUS_IGNORED,
) -> None:
    async with open_transport(TransportConfig()) as transport:
        task_status.started(transport)
        await trio.sleep_forever()


async def test_request_publications_of_one_transport_each_send_from_a_socket_of_their_own() -> None:
    # A bot farm: several sessions of one client transport to one server port. Each request
    # publication goes out of its own socket (the server's images come from different
    # ports), so an SM for one is not a poll of all the others; each still hears its answer.
    port, control = _free_ports()
    async with open_transport() as server, open_transport() as client:
        arrivals = Arrivals(3)
        requests_in = await server.add_subscription(
            f"aeron:udp?endpoint=127.0.0.1:{port}", STREAM, on_image_available=arrivals
        )
        pairs = []
        for _ in range(3):
            response_in = await client.add_subscription(
                f"aeron:udp?control-mode=response|control=127.0.0.1:{control}", STREAM
            )
            request_out = await client.add_publication(
                f"aeron:udp?endpoint=127.0.0.1:{port}"
                f"|response-correlation-id={response_in.registration_id}",
                STREAM,
            )
            pairs.append((response_in, request_out))
        with trio.fail_after(20):
            await arrivals.all_in.wait()
            assert len({image.source_address for image in arrivals.images}) == 3
            answers = {
                image.session_id: await server.add_publication(
                    f"aeron:udp?control-mode=response|control=127.0.0.1:{control}"
                    f"|response-correlation-id={image.correlation_id}",
                    STREAM,
                )
                for image in arrivals.images
            }
            for _, request_out in pairs:
                await request_out.send(b"ask %d" % request_out.session_id)
            for _ in pairs:
                message = await requests_in.receive()
                await answers[message.session_id].send(b"answer to %d" % message.session_id)
            for response_in, request_out in pairs:
                reply = await response_in.receive()
                assert reply.data == b"answer to %d" % request_out.session_id
        # Closing one leaves the others' sockets open.
        await pairs[0][1].close()
        with trio.fail_after(20):
            await pairs[1][1].send(b"still here")
            message = await requests_in.receive()
        assert message.data == b"still here"


async def test_a_stranger_on_the_same_host_cannot_take_a_live_response_stream() -> None:
    port, control = _free_ports()
    async with open_transport() as server, open_transport() as client:
        arrivals = Arrivals(1)
        await server.add_subscription(
            f"aeron:udp?endpoint=127.0.0.1:{port}", STREAM, on_image_available=arrivals
        )
        response_in = await client.add_subscription(
            f"aeron:udp?control-mode=response|control=127.0.0.1:{control}", STREAM
        )
        await client.add_publication(
            f"aeron:udp?endpoint=127.0.0.1:{port}"
            f"|response-correlation-id={response_in.registration_id}",
            STREAM,
        )
        with trio.fail_after(20):
            await arrivals.all_in.wait()
        answer = await server.add_publication(
            f"aeron:udp?control-mode=response|control=127.0.0.1:{control}"
            f"|response-correlation-id={arrivals.images[0].correlation_id}",
            STREAM,
        )
        with trio.fail_after(20):
            await answer.wait_connected()
        # The stranger knows the response session and asks for it from its own socket.
        stranger = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        await stranger.bind(("127.0.0.1", 0))
        claim = StatusMessage(
            session_id=answer.session_id,
            stream_id=STREAM,
            consumption_term_id=0,
            consumption_term_offset=0,
            receiver_window=0,
            receiver_id=666,
            flags=SM_SETUP_FLAG,
        ).encode()
        before = server.counters.unvalidated_drops
        await stranger.sendto(claim, ("127.0.0.1", control))
        # Loopback delivers at sendto; the server's reader handles it, then everything idles.
        await trio.testing.wait_all_tasks_blocked(cushion=0.05)
        assert server.counters.unvalidated_drops == before + 1
        await answer.send(b"secret")
        with trio.fail_after(10):
            reply = await response_in.receive()
        assert reply.data == b"secret"
        # Whatever the server sent after the claim went to the client, none to the stranger.
        with trio.move_on_after(0.3):
            await stranger.recv(2048)
            raise AssertionError("the stranger received a datagram of the response stream")
        stranger.close()


async def test_many_session_subscriptions_on_one_socket_receive_at_once() -> None:
    # One task per session reads its own subscription, all on one socket (the shared request
    # port): one of them reads the socket for everyone (the driver lends it) while the others
    # wait; a task that got its message must not hand the socket back to the driver's reader
    # while another task is still reading it (trio.BusyResourceError killed the server).
    port, _ = _free_ports()
    sessions = list(range(1000, 1006))
    rounds = 30
    async with open_transport() as server, open_transport() as client:
        subscriptions = [
            await server.add_subscription(
                f"aeron:udp?endpoint=127.0.0.1:{port}|session-id={session}", STREAM
            )
            for session in sessions
        ]
        publications = [
            await client.add_publication(
                f"aeron:udp?endpoint=127.0.0.1:{port}|session-id={session}", STREAM
            )
            for session in sessions
        ]
        assert len({s.local_address for s in subscriptions}) == 1
        got: dict[int, list[bytes]] = {session: [] for session in sessions}

        async def read(session: int, subscription: object) -> None:
            for _ in range(rounds):
                message = await subscription.receive()  # type: ignore[attr-defined]
                assert message.session_id == session
                got[session].append(message.data)

        with trio.fail_after(60):
            for publication in publications:
                await publication.wait_connected()
            async with trio.open_nursery() as nursery:
                for session, subscription in zip(sessions, subscriptions, strict=True):
                    nursery.start_soon(read, session, subscription)
                for index in range(rounds):
                    for publication in publications:
                        await publication.send(b"%d:%d" % (publication.session_id, index))
                    await trio.lowlevel.checkpoint()
        for session in sessions:
            assert got[session] == [b"%d:%d" % (session, i) for i in range(rounds)]


async def test_a_task_that_stops_waiting_leaves_the_socket_to_the_task_reading_it() -> None:
    # The rule behind the test above, without its timing: with many subscriptions on one
    # socket, a task that got its message stops waiting while another task still reads the
    # socket (borrowed); giving the socket back to the driver's reader then would make two
    # tasks wait on one fd. Given back only when nobody reads it.
    port, _ = _free_ports()
    async with open_transport() as server:
        subscription = await server.add_subscription(
            f"aeron:udp?endpoint=127.0.0.1:{port}|session-id=1", STREAM
        )
        await server.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}|session-id=2", STREAM)
        udp = subscription._channel.socket
        lending = udp.lending
        lending.lend(0.0)
        lending.waiters = 1
        lending.borrowed = True
        server._driver.stop_waiting(udp)
        assert lending.lent  # another task is reading it: not given back
        lending.borrowed = False
        server._driver.stop_waiting(udp)
        assert not lending.lent
        lending.waiters = 0
