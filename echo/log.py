"""The one structlog configuration of echo, used by every CLI.

Console output for people, JSON lines for machines. Event names are snake_case verbs with
key=value fields (`duologue_created duologue_id=3 source_ip=...`).
"""

from __future__ import annotations

import logging
import sys
from typing import Literal, TextIO

import structlog

LogFormat = Literal["console", "json"]


def configure_logging(
    log_format: LogFormat = "console", level: str = "info", stream: TextIO | None = None
) -> None:
    renderer: structlog.typing.Processor
    if log_format == "json":
        renderer = structlog.processors.JSONRenderer()
    elif log_format == "console":
        renderer = structlog.dev.ConsoleRenderer(colors=(stream or sys.stderr).isatty())
    else:
        raise ValueError(f"unknown log format {log_format!r}: use console or json")
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(stream or sys.stderr),
        cache_logger_on_first_use=False,
    )
