"""`./dev lobby-demo`: a lobby server, a topics server, a game server and four bots on loopback.

Every server is the real CLI started as a process (echo-topics, echo-lobby, echo-server
--ticket-key and echo-lobby-announce for its announcements); each bot is a process of its own
on the `echo.lobby` library. Alice creates a lobby; bob, carol and dave search for it, join,
chat and ready up; alice starts the game; every bot takes its ticket to the game server, which
admits it (and would refuse a forged one), and echoes a line there. The demo ends by itself.

Everything is encrypted (echo.session.crypto): the lobby server and the game server run with
--key and --encryption required; the bots pin the lobby's key (--server-key), and learn the
game server's key from the lobby, with their tickets (echo-lobby-announce --server-key), so no
bot is ever given the game server's key.
admits it (and would refuse a forged one), and echoes a line there.

Then the "ship a game" walk-through (tools/demo/ship.py, examples/ship_a_game): a game server
of rock-paper-scissors and two players; one is killed with SIGKILL in the middle of the game,
restarted with its state file ("resumed"), gets a fresh ticket for the running game and
finishes it; the game server's signed result goes back to the lobby, which tells both players
(GameEnded) and is open again. The demo ends by itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click
import trio

from tools.demo.server import COLOURS, _start

BOTS = ["alice", "bob", "carol", "dave"]


def _wait_for(lines: list[str], text: str, process: subprocess.Popen[str], what: str) -> None:
    deadline = time.monotonic() + 30
    while not any(text in line for line in lines):
        if process.poll() is not None or time.monotonic() > deadline:
            print(f"{what} did not start; its output is above.")
            raise SystemExit(1)
        time.sleep(0.05)


@click.group(invoke_without_command=True)
@click.option("--port", default=7600, show_default=True, help="Lobby server port (control +1).")
@click.pass_context
def main(ctx: click.Context, port: int) -> None:
    """Run the lobby demo (servers and four bots) and show what they print."""
    if ctx.invoked_subcommand is not None:
        return
    topics_port, game_port = port + 100, port + 200
    lobby = f"127.0.0.1:{port}"
    topics = f"127.0.0.1:{topics_port}"
    processes: list[subprocess.Popen[str]] = []
    codes: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="echo-lobby-demo-") as tmp:
        from echo.session.crypto import generate_key_file
        from echo.tickets import new_key_text

        key = Path(tmp) / "game.key"
        key.write_text(new_key_text())
        os.chmod(key, 0o600)
        lobby_key, game_key = Path(tmp) / "lobby-session.key", Path(tmp) / "game-session.key"
        lobby_public = generate_key_file(lobby_key).public_text
        generate_key_file(game_key)
        encrypted = ["--encryption", "required"]
        try:
            print(
                f"Starting echo-topics on {topics}, echo-lobby on {lobby}, "
                f"echo-server on 127.0.0.1:{game_port} with --ticket-key..."
            )
            started = [
                (
                    "topics",
                    ["echo.topics.serve", "--port", str(topics_port), "--log-level", "warning"],
                    "",
                ),
                (
                    "lobby",
                    [
                        "echo.lobby.cli",
                        "server",
                        "--port",
                        str(port),
                        "--max-clients",
                        "16",
                        "--topics",
                        topics,
                        "--ticket-key",
                        str(key),
                        "--log-level",
                        "warning",
                        "--key",
                        str(lobby_key),
                        *encrypted,
                    ],
                    "",
                ),
                (
                    "game",
                    [
                        "echo.server.cli",
                        "--port",
                        str(game_port),
                        "--control-port",
                        str(game_port + 1),
                        "--clients-base-port",
                        str(game_port + 2),
                        "--max-per-ip",
                        "8",
                        "--duologue-ports",
                        "shared",
                        "--ticket-key",
                        str(key),
                        "--key",
                        str(game_key),
                        *encrypted,
                    ],
                    "listening",
                ),
                (
                    "announce",
                    [
                        "echo.lobby.cli",
                        "announce",
                        "--topics",
                        topics,
                        "--address",
                        f"127.0.0.1:{game_port}",
                        "--slots",
                        "8",
                        "--interval",
                        "0.5",
                        "--server-key",
                        str(game_key),
                    ],
                    "announcing",
                ),
            ]
            for i, (label, argv, ready) in enumerate(started):
                lines: list[str] = []
                process = _start(argv, label, COLOURS[i % len(COLOURS)], lines)
                processes.append(process)
                if ready:
                    _wait_for(lines, ready, process, label)
            # echo-lobby logs only warnings here (readable output), so nothing tells when it
            # listens: the first bot's handshake waits for it (up to 10 s).
            print(
                "Everything encrypted: the bots pin the lobby's key; the game server's key "
                "reaches them with their tickets."
            )
            print("Four bots: alice creates a lobby; bob, carol and dave find it and join.")
            bots = []
            for i, name in enumerate(BOTS):
                bot = _start(
                    [
                        "tools.demo.lobby",
                        "--port",
                        str(port),
                        "bot",
                        name,
                        "--owner",
                        BOTS[0],
                        "--lobby-key",
                        lobby_public,
                    ],
                    name,
                    COLOURS[(i + 1) % len(COLOURS)],
                    [],
                )
                bots.append((name, bot))
                if i == 0:
                    time.sleep(1.0)  # alice's lobby exists before the others search
            for name, bot in bots:
                try:
                    codes[name] = bot.wait(timeout=90)
                except subprocess.TimeoutExpired:
                    bot.kill()
                    codes[name] = -1
            codes["walkthrough"] = _walkthrough(
                lobby, topics, key, port + 300, Path(tmp), lobby_public
            )
        finally:
            for process in reversed(processes):
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
                    try:
                        process.wait(timeout=15)
                    except subprocess.TimeoutExpired:
                        process.kill()
            time.sleep(0.1)
    print()
    print("exit statuses: " + ", ".join(f"{k}={v}" for k, v in codes.items()))
    print("(0 = the bot got into the game server with its ticket)")
    sys.exit(0 if codes and all(code == 0 for code in codes.values()) else 1)


def _walkthrough(
    lobby: str, topics: str, key: Path, game_port: int, tmp: Path, lobby_key: str
) -> int:
    from tools.demo.ship import walkthrough

    print()
    print("Ship a game: a rock-paper-scissors server in the lobby's loop, two players, a crash.")
    try:
        # erin and frank: the bots' names are seated in the first lobby.
        outcome = walkthrough(
            lobby, topics, key, game_port, tmp, ("erin", "frank"), lobby_key, matchmaker=True
        )
    except AssertionError as error:
        print(f"the walk-through stopped: {error}")
        return 1
    print(
        f"bob was back in his seat {outcome.resume_seconds:.1f} s after his restart "
        "(the process's start-up included), and the game's result came back to the lobby."
    )
    return 0


@main.command()
@click.argument("name")
@click.option("--owner", default="alice", help="The bot that creates and starts the lobby.")
@click.option("--lobby-key", default=None, help="The lobby server's public key, to pin.")
@click.pass_context
def bot(ctx: click.Context, name: str, owner: str, lobby_key: str | None) -> None:
    """One bot (used by the demo)."""
    from echo.log import configure_logging

    configure_logging("console", "warning")
    port = ctx.parent.params["port"] if ctx.parent else 7600
    sys.exit(trio.run(_bot, f"127.0.0.1:{port}", name, name == owner, lobby_key))


def say(text: str) -> None:
    print(text, flush=True)


async def _bot(server: str, name: str, owner: bool, lobby_key: str | None = None) -> int:
    import echo.lobby.client as lc
    import echo.session as es
    from echo.lobby.keys import game_pin
    from echo.lobby.play import join_game
    from echo.lobby.protocol import ChatLine, GameStarting, MemberJoined, ReadyChanged

    with trio.move_on_after(60) as overall:
        async with lc.connect([server], member=name, server_key=lobby_key) as lobby:
            say(f"connected to lobby server {lobby.server}")
            if owner:
                lobby_id = await lobby.create(
                    "Friday duel", 4, metadata={"mode": "duel", "region": "eu"}
                )
                say(f"created lobby {lobby_id:x} (4 seats, mode=duel)")
                await lobby.chat("anyone up for a duel?")
            else:
                while True:
                    found = await lobby.search(
                        lc.filters_from(equals={"mode": "duel"}, free_slots=1)
                    )
                    if found.listings:
                        break
                    await trio.sleep(0.3)
                first = found.listings[0]
                say(
                    f"search found {first.name!r}: {first.member_count}/{first.max_members} "
                    f"on {first.home}"
                )
                lobby_id = await lobby.join(first.lobby_id)
                say(f"joined lobby {lobby_id:x}")
                await lobby.chat(f"hi, {name} here")
                await lobby.set_attributes(
                    {"colour": {"bob": "red", "carol": "green"}.get(name, "blue")}
                )
                await lobby.ready()
                say("ready")
            async for event in lobby.events():
                if isinstance(event, ChatLine) and event.member_id != name:
                    say(f"chat <{event.member_id}> {event.text}")
                elif isinstance(event, MemberJoined) and owner:
                    say(f"{event.member.member_id} joined")
                elif isinstance(event, ReadyChanged) and owner and event.ready:
                    say(f"{event.member_id} is ready")
                if owner and lobby.replica is not None:
                    members = lobby.replica.members.values()
                    if len(lobby.replica.members) == 4 and all(
                        m.ready or m.member_id == name for m in members
                    ):
                        say("everyone is ready: starting the game")
                        await lobby.start()
                        owner = False  # start once; now wait for our own ticket like the rest
                if isinstance(event, GameStarting):
                    say(
                        f"game on {event.address}: ticket of {len(event.ticket)} bytes"
                        + (", encrypted to the key the lobby carried" if event.server_key else "")
                    )
                    host, port = event.address.rsplit(":", 1)
                    async with join_game(event, timeout=10, duologue_ports="shared") as game:
                        await game.send(f"ECHO {name} is in the game".encode())
                        reply = await game.receive()
                        say(f"game server answered: {reply.decode()}")
                    if name == BOTS[-1]:
                        forged = event.ticket[:-1] + bytes([event.ticket[-1] ^ 1])
                        try:
                            async with es.connect(
                                host,
                                int(port),
                                int(port) + 1,
                                credentials=forged,
                                timeout=10,
                                duologue_ports="shared",
                                server_key=game_pin(event.server_key),
                            ):
                                say("a forged ticket got in (it should not have)")
                                return 1
                        except es.Rejected as refused:
                            say(f"a forged ticket was refused: {refused.reason}")
                    return 0
    if overall.cancelled_caught:
        say("gave up after 60 s")
    return 1


if __name__ == "__main__":  # pragma: no cover
    main()
