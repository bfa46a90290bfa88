"""A player of the "ship a game" walk-through: lobby -> game server -> result -> lobby.

    python examples/ship_a_game/player.py --servers 127.0.0.1:7700 --member alice \\
        --state-file alice.state --create --move rock
    python examples/ship_a_game/player.py --servers 127.0.0.1:7700 --member bob \\
        --state-file bob.state --join LOBBY_ID --move paper

The owner (--create) makes a lobby for two and starts the game once the other player is
ready, on a game server tagged mode=rps; every player takes the ticket of its GameStarting to
that server, plays one move, and waits for the lobby's GameEnded: back in the lobby, unlocked,
nobody ready. The seat's resume token is kept in --state-file: killed mid-game and started
again with the same file, the player takes its seat back ("resumed"), asks the lobby for a
fresh ticket for the game still running, and plays on. One line per step on standard output.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import trio

import echo.lobby
import echo.session as es
from echo.lobby.protocol import GameEnded, GameStarting, ResumeToken
from echo.lobby.statefile import SavedSeat, read_state, remove_state, write_state


def say(*words: object) -> None:
    print(*words, flush=True)


async def main(args: argparse.Namespace) -> None:
    saved = read_state(args.state_file)
    token = saved.token if saved is not None else None
    async with echo.lobby.connect(
        args.servers.split(","), member=args.member, resume_token=token
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
            args.create
            and not started
            and replica is not None
            and len(replica.members) == 2
            and all(s.ready for s in replica.members.values())
        ):
            started = True
            await lobby.start({"mode": "rps"})  # any game server announcing mode=rps


async def play(start: GameStarting, args: argparse.Namespace) -> None:
    """Take the ticket to the game server: everything to connect is in the GameStarting."""
    async with es.connect(
        start.host,
        start.port,
        start.control_port,
        credentials=start.ticket,
        duologue_ports=start.duologue_ports,
    ) as game:
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
    who = parser.add_mutually_exclusive_group()
    who.add_argument("--create", action="store_true", help="create the lobby (the owner)")
    who.add_argument("--join", type=int, metavar="LOBBY_ID")
    parser.add_argument("--team", default="red")
    parser.add_argument("--move", choices=["rock", "paper", "scissors"], default="rock")
    parser.add_argument("--hold", action="store_true", help="wait for a line before moving")
    args = parser.parse_args()
    if not (args.create or args.join or args.state_file.exists()):
        parser.error("--create or --join LOBBY_ID (or a --state-file to resume)")
    trio.run(main, args)


if __name__ == "__main__":
    cli()
