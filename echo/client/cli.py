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

from echo._cli import (
    EXIT_FAILURE,
    check_resolvable,
    count_option,
    log_options,
    one_line,
    port_option,
    sole_error,
)
from echo.client.application import ClientState, EchoReceived, FailureKind
from echo.client.client import ClientConfig, EchoClient
from echo.protocol import Echo, format_message
from echo.session.machine import HandshakeState
from echo.session.timers import echo_timers
from echo.transport import UriError

EPILOG = """\b
Exit status:
  0  done (--count echoes received, or interrupted)
  1  no echo-server answered at --server/--port/--control-port, or a socket error
  2  a bad command line (including a --server name that does not resolve)
  3  timed out after the server answered (what it was waiting for is printed)
  4  protocol or connection error (the server closed the duologue, went away, ...)
  5  rejected by the server (its message is printed)
  6  the server did not prove the --server-key (another key, or no encryption)
"""


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
@port_option("--port", default=9000, help="The server's --port (all-clients data port).")
@port_option(
    "--control-port",
    default=9001,
    help="The server's --control-port (all-clients MDC control port).",
)
@count_option(
    "--count",
    default=None,
    help="Echoes to do, then exit 0 (0: connect, then leave). Default: until interrupted.",
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
    "--message",
    default=None,
    help="Text to echo (default: a random 64-bit value per message, as 16 hex digits).",
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
@log_options(default_level="warning")
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
    config = _config(
        server, port, control_port, count, interval, message, timeout, duologue_ports, source,
        server_key,
    )  # fmt: skip

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
        sys.exit(EXIT_FAILURE)
    _report(client, as_json, duologue_ports)


def _config(
    server: str,
    port: int,
    control_port: int,
    count: int | None,
    interval: float,
    message: str | None,
    timeout: float,
    duologue_ports: str,
    source: str | None,
    server_key: str | None,
) -> ClientConfig:
    """The client's configuration, every option checked first (a bad one exits 2)."""
    if message is not None:
        try:
            format_message(Echo(message))
        except ValueError as error:
            raise click.BadParameter(str(error), param_hint="--message") from None
    # Before anything starts: a typo or an unknown name is a bad command line.
    check_resolvable(server, port, "--server")
    if source is not None:
        unusable = _source_problem(source)
        if unusable:
            raise click.BadParameter(unusable, param_hint="--source")
    if server_key is not None:
        server_key = _server_key(server_key)
    return ClientConfig(
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


def _report(client: EchoClient, as_json: bool, duologue_ports: str) -> None:
    """Print the result (a line or the JSON summary) and exit with the failure's code."""
    config = client.config
    server, port, control_port = config.server, config.port, config.control_port
    result = summary(client)
    machine = client.machine
    failure = machine.failure
    if as_json:
        click.echo(json.dumps(result))
    elif failure is None:
        click.echo(_done_line(result))
    if failure is not None:
        if not as_json and failure.no_answer:
            click.echo(
                f"echo-client: no echo-server answered at {server}:{port}/{control_port} "
                f"within {config.timeout:g} s",
                err=True,
            )
        elif not as_json:
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


def _done_line(result: dict[str, Any]) -> str:
    """The last line: how many echoes came back and, if any did, how fast."""
    done = f"done: {result['received']}/{result['sent']} echoes"
    rtt = result["rtt_ms"]
    if rtt["p50"] is None:
        return done
    return f"{done}, rtt p50 {rtt['p50']} ms, p99 {rtt['p99']} ms"
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


if __name__ == "__main__":  # pragma: no cover
    main()
