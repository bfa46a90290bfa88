"""Signed game tickets and the key files that hold their keys.

The lobby service issues a ticket to every member when a game starts (`TicketIssuer`); a game
server checks it at admission (`verify`), before it opens a session: `echo-server
--ticket-key` does, and so can any server on `echo.session` through its admission hook. Seats
(`TicketSeats`) and seat tags are the lobby's own use of the same keys. Neither side imports
the other: this package sits beside `echo.session`, below the lobby and the servers.

`echo.tickets.core` is pure (no trio, no clock); `echo.tickets.keyfile` reads key files.
"""

from __future__ import annotations

from echo.tickets.core import (
    MAC_BYTES,
    MAX_TICKET_BYTES,
    MIN_KEY_BYTES,
    MIN_TICKET_BYTES,
    SEAT_SERVER_ID,
    SEAT_TAG_BYTES,
    SEAT_TAG_MAC_BYTES,
    TICKET_VERSION,
    TICKET_VERSIONS,
    RosterEntry,
    TicketClaims,
    TicketError,
    TicketIssuer,
    TicketKey,
    TicketReason,
    TicketRefusal,
    TicketSeats,
    decode_ticket_untrusted,
    issue,
    open_ticket,
    verify,
)
from echo.tickets.keyfile import KeyFileError, new_key_text, parse_key_text, read_key_file

__all__ = [
    "MAC_BYTES",
    "MAX_TICKET_BYTES",
    "MIN_KEY_BYTES",
    "MIN_TICKET_BYTES",
    "SEAT_SERVER_ID",
    "SEAT_TAG_BYTES",
    "SEAT_TAG_MAC_BYTES",
    "TICKET_VERSION",
    "TICKET_VERSIONS",
    "KeyFileError",
    "RosterEntry",
    "TicketClaims",
    "TicketError",
    "TicketIssuer",
    "TicketKey",
    "TicketReason",
    "TicketRefusal",
    "TicketSeats",
    "decode_ticket_untrusted",
    "issue",
    "new_key_text",
    "open_ticket",
    "parse_key_text",
    "read_key_file",
    "verify",
]
