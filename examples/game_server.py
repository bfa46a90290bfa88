"""A tiny game server on echo.session: players join a room, move, and see everyone's moves.

    python examples/game_server.py                  # the server, on 127.0.0.1 ports 9000/9001
    python examples/game_server.py --bot alice      # a player that moves 5 times and leaves

The server gets everything a public game server needs from the library: HELLO admission,
per-IP limits, a private duologue per player (through NAT), expiry of players who never
joined, goodbyes on Ctrl-C. What is left to write is the game: one coroutine per player.
"""

from __future__ import annotations

import argparse
import random
import signal

import trio

import echo.session as es


class Room:
    """Everyone in one room. Protocol (one message each): client `MOVE <x> <y>`;
    server `WELCOME <id>`, `AT <id> <x> <y>` (anyone's move), `LEFT <id>`."""

    def __init__(self) -> None:
        self.players: dict[int, es.Session] = {}
        self.positions: dict[int, tuple[int, int]] = {}

    async def __call__(self, session: es.Session) -> None:
        me = session.session_id
        # WELCOME first, then join the room: registered earlier, another player's move could
        # reach this player before its WELCOME. A move made while the positions below are sent
        # arrives twice at worst, and AT is idempotent.
        await session.send(b"WELCOME %d" % me)
        self.players[me] = session
        try:
            for other, (x, y) in list(self.positions.items()):
                await session.send(b"AT %d %d %d" % (other, x, y))
            async for message in session:
                verb, *args = message.split()
                if verb != b"MOVE" or len(args) != 2 or not all(a.isdigit() for a in args):
                    await session.close("expected MOVE <x> <y>")  # the player sees this reason
                    return
                x, y = int(args[0]), int(args[1])
                self.positions[me] = (x, y)
                await self.broadcast(b"AT %d %d %d" % (me, x, y))
            # The loop ends by itself when the player leaves in order; a player that fell
            # silent (crashed, unplugged) raises LostContact instead: not the same news.
        except es.LostContact as lost:
            print(f"player {me} lost: {lost.reason}")
        finally:
            del self.players[me]
            self.positions.pop(me, None)
            await self.broadcast(b"LEFT %d" % me)

    async def broadcast(self, data: bytes) -> None:
        for player in list(self.players.values()):
            try:
                await player.send(data)
            except es.SessionClosed:
                pass  # that player is leaving; its own task cleans up


async def serve(config: es.ServerConfig) -> None:
    """Serve until Ctrl-C (or SIGTERM); then every player gets "ERROR server shutting down"."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            server = await nursery.start(es.SessionServer(config, Room()).run)
            print(f"game server on {config.address} ports {config.port}/{config.control_port}")
            async for _ in signals:
                await server.stop()
                break


async def bot(name: str, server: str, port: int, control_port: int) -> list[bytes]:
    """Join, make five random moves, print what the room says; returns what it saw."""
    seen: list[bytes] = []
    async with es.connect(server, port, control_port) as session:
        welcome = await session.receive()
        print(f"{name}: {welcome.decode()}")
        seen.append(welcome)
        for _ in range(5):
            await session.send(b"MOVE %d %d" % (random.randrange(100), random.randrange(100)))
            # Our own move comes back; others' moves arrive in between.
            while True:
                update = await session.receive()
                seen.append(update)
                print(f"{name}: {update.decode()}")
                if update.startswith(b"AT %d " % session.session_id):
                    break
            await trio.sleep(0.2)
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--control-port", type=int, default=9001)
    parser.add_argument("--bot", metavar="NAME", help="run a player instead of the server")
    args = parser.parse_args()
    try:
        if args.bot:
            trio.run(bot, args.bot, args.address, args.port, args.control_port)
        else:
            config = es.ServerConfig(
                address=args.address, port=args.port, control_port=args.control_port
            )
            trio.run(serve, config)
    except es.SessionError as error:
        raise SystemExit(f"{args.bot}: {error}") from None
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
