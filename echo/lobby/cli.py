"""`echo-lobby` (the server), `echo-lobby-client` (a line-oriented member) and
`echo-lobby-announce` (a game server's announcements on the games topic)."""

from __future__ import annotations

import gc
import json
import os
import shlex
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

import attrs
import click
import structlog
import trio

from echo._cli import (
    address_option,
    check_resolvable,
    count_option,
    events_option,
    fail,
    log_options,
    log_server_key,
    one_line,
    port_option,
    server_key_options,
    server_key_pin_option,
    sole_error,
)
from echo.lobby import cli_queue
from echo.lobby.drain import hand_off
from echo.lobby.web.cli import web_door_config, web_door_options
from echo.lobby.webpage.cli import door_type, web_page_option
from echo.ops.cli import Ops, metrics_option, open_ops
from echo.ops.metrics import LobbyCollector, session_collectors

DEFAULT_PORT = 7600

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


def _server_list(text: str | None, flag: str, resolve: bool = False) -> tuple[str, ...]:
    """A comma-separated HOST:PORT list; with `resolve`, every name must resolve (the list of
    a client, which sends to them at once; a server's --lobby-servers names its peers, which
    may come up later)."""
    from echo.lobby.client import split_server

    if not text:
        return ()
    out = tuple(part.strip() for part in text.split(",") if part.strip())
    for server in out:
        try:
            host, port, _ = split_server(server)
        except ValueError as error:
            raise click.BadParameter(str(error), param_hint=flag) from None
        if resolve:
            check_resolvable(host, port, flag)
    if len(set(out)) != len(out):
        raise click.BadParameter("a server is listed twice", param_hint=flag)
    return out


def _identity(path: str | None, issuer: str | None, audience: str) -> Any:
    """The verifier of --auth-key, or None (development mode)."""
    import stat

    from echo.lobby.identity import IdentityKeyError, IdentityVerifier, parse_key_set

    if path is None:
        if issuer is not None:
            raise click.BadParameter("needs --auth-key", param_hint="--auth-issuer")
        return None
    if not issuer:
        raise click.BadParameter(
            "--auth-key needs --auth-issuer (the iss your backend puts in its tokens)",
            param_hint="--auth-issuer",
        )
    try:
        with open(path, "rb") as handle:
            mode = os.fstat(handle.fileno()).st_mode
            data = handle.read(1 << 20)
        keys = parse_key_set(data)
    except OSError as error:
        raise click.BadParameter(
            f"cannot read {path}: {error.strerror}", param_hint="--auth-key"
        ) from None
    except IdentityKeyError as error:
        raise click.BadParameter(f"{path}: {error}", param_hint="--auth-key") from None
    secret = any(key.algorithm_name == "HS256" for key in keys.keys.values())
    if secret and mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise click.BadParameter(
            f"{path} holds HS256 secrets and is accessible by others (mode "
            f"{stat.S_IMODE(mode):04o}); run: chmod 600 {path}",
            param_hint="--auth-key",
        )
    return IdentityVerifier(keys, issuer=issuer, audience=audience)


