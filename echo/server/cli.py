"""`echo-server`: run the Echo 2.0 server."""

from __future__ import annotations

import gc
import os
import signal
import socket
from collections import Counter
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import click
import structlog
import trio

from echo._cli import (
    address_option,
    count_option,
    events_option,
    fail,
    log_options,
    one_line,
    port_option,
    sole_error,
)
from echo.ops.cli import Ops, metrics_option, open_ops
from echo.ops.heap import trim_heap
from echo.ops.memdebug import probe_from_environment, serve_probe
from echo.ops.metrics import TicketCollector, session_collectors
from echo.server.server import EchoServer, echo_application
from echo.session.config import ServerConfig
from echo.session.server import Admit, Admitted, SessionServer
from echo.session.timers import echo_timers
from echo.transport import TransportConfig, UriError

if TYPE_CHECKING:
    from echo.ops.agones_driver import AgonesClient

EPILOG = """\b
Clients connect with:  echo-client --server ADDRESS --port PORT --control-port CONTROL_PORT
Ports to open in the firewall (all UDP): --port and --control-port, and
  --duologue-ports shared:     clients-base-port and clients-base-port + 1 (every client);
  --duologue-ports per-client: [clients-base-port, clients-base-port + 2 * max-clients).
Every one of these ports is bound at start: a port in use stops the server there.
Encryption: make a key once with  echo-keygen server.key  (it prints the public key),
  start with --key server.key, and give clients  echo-client --server-key PUBLIC_KEY.
SIGINT or SIGTERM: no more clients are admitted; after --drain-timeout (a second signal
  cuts it short), clients still connected get "ERROR server shutting down", then exit 0.
\b
Agones (--agones): docs/operations.md; the sidecar may start later, it is retried.
\b
Exit status: 0 stopped by a signal, or with --agones the game over; 1 a port in use, an address
not on this host, an --events file that cannot be opened; 2 a bad command line (including an
--events file in a missing directory, a --ticket-key file that cannot be read and --agones with
an AGONES_SDK_HTTP_PORT that is no port number).
"""


