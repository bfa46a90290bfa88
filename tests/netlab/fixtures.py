"""Pytest fixtures for netns tests.

Use from a test module (or a conftest) with::

    pytest_plugins = ["tests.netlab.fixtures"]

or import the fixture name directly (``from tests.netlab.fixtures import nat_lab_factory``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from tests.netlab.lab import Lab, NatLabFactory, nat_lab


@pytest.fixture
def nat_lab_factory() -> Iterator[NatLabFactory]:
    """Build labs on demand inside a test; all are torn down when the test ends (pass or fail).

    A sync fixture on purpose: building a lab blocks on ``ip``/``nft`` for ~0.1 s, which is fine
    before a trio test starts and keeps the fixture usable from sync and async tests alike.
    """
    with contextlib.ExitStack() as stack:

        def make(*, sites: int = 1, clients_per_site: int = 1, prefix: str | None = None) -> Lab:
            return stack.enter_context(
                nat_lab(sites=sites, clients_per_site=clients_per_site, prefix=prefix)
            )

        yield make