def _keys(path: str | None, flag: str) -> tuple[Any, ...]:
    from echo.tickets import KeyFileError, read_key_file

    if path is None:
        return ()
    try:
        return tuple(read_key_file(path))
    except KeyFileError as error:
        raise click.BadParameter(str(error), param_hint=flag) from None


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
    from echo.lobby.limits import LobbyConfig
    from echo.lobby.server import LobbyServer, LobbyServerConfig
    from echo.lobby.timers import lobby_server_timers
    from echo.log import configure_logging
    from echo.session import ServerConfig
    from echo.telemetry.events import EventLog

    configure_logging(log_format, log_level)  # type: ignore[arg-type]
    log = structlog.get_logger("echo.lobby")
    control_port, clients_base_port = _derived_ports(
        port, control_port, clients_base_port, max_clients
    )
    try:
        session_config = ServerConfig(
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
    name = server_id or f"{address}:{port}"
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
    config = LobbyServerConfig(
        lobby=lobby,
        server_id=name,
        lobby_servers=ring,
        topics=_server_list(topics, "--topics"),
        seat_keys=_keys(seat_key_path, "--seat-key"),
        ticket_keys=_keys(ticket_key_path, "--ticket-key"),
        ticket_ttl=ticket_ttl,
        identity=_identity(auth_key_path, auth_issuer, auth_audience),
    )
    door = web_door_config(address, ring)
    door_class = door_type(door)  # --web: the door serves the lobby page too
    try:
        events = EventLog(events_path, server_id=name) if events_path else None
    except OSError as error:
        fail("echo-lobby", f"cannot open --events {events_path}: {one_line(error)}")
    ops = open_ops(metrics, "echo-lobby")
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
        fail("echo-lobby", f"cannot serve on {address}:{port}: {why}")
    finally:
        if events is not None:
            events.close()


def _derived_ports(
    port: int, control_port: int | None, clients_base_port: int | None, max_clients: int
) -> tuple[int, int]:
    """--control-port and --clients-base-port, the defaults derived from the options given.

    A default that would pass 65535 is a bad value of the option it was derived from (the
    user gave --port 65535, not --control-port 65536), named as such.
    """
    control_given = control_port is not None
    if control_port is None:
        control_port = port + 1
        if control_port > 65535:
            raise click.BadParameter(
                f"{port} leaves no room for the control port (--port + 1, which members "
                "assume): give a lower --port",
                param_hint="--port",
            )
    if clients_base_port is None:
        clients_base_port = max(port, control_port) + 1
        last = clients_base_port + 2 * max_clients - 1
        if last > 65535:
            given = "--control-port" if control_given and control_port > port else "--port"
            raise click.BadParameter(
                f"{port if given == '--port' else control_port} leaves no room for the "
                f"{2 * max_clients} duologue ports after the control port (2 per --max-clients, "
                f"up to {last}): give a lower {given}, a lower --max-clients or "
                "--clients-base-port",
                param_hint=given,
            )
    return control_port, clients_base_port


#: The cyclic collector's thresholds for a lobby server (Python's: 700, 10, 10). See below.
COLLECTOR_THRESHOLDS = (50_000, 20, 100)


def tune_collector() -> None:
    """Keep the cyclic collector's full passes rare: they stop the whole server.

    A lobby server's heap is its members' sessions, channels and tasks: long-lived, and
    (measured with the collector's callbacks in L1 at 300 x 8) without cyclic garbage while
    they live: the 14 full passes between start and stop found 0 objects to free and took
    4.1 s, up to 0.9 s each (all traffic stalls meanwhile; a pass visits every object, and
    8,000 members have three times as many). With Python's
    thresholds a full pass comes whenever the objects that survived two passes grew by a
    quarter, so every few seconds while members join, and the young passes promote whatever
    lives a few thousand allocations (a message waiting for its member). Higher thresholds
    promote only what really lives, and leave a full pass to once per 100 million
    allocations or so; what a session leaves in cycles when it ends is freed then. The
    objects of start-up are frozen out of the passes (as echo-server does).
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


# --------------------------------------------------------------------------------------------
# echo-lobby-client

CLIENT_EPILOG = """\b
Commands, one a line on standard input (arguments split like a shell's):
  create NAME [MAX] [private] [KEY=VALUE...]   join LOBBY_ID        code JOIN_CODE
  quick [KEY=VALUE | KEY=LOW..HIGH | free=N]...  search [FILTERS...] [page=N]   leave
  meta KEY=VALUE...   lock   unlock   kick M   ban M   transfer M   (owner only)
  attr KEY=VALUE...   ready   unready   chat TEXT...   state   sleep SECONDS
  start [TAG=VALUE...]   (owner; a game server announcing those tags, e.g. region=eu)
  ticket   (a fresh ticket for the running game)   report SERVER_ID REASON...   (its
  game server refused our ticket)
  queue MODE REGION [skill=N] [size=N] [party] [start] [strict]   cancel   (matchmaker)
  wait EVENT [SECONDS]   (until an event of that name arrives, e.g. wait game)   quit
Values that are integers are sent as numbers; KEY= deletes a key.
\b
Output, one line each: "ok COMMAND", "refused CODE message", "joined ID SERVER",
"lobby ID NAME MEMBERS/MAX home=SERVER KEY=VALUE...", and the events as they arrive:
snapshot, member_joined, member_left, owner, metadata, locked, attributes, ready, presence,
banned, game SERVER_ID ADDRESS TICKET_HEX control_port=N duologue_ports=MODE match_id=N,
game_ended MATCH_ID result={...}, chat MEMBER TEXT, rehomed, reconnected, left,
"queued TICKET SERVER", matched TICKET LOBBY_ID WAITED_MS, queue_left TICKET REASON;
with --state-file also "token_saved LOBBY_ID" (each new resume token, kept in the file) and,
after a restart, "resumed LOBBY_ID SERVER" or "resume_refused CODE message" (then it starts
without a seat). With --json, one JSON object a line with an "event" key.
\b
Exit status: 0 standard input ended (or quit) and every command was accepted; 1 no lobby
server answered or let the member in (or all went away); 2 a bad command line; 3 some command
was refused or malformed (the lines say which); 4 a wait timed out; 5 the lobby refused the
--token (the reason is printed: expired, not_yet_valid, wrong_audience, bad_signature,
unknown_kid, ...).
"""

STATE_FILE_HELP = (
    "Keep this member's resume token in FILE (written atomically, mode 0600). If FILE exists "
    "at start, take the seat it names back (a restart after a crash): prints "
    '"resumed LOBBY_ID". A corrupt FILE or a refused token is said on standard error and '
    "the client starts without a seat; a FILE of another member is a usage error."
)


@click.command(epilog=CLIENT_EPILOG)
@click.option(
    "--servers",
    default=f"127.0.0.1:{DEFAULT_PORT}",
    show_default=True,
    help="Comma-separated HOST:PORT of every lobby server (the same list as theirs).",
)
@click.option(
    "--member",
    default=None,
    help="Your member id (1..64 printable bytes) [default: the sub of --token; one of the "
    "two is needed].",
)
@click.option(
    "--token",
    default=None,
    metavar="TOKEN|@FILE",
    help="Your identity token from the game's backend, or @FILE to read it from a file, for a "
    "lobby that verifies identities (echo-lobby --auth-key).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per output line.")
@click.option(
    "--timeout",
    default=10.0,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="Seconds to wait for a server's answer.",
)
@click.option(
    "--connect-timeout",
    default=3.0,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="Seconds a handshake with one lobby server may take before the next is tried "
    "(raise it for a server admitting hundreds of members a second).",
)
@click.option(
    "--liveness",
    default=2.5,
    show_default=True,
    type=click.FloatRange(min=0.5),
    help="Seconds of silence from the server before the session counts as dropped and the "
    "member reconnects, or re-creates its lobby on the next server (the server heartbeats "
    "every 0.8 s; failover within 5 s assumes the default).",
)
@click.option(
    "--state-file",
    default=None,
    metavar="FILE",
    type=click.Path(dir_okay=False),
    help=STATE_FILE_HELP,
)
@server_key_pin_option(
    "Encrypt the sessions to the lobby servers, pinning this key: the ring's public key as "
    "echo-lobby prints it (every server of the ring loads the same --key file), its SHA-256 "
    "fingerprint, or a file holding one. A server that does not prove it is not used (never a "
    "fallback to the clear). Default: no encryption."
)
@log_options(default_level="warning")
def client_main(
    servers: str,
    member: str | None,
    token: str | None,
    as_json: bool,
    timeout: float,
    connect_timeout: float,
    liveness: float,
    state_file: str | None,
    server_key: str | None,
    log_format: str,
    log_level: str,
) -> None:
    """A lobby member driven by commands on standard input; events are printed as lines."""
    from echo.log import configure_logging

    configure_logging(log_format, log_level)  # type: ignore[arg-type]
    listed = _server_list(servers, "--servers", resolve=True)
    if not listed:
        raise click.BadParameter("no servers listed", param_hint="--servers")
    token = _token(token)
    member = _member(member, token)
    if not 1 <= len(member.encode()) <= 64 or not member.isprintable():
        raise click.BadParameter("1..64 printable bytes", param_hint="--member")
    out = _Printer(as_json)
    resume = _saved_token(state_file, member)
    try:
        code = trio.run(
            _client, list(listed), member, timeout, out, connect_timeout, liveness, state_file,
            resume, token, server_key,
        )  # fmt: skip
    except KeyboardInterrupt:
        code = 0
    sys.exit(code)


def _token(value: str | None) -> str | None:
    """--token: the token itself, or @FILE holding it (surrounding whitespace dropped)."""
    if value is None:
        return None
    if value.startswith("@"):
        try:
            with open(value[1:], encoding="ascii") as handle:
                value = handle.read(64 * 1024)
        except (OSError, UnicodeDecodeError) as error:
            why = error.strerror if isinstance(error, OSError) else "not ASCII"
            raise click.BadParameter(
                f"cannot read {value[1:]}: {why}", param_hint="--token"
            ) from None
    value = value.strip()
    if not value:
        raise click.BadParameter("an empty token", param_hint="--token")
    return value


def _member(member: str | None, token: str | None) -> str:
    from echo.lobby.client import member_of

    if member is None and token is None:
        raise click.BadParameter(
            "give --member, or --token (its sub is the member id)", param_hint="--member"
        )
    try:
        return member_of(member, token)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--token") from None


class _Printer:
    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json

    def __call__(self, event: str, *words: Any, **fields: Any) -> None:
        if self.as_json:
            record = {"event": event, **fields}
            print(json.dumps(record, default=_jsonable), flush=True)
        else:
            said = [str(w) for w in words]
            # Fields already said as words are not repeated as KEY=VALUE.
            parts = [event, *said]
            parts += [f"{k}={_text(v)}" for k, v in fields.items() if str(v) not in said]
            print(" ".join(parts), flush=True)


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    if hasattr(value, "name"):
        return value.name.lower()
    return str(value)


def _text(value: Any) -> str:
    if isinstance(value, dict):
        return ",".join(f"{k}:{v}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def _value(text: str) -> str | int | None:
    if text == "":
        return None
    if text.lstrip("-").isdigit():
        return int(text)
    return text


def _pairs(words: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for word in words:
        key, sep, value = word.partition("=")
        if not sep or not key:
            raise ValueError(f"expected KEY=VALUE, got {word!r}")
        out[key] = _value(value)
    return out


def _filters(words: Sequence[str]) -> tuple[tuple[Any, ...], int]:
    from echo.lobby.client import filters_from

    equals: dict[str, str] = {}
    ranges: dict[str, tuple[int | None, int | None]] = {}
    free: int | None = None
    page = 20
    for word in words:
        key, sep, value = word.partition("=")
        if not sep:
            raise ValueError(f"expected KEY=VALUE, got {word!r}")
        if key == "free":
            free = int(value)
        elif key == "page":
            page = int(value)
        elif ".." in value:
            low, _, high = value.partition("..")
            ranges[key] = (int(low) if low else None, int(high) if high else None)
        else:
            equals[key] = value
    return filters_from(equals, ranges, free), page


def _saved_token(state_file: str | None, member: str) -> bytes | None:
    """The resume token kept in `state_file` for `member`, if there is one to use."""
    from echo.lobby.statefile import StateFileError, read_state

    if state_file is None:
        return None
    try:
        saved = read_state(state_file)
    except StateFileError as error:
        click.echo(
            f"echo-lobby-client: state file {state_file} is {error}: starting without a seat "
            "(the file is replaced once seated)",
            err=True,
        )
        return None
    if saved is None:
        return None
    if saved.member != member:
        raise click.BadParameter(
            f"it keeps the seat of member {saved.member!r}, not {member!r}",
            param_hint="--state-file",
        )
    return saved.token


def _print_event(out: _Printer, event: Any) -> None:
    from echo.lobby import protocol as p
    from echo.lobby.client import Left, Reconnected, Rehomed, Resumed

    if cli_queue.print_queue_event(out, event):
        return
    match event:
        case p.LobbySnapshot():
            out(
                "snapshot",
                event.lobby_id,
                lobby_id=event.lobby_id,
                name=event.name,
                owner=event.owner,
                members=[m.member_id for m in event.members],
                max=event.max_members,
                locked=event.locked,
                code=event.join_code,
                metadata=dict(event.metadata),
            )
        case p.MemberJoined():
            out("member_joined", event.member.member_id, member=event.member.member_id)
        case p.MemberLeft():
            reason = event.reason.name.lower()
            out("member_left", event.member_id, reason, member=event.member_id, reason=reason)
        case p.OwnerChanged():
            out("owner", event.owner, owner=event.owner)
        case p.MetadataChanged():
            out("metadata", changes=dict(event.changes))
        case p.LockChanged():
            out("locked" if event.locked else "unlocked")
        case p.AttributesChanged():
            out("attributes", event.member_id, member=event.member_id, changes=dict(event.changes))
        case p.ReadyChanged():
            out("ready" if event.ready else "unready", event.member_id, member=event.member_id)
        case p.PresenceChanged():
            presence = event.presence.name.lower()
            out("presence", event.member_id, presence, member=event.member_id, presence=presence)
        case p.MemberBanned():
            out("banned", event.member_id, member=event.member_id)
        case p.GameStarting():
            # The game server's public key, when it announced one: what the member pins.
            from echo.session.crypto import public_key_text

            key = (public_key_text(event.server_key),) if event.server_key else ()
            out(
                "game",
                event.server_id,
                event.address,
                event.ticket.hex(),
                *key,
                server_id=event.server_id,
                address=event.address,
                ticket=event.ticket.hex(),
                **({"server_key": key[0]} if key else {}),
                control_port=event.control_port,
                duologue_ports=event.duologue_ports,
                match_id=event.match_id,
            )
        case p.GameEnded():
            out("game_ended", event.match_id, match_id=event.match_id, result=dict(event.result))
        case p.ChatLine():
            out("chat", event.member_id, event.text, member=event.member_id, text=event.text)
        case Rehomed():
            out(
                "rehomed",
                event.lobby_id,
                event.server,
                lobby_id=event.lobby_id,
                server=event.server,
            )
        case Reconnected():
            out("reconnected", event.server, server=event.server)
        case Resumed():
            out("resumed", event.lobby_id, event.server, lobby=event.lobby_id, server=event.server)
        case Left():
            out("left", event.lobby_id, event.reason, lobby_id=event.lobby_id, reason=event.reason)


def _event_name(event: Any) -> str:
    from echo.lobby import protocol as p
    from echo.lobby.client import Left, Reconnected, Rehomed, Resumed

    names = {
        p.LobbySnapshot: "snapshot",
        p.MemberJoined: "member_joined",
        p.MemberLeft: "member_left",
        p.OwnerChanged: "owner",
        p.MetadataChanged: "metadata",
        p.LockChanged: "locked",
        p.AttributesChanged: "attributes",
        p.ReadyChanged: "ready",
        p.PresenceChanged: "presence",
        p.MemberBanned: "banned",
        p.GameStarting: "game",
        p.GameEnded: "game_ended",
        p.ChatLine: "chat",
        Rehomed: "rehomed",
        Reconnected: "reconnected",
        Resumed: "resumed",
        p.ResumeToken: "token",
        Left: "left",
        **cli_queue.EVENT_NAMES,
    }
    return names.get(type(event), type(event).__name__)


async def _client(
    servers: list[str],
    member: str,
    timeout: float,
    out: _Printer,
    connect_timeout: float,
    liveness: float,
    state_file: str | None = None,
    resume: bytes | None = None,
    identity: str | None = None,
    server_key: str | None = None,
) -> int:
    import echo.lobby.client as lc
    from echo.lobby.statefile import remove_state

    options: dict[str, Any] = {
        "identity_token": identity,
        "timeout": timeout,
        "connect_timeout": connect_timeout,
        "liveness": liveness,
        "server_key": server_key,
    }
    try:
        try:
            async with lc.connect(
                servers, member=member, resume_token=resume, **options
            ) as lobby:  # fmt: skip
                return await _session(lobby, member, timeout, out, state_file)
        except lc.ResumeRefused as refused:
            # The seat is gone (grace over), or the token is stale: start without it.
            click.echo(
                f"echo-lobby-client: could not take the seat back ({refused}): starting "
                "without a seat",
                err=True,
            )
            reason = refused.reason.name
            out("resume_refused", reason, refused.message, code=reason, message=refused.message)
            if state_file is not None:
                remove_state(state_file)
            async with lc.connect(servers, member=member, **options) as lobby:
                return await _session(lobby, member, timeout, out, state_file)
    except lc.AuthRefused as error:
        click.echo(f"echo-lobby-client: {error}", err=True)
        return 5
    except lc.LobbyUnavailable as error:
        click.echo(f"echo-lobby-client: {error}", err=True)
        return 1


def _keep_token(out: _Printer, state_file: str | None, member: str, event: Any) -> None:
    """With --state-file: each new resume token saved, the file removed once seatless."""
    from echo.lobby import protocol as p
    from echo.lobby.client import Left
    from echo.lobby.statefile import SavedSeat, StateFileError, remove_state, write_state

    if state_file is None:
        return
    try:
        if isinstance(event, p.ResumeToken):
            write_state(state_file, SavedSeat(member, event.lobby_id, event.token))
            out("token_saved", event.lobby_id, lobby=event.lobby_id, file=state_file)
        elif isinstance(event, Left):
            remove_state(state_file)
    except (OSError, StateFileError) as error:
        click.echo(f"echo-lobby-client: state file {state_file}: {error}", err=True)


async def _session(
    lobby: Any, member: str, timeout: float, out: _Printer, state_file: str | None
) -> int:
    """Commands from standard input on a connected client, events printed; the exit status."""
    import echo.lobby.client as lc

    status = 0
    seen: list[str] = []
    arrived = trio.Event()
    out("connected", lobby.server, server=lobby.server, member=member)

    async def show_events() -> None:
        nonlocal arrived
        async for event in lobby.events():
            _print_event(out, event)
            _keep_token(out, state_file, member, event)
            seen.append(_event_name(event))
            arrived.set()
            arrived = trio.Event()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(show_events)
        stdin = trio.wrap_file(sys.stdin)
        while True:
            line = await stdin.readline()
            if not line:
                break
            try:
                words = shlex.split(line)
            except ValueError as error:
                out(
                    "refused",
                    "BAD_COMMAND",
                    str(error),
                    code="BAD_COMMAND",
                    message=str(error),
                )
                status = 3
                continue
            if not words or words[0].startswith("#"):
                continue
            if words[0] == "quit":
                break
            if words[0] == "wait":
                name = words[1] if len(words) > 1 else "snapshot"
                limit = float(words[2]) if len(words) > 2 else timeout
                start = len(seen)
                with trio.move_on_after(limit) as waited:
                    while name not in seen[start:]:
                        await arrived.wait()
                if waited.cancelled_caught:
                    out("timeout", name, event_name=name)
                    status = 4
                continue
            try:
                await _command(lobby, words, out)
            except lc.LobbyError as error:
                out(
                    "refused",
                    error.code.name,
                    error.message,
                    command=words[0],
                    code=error.code.name,
                    message=error.message,
                )
                status = 3
            except (ValueError, IndexError) as error:
                # An IndexError is an argument the command needs and did not get.
                why = "missing argument" if isinstance(error, IndexError) else str(error)
                out(
                    "refused",
                    "BAD_COMMAND",
                    why,
                    command=words[0],
                    code="BAD_COMMAND",
                    message=why,
                )
                status = 3
        nursery.cancel_scope.cancel()
    return status


def _whole_number(text: str, what: str) -> int:
    """A command's integer argument, or a ValueError that says which and why (not int()'s)."""
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{what} is a whole number, not {text!r}") from None


def _seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise ValueError(f"SECONDS is a number, not {text!r}") from None
    if not 0 <= seconds < float("inf"):
        raise ValueError(f"SECONDS is 0 or more, not {text!r}")
    return seconds


async def _command(lobby: Any, words: list[str], out: _Printer) -> None:
    verb, args = words[0], words[1:]
    match verb:
        case "create":
            name = args[0]
            rest = args[1:]
            size = int(rest.pop(0)) if rest and rest[0].isdigit() else 8
            private = bool(rest and rest[0] == "private")
            if private:
                rest = rest[1:]
            lobby_id = await lobby.create(name, size, private=private, metadata=_pairs(rest))
            out("joined", lobby_id, lobby.server, lobby_id=lobby_id, server=lobby.server)
        case "join":
            lobby_id = await lobby.join(_whole_number(args[0], "LOBBY_ID"))
            out("joined", lobby_id, lobby.server, lobby_id=lobby_id, server=lobby.server)
        case "code":
            lobby_id = await lobby.join_code(args[0])
            out("joined", lobby_id, lobby.server, lobby_id=lobby_id, server=lobby.server)
        case "quick":
            filters, _ = _filters(args)
            lobby_id = await lobby.quick_join(filters)
            out("joined", lobby_id, lobby.server, lobby_id=lobby_id, server=lobby.server)
        case "search":
            filters, page = _filters(args)
            for listing in await lobby.search_all(filters, limit=page):
                out(
                    "lobby",
                    listing.lobby_id,
                    listing.name,
                    f"{listing.member_count}/{listing.max_members}",
                    f"home={listing.home}",
                    *(f"{k}={v}" for k, v in listing.metadata.items()),
                    lobby_id=listing.lobby_id,
                    name=listing.name,
                    members=listing.member_count,
                    max=listing.max_members,
                    home=listing.home,
                    metadata=dict(listing.metadata),
                )
            out("ok", verb, command=verb)
            return
        case "leave":
            await lobby.leave()
        case "meta":
            await lobby.set_metadata(_pairs(args))
        case "lock":
            await lobby.lock(True)
        case "unlock":
            await lobby.lock(False)
        case "kick":
            await lobby.kick(args[0])
        case "ban":
            await lobby.ban(args[0])
        case "transfer":
            await lobby.transfer(args[0])
        case "attr":
            await lobby.set_attributes(_pairs(args))
        case "ready":
            await lobby.ready(True)
        case "unready":
            await lobby.ready(False)
        case "chat":
            await lobby.chat(" ".join(args))
        case "start":
            await lobby.start({k: str(v) for k, v in _pairs(args).items()})
        case "ticket":
            await lobby.request_ticket()
        case "report":
            if len(args) < 2:
                raise ValueError("report SERVER_ID REASON...")
            await lobby.report_game_server(args[0], " ".join(args[1:]))
        case "queue":
            await cli_queue.queue_command(lobby, args, out)
            return
        case "cancel":
            await lobby.cancel_queue()
        case "sleep":
            await trio.sleep(_seconds(args[0]))
        case "state":
            replica = lobby.replica
            if replica is None:
                out("state", "none", lobby_id=None)
            else:
                snap = replica.snapshot()
                out(
                    "state",
                    snap.lobby_id,
                    lobby_id=snap.lobby_id,
                    owner=snap.owner,
                    members=[m.member_id for m in snap.members],
                    ready=[m.member_id for m in snap.members if m.ready],
                    connected=[m.member_id for m in snap.members if m.presence.name == "CONNECTED"],
                    attributes={m.member_id: dict(m.attributes) for m in snap.members},
                    metadata=dict(snap.metadata),
                )
            return
        case _:
            raise ValueError(f"unknown command {verb!r}")
    if verb not in {"create", "join", "code", "quick"}:
        out("ok", verb, command=verb)


# --------------------------------------------------------------------------------------------
# echo-lobby-announce

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


if __name__ == "__main__":  # pragma: no cover - `python -m echo.lobby.cli server|client|announce`
    {"server": server_main, "client": client_main, "announce": announce_main}[sys.argv.pop(1)]()
