"""Moved to `echo.session.limits` (the session library owns admission); kept for imports."""

from echo.session.limits import DEFAULT_IPV6_PREFIX, AddressCounter, address_key

__all__ = ["DEFAULT_IPV6_PREFIX", "AddressCounter", "address_key"]
