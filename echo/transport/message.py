"""`Message`, what a subscription delivers (public, re-exported by api.py), and address text."""

from __future__ import annotations

from typing import NamedTuple

from echo.transport.destinations import Address

# session id, stream id, source, source ip, source port: what follows `data` in a Message
Origin = tuple[int, int, str, str, int]


def format_address(address: Address) -> str:
    host, port = address[0], address[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Message(NamedTuple):
    """One message from a subscription. Immutable.

    A named tuple rather than an attrs class: one is made per message delivered, and a tuple
    is made in a third of the time of a frozen attrs instance.
    """

    data: bytes
    session_id: int
    stream_id: int
    #: the image's source identity, "ip:port" (IPv6 in brackets)
    source: str
    source_ip: str
    source_port: int