@click.command(epilog=EPILOG)
@address_option(help="Local IP address to bind (the server's public address on a public host).")
@port_option(
    "--port",
    default=9000,
    help="UDP port of the all-clients subscription (clients send HELLO here).",
)
@port_option(
    "--control-port",
    default=9001,
    help="UDP control port of the all-clients MDC publication (replies come from here).",
)
@port_option(
    "--clients-base-port",
    default=9010,
    help="First UDP port used for duologues (shared: this one and the next).",
)
@click.option(
    "--duologue-ports",
    type=click.Choice(["shared", "per-client"]),
    default="shared",
    show_default=True,
    help="shared: every duologue on two ports (Aeron response channels; echo-client and "
    "echo.session.connect speak it). per-client: two ports per duologue, as the guide's Echo "
    "2.0 (the Java Echo client and plain Aeron peers need it).",
)
@count_option(
    "--max-clients",
    default=16,
    minimum=1,
    help="Most duologues open at once; more HELLOs get 'ERROR server full'.",
)
@count_option(
    "--max-per-ip", default=3, minimum=1, help="Most duologues per IPv4 address or IPv6 prefix."
)
@click.option(
    "--ipv6-prefix",
    default=64,
    show_default=True,
    type=click.IntRange(0, 128),
    help="IPv6 clients are limited per network of this prefix length.",
)
@click.option(
    "--duologue-expiry",
    default=10.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds a new duologue waits for its client before it is deleted.",
)
@events_option(help="Append one JSON line per server event to this file (echo-analyze reads it).")
@click.option(
    "--server-id", default=None, help="Name of this server in the events (default: hostname:port)."
)
@click.option(
    "--ip-salt",
    default=None,
    envvar="ECHO_IP_SALT",
    help="Pseudonymise IP addresses in the events with this key (or $ECHO_IP_SALT).",
)
@click.option(
    "--no-address-validation",
    "no_validation",
    is_flag=True,
    help="Accept MDC receivers that cannot answer echo's address-validation cookie (plain "
    "Aeron subscribers). Off by default: without it a forged packet can make the server "
    "stream to any address, and forged HELLOs are accepted.",
)
@click.option(
    "--ticket-key",
    "ticket_key_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Admit only clients showing a game ticket of the lobby service signed with a key of "
    "this key file (lines 'KEY_ID HEX_SECRET'; see echo-lobby --help). The ticket must name "
    "this server: --server-id if given, else ADDRESS:PORT. Without it, no ticket is asked.",
)
@metrics_option()
@click.option(
    "--key",
    "--key-file",
    "key_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="The server's X25519 key file (make one with: echo-keygen FILE; mode 0600). Its "
    "public key and fingerprint are printed at start, for clients' --server-key.",
)
@click.option(
    "--encryption",
    type=click.Choice(["required", "optional", "off"]),
    default=None,
    help="required: only clients that encrypt; optional: encrypting clients and Echo 2.0's "
    "plain ones side by side; off: all in the clear. Default: optional with --key, off "
    "without (Echo 2.0 clients stay servable either way).",
)
@click.option(
    "--drain-timeout",
    default=0.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="On SIGTERM or SIGINT, stop admitting (/readyz says 503) and let the open sessions "
    "end by themselves for up to this many seconds before the rest are told the server is "
    "shutting down. 0: at once.",
)
@click.option(
    "--agones",
    is_flag=True,
    help="Run as an Agones game server: talk to the SDK sidecar's REST API on "
    "localhost:$AGONES_SDK_HTTP_PORT (9358 if unset): Ready once listening, Health on a "
    "period, each session a player (connect/disconnect), Allocate on the first player, "
    "Shutdown (then exit 0) when the last session of the game ends or after the drain on "
    "SIGTERM. A sidecar that is late or down is retried, never fatal.",
)
@log_options(default_level="info")
def main(
    address: str,
    port: int,
    control_port: int,
    clients_base_port: int,
    duologue_ports: str,
    max_clients: int,
    max_per_ip: int,
    ipv6_prefix: int,
    duologue_expiry: float,
    events_path: str | None,
    server_id: str | None,
    ip_salt: str | None,
    no_validation: bool,
    ticket_key_path: str | None,
    metrics: tuple[str, int] | None,
    drain_timeout: float,
    key_path: str | None,
    encryption: str | None,
    agones: bool,
    log_format: str,
    log_level: str,
) -> None:
    """Run the Echo 2.0 server: clients say HELLO, get a private duologue, and echo."""
    from echo.log import configure_logging
    from echo.telemetry.events import EventLog

    configure_logging(log_format, log_level)  # type: ignore[arg-type]
    config = _server_config(
        address, port, control_port, clients_base_port, max_clients, max_per_ip,
        duologue_expiry, ipv6_prefix, duologue_ports, key_path, encryption,
    )  # fmt: skip
    server_name = server_id or f"{socket.gethostname()}:{port}"
    admit = None
    tickets: Counter[str] = Counter()
    if ticket_key_path is not None:
        admit = ticket_admission(ticket_key_path, server_id or f"{address}:{port}", tickets)
    ops = open_ops(metrics, "echo-server")
    if ops is not None and admit is not None:
        ops.register(TicketCollector(tickets))
    agones_port = _agones_port() if agones else None
    try:
        events = EventLog(
            events_path,
            server_id=server_name,
            ip_salt=ip_salt.encode() if ip_salt else None,
        )
    except OSError as error:
        fail("echo-server", f"cannot open --events {events_path}: {one_line(error)}")
    try:
        transport = echo_timers(validate_addresses=not no_validation)
        trio.run(_serve, config, events, transport, admit, ops, drain_timeout, agones_port)
    except BaseException as error:
        # A port in use, an address not on this host: one clear line and exit 1.
        found = sole_error(error, (OSError, UriError))
        if found is None:
            raise
        why = one_line(found)
        structlog.get_logger("echo.server").error("server_failed", error=why)
        fail("echo-server", why)
    finally:
        events.close()


