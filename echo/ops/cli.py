"""`--metrics ADDRESS:PORT` for every server's command line, and what it starts.

@metrics_option()                       # on the click command
ops = open_ops(metrics, "echo-server")  # before trio.run: binds, or exits 1 naming the port
...
async with trio.open_nursery() as nursery:
    await ops.start(nursery)            # serves /metrics, /healthz; /readyz says starting
    ops.register(SomeCollector(...))
    ops.health.ready()                  # once the server listens
    ...
    ops.health.draining()               # on SIGTERM, before stopping
"""

from __future__ import annotations

import ipaddress
import socket
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click
import structlog
import trio
from prometheus_client import CollectorRegistry
from prometheus_client.registry import Collector

from echo._cli import one_line
from echo.ops.http import Health, OpsHttpServer
from echo.ops.metrics import new_registry

__all__ = ["MetricsAddress", "Ops", "metrics_option", "open_ops"]

FC = TypeVar("FC", bound=Callable[..., Any] | click.Command)

_HELP = (
    "Serve Prometheus metrics (/metrics) and health probes (/healthz, /readyz) over HTTP on "
    "this ADDRESS:PORT (an IP address; [::1]:9100 for IPv6; port 0 picks a free one). "
    "Off by default."
)


class MetricsAddress(click.ParamType[tuple[str, int]]):
    """ADDRESS:PORT with an IP address (IPv6 in brackets) and a port 0-65535."""

    name = "ADDRESS:PORT"

    def convert(self, value: Any, param: Any, ctx: Any) -> tuple[str, int]:
        if isinstance(value, tuple):
            return value
        text = str(value).strip()
        host, sep, port_text = text.rpartition(":")
        if not sep or not host:
            self.fail(f"{text!r} is not ADDRESS:PORT (e.g. 127.0.0.1:9100)", param, ctx)
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
            if ":" not in host:
                self.fail(f"{text!r}: only an IPv6 address goes in brackets", param, ctx)
        elif ":" in host:
            self.fail(f"{text!r}: an IPv6 address goes in brackets, e.g. [::1]:9100", param, ctx)
        try:
            ipaddress.ip_address(host)
        except ValueError:
            self.fail(f"{text!r}: {host!r} is not an IP address", param, ctx)
        if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
            self.fail(f"{text!r}: the port must be a number from 0 to 65535", param, ctx)
        return host, int(port_text)


def metrics_option() -> Callable[[FC], FC]:
    """The `--metrics` option (value: (host, port) or None), the same on every server."""
    return click.option("--metrics", type=MetricsAddress(), default=None, help=_HELP)


class Ops:
    """A bound metrics listener with its registry and health, for one server."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.address: tuple[str, int] = sock.getsockname()[:2]
        self.health = Health()
        self.registry: CollectorRegistry = new_registry(self.health)
        self.http = OpsHttpServer(self.registry, self.health)

    def register(self, *collectors: Collector) -> None:
        for collector in collectors:
            self.registry.register(collector)

    def allow_drain(self) -> trio.Event:
        """Offer ``POST /drain``: it sets /readyz to draining and the event returned (202)."""
        requested = trio.Event()

        def drain() -> tuple[int, str, bytes, list[tuple[str, str]]]:
            self.health.draining()
            requested.set()
            structlog.get_logger("echo.ops").info("drain_requested", via="POST /drain")
            return 202, "Accepted", b"draining\n", [("content-type", "text/plain; charset=utf-8")]

        self.http.actions["/drain"] = drain
        return requested

    async def start(self, nursery: trio.Nursery) -> None:
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(self.sock))
        await nursery.start(self.http.serve, listener)
        host, port = self.address
        structlog.get_logger("echo.ops").info("metrics_listening", address=host, port=port)


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port); raises OSError as bind does."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(64)
    except BaseException:
        sock.close()
        raise
    return sock


def open_ops(address: tuple[str, int] | None, prog: str) -> Ops | None:
    """The `--metrics` endpoint bound (None without the option); a port in use or an
    address not on this host: one line naming it, exit 1."""
    if address is None:
        return None
    host, port = address
    try:
        return Ops(bind(host, port))
    except OSError as error:
        shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        click.echo(f"{prog}: cannot serve --metrics on {shown}: {one_line(error)}", err=True)
        sys.exit(1)
