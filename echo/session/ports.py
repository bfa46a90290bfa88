"""The start-up check of the shared duologue ports: real sockets, so the session server's
driver runs it, not the pure allocator beside it (`echo.session.shared`)."""

from __future__ import annotations

import socket


def check_ports_free(address: str, ports: tuple[int, ...]) -> None:
    """Fail at start-up, as the all-clients ports do, if another program holds a shared port:
    otherwise every HELLO would find the pair unbindable and be refused as "server full"."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    for port in ports:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            try:
                probe.bind((address, port))
            except OSError as error:
                where = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
                raise OSError(
                    error.errno,
                    f"cannot bind UDP {where} (a shared duologue port): {error.strerror}",
                ) from None
