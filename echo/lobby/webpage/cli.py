"""`echo-lobby --web`: the lobby page on the WebSocket door's port (needs --ws-port)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

_KEY = "echo.lobby.webpage"


def _store(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    ctx.meta[_KEY] = value
    return value


def web_page_option(f: F) -> F:
    """The --web flag; `door_type` reads it (it is not an argument of `f`)."""
    return click.option(
        "--web",
        is_flag=True,
        default=False,
        expose_value=False,
        callback=_store,
        help="Serve the lobby page on the WebSocket door's port: http://ADDRESS:WS_PORT/ "
        "(https with --ws-tls-cert), where a person finds, creates and joins lobbies "
        "(docs/browser-quickstart.md). Needs --ws-port.",
    )(f)


def door_type(door_config: Any) -> Any:
    """The class of the door to open: with --web the door that serves the page too. --web
    without --ws-port is a usage error (status 2)."""
    web = bool(click.get_current_context().meta.get(_KEY))
    if not web:
        from echo.lobby.web.door import WebDoor

        return WebDoor
    if door_config is None:
        raise click.BadParameter("needs --ws-port (the page is served on the door's port)",
                                 param_hint="--web")
    from echo.lobby.webpage.paged import PagedDoor

    return PagedDoor
