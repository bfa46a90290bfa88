"""`echo-client`: connect to an Echo 2.0 server and echo messages."""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import socket
import sys
from typing import Any

import click
import trio

from echo._cli import one_line, sole_error
from echo.client.application import ClientState, EchoReceived, FailureKind
from echo.client.client import ClientConfig, EchoClient
from echo.protocol import Echo, format_message
from echo.session.machine import HandshakeState
from echo.timers import echo_timers
from echo.transport import UriError

EPILOG = """\b
Exit codes:
  0  done (--count echoes received, or interrupted)
  2  rejected by the server (its message is printed)
  3  timed out (what it was waiting for is printed)
  4  protocol or connection error (the server closed the duologue, went away, ...)
  5  the server did not prove the --server-key (another key, or no encryption)
  64 bad command line
"""
USAGE_ERROR = 64  # EX_USAGE: kept apart from 2, which scripts read as "rejected by the server"


def _percentile(samples: list[float], fraction: float) -> float | None:
    if not samples:
        return None
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return round(ordered[index] * 1000.0, 3)


def summary(client: EchoClient) -> dict[str, Any]:
    machine = client.machine
    rtts = machine.rtts
    failure = machine.failure
    return {
        "sent": machine.sent,
        "received": machine.received,
        "rtt_ms": {
            "p50": _percentile(rtts, 0.50),
            "p90": _percentile(rtts, 0.90),
            "p99": _percentile(rtts, 0.99),
            "max": _percentile(rtts, 1.0),
        },
        "state": machine.state.value,
        "error": failure.message if failure is not None else None,
    }


def _source_problem(source: str) -> str | None:
    """Why `source` cannot be sent from (not an address, or not one of this host's)."""
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(source).version == 6 else socket.AF_INET
    except ValueError:
        return f"{source!r} is not an IP address"
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((source, 0))
        except OSError as error:
            return f"cannot send from {source}: {error.strerror}"
    return None


