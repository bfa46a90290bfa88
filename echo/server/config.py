"""Moved to `echo.session.config` (every session server has these settings); kept for imports."""

from echo.session.config import ServerConfig

__all__ = ["ServerConfig"]