def _server_config(
    address: str,
    port: int,
    control_port: int,
    clients_base_port: int,
    max_clients: int,
    max_per_ip: int,
    duologue_expiry: float,
    ipv6_prefix: int,
    duologue_ports: str,
    key_path: str | None,
    encryption: str | None,
) -> ServerConfig:
    """The session server's configuration, with the --key file read (a bad one exits 2)."""
    server_key = None
    if key_path is not None:
        from echo.session.crypto import KeyFileError, load_key_file

        try:
            server_key = load_key_file(key_path)
        except KeyFileError as error:
            raise click.BadParameter(str(error), param_hint="--key") from None
    try:
        return ServerConfig(
            address=address,
            port=port,
            control_port=control_port,
            clients_base_port=clients_base_port,
            max_clients=max_clients,
            max_per_ip=max_per_ip,
            duologue_expiry=duologue_expiry,
            ipv6_prefix=ipv6_prefix,
            duologue_ports=duologue_ports,
            key=server_key,
            encryption=encryption,
        )
    except ValueError as error:
        raise click.UsageError(str(error)) from None


def _agones_port() -> int:
    """--agones: the SDK sidecar's port from the environment (a bad one exits 2)."""
    from echo.ops.agones import sidecar_port

    try:
        return sidecar_port(os.environ)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--agones") from None