@click.command(epilog=EPILOG)
@click.option(
    "--server",
    default="127.0.0.1",
    show_default=True,
    help="Address of the echo-server (IP or hostname).",
)
@click.option(
    "--port",
    default=9000,
    show_default=True,
    type=click.IntRange(1, 65535),
    help="The server's --port (all-clients data port).",
)
@click.option(
    "--control-port",
    default=9001,
    show_default=True,
    type=click.IntRange(1, 65535),
    help="The server's --control-port (all-clients MDC control port).",
)
@click.option(
    "--count",
    default=None,
    type=click.IntRange(min=0),
    help="Echoes to do, then exit 0. Default: until interrupted.",
)
@click.option(
    "--interval",
    default=1.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds from one ECHO to the next, one outstanding at a time: a reply later than "
    "this is followed by the next ECHO at once (0 = each as soon as the last returns).",
)
@click.option(
    "--message", default=None, help="Text to echo (default: a random 64-bit hex value per message)."
)
@click.option(
    "--timeout",
    default=10.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds to wait for each step (connect, CONNECT reply, echo).",
)
@click.option(
    "--no-address-validation",
    "no_validation",
    is_flag=True,
    help="For a server started with --no-address-validation (plain Aeron MDC).",
)
@click.option(
    "--duologue-ports",
    type=click.Choice(["shared", "per-client"]),
    default="shared",
    show_default=True,
    help="The server's --duologue-ports: shared (every duologue on the server's two duologue "
    "ports, as Aeron response channels) or per-client (two ports of its own).",
)
@click.option(
    "--source",
    default=None,
    metavar="ADDRESS",
    help="The local address to send from, on a host with several (default: the system's choice).",
)
@click.option(
    "--server-key",
    default=None,
    metavar="KEY",
    help="Encrypt the session to this server key: its public key or SHA-256 fingerprint as "
    "echo-server prints them, or a file holding one. The client refuses a server that does "
    "not prove it (never falls back to the clear). Default: no encryption.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON summary at the end instead of a line per echo.",
)
@click.option(
    "--log-format",
    type=click.Choice(["console", "json"]),
    default="console",
    show_default=True,
    help="Format of diagnostic logs on stderr.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning"]),
    default="warning",
    show_default=True,
)
def main(
    server: str,
    port: int,
    control_port: int,
    count: int | None,
    interval: float,
    message: str | None,
    timeout: float,
    no_validation: bool,
    duologue_ports: str,
    source: str | None,
    server_key: str | None,
    as_json: bool,
    log_format: str,
    log_level: str,
) -> None:
    """Connect to an Echo 2.0 server, join a private duologue and echo messages.

    Works from behind a NAT: everything the server sends is an answer to a datagram the
    client sent first.
    """
    from echo.log import configure_logging

    configure_logging(log_format, log_level)  # type: ignore[arg-type]
    if message is not None:
        try:
            format_message(Echo(message))
        except ValueError as error:
            raise click.BadParameter(str(error), param_hint="--message") from None
    try:
        # Before anything starts: a typo or an unknown name is a bad command line.
        socket.getaddrinfo(server, port, type=socket.SOCK_DGRAM)
    except (OSError, UnicodeError) as error:
        problem = f"cannot resolve {server!r}: {one_line(error)}"
        raise click.BadParameter(problem, param_hint="--server") from None
    if source is not None:
        unusable = _source_problem(source)
        if unusable:
            raise click.BadParameter(unusable, param_hint="--source")
    if server_key is not None:
        server_key = _server_key(server_key)
    config = ClientConfig(
        server=server,
        port=port,
        control_port=control_port,
        count=count,
        interval=interval,
        message=message,
        timeout=timeout,
        duologue_ports=duologue_ports,
        source=source,
        server_key=server_key,
    )

    def on_echo(echo: EchoReceived) -> None:
        if not as_json:
            click.echo(f"echo {echo.index}: {echo.text!r} in {echo.rtt * 1000:.2f} ms")

    def on_state(name: str, fields: dict[str, Any]) -> None:
        if as_json:
            return
        if name == "connecting":
            click.echo(f"connecting to {server} (ports {port}/{control_port})...")
        elif name == "joining_duologue":
            ports = f"{fields['data_port']}/{fields['control_port']}"
            click.echo(f"server assigned a duologue on ports {ports}")

    client = EchoClient(
        config,
        on_echo=on_echo,
        on_state=on_state,
        transport_config=echo_timers(validate_addresses=not no_validation),
    )
    try:
        trio.run(_run, client)
    except BaseException as error:
        # A socket error (no route, no local port), or a name that stopped resolving.
        found = sole_error(error, (OSError, UriError))
        if found is None:
            raise
        click.echo(f"echo-client: {one_line(found)}", err=True)
        sys.exit(4)
    result = summary(client)
    machine = client.machine
    failure = machine.failure
    if as_json:
        click.echo(json.dumps(result))
    elif failure is None:
        click.echo(
            f"done: {result['received']}/{result['sent']} echoes, "
            f"rtt p50 {result['rtt_ms']['p50']} ms, p99 {result['rtt_ms']['p99']} ms"
        )
    if failure is not None:
        if not as_json:
            click.echo(f"echo-client: {failure.kind.value}: {failure.message}", err=True)
            if failure.kind is FailureKind.TIMED_OUT and failure.phase is HandshakeState.JOINING:
                # The one way a CONNECT is followed by silence that a user can fix: the server
                # runs the other duologue-port mode (a CONNECT does not say which).
                click.echo(
                    "echo-client: the server assigned a duologue that never connected; check "
                    f"that it runs --duologue-ports {duologue_ports} like this client",
                    err=True,
                )
        sys.exit(failure.exit_code)
    if machine.state is not ClientState.CLOSED:
        sys.exit(4)


def _server_key(value: str) -> str:
    """--server-key: a key or fingerprint, or a file holding one (checked here)."""
    from echo.session.crypto import BadPin, Pin

    text = value
    if os.path.isfile(value):
        try:
            with open(value, encoding="utf-8") as handle:
                text = handle.read(4096).strip()
        except (OSError, UnicodeDecodeError) as error:
            raise click.BadParameter(one_line(error), param_hint="--server-key") from None
    try:
        Pin.parse(text)
    except BadPin as error:
        raise click.BadParameter(str(error), param_hint="--server-key") from None
    return text


async def _run(client: EchoClient) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                async for _ in signals:
                    client.stop()

            nursery.start_soon(watch)
            await client.run()
            nursery.cancel_scope.cancel()


def entry() -> None:
    """Console entry point: click's usage errors exit 64 instead of 2 (see EPILOG)."""
    try:
        code = main.main(standalone_mode=False)
    except click.UsageError as error:
        error.show()
        sys.exit(USAGE_ERROR)
    except click.Abort:
        sys.exit(130)
    except click.ClickException as error:
        error.show()
        sys.exit(USAGE_ERROR)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":  # pragma: no cover
    entry()
