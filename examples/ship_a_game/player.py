"""A player of the "ship a game" walk-through: lobby -> game server -> result -> lobby.

    python examples/ship_a_game/player.py --servers 127.0.0.1:7700 --member alice \\
        --state-file alice.state --create --move rock
    python examples/ship_a_game/player.py --servers 127.0.0.1:7700 --member bob \\
        --state-file bob.state --join LOBBY_ID --move paper
    # or, for players who do not know each other, both ask the matchmaker:
    python examples/ship_a_game/player.py ... --member alice --queue rps eu --skill 1500

The owner (--create, or whom the matchmaker's lobby names owner with --queue) starts the game
once the other player is ready, on a game server tagged mode=rps; every player takes the
ticket of its GameStarting to that server, plays one move, and waits for the lobby's
GameEnded: back in the lobby, unlocked, nobody ready. The seat's resume token is kept in
--state-file: killed mid-game and started again with the same file, the player takes its seat
back ("resumed"), asks the lobby for a fresh ticket for the game still running, and plays on.
One line per step on standard output.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import trio

import echo.lobby
from echo.lobby.protocol import GameEnded, GameStarting, ResumeToken
from echo.lobby.queue_wire import Matched, QueueLeft
from echo.lobby.statefile import SavedSeat, read_state, remove_state, write_state


def say(*words: object) -> None:
    print(*words, flush=True)


async def main(args: argparse.Namespace) -> None:
    saved = read_state(args.state_file)
    token = saved.token if saved is not None else None
    async with echo.lobby.connect(
        args.servers.split(","),
        member=args.member,
        resume_token=token,
        server_key=args.server_key,  # the lobby's public key, if it encrypts (echo-lobby --key)
    ) as lobby:
        if token is not None:
            # A restart: the seat is ours again, with its ready state and attributes.
            while lobby.replica is None:
                await lobby.next_event()
            say("resumed", lobby.replica.lobby_id)
            if lobby.replica.locked:
                await lobby.request_ticket()  # the game runs on: a fresh ticket for it
        elif args.create:
            lobby_id = await lobby.create("rock-paper-scissors", 2, metadata={"mode": "rps"})
            say("created", lobby_id)
        elif args.queue:
            # Strangers: the matchmaker seats two players of the mode and region in a new lobby.
            mode, region = args.queue
            await lobby.queue(mode, region, skill=args.skill, size=2)
            while not isinstance(event := await lobby.next_event(), Matched):
                if isinstance(event, QueueLeft):
                    raise SystemExit(f"left the queue: {event.reason}")
            say("matched", event.lobby_id)
        else:
            await lobby.join(args.join)
            say("joined", args.join)
        if token is None:
            await lobby.set_attributes({"team": args.team})
            await lobby.ready()
        await play_until_the_game_ends(lobby, args)


async def play_until_the_game_ends(lobby: echo.lobby.LobbyClient, args: argparse.Namespace) -> None:
    started = False
    while True:
        event = await lobby.next_event()
        match event:
            case ResumeToken():
                write_state(args.state_file, SavedSeat(args.member, event.lobby_id, event.token))
            case GameStarting():
                say("game", event.match_id, event.address)
                await play(event, args)
            case GameEnded():
                say("game_ended", dict(event.result))
                replica = lobby.replica
                assert replica is not None
                ready = [m for m, s in replica.members.items() if s.ready]
                say("back_in_lobby", f"locked={replica.locked}", f"ready={ready}")
                await lobby.leave()
                remove_state(args.state_file)
                return
        replica = lobby.replica
        if (
            replica is not None
            and replica.owner == args.member  # who created the lobby, or whom the match made owner
            and not replica.locked  # no game running (a resumed owner must not start another)
            and not started
            and replica is not None
            and len(replica.members) == 2
            and all(s.ready for s in replica.members.values())
        ):
            started = True
            await lobby.start({"mode": "rps"})  # any game server announcing mode=rps


async def play(start: GameStarting, args: argparse.Namespace) -> None:
    """Take the ticket to the game server: everything to connect is in the GameStarting (its
    ports, its duologue mode and, if it announced one, its key, which `join_game` pins)."""
    async with echo.lobby.join_game(start) as game:
        say((await game.receive()).decode())  # WELCOME alice team=red against=bob
        prompt = await game.receive()
        if prompt == b"MOVE?":
            say("in_game")
            if args.hold:
                await trio.to_thread.run_sync(sys.stdin.readline)  # the demo kills us here
            await game.send(f"MOVE {args.move}".encode())
            prompt = await game.receive()
        say(prompt.decode())  # RESULT winner=...


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", required=True, help="HOST:PORT,... of the lobby servers")
    parser.add_argument("--member", required=True)
    parser.add_argument("--state-file", type=Path, required=True)
    parser.add_argument("--server-key", help="the lobby's public key (echo-lobby --key prints it)")
    who = parser.add_mutually_exclusive_group()
    who.add_argument("--create", action="store_true", help="create the lobby (the owner)")
    who.add_argument("--join", type=int, metavar="LOBBY_ID")
    who.add_argument("--queue", nargs=2, metavar=("MODE", "REGION"), help="ask the matchmaker")
    parser.add_argument("--skill", type=int, default=1500, help="for the matchmaker")
    parser.add_argument("--team", default="red")
    parser.add_argument("--move", choices=["rock", "paper", "scissors"], default="rock")
    parser.add_argument("--hold", action="store_true", help="wait for a line before moving")
    args = parser.parse_args()
    if not (args.create or args.join or args.queue or args.state_file.exists()):
        parser.error("--create, --join LOBBY_ID or --queue MODE REGION (or a --state-file)")
    trio.run(main, args)


if __name__ == "__main__":
    cli()
