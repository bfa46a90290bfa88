"""`echo-lobby`: a lobby server, its options, its run until a signal or a drain, and the
cyclic collector's thresholds it runs with.

Driver: a command line.
"""

from __future__ import annotations

import gc
import os
import signal
from typing import Any

import click
import structlog
import trio

from echo._cli import (
    address_option,
    count_option,
    events_option,
    fail,
    log_options,
    log_server_key,
    one_line,
    port_option,
    server_key_options,
    sole_error,
)
from echo.lobby.cli.options import (
    DEFAULT_PORT,
    _derived_ports,
    _identity,
    _keys,
    _server_list,
)
from echo.lobby.drain import hand_off
from echo.lobby.web.cli import web_door_config, web_door_options
from echo.lobby.webpage.cli import door_type, web_page_option
from echo.ops.cli import Ops, metrics_option, open_ops
from echo.ops.heap import trim_heap
from echo.ops.memdebug import probe_from_environment, serve_probe
from echo.ops.metrics import LobbyCollector, session_collectors

SERVER_EPILOG = """\b
Members connect with:  echo-lobby-client --servers ADDRESS:PORT --member NAME
Many servers: run one per host, give each the same --lobby-servers list (ADDRESS:PORT of
every lobby server, the ring; members use the same list), the same --seat-key (so a member's
seat is honoured by the server a lobby moves to when its home dies) and the same --topics
(listings of every server are searchable everywhere; game servers announce there).
Starting games needs --ticket-key: the key file the game servers (echo-server --ticket-key)
hold; without it a start is refused NO_GAME_SERVER. Key files hold lines 'KEY_ID HEX_SECRET':
  echo "1 $(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n')" > game.key
Open --port, --control-port and the duologue ports (--clients-base-port ..., 2 per member) in
your firewall, all UDP. SIGINT, SIGTERM or POST /drain on --metrics: the server drains (it
stops admitting, tells its members to move now, and they re-create its lobbies on the next
server of the ring at once), then exits 0.
\b
Every one of these ports is bound at start: a port in use stops the server there.
\b
Identities: with --auth-key (a JWK Set of the game backend's keys, by kid) and --auth-issuer,
a member proves its id with a token signed by the game's backend (a JWT, EdDSA or HS256,
whose sub is the member id; members pass it with echo-lobby-client --token). WITHOUT
--auth-key THE SERVER RUNS IN DEVELOPMENT MODE: a member is whoever it claims to be (it says
so at start). See docs/security.md, "Verified identities"; examples/auth_backend.py issues
tokens.
\b
Browsers and game engines: --ws-port opens a WebSocket door (JSON, docs/json-protocol.md)
beside the UDP port, into the same lobbies; --ws-tls-cert/--ws-tls-key make it wss://.
\b
Exit status: 0 stopped by a signal or POST /drain (after the drain); 1 a port in use
(--ws-port included), an address not on this host or an --events file that cannot be
opened; 2 a bad command line (including an unreadable key file, an --auth-key file that is
not a usable key set, --auth-key without --auth-issuer, an --events file in a missing
directory, a --ws-* option without --ws-port and a certificate that does not load).
"""


