"""Pytest fixtures for netns tests.

Use from a test module (or a conftest) with::

    pytest_plugins = ["tests.netlab.fixtures"]

or import the fixture name directly (``from tests.netlab.fixtures import nat_lab_factory``).
"""

from __future__ import annotations

import contextlib
import ctypes
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.netlab.lab import Lab, NatLabFactory, nat_lab, require_netns_support


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


@pytest.fixture
def fresh_netns() -> Iterator[Callable[[], int]]:
    """Run the test's sockets in a new network namespace of their own, with only `lo` up.

    Yields a function that reads the namespace's ICMP destination-unreachables sent so far
    (/proc/net/snmp `Icmp: OutDestUnreachs`): nobody else's traffic counts in it. Only this
    (main) thread moves, and moves back afterwards: sockets stay in the namespace they were
    created in.
    """
    require_netns_support()
    libc = ctypes.CDLL(None, use_errno=True)
    clone_newnet = 0x40000000
    with open("/proc/thread-self/ns/net") as home:
        if libc.unshare(clone_newnet) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET)")
        try:
            # A child forked from this thread inherits its namespace.
            subprocess.run(["ip", "link", "set", "lo", "up"], check=True)

            def out_dest_unreachs() -> int:
                lines = Path("/proc/thread-self/net/snmp").read_text().splitlines()
                names, values = [line.split()[1:] for line in lines if line.startswith("Icmp:")]
                return int(values[names.index("OutDestUnreachs")])

            yield out_dest_unreachs
        finally:
            if libc.setns(home.fileno(), clone_newnet) != 0:
                raise OSError(ctypes.get_errno(), "setns back to the original namespace")
