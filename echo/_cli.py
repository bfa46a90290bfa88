"""What the command-line tools share: their common options, exit statuses and error lines.

Every echo CLI exits with the same meaning (docs/exit-codes.md):

    0  success (done, or stopped by SIGINT/SIGTERM)
    1  a runtime failure: a port in use, an address not on this host, a file that cannot be
       written while running, a peer that never answered or went away
    2  a bad command line: click's usage banner and one "Error:" line naming the option (an
       unknown option, a value out of range, a file named on it that cannot be used, a host
       name that does not resolve)
    3+ the tool's own, listed in its --help

The options every tool repeats (--log-format, --log-level, --events, addresses, ports and
counts) are defined here once, so that they read, default and fail the same everywhere.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import click

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2  # click's own status for a UsageError or BadParameter

#: a UDP port a server binds or a client sends to
PORT = click.IntRange(1, 65535)
#: the same, where 0 means "any free port" (printed at start)
PORT_OR_ANY = click.IntRange(0, 65535)

LOG_LEVELS = ("debug", "info", "warning", "error")

F = TypeVar("F", bound=Callable[..., Any])


def log_options(default_level: str = "info", level_help: str | None = None) -> Callable[[F], F]:
    """--log-format and --log-level: diagnostics on stderr for people or machines."""

    def decorate(function: F) -> F:
        function = click.option(
            "--log-level",
            type=click.Choice(LOG_LEVELS),
            default=default_level,
            show_default=True,
            help=level_help or "Least important log lines written to stderr.",
        )(function)
        return click.option(
            "--log-format",
            type=click.Choice(["console", "json"]),
            default="console",
            show_default=True,
            help="Log lines on stderr for people (console) or machines (json, one object a line).",
        )(function)

    return decorate


def _events_path(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """An --events file must be one the tool can create or append to: checked before start,
    so a typo in its directory is a bad command line and not a server that fails later."""
    if value is None:
        return None
    path = os.path.abspath(os.path.expanduser(value))
    folder = os.path.dirname(path)
    if os.path.isdir(path):
        raise click.BadParameter(f"{value} is a directory", ctx, param)
    if not os.path.isdir(folder):
        raise click.BadParameter(f"{value}: directory {folder} does not exist", ctx, param)
    target = path if os.path.exists(path) else folder
    if not os.access(target, os.W_OK):
        raise click.BadParameter(f"{value}: {target} is not writable", ctx, param)
    return value


def events_option(help: str) -> Callable[[F], F]:
    """--events PATH: append one JSON line per event (the file's directory must exist)."""
    return click.option(
        "--events",
        "events_path",
        type=click.Path(dir_okay=False),
        default=None,
        metavar="PATH",
        callback=_events_path,
        help=help,
    )


def address_option(
    default: str = "127.0.0.1", help: str = "Local IP address to bind."
) -> Callable[[F], F]:
    """--address: the local IP address a server binds."""
    return click.option("--address", default=default, show_default=True, help=help)


def port_option(
    *decls: str, default: int | None, help: str, any_port: bool = False, show_default: bool = True
) -> Callable[[F], F]:
    """A UDP port option: 1-65535 (0-65535 with `any_port`: 0 asks for a free one)."""
    return click.option(
        *decls,
        default=default,
        show_default=show_default and default is not None,
        type=PORT_OR_ANY if any_port else PORT,
        help=help,
    )


def count_option(
    *decls: str, default: int | None, help: str, minimum: int = 0, show_default: bool = True
) -> Callable[[F], F]:
    """A count option: a whole number of at least `minimum` (0 or 1)."""
    return click.option(
        *decls,
        default=default,
        show_default=show_default and default is not None,
        type=click.IntRange(min=minimum),
        help=help,
    )


def check_resolvable(host: str, port: int, param_hint: str) -> None:
    """A host name on the command line that does not resolve is a bad command line (2)."""
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except (OSError, UnicodeError) as error:
        raise click.BadParameter(
            f"cannot resolve {host!r}: {one_line(error)}", param_hint=param_hint
        ) from None


def fail(prog: str, message: str) -> NoReturn:
    """A runtime failure: one line `prog: message` on stderr, exit status 1."""
    click.echo(f"{prog}: {message}", err=True)
    sys.exit(EXIT_FAILURE)


def sole_error(
    error: BaseException, kinds: type[BaseException] | tuple[type[BaseException], ...]
) -> BaseException | None:
    """The one exception of `kinds` that `error` is, or wraps; else None.

    A task that fails inside trio nurseries reaches `trio.run`'s caller wrapped in one
    ExceptionGroup per nursery: a port already in use must still be one clear line, not
    a traceback. Several failures at once, or anything else, are not ours to summarise.
    """
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error if isinstance(error, kinds) else None


def one_line(error: BaseException) -> str:
    """What went wrong, for a person: an OSError's own words without its `[Errno N]`."""
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error)


# ---------------------------------------------------------------- session encryption options


def _key_file(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    """--key FILE: the server's X25519 key (echo.session.crypto), loaded and checked now, so a
    missing or group-readable file is a bad command line, not a server that fails later."""
    if value is None:
        return None
    from echo.session.crypto import KeyFileError, load_key_file

    try:
        return load_key_file(value)
    except KeyFileError as error:
        raise click.BadParameter(str(error), ctx, param) from None


def server_key_options(who: str) -> Callable[[F], F]:
    """--key FILE (passed on as `server_key`, a loaded ServerKey or None) and --encryption
    (required|optional|off, or None: optional with a key, off without), for `who`'s sessions."""

    def decorate(function: F) -> F:
        function = click.option(
            "--encryption",
            type=click.Choice(["required", "optional", "off"]),
            default=None,
            help=f"required: only {who} that encrypt; optional: encrypting ones and Echo 2.0's "
            "plain ones side by side; off: all in the clear. Default: optional with --key, off "
            "without.",
        )(function)
        return click.option(
            "--key",
            "server_key",
            type=click.Path(dir_okay=False),
            default=None,
            callback=_key_file,
            help="The server's X25519 key file (make one with: echo-keygen FILE; mode 0600). "
            "Its public key and fingerprint are printed at start, for --server-key.",
        )(function)

    return decorate


def _pinned_key(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--server-key: a public key or full fingerprint, or a file holding one (checked here)."""
    if value is None:
        return None
    from echo.session.crypto import BadPin, Pin

    text = value
    if os.path.isfile(value):
        try:
            with open(value, encoding="utf-8") as handle:
                text = handle.read(4096).strip()
        except (OSError, UnicodeDecodeError) as error:
            raise click.BadParameter(one_line(error), ctx, param) from None
    try:
        Pin.parse(text)
    except BadPin as error:
        raise click.BadParameter(str(error), ctx, param) from None
    return text


def server_key_pin_option(help: str) -> Callable[[F], F]:
    """--server-key KEY: the server's public key (or fingerprint, or a file holding one) that
    a client pins; the value is passed on as text that `Pin.parse` accepts, or None."""
    return click.option(
        "--server-key", default=None, metavar="KEY", callback=_pinned_key, help=help
    )


def log_server_key(log: Any, config: Any) -> None:
    """At start: the mode in force and the key clients pin (or that there is none)."""
    if config.key is not None:
        log.info(
            "server_key",
            encryption=config.encryption_mode.value,
            public_key=config.key.public_text,
            fingerprint="SHA256:" + config.key.fingerprint,
        )
    else:
        log.warning("encryption_off", reason="no --key: every session is in the clear")
