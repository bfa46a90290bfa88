"""EventLog: structured server events, logged and appended as JSON lines (schema v1)."""

from __future__ import annotations

import datetime
import hashlib
import hmac
import json
import os
import time
from collections.abc import Callable
from typing import Any, TextIO

import structlog

SCHEMA_VERSION = 1
_IP_FIELDS = ("source_ip", "source_prefix")


def pseudonymise_ip(ip: str, salt: bytes) -> str:
    return "h:" + hmac.new(salt, ip.encode(), hashlib.blake2b).hexdigest()[:24]


class EventLog:
    def __init__(
        self,
        path: str | os.PathLike[str] | None,
        *,
        server_id: str,
        ip_salt: bytes | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.server_id = server_id
        self.ip_salt = ip_salt
        self.wall_clock = wall_clock
        self.write_errors = 0
        self._log = structlog.get_logger("echo.events")
        self._file: TextIO | None = open(path, "a", encoding="utf-8") if path else None

    def emit(self, event: str, **fields: Any) -> None:
        if self.ip_salt is not None:
            for name in _IP_FIELDS:
                if isinstance(fields.get(name), str):
                    fields[name] = pseudonymise_ip(fields[name], self.ip_salt)
        self._log.info(event, **fields)
        if self._file is None:
            return
        ts = datetime.datetime.fromtimestamp(self.wall_clock(), datetime.UTC)
        record = {
            "ts": ts.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "server_id": self.server_id,
            "event": event,
            "schema_version": SCHEMA_VERSION,
            **fields,
        }
        try:
            self._file.write(json.dumps(record, separators=(",", ":")) + "\n")
            self._file.flush()
        except OSError as error:
            self.write_errors += 1
            if self.write_errors == 1:
                self._log.error("event_write_failed", error=str(error))

    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
