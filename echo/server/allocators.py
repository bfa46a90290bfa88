"""Moved to `echo.session.allocators` (the session library owns admission); kept for imports."""

from echo.session.allocators import AllocationError, PortAllocator, RandomSource, SessionAllocator

__all__ = ["AllocationError", "PortAllocator", "RandomSource", "SessionAllocator"]
