"""Moved to `echo.session.timers` (every session server and client uses them); kept for imports."""

from echo.session.timers import ECHO_HEARTBEAT_INTERVAL, ECHO_STATUS_MESSAGE_INTERVAL, echo_timers

__all__ = ["ECHO_HEARTBEAT_INTERVAL", "ECHO_STATUS_MESSAGE_INTERVAL", "echo_timers"]
