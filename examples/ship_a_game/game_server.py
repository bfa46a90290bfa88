"""A game server in the lobby's loop: rock-paper-scissors for the players of a lobby.

    python examples/ship_a_game/game_server.py --port 9100 --topics 127.0.0.1:7600 \\
        --ticket-key game.key --region eu

It admits only players with a ticket of the lobby service (signed with the key in
--ticket-key, for this server), learns from the ticket who the player is, its team and who
else is in the match (the roster), announces itself and its tags on the topics so that lobbies
start games here, and when every player of a match has moved, reports the result to the lobby,
signed with the same key. A player whose process crashes comes back with a fresh ticket from
the lobby (same match) and plays on: its move, if it made one, is kept.
"""

from __future__ import annotations

import argparse
import signal
import time

import attrs
import trio

import echo.session as es
from echo.lobby.games import GameServerAnnouncement
from echo.lobby.results import GameResult
from echo.lobby.server import announce_game_server, report_game_result
from echo.tickets import TicketClaims, TicketKey, TicketRefusal, read_key_file, verify
from echo.topics import ClientConfig, open_topic_client

BEATS = {"rock": "scissors", "paper": "rock", "scissors": "paper"}


@attrs.define
class Match:
    """One lobby's game: its players (the ticket's roster) and their moves so far."""

    claims: TicketClaims
    moves: dict[str, str] = attrs.Factory(dict)
    players: dict[str, es.Session] = attrs.Factory(dict)
    over: bool = False

    def result(self) -> dict[str, str | int]:
        """Who won: the players whose move beats every other move made ("draw" otherwise)."""
        made = set(self.moves.values())
        winners = [m for m, move in self.moves.items() if made - {move} == {BEATS[move]}]
        moves = ",".join(f"{m}:{move}" for m, move in sorted(self.moves.items()))
        return {"winner": winners[0] if len(winners) == 1 else "draw", "moves": moves}


class RockPaperScissors:
    def __init__(self, server_id: str, keys: list[TicketKey], topic_client: object) -> None:
        self.server_id = server_id
        self.keyring = {key.key_id: key.secret for key in keys}
        self.signing_key = keys[0]  # the first key of the file signs (as the lobby's does)
        self.topic_client = topic_client
        self.matches: dict[int, Match] = {}

    def admit(self, peer: object, credentials: bytes) -> str | es.Admitted:
        """The admission hook: a valid ticket for this server, or the refusal's reason."""
        verdict = verify(credentials, self.keyring, self.server_id, time.time())
        if isinstance(verdict, TicketRefusal):
            return f"ticket refused: {verdict.reason.name.lower()}"
        return es.Admitted(verdict)  # the session carries the claims: session.admission

    async def __call__(self, session: es.Session) -> None:
        claims = session.admission
        assert isinstance(claims, TicketClaims)
        match = self.matches.setdefault(claims.match_id, Match(claims))
        me = claims.member_id
        team = claims.attributes.get("team", "none")
        others = [e.member_id for e in claims.roster if e.member_id != me]
        await session.send(f"WELCOME {me} team={team} against={','.join(others)}".encode())
        match.players[me] = session
        try:
            if me not in match.moves:
                await session.send(b"MOVE?")
                move = (await session.receive()).decode().removeprefix("MOVE ")
                if move not in BEATS:
                    await session.close("expected MOVE rock|paper|scissors")
                    return
                match.moves[me] = move
            roster = {e.member_id for e in claims.roster}
            if roster <= match.moves.keys() and not match.over:
                match.over = True
                await self.finish(match)
            else:
                await session.receive()  # wait for the result (or the player leaving)
        except es.LostContact as lost:
            print(
                f"{me} lost: {lost.reason}; its move, if it made one, is kept for its return",
                flush=True,
            )
        except es.SessionClosed:
            pass
        finally:
            if match.players.get(me) is session:
                del match.players[me]

    async def finish(self, match: Match) -> None:
        result = match.result()
        print(f"match {match.claims.match_id} over: {result}", flush=True)
        for player in list(match.players.values()):
            try:
                await player.send(f"RESULT winner={result['winner']}".encode())
                await player.close("game over")
            except es.SessionError:
                pass
        report = GameResult(match.claims.lobby_id, match.claims.match_id, self.server_id, result)
        await report_game_result(self.topic_client, self.signing_key, report)
        del self.matches[match.claims.match_id]


async def serve(args: argparse.Namespace) -> None:
    config = es.ServerConfig(
        address="127.0.0.1",
        port=args.port,
        control_port=args.port + 1,
        clients_base_port=args.port + 2,
        max_clients=16,
        max_per_ip=16,  # the players of a demo share 127.0.0.1
        duologue_ports="shared",
    )
    server_id = f"{config.address}:{config.port}"
    keys = read_key_file(args.ticket_key)
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with (
            open_topic_client(args.topics.split(","), ClientConfig(k=1)) as topics,
            trio.open_nursery() as nursery,
        ):
            game = RockPaperScissors(server_id, keys, topics)
            server = es.SessionServer(config, game, admit=game.admit)
            await nursery.start(server.run)

            def announcement() -> GameServerAnnouncement:
                free = config.max_clients - len(server.duologues)
                tags = {"region": args.region, "mode": "rps"}
                return GameServerAnnouncement(
                    server_id, server_id, max(free, 0), config.control_port, "shared", tags
                )

            nursery.start_soon(lambda: announce_game_server(topics, announcement, interval=0.5))
            print(f"game server {server_id} announcing region={args.region}", flush=True)
            async for _ in signals:
                await server.stop()
                nursery.cancel_scope.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=9100, help="data port (control: +1)")
    parser.add_argument("--topics", required=True, help="HOST:PORT,... of the topic servers")
    parser.add_argument("--ticket-key", required=True, help="the lobby's ticket key file")
    parser.add_argument("--region", default="eu")
    trio.run(serve, parser.parse_args())


if __name__ == "__main__":
    main()
