"""The lobby server's chat fan-out alone, for instruction counts (L1).

`LobbyServer._deliver` of chat lines to the 8 members of a lobby, each member a real
`Channels` (with the lobby's own two reader tasks per member) over a stand-in session whose
other end is a pure `ChannelPeer` that reads every message at once and sends back what it
would (its guarantees): the lobby, channels and trio work per delivery, without the transport
or the network. Deterministic under callgrind, unlike any timing on a shared machine:

    valgrind --tool=callgrind --callgrind-out-file=/dev/null python -m bench.lobby_fanout 0
    valgrind --tool=callgrind --callgrind-out-file=/dev/null python -m bench.lobby_fanout 300

(instructions per delivery = the difference / (300 x 8)). It prints the session messages
each way.
"""

from __future__ import annotations

import sys

import trio
import trio.lowlevel

from echo.channels import open_channels
from echo.channels.core import ChannelPeer
from echo.lobby.protocol import ChatLine
from echo.lobby.server import LobbyServer, _Conn, lobby_channel_specs
from echo.lobby.state import Send
from echo.session import ServerConfig

MEMBERS = tuple(f"member-{i}" for i in range(8))


class Member:
    """A session whose far end is a member's ChannelPeer that reads everything at once."""

    def __init__(self) -> None:
        self.sent = 0
        self.back = 0
        self.peer = ChannelPeer(lobby_channel_specs(server=False))
        self._in, self._inbox = trio.open_memory_channel[bytes](1000)
        self._in.send_nowait(self.peer.data_to_send())  # its first guarantees

    def _arrive(self, data: bytes) -> None:
        self.sent += 1
        peer = self.peer
        peer.receive(data)
        for channel in peer.specs:
            while (delivery := peer.take(channel)) is not None:
                peer.release(delivery)
        answer = peer.data_to_send()
        if answer:
            self.back += 1
            self._in.send_nowait(answer)

    async def send(self, data: bytes) -> None:
        self._arrive(data)

    def send_nowait(self, data: bytes) -> bool:
        self._arrive(data)
        return True

    async def receive(self) -> bytes:
        return await self._inbox.receive()

    async def close(self, reason: str = "") -> None:
        pass


async def run(lines: int) -> tuple[int, int]:
    server = LobbyServer(
        ServerConfig(address="127.0.0.1", port=31000, control_port=31001,
                     clients_base_port=31002, max_clients=16, max_per_ip=16)
    )
    members: list[Member] = []
    async with trio.open_nursery() as nursery:

        async def member(name: str, task_status: trio.TaskStatus[None]) -> None:
            session = Member()
            members.append(session)
            conn = _Conn(name, session)  # type: ignore[arg-type]
            async with open_channels(session, lobby_channel_specs(server=True)) as channels:
                conn.channels = channels
                server.conns[name] = conn
                async with trio.open_nursery() as readers:
                    readers.start_soon(server._read_requests, conn)
                    readers.start_soon(server._read_chat, conn)
                    task_status.started()
                    await trio.sleep_forever()

        for name in MEMBERS:
            await nursery.start(member, name)
        await trio.sleep(0.01)
        line = ChatLine(1, MEMBERS[0], "x" * 32)
        for _ in range(lines):
            server._deliver((Send(MEMBERS, line),))
            await trio.lowlevel.checkpoint()  # the woken tasks run, as in the server's loop
            await trio.lowlevel.checkpoint()
        await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    return sum(m.sent for m in members), sum(m.back for m in members)


def main() -> None:
    lines = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    sent, back = trio.run(run, lines)
    print(f"{lines * len(MEMBERS)} deliveries: {sent} session messages to the members, "
          f"{back} back")


if __name__ == "__main__":
    main()