def freeze_start_up_objects() -> int:
    """Move everything alive after start-up out of the cyclic collector's sight; how many.

    A full pass of the collector visits every tracked object, and it stops the whole server
    while it does (a full pass with 1,000 duologues open took 60-120 ms in B4, and echoes and
    HELLOs queued up behind it). About 30,000 of those objects are the modules, classes and
    functions loaded at start-up, and the server's own channels: they live as long as the
    process, so every pass would visit them for nothing. Frozen objects are still freed by
    reference counting; only a cycle among them would never be collected, and the collect()
    first leaves none.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def ticket_admission(
    path: str, ticket_server_id: str, outcomes: Counter[str] | None = None
) -> Admit:
    """The admission hook of `--ticket-key`: a HELLO must carry a valid game ticket of the
    lobby service (echo.tickets) for this server; the reason otherwise. Each verdict is
    counted in `outcomes` ("admitted", "missing", or the refusal's reason, lower case)."""
    import time

    from echo.tickets import KeyFileError, TicketRefusal, read_key_file, verify

    try:
        keyring = {key.key_id: key.secret for key in read_key_file(path)}
    except KeyFileError as error:
        raise click.BadParameter(str(error), param_hint="--ticket-key") from None
    log = structlog.get_logger("echo.server")
    counted: Counter[str] = Counter() if outcomes is None else outcomes

    def admit(peer: object, credentials: bytes) -> str | Admitted:
        if not credentials:
            counted["missing"] += 1
            return "a game ticket is required"
        verdict = verify(credentials, keyring, ticket_server_id, time.time())
        if isinstance(verdict, TicketRefusal):
            counted[verdict.reason.name.lower()] += 1
            log.info("ticket_refused", reason=verdict.reason.name, detail=verdict.detail)
            return f"ticket refused: {verdict.reason.name.lower()}"
        counted["admitted"] += 1
        log.info("ticket_admitted", lobby_id=verdict.lobby_id, member_id=verdict.member_id)
        return Admitted(verdict)  # the application reads the claims: session.admission

    return admit


async def _serve(
    config: ServerConfig,
    events: object,
    transport: TransportConfig,
    admit: Admit | None = None,
    ops: Ops | None = None,
    drain_timeout: float = 0.0,
    agones_port: int | None = None,
) -> None:
    log = structlog.get_logger("echo.server")
    agones = None
    if agones_port is not None:
        from echo.ops.agones_driver import AgonesClient

        agones = AgonesClient(agones_port)
        # The session library's hook: every session a player of the GameServer.
        events = agones.session_events(events)
    server = _session_server(config, events, transport, admit)
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            if ops is not None:
                await ops.start(nursery)
                ops.register(*session_collectors(server))
            if agones is not None:
                nursery.start_soon(agones.run)
            await nursery.start(server.run)
            nursery.start_soon(trim_heap)
            frozen = freeze_start_up_objects()
            probe = probe_from_environment(os.environ)
            if probe is not None:
                await nursery.start(serve_probe, probe, log)
            _log_listening(config, frozen)
            if ops is not None:
                ops.health.ready()
            if agones is not None:
                agones.listening()
            reason = await _stop_reason(signals, agones)
            if reason == GAME_OVER:
                log.info("shutting_down", reason=reason)
            else:
                log.info("shutting_down", signal=reason)
            if ops is not None:
                ops.health.draining()
            if drain_timeout > 0 and reason != GAME_OVER:
                await _drain(server, drain_timeout, signals)
            await server.stop(reason=reason)
            if agones is not None:
                # After the players' disconnects that the stop reported.
                await agones.shutdown(timeout=AGONES_SHUTDOWN_TIMEOUT)
            nursery.cancel_scope.cancel()


def _session_server(
    config: ServerConfig, events: object, transport: TransportConfig, admit: Admit | None
) -> SessionServer:
    """The Echo server, or the same application behind the --ticket-key admission hook."""
    if admit is None:
        return EchoServer(config, events=events, transport_config=transport)  # type: ignore[arg-type]
    # The same application behind the session library's admission hook.
    return SessionServer(
        config,
        echo_application,
        events=events,  # type: ignore[arg-type]
        transport_config=transport,
        admit=admit,
    )


def _log_listening(config: ServerConfig, frozen: int) -> None:
    """Say where the server listens, and its key (or that sessions are in the clear)."""
    log = structlog.get_logger("echo.server")
    log.info(
        "listening",
        address=config.address,
        port=config.port,
        control_port=config.control_port,
        duologue_ports=f"{config.clients_port_range[0]}-{config.clients_port_range[-1]}",
        duologue_mode=config.duologue_ports.value,
        pid=os.getpid(),
        gc_frozen=frozen,
    )
    mode = config.encryption_mode.value
    if config.key is not None:
        log.info(
            "server_key",
            encryption=mode,
            public_key=config.key.public_text,
            fingerprint="SHA256:" + config.key.fingerprint,
        )
    else:
        log.warning("encryption_off", reason="no --key: every session is in the clear")


#: Seconds a stopping `--agones` server waits for the sidecar to hear its /shutdown.
AGONES_SHUTDOWN_TIMEOUT = 10.0
#: Why an `--agones` server stops when its last player left (else: the signal's name)
GAME_OVER = "game over"


async def _stop_reason(signals: AsyncIterator[int], agones: AgonesClient | None) -> str:
    """Wait for the first signal (its name) or, with Agones, the end of the game."""
    reason = ""
    async with trio.open_nursery() as nursery:

        async def first_signal() -> None:
            nonlocal reason
            async for signum in signals:
                reason = signal.Signals(signum).name
                nursery.cancel_scope.cancel()

        async def game_over() -> None:
            nonlocal reason
            assert agones is not None
            await agones.game_over.wait()
            reason = GAME_OVER
            nursery.cancel_scope.cancel()

        nursery.start_soon(first_signal)
        if agones is not None:
            nursery.start_soon(game_over)
    return reason


async def _drain(server: SessionServer, timeout: float, signals: AsyncIterator[int]) -> None:
    """Admit nobody and wait for the open sessions to end, up to `timeout` seconds or until
    another signal comes."""
    log = structlog.get_logger("echo.server")
    async with trio.open_nursery() as nursery:

        async def cut_short() -> None:
            async for signum in signals:
                log.info("drain_cut_short", signal=signal.Signals(signum).name)
                nursery.cancel_scope.cancel()

        nursery.start_soon(cut_short)
        drained = await server.drain(timeout)
        log.info("drained" if drained else "drain_timed_out", sessions_left=len(server.duologues))
        nursery.cancel_scope.cancel()


if __name__ == "__main__":  # pragma: no cover
    main()
