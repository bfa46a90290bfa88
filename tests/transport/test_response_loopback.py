"""Response channels over real loopback sockets: many clients, one server port pair.

The server subscribes once on its request port; each client's request image is answered by a
response publication on the server's control port that reaches that client alone. Timing
comes from awaited conditions (wait_connected, receive), never from sleeps.
"""

from __future__ import annotations

import socket

import trio
import trio.testing

from echo.transport import Image, Publication, TransportConfig, open_transport
from echo.transport.frames import SM_SETUP_FLAG, StatusMessage

STREAM = 1001
CLIENTS = 5


def _free_ports() -> tuple[int, int]:
    found = []
    for _ in range(2):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.bind(("127.0.0.1", 0))
            found.append(probe.getsockname()[1])
    return found[0], found[1]


async def test_many_clients_share_two_server_ports_and_hear_only_their_answers() -> None:
    port, control = _free_ports()
    config = TransportConfig()
    async with open_transport(config) as server:
        images: list[Image] = []
        arrived = trio.Event()

        def on_image(image: Image) -> None:
            images.append(image)
            if len(images) == CLIENTS:
                arrived.set()

        requests_in = await server.add_subscription(
            f"aeron:udp?endpoint=127.0.0.1:{port}", STREAM, on_image_available=on_image
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
                await arrived.wait()
            answers: dict[int, Publication] = {}
            for image in images:
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


async def test_a_stranger_on_the_same_host_cannot_take_a_live_response_stream() -> None:
    port, control = _free_ports()
    async with open_transport() as server, open_transport() as client:
        images: list[Image] = []
        got_image = trio.Event()

        def on_image(image: Image) -> None:
            images.append(image)
            got_image.set()

        await server.add_subscription(
            f"aeron:udp?endpoint=127.0.0.1:{port}", STREAM, on_image_available=on_image
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
            await got_image.wait()
        answer = await server.add_publication(
            f"aeron:udp?control-mode=response|control=127.0.0.1:{control}"
            f"|response-correlation-id={images[0].correlation_id}",
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