@click.command(epilog=SERVER_EPILOG)
@address_option()
@port_option(
    "--port",
    default=DEFAULT_PORT,
    help="UDP port where members say HELLO (the all-clients channel).",
)
@port_option(
    "--control-port",
    default=None,
    help="UDP control port of the all-clients channel [default: --port + 1, which is what "
    "members assume for a HOST:PORT in their list].",
)
@port_option(
    "--clients-base-port",
    default=None,
    help="First UDP port of the members' duologues [default: the port after --control-port].",
)
@count_option(
    "--max-clients",
    default=256,
    minimum=1,
    help="Most member sessions at once (two UDP ports each).",
)
@count_option(
    "--max-per-ip",
    default=64,
    minimum=1,
    help="Most member sessions per IPv4 address or IPv6 prefix.",
)
@click.option(
    "--server-id",
    default=None,
    help="This server's name on the ring and in listings [default: ADDRESS:PORT, which is "
    "how members list it].",
)
@click.option(
    "--lobby-servers",
    default=None,
    help="Comma-separated HOST:PORT of every lobby server, this one included (the ring) "
    "[default: this server alone].",
)
@click.option(
    "--topics",
    default=None,
    help="Comma-separated HOST:PORT of topic servers (echo-topics) for listings and game-"
    "server announcements [default: none: searches see this server only, no games].",
)
@click.option(
    "--ticket-key",
    "ticket_key_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Key file shared with the game servers: signs the game tickets of a start.",
)
@click.option(
    "--ticket-ttl",
    default=30.0,
    show_default=True,
    type=click.FloatRange(min=1),
    help="Seconds a game ticket stays valid.",
)
@click.option(
    "--seat-key",
    "seat_key_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Key file every lobby server shares: signs members' seats (reconnection, re-creating "
    "a lobby elsewhere) [default: a random key of this process].",
)
@click.option(
    "--reconnect-grace",
    default=20.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds a member whose session dropped keeps its seat.",
)
@click.option(
    "--indexed-keys",
    default="mode,region,map,skill",
    show_default=True,
    help="Comma-separated metadata keys that searches may filter on (and listings carry).",
)
@click.option(
    "--auth-key",
    "auth_key_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="JWK Set (JSON) of the game backend's token keys by kid (Ed25519 public keys or "
    "HS256 secrets): members must prove their id with a token [default: none: DEVELOPMENT "
    "MODE, any member id is taken as claimed].",
)
@click.option(
    "--auth-issuer",
    default=None,
    help="The iss every member token must carry (required with --auth-key).",
)
@click.option(
    "--auth-audience",
    default="echo-lobby",
    show_default=True,
    help="The aud every member token must carry: the lobby service's name, the same on every "
    "lobby server of the ring.",
)
@server_key_options("members")
@events_option(
    help="Append one JSON line per lobby and session event to this file (echo-analyze)."
)
@web_door_options
@web_page_option
@metrics_option()
@log_options(default_level="info")
def server_main(
    address: str,
    port: int,
    control_port: int | None,
    clients_base_port: int | None,
    max_clients: int,
    max_per_ip: int,
    server_id: str | None,
    lobby_servers: str | None,
    topics: str | None,
    ticket_key_path: str | None,
    ticket_ttl: float,
    seat_key_path: str | None,
    reconnect_grace: float,
    indexed_keys: str,
    auth_key_path: str | None,
    auth_issuer: str | None,
    auth_audience: str,
    server_key: Any,
    encryption: str | None,
    events_path: str | None,
    metrics: tuple[str, int] | None,
    log_format: str,
    log_level: str,
) -> None:
    """Run a lobby server: lobbies over echo sessions, spread over many servers.

    Without --auth-key it runs in development mode: member ids are not verified."""
    from echo.log import configure_logging
    from echo.telemetry.events import EventLog

    configure_logging(log_format, log_level)  # type: ignore[arg-type]
    log = structlog.get_logger("echo.lobby")
    session_config = _session_config(
        address, port, control_port, clients_base_port, max_clients, max_per_ip, server_key,
        encryption,
    )  # fmt: skip
    name = server_id or f"{address}:{port}"
    config = _lobby_server_config(
        name, lobby_servers, topics, indexed_keys, reconnect_grace, seat_key_path,
        ticket_key_path, ticket_ttl, auth_key_path, auth_issuer, auth_audience,
    )  # fmt: skip
    door = web_door_config(address, config.lobby_servers)
    door_class = door_type(door)  # --web: the door serves the lobby page too
    try:
        events = EventLog(events_path, server_id=name) if events_path else None
    except OSError as error:
        fail("echo-lobby", f"cannot open --events {events_path}: {one_line(error)}")
    ops = open_ops(metrics, "echo-lobby")
    _run(session_config, config, events, log, ops, door, door_class, f"{address}:{port}")


def _run(
    session_config: Any,
    config: Any,
    events: Any,
    log: Any,
    ops: Ops | None,
    door: Any,
    door_class: Any,
    where: str,
) -> None:
    """Serve until a signal or a drain; a socket error on `where` (ADDRESS:PORT) is exit
    status 1 (`fail`)."""
    from echo.lobby.server import LobbyServer
    from echo.lobby.timers import lobby_server_timers

    try:
        server = LobbyServer(
            session_config, config, events=events, transport_config=lobby_server_timers()
        )
        tune_collector()
        trio.run(_serve, server, log, ops, door, door_class)
    except BaseException as error:
        found = sole_error(error, OSError)
        if found is None:
            raise
        why = one_line(found)
        log.error("server_failed", error=why)
        fail("echo-lobby", f"cannot serve on {where}: {why}")
    finally:
        if events is not None:
            events.close()


def _session_config(
    address: str,
    port: int,
    control_port: int | None,
    clients_base_port: int | None,
    max_clients: int,
    max_per_ip: int,
    server_key: Any,
    encryption: str | None,
) -> Any:
    """The sessions' `ServerConfig` of echo-lobby's options (usage errors for bad ones)."""
    from echo.session import ServerConfig

    control_port, clients_base_port = _derived_ports(
        port, control_port, clients_base_port, max_clients
    )
    try:
        return ServerConfig(
            address=address,
            port=port,
            control_port=control_port,
            clients_base_port=clients_base_port,
            max_clients=max_clients,
            max_per_ip=max_per_ip,
            key=server_key,
            encryption=encryption,
        )
    except ValueError as error:
        raise click.UsageError(str(error)) from None


