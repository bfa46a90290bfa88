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
