"""The lobby CLIs' option values: server lists, key files, the identity verifier of
--auth-key, and the ports derived from --port.

Driver: a command line.
"""

from __future__ import annotations

import os
from typing import Any

import click

from echo._cli import (
    check_resolvable,
)

DEFAULT_PORT = 7600


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