def _lobby_server_config(
    name: str,
    lobby_servers: str | None,
    topics: str | None,
    indexed_keys: str,
    reconnect_grace: float,
    seat_key_path: str | None,
    ticket_key_path: str | None,
    ticket_ttl: float,
    auth_key_path: str | None,
    auth_issuer: str | None,
    auth_audience: str,
) -> Any:
    """The `LobbyServerConfig` of echo-lobby's options (usage errors for bad ones)."""
    from echo.lobby.limits import LobbyConfig
    from echo.lobby.server import LobbyServerConfig

    ring = _server_list(lobby_servers, "--lobby-servers") or (name,)
    if name not in ring:
        raise click.BadParameter(
            f"the list does not name this server ({name}); set --server-id to its entry",
            param_hint="--lobby-servers",
        )
    keys = frozenset(k.strip() for k in indexed_keys.split(",") if k.strip())
    try:
        lobby = LobbyConfig(indexed_keys=keys, reconnect_grace=reconnect_grace)
    except ValueError as error:
        raise click.UsageError(str(error)) from None
    return LobbyServerConfig(
        lobby=lobby,
        server_id=name,
        lobby_servers=ring,
        topics=_server_list(topics, "--topics"),
        seat_keys=_keys(seat_key_path, "--seat-key"),
        ticket_keys=_keys(ticket_key_path, "--ticket-key"),
        ticket_ttl=ticket_ttl,
        identity=_identity(auth_key_path, auth_issuer, auth_audience),
    )


#: The cyclic collector's thresholds for a lobby server (Python's: 700, 10, 10). See below.
COLLECTOR_THRESHOLDS = (10_000, 2, 5_000)


def tune_collector() -> None:
    """Keep the cyclic collector's passes short: each one stops the whole server.

    A lobby server's heap is its members' sessions, channels and tasks: long-lived, and
    (measured with the collector's callbacks in L1 at 300 x 8) without cyclic garbage while
    they live: the 14 full passes between start and stop found 0 objects to free and took
    4.1 s, up to 0.9 s each (all traffic stalls meanwhile; a pass visits every object, and
    8,000 members have three times as many). With Python's thresholds a full pass comes
    whenever the objects that survived two passes grew by a quarter, so every few seconds
    while members join.

    A pass costs what it visits: the youngest generation, plus the middle one's when that
    is due. The middle generation holds what survived its last `threshold1` young passes,
    so with (50,000, 20, ...) a middle pass visited up to a million objects while 8,000
    WebSocket members joined: 0.66 s, in which nothing was sent (chat delivery p99 went from
    5 ms to 650 ms). Here a young pass visits at most 10,000 objects (5-7 ms) and a middle
    one about 30,000 (10-20 ms with WebSocket members); each object that lives is still
    visited once in each. In L1 over UDP (8,000 members, the collector's callbacks, runs
    alternated) the longest pass was 135 ms against 618 and 1,453 ms before, for about the
    same total time in the collector (4.9 s against 3.8 and 7.7 s). A full pass needs 5,000
    middle ones (about 100 million allocations); what a session leaves in cycles when it
    ends is freed then. The objects of start-up are frozen out of the passes (as
    echo-server does).
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*COLLECTOR_THRESHOLDS)


async def _serve(
    server: Any, log: Any, ops: Ops | None = None, door: Any = None, door_class: Any = None
) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            if ops is not None:
                await ops.start(nursery)
                ops.register(LobbyCollector(server), *session_collectors(server.sessions))
            await nursery.start(server.run)
            nursery.start_soon(trim_heap)  # freed pages back to the kernel, as echo-server
            probe = probe_from_environment(os.environ)  # ECHO_MEMDEBUG, as on echo-server
            if probe is not None:
                await nursery.start(serve_probe, probe, log)
            if door is not None:  # the WebSocket door (echo.lobby.web), beside the UDP port
                from echo.lobby.web.door import WebDoor

                door = await nursery.start((door_class or WebDoor)(server, door).run)
            log.info("listening", server_id=server.server_id, pid=os.getpid())
            log_server_key(log, server.session_config)
            if ops is not None:
                ops.health.ready()
            reason = await _drain_requested(signals, None if ops is None else ops.allow_drain())
            log.info("shutting_down", signal=reason)
            if ops is not None:
                ops.health.draining()
            await hand_off(server, reason, door)  # WebSocket members too: `moved`, then 1001
            nursery.cancel_scope.cancel()


async def _drain_requested(signals: Any, posted: trio.Event | None) -> str:
    """The first SIGTERM/SIGINT (its name) or POST /drain ("drain")."""
    reason = ""
    async with trio.open_nursery() as nursery:

        async def first_signal() -> None:
            nonlocal reason
            async for signum in signals:
                reason = signal.Signals(signum).name
                nursery.cancel_scope.cancel()

        async def post() -> None:
            nonlocal reason
            assert posted is not None
            await posted.wait()
            reason = "drain"
            nursery.cancel_scope.cancel()

        nursery.start_soon(first_signal)
        if posted is not None:
            nursery.start_soon(post)
    return reason
