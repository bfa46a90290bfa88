"""`echo-lobby-announce`: a game server's announcements on the games topic.

Driver: a command line.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import attrs
import click
import structlog
import trio

from echo._cli import (
    fail,
    log_options,
    one_line,
    sole_error,
)
from echo.lobby.cli.options import _server_list

ANNOUNCE_EPILOG = """\b
Run next to a game server (echo-server --ticket-key KEYFILE, or your own on echo.session with
an admission hook): every --interval seconds it tells the lobby servers on --topics that the
server --server-id at --address has --slots free slots. Lobby servers forget a server 5 s
after its last announcement. The id must be what the game server checks tickets for
(echo-server: --server-id, else ADDRESS:PORT).
\b
Exit status: 0 stopped by SIGINT/SIGTERM; 1 a socket error; 2 a bad command line (including
a topic server name that does not resolve).
"""


@click.command(epilog=ANNOUNCE_EPILOG)
@click.option("--topics", required=True, help="Comma-separated HOST:PORT of topic servers.")
@click.option("--address", required=True, help="HOST:PORT where the game server admits sessions.")
@click.option("--server-id", default=None, help="The game server's id [default: --address].")
@click.option(
    "--slots",
    default=16,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="Free slots to announce (0 to 65535).",
)
@click.option(
    "--interval",
    default=1.0,
    show_default=True,
    type=click.FloatRange(min=0.05),
    help="Seconds between announcements.",
)
@click.option(
    "--server-key",
    "server_key",
    default=None,
    metavar="KEY|FILE",
    help="The game server's public key (as echo-server prints it at start), or its key file "
    "(echo-server --key FILE): the lobby hands it to the members with their tickets, and "
    "their sessions to the game server are encrypted to it [default: none: in the clear].",
)
@click.option(
    "--control-port",
    default=None,
    type=click.IntRange(1, 65535),
    help="The game server's control port [default: the port of --address + 1].",
)
@click.option(
    "--duologue-ports",
    default="shared",
    show_default=True,
    type=click.Choice(["per-client", "shared"]),
    help="The game server's duologue-port mode (echo-server's default, shared, by default).",
)
@click.option(
    "--tag",
    "tags",
    multiple=True,
    metavar="KEY=VALUE",
    help="A tag a start can filter on (region=eu, mode=ctf, version=3); repeatable.",
)
@log_options(default_level="info")
def announce_main(
    topics: str,
    address: str,
    server_id: str | None,
    slots: int,
    interval: float,
    server_key: str | None,
    control_port: int | None,
    duologue_ports: str,
    tags: tuple[str, ...],
    log_format: str,
    log_level: str,
) -> None:
    """Announce a game server and its free slots to the lobby servers."""
    from echo.lobby.games import GameServerAnnouncement, encode_announcement
    from echo.lobby.protocol import LobbyProtocolError
    from echo.log import configure_logging

    configure_logging(log_format, log_level)  # type: ignore[arg-type]
    listed = _server_list(topics, "--topics", resolve=True)
    if not listed:
        raise click.BadParameter("no servers listed", param_hint="--topics")
    public = b"" if server_key is None else _announced_key(server_key)
    port_text = address.rsplit(":", 1)[-1]
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise click.BadParameter("expected HOST:PORT", param_hint="--address")
    tag_map: dict[str, str] = {}
    for word in tags:
        key, sep, value = word.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {word!r}", param_hint="--tag")
        tag_map[key] = value
    announcement = GameServerAnnouncement(
        server_id or address,
        address,
        slots,
        control_port or int(port_text) + 1,
        duologue_ports,
        tag_map,
        public,
    )
    try:
        encode_announcement(announcement)
    except LobbyProtocolError as error:
        raise click.UsageError(str(error)) from None
    try:
        trio.run(_announce, list(listed), announcement, interval)
    except BaseException as error:
        found = sole_error(error, OSError)
        if found is None:
            raise
        fail("echo-lobby-announce", one_line(found))


def _announced_key(value: str) -> bytes:
    """--server-key of echo-lobby-announce: a public key, or the game server's key file."""
    from echo.lobby.keys import parse_public_key
    from echo.session.crypto import BadKey, KeyFileError, load_key_file

    if os.path.isfile(value):
        try:
            return load_key_file(value).public
        except KeyFileError as error:
            raise click.BadParameter(str(error), param_hint="--server-key") from None
    try:
        return parse_public_key(value)
    except BadKey as error:
        raise click.BadParameter(str(error), param_hint="--server-key") from None


async def _announce(topics: list[str], announcement: Any, interval: float) -> None:
    from echo.lobby.server import announce_game_server
    from echo.topics import ClientConfig, open_topic_client

    log = structlog.get_logger("echo.lobby")
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with open_topic_client(topics, ClientConfig(k=min(3, len(topics)))) as client:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    lambda: announce_game_server(client, lambda: announcement, interval=interval)
                )
                fields = attrs.asdict(announcement)
                if announcement.public_key:
                    from echo.session.crypto import public_key_text

                    fields["public_key"] = public_key_text(announcement.public_key)
                else:
                    del fields["public_key"]
                log.info("announcing", **fields, at=time.time())
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    break
