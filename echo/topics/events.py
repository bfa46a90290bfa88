"""Events of the topics server: structlog lines and, with ``--events``, JSON lines in a file.

The records have echo-server's shape (``ts``, ``server_id``, ``event``, then the event's own
fields) so the same tools read both; they are not schema-v1 events, whose names are fixed by
echo.telemetry.schema for the Echo 2.0 server, so this log does not validate against it. Like
echo-server's: appended and flushed per line (a crash loses nothing already written), and a
failing disk is counted and logged once, never fatal.
"""

from __future__ import annotations

import datetime
import json
import os
import time
from collections.abc import Callable
from typing import Any, BinaryIO

import structlog

__all__ = ["TopicEvents"]


class TopicEvents:
    def __init__(
        self,
        path: str | os.PathLike[str] | None,
        *,
        server_id: str,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.server_id = server_id
        self.path = os.fspath(path) if path is not None else None
        self.wall_clock = wall_clock
        self.write_errors = 0
        self.events_written = 0
        self._log = structlog.get_logger("echo.topics")
        # Opening may raise OSError on purpose: the CLI turns it into a clear error at start.
        self._file: BinaryIO | None = (
            open(self.path, "ab", buffering=0) if self.path is not None else None
        )

    def emit(self, event: str, *, log: bool = True, **fields: Any) -> None:
        if log:
            self._log.info(event, **fields)
        if self._file is None:
            return
        ts = datetime.datetime.fromtimestamp(self.wall_clock(), datetime.UTC)
        record = {
            "ts": ts.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "server_id": self.server_id,
            "event": event,
            **fields,
        }
        data = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        try:
            view = memoryview(data)
            while view:
                written = self._file.write(view)
                if not written:
                    raise OSError("write made no progress")
                view = view[written:]
            self.events_written += 1
        except OSError as error:
            self.write_errors += 1
            if self.write_errors == 1:
                self._log.error("event_write_failed", path=self.path, error=str(error))

    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError as error:
                self.write_errors += 1
                self._log.error("event_write_failed", path=self.path, error=str(error))
            self._file = None
