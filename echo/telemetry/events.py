"""EventLog: structured server events, logged through structlog and appended as JSON lines.

The file is the input of `echo-analyze`; its format is schema v1 (echo.telemetry.schema).
Two promises shape this class:
- a crash loses nothing already emitted: the file is opened in append mode and flushed after
  every line, so a restarted server appends to the same log;
- a broken disk never takes the server down: after the file is open, write errors are counted
  (`write_errors`) and logged once, and the event still reaches the structured log.
A wrong event name or field, on the other hand, is a bug in the caller and raises ValueError.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any, BinaryIO

import structlog

from echo.telemetry.schema import (
    EVENT_FIELDS,
    IP_FIELDS,
    SCHEMA_VERSION,
    format_ts,
    pseudonymise_ip,
    validate_event,
)

__all__ = ["SCHEMA_VERSION", "EventLog", "pseudonymise_ip"]


class EventLog:
    """Emit schema-v1 events to structlog and, if `path` is given, to a JSON-lines file.

    `ip_salt` turns `source_ip` / `source_prefix` into keyed pseudonyms before they reach
    either the log or the file, so no raw address is stored anywhere. `wall_clock` is injected
    so tests can fix the timestamps.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None,
        *,
        server_id: str,
        ip_salt: bytes | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if not isinstance(server_id, str) or not server_id:
            raise ValueError("server_id must be a non-empty string")
        self.server_id = server_id
        self.ip_salt = ip_salt
        self.wall_clock = wall_clock
        self.path = os.fspath(path) if path is not None else None
        self.write_errors = 0
        self.events_written = 0
        self._log = structlog.get_logger("echo.events")
        # Opening may raise OSError on purpose: a server told to write events somewhere it
        # cannot should refuse to start, not run silently without its audit trail.
        # Unbuffered: each line is one write() to an O_APPEND file, so a failed write leaves
        # nothing behind in a buffer to fail again on every later flush (or on close).
        self._file: BinaryIO | None = (
            open(self.path, "ab", buffering=0) if self.path is not None else None
        )

    def emit(self, event: str, **fields: Any) -> None:
        """Record one event. Raises ValueError if the event or its fields break schema v1."""
        if event not in EVENT_FIELDS:
            raise ValueError(f"unknown event {event!r}")
        for name in ("ts", "server_id", "event", "schema_version"):
            if name in fields:
                raise ValueError(f"{name} is set by EventLog, not by the caller")
        if self.ip_salt is not None:
            for name in IP_FIELDS:
                value = fields.get(name)
                if isinstance(value, str):
                    fields[name] = pseudonymise_ip(value, self.ip_salt)
        record: dict[str, Any] = {
            "ts": format_ts(self.wall_clock()),
            "server_id": self.server_id,
            "event": event,
            "schema_version": SCHEMA_VERSION,
            **fields,
        }
        error = validate_event(record)
        if error is not None:
            raise ValueError(f"invalid event: {error}")
        self._log.info(event, **fields)
        if self._file is None:
            return
        try:
            # allow_nan=False: NaN is not JSON, and a reader in another language would choke.
            line = json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n"
        except ValueError:
            raise ValueError(f"invalid event {event}: a float field is NaN or infinite") from None
        data = line.encode("utf-8")
        try:
            view = memoryview(data)
            while view:  # a raw write may be partial (a signal, a nearly full disk)
                written = self._file.write(view)
                if not written:
                    raise OSError("write made no progress")
                view = view[written:]
            self.events_written += 1
        except OSError as exc:
            self.write_errors += 1
            if self.write_errors == 1:
                # Once: a full disk would otherwise turn every event into an error line.
                self._log.error("event_write_failed", path=self.path, error=str(exc))

    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError as exc:
                self.write_errors += 1
                self._log.error("event_write_failed", path=self.path, error=str(exc))
            self._file = None

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
