"""`echo-lobby`'s WebSocket door options (--ws-port, --ws-address, --ws-tls-cert,
--ws-tls-key, --ws-max-connections, --lobby-ws-urls), read into a `WebDoorConfig`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from echo._cli import PORT

F = TypeVar("F", bound=Callable[..., Any])

_KEY = "echo.lobby.web"


def _store(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    ctx.meta.setdefault(_KEY, {})[param.name] = value
    return value


def web_door_options(f: F) -> F:
    """The door's options; `web_door_config` reads them (they are not arguments of `f`)."""
    options = [
        click.option(
            "--ws-port",
            type=PORT,
            default=None,
            expose_value=False,
            callback=_store,
            help="Open the WebSocket door on this TCP port: browsers and game engines join "
            "lobbies with the JSON protocol (docs/json-protocol.md) [default: no door].",
        ),
        click.option(
            "--ws-address",
            default=None,
            expose_value=False,
            callback=_store,
            help="The address the WebSocket door binds [default: --address].",
        ),
        click.option(
            "--ws-tls-cert",
            type=click.Path(dir_okay=False),
            default=None,
            expose_value=False,
            callback=_store,
            help="PEM certificate chain: the door speaks wss:// (with --ws-tls-key).",
        ),
        click.option(
            "--ws-tls-key",
            type=click.Path(dir_okay=False),
            default=None,
            expose_value=False,
            callback=_store,
            help="PEM private key of --ws-tls-cert.",
        ),
        click.option(
            "--ws-max-connections",
            type=click.IntRange(min=1),
            default=10_000,
            show_default=True,
            expose_value=False,
            callback=_store,
            help="WebSocket connections held at once (each is a file descriptor: raise "
            "ulimit -n to match); one more is closed with 1013.",
        ),
        click.option(
            "--lobby-ws-urls",
            default=None,
            expose_value=False,
            callback=_store,
            metavar="URL,...",
            help="The WebSocket door of every server of --lobby-servers, in its order "
            "(ws://HOST:PORT or wss://..., '-' for a server without one): when this server "
            "drains, each WebSocket member is told the URL its lobby moves to "
            "[default: members hear only the close 1001].",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def web_door_config(address: str, ring: Sequence[str] = ()) -> Any:
    """The `WebDoorConfig` of the command line's options, or None without --ws-port; `ring`:
    the --lobby-servers list. A bad combination, an unusable certificate or a URL list that
    does not match the ring is a usage error (status 2)."""
    from echo.lobby.web.door import WebDoorConfig, tls_context
    from echo.lobby.web.moving import ws_urls_for

    given = click.get_current_context().meta.get(_KEY, {})
    port = given.get("ws_port")
    cert, key = given.get("ws_tls_cert"), given.get("ws_tls_key")
    if port is None:
        for name in ("ws_address", "ws_tls_cert", "ws_tls_key", "lobby_ws_urls"):
            if given.get(name) is not None:
                flag = "--" + name.replace("_", "-")
                raise click.BadParameter("needs --ws-port", param_hint=flag)
        return None
    if (cert is None) != (key is None):
        missing = "--ws-tls-key" if key is None else "--ws-tls-cert"
        raise click.BadParameter(
            "wss:// needs both --ws-tls-cert and --ws-tls-key", param_hint=missing
        )
    context = None
    if cert is not None:
        try:
            context = tls_context(cert, key)
        except ValueError as error:
            raise click.BadParameter(str(error), param_hint="--ws-tls-cert") from None
    ring_urls: dict[str, str] = {}
    if given.get("lobby_ws_urls") is not None:
        urls = [u.strip() for u in given["lobby_ws_urls"].split(",") if u.strip()]
        try:
            ring_urls = ws_urls_for(ring, urls)
        except ValueError as error:
            raise click.BadParameter(str(error), param_hint="--lobby-ws-urls") from None
    return WebDoorConfig(
        port=port,
        address=given.get("ws_address") or address,
        ssl_context=context,
        max_connections=given["ws_max_connections"],
        ring_urls=ring_urls,
    )
