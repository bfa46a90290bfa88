"""`Message`, what a subscription delivers (public, re-exported by api.py), and address text."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, TypeVar

from echo.transport.core.destinations import Address

_T = TypeVar("_T")

try:
    from mypy_extensions import mypyc_attr
except ImportError:  # mypy's own package (a dev dependency): not needed to run interpreted

    def mypyc_attr(*attrs: str, **kwattrs: object) -> Callable[[_T], _T]:
        return lambda cls: cls

# session id, stream id, source, source ip, source port: what follows `data` in a Message
Origin = tuple[int, int, str, str, int]


def format_address(address: Address) -> str:
    host, port = address[0], address[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# acyclic: its fields are bytes, ints and strs, so the garbage collector need not track it;
# free_list_len: the one freed last is kept for the next (a handler that drops each message
# before the next is made allocates none).
@mypyc_attr(acyclic=True, free_list_len=1)
class Message:
    """One message from a subscription. Immutable (its fields are read-only), compared and
    hashed by value.

    A compiled class (the core's build, compiled.py) rather than a named tuple: one is made
    per message delivered, and the compiled assembler makes one of these in a third of the
    time of a tuple subclass, whose constructor builds a second tuple to copy it from.
    """

    __slots__ = ("data", "session_id", "source", "source_ip", "source_port", "stream_id")

    def __init__(
        self,
        data: bytes,
        session_id: int,
        stream_id: int,
        source: str,
        source_ip: str,
        source_port: int,
    ) -> None:
        self.data: Final = data
        self.session_id: Final = session_id
        self.stream_id: Final = stream_id
        #: the image's source identity, "ip:port" (IPv6 in brackets)
        self.source: Final = source
        self.source_ip: Final = source_ip
        self.source_port: Final = source_port

    def _key(self) -> tuple[bytes, int, int, str, str, int]:
        return (
            self.data,
            self.session_id,
            self.stream_id,
            self.source,
            self.source_ip,
            self.source_port,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return (
            f"Message(data={self.data!r}, session_id={self.session_id}, "
            f"stream_id={self.stream_id}, source={self.source!r})"
        )
